/* Uses SIGTRAP itself, the signal igprof's default sampler (sigtrap perf
   events) raises. Checks, as POSIX says they must behave:
   (a) its handler runs once per raise(SIGTRAP) and per int3 (x86-64),
   (b) inside the handler its sa_mask (SIGUSR1) and SIGTRAP are blocked,
   (c) while it blocks SIGTRAP nothing is delivered and sigprocmask says it
       is blocked; the held signal arrives on unblock,
   (d) sigaction reads back its own handler.
   Prints the counts and exits 0 when all held. With argument "die": raises
   SIGTRAP under SIG_DFL, which must kill it by SIGTRAP. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "burn_ms.h"
static volatile sig_atomic_t calls, bad_mask;
static void on_trap(int s, siginfo_t *si, void *uc) {
  (void)s; (void)si; (void)uc;
  sigset_t cur;
  sigprocmask(SIG_BLOCK, 0, &cur);
  if (!sigismember(&cur, SIGUSR1) || !sigismember(&cur, SIGTRAP)) bad_mask++;
  calls++;
}
__attribute__((noinline)) void blocked_phase(void) { burn_ms(300); sink++; }
__attribute__((noinline)) void trapping_phase(void) {
  for (int i = 0; i < 1000; i++) {
    raise(SIGTRAP);
#if defined(__x86_64__)
    __asm__ volatile("int3");
#endif
    burn_ms(0);
  }
  burn_ms(300);
  sink++; /* not a tail call: keeps this frame on the stack */
}
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "die")) {
    burn_ms(50);
    raise(SIGTRAP);
    return 3; /* not reached */
  }
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_trap;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGUSR1);
  if (sigaction(SIGTRAP, &sa, 0)) return 10;
  if (sigaction(SIGTRAP, 0, &old) || old.sa_sigaction != on_trap || !sigismember(&old.sa_mask, SIGUSR1)) return 11;
  sigset_t set, cur;
  sigemptyset(&set);
  sigaddset(&set, SIGTRAP);
  if (sigprocmask(SIG_BLOCK, &set, 0)) return 12;
  if (sigprocmask(SIG_BLOCK, 0, &cur) || !sigismember(&cur, SIGTRAP)) return 13;
  raise(SIGTRAP);
  blocked_phase();
  int during = calls;
  sigprocmask(SIG_UNBLOCK, &set, 0);
  int after_unblock = calls;
  trapping_phase();
  int per_raise = 1;
#if defined(__x86_64__)
  per_raise = 2;
#endif
  int total = calls;
  sigprocmask(SIG_BLOCK, 0, &cur);
  printf("during=%d after_unblock=%d total=%d bad_mask=%d\n", during, after_unblock, total, bad_mask);
  return (during == 0 && after_unblock == 1 && total == 1 + 1000 * per_raise && bad_mask == 0 &&
          !sigismember(&cur, SIGTRAP) && !sigismember(&cur, SIGUSR1)) ? 0 : 1;
}
