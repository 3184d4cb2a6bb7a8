//! A thread's sampler over its life: started with the thread (a perf
//! event where the process samples with them and the kernel allows it,
//! else a POSIX timer), re-armed by each of its samples (a perf event's
//! period re-randomised every so often, a timer armed again), stopped at
//! thread exit and exec, and forgotten in a forked child.
//!
//! Must never: start a second sampler on a thread that has one, or leave
//! a thread's sampler running after [`stop_thread`].

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::choice::{mode, signal};
use super::perf::{open_event, open_switch_event, release_event, renew_held_event};
use super::ticks::{
    charge, event_tail, late_off_cpu_ticks, next_interval, spill, tick_slot, ticks_for,
};
use super::{has_event, timer, COOKIE};
use crate::base::options::{self, PerfClock, Sampler};
use crate::base::thread::ThreadState;
use crate::sys::{self, Errno, PerfDelivery};

/// Starts sampling the calling thread (its state must be registered).
///
/// -pp / -pu use a task-clock perf event on the thread (sigtrap or sigprof,
/// see the layer's doc). When perf events are not allowed
/// (perf_event_paranoid, seccomp) they fall back to a POSIX timer on the
/// thread CPU clock, which the kernel only checks at the scheduler tick
/// (HZ): intervals below the tick are then coarser. -pr uses a POSIX
/// CLOCK_MONOTONIC timer.
pub fn start_thread(t: &'static ThreadState) {
    let o = options::get();
    if !o.needs_timers()
        || super::ended()
        || t.sampler.timer.load(Ordering::Relaxed) >= 0
        || has_event(t)
    {
        return;
    }
    start_sampler(t, o);
    end_if_ended(t);
}

fn start_sampler(t: &'static ThreadState, o: &options::Options) {
    let user_only = o.perf == Some(PerfClock::User);
    let how = match mode() {
        Sampler::Sigtrap => Some(PerfDelivery::Sigtrap { cookie: COOKIE }),
        Sampler::Sigprof => Some(PerfDelivery::Fasync { signo: signal() }),
        _ => None,
    };
    if let Some(how) = how {
        if !PERF_UNAVAILABLE.load(Ordering::Relaxed) {
            match open_event(t, user_only, how).and_then(|()| open_switch_event(t)) {
                Ok(()) => return,
                Err(e) => {
                    // Said once per process, whatever -d says: the
                    // samples are coarser from here on. Start-up's lines
                    // are the run's, said by the process the user started.
                    if !PERF_UNAVAILABLE.swap(true, Ordering::Relaxed) {
                        no_perf_events(e, o.perf == Some(PerfClock::Real));
                    }
                }
            }
        }
    }
    if let Err(e) = timer::start(t) {
        no_timer(t.tid(), e);
    }
}

/// Says why a thread is not sampled: out of line, so that the line buffer
/// is not in [`start_thread`]'s frame on every thread's (maybe small) stack.
#[cold]
#[inline(never)]
fn no_timer(tid: i32, e: Errno) {
    crate::igprof_log!(
        "cannot create the sampling timer of thread {tid} (errno {e}); it is not sampled"
    );
}

/// Says once per process that samples come from POSIX timers (`wall`:
/// `-pr`'s monotonic ones) because perf events were refused.
#[cold]
#[inline(never)]
fn no_perf_events(e: Errno, wall: bool) {
    let timers = if wall {
        "wall-clock POSIX timers"
    } else {
        "CPU-clock POSIX timers, at most one sample per scheduler tick"
    };
    crate::igprof_log!(
        "perf_event_open(task-clock): {}; sampling with {timers}",
        super::choice::task_clock_refusal(e)
    );
}

/// Set once a thread's perf event could not be opened: later threads
/// sample with timers without trying again.
static PERF_UNAVAILABLE: AtomicBool = AtomicBool::new(false);

