/* Says whether the page holding libm's .eh_frame_hdr is mapped in this
 * process (/proc/self/pagemap), after some work of its own that never runs
 * in libm. Linked with libm (--no-as-needed), whose code it never calls:
 * unprofiled, nothing reads that page, and a profiler that unwinds only
 * through the program and libc should leave it as it was.
 *
 *   unwound_objects MS   -> "libm eh_frame_hdr: absent, read-only segment"
 *
 * ("present"; "executable segment" where the object's layout puts its
 * unwind tables in with its code, as Debian's AArch64 libraries do.)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uintptr_t hdr_page;
static int hdr_in_code;

static int find_libm(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    if (!strstr(info->dlpi_name, "/libm.so"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME)
            hdr_page = (info->dlpi_addr + info->dlpi_phdr[i].p_vaddr) & ~(uintptr_t)4095;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && lo <= hdr_page && hdr_page < lo + ph->p_memsz)
            hdr_in_code = (ph->p_flags & PF_X) != 0;
    }
    return 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    double ms = argc > 1 ? atof(argv[1]) : 50;
    volatile uint64_t x = 1;
    for (double t0 = now_ms(); now_ms() - t0 < ms;)
        for (int i = 0; i < 100000; i++)
            x = x * 6364136223846793005u + 1442695040888963407u;
    dl_iterate_phdr(find_libm, NULL);
    if (!hdr_page) {
        printf("libm eh_frame_hdr: not found\n");
        return 1;
    }
    int fd = open("/proc/self/pagemap", O_RDONLY);
    uint64_t entry = 0;
    if (fd < 0 || pread(fd, &entry, 8, (off_t)(hdr_page / 4096 * 8)) != 8) {
        printf("libm eh_frame_hdr: pagemap unreadable\n");
        return 1;
    }
    close(fd);
    printf("libm eh_frame_hdr: %s, %s segment\n", entry >> 63 ? "present" : "absent",
           hdr_in_code ? "executable" : "read-only");
    return 0;
}
