//! System calls made with the instruction itself, not through libc: they
//! touch no errno and no other thread-local state, so code that runs on
//! another task's TLS (the keeper, while the program lives) may make them.
//! The result is the kernel's: a negative errno on failure.

/// # Safety
/// As the system call `n` with these arguments.
#[cfg(target_arch = "x86_64")]
pub unsafe fn raw_syscall(n: libc::c_long, a: [usize; 6]) -> isize {
    let r: isize;
    // SAFETY: the syscall instruction clobbers only rax, rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => r,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack)
        );
    }
    r
}

/// # Safety
/// As the system call `n` with these arguments.
#[cfg(target_arch = "aarch64")]
pub unsafe fn raw_syscall(n: libc::c_long, a: [usize; 6]) -> isize {
    let r: isize;
    // SAFETY: svc 0 returns in x0 and clobbers nothing else.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a[0] as isize => r,
            in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
            options(nostack)
        );
    }
    r
}
