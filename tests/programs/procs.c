/* fork without exec, fork+exec of itself, and system(): each process burns
   CPU in its own function. Usage: procs [exec-child|reexec|reexec-second];
   reexec: burns, then replaces itself (same pid) by exec, and burns again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile unsigned long sink;
__attribute__((noinline)) static unsigned long burn(unsigned long n) {
  unsigned long x = 1;
  for (unsigned long i = 0; i < n; i++) { x = x * 6364136223846793005ul + 1; __asm__ volatile("" : "+r"(x)); }
  return x;
}
__attribute__((noinline)) void parent_work(void) { sink += burn(60000000); }
__attribute__((noinline)) void forked_child_work(void) { sink += burn(60000000); }
__attribute__((noinline)) void exec_child_work(void) { sink += burn(60000000); }
__attribute__((noinline)) void first_image_work(void) { sink += burn(60000000); }
__attribute__((noinline)) void second_image_work(void) { sink += burn(60000000); }
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "exec-child")) { exec_child_work(); return 0; }
  if (argc > 1 && !strcmp(argv[1], "reexec")) {
    first_image_work();
    execl("/proc/self/exe", argv[0], "reexec-second", (char *)0);
    return 127;
  }
  if (argc > 1 && !strcmp(argv[1], "reexec-second")) { second_image_work(); return 0; }
  pid_t a = fork();
  if (a == 0) { forked_child_work(); exit(0); }
  pid_t b = fork();
  if (b == 0) { execl("/proc/self/exe", argv[0], "exec-child", (char *)0); _exit(127); }
  int rc = system("exit 0");
  parent_work();
  int s1, s2;
  waitpid(a, &s1, 0);
  waitpid(b, &s2, 0);
  printf("%d %d %d\n", WEXITSTATUS(s1), WEXITSTATUS(s2), WEXITSTATUS(rc));
  return WEXITSTATUS(s1) || WEXITSTATUS(s2) || WEXITSTATUS(rc);
}
