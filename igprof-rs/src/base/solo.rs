//! Whether the process has exactly one thread that can touch profiler
//! state, and the shared updates that are cheaper when it has.
//!
//! A program that never creates a thread is profiled without any thread
//! of ours either (the watcher starts with the program's first thread, see
//! `process/watcher.rs`): glibc then stays in its single-threaded mode (its malloc
//! takes no arena locks), as unprofiled. While that holds, every update of
//! shared profiler state comes from that one thread, serialised by its
//! re-entrancy guard (a signal handler that interrupts profiler code
//! defers its events), so the live-block table needs no lock and the
//! counters shared between threads need no locked instruction: what costs
//! an exact memory profile most on real programs.
//!
//! The process leaves solo mode for good, before the second thread exists,
//! when the program creates a thread (`pthread_create`, and the `clone`
//! hook for threads made without it), when the watcher starts (`-D`,
//! `--dump-every`), or at start-up if a thread already exists (another
//! preloaded library made one: glibc's `__libc_single_threaded` says so).
//! The one thread's stores before creating the second are visible to it
//! (thread creation orders them), and every update after uses the atomic
//! form. A fork child, which has one thread, starts solo again.
//!
//! Not covered: threads made by the raw `clone`/`clone3` system calls
//! without libc (glibc does not support them calling malloc either), and a
//! program signal handler that creates a thread while it interrupts a
//! profiler hook (pthread_create is not async-signal-safe).
//!
//! Must never: switch back to solo in a process that may have a second
//! thread, or be left by a thread that is inside a solo update.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static SOLO: AtomicBool = AtomicBool::new(false);

/// Whether only one thread touches profiler state.
#[inline]
pub fn solo() -> bool {
    SOLO.load(Ordering::Relaxed)
}

/// Start-up and fork child: solo if the process has one thread and no
/// option needs a resident thread of ours.
pub fn begin(one_thread: bool) {
    SOLO.store(one_thread, Ordering::SeqCst);
}

/// The keeper, once every thread of the program is gone (process/keeper/):
/// it is the only thread left, and a lock a killed thread held is never
/// let go. The live-block table stops taking its locks (solo), and every
/// spin lock of the library is taken even when held.
pub fn program_gone() {
    SOLO.store(true, Ordering::SeqCst);
    crate::sys::locks_abandoned();
}

/// A second thread is about to exist: shared updates become atomic.
#[inline]
pub fn leave() {
    if SOLO.load(Ordering::Relaxed) {
        SOLO.store(false, Ordering::SeqCst);
    }
}

/// Whether glibc says the process has only ever had one thread: its
/// `__libc_single_threaded` (glibc 2.32+; without it, false). The
/// variable is found once, without a failed `dlsym` where no object
/// defines it (EL8's glibc 2.28: the error would be left pending for the
/// program's `dlerror()`).
pub fn libc_single_threaded() -> bool {
    /// The variable's address, if glibc has it.
    static AT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let at = *AT.get_or_init(|| trampoline::global_symbol(c"__libc_single_threaded"));
    // SAFETY: glibc's `char __libc_single_threaded`, read only.
    at.is_some_and(|p| unsafe { core::ptr::read_volatile(p as *const u8) } != 0)
}

/// `a += v`, returning the new value.
#[inline]
pub fn add(a: &AtomicU64, v: u64) -> u64 {
    add_in(solo(), a, v)
}

/// `a -= v`.
#[inline]
pub fn sub(a: &AtomicU64, v: u64) {
    sub_in(solo(), a, v)
}

/// `a = max(a, v)`; returns the previous value.
#[inline]
pub fn max(a: &AtomicU64, v: u64) -> u64 {
    max_in(solo(), a, v)
}

/// [`add`] with the caller's [`solo`] answer (`one`), read once for
/// several updates.
#[inline(always)]
pub fn add_in(one: bool, a: &AtomicU64, v: u64) -> u64 {
    if one {
        let n = a.load(Ordering::Relaxed).wrapping_add(v);
        a.store(n, Ordering::Relaxed);
        n
    } else {
        a.fetch_add(v, Ordering::AcqRel).wrapping_add(v)
    }
}

/// [`sub`] with the caller's [`solo`] answer (`one`), read once for
/// several updates.
#[inline(always)]
pub fn sub_in(one: bool, a: &AtomicU64, v: u64) {
    if one {
        a.store(a.load(Ordering::Relaxed).wrapping_sub(v), Ordering::Relaxed);
    } else {
        a.fetch_sub(v, Ordering::AcqRel);
    }
}

/// [`max`] with the caller's [`solo`] answer (`one`), read once for
/// several updates.
#[inline(always)]
pub fn max_in(one: bool, a: &AtomicU64, v: u64) -> u64 {
    let old = a.load(Ordering::Relaxed);
    if old >= v {
        return old;
    }
    if one {
        a.store(v, Ordering::Relaxed);
        old
    } else {
        a.fetch_max(v, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The process-wide flag is left alone: other tests use shared tables
    // from several threads at the same time.
    #[test]
    fn updates_are_the_same_solo_or_not() {
        for one in [true, false] {
            let a = AtomicU64::new(5);
            assert_eq!(add_in(one, &a, 7), 12);
            sub_in(one, &a, 2);
            assert_eq!(a.load(Ordering::Relaxed), 10);
            assert_eq!(max_in(one, &a, 3), 10);
            assert_eq!(a.load(Ordering::Relaxed), 10);
            assert_eq!(max_in(one, &a, 40), 10);
            assert_eq!(a.load(Ordering::Relaxed), 40);
        }
    }
}
