/* Runs argv[1] (with the arguments after it) through posix_spawnp, as
 * make and many runtimes do (glibc makes the child with CLONE_VFORK: it
 * shares this process's memory until it execs), waits for it and prints
 * its exit status. */
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: spawner PROGRAM [ARG...]\n");
        return 2;
    }
    pid_t pid;
    int st;
    int r = posix_spawnp(&pid, argv[1], 0, 0, argv + 1, environ);
    if (r != 0) {
        printf("posix_spawnp failed: %d\n", r);
        return 1;
    }
    if (waitpid(pid, &st, 0) != pid) {
        perror("waitpid");
        return 1;
    }
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    return 0;
}
