/* JIT code that says its name the way JIT runtimes do for perf: copies a
   counting loop into an anonymous executable page (no object file, no
   symbol), describes it as the function `jitted_count_down`, and calls it
   until `ms` milliseconds of CPU time have passed.

   jit_named MS MODE DIR
     MODE map:   DIR/perf-PID.map, one line `START SIZE NAME` (node's
                 --perf-basic-prof, the JVM's DumpPerfMapAtExit);
          dump:  DIR/jit-PID.dump, a jitdump (node's --perf-prof): its
                 header, a debug-info record (generated.js line 7) and a
                 code-load record;
          stale: the perf map, then its time set an hour back, as a map
                 another process with the same pid left behind;
          none:  no file.
   Prints the page's address and the number of calls. x86-64 and AArch64. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* unsigned long loop(unsigned long n): counts n down to 0, returns 0. */
#if defined(__x86_64__)
static const unsigned char code[] = {
    0x48, 0x89, 0xf8,       /* mov rax, rdi */
    0x48, 0xff, 0xc8,       /* 1: dec rax */
    0x75, 0xfb,             /* jnz 1b */
    0xc3,                   /* ret */
};
#define ELF_MACH 62
#elif defined(__aarch64__)
static const unsigned int code[] = {
    0xf1000400,             /* 1: subs x0, x0, #1 */
    0x54ffffe1,             /* b.ne 1b */
    0xd65f03c0,             /* ret */
};
#define ELF_MACH 183
#else
#error "jit_named: x86-64 or AArch64 only"
#endif

static const char NAME[] = "jitted_count_down";

static double cpu_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static void put(FILE *f, const void *p, size_t n) {
  if (fwrite(p, 1, n, f) != n) { perror("fwrite"); exit(1); }
}

static void put32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put64(FILE *f, uint64_t v) { put(f, &v, 8); }

static void record_header(FILE *f, uint32_t id, uint32_t size) {
  put32(f, id);
  put32(f, size);
  put64(f, mono_ns());
}

/* The jitdump of the specification in the Linux tree
   (tools/perf/Documentation/jitdump-specification.txt), version 1. */
static void write_jitdump(const char *dir, void *page) {
  char path[4096];
  snprintf(path, sizeof path, "%s/jit-%d.dump", dir, (int)getpid());
  FILE *f = fopen(path, "w");
  if (!f) { perror(path); exit(1); }
  put32(f, 0x4A695444);          /* magic "JiTD" */
  put32(f, 1);                   /* version */
  put32(f, 40);                  /* header size */
  put32(f, ELF_MACH);
  put32(f, 0);                   /* pad */
  put32(f, (uint32_t)getpid());
  put64(f, mono_ns());
  put64(f, 0);                   /* flags */
  /* JIT_CODE_DEBUG_INFO: code address, one entry (address, line,
     discriminator, file name). */
  static const char file[] = "generated.js";
  record_header(f, 2, 16 + 16 + 16 + sizeof file);
  put64(f, (uint64_t)(uintptr_t)page);
  put64(f, 1);
  put64(f, (uint64_t)(uintptr_t)page);
  put32(f, 7);
  put32(f, 0);
  put(f, file, sizeof file);
  /* JIT_CODE_LOAD: pid, tid, vma, code address, size, index, name, code. */
  record_header(f, 0, 16 + 40 + sizeof NAME + sizeof code);
  put32(f, (uint32_t)getpid());
  put32(f, (uint32_t)syscall(SYS_gettid));
  put64(f, (uint64_t)(uintptr_t)page);
  put64(f, (uint64_t)(uintptr_t)page);
  put64(f, sizeof code);
  put64(f, 1);
  put(f, NAME, sizeof NAME);
  put(f, code, sizeof code);
  if (fclose(f)) { perror(path); exit(1); }
}

static void write_perf_map(const char *dir, void *page, int stale) {
  char path[4096];
  snprintf(path, sizeof path, "%s/perf-%d.map", dir, (int)getpid());
  FILE *f = fopen(path, "w");
  if (!f) { perror(path); exit(1); }
  fprintf(f, "%lx %zx %s\n", (unsigned long)(uintptr_t)page, sizeof code, NAME);
  if (fclose(f)) { perror(path); exit(1); }
  if (stale) {
    struct timespec back[2];
    clock_gettime(CLOCK_REALTIME, &back[0]);
    back[0].tv_sec -= 3600;
    back[1] = back[0];
    if (utimensat(AT_FDCWD, path, back, 0)) { perror("utimensat"); exit(1); }
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: jit_named MS map|dump|stale|none DIR\n");
    return 2;
  }
  int ms = atoi(argv[1]);
  const char *mode = argv[2], *dir = argv[3];
  void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) { perror("mmap"); return 1; }
  memcpy(page, code, sizeof code);
  __builtin___clear_cache((char *)page, (char *)page + sizeof code);
  if (mprotect(page, 4096, PROT_READ | PROT_EXEC)) { perror("mprotect"); return 1; }
  if (!strcmp(mode, "map") || !strcmp(mode, "stale"))
    write_perf_map(dir, page, !strcmp(mode, "stale"));
  else if (!strcmp(mode, "dump"))
    write_jitdump(dir, page);
  else if (strcmp(mode, "none")) {
    fprintf(stderr, "jit_named: unknown mode %s\n", mode);
    return 2;
  }
  unsigned long (*loop)(unsigned long) = (unsigned long (*)(unsigned long))page;
  unsigned long calls = 0;
  double start = cpu_ms();
  while (cpu_ms() - start < ms) { loop(10000000); calls++; }
  printf("%p %lu\n", page, calls);
  return 0;
}
