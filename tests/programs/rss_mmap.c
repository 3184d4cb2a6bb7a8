/* Most of the memory where the heap profiler does not look: mallocs
 * HEAP_MIB MiB and maps MAP_MIB MiB with mmap, touching every page of
 * both, then prints its own peak RSS (getrusage ru_maxrss, KiB).
 *
 * Usage: rss_mmap HEAP_MIB MAP_MIB
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: rss_mmap HEAP_MIB MAP_MIB\n");
    return 2;
  }
  size_t heap = (size_t)atoi(argv[1]) << 20, map = (size_t)atoi(argv[2]) << 20;
  char *h = malloc(heap);
  char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!h || m == MAP_FAILED) {
    perror("rss_mmap");
    return 2;
  }
  memset(h, 1, heap);
  memset(m, 2, map);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("maxrss %ld\n", ru.ru_maxrss);
  free(h);
  munmap(m, map);
  return 0;
}
