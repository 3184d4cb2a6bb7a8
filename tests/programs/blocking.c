/* Threads that wait in the ways programs wait: poll, select, nanosleep,
 * read on a pipe, a condition variable (futex), 200 ms each, while main
 * burns CPU. Prints how many calls failed with EINTR (0 unprofiled), and on
 * stderr each thread's wall-clock time ("in_read 203", ms). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>
#include "burn_ms.h"

static int eintr;
static int pipefd[2];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void count(int r) {
    if (r < 0 && errno == EINTR) __atomic_add_fetch(&eintr, 1, __ATOMIC_RELAXED);
}

__attribute__((noinline)) static void *in_poll(void *a) {
    for (int i = 0; i < 10; i++) count(poll(0, 0, 20));
    return a;
}
__attribute__((noinline)) static void *in_select(void *a) {
    for (int i = 0; i < 10; i++) {
        struct timeval tv = {0, 20000};
        count(select(0, 0, 0, 0, &tv));
    }
    return a;
}
__attribute__((noinline)) static void *in_nanosleep(void *a) {
    for (int i = 0; i < 10; i++) {
        struct timespec ts = {0, 20000000};
        count(nanosleep(&ts, 0));
    }
    return a;
}
__attribute__((noinline)) static void *in_read(void *a) {
    char c;
    count(read(pipefd[0], &c, 1));
    return a;
}
__attribute__((noinline)) static void *in_cond(void *a) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200000000;
    if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
    pthread_mutex_lock(&mu);
    int r;
    do r = pthread_cond_timedwait(&cv, &mu, &until); while (r == 0);
    if (r == EINTR) eintr++;
    pthread_mutex_unlock(&mu);
    return a;
}

static void *(*fs[])(void *) = {in_poll, in_select, in_nanosleep, in_read, in_cond};
static const char *names[] = {"in_poll", "in_select", "in_nanosleep", "in_read", "in_cond"};
static double wall[5];

static void *timed(void *a) {
    long i = (long)a;
    double t0 = now_ms();
    fs[i](0);
    wall[i] = now_ms() - t0;
    return 0;
}

int main(void) {
    pipe(pipefd);
    pthread_t t[5];
    for (long i = 0; i < 5; i++) pthread_create(&t[i], 0, timed, (void *)i);
    burn_ms(200);
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, 0);
    write(pipefd[1], "x", 1);
    for (int i = 0; i < 5; i++) pthread_join(t[i], 0);
    printf("eintr %d\n", eintr);
    for (int i = 0; i < 5; i++) fprintf(stderr, "%s %.0f\n", names[i], wall[i]);
    return 0;
}
