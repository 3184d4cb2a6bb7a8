/* Loads plugin.so (path in argv[1]) and burns in plugin_burn; meanwhile a
   second thread dlopens and dlcloses argv[2] (another copy) in a loop and
   calls into it between, while everything is sampled. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static const char *other;
static volatile int stop;
static void *cycler(void *a) {
  (void)a;
  int n = 0;
  while (!stop) {
    void *h = dlopen(other, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", other, dlerror()); exit(2); }
    void (*f)(unsigned long) = (void (*)(unsigned long))dlsym(h, "plugin_burn");
    f(20000);
    if (dlclose(h)) { fprintf(stderr, "dlclose failed\n"); exit(3); }
    n++;
  }
  return (void *)(long)n;
}
int main(int argc, char **argv) {
  if (argc < 3) return 1;
  other = argv[2];
  pthread_t t;
  pthread_create(&t, 0, cycler, 0);
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  void (*f)(unsigned long) = (void (*)(unsigned long))dlsym(h, "plugin_burn");
  for (int i = 0; i < 20; i++) f(10000000);
  stop = 1;
  void *cycles;
  pthread_join(t, &cycles);
  printf("cycles %ld\n", (long)cycles);
  return (long)cycles > 0 ? 0 : 4;
}
