/* Time off the CPU with known totals, for -e context-switches and -oc.
   wait_here(): SLEEPS nanosleeps of SLEEP_US microseconds (a voluntary
   context switch each, unless a preemption just before it let the sleep
   end first); lock_here(): blocks LOCK_MS milliseconds on a mutex another
   thread holds (it takes the lock, signals, sleeps from when main has
   taken its marks, then unlocks). Usage: offcpu [SLEEPS] [SLEEP_US]
   [LOCK_MS] (default 100 10000 500). Prints what it did; with
   OFFCPU_TIMES=FILE in the environment, also writes to FILE the wall-clock
   minus CPU time each of wait_here and lock_here really took (ns): on a
   loaded machine a woken thread waits for a CPU, which is time off the
   CPU too; then the main thread's voluntary and involuntary context
   switches (getrusage's counts) inside wait_here, and from the start of
   main to its last printf: on a loaded machine every preemption is one
   more involuntary switch. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ready_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_c = PTHREAD_COND_INITIALIZER;
static int ready, go;
static long lock_ms;

static void sleep_us(long us) {
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&t, &t) != 0) {}
}

__attribute__((noinline)) void wait_here(long n, long us) {
  for (long i = 0; i < n; i++) sleep_us(us);
  __asm__ volatile("");
}

static void *holder(void *arg) {
  (void)arg;
  pthread_mutex_lock(&m);
  pthread_mutex_lock(&ready_m);
  ready = 1;
  pthread_cond_broadcast(&ready_c);
  /* The sleep starts once main has taken its marks: however late main
     wakes up on a loaded machine, it then waits the whole LOCK_MS. */
  while (!go) pthread_cond_wait(&ready_c, &ready_m);
  pthread_mutex_unlock(&ready_m);
  sleep_us(lock_ms * 1000);
  pthread_mutex_unlock(&m);
  return 0;
}

__attribute__((noinline)) void lock_here(void) {
  pthread_mutex_lock(&m);
  pthread_mutex_unlock(&m);
  __asm__ volatile("");
}

static long long ns(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* This thread's voluntary and involuntary context switches since *from
   (zeros for "so far"). */
struct switches { long vol, invol; };
static struct switches switches_since(struct switches from) {
  struct rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return (struct switches){u.ru_nvcsw - from.vol, u.ru_nivcsw - from.invol};
}

/* Wall-clock minus this thread's CPU time since the marks. */
static long long off_since(long long wall, long long cpu) {
  return (ns(CLOCK_MONOTONIC) - wall) - (ns(CLOCK_THREAD_CPUTIME_ID) - cpu);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100;
  long us = argc > 2 ? atol(argv[2]) : 10000;
  lock_ms = argc > 3 ? atol(argv[3]) : 500;
  struct switches zero = {0, 0}, in_main = switches_since(zero);
  long long wall = ns(CLOCK_MONOTONIC), cpu = ns(CLOCK_THREAD_CPUTIME_ID);
  struct switches in_wait = switches_since(zero);
  wait_here(n, us);
  in_wait = switches_since(in_wait);
  long long waited = off_since(wall, cpu), blocked = 0;
  if (lock_ms > 0) {
    pthread_t t;
    pthread_create(&t, 0, holder, 0);
    pthread_mutex_lock(&ready_m);
    while (!ready) pthread_cond_wait(&ready_c, &ready_m);
    wall = ns(CLOCK_MONOTONIC);
    cpu = ns(CLOCK_THREAD_CPUTIME_ID);
    go = 1;
    pthread_cond_broadcast(&ready_c);
    pthread_mutex_unlock(&ready_m);
    lock_here();
    blocked = off_since(wall, cpu);
    pthread_join(t, 0);
  }
  printf("slept %ld x %ld us, blocked %ld ms\n", n, us, lock_ms);
  fflush(stdout);
  in_main = switches_since(in_main);
  const char *times = getenv("OFFCPU_TIMES");
  if (times) {
    FILE *f = fopen(times, "w");
    if (f) {
      fprintf(f, "%lld %lld %ld %ld %ld %ld\n", waited, blocked, in_wait.vol,
              in_wait.invol, in_main.vol, in_main.invol);
      fclose(f);
    }
  }
  return 0;
}
