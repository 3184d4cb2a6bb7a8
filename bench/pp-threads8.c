/* bench workload: 8 threads, each burning the same CPU work through a
   4-deep call chain. Arg: iterations per thread (default 150M). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static volatile unsigned long sink;
static unsigned long iters = 150000000ul;
__attribute__((noinline)) static unsigned long leaf(unsigned long n) {
  unsigned long x = 0x9e3779b97f4a7c15ul;
  for (unsigned long i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; __asm__ volatile("" : "+r"(x)); }
  return x;
}
__attribute__((noinline)) static unsigned long mid(unsigned long n) { unsigned long r = leaf(n); __asm__ volatile(""); return r + 1; }
__attribute__((noinline)) static unsigned long top(unsigned long n) { unsigned long r = mid(n); __asm__ volatile(""); return r + 1; }
static void *run(void *a) { (void)a; sink += top(iters); return 0; }
int main(int argc, char **argv) {
  if (argc > 1) iters = strtoul(argv[1], 0, 10);
  pthread_t t[8];
  for (int i = 0; i < 8; i++) pthread_create(&t[i], 0, run, 0);
  for (int i = 0; i < 8; i++) pthread_join(t[i], 0);
  printf("%lu\n", sink & 1);
  return 0;
}
