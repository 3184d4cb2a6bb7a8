/* Empty-memory profilers: three 256 KiB blocks (mmap'd by glibc, so fresh
   zero pages), one never written, one with its first half written, one
   cleared with zeros, then freed. For each, prints the bytes of whole pages
   inside the block and of whole pages no write touched, from which the
   test computes what -ep, -ei and -eu must report. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define SZ (256 * 1024)
#define PG 4096
/* USED(p): the compiler must assume the block's contents are read (so a
   memset right before free is not removed as a dead store). */
#define USED(p) __asm__ volatile("" : : "r"(p) : "memory")
static void report(const char *name, uintptr_t a, size_t written) {
  uintptr_t lo = (a + PG - 1) & ~(uintptr_t)(PG - 1), hi = (a + SZ) & ~(uintptr_t)(PG - 1);
  uintptr_t wend = a + written;
  size_t whole = 0, clean = 0;
  for (uintptr_t p = lo; p + PG <= hi; p += PG) { whole += PG; if (p >= wend) clean += PG; }
  printf("%s %zu %zu\n", name, whole, clean);
}
__attribute__((noinline)) void e_untouched(void) { char *volatile p = malloc(SZ); report("e_untouched", (uintptr_t)p, 0); free(p); }
__attribute__((noinline)) void e_half(void) { char *volatile p = malloc(SZ); memset(p, 0x11, SZ / 2); USED(p); report("e_half", (uintptr_t)p, SZ / 2); free(p); }
__attribute__((noinline)) void e_zeroed(void) { char *volatile p = malloc(SZ); memset(p, 0, SZ); USED(p); report("e_zeroed", (uintptr_t)p, SZ); free(p); }
int main(void) { e_untouched(); e_half(); e_zeroed(); return 0; }
