/* Threads that each run a few milliseconds of CPU, one after another, in
 * `work`: fewer than two sampling intervals apiece at 5 ms. Prints on
 * stderr the CPU time all of them took ("threads_ms 712"), each measured
 * by its own thread CPU clock. Usage: short_threads THREADS MS_EACH. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double each_ms, total_ms;

static double thread_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) static void *work(void *arg) {
    (void)arg;
    volatile unsigned long x = 0;
    while (thread_ms() < each_ms) x++;
    total_ms += thread_ms();
    return 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    each_ms = argc > 2 ? atof(argv[2]) : 7;
    for (int i = 0; i < n; i++) {
        pthread_t t;
        pthread_create(&t, 0, work, 0);
        pthread_join(t, 0);
    }
    fprintf(stderr, "threads_ms %.0f\n", total_ms);
    return 0;
}
