/* The function-call profiler (-fp) under test. argv[1]:
     sites    target() called 1000 times from site_a, 300 from site_b and
              7 from site_c.
     args     functions whose arguments and results the stub must keep:
              10 integer arguments (4 on the stack), 10 doubles (2 on the
              stack), a printf-like varargs function with doubles, a
              function returning double, structures by value (in registers
              and in memory) and returned in memory, and on x86-64 __m256
              and __m512 arguments (when the CPU has AVX / AVX-512F), and
              (AVX-512F) 28 values a caller keeps in registers, xmm16-31
              among them, across a call of tiny512.
              Each is called 50 times; every result is checked against
              the same computation done inline, and printed.
     plugin   dlopen("./fp_plug.so") and 250 calls of its plug_fn from
              call_plug().
     replug   the same, dlclose (the library is unloaded), dlopen again
              and 100 more calls.
     threads  4 threads each calling target() 20000 times from
              thread_site().
   Exits 1 (after saying what) if a result is wrong. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __x86_64__
#include <immintrin.h>
#endif

#define NOINLINE __attribute__((noinline, noclone))

static volatile long sink;
static int bad;

static void check(const char *what, int ok) {
  if (!ok) {
    if (bad++ < 5) fprintf(stderr, "wrong result: %s\n", what);
  }
}

NOINLINE long target(long x) {
  sink += x;
  return x + 1;
}

NOINLINE void site_a(void) {
  for (int i = 0; i < 1000; i++) target(i);
  sink++;
}
NOINLINE void site_b(void) {
  for (int i = 0; i < 300; i++) target(i);
  sink++;
}
NOINLINE void site_c(void) {
  for (int i = 0; i < 7; i++) target(i);
  sink++;
}

/* ---- args ---- */

NOINLINE long many_ints(long a, long b, long c, long d, long e, long f,
                        long g, long h, long i, long j) {
  return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i +
         10 * j;
}

NOINLINE double many_doubles(double a, double b, double c, double d, double e,
                             double f, double g, double h, double i,
                             double j) {
  return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i +
         10 * j;
}

NOINLINE double mixed(int n, double x, long m, float y) {
  return n * x + m * (double)y;
}

NOINLINE int fmt(char *buf, size_t n, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  int r = vsnprintf(buf, n, f, ap);
  va_end(ap);
  return r;
}

struct small { double x; long y; };
struct big { long a, b, c, d, e; double f; };

NOINLINE struct small small_pass(struct small s, double k) {
  struct small r = {s.x * k, s.y + 1};
  return r;
}

NOINLINE struct big big_pass(struct big s, long k) {
  struct big r = {s.a + k, s.b + k, s.c + k, s.d + k, s.e + k, s.f * k};
  return r;
}

#ifdef __x86_64__
__attribute__((target("avx"))) NOINLINE __m256 vec256(__m256 a, __m256 b,
                                                       __m256 c) {
  return _mm256_add_ps(_mm256_mul_ps(a, b), c);
}
__attribute__((target("avx512f"))) NOINLINE __m512d vec512(__m512d a,
                                                           __m512d b) {
  return _mm512_sub_pd(a, b);
}

__attribute__((target("avx"))) static void check_avx(int i) {
  float fa[8], fb[8], fc[8], out[8];
  for (int k = 0; k < 8; k++) {
    fa[k] = i + k * 1.5f;
    fb[k] = k - 3.25f;
    fc[k] = 100.0f * k + i;
  }
  __m256 r = vec256(_mm256_loadu_ps(fa), _mm256_loadu_ps(fb),
                    _mm256_loadu_ps(fc));
  _mm256_storeu_ps(out, r);
  for (int k = 0; k < 8; k++) check("vec256", out[k] == fa[k] * fb[k] + fc[k]);
  if (i == 0) printf("vec256 %.9g %.9g\n", out[0], out[7]);
}

__attribute__((target("avx512f"))) static void check_avx512(int i) {
  double da[8], db[8], out[8];
  for (int k = 0; k < 8; k++) {
    da[k] = i * 1000.0 + k;
    db[k] = k * 0.125;
  }
  __m512d r = vec512(_mm512_loadu_pd(da), _mm512_loadu_pd(db));
  _mm512_storeu_pd(out, r);
  for (int k = 0; k < 8; k++) check("vec512", out[k] == da[k] - db[k]);
  if (i == 0) printf("vec512 %.17g %.17g\n", out[0], out[7]);
}

/* Under GCC's interprocedural register allocation keep512 holds its 28
   values across the call of tiny512, which writes none of them, in
   xmm1-31 and in call-clobbered integer registers instead of spilling
   them: the stub must keep zmm16-31 too. The values and sums are exact,
   whatever FMA contraction the compiler chooses. */
