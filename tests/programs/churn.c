/* Thread churn: WARM + ROUNDS rounds of 4 short-lived threads (args: WARM
   ROUNDS BURN_US). Each worker burns BURN_US of its own CPU clock in
   burner(), and in allocator() mallocs BLOCKS blocks of SIZE bytes: it
   frees half itself and hands half back to main, which frees them while
   the next round's threads run (after their owner exited and its profiler
   state may have been taken over by a new thread). Prints
   "rss_kib <after the warm-up rounds> <at the end>", "cpu_ns <workers' CPU
   time>" and "bytes <bytes allocated by workers>". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#define THREADS 4
#define BLOCKS 10
#define SIZE 100
static volatile unsigned long sink;
static long burn_us = 500;
struct work { void *handed[BLOCKS / 2]; long cpu_ns; };
static long thread_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
__attribute__((noinline)) static void burner(void) {
  long start = thread_cpu_ns();
  unsigned long x = 0x9e3779b97f4a7c15ul;
  while (thread_cpu_ns() - start < burn_us * 1000)
    for (int i = 0; i < 2000; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; __asm__ volatile("" : "+r"(x)); }
  sink += x;
}
__attribute__((noinline)) static void allocator(struct work *w) {
  for (int i = 0; i < BLOCKS; i++) {
    char *p = malloc(SIZE);
    p[0] = (char)i;
    if (i % 2) w->handed[i / 2] = p;
    else free(p);
  }
}
__attribute__((noinline)) static void *worker(void *a) {
  struct work *w = a;
  long start = thread_cpu_ns();
  allocator(w);
  burner();
  w->cpu_ns = thread_cpu_ns() - start;
  return 0;
}
static long rss_kib(void) {
  long size = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f || fscanf(f, "%ld %ld", &size, &rss) != 2) { perror("statm"); exit(1); }
  fclose(f);
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}
int main(int argc, char **argv) {
  long warm = argc > 1 ? atol(argv[1]) : 50, rounds = argc > 2 ? atol(argv[2]) : 500;
  if (argc > 3) burn_us = atol(argv[3]);
  static struct work w[2][THREADS];
  long cpu = 0, bytes = 0, rss_warm = 0;
  for (long r = 0; r < warm + rounds; r++) {
    struct work *cur = w[r % 2], *prev = w[(r + 1) % 2];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
      if (pthread_create(&th[i], 0, worker, &cur[i])) { perror("pthread_create"); return 1; }
    if (r > 0)
      for (int i = 0; i < THREADS; i++)
        for (int j = 0; j < BLOCKS / 2; j++) free(prev[i].handed[j]);
    for (int i = 0; i < THREADS; i++) {
      pthread_join(th[i], 0);
      cpu += cur[i].cpu_ns;
      bytes += BLOCKS * SIZE;
    }
    if (r + 1 == warm) rss_warm = rss_kib();
  }
  struct work *last = w[(warm + rounds - 1) % 2];
  for (int i = 0; i < THREADS; i++)
    for (int j = 0; j < BLOCKS / 2; j++) free(last[i].handed[j]);
  printf("rss_kib %ld %ld\ncpu_ns %ld\nbytes %ld\n", rss_warm, rss_kib(), cpu, bytes);
  return 0;
}
