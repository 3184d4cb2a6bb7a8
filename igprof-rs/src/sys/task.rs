//! Who runs: thread and process ids (with the keeper standing for a dead
//! program), yielding the CPU, and how a waiter for one of the library's
//! spin locks backs off ([`back_off`], [`spin_lock`]).
//!
//! Must never: cache a thread id (threads come and go; fork copies memory),
//! or block in the kernel other than by yielding, by a bounded sleep, or
//! waiting for a child process of the profiler's own ([`reap_own_child`]).

/// Field `name` of this process's /proc/self/status ("CapEff",
/// "TracerPid"), trimmed; None where unreadable. Not in signal context.
pub fn own_status(name: &str) -> Option<String> {
    status_field(&std::fs::read_to_string("/proc/self/status").ok()?, name)
}

/// Field `name` of a /proc/PID/status text.
pub fn status_field(status: &str, name: &str) -> Option<String> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// The process tracing this one (a debugger, strace) and its name
/// (/proc/PID/comm, "" if unreadable), if one does.
pub fn tracer() -> Option<(i32, String)> {
    let pid = own_status("TracerPid")?
        .parse::<i32>()
        .ok()
        .filter(|&p| p > 0)?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Some((pid, comm.trim().to_string()))
}

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

/// Waits before attempt `round + 1` (from 0) at a spin lock held by
/// another thread: a pause while the holder probably runs (64 rounds),
/// the CPU yielded so that a holder that was preempted can finish (192
/// rounds), then 1 ms asleep in a futex wait per round, for a holder that
/// stays away: preempted for long, or stopped by a tracer. `igprof
/// --attach` stops every thread of the process to call into it, and tells
/// a call that waits for another thread (blocked in a futex) from one that
/// works: a waiter that spins or yields looked like one that works, and
/// the stopped holder was left stopped for a minute.
pub fn back_off(round: u32) {
    /// Never woken: only the timeout ends a wait on it.
    static ASLEEP: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
    if round < 64 {
        core::hint::spin_loop();
    } else if round < 256 {
        sched_yield();
    } else {
        super::futex_wait(&ASLEEP, 0, Some(1_000_000));
    }
}

/// Set once the calling process is the only one left to touch the
/// profiler's state and every other holder of a lock is dead: the keeper
/// after the program's end ([`locks_abandoned`]).
static ABANDONED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// From now on [`spin_lock`] takes a lock that is held: its holder was a
/// thread of the program, killed with it (SIGKILL in the middle of a
/// hook), which will never let it go. For the keeper only, once every
/// thread of the program is gone.
pub fn locks_abandoned() {
    ABANDONED.store(true, core::sync::atomic::Ordering::SeqCst);
}

/// Whether [`locks_abandoned`] was called: the program is gone, and so is
/// every thread that held a lock (the loader's too).
pub fn abandoned() -> bool {
    ABANDONED.load(core::sync::atomic::Ordering::Relaxed)
}

/// Takes a spin lock (`false` = free), waiting between attempts as
/// [`back_off`] says. For the profiler's short critical sections (a few
/// loads and stores). After [`locks_abandoned`], a held lock is taken
/// without waiting.
pub fn spin_lock(lock: &core::sync::atomic::AtomicBool) {
    use core::sync::atomic::Ordering;
    let mut round = 0u32;
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        if ABANDONED.load(Ordering::Relaxed) {
            lock.store(true, Ordering::Release);
            return;
        }
        back_off(round);
        round = round.saturating_add(1);
    }
}

/// Reaps `pid`, a process the profiler made with exit signal 0 (hence
/// `__WCLONE`; the keeper's intermediate, the hook planner), waiting for
/// it to end unless `nohang`. Returns whether it is gone: reaped here, or
/// not (or no longer) our child. Leaves errno as it was.
pub fn reap_own_child(pid: i32, nohang: bool) -> bool {
    let _e = super::ErrnoGuard::save();
    let flags = libc::__WCLONE | if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: wait4 with no status or rusage wanted.
        let r = unsafe {
            libc::syscall(
                libc::SYS_wait4,
                pid,
                core::ptr::null_mut::<libc::c_int>(),
                flags,
                core::ptr::null_mut::<libc::rusage>(),
            )
        };
        if r == pid as libc::c_long {
            return true;
        }
        if r == 0 {
            return false;
        }
        if super::errno() != libc::EINTR {
            return super::errno() == libc::ECHILD;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn status_fields_are_found_by_their_whole_name() {
        let status =
            "Name:\tx\nTracerPid:\t0\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(
            status_field(status, "CapEff").as_deref(),
            Some("000001ffffffffff")
        );
        assert_eq!(status_field(status, "TracerPid").as_deref(), Some("0"));
        assert_eq!(status_field(status, "Cap"), None);
        assert_eq!(status_field("Name: x\n", "CapEff"), None);
        // This test process's own: traced (by a debugger) or not.
        let pid: i32 = own_status("TracerPid").unwrap().parse().unwrap();
        assert_eq!(tracer().map(|t| t.0), (pid > 0).then_some(pid));
    }

    /// What `igprof --attach` reads to tell a call that waits for another
    /// thread from one that works: a waiter for a spin lock whose holder
    /// stays away is soon seen blocked in a futex wait.
    #[test]
    fn a_waiter_for_a_held_spin_lock_is_seen_in_a_futex_wait() {
        let lock = Arc::new(AtomicBool::new(true));
        let tid = Arc::new(core::sync::atomic::AtomicI32::new(0));
        let waiter = {
            let (lock, tid) = (lock.clone(), tid.clone());
            std::thread::spawn(move || {
                tid.store(gettid(), Ordering::Release);
                spin_lock(&lock);
                lock.store(false, Ordering::Release);
            })
        };
        while tid.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        // Past its spins and yields the waiter sleeps in futex waits of
        // 1 ms, so nearly every look finds it there.
        let seen = (0..2000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            in_call(tid.load(Ordering::Acquire), libc::SYS_futex)
        });
        lock.store(false, Ordering::Release);
        waiter.join().unwrap();
        if !seen && !calls_read_as_this_architectures() {
            // qemu-user: the file shows the emulator's own system calls.
            eprintln!("/proc/PID/task/TID/syscall is not this architecture's: not run");
            return;
        }
        assert!(seen, "the waiter was never seen in a futex wait");
    }

    /// Whether thread `tid` is blocked in system call `nr`.
    fn in_call(tid: i32, nr: libc::c_long) -> bool {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .is_ok_and(|s| s.split_whitespace().next() == Some(&nr.to_string()))
    }

    /// Whether a thread blocked in `read` is seen in it (not under an
    /// emulator, whose threads make its own system calls).
    fn calls_read_as_this_architectures() -> bool {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut b = [0u8; 1];
            // SAFETY: one byte into b, from the pipe's read end.
            unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        });
        let t = rx.recv().unwrap();
        let seen = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            in_call(t, libc::SYS_read)
        });
        // SAFETY: the pipe's write end, one byte; then both ends closed.
        unsafe {
            libc::write(fds[1], b"x".as_ptr().cast(), 1);
        }
        reader.join().unwrap();
        // SAFETY: descriptors of this test's pipe.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        seen
    }
}
