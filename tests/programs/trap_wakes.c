/* A thread that waits twice: 20 ms in nanosleep, then in pause() until the
 * main thread sends it a SIGTRAP of the program's own, 200 ms later, and
 * ends. The program's SIGTRAP is pending when the waiter runs again, so
 * under -pr the kernel drops the SIGTRAP of the waiter's context-switch
 * event (a second SIGTRAP is not queued while one is pending): the wait
 * must still be charged. Prints "traps 1" (the handler ran once, pause
 * returned with EINTR) and on stderr the waiter's wall-clock time
 * ("waiter 221", ms). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t traps;
static volatile pid_t waiter_tid;
static double waited;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void on_trap(int sig) {
    (void)sig;
    traps++;
}

__attribute__((noinline)) static void *waiter(void *a) {
    double t0 = now_ms();
    waiter_tid = syscall(SYS_gettid);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, 0);
    int r = pause();
    if (r != -1 || errno != EINTR) fprintf(stderr, "pause: %d %s\n", r, strerror(errno));
    waited = now_ms() - t0;
    return a;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, 0);
    pthread_t t;
    pthread_create(&t, 0, waiter, 0);
    struct timespec ts = {0, 220000000};
    nanosleep(&ts, 0);
    syscall(SYS_tgkill, getpid(), waiter_tid, SIGTRAP);
    pthread_join(t, 0);
    printf("traps %d\n", (int)traps);
    fprintf(stderr, "waiter %.0f\n", waited);
    return 0;
}
