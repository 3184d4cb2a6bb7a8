/* A daemon-like program that treats descriptors as its own: it reports the
 * first descriptor it gets, counts what /proc/self/fd lists, closes every
 * descriptor from 3 up (one by one and with close_range), then opens and
 * reads a file; with "stderr" it also closes stderr and reuses descriptor 2
 * for a data file. Everything it prints must be the same profiled. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "burn_ms.h"

/* The worker says it runs before main touches descriptors: a profiler opens
 * a thread's perf events as the thread starts, and perf_event_open takes the
 * lowest free descriptor for a moment (see the user guide, -fd). */
static volatile int worker_runs;
static void *worker(void *a) { (void)a; worker_runs = 1; burn_ms(100); return 0; }

__attribute__((noinline)) static void after_close_all(void) {
    burn_thread_ms(100); /* its own: the worker may be burning beside it */
    sink++; /* not a tail call: keeps this frame on the stack */
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own descriptor */
}

int main(int argc, char **argv) {
    const char *data = argc > 1 ? argv[1] : "data.txt";
    int stderr_too = argc > 2 && !strcmp(argv[2], "stderr");
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    while (!worker_runs) sched_yield();
    int fd = open("/etc/hostname", O_RDONLY);
    printf("first descriptor %d, %d open\n", fd, count_fds());
    for (int i = 3; i < 256; i++) close(i);
    syscall(SYS_close_range, 3, ~0U, 0);
    FILE *f = fopen(data, "w");
    fprintf(f, "program data\n");
    fclose(f);
    int in = open(data, O_RDONLY);
    char buf[64] = {0};
    ssize_t r = read(in, buf, sizeof buf - 1);
    printf("after closing all: descriptor %d read %zd: %s", in, r, buf);
    /* Ask for a dump while the program's file is open. */
    if (getenv("DUMP_SIGNAL")) kill(getpid(), atoi(getenv("DUMP_SIGNAL")));
    after_close_all();
    close(in);
    if (stderr_too) {
        close(2);
        int two = open(data, O_WRONLY | O_APPEND);
        printf("stderr's number reused: %d\n", two);
    }
    pthread_join(t, 0);
    struct rlimit rl = {16, 32}; /* soft 16, hard above it */
    setrlimit(RLIMIT_NOFILE, &rl);
    int n = 0;
    while (open("/etc/hostname", O_RDONLY) >= 0) n++;
    printf("under a soft RLIMIT_NOFILE of 16: opened %d more\n", n);
    return 0;
}
