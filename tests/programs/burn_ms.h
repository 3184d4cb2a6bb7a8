/* burn_ms(ms): spins on the CPU for ms milliseconds of process CPU time.
   Included by the test programs that need a CPU-time phase. */
#include <time.h>
static volatile unsigned long sink;
__attribute__((noinline, unused)) static void burn_ms(int ms) {
  struct timespec a, b;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  do {
    for (int i = 0; i < 10000; i++) sink = sink * 31 + i;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}

/* burn_thread_ms(ms): spins for ms milliseconds of the calling thread's CPU
   time (threads that run side by side each burn their own share). */
__attribute__((noinline, noclone, unused)) static void burn_thread_ms(int ms) {
  struct timespec a, b;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  do {
    for (int i = 0; i < 10000; i++) sink = sink * 31 + i;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}
