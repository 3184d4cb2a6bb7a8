/* JIT-like code: copies a counting loop into an anonymous executable page
   (no object file, no symbol) and calls it until `ms` milliseconds of CPU
   time have passed (default 300). x86-64 and AArch64. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* unsigned long loop(unsigned long n): counts n down to 0, returns 0. */
#if defined(__x86_64__)
static const unsigned char code[] = {
    0x48, 0x89, 0xf8,       /* mov rax, rdi */
    0x48, 0xff, 0xc8,       /* 1: dec rax */
    0x75, 0xfb,             /* jnz 1b */
    0xc3,                   /* ret */
};
#elif defined(__aarch64__)
static const unsigned int code[] = {
    0xf1000400,             /* 1: subs x0, x0, #1 */
    0x54ffffe1,             /* b.ne 1b */
    0xd65f03c0,             /* ret */
};
#else
#error "jit_loop: x86-64 or AArch64 only"
#endif

static double cpu_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  int ms = argc > 1 ? atoi(argv[1]) : 300;
  void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) { perror("mmap"); return 1; }
  memcpy(page, code, sizeof code);
  __builtin___clear_cache((char *)page, (char *)page + sizeof code);
  if (mprotect(page, 4096, PROT_READ | PROT_EXEC)) { perror("mprotect"); return 1; }
  unsigned long (*loop)(unsigned long) = (unsigned long (*)(unsigned long))page;
  unsigned long calls = 0;
  double start = cpu_ms();
  while (cpu_ms() - start < ms) { loop(10000000); calls++; }
  printf("%p %lu\n", page, calls);
  return 0;
}
