/* Allocation from a signal handler while the main thread allocates: a
   100 us timer's handler allocates and frees 200 bytes (its own tcache
   bin, warmed up first), the main loop 32 bytes. Prints how many times
   the handler allocated: the profile must count exactly that many. The
   timer signals the main thread itself (SIGEV_THREAD_ID), so the handler
   runs while it allocates, never on another thread. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static volatile sig_atomic_t hits;
static void *volatile keep;
__attribute__((noinline)) void in_handler(void) { void *p = malloc(200); keep = p; free(p); }
static void on_alarm(int s) { (void)s; in_handler(); hits++; }
__attribute__((noinline)) void churn(long n) { for (long i = 0; i < n; i++) { void *p = malloc(32); keep = p; free(p); } }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 3000000;
  keep = malloc(200); free(keep); keep = malloc(32); free(keep);
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, 0);
  struct sigevent ev; memset(&ev, 0, sizeof ev);
  ev.sigev_notify = SIGEV_THREAD_ID; ev.sigev_signo = SIGALRM; ev._sigev_un._tid = gettid();
  timer_t tm;
  if (timer_create(CLOCK_MONOTONIC, &ev, &tm) != 0) return 2;
  struct itimerspec it = {{0, 100000}, {0, 100000}};
  timer_settime(tm, 0, &it, 0);
  churn(n);
  timer_delete(tm);
  printf("hits %d\n", (int)hits);
  return 0;
}
