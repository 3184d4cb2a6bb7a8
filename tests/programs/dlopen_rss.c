/* Loads and unloads libz N times (argv[1]) and prints its anonymous resident set
   after 100 rounds and at the end, and its peak resident set, in kB: what
   a profiler keeps per dlopen shows as growth between the first two. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kB of /proc/self/status's field `what` ("RssAnon:"). */
static long status_kb(const char *what) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, what, strlen(what)) == 0) kb = atol(line + strlen(what));
    if (f) fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long early = -1;
    for (int i = 0; i < n; i++) {
        void *h = dlopen("libz.so.1", RTLD_NOW);
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 2;
        }
        dlclose(h);
        if (i == 100) early = status_kb("RssAnon:");
    }
    printf("rss %ld %ld peak %ld\n", early, status_kb("RssAnon:"), status_kb("VmHWM:"));
    return 0;
}
