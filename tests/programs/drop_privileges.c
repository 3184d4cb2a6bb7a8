/* Started as root, gives up its privileges as daemons do (setgid, then
 * setuid to nobody), then allocates and exits. */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline, noclone)) static void allocate(long n) {
    for (long i = 0; i < n; i++) {
        void *volatile p = malloc(100);
        free(p);
    }
}

int main(void) {
    if (setgroups(0, 0) || setgid(65534) || setuid(65534)) {
        perror("dropping privileges");
        return 2;
    }
    allocate(1000);
    printf("uid %d\n", (int)getuid());
    return 0;
}
