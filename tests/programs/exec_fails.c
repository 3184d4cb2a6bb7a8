/* Tries N times (argv[1], default 100) to exec a program that does not
 * exist, as execvp does along a long PATH, then prints its address-space
 * size (VmSize, kB) and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    char *args[] = {"missing", 0};
    for (int i = 0; i < n; i++) execv("/nonexistent/missing", args);
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) printf("%ld\n", atol(line + 7));
    return 0;
}
