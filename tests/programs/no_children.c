/* Says what the process has at main that a profiler's start-up could have
 * left behind: any child, zombie or running, of any kind (__WALL: also
 * those whose exit signal is not SIGCHLD), "children: none" or
 * "children: pid N"; and how many CPUs its CPU set holds, "cpus: N". */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <sys/wait.h>

int main(void) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG | __WALL);
    if (p == -1 && errno == ECHILD)
        printf("children: none\n");
    else
        printf("children: pid %d\n", (int)p);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        printf("cpus: %d\n", CPU_COUNT(&set));
    else
        printf("cpus: unknown\n");
    return 0;
}
