/* Loads the library argv[1] while another thread calls dl_iterate_phdr
   in a loop (as a thread that looks up a library, or that unwinds an
   exception with an older libgcc), and prints how long the dlopen took
   and the longest of that thread's calls in ms: a profiler that holds the
   loader's lock while it works on the new library shows in the second. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

static atomic_int done;
static double longest;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int count(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info, (void)size;
    ++*(long *)data;
    return 0;
}

static void *lookups(void *arg) {
    long n = 0;
    (void)arg;
    while (!atomic_load(&done)) {
        double t = now_ms();
        dl_iterate_phdr(count, &n);
        double d = now_ms() - t;
        if (d > longest) longest = d;
    }
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc < 2) {
        fprintf(stderr, "usage: dlopen-stall LIBRARY\n");
        return 2;
    }
    pthread_create(&t, NULL, lookups, NULL);
    double start = now_ms();
    void *h = dlopen(argv[1], RTLD_NOW);
    double took = now_ms() - start;
    atomic_store(&done, 1);
    pthread_join(t, NULL);
    if (!h) {
        fprintf(stderr, "dlopen-stall: %s\n", dlerror());
        return 2;
    }
    printf("dlopen %.1f ms, longest dl_iterate_phdr elsewhere %.1f ms\n", took, longest);
    return 0;
}
