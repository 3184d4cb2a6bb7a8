/* The target of tests/tests/attach.rs's lock test: one thread holds the
 * loader's lock almost all the time (inside a dl_iterate_phdr callback
 * that sleeps 3 s, then 5 ms outside it), another allocates and frees in
 * a loop, the main thread waits. An attach that needs the loader's lock
 * waits for the first thread, so the launcher lets the threads run during
 * its call. Runs until killed; prints "ready" once its threads run. */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int hold(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)info;
    (void)size;
    (void)data;
    struct timespec t = {3, 0};
    nanosleep(&t, NULL);
    return 1;
}

static void *holder(void *arg)
{
    struct timespec t = {0, 5000000};
    for (;;) {
        dl_iterate_phdr(hold, NULL);
        nanosleep(&t, NULL);
    }
    return arg;
}

static void *churn(void *arg)
{
    volatile unsigned long x = 0;
    for (unsigned long i = 0;; i++) {
        x += i;
        if (i % 1000 == 0)
            free(malloc(32 + i % 200));
    }
    return arg;
}

int main(void)
{
    pthread_t t;
    pthread_create(&t, NULL, holder, NULL);
    pthread_create(&t, NULL, churn, NULL);
    puts("ready");
    fflush(stdout);
    pause();
    return 0;
}
