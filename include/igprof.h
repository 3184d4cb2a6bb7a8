/*
 * igprof.h: calls a program makes to the igprof-rs profiler.
 *
 * Include it, call the functions below, and build as usual: no library to
 * link, no option to add. Run unprofiled, every call is a no-op (the query
 * ones return -1); run under `igprof` (which preloads libigprof.so), the
 * calls reach the profiler.
 *
 * How: each function is declared as a weak symbol, and each name is also a
 * macro that calls the function only when the dynamic linker found it.
 * The address is read from the global offset table, so the check works in
 * position-independent executables, shared libraries and non-PIE
 * executables alike (a plain weak reference in code built with -fno-pic
 * would be resolved to 0 at link time, and the profiler never called).
 * The program gets no dependency on libdl or on any glibc symbol version:
 * it runs on any glibc the profiler supports (2.28 and newer).
 *
 * Cost unprofiled: a load of the address (which the compiler may hoist out
 * of a loop), a test and a branch not taken; no call. docs/benchmarks.md
 * has the measured figures.
 *
 * The macros take the place of the names: take the address of a function
 * (`&igprof_alloc_event`, null when the profiler is not loaded) only after
 * testing it. A static executable cannot be profiled; there the calls are
 * no-ops too.
 *
 * C and C++ (C99 or newer) with GCC or a compiler that takes its extensions
 * (statement expressions, inline asm), on Linux x86_64 and AArch64; tested
 * with GCC 12 (tests/tests/pool_api.rs).
 */
#ifndef IGPROF_H
#define IGPROF_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Writes a snapshot of the profile so far to `path` (NULL: the run's output
 * file). Returns 0 on success, -1 if not profiled or the write failed.
 */
int igprof_dump_now(const char *path) __attribute__((weak));

/*
 * Turns recording on (after `igprof -pd`, or igprof_disable()): samples,
 * allocations and descriptors opened from now on are recorded. Returns 1
 * if recording was already on, 0 if it was off, -1 if not profiled.
 */
int igprof_enable(void) __attribute__((weak));

/*
 * Turns recording off: nothing new is recorded until igprof_enable() (what
 * was recorded stays, and its releases still count). Returns 1 if
 * recording was on, 0 if it was off, -1 if not profiled.
 */
int igprof_disable(void) __attribute__((weak));

/*
 * Starts a new epoch of the memory profiler (`igprof -mp --marks`):
 * MEM_LIVE_SINCE_MARK then holds what is allocated from now on and still
 * live at the dump ("what grew since here and stayed"). Returns the new
 * epoch's number (1 for the first mark), or -1 when the run takes no
 * marks (not profiled, or without --marks). Signal-safe.
 */
int igprof_mark(void) __attribute__((weak));

/*
 * A custom pool (arena, free list, slab) handed out the block of `size`
 * bytes at `ptr`. Under `igprof -mp` it is recorded exactly as a malloc'd
 * block: charged to the stack of the caller of igprof_alloc_event, in
 * MEM_TOTAL, MEM_MAX, MEM_LIVE and MEM_LIVE_AT_PEAK, for `size` bytes
 * whatever -mo says; with --sample-bytes it is sampled as malloc's blocks
 * are. Without -mp it does nothing. As valgrind's VALGRIND_MALLOCLIKE_BLOCK.
 *
 * The pool's own memory, if it came from malloc, is counted too: report
 * the blocks, the chunk, or both, as you prefer. A block that starts at
 * the address of another live recorded block (the malloc'd chunk itself)
 * replaces that block's record: start the first block after a header, or
 * take the chunk from mmap.
 */
void igprof_alloc_event(void *ptr, size_t size) __attribute__((weak));

/*
 * The custom pool took back the block at `ptr` (reported with
 * igprof_alloc_event): it leaves MEM_LIVE. A pointer that is no recorded
 * block is ignored (but one that is a live malloc'd block takes that
 * block's record out: report only the pool's blocks). As valgrind's
 * VALGRIND_FREELIKE_BLOCK.
 */
void igprof_free_event(void *ptr) __attribute__((weak));

/* The address of `name`, or null when no loaded object defines it. */
#if defined(__x86_64__)
#define IGPROF_ADDR_(name, type)                                               \
  __extension__({                                                              \
    type igprof_f_;                                                            \
    __asm__(".weak " #name "\n\tmovq " #name "@GOTPCREL(%%rip), %0"           \
            : "=r"(igprof_f_));                                                \
    igprof_f_;                                                                 \
  })
#elif defined(__aarch64__)
#define IGPROF_ADDR_(name, type)                                               \
  __extension__({                                                              \
    type igprof_f_;                                                            \
    __asm__(".weak " #name "\n\tadrp %0, :got:" #name                          \
            "\n\tldr %0, [%0, #:got_lo12:" #name "]"                           \
            : "=r"(igprof_f_));                                                \
    igprof_f_;                                                                 \
  })
#else
#define IGPROF_ADDR_(name, type) ((type)&name)
#endif

typedef int (*igprof_dump_now_fn_)(const char *);
typedef int (*igprof_switch_fn_)(void);
typedef void (*igprof_alloc_event_fn_)(void *, size_t);
typedef void (*igprof_free_event_fn_)(void *);

static inline __attribute__((always_inline)) int igprof_call_dump_now_(const char *path) {
  igprof_dump_now_fn_ f = IGPROF_ADDR_(igprof_dump_now, igprof_dump_now_fn_);
  return f ? f(path) : -1;
}

static inline __attribute__((always_inline)) int igprof_call_enable_(void) {
  igprof_switch_fn_ f = IGPROF_ADDR_(igprof_enable, igprof_switch_fn_);
  return f ? f() : -1;
}

static inline __attribute__((always_inline)) int igprof_call_disable_(void) {
  igprof_switch_fn_ f = IGPROF_ADDR_(igprof_disable, igprof_switch_fn_);
  return f ? f() : -1;
}

static inline __attribute__((always_inline)) int igprof_call_mark_(void) {
  igprof_switch_fn_ f = IGPROF_ADDR_(igprof_mark, igprof_switch_fn_);
  return f ? f() : -1;
}

static inline __attribute__((always_inline)) void igprof_call_alloc_event_(void *ptr, size_t size) {
  igprof_alloc_event_fn_ f =
      IGPROF_ADDR_(igprof_alloc_event, igprof_alloc_event_fn_);
  if (f)
    f(ptr, size);
}

static inline __attribute__((always_inline)) void igprof_call_free_event_(void *ptr) {
  igprof_free_event_fn_ f =
      IGPROF_ADDR_(igprof_free_event, igprof_free_event_fn_);
  if (f)
    f(ptr);
}

#define igprof_dump_now(path) igprof_call_dump_now_(path)
#define igprof_enable() igprof_call_enable_()
#define igprof_disable() igprof_call_disable_()
#define igprof_mark() igprof_call_mark_()
#define igprof_alloc_event(ptr, size) igprof_call_alloc_event_((ptr), (size))
#define igprof_free_event(ptr) igprof_call_free_event_(ptr)

#ifdef __cplusplus
}
#endif

#endif /* IGPROF_H */
