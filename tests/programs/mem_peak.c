/* Phases whose memory peaks at a known moment: at the process's peak,
   phase_b holds 20 x 40000 bytes and phase_c 3 x 500000; phase_a (freed
   before) and phase_d (after) hold nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void *volatile a[10], *volatile b[20], *volatile c[3], *volatile d;
__attribute__((noinline)) void phase_a(void) { for (int i = 0; i < 10; i++) { a[i] = malloc(100000); memset((void *)a[i], 1, 100000); } }
__attribute__((noinline)) void phase_b(void) { for (int i = 0; i < 20; i++) { b[i] = malloc(40000); memset((void *)b[i], 1, 40000); } }
__attribute__((noinline)) void phase_c(void) { for (int i = 0; i < 3; i++) { c[i] = malloc(500000); memset((void *)c[i], 1, 500000); } }
__attribute__((noinline)) void phase_d(void) { d = malloc(1000000); memset((void *)d, 1, 1000000); }
int main(void) {
  phase_a();                       /* live 1,000,000 */
  phase_b();                       /* live 1,800,000 */
  for (int i = 0; i < 10; i++) free((void *)a[i]);   /* 800,000 */
  phase_c();                       /* 2,300,000: the peak */
  for (int i = 0; i < 3; i++) free((void *)c[i]);    /* 800,000 */
  phase_d();                       /* 1,800,000 */
  printf("peak done\n");
  return 0;
}
