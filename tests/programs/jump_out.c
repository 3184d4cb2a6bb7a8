/* A 1 ms SIGALRM itimer whose handler leaves by siglongjmp (as runtimes
 * recover from timeouts and faults), 1000 times, while the program burns CPU;
 * then a last phase in after_jumps() that must still be sampled. Prints on
 * stderr how many malloc calls returned ("mallocs N"; a jump can also land
 * inside malloc). */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include "burn_ms.h"

static sigjmp_buf env;
static volatile int jumps;
static volatile int mallocs;

/* Jumps only while jumps are still wanted: an alarm that fires after the
 * last one, before the timer is stopped, returns instead (the program
 * printed "1001 jumps" when one did, unprofiled as well as profiled). */
static void on_alarm(int sig) {
    (void)sig;
    if (jumps <= 1000) siglongjmp(env, 1);
}

__attribute__((noinline)) static void spin_until_alarm(void) {
    for (;;) {
        void *volatile p = malloc(64);
        mallocs++;
        free(p);
        burn_ms(1);
    }
}

__attribute__((noinline)) static void after_jumps(void) {
    burn_ms(300);
    sink++; /* not a tail call: keeps this frame on the stack */
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, 0);
    sigsetjmp(env, 1);
    if (++jumps <= 1000) spin_until_alarm();
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    after_jumps();
    printf("%d jumps\n", jumps - 1);
    fprintf(stderr, "mallocs %d\n", mallocs);
    return 0;
}
