//! A thread's sampling POSIX timer: the fallback where perf events are
//! refused, and -pr without sigtrap events. One-shot on the thread CPU
//! clock (CLOCK_MONOTONIC for -pr), signalling only its thread
//! (SIGEV_THREAD_ID), re-armed by every expiry with a jittered interval.
//!
//! Must never: deliver its signal to another thread, or be made without
//! being marked ours (a late expiry must not reach the program).

use core::sync::atomic::Ordering;

use super::choice::signal;
use super::origin::{mark_timer_ours, timer_cookie};
use super::ticks::{next_interval, sampled_clock_ns};
use crate::base::options::{self, PerfClock};
use crate::base::thread::ThreadState;
use crate::sys::{self, Errno};

fn clock_for(tid: i32) -> libc::clockid_t {
    match options::get().perf {
        Some(PerfClock::Real) => libc::CLOCK_MONOTONIC,
        _ => sys::thread_cpu_clock(tid),
    }
}

/// Creates and arms the calling thread's sampling timer; the errno when it
/// cannot be created.
pub(super) fn start(t: &'static ThreadState) -> Result<(), Errno> {
    t.sampler.clock.clock_seen.set(sampled_clock_ns());
    t.sampler.clock.clock_credit.set(0);
    let id =
        sys::timer_create_for_thread(clock_for(t.tid()), signal(), t.tid(), timer_cookie(t.tid()))?;
    mark_timer_ours(id);
    t.sampler.timer.store(id, Ordering::SeqCst);
    sys::timer_arm_once(id, next_interval(t));
    Ok(())
}
