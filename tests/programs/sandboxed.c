/* Sandboxes itself as some servers do: a seccomp filter that refuses
 * perf_event_open (EPERM), then starts two threads that each burn 200 ms
 * of CPU in their own function (each prints its wall-clock time of it on
 * stderr: "first 203", ms). */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>
#include "burn_ms.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void timed_burn(const char *name) {
    double t0 = now_ms();
    burn_ms(200);
    fprintf(stderr, "%s %.0f\n", name, now_ms() - t0);
}

__attribute__((noinline)) static void *first(void *a) { (void)a; timed_burn("first"); sink++; return 0; }
__attribute__((noinline)) static void *second(void *a) { (void)a; timed_burn("second"); sink++; return 0; }

int main(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_perf_event_open, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 2;
    }
    printf("perf_event_open now %s\n", syscall(SYS_perf_event_open, 0, 0, -1, -1, 0) < 0 && errno == EPERM ? "refused" : "allowed");
    pthread_t a, b;
    pthread_create(&a, 0, first, 0);
    pthread_join(a, 0);
    pthread_create(&b, 0, second, 0);
    pthread_join(b, 0);
    return 0;
}
