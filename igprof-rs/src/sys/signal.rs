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

/// glibc's thread-cancellation signal (the kernel's first real-time
/// signal, which glibc keeps for itself as SIGCANCEL).
const SIGCANCEL: usize = 32;

/// Every signal but glibc's SIGSETXID: the mask of a handler that must run
/// to its end. glibc's `sigfillset` leaves out SIGCANCEL, so a thread that
/// enabled asynchronous cancellation could be cancelled inside the handler
/// and unwound through the library's frames (on its walk stack, where the
/// unwinder found no way back and the program died of SIGSEGV); with it
/// blocked, the cancellation is acted on where the handler returns to, as
/// unprofiled. SIGSETXID stays deliverable: a `setuid` in another thread
/// waits for every thread to take it, and its handler runs no program code.
pub fn handler_mask() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is a valid set for sigfillset to fill.
    let mut set: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: set is a valid sigset_t.
    unsafe { libc::sigfillset(&mut set) };
    // SAFETY: sigset_t is an array of unsigned longs whose bit (n - 1)
    // stands for signal n, as the kernel reads it (glibc's sigaddset
    // refuses its internal signals, so the bit is set directly).
    let words = unsafe { &mut *(&mut set as *mut libc::sigset_t as *mut [u64; 1]) };
    words[0] |= 1 << (SIGCANCEL - 1);
    set
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

/// Every signal blocked on the calling thread until dropped, then the mask
/// it had: by raw system calls, so the program's sigprocmask shadow is
/// untouched. A signal sent meanwhile waits, and is delivered at the drop.
pub struct AllSignalsBlocked(libc::sigset_t);

impl AllSignalsBlocked {
    pub fn new() -> Self {
        // SAFETY: all-zero is a valid sigset; sigfillset and rt_sigprocmask
        // get valid pointers.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            let mut saved: libc::sigset_t = core::mem::zeroed();
            rt_sigprocmask(libc::SIG_SETMASK, &all, &mut saved);
            AllSignalsBlocked(saved)
        }
    }
}

impl Default for AllSignalsBlocked {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AllSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { rt_sigprocmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
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
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGPROF => "SIGPROF",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(set: &libc::sigset_t, sig: usize) -> bool {
        // SAFETY: sigset_t holds at least one u64 of signal bits.
        let w = unsafe { *(set as *const libc::sigset_t as *const u64) };
        w & (1 << (sig - 1)) != 0
    }

    #[test]
    fn a_handler_mask_blocks_cancellation_and_leaves_setxid() {
        let m = handler_mask();
        assert!(has(&m, SIGCANCEL), "SIGCANCEL must be blocked");
        assert!(
            !has(&m, SIGCANCEL + 1),
            "glibc's SIGSETXID must stay deliverable"
        );
        for sig in [
            libc::SIGPROF,
            libc::SIGTRAP,
            libc::SIGALRM,
            libc::SIGINT,
            34,
            64,
        ] {
            assert!(has(&m, sig as usize), "signal {sig} must be blocked");
        }
        // What the kernel sees: the mask of a thread that blocks it.
        // SAFETY: valid sets; the thread's mask is restored below.
        let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
        let mut now: libc::sigset_t = unsafe { core::mem::zeroed() };
        unsafe {
            rt_sigprocmask(libc::SIG_SETMASK, &m, &mut old);
            rt_sigprocmask(libc::SIG_SETMASK, &old, &mut now);
        }
        assert!(has(&now, SIGCANCEL));
    }
}
