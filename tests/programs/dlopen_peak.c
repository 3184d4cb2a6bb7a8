/* Loads the library argv[1] once and prints its peak resident set in kB
   (VmHWM): what a profiler reads of a library it searches shows there. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2 || !dlopen(argv[1], RTLD_NOW)) {
        fprintf(stderr, "usage: dlopen_peak LIBRARY (%s)\n", dlerror());
        return 2;
    }
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = atol(line + 6);
    if (f) fclose(f);
    printf("peak %ld\n", kb);
    return 0;
}
