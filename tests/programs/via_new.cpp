/* N operator new of 64 bytes from one function, each deleted at once
   (argv[1]: N, default 200000). */
#include <cstdio>
#include <cstdlib>
struct B { char c[64]; };
static B *volatile keep;
__attribute__((noinline)) void site_new(long n) { for (long i = 0; i < n; i++) { B *p = new B; keep = p; delete p; } }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  site_new(n);
  std::printf("new done %ld\n", n);
  return 0;
}
