/* Baseline for bench/pp-bench: the bare sampling mechanisms libigprof uses
   for -pp, with an empty handler and nothing else: what the kernel (and a
   VM's timer exits) charge per sample before any profiler work. Every
   thread made with pthread_create is sampled too (the wrapper below opens
   its event first). Preload it. Environment:
     BARE_MODE    sigtrap (default): a task-clock perf event with attr.sigtrap,
                  the kernel raises SIGTRAP in the thread (Linux 5.13+);
                  sigprof: the same event waking a ring buffer, whose
                  wake-up sends SIGPROF through fasync.
     BARE_PERIOD  period in ns (default 1000000). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
static volatile long samples;
static void on_sample(int s, siginfo_t *si, void *uc) { (void)s; (void)si; (void)uc; __atomic_add_fetch(&samples, 1, __ATOMIC_RELAXED); }
static int trap;
/* Opens and starts the calling thread's event. */
static void sample_this_thread(void) {
  const char *p = getenv("BARE_PERIOD");
  struct perf_event_attr a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.type = PERF_TYPE_SOFTWARE;
  a.config = PERF_COUNT_SW_TASK_CLOCK;
  a.sample_period = p ? strtoul(p, 0, 10) : 1000000;
  a.disabled = 1;
  a.exclude_hv = 1;
  if (trap) {
    a.sigtrap = 1;
    a.remove_on_exec = 1;
  } else {
    a.wakeup_events = 1;
  }
  int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (fd < 0) { perror("pp-bare-sampler: perf_event_open"); return; }
  if (!trap) {
    if (mmap(0, 2 * 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) { perror("pp-bare-sampler: mmap"); return; }
    struct f_owner_ex o = {F_OWNER_TID, gettid()};
    fcntl(fd, F_SETFL, O_ASYNC);
    fcntl(fd, F_SETSIG, SIGPROF);
    fcntl(fd, F_SETOWN_EX, &o);
  }
  ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
}
struct start { void *(*fn)(void *); void *arg; };
static void *thread_main(void *p) {
  struct start s = *(struct start *)p;
  free(p);
  sample_this_thread();
  return s.fn(s.arg);
}
int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  if (!real) real = dlsym(RTLD_NEXT, "pthread_create");
  struct start *s = malloc(sizeof *s);
  if (!s) return real(t, attr, fn, arg);
  s->fn = fn;
  s->arg = arg;
  return real(t, attr, thread_main, s);
}
__attribute__((constructor)) static void start(void) {
  const char *m = getenv("BARE_MODE");
  trap = !m || strcmp(m, "sigprof") != 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sample;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(trap ? SIGTRAP : SIGPROF, &sa, 0);
  sample_this_thread();
}
__attribute__((destructor)) static void stop(void) { fprintf(stderr, "pp-bare-sampler: %ld samples\n", samples); }
