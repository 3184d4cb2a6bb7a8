/* Prints what glibc's malloc holds when main starts (mallinfo2): nothing
 * for a program that has not allocated yet, and the profiler must leave
 * it so (no allocation with the program's malloc during its start-up). */
#include <malloc.h>
#include <stdio.h>

int main(void) {
    struct mallinfo2 m = mallinfo2();
    printf("arena %zu in use %zu free %zu mmapped %zu\n", m.arena, m.uordblks, m.fordblks, m.hblkhd);
    return 0;
}
