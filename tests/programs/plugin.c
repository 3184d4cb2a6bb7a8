/* A dlopen'd library with a CPU-bound function. */
volatile unsigned long plugin_sink;
__attribute__((noinline)) void plugin_burn(unsigned long n) {
  unsigned long x = 7;
  for (unsigned long i = 0; i < n; i++) { x = x * 2862933555777941757ul + 3037000493ul; __asm__ volatile("" : "+r"(x)); }
  plugin_sink += x;
}
