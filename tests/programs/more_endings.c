/* More ways a thread or process ends or multiplies, chosen by argv[1]:
 *   thread-exit  a worker thread calls exit(5) while main waits in join
 *   cancel       main cancels a worker blocked in a cancellation point
 *   spawn        posix_spawn of /bin/echo and vfork+exec of /bin/true
 *   fork-mt      fork while three other threads run; the child allocates
 *                and exits, the parent waits for it
 *   segv         its own SIGSEGV handler recovers 100 times by siglongjmp
 *                from touching a PROT_NONE page
 *   exec-chain   execs itself twice (exec-chain 1, exec-chain 2), then
 *                /bin/true
 * Each burns some CPU and allocates in a function of its own first, and
 * prints what it saw on stdout. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "burn_ms.h"

extern char **environ;

__attribute__((noinline)) static void work(void) {
    burn_ms(30);
    for (int i = 0; i < 100; i++) {
        void *volatile p = malloc(100);
        free(p);
    }
}

static void *exits(void *a) {
    (void)a;
    work();
    fflush(stdout);
    exit(5);
}

static void *blocks(void *a) {
    (void)a;
    for (;;) sleep(1);
    return 0;
}

static volatile int stop;
static void *spins(void *a) {
    (void)a;
    while (!stop) sink++;
    return 0;
}

static sigjmp_buf env;
static void on_segv(int sig) {
    (void)sig;
    siglongjmp(env, 1);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "";
    work();
    if (!strcmp(how, "thread-exit")) {
        pthread_t t;
        pthread_create(&t, 0, exits, 0);
        printf("main waits\n");
        pthread_join(t, 0);
        return 1; /* not reached */
    }
    if (!strcmp(how, "cancel")) {
        pthread_t t;
        void *r;
        pthread_create(&t, 0, blocks, 0);
        usleep(20000);
        pthread_cancel(t);
        pthread_join(t, &r);
        printf("cancelled %d\n", r == PTHREAD_CANCELED);
        return 0;
    }
    if (!strcmp(how, "spawn")) {
        pid_t pid;
        char *args[] = {"echo", "spawned", 0};
        fflush(stdout);
        if (posix_spawn(&pid, "/bin/echo", 0, 0, args, environ) != 0) return 2;
        int st;
        waitpid(pid, &st, 0);
        pid = vfork();
        if (pid == 0) {
            execl("/bin/true", "true", (char *)0);
            _exit(127);
        }
        waitpid(pid, &st, 0);
        printf("vfork child %d\n", WEXITSTATUS(st));
        return 0;
    }
    if (!strcmp(how, "fork-mt")) {
        pthread_t t[3];
        for (int i = 0; i < 3; i++) pthread_create(&t[i], 0, spins, 0);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            work();
            printf("child done\n");
            exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        stop = 1;
        for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
        printf("parent saw %d\n", WEXITSTATUS(st));
        return 0;
    }
    if (!strcmp(how, "segv")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, 0);
        volatile char *page = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        volatile int recovered = 0;
        for (int i = 0; i < 100; i++) {
            if (sigsetjmp(env, 1) == 0)
                page[i] = 1;
            else
                recovered++;
        }
        work();
        printf("recovered %d\n", recovered);
        return 0;
    }
    if (!strcmp(how, "exec-chain")) {
        int hop = argc > 2 ? atoi(argv[2]) : 0;
        printf("hop %d\n", hop);
        fflush(stdout);
        if (hop < 2) {
            char n[16];
            snprintf(n, sizeof n, "%d", hop + 1);
            execl("/proc/self/exe", argv[0], "exec-chain", n, (char *)0);
        } else {
            execl("/bin/true", "true", (char *)0);
        }
        return 127;
    }
    fprintf(stderr, "usage: more_endings thread-exit|cancel|spawn|fork-mt|segv|exec-chain\n");
    return 2;
}
