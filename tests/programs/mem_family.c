/* Every allocation entry point once, each from its own function, with
   sizes the test knows: calls and bytes per site must be exact. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void *volatile keep;
/* T(x): store the result after the call, so the call is never a tail call
   (a tail call would charge the caller of these functions). */
#define T(x) do { void *r_ = (x); keep = r_; return r_; } while (0)
__attribute__((noinline)) void *f_malloc(void) { T(malloc(1001)); }
__attribute__((noinline)) void *f_calloc(void) { T(calloc(7, 143)); }
__attribute__((noinline)) void *f_realloc_grow(void *p) { T(realloc(p, 3003)); }
__attribute__((noinline)) void *f_realloc_null(void) { T(realloc(NULL, 1234)); }
__attribute__((noinline)) void *f_reallocarray(void *p) { T(reallocarray(p, 5, 401)); }
__attribute__((noinline)) void *f_reallocarray_null(void) { T(reallocarray(NULL, 3, 111)); }
__attribute__((noinline)) void *f_memalign(void) { T(memalign(64, 5005)); }
__attribute__((noinline)) void *f_posix_memalign(void) { void *p = 0; int r = posix_memalign(&p, 128, 6006); keep = p; return r == 0 ? p : 0; }
__attribute__((noinline)) void *f_aligned_alloc(void) { T(aligned_alloc(256, 7168)); }
__attribute__((noinline)) void *f_valloc(void) { T(valloc(8008)); }
__attribute__((noinline)) void *f_pvalloc(void) { T(pvalloc(9009)); }
__attribute__((noinline)) void *f_realloc_fail(void *p) { T(realloc(p, (size_t)1 << 62)); }
__attribute__((noinline)) void f_realloc_zero(void *p) { keep = realloc(p, 0); }
__attribute__((noinline)) void *f_leak(void) { T(malloc(4242)); }
int main(void) {
  void *a = f_malloc();
  void *b = f_calloc();
  a = f_realloc_grow(a);          /* a: 3003 at f_realloc_grow */
  void *c = f_realloc_null();
  c = f_reallocarray(c);          /* c: 2005 at f_reallocarray */
  void *ra = f_reallocarray_null(); /* glibc: reallocarray -> realloc -> malloc, all tail calls */
  void *d = f_memalign(), *e = f_posix_memalign(), *f = f_aligned_alloc();
  void *g = f_valloc(), *h = f_pvalloc();
  void *l = f_leak();             /* stays: 4242 */
  void *x = f_realloc_fail(l);    /* fails: l is still the program's */
  if (x != NULL) return 3;
  void *z = malloc(16);
  f_realloc_zero(z);              /* frees z */
  free(a); free(b); free(c); free(ra); free(d); free(e); free(f); free(g); free(h);
  printf("family done %p\n", keep);
  return 0;
}
