/* Allocates a known number of blocks in one function and says so: the
 * program whose profile the planted-link tests look for. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline, noclone)) static void allocate(long n) {
    for (long i = 0; i < n; i++) {
        void *volatile p = malloc(100);
        free(p);
    }
}

int main(void) {
    allocate(1000);
    printf("allocated 1000\n");
    return 0;
}
