/* Says whether the process has any child at main, zombie or running, of
 * any kind (__WALL: also those whose exit signal is not SIGCHLD):
 * "children: none" or "children: pid N". */
#include <errno.h>
#include <stdio.h>
#include <sys/wait.h>

int main(void) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG | __WALL);
    if (p == -1 && errno == ECHILD)
        printf("children: none\n");
    else
        printf("children: pid %d\n", (int)p);
    return 0;
}
