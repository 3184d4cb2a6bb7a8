/* A library fp_calls.c loads with dlopen (-fp:plug_fn:fp_plug.so). */
__attribute__((noinline)) long plug_fn(long i, double x) {
  return 3 * i + (long)(x * 4);
}
