//! futex wait and wake on a word of the library's own: private futexes,
//! and shared ones for a word in memory shared with another process
//! ([`futex_wait_shared`], [`futex_wake_shared`]).
//!
//! Must never: change errno for its caller, or use a private futex on
//! memory shared with another process.

use super::errno::ErrnoGuard;

/// futex(FUTEX_WAIT_PRIVATE): sleeps while `*word == expected`, at most
/// `timeout_ns` (None: without limit). Returns on a wake, a signal, a
/// timeout or a changed word; the caller re-checks the word.
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    wait(word, expected, timeout_ns, libc::FUTEX_PRIVATE_FLAG)
}

/// [`futex_wait`] on a word in memory shared with another process.
pub fn futex_wait_shared(
    word: &core::sync::atomic::AtomicU32,
    expected: u32,
    timeout_ns: Option<u64>,
) {
    wait(word, expected, timeout_ns, 0)
}

/// futex(FUTEX_WAKE_PRIVATE): wakes every thread waiting on `word`.
pub fn futex_wake(word: &core::sync::atomic::AtomicU32) {
    wake(word, libc::FUTEX_PRIVATE_FLAG)
}

/// [`futex_wake`] on a word in memory shared with another process.
pub fn futex_wake_shared(word: &core::sync::atomic::AtomicU32) {
    wake(word, 0)
}

fn wait(word: &core::sync::atomic::AtomicU32, expected: u32, timeout_ns: Option<u64>, flag: i32) {
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
            libc::FUTEX_WAIT | flag,
            expected,
            tsp,
        )
    };
}

fn wake(word: &core::sync::atomic::AtomicU32, flag: i32) {
    let _e = ErrnoGuard::save();
    // SAFETY: word is a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | flag,
            i32::MAX,
        )
    };
}
