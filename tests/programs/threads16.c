/* 16 threads, thread i (0..15) burns (i+1) units of CPU in its own function
   t<i>; expected share of t<i> in CPU time: (i+1)/136. Arg: unit size. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static volatile unsigned long sink;
static unsigned long unit = 3000000;
__attribute__((noinline)) static unsigned long burn(unsigned long n) {
  unsigned long x = 0x9e3779b97f4a7c15ul;
  for (unsigned long i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; __asm__ volatile("" : "+r"(x)); }
  return x;
}
#define T(i) __attribute__((noinline)) void *t##i(void *a) { (void)a; sink += burn(unit * (i + 1)); return 0; }
T(0) T(1) T(2) T(3) T(4) T(5) T(6) T(7) T(8) T(9) T(10) T(11) T(12) T(13) T(14) T(15)
static void *(*fns[16])(void *) = {t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15};
int main(int argc, char **argv) {
  if (argc > 1) unit = strtoul(argv[1], 0, 10);
  pthread_t th[16];
  for (int i = 0; i < 16; i++) if (pthread_create(&th[i], 0, fns[i], 0)) { perror("pthread_create"); return 1; }
  for (int i = 0; i < 16; i++) pthread_join(th[i], 0);
  printf("%lu\n", sink & 1);
  return 0;
}
