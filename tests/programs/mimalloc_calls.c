/* Allocates through mimalloc (libmimalloc, which also replaces malloc):
 * its mi_* API, a heap of its own, and the standard names, some of which
 * are mimalloc's wrappers around its own API (memalign -> mi_memalign):
 * each block must count once. Prints "site NAME CALLS BYTES LIVE_BLOCKS
 * LIVE_BYTES" per site, in the terms of the memory profile. */
#include <mimalloc.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *keep[4096];
static int nkeep;

static void report(const char *name, long calls, long bytes, long live_blocks, long live_bytes)
{
    printf("site %s %ld %ld %ld %ld\n", name, calls, bytes, live_blocks, live_bytes);
}

__attribute__((noinline)) void site_mi(void)
{
    for (int i = 0; i < 1000; i++) {
        char *p = mi_malloc(100);
        char *z = mi_zalloc(40);
        char *c = mi_calloc(4, 25);
        p = mi_realloc(p, 300);
        mi_free(z);
        mi_free(c);
        if (i % 100 == 0)
            keep[nkeep++] = p;
        else
            mi_free(p);
    }
    report("site_mi", 4000, 1000 * (100 + 40 + 100 + 300), 10, 3000);
}

__attribute__((noinline)) void site_mi_aligned(void)
{
    for (int i = 0; i < 200; i++) {
        char *p = mi_malloc_aligned(256, 64);
        char *s = mi_strdup("eleven char");
        mi_free(s);
        if (i == 0)
            keep[nkeep++] = p;
        else
            mi_free(p);
    }
    report("site_mi_aligned", 400, 200 * (256 + 12), 1, 256);
}

/* The heap itself is a block mimalloc allocates: made and deleted
 * outside the site. */
__attribute__((noinline)) void site_heap(mi_heap_t *h)
{
    for (int i = 0; i < 300; i++) {
        char *p = mi_heap_malloc(h, 72);
        p = mi_heap_realloc(h, p, 144);
        mi_free(p);
    }
    report("site_heap", 600, 300 * (72 + 144), 0, 0);
}

__attribute__((noinline)) void site_standard(void)
{
    for (int i = 0; i < 100; i++) {
        void *a = malloc(50);
        void *b = memalign(64, 70);
        void *c = valloc(90);
        void *d = 0;
        if (posix_memalign(&d, 32, 110) != 0)
            return;
        void *e = aligned_alloc(64, 128);
        free(a);
        free(b);
        free(c);
        free(d);
        free(e);
    }
    report("site_standard", 500, 100 * (50 + 70 + 90 + 110 + 128), 0, 0);
}

int main(void)
{
    site_mi();
    site_mi_aligned();
    mi_heap_t *h = mi_heap_new();
    site_heap(h);
    mi_heap_delete(h);
    site_standard();
    return 0;
}
