/* Forks with every signal blocked, as a program about to exec does (glib's
 * g_spawn, chromium's LaunchProcess), and the child then:
 *   raw   resets every signal handler to SIG_DFL and unblocks every signal
 *         by raw system calls (as chromium's children do before exec),
 *         touches 2000 pages and burns 100 ms of CPU, and ends by a raw
 *         exit_group(0): a sampling signal there would end it;
 *   libc  unblocks every signal with sigprocmask and burns 300 ms of CPU in
 *         child_burn, then exits 0 (a worker that goes on working).
 *   reset resets every handler by raw system calls, as raw does, but
 *         unblocks with sigprocmask (chromium's order), then as raw.
 * The parent prints "child exit N" or "child signal N". */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "burn_ms.h"

struct kernel_sigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

__attribute__((noinline)) static void child_burn(void) { burn_ms(300); }

static void raw_child(int unblock_by_libc) {
    struct kernel_sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    for (int sig = 1; sig < 65; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            syscall(SYS_rt_sigaction, sig, &dfl, NULL, 8);
    if (unblock_by_libc) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
    } else {
        unsigned long none = 0;
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    }
    long page = sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, 2000 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
        for (int i = 0; i < 2000; i++) p[i * page] = 1;
    burn_ms(100);
    syscall(SYS_exit_group, 0);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "raw";
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        if (!strcmp(how, "raw") || !strcmp(how, "reset"))
            raw_child(!strcmp(how, "reset"));
        sigprocmask(SIG_SETMASK, &old, NULL);
        child_burn();
        exit(0);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        perror("fork/waitpid");
        return 1;
    }
    if (WIFEXITED(st))
        printf("child exit %d\n", WEXITSTATUS(st));
    else
        printf("child signal %d\n", WTERMSIG(st));
    return 0;
}
