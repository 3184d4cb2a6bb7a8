//! The library's own `memcpy`, `memmove`, `memset`, `memcmp`, `bcmp` and
//! `strlen`: hidden local definitions that every call in the library's
//! code (the compiler's copies and clears, Rust's standard library,
//! libdeflate) binds to at link time, and that jump to glibc's functions.
//!
//! Without them these calls go to whatever the loader finds first, and a
//! sanitizer runtime, loaded before the library, defines all six. Its
//! interceptors then see the profiler's own memory, and ThreadSanitizer's
//! keep per-thread state in TLS: run by the keeper, which shares the
//! program's memory and runs on its creator's TLS, they changed the main
//! thread's state under it, and TSan crashed in its stack depot in 4 to 12
//! of 30 runs. Bound here, the keeper calls glibc's, which keep no state.
//!
//! Until start-up finds glibc's functions ([`bind_to_libc`]), and wherever
//! it cannot, each falls back on a plain loop (`rep movsb`/`stosb` on
//! x86-64), slow but correct: the code that runs before it is the Rust
//! runtime's start-up and the library constructor's first lines.
//!
//! Must never: be exported (a program would call them instead of libc's),
//! or use a register the caller's ABI does not let it clobber.

use core::sync::atomic::{AtomicUsize, Ordering};

/// glibc's functions, found at start-up (0: the fallback loops).
static MEMCPY: AtomicUsize = AtomicUsize::new(0);
static MEMMOVE: AtomicUsize = AtomicUsize::new(0);
static MEMSET: AtomicUsize = AtomicUsize::new(0);
static MEMCMP: AtomicUsize = AtomicUsize::new(0);
static BCMP: AtomicUsize = AtomicUsize::new(0);
static STRLEN: AtomicUsize = AtomicUsize::new(0);

/// Finds the definitions that come after the library in the loader's
/// order (`RTLD_NEXT`): glibc's, since the launcher preloads a sanitizer's
/// runtime before the library, never after (a `dlopen` of libc's handle
/// would allocate with the program's `malloc`, and in a process attached
/// to, wait on an arena lock a stopped thread may hold). Sends the
/// library's calls there (a function not found keeps its fallback loop).
/// Start-up, before any other thread of ours.
pub fn bind_to_libc() {
    for (name, slot) in [
        (c"memcpy", &MEMCPY),
        (c"memmove", &MEMMOVE),
        (c"memset", &MEMSET),
        (c"memcmp", &MEMCMP),
        (c"bcmp", &BCMP),
        (c"strlen", &STRLEN),
    ] {
        // SAFETY: a NUL-terminated name; every one of them is defined by
        // libc, so the look-up takes no error path.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        if p != 0 {
            slot.store(p, Ordering::Release);
        }
    }
}

// Only in the release library: a test or benchmark executable built from
// these sources keeps libc's own (its calls would run the fallback loops).
#[cfg(all(target_arch = "x86_64", panic = "abort"))]
core::arch::global_asm!(
    ".pushsection igprof_hot,\"ax\",@progbits",
    ".macro igprof_mem_call name, slot",
    ".globl \\name",
    ".hidden \\name",
    ".type \\name, @function",
    "\\name:",
    "mov rax, qword ptr [rip + \\slot]",
    "test rax, rax",
    "jz 2f",
    "jmp rax",
    "2:",
    ".endm",
    // memcpy(dst, src, n) -> dst
    "igprof_mem_call memcpy, {memcpy}",
    "mov rax, rdi",
    "mov rcx, rdx",
    "rep movsb",
    "ret",
    ".size memcpy, . - memcpy",
    // memmove(dst, src, n) -> dst: backwards where dst lies inside src.
    "igprof_mem_call memmove, {memmove}",
    "mov rax, rdi",
    "mov rcx, rdx",
    "cmp rdi, rsi",
    "jbe 3f",
    "lea r8, [rsi + rdx]",
    "cmp rdi, r8",
    "jae 3f",
    "lea rsi, [rsi + rdx - 1]",
    "lea rdi, [rdi + rdx - 1]",
    "std",
    "rep movsb",
    "cld",
    "ret",
    "3:",
    "rep movsb",
    "ret",
    ".size memmove, . - memmove",
    // memset(dst, c, n) -> dst
    "igprof_mem_call memset, {memset}",
    "mov r8, rdi",
    "mov eax, esi",
    "mov rcx, rdx",
    "rep stosb",
    "mov rax, r8",
    "ret",
    ".size memset, . - memset",
    // memcmp(a, b, n): the difference of the first unequal bytes.
    "igprof_mem_call memcmp, {memcmp}",
    "jmp igprof_mem_compare",
    ".size memcmp, . - memcmp",
    "igprof_mem_call bcmp, {bcmp}",
    "jmp igprof_mem_compare",
    ".size bcmp, . - bcmp",
    "igprof_mem_compare:",
    "xor eax, eax",
    "test rdx, rdx",
    "jz 4f",
    "3:",
    "movzx eax, byte ptr [rdi]",
    "movzx ecx, byte ptr [rsi]",
    "sub eax, ecx",
    "jnz 4f",
    "inc rdi",
    "inc rsi",
    "dec rdx",
    "jnz 3b",
    "4:",
    "ret",
    // strlen(s)
    "igprof_mem_call strlen, {strlen}",
    "mov rax, rdi",
    "3:",
    "cmp byte ptr [rax], 0",
    "je 4f",
    "inc rax",
    "jmp 3b",
    "4:",
    "sub rax, rdi",
    "ret",
    ".size strlen, . - strlen",
    ".purgem igprof_mem_call",
    ".popsection",
    memcpy = sym MEMCPY,
    memmove = sym MEMMOVE,
    memset = sym MEMSET,
    memcmp = sym MEMCMP,
    bcmp = sym BCMP,
    strlen = sym STRLEN,
);

