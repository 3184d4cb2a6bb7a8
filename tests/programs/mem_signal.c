/* Allocation from a signal handler while the main thread allocates: a
   100 us timer's handler allocates and frees 200 bytes (its own tcache
   bin, warmed up first), the main loop 32 bytes. Prints how many times
   the handler allocated: the profile must count exactly that many. The
   timer signals the main thread itself (SIGEV_THREAD_ID), so the handler
   runs while it allocates, never on another thread.
   mem_signal N T (T > 1): T threads do the same at once, each with its
   own timer signalling it (several handlers interrupting hooks at the
   same moment). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
static long hits;
static void *volatile keep;
__attribute__((noinline)) void in_handler(void) { void *p = malloc(200); keep = p; free(p); }
static void on_alarm(int s) { (void)s; in_handler(); __atomic_add_fetch(&hits, 1, __ATOMIC_RELAXED); }
__attribute__((noinline)) void churn(long n) { for (long i = 0; i < n; i++) { void *p = malloc(32); keep = p; free(p); } }
static long n = 3000000;
/* churn(n) with a 100 us timer signalling the calling thread. */
static void *timed_churn(void *unused) {
  (void)unused;
  void *w = malloc(200); free(w); w = malloc(32); free(w);
  struct sigevent ev; memset(&ev, 0, sizeof ev);
  ev.sigev_notify = SIGEV_THREAD_ID; ev.sigev_signo = SIGALRM; ev._sigev_un._tid = gettid();
  timer_t tm;
  if (timer_create(CLOCK_MONOTONIC, &ev, &tm) != 0) exit(2);
  struct itimerspec it = {{0, 100000}, {0, 100000}};
  timer_settime(tm, 0, &it, 0);
  churn(n);
  timer_delete(tm);
  return 0;
}
int main(int argc, char **argv) {
  if (argc > 1) n = atol(argv[1]);
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, 0);
  if (threads <= 1) {
    timed_churn(0);
  } else {
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, timed_churn, 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
  }
  printf("hits %ld\n", __atomic_load_n(&hits, __ATOMIC_RELAXED));
  return 0;
}
