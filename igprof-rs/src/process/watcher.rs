//! The watcher thread, and dumps on request in a process that has none.
//!
//! Owns the one thread of ours in the program and the requests it serves:
//! a snapshot when the dump signal arrives (`--dump-signal`), when the `-D`
//! flag file appears, or every `--dump-every` interval; the final profile
//! when the process is about to die by a signal ([`dump_before_death`]);
//! and its own end when no thread of the program is left (the program's
//! main thread called `pthread_exit`: glibc ends the process only when its
//! last thread ends, and this one must not keep it alive).
//!
//! The thread exists only where it is needed: from start-up with `-D` or
//! `--dump-every` (they poll) or when the program already has threads,
//! else from the program's first thread creation. A process that never
//! makes a thread stays single-threaded, as unprofiled (see `solo.rs`);
//! there the dump signal and fatal signals are served on the program's
//! thread, in the signal handler when the thread is not inside profiler
//! code, else as soon as it leaves it ([`serve_pending`]). A dump made
//! there runs on the program's time; its samples are not charged.
//!
//! Requests reach the thread through one futex word, so nothing here holds
//! a descriptor the program could see, close or reuse.
//!
//! Must never: run the program's signal handlers (the thread runs with
//! every signal blocked), take part in sampling, or dump on the program's
//! thread while that thread is inside the profiler, the library allocator
//! or the dynamic loader.

use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::{base::options, base::thread, output, sys};

/// Request bits in [`REQ`].
const SNAPSHOT: u32 = 1;
const FINAL: u32 = 2;
const QUIT: u32 = 4;
static REQ: AtomicU32 = AtomicU32::new(0);
/// Final dumps completed for [`dump_before_death`] (a futex word).
static FINAL_WRITTEN: AtomicU32 = AtomicU32::new(0);
/// The signal whose default action ends the process (for the message).
static DEATH_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Whether the watcher thread is running (0/1, a futex word is not needed).
static RUNNING: AtomicU32 = AtomicU32::new(0);

/// How long a thread about to die by a signal waits for the profile.
const FINAL_WAIT_NS: u64 = 60_000_000_000;

fn post(bit: u32) {
    REQ.fetch_or(bit, Ordering::AcqRel);
    sys::futex_wake(&REQ);
}

/// The memory usage and limit behind a snapshot asked for from outside
/// (the keeper: the process nears its cgroup's limit); 0: none.
static NEAR_USAGE: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static NEAR_LIMIT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Asks for a snapshot because the process's memory (`usage` bytes) nears
/// its cgroup's `limit`: the watcher writes it, else the next thread that
/// leaves profiler code (a hook, a sample). Called by the keeper: touches
/// no TLS and calls nothing of libc; `wake` wakes a futex word.
pub fn snapshot_near_limit(usage: u64, limit: u64, wake: fn(&AtomicU32)) {
    NEAR_LIMIT.store(limit, Ordering::Relaxed);
    NEAR_USAGE.store(usage, Ordering::Release);
    if RUNNING.load(Ordering::Acquire) != 0 {
        REQ.fetch_or(SNAPSHOT, Ordering::AcqRel);
        wake(&REQ);
    } else {
        PENDING_HERE.fetch_or(SNAPSHOT, Ordering::AcqRel);
        thread::request_after_leave();
    }
}

/// What the usage of a near-limit snapshot's line left out.
fn cache_words() -> &'static str {
    if crate::process::keeper::cache_left_out() {
        " (page cache not counted)"
    } else {
        ""
    }
}

