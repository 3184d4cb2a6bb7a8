/* Reads every page of FILE through a shared mapping, over and over, for
 * SECONDS (a file larger than its memory cgroup's limit makes the kernel
 * evict and read its pages back: tasks stall on memory, which the
 * cgroup's or the system's pressure file reports). Allocates a block of
 * 1 MiB in keep_block first, so that a profile has a site on top.
 * Usage: file_thrash FILE SECONDS; prints the rounds it made. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void *kept;

__attribute__((noinline)) void keep_block(void)
{
    kept = malloc(1 << 20);
    memset(kept, 1, 1 << 20);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    keep_block();
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return 1;
    volatile unsigned char *p = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return 1;
    time_t end = time(NULL) + atoi(argv[2]);
    unsigned long sum = 0, rounds = 0;
    while (time(NULL) < end) {
        for (off_t i = 0; i < st.st_size; i += 4096)
            sum += p[i];
        rounds++;
    }
    printf("%lu rounds (%lu)\n", rounds, sum & 1);
    return 0;
}
