/* Lowers one resource limit in the middle of its run, as a sandbox does,
 * then reports through its standard output and exits with status 0:
 *   fsize:  RLIMIT_FSIZE 0 (writing any file raises SIGXFSZ);
 *   nofile: the RLIMIT_NOFILE soft limit to the descriptors it holds, after
 *           opening descriptors up to 64 (none left to open below it);
 *   nofile-hard: the soft and the hard limit so (none left at all);
 *   as:     RLIMIT_AS soft and hard to its address space now plus 64 MiB;
 *   as-full: the same, to its address space now (no new mapping at all).
 * `allocate` makes N (default 1000) allocations of 100 bytes before. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

__attribute__((noinline, noclone)) static void allocate(long n) {
    for (long i = 0; i < n; i++) {
        void *volatile p = malloc(100);
        free(p);
    }
}

/* The address space now, in bytes (VmSize). */
static long vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) kb = atol(line + 7);
    if (f) fclose(f);
    return kb * 1024;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "fsize";
    long n = argc > 2 ? atol(argv[2]) : 1000;
    allocate(n);
    int r = 0;
    if (!strcmp(mode, "fsize")) {
        struct rlimit rl = {0, RLIM_INFINITY};
        r = setrlimit(RLIMIT_FSIZE, &rl);
    } else if (!strncmp(mode, "nofile", 6)) {
        int last = -1;
        while ((last = open("/dev/null", O_RDONLY)) >= 0 && last < 63) {}
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = (rlim_t)last + 1;
        if (!strcmp(mode, "nofile-hard")) rl.rlim_max = rl.rlim_cur;
        r = setrlimit(RLIMIT_NOFILE, &rl);
        if (open("/dev/null", O_RDONLY) >= 0) r = -1;
    } else if (!strncmp(mode, "as", 2)) {
        rlim_t lim = (rlim_t)vm_size() + (strcmp(mode, "as-full") ? 64 << 20 : 0);
        struct rlimit rl = {lim, lim};
        r = setrlimit(RLIMIT_AS, &rl);
    }
    if (r) { perror("setrlimit"); return 2; }
    printf("%s lowered after %ld allocations\n", mode, n);
    return 0;
}
