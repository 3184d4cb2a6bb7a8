/* Uses SIGPROF itself: installs a handler, runs ITIMER_PROF, blocks SIGPROF
   for a phase and checks that (a) no handler call happens while blocked,
   (b) the held signal is delivered on unblock, (c) sigprocmask reports it
   blocked, (d) the handler runs while unblocked. Prints the counts and
   exits 0 when everything behaved as POSIX says. With the argument
   "cycles": blocks and unblocks it 100 times, each block long enough for
   the timer to fire, and counts the cycles where a handler call came
   while blocked or the held signal was not delivered by the unblock. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include "burn_ms.h"
static volatile sig_atomic_t calls;
static void on_prof(int s) { (void)s; calls++; }
__attribute__((noinline)) void blocked_phase(void) { burn_ms(300); sink++; }
__attribute__((noinline)) void unblocked_phase(void) { burn_ms(300); sink++; }
__attribute__((noinline)) void held_phase(void) { burn_ms(20); sink++; }
int main(int argc, char **argv) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_prof;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, 0)) return 10;
  if (sigaction(SIGPROF, 0, &old) || old.sa_handler != on_prof) return 11;
  sigset_t set, cur;
  sigemptyset(&set);
  sigaddset(&set, SIGPROF);
  if (sigprocmask(SIG_BLOCK, &set, 0)) return 12;
  if (sigprocmask(SIG_BLOCK, 0, &cur) || !sigismember(&cur, SIGPROF)) return 13;
  struct itimerval it = {{0, 10000}, {0, 10000}};
  if (argc > 1 && !strcmp(argv[1], "cycles")) {
    if (sigprocmask(SIG_UNBLOCK, &set, 0)) return 14;
    setitimer(ITIMER_PROF, &it, 0);
    int wrong = 0;
    for (int i = 0; i < 100; i++) {
      sigprocmask(SIG_BLOCK, &set, 0);
      int before = calls;
      held_phase();
      int during = calls - before;
      sigprocmask(SIG_UNBLOCK, &set, 0);
      wrong += during != 0 || calls == before;
    }
    printf("cycles=100 wrong=%d\n", wrong);
    return wrong != 0;
  }
  setitimer(ITIMER_PROF, &it, 0);
  blocked_phase();
  int during = calls;
  sigprocmask(SIG_UNBLOCK, &set, 0);
  int after_unblock = calls;
  unblocked_phase();
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, 0);
  int total = calls;
  printf("during=%d after_unblock=%d total=%d\n", during, after_unblock, total);
  return (during == 0 && after_unblock >= 1 && total > after_unblock + 5) ? 0 : 1;
}
