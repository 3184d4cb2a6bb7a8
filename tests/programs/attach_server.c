/* A small server to attach to (igprof --attach): listens on 127.0.0.1,
 * prints its port, and serves each connection on a thread of its own.
 * Each request is a line "N\n"; the answer is a line computed from N only
 * (so a run under the profiler can be compared byte for byte with one
 * without), made in a buffer from reply_buffer() and freed after sending,
 * and every request keeps one 48-byte record from keep_record() for good.
 * At its start it allocates 1,000 blocks (old_blocks()), which the
 * request "free-old" frees: frees of blocks older than an attach.
 * "spin MS" burns MS ms of the serving thread's CPU time in spin() and
 * answers "spun US" with the CPU time it measured.
 * "load" loads libz (dlopen) and answers "loaded"; "unload" unloads it
 * (dlclose) and answers "unloaded".
 * "exec" answers, then execs /bin/true.
 * "quit" ends the process with status 0 after answering.
 *
 * Exact truth for a profile of requests made while attached: N requests
 * give reply_buffer N calls of 64 bytes (none live), keep_record N calls
 * of 48 bytes (all live). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void *old[1000];
static void **kept;
static size_t nkept, capkept;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) static void old_blocks(void)
{
    for (int i = 0; i < 1000; i++)
        old[i] = malloc(40);
}

__attribute__((noinline)) static char *reply_buffer(void)
{
    return malloc(64);
}

__attribute__((noinline)) static void keep_record(unsigned long n)
{
    unsigned long *r = malloc(48);
    r[0] = n;
    pthread_mutex_lock(&lock);
    if (nkept == capkept) {
        /* Grown with mmap-free realloc of a large array up front: the
         * array itself is allocated once, before any attach. */
        fprintf(stderr, "attach_server: more than %zu records\n", capkept);
        exit(3);
    }
    kept[nkept++] = r;
    pthread_mutex_unlock(&lock);
}

static int send_all(int fd, const char *b, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Burns the thread's CPU for `ms` milliseconds of its own CPU time;
 * returns the CPU time it measured, in microseconds. */
__attribute__((noinline)) static long spin(long ms)
{
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    volatile unsigned long x = 0;
    for (;;) {
        for (int i = 0; i < 100000; i++)
            x += (unsigned long)i * i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        long us = (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
        if (us >= ms * 1000)
            return us;
    }
}

static void *plugin;

__attribute__((noinline)) static int handle(int fd, const char *line)
{
    if (strcmp(line, "quit") == 0) {
        send_all(fd, "bye\n", 4);
        exit(0);
    }
    if (strcmp(line, "exec") == 0) {
        send_all(fd, "exec\n", 5);
        execl("/bin/true", "true", (char *)NULL);
        return -1;
    }
    if (strcmp(line, "load") == 0) {
        plugin = dlopen("libz.so.1", RTLD_NOW);
        return plugin ? send_all(fd, "loaded\n", 7) : send_all(fd, "no\n", 3);
    }
    if (strcmp(line, "unload") == 0) {
        int r = plugin ? dlclose(plugin) : -1;
        plugin = NULL;
        return r == 0 ? send_all(fd, "unloaded\n", 9) : send_all(fd, "no\n", 3);
    }
    if (strcmp(line, "free-old") == 0) {
        for (int i = 0; i < 1000; i++)
            free(old[i]);
        return send_all(fd, "freed\n", 6);
    }
    if (strncmp(line, "spin ", 5) == 0) {
        char b[64];
        int len = snprintf(b, sizeof b, "spun %ld\n", spin(strtol(line + 5, NULL, 10)));
        return send_all(fd, b, (size_t)len);
    }
    unsigned long n = strtoul(line, NULL, 10);
    char *b = reply_buffer();
    unsigned long h = n * 2654435761UL;
    int len = snprintf(b, 64, "%lu %lx %lu\n", n, h, n * n % 1000003);
    keep_record(n);
    int r = send_all(fd, b, (size_t)len);
    free(b);
    return r;
}

static void *serve(void *arg)
{
    int fd = (int)(long)arg;
    char line[128];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(fd, line + have, sizeof line - 1 - have);
        if (r <= 0)
            break;
        have += (size_t)r;
        char *nl;
        while ((nl = memchr(line, '\n', have)) != NULL) {
            *nl = 0;
            if (handle(fd, line) < 0)
                goto out;
            size_t used = (size_t)(nl - line) + 1;
            memmove(line, nl + 1, have - used);
            have -= used;
        }
        if (have == sizeof line - 1)
            break;
    }
out:
    close(fd);
    return NULL;
}

int main(void)
{
    capkept = 1 << 20;
    kept = calloc(capkept, sizeof *kept);
    old_blocks();
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 64) != 0) {
        perror("attach_server");
        return 1;
    }
    socklen_t al = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &al);
    printf("port %d\n", ntohs(a.sin_port));
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        pthread_t t;
        pthread_create(&t, NULL, serve, (void *)(long)c);
        pthread_detach(t);
    }
}
