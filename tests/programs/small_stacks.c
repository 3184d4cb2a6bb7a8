/* Threads on the smallest stacks programs use (PTHREAD_STACK_MIN, 20 KiB),
 * a 64 KiB thread that recurses through most of its stack, and a handler
 * on a 64 KiB alternate signal stack: each burns CPU and allocates 1000
 * times. Everything must work as unprofiled while samples arrive. */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "burn_ms.h"

__attribute__((noinline)) static void allocate_1000(void) {
    for (int i = 0; i < 1000; i++) {
        void *volatile p = malloc(24 + i % 100);
        free(p);
    }
}

__attribute__((noinline)) static void *on_small_stack(void *a) {
    burn_ms(40);
    allocate_1000();
    sink++;
    return a;
}

/* About 48 KiB of the 64 KiB stack, 512 bytes a level. */
__attribute__((noinline)) static long deep(int n) {
    volatile char pad[480];
    pad[0] = (char)n;
    if (n == 0) {
        burn_ms(40);
        allocate_1000();
        return pad[0];
    }
    return deep(n - 1) + pad[0];
}

__attribute__((noinline)) static void *on_64k_stack(void *a) {
    sink += deep(96);
    return a;
}

__attribute__((noinline)) static void on_altstack(int sig) {
    (void)sig;
    burn_ms(40);
    allocate_1000();
    sink++;
}

static void run(size_t size, void *(*f)(void *)) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, size);
    pthread_t t;
    if (pthread_create(&t, &at, f, 0)) {
        printf("cannot create a thread of %zu bytes\n", size);
        exit(1);
    }
    pthread_join(t, 0);
    printf("thread on %zu bytes done\n", size);
}

int main(void) {
    run(PTHREAD_STACK_MIN, on_small_stack);
    run(20 * 1024, on_small_stack);
    run(64 * 1024, on_64k_stack);
    stack_t ss = {.ss_sp = malloc(64 * 1024), .ss_size = 64 * 1024};
    sigaltstack(&ss, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_altstack;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, 0);
    raise(SIGUSR1);
    printf("handler on a 64 KiB alternate stack done\n");
    return 0;
}
