// A hot function inlined into two callers (built with -O2 -g): `mix` is
// inlined into `caller_a` and `caller_b`, which are not inlined into
// `main`. caller_a runs mix three times as long as caller_b, for `ms`
// milliseconds of CPU time in all (default 600). `mix` has external
// linkage: binutils 2.40's addr2line, which perf runs for inlined frames,
// names an inlined static function after its caller.
#include <cstdio>
#include <cstdlib>
#include <ctime>

static double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

inline __attribute__((always_inline)) unsigned long mix(unsigned long x, long n) {
  for (long i = 0; i < n; i++) {
    x = x * 6364136223846793005ul + 1442695040888963407ul;
    x ^= x >> 29;
  }
  return x;
}

__attribute__((noinline)) unsigned long caller_a(unsigned long x) { return mix(x, 3000000); }
__attribute__((noinline)) unsigned long caller_b(unsigned long x) { return mix(x + 1, 1000000); }

int main(int argc, char **argv) {
  double ms = argc > 1 ? atof(argv[1]) : 600;
  unsigned long x = 1;
  double start = cpu_ms();
  while (cpu_ms() - start < ms) {
    x = caller_a(x);
    x = caller_b(x);
  }
  std::printf("%lu\n", x & 1);
  return 0;
}
