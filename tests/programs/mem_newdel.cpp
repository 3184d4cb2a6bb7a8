/* operator new, new[], aligned new and nothrow new[], each deleted, from its own function. */
#include <cstdio>
#include <new>
struct alignas(64) A { char c[100]; };
static void *volatile keep;
__attribute__((noinline)) void f_new() { int *p = new int[250]; keep = p; delete[] p; }
__attribute__((noinline)) void f_new1() { long *p = new long; keep = p; delete p; }
__attribute__((noinline)) void f_aligned() { A *p = new A; keep = p; delete p; }
__attribute__((noinline)) void f_nothrow() { char *p = new (std::nothrow) char[77]; keep = p; delete[] p; }
int main() { f_new(); f_new1(); f_aligned(); f_nothrow(); std::printf("ok\n"); }
