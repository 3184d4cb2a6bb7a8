/* -finst: main calls work(1), forks; the child calls work(4), the parent
   waits and calls work(2); work(n) calls leaf() n times. */
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
__attribute__((noinline)) void leaf(void) { usleep(10000); }
__attribute__((noinline)) void work(int n) { for (int i = 0; i < n; i++) leaf(); }
int main(void) { work(1); pid_t p = fork(); if (p == 0) { work(4); return 0; }
int st; waitpid(p, &st, 0); work(2); printf("forked\n"); return 0; }
