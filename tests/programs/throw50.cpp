// Throws a C++ exception through 50 frames, many times, and catches it.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
static volatile unsigned long sink;
__attribute__((noinline)) void thrower(int depth, int i) {
  if (depth == 0) {
    for (int k = 0; k < 2000; k++) sink = sink * 31 + k;
    throw std::runtime_error("deep");
  }
  thrower(depth - 1, i);
  sink += depth;
}
int main(int argc, char **argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  int caught = 0;
  for (int i = 0; i < n; i++) {
    try { thrower(50, i); } catch (const std::runtime_error &e) { caught++; }
  }
  std::printf("caught %d of %d\n", caught, n);
  return caught == n ? 0 : 1;
}
