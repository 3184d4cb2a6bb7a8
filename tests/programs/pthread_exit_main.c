/* main ends with pthread_exit while two threads keep working: the process
 * must end, with status 0, when they are done. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static volatile double sink;
static void *work(void *a) {
    for (long i = 0; i < 40000000; i++) sink += i * 0.5;
    for (int i = 0; i < 1000; i++) {
        void *volatile p = malloc(100 + i);
        free(p);
    }
    printf("worker %ld done\n", (long)a);
    return 0;
}

int main(void) {
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, work, (void *)i);
    pthread_exit(0);
}
