/* A close-on-exec descriptor ends at exec; one without the flag survives. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static volatile int last;
__attribute__((noinline)) int f_cloexec(void) { int fd = open("/dev/null", O_RDONLY | O_CLOEXEC); last = fd; return fd; }
__attribute__((noinline)) int f_keep(void) { int fd = open("/dev/null", O_RDONLY); last = fd; return fd; }
int main(void) {
  int a = f_cloexec(), b = f_keep();
  printf("exec %d %d\n", a, b);
  fflush(stdout);
  execl("/bin/true", "true", (char *)0);
  return 1;
}
