/* Allocates, then changes its working directory to argv[1] and exits:
   its profile belongs where it was started. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *volatile keep;
int main(int argc, char **argv) {
  for (int i = 0; i < 100; i++) { keep = malloc(64); free(keep); }
  if (argc < 2 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
  printf("moved\n");
  return 0;
}
