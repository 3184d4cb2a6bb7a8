/* The target of tests/tests/attach.rs's busy test: the main thread and a
 * second one allocate and free without pause (blocks of 16 to 2,063
 * bytes, 64 kept each), so that no thread is ever asleep in a system call
 * and a thread stopped anywhere is most likely inside malloc or free,
 * holding its arena. Prints "ready" once both run; runs until killed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static void *churn(void *arg)
{
    unsigned x = (unsigned)(unsigned long)arg;
    void *kept[64] = {0};
    for (;;) {
        x = x * 1103515245u + 12345u;
        unsigned i = (x >> 8) % 64;
        free(kept[i]);
        kept[i] = malloc(16 + (x >> 20) % 2048);
    }
    return NULL;
}

int main(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, churn, (void *)1) != 0)
        return 2;
    printf("ready\n");
    fflush(stdout);
    churn((void *)2);
    return 0;
}
