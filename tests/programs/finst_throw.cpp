// -finst: exceptions thrown through instrumented frames (inner, mid):
// the unwinder's cleanups call their exits.
#include <cstdio>
#include <stdexcept>
__attribute__((noinline)) void inner(int i) { if (i % 2) throw std::runtime_error("x"); }
__attribute__((noinline)) void mid(int i) { inner(i); }
__attribute__((noinline)) void leaf() {}
int main() { int caught = 0; for (int i = 0; i < 10; i++) {
try { mid(i); } catch (const std::exception &) { caught++; } leaf(); }
printf("caught %d\n", caught); }
