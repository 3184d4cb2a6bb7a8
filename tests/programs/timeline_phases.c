/* Three phases for the timeline: phase one leaks 100 blocks of 1,000
 * bytes at once, then churns (allocates and frees) for PHASE seconds;
 * phase two leaks a block of 10,000 bytes in grow_leak every 50 ms for
 * PHASE seconds while it churns; phase three churns only, for PHASE
 * seconds. PHASE is the first argument (default 2). It prints each
 * phase's start and end as `phase N START END` in Unix time with
 * microseconds, and the bytes phase two leaked. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

void *keep[100000]; /* read by nobody, but global: the calls stay */
int nkeep;

static double now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec / 1e6;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) void churn(void)
{
    for (int i = 0; i < 100; i++) {
        char *p = malloc(300);
        p[0] = (char)i;
        free(p);
    }
}

__attribute__((noinline)) void early_leak(void)
{
    for (int i = 0; i < 100; i++)
        keep[nkeep++] = malloc(1000);
}

__attribute__((noinline)) void grow_leak(void)
{
    keep[nkeep++] = malloc(10000);
}

int main(int argc, char **argv)
{
    double phase = argc > 1 ? atof(argv[1]) : 2;
    long leaked = 0;
    double t[6];
    t[0] = now();
    early_leak();
    while (now() < t[0] + phase) {
        churn();
        nap_ms(50);
    }
    t[1] = now();
    t[2] = t[1];
    while (now() < t[2] + phase) {
        grow_leak();
        leaked += 10000;
        churn();
        nap_ms(50);
    }
    t[3] = now();
    t[4] = t[3];
    while (now() < t[4] + phase) {
        churn();
        nap_ms(50);
    }
    t[5] = now();
    for (int i = 0; i < 3; i++)
        printf("phase %d %.6f %.6f\n", i + 1, t[2 * i], t[2 * i + 1]);
    printf("phase two leaked %ld\n", leaked);
    return 0;
}
