/* A custom pool reported to the profiler through include/igprof.h: one
 * malloc'd slab, blocks carved from it at two sites and some given back.
 *
 * Usage: pool_arena NODES NAMES
 *   site_nodes carves NODES blocks of 48 bytes and gives back every fourth
 *   (i % 4 == 0); site_names carves NAMES blocks of 16 + (i * 37) % 200
 *   bytes and gives back the first NAMES / 3. The slab is 64 bytes of
 *   header then the blocks, malloc'd once in make_slab. Prints what it
 *   reported, and on stderr what igprof_enable() said (-1 unprofiled).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igprof.h"

struct arena {
  char *slab;
  size_t used, cap;
};

/* The slab's header: blocks never start where the malloc'd slab does. */
#define HEADER 64

static __attribute__((noinline)) struct arena make_slab(size_t cap) {
  struct arena a = {malloc(HEADER + cap), HEADER, HEADER + cap};
  if (!a.slab) {
    perror("malloc");
    exit(2);
  }
  return a;
}

static __attribute__((noinline)) void *arena_alloc(struct arena *a, size_t n) {
  size_t at = (a->used + 15) & ~(size_t)15;
  if (at + n > a->cap) {
    fprintf(stderr, "arena full\n");
    exit(2);
  }
  a->used = at + n;
  void *p = a->slab + at;
  igprof_alloc_event(p, n);
  return p;
}

static __attribute__((noinline)) void arena_release(void *p) {
  igprof_free_event(p);
}

struct tally {
  unsigned long calls, bytes, live_blocks, live_bytes;
};

static __attribute__((noinline)) void site_nodes(struct arena *a, int n, struct tally *t) {
  for (int i = 0; i < n; i++) {
    char *p = arena_alloc(a, 48);
    memset(p, i, 48);
    t->calls++, t->bytes += 48;
    if (i % 4 == 0)
      arena_release(p);
    else
      t->live_blocks++, t->live_bytes += 48;
  }
}

#define NAMES_MAX 4096
static void *kept[NAMES_MAX];

static __attribute__((noinline)) void site_names(struct arena *a, int n, struct tally *t) {
  for (int i = 0; i < n; i++) {
    size_t sz = 16 + (size_t)(i * 37) % 200;
    kept[i] = arena_alloc(a, sz);
    memset(kept[i], 'a' + i % 26, sz);
    t->calls++, t->bytes += sz;
    t->live_blocks++, t->live_bytes += sz;
  }
  for (int i = 0; i < n / 3; i++) {
    size_t sz = 16 + (size_t)(i * 37) % 200;
    arena_release(kept[i]);
    t->live_blocks--, t->live_bytes -= sz;
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: pool_arena NODES NAMES\n");
    return 2;
  }
  int nodes = atoi(argv[1]), names = atoi(argv[2]);
  if (nodes < 0 || names < 0 || names > NAMES_MAX) {
    fprintf(stderr, "pool_arena: NODES >= 0, 0 <= NAMES <= %d\n", NAMES_MAX);
    return 2;
  }
  struct arena a = make_slab((size_t)nodes * 64 + (size_t)names * 224);
  struct tally tn = {0}, tm = {0};
  site_nodes(&a, nodes, &tn);
  site_names(&a, names, &tm);
  printf("nodes %lu calls %lu bytes, %lu live %lu bytes\n", tn.calls, tn.bytes,
         tn.live_blocks, tn.live_bytes);
  printf("names %lu calls %lu bytes, %lu live %lu bytes\n", tm.calls, tm.bytes,
         tm.live_blocks, tm.live_bytes);
  fprintf(stderr, "enable %d\n", igprof_enable());
  /* The slab stays: the blocks still live are inside it at exit. */
  return 0;
}
