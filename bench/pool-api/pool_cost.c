/* Cost of include/igprof.h's pool calls: a bump arena handing out and
 * taking back N blocks, with and without igprof_alloc_event and
 * igprof_free_event around each. Prints ns per block of each loop, the
 * fastest of REPS repetitions. Built by bench/pool-api-cost.
 *
 * Usage: pool_cost N REPS
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "igprof.h"

#define SLAB (1 << 16)
static char slab[SLAB];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

/* One block of 16..79 bytes from the arena (wrapping round), its address
 * kept from the optimiser. */
static inline char *carve(size_t *used, long i) {
  size_t n = 16 + (size_t)(i & 63);
  if (*used + n > SLAB)
    *used = 64;
  char *p = slab + *used;
  *used += (n + 15) & ~(size_t)15;
  __asm__ volatile("" : : "r"(p) : "memory");
  return p;
}

static __attribute__((noinline)) double plain_loop(long n) {
  size_t used = 64;
  double t = now();
  for (long i = 0; i < n; i++)
    carve(&used, i);
  return (now() - t) / n;
}

static __attribute__((noinline)) double reported_loop(long n) {
  size_t used = 64;
  double t = now();
  for (long i = 0; i < n; i++) {
    char *p = carve(&used, i);
    igprof_alloc_event(p, 16 + (size_t)(i & 63));
    igprof_free_event(p);
  }
  return (now() - t) / n;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100000000;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  double best_plain = 1e30, best_reported = 1e30;
  for (int r = 0; r < reps; r++) {
    double a = plain_loop(n), b = reported_loop(n);
    if (a < best_plain)
      best_plain = a;
    if (b < best_reported)
      best_reported = b;
  }
  printf("C   without calls %.3f ns/block, with alloc+free events %.3f ns/block: "
         "%+.3f ns per pair of calls\n",
         best_plain, best_reported, best_reported - best_plain);
  return 0;
}
