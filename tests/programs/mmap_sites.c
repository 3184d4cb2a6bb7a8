/* Anonymous mappings of known sizes at known sites, for -mm.
 *
 * Sizes are in units of 64 KiB (a multiple of every page size), and each
 * site is a function of its own (noinline) so that the profile charges it
 * by name. What each site leaves mapped at exit is in the test
 * (tests/tests/mmap_profile.rs). Prints one line of what it saw and exits
 * with status 3. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define U ((size_t)64 << 10)
#define NI __attribute__((noinline))

static inline __attribute__((always_inline)) void *anon(size_t len, int prot, int flags, void *at)
{
    void *p = mmap(at, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

/* Every site touches what it maps (the sum is printed). */
static unsigned long touched;
static void touch(void *p, size_t len)
{
    for (size_t i = 0; i < len; i += 4096)
        ((volatile char *)p)[i] = 1;
    touched += len / U;
}

NI void *m_keep(void) { void *p = anon(3 * U, PROT_READ | PROT_WRITE, 0, NULL); touch(p, 3 * U); return p; }
NI void *m_freed(void) { return anon(2 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_head(void) { return anon(4 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_tail(void) { return anon(4 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_hole(void) { return anon(5 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_reserve(void) { return anon(6 * U, PROT_NONE, MAP_NORESERVE, NULL); }
NI void *m_span_a(void *at) { return anon(3 * U, PROT_READ | PROT_WRITE, MAP_FIXED, at); }
NI void *m_span_b(void *at) { return anon(3 * U, PROT_READ | PROT_WRITE, MAP_FIXED, at); }
NI void *m_under_file(void) { return anon(4 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_grow(void) { return anon(1 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_move(void) { return anon(2 * U, PROT_READ | PROT_WRITE, 0, NULL); }
NI void *m_target(void) { return anon(4 * U, PROT_NONE, MAP_NORESERVE, NULL); }
NI void *m_shrink(void) { return anon(4 * U, PROT_READ | PROT_WRITE, 0, NULL); }

NI void *m_file(int fd, void *at, int flags)
{
    void *p = mmap(at, U, PROT_READ, MAP_PRIVATE | flags, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap file");
        exit(1);
    }
    return p;
}

NI void *m_grow_call(void *p)
{
    void *q = mremap(p, U, 4 * U, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) {
        perror("mremap grow");
        exit(1);
    }
    touch(q, 4 * U);
    return q;
}

NI void *m_move_call(void *p, void *to)
{
    void *q = mremap(p, 2 * U, 2 * U, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    if (q != to) {
        perror("mremap move");
        exit(1);
    }
    return q;
}

NI void m_shrink_call(void *p)
{
    if (mremap(p, 4 * U, U, 0) != p) {
        perror("mremap shrink");
        exit(1);
    }
}

NI void m_refused(void *p)
{
    /* Cannot grow in place without MREMAP_MAYMOVE: the mapping after it
     * is in the way. Nothing changes. */
    if (mremap(p, U, 64 * U, 0) != MAP_FAILED) {
        fprintf(stderr, "mremap grew in place\n");
        exit(1);
    }
}

NI void *m_kept(void) { return anon(2 * U, PROT_READ | PROT_WRITE, 0, NULL); }

/* MREMAP_DONTUNMAP (Linux 5.7) moves the pages and leaves the old range
 * mapped: 1 when it did, 0 when this kernel (or emulator) refuses it. */
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* older C libraries' headers */
#endif
NI int m_dontunmap_call(void *p)
{
    /* The new address is given (NULL: none): Linux 6.18 reads it with
     * MREMAP_DONTUNMAP, and glibc passes on whatever the register held. */
    return mremap(p, 2 * U, 2 * U, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL) != MAP_FAILED;
}

NI void *m_malloc(void)
{
    void *p = malloc(1 << 20);
    __asm__ volatile("" : : "r"(p) : "memory"); /* not a tail call */
    return p;
}

#define THREADS 4
#define PER_THREAD 8
NI void *t_map(void *arg)
{
    void *p[PER_THREAD];
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++)
        p[i] = anon(U, PROT_READ | PROT_WRITE, 0, NULL);
    for (int i = 0; i < PER_THREAD; i += 2)
        munmap(p[i], U);
    return NULL;
}

/* "signal K": a thread sends the main thread K signals, one at a time,
 * while the main thread maps and unmaps in a loop; each handler maps a
 * unit and unmaps the one the previous handler mapped, so a handler runs
 * inside the profiler's mmap and munmap hooks. Signals arrive only while
 * the main thread is in s_loop. */
static volatile sig_atomic_t handled;
static void *last;
NI void h_sig(int sig)
{
    (void)sig;
    void *p = mmap(NULL, U, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (last)
        munmap(last, U);
    last = p;
    handled = handled + 1;
}

static volatile int sending = 1, looping;
static pthread_t main_thread;
static void *sender(void *arg)
{
    long k = (long)arg;
    /* Only while the main thread loops (not while it is still inside
     * pthread_create, where the profiler's own code runs). */
    while (!looping)
        sched_yield();
    for (long i = 0; i < k; i++) {
        int before = handled;
        pthread_kill(main_thread, SIGUSR1);
        while (handled == before)
            sched_yield();
    }
    sending = 0;
    return NULL;
}

NI unsigned long s_loop(void)
{
    unsigned long n = 0;
    looping = 1;
    for (int after = 0; after < 100; after += !sending) {
        void *p = mmap(NULL, U, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        munmap(p, U);
        n++;
    }
    return n;
}

static int signals(long k)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h_sig;
    sigaction(SIGUSR1, &sa, NULL);
    main_thread = pthread_self();
    pthread_t t;
    pthread_create(&t, NULL, sender, (void *)k);
    unsigned long n = s_loop();
    pthread_join(t, NULL);
    printf("signals %d loops %lu\n", (int)handled, n);
    return 3;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "signal") == 0)
        return signals(atol(argv[2]));
    m_keep();
    munmap(m_freed(), 2 * U);

    char *h = m_head();
    munmap(h, U); /* head */
    char *t = m_tail();
    munmap(t + 3 * U, U); /* tail */
    char *o = m_hole();
    munmap(o + 2 * U, U); /* middle: two ranges of 2 U each */

    /* Two mappings side by side over a reservation (MAP_FIXED replaces
     * it), then one unmap across both: 1 U of each is left. */
    char *r = m_reserve();
    m_span_a(r);
    m_span_b(r + 3 * U);
    munmap(r + U, 4 * U);

    /* A file mapping is not counted; one made over a counted mapping ends
     * that part of it. */
    FILE *f = tmpfile();
    if (!f || ftruncate(fileno(f), U) != 0) {
        perror("tmpfile");
        return 1;
    }
    m_file(fileno(f), NULL, 0);
    char *u = m_under_file();
    m_file(fileno(f), u + U, MAP_FIXED); /* u keeps 1 U + 2 U */

    void *g = m_grow_call(m_grow());
    (void)g;
    char *target = m_target();
    m_move_call(m_move(), target + U); /* target keeps U and U */
    char *s = m_shrink();
    m_shrink_call(s);
    /* Something in the way of growing s in place. */
    anon(U, PROT_NONE, MAP_FIXED, s + U);
    m_refused(s);
    munmap(s + U, U);

    int dontunmap = m_dontunmap_call(m_kept());

    void *big = m_malloc();
    memset(big, 1, 1 << 20);
    free(big);

    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, t_map, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);

    printf("mapped and touched %lu units; dontunmap %s\n", touched, dontunmap ? "yes" : "no");
    return 3;
}
