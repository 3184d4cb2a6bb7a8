/* 400 ms asleep in sleeper(), then 400 ms of this thread's CPU time burnt
   in burner() (CPU time, not wall time, so a busy machine stretches the
   burn instead of shrinking burner's share of the CPU profile); prints the
   wall time each took to stderr; then asks libigprof for a snapshot
   (igprof_dump_now, found with dlsym so the program also runs without the
   profiler) and raises the dump signal given in argv[1] (0 = none). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long sink;
__attribute__((noinline)) void sleeper(void) {
  struct timespec ts = {0, 400 * 1000 * 1000};
  while (nanosleep(&ts, &ts) != 0) {}
  sink++;
}
static long ms_between(const struct timespec *a, const struct timespec *b) {
  return (b->tv_sec - a->tv_sec) * 1000 + (b->tv_nsec - a->tv_nsec) / 1000000;
}
__attribute__((noinline)) void burner(void) {
  struct timespec a, b;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  do {
    for (int i = 0; i < 100000; i++) sink = sink * 31 + i;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  } while (ms_between(&a, &b) < 400);
  sink++;
}
int main(int argc, char **argv) {
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sleeper();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  burner();
  clock_gettime(CLOCK_MONOTONIC, &t2);
  fprintf(stderr, "sleep_burn: sleeper %ld ms, burner %ld ms of wall time\n", ms_between(&t0, &t1),
          ms_between(&t1, &t2));
  int (*dump_now)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "igprof_dump_now");
  if (dump_now) printf("dump_now %d\n", dump_now("snapshot.gz"));
  int sig = argc > 1 ? atoi(argv[1]) : 0;
  if (sig) {
    raise(sig);
    struct timespec ts = {0, 500 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0) {}
  }
  return 0;
}
