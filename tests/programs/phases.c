/* Phases of a run for -pd, igprof_enable/igprof_disable, the toggle signal
   and -pk. argv[1]:
     api     before(): 100 allocations and 150 ms of CPU; igprof_enable();
             during(): 50 allocations, 150 ms of CPU; igprof_disable();
             after(): 70 allocations, 150 ms of CPU, and frees during()'s
             blocks. Prints what enable and disable returned.
     signal  the same, turning recording on and off with raise(argv[2]).
     fork    parent_site(): 40 allocations kept; fork; the child makes 30 in
             child_site() and exits; the parent waits.
   The profiler's functions are looked up with dlsym, so the program also
   runs unprofiled (then nothing is enabled or raised). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "burn_ms.h"

static void *keep[256];

__attribute__((noinline)) void before(void) {
  for (int i = 0; i < 100; i++) free(malloc(64));
  burn_thread_ms(150);
  sink++; /* not a tail call: this frame stays on the stack */
}
__attribute__((noinline)) void during(void) {
  for (int i = 0; i < 50; i++) keep[i] = malloc(128);
  burn_thread_ms(150);
  sink++; /* not a tail call: this frame stays on the stack */
}
__attribute__((noinline)) void after(void) {
  for (int i = 0; i < 70; i++) free(malloc(32));
  burn_thread_ms(150);
  sink++; /* not a tail call: this frame stays on the stack */
}
__attribute__((noinline)) void release(void) {
  for (int i = 0; i < 50; i++) free(keep[i]);
}
__attribute__((noinline)) void parent_site(void) {
  for (int i = 0; i < 40; i++) keep[i] = malloc(16);
}
__attribute__((noinline)) void child_site(void) {
  for (int i = 0; i < 30; i++) keep[100 + i] = malloc(16);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "api";
  int (*on)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "igprof_enable");
  int (*off)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "igprof_disable");
  if (!strcmp(mode, "fork")) {
    parent_site();
    pid_t p = fork();
    if (p == 0) {
      child_site();
      _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    printf("child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
  }
  int sig = argc > 2 ? atoi(argv[2]) : 0;
  int by_signal = !strcmp(mode, "signal");
  before();
  int was_on = -2, was_off = -2;
  if (by_signal && on) raise(sig);
  else if (on) was_on = on();
  during();
  if (by_signal && on) raise(sig);
  else if (off) was_off = off();
  after();
  release();
  printf("enable %d disable %d\n", was_on, was_off);
  return 0;
}
