/* Allocation sites with known sizes for the sampled memory profiler
   (tests/tests/mem_sampled.rs computes every site's exact calls and bytes,
   and the standard error of a sampled estimate, from the same formulas).
   Blocks below 128 KiB come from the heap, larger ones from mmap (the
   threshold is fixed so that glibc does not move it), and nothing big is
   touched, so a run is quick and small in memory.

   argv[1] = scale S (1 to 4, default 1): every loop count is multiplied by S.

   site_mixed:    1,500,000 S x malloc(1024 + (i * 7919) % 7168), freed
   site_calloc:      20,000 S x calloc(32 + i % 64, 4096), freed (mmap'd)
   site_realloc:    600,000 S x malloc(6144 + i % 2048) then
                                realloc to 2048 + (i * 13) % 2048, freed
   site_align:      800,000 S x memalign / posix_memalign / aligned_alloc
                                (i % 3) of 4096 + (i * 7) % 4096, align 64
   site_big:            500 S x malloc(1 MiB + (i * 37 % 16) MiB), freed
   site_small:    2,097,152 S x malloc(32), freed (64 MiB)
   site_leak_big:     1,600 S x malloc(1 MiB), never freed
   site_leak_small: 100,000 S x malloc(100), never freed */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
static void *volatile keep;
#define MIB (1024L * 1024)
__attribute__((noinline)) void site_mixed(long n) {
  for (long i = 0; i < n; i++) { void *p = malloc(1024 + (i * 7919) % 7168); keep = p; free(p); }
}
__attribute__((noinline)) void site_calloc(long n) {
  for (long i = 0; i < n; i++) { void *p = calloc(32 + i % 64, 4096); keep = p; free(p); }
}
__attribute__((noinline)) void site_realloc(long n) {
  for (long i = 0; i < n; i++) {
    void *p = malloc(6144 + i % 2048);
    keep = p;
    p = realloc(p, 2048 + (i * 13) % 2048);
    keep = p;
    free(p);
  }
}
__attribute__((noinline)) void site_align(long n) {
  for (long i = 0; i < n; i++) {
    size_t size = 4096 + (i * 7) % 4096;
    void *p = 0;
    switch (i % 3) {
    case 0: p = memalign(64, size); break;
    case 1: if (posix_memalign(&p, 64, size) != 0) p = 0; break;
    default: p = aligned_alloc(64, size); break;
    }
    keep = p;
    free(p);
  }
}
__attribute__((noinline)) void site_big(long n) {
  for (long i = 0; i < n; i++) { void *p = malloc(MIB + (i * 37 % 16) * MIB); keep = p; free(p); }
}
__attribute__((noinline)) void site_small(long n) {
  for (long i = 0; i < n; i++) { void *p = malloc(32); keep = p; free(p); }
}
#define MAX_SCALE 4
static void *volatile leaks[(1600 + 100000) * MAX_SCALE];
__attribute__((noinline)) void site_leak_big(long n, long at) {
  for (long i = 0; i < n; i++) leaks[at + i] = malloc(MIB);
}
__attribute__((noinline)) void site_leak_small(long n, long at) {
  for (long i = 0; i < n; i++) leaks[at + i] = malloc(100);
}
int main(int argc, char **argv) {
  long s = argc > 1 ? atol(argv[1]) : 1;
  if (s < 1 || s > MAX_SCALE) return 2;
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  site_mixed(1500000 * s);
  site_calloc(20000 * s);
  site_realloc(600000 * s);
  site_align(800000 * s);
  site_big(500 * s);
  site_small(2097152 * s);
  site_leak_big(1600 * s, 0);
  site_leak_small(100000 * s, 1600 * s);
  printf("sites done %ld\n", s);
  return 0;
}
