/* A series of threads cancelled asynchronously at random points (in their
 * own code, in calls the profiler hooks, in the profiler's signal handler's
 * vicinity and in the middle of its stack walks), then one more thread that
 * burns 200 ms of its own CPU time in burn_thread_ms: it must be sampled
 * like any other. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "burn_ms.h"

/* The victims run 200 calls deep, so that each sample's stack walk is
 * long and a cancellation often lands in the middle of one. */
__attribute__((noinline)) static void spin(int depth) {
    if (depth > 0) {
        spin(depth - 1);
        sink++; /* not a tail call: every level keeps its frame */
        return;
    }
    for (;;) {
        for (int i = 0; i < 1000; i++) sink = sink * 31 + i;
        close(-1); /* hooked by -fd */
    }
}

static void *victim(void *arg) {
    (void)arg;
    pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, NULL);
    spin(200);
    return NULL;
}

static void *last(void *arg) {
    (void)arg;
    burn_thread_ms(200);
    return NULL;
}

int main(void) {
    int cancelled = 0;
    for (int i = 0; i < 40; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, victim, NULL) != 0) return 1;
        struct timespec d = {0, 1000000 + (i % 7) * 300000};
        nanosleep(&d, NULL);
        void *r;
        pthread_cancel(t);
        pthread_join(t, &r);
        cancelled += r == PTHREAD_CANCELED;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, last, NULL) != 0) return 1;
    pthread_join(t, NULL);
    printf("%d cancelled\n", cancelled);
    return 0;
}
