/* Major page faults for -pf: writes PAGES pages to a file, syncs it, asks
   the kernel to drop them from the page cache (POSIX_FADV_DONTNEED) and
   reads every page of it through a mapping without readahead
   (MADV_RANDOM) in read_file_pages(): each such fault has to read the
   disk, a major fault. Usage: major_faults FILE [PAGES] (default 64).
   Prints the sum of the bytes read. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static const long page = 4096;

__attribute__((noinline)) long read_file_pages(const char *m, long n) {
  long sum = 0;
  for (long i = 0; i < n; i++) sum += ((volatile const char *)m)[i * page];
  __asm__ volatile("");
  return sum;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: major_faults FILE [PAGES]\n"); return 2; }
  long n = argc > 2 ? atol(argv[2]) : 64;
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) { perror(argv[1]); return 1; }
  char buf[4096];
  for (int i = 0; i < 4096; i++) buf[i] = 1;
  for (long i = 0; i < n; i++) if (write(fd, buf, page) != page) { perror("write"); return 1; }
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  char *m = mmap(0, n * page, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 1; }
  madvise(m, n * page, MADV_RANDOM);
  printf("%ld\n", read_file_pages(m, n));
  munmap(m, n * page);
  close(fd);
  unlink(argv[1]);
  return 0;
}