/// Charges the calling thread's time since its last POSIX-timer sample to
/// the stack of that sample, as the thread ends or the process writes its
/// final profile. Timer samples are weighted by the clock time since the
/// previous one, so the time between samples is counted; without this the
/// time after the last one was not. CPU-clock timers may fire only a few
/// times a second on a loaded machine, which made a thread's total short by
/// most of its CPU time. A perf event's samples each stand for one period:
/// what is owed there is the thread's CPU time after its last sample
/// ([`event_tail`]), and under -pr the off-CPU time of a context
/// switch whose signal never came ([`late_off_cpu_ticks`]), charged the
/// same way. A thread never sampled has no stack to charge: its time is
/// counted in [`unsampled`].
/// Call before [`stop_thread`], on the thread `t` belongs to.
pub fn charge_tail(t: &'static ThreadState) {
    if !crate::base::run::recording() {
        return;
    }
    let evented = has_event(t);
    if !evented && t.sampler.timer.load(Ordering::Relaxed) < 0 {
        return;
    }
    // Inside the profiler either way: under this guard, or under the one
    // an outer frame of this thread holds (the exit hooks dump paused). A
    // sample landing meanwhile is held as pending and charged when the
    // guard drops; whichever comes first takes the clock time it saw.
    let g = t.enter();
    let node = t.sampler.last_sample.load(Ordering::Acquire);
    if tick_slot() == usize::MAX {
        return;
    }
    // Whole intervals owed, and the nanoseconds short of one more.
    let (k, rest) = if evented {
        let (whole, rest) = event_tail(t);
        (whole + late_off_cpu_ticks(t), rest)
    } else {
        (ticks_for(t), t.sampler.clock.clock_credit.replace(0))
    };
    if node.is_null() {
        // No sample reached the thread: its time is not in the profile,
        // and the final dump says how much.
        let ns = k * options::get().interval_ns + rest;
        if ns > 0 {
            UNSAMPLED_THREADS.fetch_add(1, Ordering::Relaxed);
            UNSAMPLED_NS.fetch_add(ns, Ordering::Relaxed);
        }
    } else {
        // SAFETY: last_sample is a node of this thread's own tree (nodes
        // are never freed), and this thread, inside the profiler, is its
        // only writer now.
        charge(unsafe { &*node }, k + spill(rest));
    }
    drop(g);
}

/// Threads that ended (or were ending the process) with sampled-clock time
/// but no sample, and that time.
static UNSAMPLED_THREADS: AtomicU64 = AtomicU64::new(0);
static UNSAMPLED_NS: AtomicU64 = AtomicU64::new(0);

/// In a fork child whose profile starts empty (no `-pk`): the parent's
/// unsampled threads, tail remainders and late off-CPU ticks are the
/// parent's.
pub fn forget_parent_counts() {
    UNSAMPLED_THREADS.store(0, Ordering::Relaxed);
    UNSAMPLED_NS.store(0, Ordering::Relaxed);
    super::ticks::forget_carries();
}

/// How many threads no sample ever reached although they ran, and their
/// time in nanoseconds (not in the profile; see [`charge_tail`]).
pub fn unsampled() -> (u64, u64) {
    (
        UNSAMPLED_THREADS.load(Ordering::Relaxed),
        UNSAMPLED_NS.load(Ordering::Relaxed),
    )
}

/// After a sampler of `t` was stored: if sampling ended meanwhile, it is
/// stopped here. Either this or the stop of every thread's sampler sees
/// it (both swap it out), so it is stopped exactly once.
pub(super) fn end_if_ended(t: &ThreadState) {
    if super::ended() {
        stop_thread(t);
    }
}

/// Stops sampling the calling thread (thread exit, exec).
pub fn stop_thread(t: &ThreadState) {
    let id = t.sampler.timer.swap(-1, Ordering::SeqCst);
    if id >= 0 {
        sys::timer_delete(id);
    }
    release_event(t);
}

/// In a forked child: the parent's samplers are not ours (perf descriptors
/// are inherited and would keep signalling the parent's threads' owner).
pub fn forget_inherited(t: &ThreadState) {
    t.sampler.timer.store(-1, Ordering::Release);
    release_event(t);
}

/// Samples between period changes (see the layer's doc).
const JITTER_EVERY: u32 = 64;
/// Samples between renewals of a held event (a new event with a new
/// period): opening, mapping and ending an event costs about 60 us here,
/// so it is done less often than an ioctl.
const RENEW_EVERY: u32 = 512;
/// Re-arms the thread's sampler after one of its samples (signal context).
#[link_section = "igprof_hot"]
pub(super) fn rearm(t: &'static ThreadState) {
    if has_event(t) {
        // The perf event keeps sampling by itself; re-randomise its period
        // every JITTER_EVERY samples (an ioctl costs more than the rest of
        // the sample). A held event has no descriptor to change: a new one
        // with the new period replaces it.
        let fd = t.sampler.perf_fd.load(Ordering::Relaxed);
        let every = if fd >= 0 { JITTER_EVERY } else { RENEW_EVERY };
        let n = t.sampler.clock.since_jitter.get() + 1;
        if n < every {
            t.sampler.clock.since_jitter.set(n);
            return;
        }
        t.sampler.clock.since_jitter.set(0);
        if fd >= 0 {
            let period = next_interval(t);
            sys::perf_set_period(fd, period);
            t.sampler.clock.clock_seen.set(period);
        } else {
            renew_held_event(t);
        }
    } else {
        let id = t.sampler.timer.load(Ordering::Relaxed);
        if id >= 0 {
            sys::timer_arm_once(id, next_interval(t));
        }
    }
}
