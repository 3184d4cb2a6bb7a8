/* A program to be killed (SIGKILL) while a thread holds a lock the
 * profiler's keeper needs for the dump it then writes:
 *   loader   the main thread makes 100 allocations at `kept_alloc`, then
 *            calls dl_iterate_phdr with a callback that spins (prints
 *            "ready" after 100 ms of CPU): the kill comes while it holds
 *            the loader's lock.
 *   threads  4 threads allocate and free at `churn` without end; "ready"
 *            once each has made 100,000 allocations: the kill often comes
 *            while one is inside the memory profiler's hooks, holding a
 *            lock of its live-block table.
 *   dlopen   the main thread makes 100 allocations at `kept_alloc`, then
 *            loads and unloads libz without end ("ready" after 50 rounds):
 *            under -fp naming a libz function, the kill often comes while
 *            the profiler hooks it again, holding the table of hooked
 *            functions, or inside a dlclose that unmapped libz before the
 *            profiler's module table heard of it.
 *   arena    the main thread allocates and frees blocks of 1-60 KB (above
 *            glibc's per-thread cache) without end ("ready" after 100,000),
 *            an idle second thread making glibc's allocator take its
 *            locks: the kill often comes while it holds the main arena's lock,
 *            which the C library's own allocating calls in the keeper
 *            (opendir, fopen) would wait for. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *volatile keep;

__attribute__((noinline)) static void kept_alloc(void) { keep = malloc(64); }

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int spin(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info, (void)size, (void)data;
    double t0 = cpu_ms();
    while (cpu_ms() - t0 < 100) {
    }
    printf("ready\n");
    fflush(stdout);
    for (volatile unsigned long x = 0;; x++) {
    }
    return 0;
}

static int started;

__attribute__((noinline)) static void *churn(void *arg) {
    (void)arg;
    void *slots[64] = {0};
    for (unsigned long i = 0;; i++) {
        int j = i % 64;
        free(slots[j]);
        slots[j] = malloc((i * 7919) % 5000 + 1);
        if (i == 100000) __atomic_add_fetch(&started, 1, __ATOMIC_RELEASE);
    }
    return 0;
}

__attribute__((noinline)) static void arena_churn(void) {
    void *slots[16] = {0};
    for (unsigned long i = 0;; i++) {
        int j = i % 16;
        free(slots[j]);
        slots[j] = malloc((i * 7919) % 60000 + 1100);
        if (i == 100000) {
            printf("ready\n");
            fflush(stdout);
        }
    }
}

static void *sleeper(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec t = {1, 0};
        nanosleep(&t, 0);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "loader") == 0) {
        for (int i = 0; i < 100; i++) kept_alloc();
        dl_iterate_phdr(spin, 0);
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "threads") == 0) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, churn, 0);
        while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) < 4) {
        }
        printf("ready\n");
        fflush(stdout);
        pthread_join(t[0], 0);
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "dlopen") == 0) {
        for (int i = 0; i < 100; i++) kept_alloc();
        for (unsigned long i = 0;; i++) {
            void *h = dlopen("libz.so.1", RTLD_NOW);
            if (!h) {
                fprintf(stderr, "%s\n", dlerror());
                return 2;
            }
            dlclose(h);
            if (i == 50) {
                printf("ready\n");
                fflush(stdout);
            }
        }
    }
    if (argc > 1 && strcmp(argv[1], "arena") == 0) {
        /* A second thread, idle: glibc's allocator takes its locks. */
        pthread_t idle;
        pthread_create(&idle, 0, sleeper, 0);
        arena_churn();
    }
    fprintf(stderr, "usage: killed_holding loader|threads|dlopen|arena\n");
    return 2;
}
