/* Two threads grow the heap until the OOM killer ends the process: each
 * allocates and touches a block of argv[1] KiB at grow_alloc, then pauses
 * argv[2] microseconds, without end. After each block, the count of blocks
 * made by both is printed (under a lock, so the last line printed is the
 * largest). tests/tests/process_ends.rs compares it with the profile that
 * the snapshot and its memory journal leave. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t block;
static long pause_ns;
static long made;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) void *grow_alloc(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 1, n);
    return p;
}

static void *grow(void *arg) {
    (void)arg;
    struct timespec ts = {0, pause_ns};
    for (;;) {
        if (!grow_alloc(block)) exit(3);
        pthread_mutex_lock(&lock);
        printf("%ld\n", ++made);
        fflush(stdout);
        pthread_mutex_unlock(&lock);
        if (pause_ns) nanosleep(&ts, 0);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: grow_threads KIB PAUSE_US\n");
        return 2;
    }
    block = (size_t)atol(argv[1]) << 10;
    pause_ns = atol(argv[2]) * 1000;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, grow, 0);
    pthread_join(t[0], 0);
    return 0;
}
