/* Whose memory is being faulted in, and by whom, for -pf -mp.
   Three sites allocate one block each (site_a 4 MiB, site_b 2 MiB, site_c
   1 MiB: mapped blocks, never touched by malloc beyond their first page),
   then fill_all() writes one byte of every page of each: the faults are
   fill_all's, the blocks site_a's, site_b's and site_c's, 4:2:1.
   Usage: mem_faults [MiB of site_c] (default 1). Prints the page counts. */
#include <stdio.h>
#include <stdlib.h>

static const long page = 4096;
static char *volatile blocks[3];

__attribute__((noinline)) void site_a(long bytes) { blocks[0] = malloc(bytes); __asm__ volatile(""); }
__attribute__((noinline)) void site_b(long bytes) { blocks[1] = malloc(bytes); __asm__ volatile(""); }
__attribute__((noinline)) void site_c(long bytes) { blocks[2] = malloc(bytes); __asm__ volatile(""); }

__attribute__((noinline)) void fill_all(const long *bytes) {
  for (int b = 0; b < 3; b++)
    for (long off = 0; off < bytes[b]; off += page) ((volatile char *)blocks[b])[off] = 1;
  __asm__ volatile("");
}

int main(int argc, char **argv) {
  long mib = argc > 1 ? atol(argv[1]) : 1;
  long bytes[3] = {4 * mib << 20, 2 * mib << 20, mib << 20};
  site_a(bytes[0]);
  site_b(bytes[1]);
  site_c(bytes[2]);
  fill_all(bytes);
  printf("pages %ld %ld %ld\n", bytes[0] / page, bytes[1] / page, bytes[2] / page);
  for (int b = 0; b < 3; b++) free(blocks[b]);
  return 0;
}
