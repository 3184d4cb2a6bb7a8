//! Signals to the library's own threads and masks, by direct system calls
//! (tgkill, rt_sigprocmask), signal names for messages, and the entry a
//! handler is installed at ([`signal_entry`]).
//!
//! Must never: send a signal outside this process, or install a handler
//! (handlers belong to process/signals.rs and the sampler).

use super::errno::{errno, ErrnoGuard};
use super::task::getpid;

/// Defines `fn $entry() -> usize`: the address a signal action names for
/// the `SA_SIGINFO` handler `$handler`. On x86-64 that is a shim, the
/// symbol `$symbol` in section `$section`, which aligns the stack to the
/// ABI's 16 bytes and calls the handler: qemu-user 7.2 (Debian 12's, which
/// runs an x86-64 program on an AArch64 host) enters an x86-64 program's
/// handlers with the stack 8 bytes off, and a handler's aligned vector
/// stores then fault (the program died of SIGSEGV at its first sample).
/// Where the stack is aligned the `and` changes nothing: four instructions
/// a signal. On AArch64, where the architecture keeps sp aligned, it is
/// the handler itself.
macro_rules! signal_entry {
    ($entry:ident, $symbol:literal, $section:literal, $handler:path) => {
        #[cfg(target_arch = "x86_64")]
        fn $entry() -> usize {
            extern "C" {
                #[link_name = $symbol]
                fn shim(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void);
            }
            shim as *const () as usize
        }

        #[cfg(target_arch = "x86_64")]
        core::arch::global_asm!(
            concat!(".pushsection ", $section, ",\"ax\",@progbits"),
            ".p2align 4",
            concat!(".hidden ", $symbol),
            concat!(".globl ", $symbol),
            concat!(".type ", $symbol, ",@function"),
            concat!($symbol, ":"),
            ".cfi_startproc",
            "endbr64",
            "push rbp",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_offset rbp, -16",
            "mov rbp, rsp",
            ".cfi_def_cfa_register rbp",
            "and rsp, -16",
            "call {handler}",
            "leave",
            ".cfi_def_cfa rsp, 8",
            "ret",
            ".cfi_endproc",
            concat!(".size ", $symbol, ", . - ", $symbol),
            ".popsection",
            handler = sym $handler,
        );

        #[cfg(target_arch = "aarch64")]
        fn $entry() -> usize {
            $handler as *const () as usize
        }
    };
}
pub(crate) use signal_entry;

/// Sends `sig` to thread `tid` of this process.
pub fn tgkill(tid: i32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::syscall(libc::SYS_tgkill, getpid(), tid, sig) };
}

/// Whether the thread `tid` of this process still exists: false only when
/// `tgkill(pid, tid, 0)` fails with ESRCH (the task is gone and runs no more
/// code). Leaves errno as it was.
pub fn thread_alive(tid: i32) -> bool {
    let _e = ErrnoGuard::save();
    // SAFETY: plain syscall; signal 0 only checks that the target exists.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, getpid(), tid, 0) };
    r == 0 || errno() != libc::ESRCH
}

/// rt_sigprocmask(2) directly (bypasses any hook on the libc functions).
///
/// # Safety
/// `set` and `old` must be null or valid `sigset_t`.
pub unsafe fn rt_sigprocmask(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> i32 {
    libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8) as i32
}

/// The name of a signal for messages ("SIGTERM"), or "a signal".
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}
