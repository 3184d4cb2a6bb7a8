/* traceme N: makes its parent its tracer (ptrace(PTRACE_TRACEME), as an
 * anti-debugging check does, with no debugger there), then burns N
 * million loop rounds and prints the ptrace result. Its parent, not a
 * debugger, never resumes it from a stop: a signal sent to it after the
 * call stops it for good. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>

__attribute__((noinline)) static unsigned long burn(unsigned long n) {
  volatile unsigned long x = 1;
  for (unsigned long i = 0; i < n; i++) x = x * 3 + i;
  return x;
}

int main(int argc, char **argv) {
  unsigned long n = (argc > 1 ? strtoul(argv[1], 0, 10) : 100) * 1000000UL;
  long r = ptrace(PTRACE_TRACEME, 0, 0, 0);
  burn(n);
  printf("traceme %ld\n", r);
  return 0;
}
