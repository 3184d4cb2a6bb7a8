/* Allocates through jemalloc linked statically (Debian's libjemalloc.a):
 * its standard names and its own mallocx family, at known sites; prints
 * what each site did as "site NAME CALLS BYTES LIVE_BLOCKS LIVE_BYTES" in
 * the terms of the memory profile (a reallocation is a call of its new
 * size; the block it replaces is freed). */
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <string.h>

static void *keep[4096];
static int nkeep;

static void report(const char *name, long calls, long bytes, long live_blocks, long live_bytes)
{
    printf("site %s %ld %ld %ld %ld\n", name, calls, bytes, live_blocks, live_bytes);
}

__attribute__((noinline)) void site_malloc(void)
{
    for (int i = 0; i < 1000; i++) {
        char *p = malloc(100);
        p[0] = 1;
        if (i % 100 == 0)
            keep[nkeep++] = p;
        else
            free(p);
    }
    report("site_malloc", 1000, 100000, 10, 1000);
}

__attribute__((noinline)) void site_mallocx(void)
{
    for (int i = 0; i < 500; i++) {
        char *p = mallocx(200, 0);
        p[0] = 1;
        if (i % 100 == 0)
            keep[nkeep++] = p;
        else
            sdallocx(p, 200, 0);
    }
    report("site_mallocx", 500, 100000, 5, 1000);
}

__attribute__((noinline)) void site_mallocx_zero(void)
{
    for (int i = 0; i < 100; i++) {
        char *p = mallocx(64, MALLOCX_ZERO | MALLOCX_ALIGN(32));
        if (p[63] != 0)
            printf("not zeroed\n");
        dallocx(p, 0);
    }
    report("site_mallocx_zero", 100, 6400, 0, 0);
}

__attribute__((noinline)) void site_rallocx(void)
{
    for (int i = 0; i < 100; i++) {
        char *p = mallocx(64, 0);
        p = rallocx(p, 640, 0);
        if (i == 0)
            keep[nkeep++] = p;
        else
            dallocx(p, 0);
    }
    report("site_rallocx", 200, 100 * (64 + 640), 1, 640);
}

__attribute__((noinline)) void site_xallocx(void)
{
    /* A large block shrunk in place: counted as a new block of the size
     * asked, when xallocx says it fits. */
    char *p = mallocx(1 << 20, 0);
    size_t got = xallocx(p, 1 << 19, 0, 0);
    keep[nkeep++] = p;
    if (got >= (1 << 19))
        report("site_xallocx", 2, (1 << 20) + (1 << 19), 1, 1 << 19);
    else
        report("site_xallocx", 1, 1 << 20, 1, 1 << 20);
}

__attribute__((noinline)) void site_calloc_realloc(void)
{
    for (int i = 0; i < 100; i++) {
        char *p = calloc(10, 30);
        p = realloc(p, 500);
        free(p);
    }
    report("site_calloc_realloc", 200, 100 * (300 + 500), 0, 0);
}

__attribute__((noinline)) void site_aligned(void)
{
    for (int i = 0; i < 50; i++) {
        void *p = 0;
        if (posix_memalign(&p, 64, 1000) != 0)
            return;
        void *q = aligned_alloc(128, 640);
        free(p);
        if (i == 0)
            keep[nkeep++] = q;
        else
            free(q);
    }
    report("site_aligned", 100, 50 * (1000 + 640), 1, 640);
}

int main(void)
{
    site_malloc();
    site_mallocx();
    site_mallocx_zero();
    site_rallocx();
    site_xallocx();
    site_calloc_realloc();
    site_aligned();
    return 0;
}
