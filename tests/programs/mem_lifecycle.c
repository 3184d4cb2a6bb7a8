/* Allocation from a thread-local destructor, inside a dlopen (a library
   constructor), and around fork: each from its own function, counts known. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static pthread_key_t key;
static void *volatile keep;
/* A(n): an allocation the compiler cannot elide, freed at once. */
#define A(n) do { keep = malloc(n); free(keep); } while (0)
__attribute__((noinline)) void tls_dtor(void *v) { keep = malloc(777); free(keep); (void)v; }
static void *thread_main(void *a) { pthread_setspecific(key, (void *)1); return a; }
__attribute__((noinline)) void before_fork(void) { keep = malloc(111); }
__attribute__((noinline)) void child_site(void) { for (int i = 0; i < 10; i++) A(222); keep = malloc(333); }
__attribute__((noinline)) void parent_site(void) { for (int i = 0; i < 5; i++) A(444); }
static void *hammer(void *a) { for (int i = 0; i < 200000; i++) { void *volatile p = malloc(64); free(p); } return a; }
int main(int argc, char **argv) {
  pthread_key_create(&key, tls_dtor);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, thread_main, 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
  if (argc > 1) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  }
  before_fork();
  pthread_t hm;
  pthread_create(&hm, 0, hammer, 0);
  pid_t pid = fork();
  if (pid == 0) { child_site(); _exit(0); }
  int st;
  waitpid(pid, &st, 0);
  pthread_join(hm, 0);
  parent_site();
  printf("lifecycle done %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 0;
}
