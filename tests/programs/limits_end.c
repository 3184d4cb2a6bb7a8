/* "fsize": a file size limit of 0 (writing any file raises SIGXFSZ);
 * "dump": asks for a dump (signal 42) just before exit.
 * Both make N allocations first and exit with status 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

__attribute__((noinline)) static void allocate(long n) {
    for (long i = 0; i < n; i++) {
        void *volatile p = malloc(16 + i % 64);
        free(p);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "fsize";
    long n = argc > 2 ? atol(argv[2]) : 1000;
    if (!strcmp(mode, "fsize")) {
        struct rlimit rl = {0, RLIM_INFINITY};
        setrlimit(RLIMIT_FSIZE, &rl);
    }
    allocate(n);
    if (!strcmp(mode, "dump")) kill(getpid(), 42);
    printf("done\n");
    return 0;
}