#[cfg(all(target_arch = "aarch64", panic = "abort"))]
core::arch::global_asm!(
    ".pushsection igprof_hot,\"ax\",@progbits",
    ".macro igprof_mem_call name, slot",
    ".globl \\name",
    ".hidden \\name",
    ".type \\name, @function",
    "\\name:",
    "adrp x16, \\slot",
    "ldr x16, [x16, :lo12:\\slot]",
    "cbz x16, 2f",
    "br x16",
    "2:",
    ".endm",
    // memcpy(dst, src, n) -> dst
    "igprof_mem_call memcpy, {memcpy}",
    "mov x3, x0",
    "cbz x2, 4f",
    "3:",
    "ldrb w4, [x1], #1",
    "strb w4, [x3], #1",
    "subs x2, x2, #1",
    "b.ne 3b",
    "4:",
    "ret",
    ".size memcpy, . - memcpy",
    // memmove(dst, src, n) -> dst: backwards where dst lies inside src.
    "igprof_mem_call memmove, {memmove}",
    "mov x3, x0",
    "cbz x2, 6f",
    "cmp x0, x1",
    "b.ls 3f",
    "add x4, x1, x2",
    "cmp x0, x4",
    "b.hs 3f",
    "add x1, x1, x2",
    "add x3, x0, x2",
    "5:",
    "ldrb w4, [x1, #-1]!",
    "strb w4, [x3, #-1]!",
    "subs x2, x2, #1",
    "b.ne 5b",
    "ret",
    "3:",
    "ldrb w4, [x1], #1",
    "strb w4, [x3], #1",
    "subs x2, x2, #1",
    "b.ne 3b",
    "6:",
    "ret",
    ".size memmove, . - memmove",
    // memset(dst, c, n) -> dst
    "igprof_mem_call memset, {memset}",
    "mov x3, x0",
    "cbz x2, 4f",
    "3:",
    "strb w1, [x3], #1",
    "subs x2, x2, #1",
    "b.ne 3b",
    "4:",
    "ret",
    ".size memset, . - memset",
    // memcmp(a, b, n): the difference of the first unequal bytes.
    "igprof_mem_call memcmp, {memcmp}",
    "b igprof_mem_compare",
    ".size memcmp, . - memcmp",
    "igprof_mem_call bcmp, {bcmp}",
    "b igprof_mem_compare",
    ".size bcmp, . - bcmp",
    "igprof_mem_compare:",
    "cbz x2, 5f",
    "3:",
    "ldrb w3, [x0], #1",
    "ldrb w4, [x1], #1",
    "subs w3, w3, w4",
    "b.ne 4f",
    "subs x2, x2, #1",
    "b.ne 3b",
    "5:",
    "mov w0, #0",
    "ret",
    "4:",
    "mov w0, w3",
    "ret",
    // strlen(s)
    "igprof_mem_call strlen, {strlen}",
    "mov x1, x0",
    "3:",
    "ldrb w2, [x1], #1",
    "cbnz w2, 3b",
    "sub x0, x1, x0",
    "sub x0, x0, #1",
    "ret",
    ".size strlen, . - strlen",
    ".purgem igprof_mem_call",
    ".popsection",
    memcpy = sym MEMCPY,
    memmove = sym MEMMOVE,
    memset = sym MEMSET,
    memcmp = sym MEMCMP,
    bcmp = sym BCMP,
    strlen = sym STRLEN,
);