/// Writes a snapshot to the output file (the watcher, or a thread that
/// may dump where it is), with one line when it was asked for because the
/// process nears its memory limit; a `periodic` one (`--dump-every`) is
/// also kept under a name of its own (`output::keep_snapshot`).
fn write_snapshot(periodic: bool) {
    let path = crate::process::output_path();
    let near = NEAR_USAGE.swap(0, Ordering::AcqRel);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let limit = mib(NEAR_LIMIT.load(Ordering::Relaxed));
    // Asked once: the question takes the answer away.
    let pressure = near != 0 && crate::process::keeper::pressure_asked();
    let why = if near == 0 {
        if periodic {
            "periodic, --dump-every".to_string()
        } else {
            "asked for by signal or flag file".to_string()
        }
    } else if pressure {
        format!("on memory pressure at {:.1} MiB", mib(near))
    } else if crate::process::keeper::watching_rss() {
        format!(
            "RSS at {:.1} MiB, above --snapshot-above {limit:.1} MiB",
            mib(near)
        )
    } else {
        // A note cannot hold parentheses (the header's syntax): what the
        // usage left out comes last, after a comma.
        let left_out = if crate::process::keeper::cache_left_out() {
            ", page cache not counted"
        } else {
            ""
        };
        format!(
            "at {:.1} MiB of its cgroup's {limit:.1} MiB memory limit{left_out}",
            mib(near)
        )
    };
    if near != 0 && !pressure {
        // Near the limit: from this snapshot on, a journal keeps the memory
        // counts that an OOM kill would otherwise take with the process.
        output::journal::arm(NEAR_LIMIT.load(Ordering::Relaxed));
    }
    let r = output::dump_snapshot(&path, &why);
    if periodic && r.is_ok() {
        output::keep_snapshot(&path);
    }
    match r {
        Ok(_) if near != 0 => {
            let near = mib(near);
            if pressure {
                crate::igprof_log!(
                    "memory pressure ({}: {}) at {near:.1} MiB: wrote a snapshot to {path}",
                    crate::process::keeper::pressure_file(),
                    crate::process::keeper::PRESSURE_MEANS
                );
            } else if crate::process::keeper::watching_rss() {
                crate::igprof_log!(
                    "RSS at {near:.1} MiB, above --snapshot-above {limit:.1} MiB: wrote a snapshot to {path}"
                );
            } else {
                crate::igprof_log!(
                    "memory at {near:.1} MiB{} of its cgroup's {limit:.1} MiB limit: wrote a snapshot to {path} (kept if the OOM killer ends the process)",
                    cache_words()
                );
            }
        }
        Ok(_) => crate::igprof_debug!("dump written to {path}"),
        Err(e @ output::DumpError::Ending) => crate::igprof_debug!("no snapshot: {e}"),
        Err(e) => crate::igprof_log!("requested dump failed: {e}"),
    }
}

extern "C" fn dump_signal_handler(_sig: i32) {
    if RUNNING.load(Ordering::Acquire) != 0 {
        post(SNAPSHOT);
    } else {
        let _e = sys::ErrnoGuard::save();
        PENDING_HERE.fetch_or(SNAPSHOT, Ordering::AcqRel);
        serve_pending_here();
    }
}

/// Snapshots asked for while no watcher runs and not yet written.
static PENDING_HERE: AtomicU32 = AtomicU32::new(0);
/// Set in a fork child that must never start a watcher (qemu-user, see
/// process::after_fork_child).
static NEVER: AtomicU32 = AtomicU32::new(0);

/// Installs the dump signal's handler (start-up).
pub fn install_dump_signal() {
    let o = options::get();
    if o.dump_signal != 0 {
        // The handler only posts a request, or dumps when that is safe
        // (see the module docs).
        let handler = dump_signal_handler as *const () as usize;
        let _ = crate::hook::take_signal(o.dump_signal, handler, libc::SA_RESTART);
    }
}

/// Whether `-D`, `--dump-every`, `--mark-every` or `--snapshot-above`
/// need a thread from start-up. (`--snapshot-above`: the keeper's request
/// must be served even when the program makes no call the profiler sees
/// after its memory grew, such as a service that sleeps.)
pub fn needed_from_start(o: &options::Options) -> bool {
    poll_interval(o).is_some() || o.snapshot_above != 0
}

