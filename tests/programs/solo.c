/* A single-threaded allocation loop: prints how many threads the process
   has ("tasks N", from /proc/self/task) before and after, then "ready" and
   waits for a line on stdin before it starts, so that a test can send it
   signals while it allocates. churn(N) makes exactly N allocations of
   32..287 bytes and frees them all. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

static int tasks(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  struct dirent *e;
  if (!d) return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

__attribute__((noinline)) void churn(long n) {
  void *keep[64] = {0};
  for (long i = 0; i < n; i++) {
    int k = i & 63;
    free(keep[k]);
    keep[k] = malloc(32 + (i & 255));
  }
  for (int k = 0; k < 64; k++) free(keep[k]);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  printf("tasks %d\nready\n", tasks());
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) return 2;
  churn(n);
  printf("tasks %d\ndone\n", tasks());
  return 0;
}
