/* Ends without any exit handler, in the way argv[1] says, after making
 * argv[2] allocations of 64 bytes at one site (kept_alloc) and burning
 * about 0.3 s of CPU in burn():
 *   kill      prints "ready N" and waits to be killed (SIGKILL by the test);
 *   crash     segfaults inside its own SIGSEGV handler;
 *   exitgroup ends with a raw exit_group(7) system call;
 *   child     forks a child that does the above and then kills itself with a
 *             raw SIGKILL system call (no hook of kill sees it); the parent
 *             prints how the child ended;
 *   daemon    forks a child that closes its stdio and lives on for N s (3
 *             for 0),
 *             while the parent returns at once (a pipe's reader must see
 *             end-of-file then);
 *   children  prints what wait() and waitpid(-1, __WALL) return and how many
 *             processes name it as their parent (none, as unprofiled);
 *   grow      runs for 0.3 s (a service at work), then allocates and touches
 *             blocks of N KiB (1 MiB for 0) at grow_alloc without end,
 *             printing how many after each (the OOM killer ends it in a
 *             memory cgroup);
 *   cachegrow reads the file argv[2] once (its pages fill the page cache,
 *             charged to the cgroup), then grows as grow does;
 *   growto    allocates and touches N blocks of 1 MiB at grow_alloc, says
 *             "grown N", then waits (30 s at most) to be ended;
 *   growspin  as growto, then waits (10 s at most) for the file argv[3]
 *             to appear (a snapshot's journal), burns 0.5 s of CPU in
 *             burn, opens /dev/null 5 times at open_after, makes 100 more
 *             blocks, forks a child that makes 7 blocks at child_alloc,
 *             burns 0.1 s in child_burn and exits, says "ready SECONDS"
 *             (the CPU time burn measured), then waits (30 s at most) to
 *             be ended;
 *   none      returns from main (the ordinary end, for comparison).
 * Its output and status are what the tests compare with the unprofiled run. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *kept[1 << 20];

__attribute__((noinline)) void *kept_alloc(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

__attribute__((noinline)) double burn(double secs) {
    struct timespec a, b;
    double x = 0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 100000; i++) x += i * 0.5;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);
    return x;
}

__attribute__((noinline)) void *grow_alloc(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 1, n);
    return p;
}

__attribute__((noinline)) void *child_alloc(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 2, n);
    return p;
}

__attribute__((noinline)) double child_burn(double secs) {
    double r = burn(secs);
    __asm__ volatile("" : : "x"(r) : "memory"); /* not a tail call */
    return r;
}

__attribute__((noinline)) int open_after(const char *path) {
    int fd = open(path, O_RDONLY);
    __asm__ volatile("" : : "r"(fd) : "memory");
    return fd;
}

static void bad_handler(int sig) {
    (void)sig;
    volatile int *p = (volatile int *)(unsigned long)sig - sig;
    *p = 1; /* SIGSEGV again, inside the handler: the kernel kills the process */
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: kill_mid kill|crash|exitgroup|child|daemon|children|grow|cachegrow|growto|growspin|none N|FILE [FILE]\n");
        return 2;
    }
    long n = atol(argv[2]);
    if (!strcmp(argv[1], "grow") || !strcmp(argv[1], "cachegrow")) {
        if (argv[1][0] == 'c') {
            static char buf[1 << 16];
            FILE *f = fopen(argv[2], "r");
            if (!f) return 4;
            while (fread(buf, 1, sizeof buf, f) == sizeof buf) {}
            fclose(f);
        }
        size_t block = argv[1][0] == 'g' && n > 0 ? (size_t)n << 10 : 1 << 20;
        burn(0.3);
        for (long i = 1;; i++) {
            if (!grow_alloc(block)) return 3;
            printf("%ld\n", i);
            fflush(stdout);
        }
    }
    if (!strcmp(argv[1], "growto")) {
        for (long i = 0; i < n; i++)
            if (!grow_alloc(1 << 20)) return 3;
        printf("grown %ld\n", n);
        fflush(stdout);
        struct timespec ts = {30, 0};
        nanosleep(&ts, 0);
        return 0;
    }
    if (!strcmp(argv[1], "growspin") && argc > 3) {
        for (long i = 0; i < n; i++)
            if (!grow_alloc(1 << 20)) return 3;
        printf("grown %ld\n", n);
        fflush(stdout);
        for (int i = 0; i < 1000 && access(argv[3], F_OK) != 0; i++) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, 0);
        }
        struct timespec a, b;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        burn(0.5);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        for (int i = 0; i < 5; i++)
            if (open_after("/dev/null") < 0) return 4;
        for (long i = 0; i < 100; i++)
            if (!grow_alloc(1 << 20)) return 3;
        pid_t kid = fork();
        if (kid == 0) {
            for (int i = 0; i < 7; i++)
                if (!child_alloc(1 << 20)) _exit(3);
            child_burn(0.1);
            exit(0);
        }
        int st = -1;
        if (kid < 0 || waitpid(kid, &st, 0) != kid || st != 0) return 5;
        printf("ready %.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
        fflush(stdout);
        struct timespec ts = {30, 0};
        nanosleep(&ts, 0);
        return 0;
    }
    if (!strcmp(argv[1], "children")) {
        errno = 0;
        pid_t w = wait(NULL);
        printf("wait %d %s\n", (int)w, strerror(errno));
        errno = 0;
        w = waitpid(-1, NULL, __WALL | WNOHANG);
        printf("waitpid __WALL %d %s\n", (int)w, strerror(errno));
        int kids = 0;
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char path[300], buf[512];
            snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            size_t len = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[len] = 0;
            char *r = strrchr(buf, ')');
            int ppid = 0;
            if (r && sscanf(r + 2, "%*c %d", &ppid) == 1 && ppid == getpid()) kids++;
        }
        if (d) closedir(d);
        printf("children %d\n", kids);
        return 0;
    }
    if (!strcmp(argv[1], "daemon")) {
        pid_t c = fork();
        if (c == 0) {
            close(0);
            close(1);
            close(2);
            setsid();
            sleep(n > 0 ? n : 3);
            _exit(0);
        }
        printf("parent %d\n", c > 0);
        return 0;
    }
    if (!strcmp(argv[1], "child")) {
        fflush(stdout);
        pid_t c = fork();
        if (c > 0) {
            int st = 0;
            waitpid(c, &st, 0);
            printf("child killed by %d\n", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            return 0;
        }
    }
    if (n > (long)(sizeof kept / sizeof kept[0])) n = sizeof kept / sizeof kept[0];
    for (long i = 0; i < n; i++) kept[i] = kept_alloc(64);
    double x = burn(0.3);
    printf("ready %ld %d\n", n, x > 0);
    fflush(stdout);
    if (!strcmp(argv[1], "kill")) {
        for (;;) pause();
    } else if (!strcmp(argv[1], "child")) {
        syscall(SYS_kill, getpid(), SIGKILL);
    } else if (!strcmp(argv[1], "crash")) {
        signal(SIGSEGV, bad_handler);
        raise(SIGSEGV);
    } else if (!strcmp(argv[1], "exitgroup")) {
        syscall(SYS_exit_group, 7);
    }
    return 0;
}
