//! Signals to the library's own threads and masks, by direct system calls
//! (tgkill, rt_sigprocmask), and signal names for messages.
//!
//! Must never: send a signal outside this process, or install a handler
//! (handlers belong to process/signals.rs and the sampler).

use super::errno::{errno, ErrnoGuard};
use super::task::getpid;

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
