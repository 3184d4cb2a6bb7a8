/* Data objects for the -ibs test seam (IGPROF_IBS_TEST_RECORDS): the
 * program publishes, in its exported igprof_ibs_record, the raw IBS
 * sample a real op of each phase would produce (the kernel's
 * PERF_SAMPLE_RAW layout: u32 size, u32 ibs_caps, then the registers),
 * and spends CPU time in each phase while touching the object named.
 *
 *   ibs_objects op     heap blocks from three sites, 600/300/100 ms, then
 *                      a global array, the stack and an anonymous mapping
 *                      100/100/50 ms, each with its own latency and source
 *   ibs_objects fetch  fetch samples of hot_access for 300 ms
 *
 * Built with -rdynamic so that the profiler finds the record. Register
 * bits as arch/x86/include/asm/amd/ibs.h lays them out. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

struct raw {
    uint32_t size; /* 0 while the program rewrites the rest */
    uint32_t caps;
    uint64_t regs[7];
};
volatile struct raw igprof_ibs_record;

int global_table[4096];

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* The sampled op's instruction (IbsOpRip points into it). */
__attribute__((noinline)) long hot_access(volatile char *p, long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += p[(i * 64) & 127];
    return s;
}

__attribute__((noinline)) long spin_on(volatile char *p, double ms)
{
    long s = 0;
    double end = cpu_ms() + ms;
    while (cpu_ms() < end)
        s += hot_access(p, 200);
    return s;
}

/* Publishes an op sample: a load that missed with `lat` cycles, from
 * data source `src` (IbsOpData2), at `addr`. The handler runs on this
 * thread, between two of its instructions: with size 0 it reads nothing,
 * so it never sees half a record. */
static void publish_op(void *addr, uint64_t lat, uint64_t src)
{
    igprof_ibs_record.size = 0;
    igprof_ibs_record.caps = 0x1f;
    igprof_ibs_record.regs[0] = 1ull << 18;                     /* IbsOpCtl: op_val */
    igprof_ibs_record.regs[1] = (uint64_t)(uintptr_t)hot_access + 4; /* IbsOpRip */
    igprof_ibs_record.regs[2] = 100ull << 16;                   /* tag_to_ret_ctr */
    igprof_ibs_record.regs[3] = src;                            /* IbsOpData2 */
    /* IbsOpData3: ld_op, dc_miss, dc_lin_addr_valid, dc_miss_lat. */
    igprof_ibs_record.regs[4] = 1 | 1ull << 7 | 1ull << 17 | lat << 32;
    igprof_ibs_record.regs[5] = (uint64_t)(uintptr_t)addr;      /* IbsDcLinAd */
    igprof_ibs_record.regs[6] = 0;
    igprof_ibs_record.size = 4 + 7 * 8;
}

__attribute__((noinline)) char *alloc_a(void) { return malloc(1 << 20); }
__attribute__((noinline)) char *alloc_b(void) { return malloc(200); }
__attribute__((noinline)) char *alloc_c(void) { return malloc(4000); }

int main(int argc, char **argv)
{
    long s = 0;
    if (argc > 1 && strcmp(argv[1], "fetch") == 0) {
        igprof_ibs_record.caps = 0x1f;
        /* IbsFetchCtl: fetch_val, fetch_comp, ic_miss, fetch_lat 60. */
        igprof_ibs_record.regs[0] = 1ull << 49 | 1ull << 50 | 1ull << 51 | 60ull << 32;
        igprof_ibs_record.regs[1] = (uint64_t)(uintptr_t)hot_access + 8;
        igprof_ibs_record.size = 4 + 3 * 8;
        s += spin_on((volatile char *)global_table, 300);
        printf("fetch %d\n", (int)(s & 1) * 0);
        return 0;
    }
    char *a = alloc_a(), *b = alloc_b(), *c = alloc_c();
    memset(a, 1, 1 << 20);
    memset(b, 2, 200);
    memset(c, 3, 4000);
    char on_stack[256];
    memset(on_stack, 4, sizeof on_stack);
    char *anon = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(anon, 5, 4096);
    /* DRAM (legacy data_src 3), 400 cycles, in the middle of a. */
    publish_op(a + (1 << 19), 400, 3);
    s += spin_on(a + (1 << 19), 600);
    /* A remote cache (4), line modified there (cache_hit_st 0): HitM. */
    publish_op(b + 100, 200, 4);
    s += spin_on(b, 300);
    /* The local cache (2), line not modified (cache_hit_st 1). */
    publish_op(c + 3000, 50, 2 | 1 << 5);
    s += spin_on(c + 3000, 100);
    publish_op(&global_table[1000], 30, 2 | 1 << 5);
    s += spin_on((volatile char *)&global_table[1000], 100);
    publish_op(on_stack + 8, 10, 2 | 1 << 5);
    s += spin_on(on_stack, 100);
    publish_op(anon + 64, 5, 2 | 1 << 5);
    s += spin_on(anon, 50);
    igprof_ibs_record.size = 0;
    printf("op %d\n", (int)(s & 1) * 0);
    free(a);
    free(b);
    free(c);
    return 0;
}
