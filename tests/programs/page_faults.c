/* Page faults with known totals, for -e page-faults (and perf stat).
   touch_pages(n) maps n fresh anonymous pages and writes one byte of each,
   once: exactly n minor faults, all under touch_pages (a user-mode write
   to a page never touched faults once). other_pages does the same for
   n / 4 pages.
   Usage: page_faults [PAGES] [threads|fork] (default 10000 pages):
   threads: a second thread runs thread_pages(n / 2) meanwhile;
   fork: a child process runs child_pages(n / 2) and exits.
   Prints what it did. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static const long page = 4096;

__attribute__((noinline)) static void touch(long n) {
  char *p = mmap(0, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  for (long i = 0; i < n; i++) ((volatile char *)p)[i * page] = 1;
  munmap(p, n * page);
}

/* The empty asm keeps each call out of tail position, so that every
   function below has its own frame on the faulting stacks. */
__attribute__((noinline)) void touch_pages(long n) { touch(n); __asm__ volatile(""); }
__attribute__((noinline)) void other_pages(long n) { touch(n); __asm__ volatile(""); }
__attribute__((noinline)) void child_pages(long n) { touch(n); __asm__ volatile(""); }
__attribute__((noinline)) static void *thread_pages(void *n) { touch((long)n); __asm__ volatile(""); return 0; }

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000;
  const char *mode = argc > 2 ? argv[2] : "";
  pthread_t t;
  if (!strcmp(mode, "threads")) pthread_create(&t, 0, thread_pages, (void *)(n / 2));
  if (!strcmp(mode, "fork")) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { child_pages(n / 2); _exit(0); }
    int st;
    waitpid(pid, &st, 0);
  }
  touch_pages(n);
  other_pages(n / 4);
  if (!strcmp(mode, "threads")) pthread_join(t, 0);
  printf("touch_pages %ld other_pages %ld %s\n", n, n / 4, mode);
  return 0;
}
