//! Clocks: monotonic and realtime time (through the vDSO where it is
//! signal-safe), thread CPU and user time, thread CPU clock ids, and sleep.
//!
//! Must never: take a lock or allocate (clocks are read in signal
//! handlers), or let a sleep end early on a signal.

use super::errno::{errno, ErrnoGuard};

fn timespec_ns(ts: &libc::timespec) -> u64 {
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds of `clock` through clock_gettime(2) as a system call.
fn syscall_clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clock, &mut ts) };
    timespec_ns(&ts)
}

/// Nanoseconds of `clock` through the vDSO (no system call for the
/// ordinary clocks; clock_gettime is async-signal-safe), or None when the
/// clock is invalid (such as the CPU clock of a thread that is gone).
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; a bad clock id is an error return.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| timespec_ns(&ts))
}

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    syscall_clock_ns(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds of CLOCK_MONOTONIC through the vDSO (no system call).
#[inline]
pub fn fast_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// CPU time of the calling thread in nanoseconds (clock_gettime of
/// CLOCK_THREAD_CPUTIME_ID: a system call, async-signal-safe).
#[link_section = "igprof_hot"]
pub fn thread_cpu_ns() -> u64 {
    syscall_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of thread `tid` of this process in nanoseconds (a system
/// call, async-signal-safe; 0 when the thread is gone).
pub fn thread_cpu_ns_of(tid: i32) -> u64 {
    syscall_clock_ns(thread_cpu_clock(tid))
}

/// User CPU time of the calling thread in nanoseconds (getrusage RUSAGE_THREAD).
pub fn thread_user_ns() -> u64 {
    // SAFETY: rusage is plain data; the kernel fills it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    unsafe { libc::syscall(libc::SYS_getrusage, libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_utime.tv_sec as u64 * 1_000_000_000 + ru.ru_utime.tv_usec as u64 * 1000
}

/// The clock id of thread `tid`'s CPU-time clock (the kernel's
/// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)); any thread of the process
/// may read it.
pub fn thread_cpu_clock(tid: i32) -> libc::clockid_t {
    ((!(tid as libc::clockid_t)) << 3) | 4 | 2
}

/// Sleeps `ns` nanoseconds (restarted after signals).
pub fn sleep_ns(ns: u64) {
    let _e = ErrnoGuard::save();
    let mut ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let p: *mut libc::timespec = &mut ts;
    // SAFETY: p is valid for reading the request and writing the remainder.
    while unsafe { libc::syscall(libc::SYS_nanosleep, p, p) } != 0 && errno() == libc::EINTR {}
}
