/* Allocations of known sizes, built with a sanitizer (-fsanitize=address,
   undefined or thread) for tests/tests/sanitizers.rs.
   san_small: N (argv[1]) mallocs of 100 bytes, each freed right after.
   san_kept: one block of 12345 bytes kept in a global until exit (live at
   exit for the profiler; reachable, so LeakSanitizer does not report it).
   san_lost: with argv[2] = "leak", one block of 777 bytes whose address is
   dropped (LeakSanitizer reports it at exit and the exit status is its),
   then san_scrub.
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
/* LeakSanitizer scans stacks and registers conservatively: a stale copy
   of the lost block's address, left below the stack pointer by malloc or
   in a register, hides the leak if it is ever written back into a live
   frame, as a signal frame does with the registers it saves (a sampling
   profiler's signal). san_scrub clears both after san_lost, so that the
   test sees what it is about: whether the profiler's own records keep
   the block reachable. */
__attribute__((noinline)) void san_scrub(void) {
  volatile char b[16384];
  for (unsigned i = 0; i < sizeof b; i++) b[i] = 0;
#if defined(__x86_64__)
  __asm__ volatile("xor %%eax, %%eax\n\txor %%ecx, %%ecx\n\txor %%edx, %%edx\n\t"
                   "xor %%esi, %%esi\n\txor %%edi, %%edi\n\txor %%r8d, %%r8d\n\t"
                   "xor %%r9d, %%r9d\n\txor %%r10d, %%r10d\n\txor %%r11d, %%r11d\n\t"
                   "pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1\n\tpxor %%xmm2, %%xmm2\n\t"
                   "pxor %%xmm3, %%xmm3\n\tpxor %%xmm4, %%xmm4\n\tpxor %%xmm5, %%xmm5\n\t"
                   "pxor %%xmm6, %%xmm6\n\tpxor %%xmm7, %%xmm7\n\tpxor %%xmm8, %%xmm8\n\t"
                   "pxor %%xmm9, %%xmm9\n\tpxor %%xmm10, %%xmm10\n\tpxor %%xmm11, %%xmm11\n\t"
                   "pxor %%xmm12, %%xmm12\n\tpxor %%xmm13, %%xmm13\n\tpxor %%xmm14, %%xmm14\n\t"
                   "pxor %%xmm15, %%xmm15"
                   ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0",
                   "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                   "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory");
#endif
}
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
  if (argc > 2 && strcmp(argv[2], "leak") == 0) { san_lost(); san_scrub(); }
  if (argc > 2 && strcmp(argv[2], "ub") == 0) printf("overflow %d\n", san_overflow(argc));
  san_fds();
  double x = san_burn(50000000);
  printf("done %ld %d\n", n, x > 0);
  fflush(stdout);
  return 3;
}
