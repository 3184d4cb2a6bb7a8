/* What the C library's heap holds when main starts: its arena's size and
 * the bytes in use (mallinfo2), before the program allocates anything. */
#include <malloc.h>
#include <stdio.h>

int main(void) {
    struct mallinfo2 m = mallinfo2();
    printf("arena %zu in use %zu mapped %zu\n", m.arena, m.uordblks, m.hblkhd);
    return 0;
}
