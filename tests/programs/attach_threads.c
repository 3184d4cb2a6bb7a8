/* The target of bench/attach-pause and tests/tests/attach.rs: 50 threads (25 spinning on a little
 * arithmetic with an allocation now and then, 25 sleeping in nanosleep),
 * running until killed. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *spin(void *arg)
{
    volatile unsigned long x = 0;
    for (unsigned long i = 0;; i++) {
        x += i * i;
        if (i % 100000 == 0)
            free(malloc(64 + i % 512));
    }
    return arg;
}

static void *nap(void *arg)
{
    struct timespec t = {0, 5000000};
    for (;;)
        nanosleep(&t, NULL);
    return arg;
}

int main(void)
{
    pthread_t t;
    for (int i = 0; i < 25; i++) {
        pthread_create(&t, NULL, spin, NULL);
        pthread_create(&t, NULL, nap, NULL);
    }
    pause();
    return 0;
}
