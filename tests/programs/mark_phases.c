/* Three phases of allocation with a mark at the start of the second
 * (igprof_mark() from include/igprof.h): phase_one leaks 100 blocks of
 * 1,000 bytes, phase_two 50 of 2,000, phase_three none; each also
 * allocates and frees. With `every` as argument it makes no mark itself:
 * it leaks in early_leak, sleeps 3 s (a `--mark-every 2s` mark falls in
 * between, a second before and after it) and leaks in late_leak. With `wait` it makes no mark itself
 * either: after phase_one it says so and waits for a line on stdin (the
 * test runs `igprof --mark PID` meanwhile). Prints the marks' numbers. */
#include <igprof.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *keep[1024]; /* read by nobody, but global: the calls stay */
int nkeep;

__attribute__((noinline)) void churn(int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        char *p = malloc(size);
        p[0] = (char)i;
        free(p);
    }
}

__attribute__((noinline)) void phase_one(void)
{
    for (int i = 0; i < 100; i++)
        keep[nkeep++] = malloc(1000);
    churn(200, 500);
}

__attribute__((noinline)) void phase_two(void)
{
    for (int i = 0; i < 50; i++)
        keep[nkeep++] = malloc(2000);
    churn(100, 300);
}

__attribute__((noinline)) void phase_three(void)
{
    churn(300, 700);
}

__attribute__((noinline)) void early_leak(void)
{
    for (int i = 0; i < 10; i++)
        keep[nkeep++] = malloc(3000);
}

__attribute__((noinline)) void late_leak(void)
{
    for (int i = 0; i < 20; i++)
        keep[nkeep++] = malloc(4000);
}

int main(int argc, char **argv)
{
    /* stdout's buffer is allocated here, before any mark. */
    printf("start\n");
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "every") == 0) {
        early_leak();
        struct timespec ts = {3, 0};
        nanosleep(&ts, 0);
        late_leak();
        printf("done\n");
        return 0;
    }
    phase_one();
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char line[64];
        printf("phase one done\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 2;
    } else {
        printf("mark %d\n", igprof_mark());
    }
    phase_two();
    phase_three();
    printf("done\n");
    return 0;
}
