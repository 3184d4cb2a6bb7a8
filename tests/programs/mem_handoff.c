/* 8 threads: thread k allocates M blocks of 16*(k+1) bytes in produce()
   and hands each to thread (k+1)%8, which frees it in consume(). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define T 8
static long M;
static void **q[T];
static long qn[T], qh[T];
static pthread_mutex_t mu[T];
__attribute__((noinline)) void *produce(int k) { void *p = malloc(16 * (k + 1)); memset(p, k, 16 * (k + 1)); return p; }
__attribute__((noinline)) long consume(int k) {
  long n = 0;
  pthread_mutex_lock(&mu[k]);
  while (qh[k] < qn[k]) { free(q[k][qh[k]++]); n++; }
  pthread_mutex_unlock(&mu[k]);
  return n;
}
static void *worker(void *arg) {
  int k = (int)(long)arg, to = (k + 1) % T;
  long freed = 0;
  for (long i = 0; i < M; i++) {
    void *p = produce(k);
    pthread_mutex_lock(&mu[to]);
    q[to][qn[to]++] = p;
    pthread_mutex_unlock(&mu[to]);
    if ((i & 63) == 0) freed += consume(k);
  }
  while (freed < M) freed += consume(k);
  return 0;
}
int main(int argc, char **argv) {
  M = argc > 1 ? atol(argv[1]) : 100000;
  pthread_t th[T];
  for (int k = 0; k < T; k++) { pthread_mutex_init(&mu[k], 0); q[k] = calloc(M, sizeof(void *)); }
  for (int k = 0; k < T; k++) pthread_create(&th[k], 0, worker, (void *)(long)k);
  for (int k = 0; k < T; k++) pthread_join(th[k], 0);
  for (int k = 0; k < T; k++) free(q[k]);
  printf("handoff done %ld\n", M);
  return 0;
}
