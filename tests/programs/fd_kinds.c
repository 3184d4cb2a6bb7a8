/* Every descriptor-creating function once (or as noted), each from its
   own function; some descriptors are closed, replaced or closed by
   another thread, so FD_USED and FD_LIVE per site are known. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>
static int keep[64];
static int nk;
static volatile int last;
/* R(x): use the result after the call, so the call is never a tail call. */
#define R(x) do { int r_ = (x); last = r_; return r_; } while (0)
#define K(x) (keep[nk++] = (x))
__attribute__((noinline)) int f_range(void) { R(open("/dev/null", O_RDONLY)); }
__attribute__((noinline)) void f_open(void) { K(open("/dev/null", O_RDONLY)); }
__attribute__((noinline)) void f_openat(void) { K(openat(AT_FDCWD, "/dev/null", O_RDONLY)); }
__attribute__((noinline)) void f_creat(const char *p) { K(creat(p, 0600)); }
__attribute__((noinline)) int f_target(void) { R(open("/dev/null", O_RDONLY)); }
__attribute__((noinline)) void f_dup(int fd) { K(dup(fd)); }
__attribute__((noinline)) void f_dup2(int fd, int to) { K(dup2(fd, to)); }
__attribute__((noinline)) void f_dup3(int fd, int to) { K(dup3(fd, to, O_CLOEXEC)); }
__attribute__((noinline)) void f_pipe(void) { int p[2]; pipe(p); K(p[0]); K(p[1]); }
__attribute__((noinline)) void f_pipe2(void) { int p[2]; pipe2(p, O_CLOEXEC); K(p[0]); K(p[1]); }
__attribute__((noinline)) void f_socket(void) { K(socket(AF_INET, SOCK_DGRAM, 0)); }
__attribute__((noinline)) void f_socketpair(void) { int s[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, s); K(s[0]); K(s[1]); }
__attribute__((noinline)) int f_listen(struct sockaddr_un *a) { int s = socket(AF_UNIX, SOCK_STREAM, 0); bind(s, (void *)a, sizeof *a); listen(s, 4); return s; }
__attribute__((noinline)) void f_connect(struct sockaddr_un *a) { int c = socket(AF_UNIX, SOCK_STREAM, 0); connect(c, (void *)a, sizeof *a); K(c); }
__attribute__((noinline)) void f_accept(int s) { K(accept(s, 0, 0)); }
__attribute__((noinline)) void f_accept4(int s) { K(accept4(s, 0, 0, SOCK_CLOEXEC)); }
__attribute__((noinline)) void f_epoll_create(void) { K(epoll_create(4)); }
__attribute__((noinline)) void f_epoll_create1(void) { K(epoll_create1(0)); }
__attribute__((noinline)) void f_eventfd(void) { K(eventfd(0, 0)); }
__attribute__((noinline)) void f_timerfd(void) { K(timerfd_create(CLOCK_MONOTONIC, 0)); }
__attribute__((noinline)) void f_signalfd(void) { sigset_t m; sigemptyset(&m); sigaddset(&m, SIGUSR2); int s = signalfd(-1, &m, 0); K(s); signalfd(s, &m, 0); }
__attribute__((noinline)) void f_memfd(void) { K(memfd_create("igprof-test", 0)); }
__attribute__((noinline)) void f_inotify_init(void) { K(inotify_init()); }
__attribute__((noinline)) void f_inotify_init1(void) { K(inotify_init1(IN_CLOEXEC)); }
__attribute__((noinline)) FILE *f_fopen(void) { FILE *f = fopen("/dev/null", "r"); last = f != 0; return f; }
__attribute__((noinline)) void f_fclose(FILE *f) { last = fclose(f); }
__attribute__((noinline)) void f_tmpfile(void) { FILE *f = tmpfile(); K(fileno(f)); }
__attribute__((noinline)) int f_closed(void) { R(open("/dev/null", O_RDONLY)); }
__attribute__((noinline)) void f_close(int fd) { last = close(fd); }
static int thread_fd;
__attribute__((noinline)) void f_thread_open(void) { thread_fd = open("/dev/null", O_RDONLY); }
static void *th(void *a) { f_thread_open(); return a; }
int main(void) {
  int r0 = f_range(), r1 = f_range(), r2 = f_range();
  if (r1 != r0 + 1 || r2 != r0 + 2) return 2;
  close_range(r0, r2, 0);
  char path[64];
  snprintf(path, sizeof path, "/tmp/igprof-fd-kinds-%d", (int)getpid());
  f_open(); f_openat(); f_creat(path); unlink(path);
  int t = f_target(), t3 = f_target();
  f_dup(keep[0]); f_dup2(keep[0], t); f_dup3(keep[0], t3);
  f_pipe(); f_pipe2(); f_socket(); f_socketpair();
  struct sockaddr_un a; memset(&a, 0, sizeof a); a.sun_family = AF_UNIX;
  snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "igprof-fd-kinds-%d", (int)getpid());
  int s = f_listen(&a);
  f_connect(&a); f_accept(s); f_connect(&a); f_accept4(s);
  f_epoll_create(); f_epoll_create1(); f_eventfd(); f_timerfd(); f_signalfd(); f_memfd();
  f_inotify_init(); f_inotify_init1();
  f_fclose(f_fopen()); f_tmpfile();
  f_close(f_closed());
  pthread_t p; pthread_create(&p, 0, th, 0); pthread_join(p, 0); close(thread_fd);
  printf("kinds done %d\n", nk);
  return 0;
}
