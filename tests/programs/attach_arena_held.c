/* The target of tests/tests/attach.rs's arena test: the main thread is
 * stopped holding glibc's main arena lock. malloc_stats() prints to stderr
 * while it holds each arena's lock; the program first fills its stderr (a
 * pipe the test does not read yet) to the last byte, so that print blocks
 * before writing anything. A second thread sleeps in pause(). A call the
 * launcher made on the main thread (dlopen allocates) would wait for the
 * lock that very thread holds, forever.
 *
 * Prints "ready N" (N: the filler bytes) before malloc_stats(); once the
 * test drains stderr, makes 1,000 allocations of 4,242 bytes in
 * alloc_site(), prints "done", and exits 0 when its stdin closes. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *sleeper(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

__attribute__((noinline)) void *alloc_site(void)
{
    return malloc(4242);
}

int main(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL) != 0)
        return 2;
    int flags = fcntl(2, F_GETFL);
    if (fcntl(2, F_SETFL, flags | O_NONBLOCK) != 0)
        return 3;
    long filler = 0;
    char c = 'x';
    while (write(2, &c, 1) == 1)
        filler++;
    fcntl(2, F_SETFL, flags);
    printf("ready %ld\n", filler);
    fflush(stdout);
    malloc_stats();
    static void *kept[1000];
    for (int i = 0; i < 1000; i++)
        kept[i] = alloc_site();
    printf("done %p\n", kept[999]);
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0)
        ;
    return 0;
}
