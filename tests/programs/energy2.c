/* Two threads burning CPU at the same time, 3:1 in CPU time: big_burner
   runs until its thread CPU clock reaches 3 x MS milliseconds, small_burner
   until MS (argv[1], default 200). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static volatile unsigned long sink;
static long ms = 200;
__attribute__((noinline)) static void burn_cpu_ms(long limit) {
  struct timespec t;
  unsigned long x = 0x9e3779b97f4a7c15ul;
  do {
    for (int i = 0; i < 100000; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; __asm__ volatile("" : "+r"(x)); }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  } while (t.tv_sec * 1000 + t.tv_nsec / 1000000 < limit);
  sink += x;
}
__attribute__((noinline)) void *big_burner(void *a) { (void)a; burn_cpu_ms(3 * ms); sink++; return 0; }
__attribute__((noinline)) void *small_burner(void *a) { (void)a; burn_cpu_ms(ms); sink++; return 0; }
int main(int argc, char **argv) {
  if (argc > 1) ms = atol(argv[1]);
  pthread_t a, b;
  pthread_create(&a, 0, big_burner, 0);
  pthread_create(&b, 0, small_burner, 0);
  pthread_join(a, 0);
  pthread_join(b, 0);
  printf("%lu\n", sink & 1);
  return 0;
}