static volatile double vin[28];
__attribute__((target("avx512f"))) NOINLINE double tiny512(double x) {
  return x * 2.0 + 1.0;
}
#define KEEP_LOAD(n) double v##n = vin[n];
#define KEEP_SUM(n) +v##n *(n + 1)
__attribute__((target("avx512f"))) NOINLINE static double keep512(double x) {
  KEEP_LOAD(0) KEEP_LOAD(1) KEEP_LOAD(2) KEEP_LOAD(3) KEEP_LOAD(4) KEEP_LOAD(5)
  KEEP_LOAD(6) KEEP_LOAD(7) KEEP_LOAD(8) KEEP_LOAD(9) KEEP_LOAD(10)
  KEEP_LOAD(11) KEEP_LOAD(12) KEEP_LOAD(13) KEEP_LOAD(14) KEEP_LOAD(15)
  KEEP_LOAD(16) KEEP_LOAD(17) KEEP_LOAD(18) KEEP_LOAD(19) KEEP_LOAD(20)
  KEEP_LOAD(21) KEEP_LOAD(22) KEEP_LOAD(23) KEEP_LOAD(24) KEEP_LOAD(25)
  KEEP_LOAD(26) KEEP_LOAD(27)
  double r = tiny512(x);
  return r KEEP_SUM(0) KEEP_SUM(1) KEEP_SUM(2) KEEP_SUM(3) KEEP_SUM(4)
      KEEP_SUM(5) KEEP_SUM(6) KEEP_SUM(7) KEEP_SUM(8) KEEP_SUM(9) KEEP_SUM(10)
      KEEP_SUM(11) KEEP_SUM(12) KEEP_SUM(13) KEEP_SUM(14) KEEP_SUM(15)
      KEEP_SUM(16) KEEP_SUM(17) KEEP_SUM(18) KEEP_SUM(19) KEEP_SUM(20)
      KEEP_SUM(21) KEEP_SUM(22) KEEP_SUM(23) KEEP_SUM(24) KEEP_SUM(25)
      KEEP_SUM(26) KEEP_SUM(27);
}

static void check_keep512(int i) {
  double want = 2.0 * i + 1.0;
  for (int k = 0; k < 28; k++) {
    vin[k] = i + k * 0.25;
    want += (i + k * 0.25) * (k + 1);
  }
  check("keep512", keep512(i) == want);
}
#endif

NOINLINE void call_args(void) {
  char buf[200], want[200];
  for (int i = 0; i < 50; i++) {
    long r = many_ints(i, 2, 3, 4, 5, 6, 7, 8, 9, 10 + i);
    check("many_ints", r == i + 4 + 9 + 16 + 25 + 36 + 49 + 64 + 81 +
                               10 * (10 + i));
    double d = many_doubles(i * 0.5, 1.25, 2.5, 3.75, 5, 6.25, 7.5, 8.75, 10,
                            11.25 + i);
    check("many_doubles", d == i * 0.5 + 2 * 1.25 + 3 * 2.5 + 4 * 3.75 +
                                  5 * 5.0 + 6 * 6.25 + 7 * 7.5 + 8 * 8.75 +
                                  9 * 10.0 + 10 * (11.25 + i));
    double m = mixed(i, 0.5 + i, 3 * i, 0.25f);
    check("mixed", m == i * (0.5 + i) + 3 * i * 0.25);
    int n = fmt(buf, sizeof buf, "%d %s %.3f %ld %g %c %.2e", i, "str",
                i / 3.0, 1234567890123L * i, 2.5 * i, 'a' + i % 26, 1e10 + i);
    snprintf(want, sizeof want, "%d %s %.3f %ld %g %c %.2e", i, "str",
             i / 3.0, 1234567890123L * i, 2.5 * i, 'a' + i % 26, 1e10 + i);
    check("fmt", n == (int)strlen(want) && !strcmp(buf, want));
    struct small s = small_pass((struct small){1.5 * i, 7 * i}, 3.0);
    check("small_pass", s.x == 4.5 * i && s.y == 7 * i + 1);
    struct big b = big_pass((struct big){i, 2 * i, 3 * i, 4 * i, 5 * i, 0.5 * i}, 9);
    check("big_pass", b.a == i + 9 && b.b == 2 * i + 9 && b.c == 3 * i + 9 &&
                          b.d == 4 * i + 9 && b.e == 5 * i + 9 &&
                          b.f == 4.5 * i);
#ifdef __x86_64__
    if (__builtin_cpu_supports("avx")) check_avx(i);
    if (__builtin_cpu_supports("avx512f")) {
      check_avx512(i);
      check_keep512(i);
    }
#endif
    if (i == 49)
      printf("%ld %.17g %.17g %s %.17g %ld %ld %.17g\n", r, d, m, buf, s.x,
             s.y, b.e, b.f);
  }
}

/* ---- plugin ---- */

NOINLINE long call_plug(long (*f)(long, double), int n) {
  long s = 0;
  for (int i = 0; i < n; i++) s += f(i, 0.5 * i);
  return s;
}

/* ---- threads ---- */

NOINLINE void thread_site(void) {
  for (int i = 0; i < 20000; i++) target(i);
  sink++;
}

static void *worker(void *arg) {
  (void)arg;
  thread_site();
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "sites";
  if (!strcmp(mode, "sites")) {
    site_a();
    site_b();
    site_c();
  } else if (!strcmp(mode, "args")) {
    call_args();
  } else if (!strcmp(mode, "plugin") || !strcmp(mode, "replug")) {
    int rounds = strcmp(mode, "plugin") ? 2 : 1;
    for (int r = 0; r < rounds; r++) {
      void *h = dlopen("./fp_plug.so", RTLD_NOW);
      if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
      }
      long (*f)(long, double) = (long (*)(long, double))dlsym(h, "plug_fn");
      int n = r == 0 ? 250 : 100;
      long s = call_plug(f, n);
      long want = 0;
      for (int i = 0; i < n; i++) want += 3 * i + (long)(0.5 * i * 4);
      check("plug_fn", s == want);
      printf("plugin %ld\n", s);
      if (rounds == 2) {
        dlclose(h);
        /* Unloaded: no object holds plug_fn any more. */
        check("unloaded", dlopen("./fp_plug.so", RTLD_NOW | RTLD_NOLOAD) == NULL);
      }
    }
  } else if (!strcmp(mode, "threads")) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  printf("fp_calls %s done\n", mode);
  return bad != 0;
}
