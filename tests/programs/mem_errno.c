/* What the program sees through the hooks: errno at start, return values
   and errno after successful and failing allocation and descriptor calls.
   The output must be the same with and without the profiler. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *volatile keep;
int main(void) {
  /* C: errno is zero at program start; the profiler's start-up (files it
     read or did not find) must not change that. */
  printf("errno at start: %d\n", errno);
  errno = 1234; keep = malloc(100); printf("malloc ok: errno %d\n", errno); free(keep);
  errno = 1234; free(NULL); printf("free(NULL): errno %d\n", errno);
  errno = 0; keep = malloc(SIZE_MAX / 2); printf("malloc huge: %s errno %d\n", keep ? "ptr" : "null", errno);
  errno = 0; keep = calloc(SIZE_MAX / 2, 4); printf("calloc overflow: %s errno %d\n", keep ? "ptr" : "null", errno);
  void *p = malloc(10);
  errno = 0; keep = realloc(p, SIZE_MAX / 2); printf("realloc huge: %s errno %d\n", keep ? "ptr" : "null", errno);
  free(p);
  int e;
  void *q = 0; int r = posix_memalign(&q, 3, 10); printf("posix_memalign bad align: %d %s\n", r, q ? "ptr" : "null");
  errno = 1234; int fd = open("/dev/null", O_RDONLY); printf("open ok: %s errno %d\n", fd >= 0 ? "fd" : "-1", errno);
  errno = 1234; r = close(fd); e = errno; printf("close ok: %d errno %d\n", r, e);
  errno = 0; r = open("/nonexistent/x", O_RDONLY); e = errno; printf("open missing: %d errno %d\n", r, e);
  errno = 0; r = close(987); e = errno; printf("close bad: %d errno %d\n", r, e);
  errno = 0; r = dup(987); e = errno; printf("dup bad: %d errno %d\n", r, e);
  errno = 0; FILE *f = fopen("/nonexistent/x", "r"); printf("fopen missing: %s errno %d\n", f ? "FILE" : "null", errno);
  return 0;
}