/// Starts the watcher unless it runs (or may not run in this process).
/// Called at start-up and in a fork child when the process is not solo,
/// and before the program creates a thread.
pub fn start() {
    if RUNNING.load(Ordering::Acquire) != 0 || NEVER.load(Ordering::Acquire) != 0 {
        return;
    }
    REQ.store(PENDING_HERE.swap(0, Ordering::AcqRel), Ordering::Release);
    FINAL_WRITTEN.store(0, Ordering::Release);
    let real = crate::hook::orig::pthread_create();
    let mut th: libc::pthread_t = 0;
    // The watcher must start with every signal blocked: a process-directed
    // signal arriving between its creation and its first instruction would
    // otherwise run the program's handler on it. A new thread inherits the
    // creator's mask, so block all here and restore after.
    let blocked = sys::AllSignalsBlocked::new();
    // SAFETY: watcher matches the start-routine ABI; no attributes.
    let r = unsafe {
        match real {
            Some(f) => f(&mut th, core::ptr::null(), watcher, core::ptr::null_mut()),
            None => {
                libc::pthread_create(&mut th, core::ptr::null(), watcher_c, core::ptr::null_mut())
            }
        }
    };
    drop(blocked);
    if r == 0 {
        RUNNING.store(1, Ordering::Release);
        // SAFETY: th is a valid thread we never join.
        unsafe { libc::pthread_detach(th) };
    }
}

/// In a fork child: the parent's watcher is not in this process, so
/// nothing may wait for it. `never`: the child may not start one (under
/// qemu-user, see process::after_fork_child).
pub fn none_in_child(never: bool) {
    RUNNING.store(0, Ordering::Release);
    PENDING_HERE.store(0, Ordering::Release);
    NEVER.store(never as u32, Ordering::Release);
}

/// Called as the calling thread leaves profiler code: a snapshot asked for
/// while it was inside is written now (or handed to the watcher if one
/// started meanwhile).
#[inline]
pub fn serve_pending() {
    if PENDING_HERE.load(Ordering::Relaxed) != 0 {
        serve_pending_here();
    }
}

#[cold]
#[inline(never)]
fn serve_pending_here() {
    if RUNNING.load(Ordering::Acquire) != 0 {
        let req = PENDING_HERE.swap(0, Ordering::AcqRel);
        if req != 0 {
            post(req);
        }
        return;
    }
    if !can_dump_here() {
        // Served when a thread leaves what it is inside.
        thread::request_after_leave();
        return;
    }
    if PENDING_HERE.swap(0, Ordering::AcqRel) == 0 {
        return;
    }
    let _e = sys::ErrnoGuard::save();
    let Some(t) = thread::current() else { return };
    let Some(g) = t.enter() else { return };
    // Samples taken while the dump runs are the profiler's time.
    let ticks = t.sampler.clock.pending_ticks.get();
    write_snapshot(false);
    t.sampler.clock.pending_ticks.set(ticks);
    drop(g);
}

/// Whether a dump may run here and now on the calling thread: the process
/// has no other thread, and this one is not inside the profiler, its
/// allocator or the dynamic loader (each may hold what a dump needs).
fn can_dump_here() -> bool {
    crate::base::solo::solo()
        && !thread::is_busy()
        && crate::base::alloc::all_unlocked()
        && !crate::hook::in_loader()
        && crate::process::is_own_process()
}

/// The process dies by `sig` and has no watcher: writes the final profile
/// on the calling thread (signal context) if that is safe. Returns whether
/// it was written.
pub fn final_dump_here(sig: i32) -> bool {
    if RUNNING.load(Ordering::Acquire) != 0 || !can_dump_here() {
        return false;
    }
    crate::process::ending::final_dump(crate::sys::signal_name(sig))
}

/// No thread of the program is left: the watcher ends too, so that glibc
/// ends the process as it would unprofiled.
pub fn quit() {
    post(QUIT);
}

