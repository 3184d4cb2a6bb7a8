/* Burns CPU, then ends in the way argv[1] says: exit, _exit, abort, kill. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static volatile unsigned long sink;
__attribute__((noinline)) void burn_before_end(void) {
  unsigned long x = 5;
  for (unsigned long i = 0; i < 100000000ul; i++) { x = x * 6364136223846793005ul + 1; __asm__ volatile("" : "+r"(x)); }
  sink += x;
}
int main(int argc, char **argv) {
  burn_before_end();
  const char *how = argc > 1 ? argv[1] : "exit";
  if (!strcmp(how, "_exit")) _exit(3);
  if (!strcmp(how, "abort")) abort();
  if (!strcmp(how, "kill")) kill(getpid(), SIGTERM);
  exit(0);
}
