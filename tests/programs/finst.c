/* A program built with -finstrument-functions, with known calls and times:
 * main calls a() 3 times and b() 5 times; a() calls c() twice; c() sleeps
 * 20 ms (and says on stderr how long its calls took, per caller); b() burns
 * 10 ms of CPU. With an argument "threads", two threads
 * each call t_work() which calls c() once. With "jump", j_outer() calls
 * j_mid() which calls j_inner() which longjmps back to j_outer (the exits
 * of j_inner and j_mid never run). Prints what it did and exits 3. */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))

__attribute__((no_instrument_function)) static double now_ms(clockid_t clk)
{
  struct timespec ts;
  clock_gettime(clk, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Wall-clock time c() measured of itself, in microseconds, per caller
 * (printed on stderr: a busy machine wakes a 20 ms sleep late). */
static unsigned long c_in_a_us, c_in_threads_us, c_after_jump_us;

NOINLINE void c(unsigned long *spent_us)
{
  double t0 = now_ms(CLOCK_MONOTONIC);
  struct timespec ts = { 0, 20 * 1000 * 1000 };
  while (nanosleep(&ts, &ts) != 0)
    ;
  __atomic_fetch_add(spent_us, (unsigned long)((now_ms(CLOCK_MONOTONIC) - t0) * 1e3), __ATOMIC_RELAXED);
}

NOINLINE void a(void)
{
  c(&c_in_a_us);
  c(&c_in_a_us);
}

static volatile unsigned long sink;

NOINLINE void b(void)
{
  double end = now_ms(CLOCK_THREAD_CPUTIME_ID) + 10;
  while (now_ms(CLOCK_THREAD_CPUTIME_ID) < end)
    for (int i = 0; i < 1000; i++)
      sink += i;
}

NOINLINE void *t_work(void *arg)
{
  (void)arg;
  c(&c_in_threads_us);
  return 0;
}

static jmp_buf env;

NOINLINE void j_inner(void)
{
  longjmp(env, 1);
}

NOINLINE void j_mid(void)
{
  j_inner();
  sink++;
}

NOINLINE void j_outer(void)
{
  if (setjmp(env) == 0)
    j_mid();
  sink++;
}

int main(int argc, char **argv)
{
  for (int i = 0; i < 3; i++)
    a();
  for (int i = 0; i < 5; i++)
    b();
  if (argc > 1 && strcmp(argv[1], "threads") == 0) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
      pthread_create(&t[i], 0, t_work, 0);
    for (int i = 0; i < 2; i++)
      pthread_join(t[i], 0);
  }
  if (argc > 1 && strcmp(argv[1], "jump") == 0) {
    j_outer();
    c(&c_after_jump_us);
  }
  fprintf(stderr, "c_us in_a %lu in_threads %lu after_jump %lu\n", c_in_a_us, c_in_threads_us, c_after_jump_us);
  printf("finst done %s\n", argc > 1 ? argv[1] : "plain");
  return 3;
}
