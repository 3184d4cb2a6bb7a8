/* Threads made with glibc's clone() and no pthread (as some runtimes and
 * sandboxes do): CLONE_VM | CLONE_THREAD and friends, no CLONE_SETTLS, so
 * each shares its creator's thread pointer. Each burns 100 ms of its own
 * CPU time and allocates 1000 times, while main allocates 1000 times of its
 * own; then main waits for them on their tids. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "burn_ms.h"

/* glibc's malloc keeps its per-thread cache in TLS, which these threads
 * share: they must take turns in it, as a runtime that made them would. */
static int malloc_turn;
static void lock(void) {
    while (__atomic_exchange_n(&malloc_turn, 1, __ATOMIC_ACQUIRE)) {
    }
}
static void unlock(void) { __atomic_store_n(&malloc_turn, 0, __ATOMIC_RELEASE); }

#define STACK (256 * 1024)

__attribute__((noinline)) static void allocate_1000(void) {
    for (int i = 0; i < 1000; i++) {
        lock();
        void *volatile p = malloc(40 + i % 50);
        free(p);
        unlock();
    }
}

__attribute__((noinline)) static void main_allocates_1000(void) {
    for (int i = 0; i < 1000; i++) {
        lock();
        void *volatile p = malloc(24 + i % 50);
        free(p);
        unlock();
    }
}

__attribute__((noinline)) static int cloned(void *arg) {
    (void)arg;
    burn_thread_ms(100);
    allocate_1000();
    sink++;
    return 0;
}

int main(void) {
    enum { N = 2 };
    static pid_t tids[N];
    for (int i = 0; i < N; i++) {
        lock();
        char *stack = malloc(STACK);
        unlock();
        int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                    CLONE_SYSVSEM | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID;
        if (clone(cloned, stack + STACK, flags, 0, &tids[i], 0, &tids[i]) < 0) {
            perror("clone");
            return 1;
        }
    }
    main_allocates_1000();
    /* CLONE_CHILD_CLEARTID zeroes the tid and wakes its futex at exit. */
    for (int i = 0; i < N; i++) {
        pid_t t;
        while ((t = __atomic_load_n(&tids[i], __ATOMIC_ACQUIRE)) != 0)
            syscall(SYS_futex, &tids[i], FUTEX_WAIT, t, 0, 0, 0);
    }
    printf("%d clone threads done\n", N);
    return 0;
}
