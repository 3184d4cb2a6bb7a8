/* Three hot functions with loops of several instructions (so that samples
   land on many addresses of each), run for 5:3:2 iterations (hot_a's loop
   costs the most: about 60/25/15% of the time), each reached from main
   through work(). Built stripped by the tests, to check that all addresses
   of one unnamed function are one entry. Units default to 100. */
#include <stdio.h>
#include <stdlib.h>
static volatile unsigned long sink;
__attribute__((noinline)) static unsigned long hot_a(unsigned long n) {
  unsigned long x = 0x9e3779b97f4a7c15ul, y = n;
  for (unsigned long i = 0; i < n * 5; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; y += x * 3; __asm__ volatile("" : "+r"(x), "+r"(y)); }
  return x ^ y;
}
__attribute__((noinline)) static unsigned long hot_b(unsigned long n) {
  unsigned long x = 0x243f6a8885a308d3ul, y = n;
  for (unsigned long i = 0; i < n * 3; i++) { x = x * 6364136223846793005ul + 1442695040888963407ul; y ^= x >> 29; __asm__ volatile("" : "+r"(x), "+r"(y)); }
  return x + y;
}
__attribute__((noinline)) static unsigned long hot_c(unsigned long n) {
  unsigned long x = 0x13198a2e03707344ul, y = 1;
  for (unsigned long i = 0; i < n * 2; i++) { x += 0x9e3779b97f4a7c15ul; y = (y ^ x) * 0xbf58476d1ce4e5b9ul; __asm__ volatile("" : "+r"(x), "+r"(y)); }
  return x - y;
}
__attribute__((noinline)) static void work(int units) {
  for (int u = 0; u < units; u++) { sink += hot_a(300000); sink += hot_b(300000); sink += hot_c(300000); }
}
int main(int argc, char **argv) {
  int units = argc > 1 ? atoi(argv[1]) : 100;
  work(units);
  printf("%lu\n", sink & 1);
  return 0;
}
