/* Allocations of known sizes, built with a sanitizer (-fsanitize=address,
   undefined or thread) for tests/tests/sanitizers.rs.
   san_small: N (argv[1]) mallocs of 100 bytes, each freed right after.
   san_kept: one block of 12345 bytes kept in a global until exit (live at
   exit for the profiler; reachable, so LeakSanitizer does not report it).
   san_lost: with argv[2] = "leak", one block of 777 bytes whose address is
   dropped (LeakSanitizer reports it at exit and the exit status is its).
   san_overflow: with argv[2] = "ub", a signed addition that overflows
   (UBSan reports it on stderr and the program goes on).
   san_fds: 10 opens of /dev/null, all closed.
   Then some CPU work in san_burn, and "done N" on stdout; exit status 3. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* USED(p): the compiler must assume the block is read (so that a malloc
   and its free are not removed as a pair). */
#define USED(p) __asm__ volatile("" : : "r"(p) : "memory")
void *volatile san_kept_block;
__attribute__((noinline)) void san_small(long n) {
  for (long i = 0; i < n; i++) {
    char *p = malloc(100);
    memset(p, (int)i, 100);
    USED(p);
    free(p);
  }
}
__attribute__((noinline)) void san_kept(void) { san_kept_block = malloc(12345); }
__attribute__((noinline)) void san_lost(void) { char *volatile p = malloc(777); p[0] = 1; p = 0; }
__attribute__((noinline)) int san_overflow(int x) { return x + (int)(2147483647L - 1); }
__attribute__((noinline)) void san_fds(void) {
  for (int i = 0; i < 10; i++) {
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) close(fd);
  }
}
__attribute__((noinline)) double san_burn(long n) {
  volatile double x = 0;
  for (long i = 0; i < n; i++) x += (double)i * 0.5;
  return x;
}
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 5000;
  san_small(n);
  san_kept();
  if (argc > 2 && strcmp(argv[2], "leak") == 0) san_lost();
  if (argc > 2 && strcmp(argv[2], "ub") == 0) printf("overflow %d\n", san_overflow(argc));
  san_fds();
  double x = san_burn(50000000);
  printf("done %ld %d\n", n, x > 0);
  fflush(stdout);
  return 3;
}
