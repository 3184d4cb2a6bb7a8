//! Who runs: thread and process ids (with the keeper standing for a dead
//! program), yielding the CPU, and the spin lock built on it.
//!
//! Must never: cache a thread id (threads come and go; fork copies memory),
//! or block in the kernel other than by yielding.

pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// The pid of the process whose profile this one writes: its own, except
/// in the keeper (process/keeper/), which writes a dead program's.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    let own = unsafe { libc::syscall(libc::SYS_getpid) as i32 };
    let [keeper, program] = &STANDS_FOR;
    if own == keeper.load(core::sync::atomic::Ordering::Relaxed) {
        program.load(core::sync::atomic::Ordering::Relaxed)
    } else {
        own
    }
}

/// The keeper's pid and the program's whose profile it writes (0: none).
static STANDS_FOR: [core::sync::atomic::AtomicI32; 2] = [
    core::sync::atomic::AtomicI32::new(0),
    core::sync::atomic::AtomicI32::new(0),
];

/// In the keeper, once the program is gone: [`getpid`] answers `program`.
pub fn stand_for(program: i32) {
    // SAFETY: getpid has no arguments and cannot fail.
    let own = unsafe { libc::syscall(libc::SYS_getpid) as i32 };
    STANDS_FOR[1].store(program, core::sync::atomic::Ordering::Relaxed);
    STANDS_FOR[0].store(own, core::sync::atomic::Ordering::Relaxed);
}

pub fn sched_yield() {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_sched_yield) };
}

/// Takes a spin lock (`false` = free): spins briefly, then yields the CPU
/// between attempts, so a holder that was preempted can finish. For the
/// profiler's short critical sections (a few loads and stores).
pub fn spin_lock(lock: &core::sync::atomic::AtomicBool) {
    use core::sync::atomic::Ordering;
    let mut spins = 0u32;
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins > 64 {
            sched_yield();
        } else {
            core::hint::spin_loop();
        }
    }
}
