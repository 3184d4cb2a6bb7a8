/* Half wall-clock time asleep in sleeper(), half burning CPU in burner();
   then asks libigprof for a snapshot (igprof_dump_now, found with dlsym so
   the program also runs without the profiler) and raises the dump signal
   given in argv[1] (0 = none). */
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
__attribute__((noinline)) void burner(void) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  do {
    for (int i = 0; i < 100000; i++) sink = sink * 31 + i;
    clock_gettime(CLOCK_MONOTONIC, &b);
  } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < 400);
  sink++;
}
int main(int argc, char **argv) {
  sleeper();
  burner();
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
