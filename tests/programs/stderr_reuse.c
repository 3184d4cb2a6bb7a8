/* Started with descriptor 2 closed (a daemon's start, `2>&-`): opens
 * argv[1] for writing, which takes number 2, writes "fd N" there, makes
 * 1000 allocations and exits 0. Nothing else may appear in that file. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) static void allocate(void) {
    for (int i = 0; i < 1000; i++) {
        void *volatile p = malloc(100);
        free(p);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 3;
    dprintf(fd, "fd %d\n", fd);
    allocate();
    return 0;
}
