/* A minimal allocator, preloaded: glibc's allocator under the standard
   names, and C++ operator new/delete that allocate through this malloc/free
   (as jemalloc's do), so that a profiler hooks both and must count each
   block once. Each function counts its calls, so none is a bare jump. */
#include <stddef.h>
#include <stdlib.h>
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static volatile unsigned long calls;
void *malloc(size_t n) { calls++; return __libc_malloc(n); }
void free(void *p) { calls++; __libc_free(p); }
void *calloc(size_t n, size_t m) { calls++; return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { calls++; return __libc_realloc(p, n); }
/* operator new(size_t), operator delete(void *) */
void *_Znwm(size_t n) {
  calls++;
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}
void _ZdlPv(void *p) { calls++; free(p); }