/// Called in signal context when the process is about to die by `sig`
/// (its default action): asks the watcher for the final profile and waits
/// for it (at most a minute). Returns whether a profile was written.
pub fn dump_before_death(sig: i32) -> bool {
    if RUNNING.load(Ordering::Acquire) == 0 || !crate::process::is_own_process() {
        return false;
    }
    let _ = DEATH_SIGNAL.compare_exchange(0, sig, Ordering::AcqRel, Ordering::Relaxed);
    post(FINAL);
    let deadline = sys::monotonic_ns() + FINAL_WAIT_NS;
    loop {
        if FINAL_WRITTEN.load(Ordering::Acquire) != 0 {
            return true;
        }
        let now = sys::monotonic_ns();
        if now >= deadline || RUNNING.load(Ordering::Acquire) == 0 {
            return false;
        }
        sys::futex_wait(&FINAL_WRITTEN, 0, Some((deadline - now).min(100_000_000)));
    }
}

extern "C" fn watcher_c(p: *mut libc::c_void) -> *mut libc::c_void {
    watcher(p)
}

/// How long the watcher sleeps before it looks again without a request:
/// the flag file is polled, periodic dumps are due.
fn poll_interval(o: &options::Options) -> Option<u64> {
    let mut t: Option<u64> = None;
    if !o.flag_file.is_empty() {
        t = Some(200_000_000);
    }
    for every in [o.dump_every_ns, o.mark_every_ns] {
        if every != 0 {
            t = Some(t.map_or(every, |x| x.min(every)));
        }
    }
    t
}

extern "C" fn watcher(_: *mut libc::c_void) -> *mut libc::c_void {
    // Every signal is already blocked here (start creates this thread with
    // a full mask): process-directed signals go to the program.
    // A state so hooks triggered by dumping pass through; never sampled.
    let Some(me) = thread::register_unsampled(16) else {
        RUNNING.store(0, Ordering::Release);
        return core::ptr::null_mut();
    };
    let o = options::get();
    // Where no keeper runs, the timeline's points are this thread's.
    let timeline = o.timeline_ns() != 0;
    let wait = match (poll_interval(o), timeline) {
        (w, false) => w,
        (None, true) => Some(o.timeline_ns()),
        (Some(w), true) => Some(w.min(o.timeline_ns())),
    };
    let mut next_periodic = sys::monotonic_ns() + o.dump_every_ns;
    let mut next_mark = sys::monotonic_ns() + o.mark_every_ns;
    let mut next_point = sys::monotonic_ns();
    loop {
        let mut req = REQ.swap(0, Ordering::AcqRel);
        if req == 0 {
            sys::futex_wait(&REQ, 0, wait);
            req = REQ.swap(0, Ordering::AcqRel);
        }
        if req & FINAL != 0 {
            let sig = DEATH_SIGNAL.load(Ordering::Acquire);
            let g = me.enter();
            crate::process::ending::final_dump(crate::sys::signal_name(sig));
            drop(g);
            FINAL_WRITTEN.store(1, Ordering::Release);
            sys::futex_wake(&FINAL_WRITTEN);
            continue;
        }
        if req & QUIT != 0 {
            RUNNING.store(0, Ordering::Release);
            return core::ptr::null_mut();
        }
        let mut want = req & SNAPSHOT != 0;
        if !o.flag_file.is_empty() && sys::exists(o.flag_file.as_bytes_nul()) {
            // SAFETY: NUL-terminated path.
            unsafe { libc::unlink(o.flag_file.as_bytes_nul().as_ptr() as *const libc::c_char) };
            want = true;
        }
        if o.mark_every_ns != 0 && sys::monotonic_ns() >= next_mark {
            next_mark = sys::monotonic_ns() + o.mark_every_ns;
            crate::base::run::mark();
        }
        if timeline && sys::monotonic_ns() >= next_point && !crate::process::keeper::watching() {
            next_point = sys::monotonic_ns() + crate::process::timeline_point_here();
        }
        let mut periodic = false;
        if o.dump_every_ns != 0 && sys::monotonic_ns() >= next_periodic {
            next_periodic = sys::monotonic_ns() + o.dump_every_ns;
            periodic = true;
        }
        if (want || periodic) && crate::process::is_own_process() {
            let g = me.enter();
            write_snapshot(periodic);
            drop(g);
        }
    }
}
