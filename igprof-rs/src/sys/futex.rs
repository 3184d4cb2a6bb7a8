//! futex wait and wake on a word of the library's own (private futexes).
//!
//! Must never: change errno for its caller, or be used on memory shared
//! with another process.

use super::errno::ErrnoGuard;

/// futex(FUTEX_WAIT_PRIVATE): sleeps while `*word == expected`, at most
/// `timeout_ns` (None: without limit). Returns on a wake, a signal, a
/// timeout or a changed word; the caller re-checks the word.
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let _e = ErrnoGuard::save();
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a valid, aligned u32 for the call; tsp null or valid.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        )
    };
}

/// futex(FUTEX_WAKE_PRIVATE): wakes every thread waiting on `word`.
pub fn futex_wake(word: &core::sync::atomic::AtomicU32) {
    let _e = ErrnoGuard::save();
    // SAFETY: word is a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}
