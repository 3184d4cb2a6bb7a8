/* Recurses N (default 10000) frames deep, then burns CPU at the bottom. */
#include <stdio.h>
#include <stdlib.h>
static volatile unsigned long sink;
__attribute__((noinline)) void bottom(void) {
  unsigned long x = 3;
  for (unsigned long i = 0; i < 300000000ul; i++) { x = x * 2862933555777941757ul + 1; __asm__ volatile("" : "+r"(x)); }
  sink += x;
}
__attribute__((noinline)) int recurse(int n) {
  if (n == 0) { bottom(); return 0; }
  int r = recurse(n - 1);
  __asm__ volatile("");
  return r + 1;
}
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 10000;
  printf("%d\n", recurse(n));
  return 0;
}
