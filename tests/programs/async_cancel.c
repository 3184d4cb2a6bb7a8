/* A series of threads cancelled asynchronously at random points (in their
 * own code, in calls the profiler hooks, in the profiler's signal handler's
 * vicinity), then one more thread that burns 200 ms of its own CPU time in
 * final_burn: it must be sampled like any other. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline, noclone)) static void final_burn(int ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 10000; i++) sink = sink * 31 + i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}

static void *victim(void *arg) {
    (void)arg;
    pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, NULL);
    for (;;) {
        for (int i = 0; i < 1000; i++) sink = sink * 31 + i;
        close(-1); /* hooked by -fd */
    }
    return NULL;
}

static void *last(void *arg) {
    (void)arg;
    final_burn(200);
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
