/* tracer PROGRAM ARGS...: runs PROGRAM traced (ptrace), as a debugger
 * does, passing every signal on to it, and prints how many signals of
 * each kind stopped it: "SIGTRAP n", "SIGPROF n" (a debugger such as gdb
 * stops the program and waits for its user at each SIGTRAP).
 * Exits with the program's exit status. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: tracer PROGRAM ARGS...\n");
    return 2;
  }
  pid_t child = fork();
  if (child == 0) {
    ptrace(PTRACE_TRACEME, 0, 0, 0);
    raise(SIGSTOP);
    execvp(argv[1], argv + 1);
    _exit(127);
  }
  int status;
  waitpid(child, &status, 0); /* its SIGSTOP */
  /* The exec is an event stop, not a SIGTRAP to pass on. */
  ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL);
  ptrace(PTRACE_CONT, child, 0, 0);
  long traps = 0, profs = 0;
  for (;;) {
    if (waitpid(child, &status, 0) < 0)
      return 1;
    if (WIFEXITED(status) || WIFSIGNALED(status))
      break;
    int sig = 0;
    if (WIFSTOPPED(status) && (status >> 16) == 0) {
      sig = WSTOPSIG(status);
      traps += sig == SIGTRAP;
      profs += sig == SIGPROF;
    }
    ptrace(PTRACE_CONT, child, 0, sig);
  }
  printf("SIGTRAP %ld\nSIGPROF %ld\n", traps, profs);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
