/* Loads an allocator library with dlopen after start-up (Debian's
 * libmimalloc.so.2, RTLD_LOCAL: the process's malloc stays glibc's; a
 * jemalloc cannot be loaded so, its TLS is initial-exec) and allocates
 * through its own entry points, found with dlsym. Prints
 * "site NAME CALLS BYTES LIVE_BLOCKS LIVE_BYTES" in the terms of the
 * memory profile. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *(*malloc_t)(size_t);
typedef void *(*realloc_t)(void *, size_t);
typedef void (*free_t)(void *);

__attribute__((noinline)) void site_loaded(malloc_t m, realloc_t r, free_t f)
{
    void *keep = 0;
    for (int i = 0; i < 400; i++) {
        char *p = m(120);
        p[0] = 1;
        p = r(p, 360);
        if (i == 7)
            keep = p;
        else
            f(p);
    }
    printf("site site_loaded %d %d %d %d\n", 800, 400 * (120 + 360), 1, 360);
    (void)keep;
}

int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libmimalloc.so.2";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        return 2;
    }
    malloc_t m = (malloc_t)dlsym(h, "mi_malloc");
    realloc_t r = (realloc_t)dlsym(h, "mi_realloc");
    free_t f = (free_t)dlsym(h, "mi_free");
    if (!m || !r || !f) {
        fprintf(stderr, "%s: no mi_malloc, mi_realloc, mi_free\n", lib);
        return 2;
    }
    site_loaded(m, r, f);
    return 0;
}
