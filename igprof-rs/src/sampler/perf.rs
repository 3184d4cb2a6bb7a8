//! A thread's sampling perf events: the task-clock event (sigtrap or
//! sigprof) and the -pr context-switch event, how each is held (a one-page
//! mapping with its descriptor closed, else the descriptor moved up out of
//! the program's way), the renewal of a held event with a new period, and
//! their release.
//!
//! Must never: leave the program a descriptor of ours in its low numbers,
//! or leave a thread unsampled while renewing its event (the new one is
//! held before the old one ends).

use core::sync::atomic::{AtomicBool, Ordering};

use super::origin::mark_fd_ours;
use super::ticks::{next_interval, set_event_period};
use super::{COOKIE, SWITCH_COOKIE};
use crate::base::options::{self, PerfClock};
use crate::base::thread::ThreadState;
use crate::sys::{self, Errno, PerfDelivery};

/// Opens and enables the calling thread's sampling perf event.
///
/// A sigtrap event is held by a one-page mapping and its descriptor closed
/// at once, so the program never sees a descriptor of ours (it could close
/// it, reuse its number, or run out of descriptors one early). When the
/// mapping is refused (the locked-memory limit for perf mappings), and for
/// the sigprof sampler (whose signal names the descriptor), the descriptor
/// is kept, moved up out of the program's way.
pub(super) fn open_event(
    t: &'static ThreadState,
    user_only: bool,
    how: PerfDelivery,
) -> Result<(), Errno> {
    if let PerfDelivery::Sigtrap { .. } = how {
        if !HOLD_REFUSED.load(Ordering::Relaxed) {
            let period = next_interval(t);
            let (fd, _) = sys::perf_task_clock_open(t.tid(), period, user_only, how, 0)?;
            match sys::perf_hold(fd) {
                Ok(hold) => {
                    let enabled = sys::perf_enable(fd);
                    sys::close(fd);
                    if !enabled {
                        sys::perf_release(hold);
                        return Err(Errno::last());
                    }
                    t.sampler.perf_ring.store(hold, Ordering::SeqCst);
                    set_event_period(t, period);
                    return Ok(());
                }
                Err(_) => {
                    HOLD_REFUSED.store(true, Ordering::Relaxed);
                    sys::close(fd);
                }
            }
        }
    }
    let period = next_interval(t);
    let (fd, ring) = sys::perf_task_clock_open(t.tid(), period, user_only, how, high_fd_base())?;
    set_event_period(t, period);
    mark_fd_ours(fd);
    t.sampler.perf_ring.store(ring, Ordering::SeqCst);
    t.sampler.perf_fd.store(fd, Ordering::SeqCst);
    if sys::perf_enable(fd) {
        return Ok(());
    }
    let e = Errno::last();
    // The thread has no timer yet (its sampler is being started).
    release_event(t);
    Err(e)
}

/// -pr with sigtrap events: a second event on the thread signals it after
/// every context switch, once it runs again in user space, so that the
/// time it spent off the CPU is charged where it waited ([`off_cpu_ticks`](super::ticks::off_cpu_ticks)).
/// Nothing to do for the other clocks. On failure the task-clock event is
/// closed too (the caller falls back to wall-clock timers).
pub(super) fn open_switch_event(t: &'static ThreadState) -> Result<(), Errno> {
    if options::get().perf != Some(PerfClock::Real) {
        return Ok(());
    }
    let held = sys::perf_switch_open(t.tid(), SWITCH_COOKIE).and_then(|fd| {
        let h = sys::perf_hold(fd);
        sys::close(fd);
        h
    });
    match held {
        Ok(hold) => {
            t.sampler.clock.wall_mark.set(sys::monotonic_ns());
            t.sampler.clock.cpu_mark.set(sys::thread_cpu_ns());
            t.sampler.switch_hold.store(hold, Ordering::SeqCst);
            Ok(())
        }
        Err(e) => {
            release_event(t);
            Err(e)
        }
    }
}

/// Set once a perf mapping was refused: events keep their descriptor.
static HOLD_REFUSED: AtomicBool = AtomicBool::new(false);

/// Where the profiler's own descriptors go: high enough to stay out of the
/// way of programs that expect the lowest free numbers.
pub fn high_fd_base() -> i32 {
    (sys::nofile_limit().min(1 << 20) as i32 - 128).max(3)
}

/// Ends the thread's perf event, whichever way it is held.
pub(super) fn release_event(t: &ThreadState) {
    let fd = t.sampler.perf_fd.swap(-1, Ordering::SeqCst);
    let ring = t.sampler.perf_ring.swap(0, Ordering::SeqCst);
    if fd >= 0 {
        sys::perf_close(fd, ring);
    } else if ring != 0 {
        sys::perf_release(ring);
    }
    let switch = t.sampler.switch_hold.swap(0, Ordering::SeqCst);
    if switch != 0 {
        sys::perf_release(switch);
    }
}

/// Replaces a held sigtrap event by one with a new random period (signal
/// context: system calls only). The new event is held before the old one
/// ends, so the thread is never left unsampled; if it cannot be made, the
/// old one stays.
pub(super) fn renew_held_event(t: &'static ThreadState) {
    let user_only = options::get().perf == Some(PerfClock::User);
    let how = PerfDelivery::Sigtrap { cookie: COOKIE };
    let period = next_interval(t);
    let Ok((fd, _)) = sys::perf_task_clock_open(t.tid(), period, user_only, how, 0) else {
        return;
    };
    let held = sys::perf_hold(fd);
    let enabled = held.is_ok() && sys::perf_enable(fd);
    sys::close(fd);
    match held {
        Ok(new) if enabled => {
            let old = t.sampler.perf_ring.swap(new, Ordering::SeqCst);
            t.sampler.clock.clock_seen.set(period);
            if old != 0 {
                sys::perf_release(old);
            }
            // Sampling ended meanwhile (see super::end_all): this one
            // must not outlive it.
            if super::ended() {
                release_event(t);
            }
        }
        Ok(new) => sys::perf_release(new),
        Err(_) => {}
    }
}
