/* Spends most of its time in malloc/free and open/close (inside the
 * profiler's hooks under -mp -fd), the rest in plain code; prints the CPU
 * time main used, in ms, on stderr at the end (not the profiler's start-up
 * before main, which no sample sees). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void churn(long n) {
    void *keep[64] = {0};
    for (long i = 0; i < n; i++) {
        int k = i & 63;
        free(keep[k]);
        keep[k] = malloc(16 + (i * 7) % 512);
        if ((i & 255) == 0) close(open("/dev/null", O_RDONLY));
    }
    for (int k = 0; k < 64; k++) free(keep[k]);
}

__attribute__((noinline)) static void plain(long n) {
    for (long i = 0; i < n; i++) sink = sink * 31 + i;
}

static long cpu_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 3000000;
    long start = cpu_us();
    churn(n);
    plain(n * 20);
    fprintf(stderr, "cpu_ms %ld\n", (cpu_us() - start) / 1000);
    return 0;
}
