/* Works until a signal ends it. "default": the signal's default action;
 * "handler": its own SIGTERM handler, which must still run (exit 3);
 * "query": prints what sigaction reports for SIGTERM and SIGINT first.
 * Prints "ready" once it has spent 100 ms in its loop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "burn_ms.h"

static void on_term(int sig) {
    (void)sig;
    static const char m[] = "handled\n";
    write(1, m, sizeof m - 1);
    _exit(3);
}

__attribute__((noinline)) static void until_killed(void) {
    for (int i = 0;; i++) {
        burn_ms(2);
        void *volatile p = malloc(32);
        free(p);
        if (i == 50) {
            printf("ready\n");
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "default";
    if (!strcmp(mode, "handler")) signal(SIGTERM, on_term);
    if (!strcmp(mode, "query")) {
        struct sigaction old;
        sigaction(SIGTERM, 0, &old);
        printf("SIGTERM %s\n", old.sa_handler == SIG_DFL ? "default" : "changed");
        void (*prev)(int) = signal(SIGINT, SIG_DFL);
        printf("SIGINT %s\n", prev == SIG_DFL ? "default" : "changed");
    }
    until_killed();
}
