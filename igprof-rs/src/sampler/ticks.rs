//! What a sample is worth: the sampling interval with its random part,
//! the PERF ticks a sample stands for (one event period, or the sampled
//! clock's time since the previous sample in whole intervals with the
//! remainder carried), the off-CPU time of -pr, and the counter slot the
//! ticks are charged to.
//!
//! Must never: allocate, lock or make a system call other than reading a
//! clock (these run in the sampling handler).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::has_event;
use crate::base::options::{self, PerfClock};
use crate::base::thread::ThreadState;
use crate::sys;

/// The counter slot PERF ticks go to (`usize::MAX`: none; see [`set_tick_slot`]).
static TICK_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Charges the sampler's ticks to counter `slot` (the CPU module's
/// PERF_TICKS, once the counters froze).
pub fn set_tick_slot(slot: usize) {
    TICK_SLOT.store(slot, Ordering::Relaxed);
}

/// The counter slot ticks are charged to, `usize::MAX` for none.
pub(super) fn tick_slot() -> usize {
    TICK_SLOT.load(Ordering::Relaxed)
}

/// Charges `k` PERF ticks to `node`, a node of the calling thread's own
/// tree (nothing without a tick counter or without ticks).
#[link_section = "igprof_hot"]
pub(super) fn charge(node: &crate::base::tree::Node, k: u64) {
    let slot = tick_slot();
    if slot != usize::MAX && k > 0 {
        node.counter(slot).add(k, k);
        if crate::modules::mem::journal::on() {
            crate::modules::mem::journal::ticks(node, k, k);
        }
    }
}

/// The jittered interval of the next sample: the interval +-10%.
#[link_section = "igprof_hot"]
pub(super) fn next_interval(t: &ThreadState) -> u64 {
    let base = options::get().interval_ns;
    let spread = base / 5;
    base - base / 10
        + if spread > 0 {
            t.sampler.clock.next_random() % spread
        } else {
            0
        }
}

/// -pr: ticks for the time the thread spent off the CPU (blocked, or
/// runnable and waiting) since the last charge: wall time minus the
/// thread's CPU time (which its task-clock samples count), in whole
/// intervals with the remainder carried.
#[link_section = "igprof_hot"]
pub(super) fn off_cpu_ticks(t: &ThreadState) -> u64 {
    let (wall, cpu) = (sys::monotonic_ns(), sys::thread_cpu_ns());
    let off = wall
        .saturating_sub(t.sampler.clock.wall_mark.get())
        .saturating_sub(cpu.saturating_sub(t.sampler.clock.cpu_mark.get()));
    t.sampler.clock.wall_mark.set(wall);
    t.sampler.clock.cpu_mark.set(cpu);
    t.sampler.clock.sample_wall.set(wall);
    let iv = options::get().interval_ns;
    let credit = t.sampler.clock.clock_credit.get() + off;
    t.sampler.clock.clock_credit.set(credit % iv);
    credit / iv
}

/// -pr with a context-switch event: the off-CPU ticks still owed at a CPU
/// sample, at a signal of the program's own, or at the thread's end.
/// Every switch is charged when the thread runs again (its SIGTRAP,
/// [`off_cpu_ticks`]), so time still owed here is a switch whose signal
/// never came: the kernel drops a SIGTRAP raised while another is pending
/// (the program's, or a CPU sample's, due at the same return to user
/// space: then the thread is where it waited). Charged here, the wait is
/// counted; 0 for every other sampler, whose ticks already count the time
/// they stand for.
#[link_section = "igprof_hot"]
pub(super) fn late_off_cpu_ticks(t: &ThreadState) -> u64 {
    if t.sampler.switch_hold.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let k = off_cpu_ticks(t);
    LATE_OFF_CPU_TICKS.fetch_add(k, Ordering::Relaxed);
    k
}

/// [`late_off_cpu_ticks`] at a CPU sample, when the thread may have been
/// off the CPU since its previous CPU sample or off-CPU charge: more than
/// two intervals of wall time for the one period of CPU time (at most 1.1
/// intervals) a sample stands for. Otherwise what it may owe is under an
/// interval, left to the next charge: reading the thread's CPU clock (a
/// system call) at every sample cost half as much again as the rest of
/// the handler.
#[link_section = "igprof_hot"]
pub(super) fn late_off_cpu_ticks_at_sample(t: &ThreadState) -> u64 {
    if t.sampler.switch_hold.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let wall = sys::fast_monotonic_ns();
    let gap = wall.saturating_sub(t.sampler.clock.sample_wall.replace(wall));
    if gap <= 2 * options::get().interval_ns {
        return 0;
    }
    late_off_cpu_ticks(t)
}

/// Off-CPU ticks charged late ([`late_off_cpu_ticks`]), all threads.
static LATE_OFF_CPU_TICKS: AtomicU64 = AtomicU64::new(0);

/// -pr: off-CPU ticks charged late because their context switch's signal
/// never came ([`late_off_cpu_ticks`]; `-d` reports them).
pub fn late_off_cpu() -> u64 {
    LATE_OFF_CPU_TICKS.load(Ordering::Relaxed)
}

/// A perf event samples every `period` ns of thread time (the interval
/// with its random part): remembered so that each sample counts for what it
/// stands for ([`ticks_for`]).
pub(super) fn set_event_period(t: &ThreadState, period: u64) {
    t.sampler.clock.clock_seen.set(period);
    t.sampler.clock.clock_credit.set(0);
    t.sampler.clock.event_cpu_start.set(sys::thread_cpu_ns());
    t.sampler.clock.event_ticks.set(0);
}

/// A perf event's tail, at the thread's end: the thread's CPU time since
/// its event started that its samples' ticks do not hold yet (the time
/// after its last sample, and what the whole intervals left over), as
/// (whole intervals, nanoseconds short of one more). Each sample stands
/// for one period, so without this every thread lost its last part of an
/// interval: 300 threads of 7 ms each, one sample apiece at 5 ms, had
/// 0.76 s of their 2.1 s. Nothing for `-pu`, whose event counts user time
/// only, which the thread's clocks cannot give finely.
pub(super) fn event_tail(t: &ThreadState) -> (u64, u64) {
    if options::get().perf == Some(PerfClock::User) {
        return (0, 0);
    }
    let c = &t.sampler.clock;
    let iv = options::get().interval_ns;
    let ran = sys::thread_cpu_ns().saturating_sub(c.event_cpu_start.get());
    let owed = ran.saturating_sub(c.event_ticks.get().saturating_mul(iv));
    c.event_ticks.set(c.event_ticks.get() + owed / iv);
    (owed / iv, owed % iv)
}

/// What ending threads left of an interval, all threads together.
static SPILLED: AtomicU64 = AtomicU64::new(0);

/// A fork child forgets the parent's remainders and late ticks (see
/// `life::forget_parent_counts`).
pub(super) fn forget_carries() {
    SPILLED.store(0, Ordering::Relaxed);
    LATE_OFF_CPU_TICKS.store(0, Ordering::Relaxed);
}

/// Adds `ns`, an ending thread's time short of a whole interval, to what
/// ending threads left, and returns the whole intervals that makes: the
/// remainder is carried across threads as across one thread's samples,
/// so that many short threads are counted in full (each alone would drop
/// its part of an interval: 300 threads of 1.4 intervals are 420, not 300).
pub(super) fn spill(ns: u64) -> u64 {
    let iv = options::get().interval_ns;
    let mut k = 0;
    let _ = SPILLED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |was| {
        k = (was + ns) / iv;
        Some((was + ns) % iv)
    });
    k
}

/// The reading of the clock a POSIX-timer sampler runs on.
pub(super) fn sampled_clock_ns() -> u64 {
    match options::get().perf {
        Some(PerfClock::Real) => sys::fast_monotonic_ns(),
        Some(PerfClock::User) => sys::thread_user_ns(),
        _ => sys::thread_cpu_ns(),
    }
}

/// How many PERF ticks this sample is worth. A perf-event sample stands for
/// one period of its event (the interval, randomised by +-10%). A POSIX-timer sample stands for the clock time since
/// the previous one, in whole intervals with the remainder carried: CPU-clock
/// timers fire late (on the scheduler tick), a wall-clock timer of a thread
/// that was runnable but not running fires once for several intervals, and
/// -pu weighs by user time; the totals stay exact either way.
#[link_section = "igprof_hot"]
pub(super) fn ticks_for(t: &ThreadState) -> u64 {
    if options::get().perf.is_none() {
        return 0;
    }
    let iv = options::get().interval_ns;
    let evented = has_event(t);
    let elapsed = if evented {
        // One event period (clock_seen holds it).
        t.sampler.clock.clock_seen.get()
    } else {
        let now = sampled_clock_ns();
        let e = now.saturating_sub(t.sampler.clock.clock_seen.get());
        t.sampler.clock.clock_seen.set(now);
        e
    };
    let (mut ticks, carry) = whole_intervals(t.sampler.clock.clock_credit.get(), elapsed, iv);
    t.sampler.clock.clock_credit.set(carry);
    if evented {
        let c = &t.sampler.clock;
        if c.since_jitter.get() == 0 {
            // Once every few dozen samples (as the period is re-randomised):
            // the event's clock against the thread's.
            let ran = sys::thread_cpu_ns().saturating_sub(c.event_cpu_start.get());
            c.tick_debt
                .set(beyond_cpu_clock(c.event_ticks.get() + ticks, ran, iv));
        }
        let withheld = c.tick_debt.get().min(ticks);
        c.tick_debt.set(c.tick_debt.get() - withheld);
        ticks -= withheld;
        c.event_ticks.set(c.event_ticks.get() + ticks);
    }
    ticks
}

/// Of `ticks` charged for a perf event's samples, those beyond what the
/// thread's CPU clock says it ran (`ran` ns), one interval of slack aside.
/// The kernel's task-clock event runs on the scheduler's clock while the
/// thread is on a CPU, stolen time included; the thread's CPU clock leaves
/// out what the hypervisor stole (paravirtual steal accounting), as
/// `getrusage` does: on a VM whose CPUs the host takes away for tens of
/// milliseconds, a run's samples came to 12% more than its CPU time (perl,
/// 102 ticks of 5 ms for 0.453 s). Withheld, the profile's ticks stay
/// within an interval of the thread's CPU time.
fn beyond_cpu_clock(ticks: u64, ran: u64, interval: u64) -> u64 {
    ticks.saturating_sub(ran / interval + 1)
}

/// `elapsed` nanoseconds of the sampled clock, plus the `carried`
/// remainder, in whole `interval`s: (ticks, remainder to carry). A run of
/// samples at a period 10% longer than the interval counts 10% more.
fn whole_intervals(carried: u64, elapsed: u64, interval: u64) -> (u64, u64) {
    let credit = carried + elapsed;
    (credit / interval, credit % interval)
}

/// Seconds per PERF tick for the dump header (T=), 0 without sampling.
pub fn tick_seconds() -> f64 {
    match options::get().perf {
        Some(_) => options::get().interval_ns as f64 / 1e9,
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_beyond_the_cpu_clock_are_owed_back() {
        let iv = 5_000_000;
        // 102 ticks for 453 ms of CPU: 90 fit, with one of slack.
        assert_eq!(beyond_cpu_clock(102, 453_000_000, iv), 11);
        // Within an interval of the clock: nothing.
        assert_eq!(beyond_cpu_clock(91, 453_000_000, iv), 0);
        assert_eq!(beyond_cpu_clock(10, 453_000_000, iv), 0);
    }

    #[test]
    fn ticks_are_whole_intervals_with_the_remainder_carried() {
        let iv = 1_000_000;
        assert_eq!(whole_intervals(0, 1_000_000, iv), (1, 0));
        assert_eq!(whole_intervals(0, 2_500_000, iv), (2, 500_000));
        assert_eq!(whole_intervals(500_000, 600_000, iv), (1, 100_000));
        assert_eq!(whole_intervals(0, 999_999, iv), (0, 999_999));
        // Ten samples at a period 10% longer than the interval count 11.
        let (mut carry, mut total) = (0, 0);
        for _ in 0..10 {
            let (k, c) = whole_intervals(carry, 1_100_000, iv);
            total += k;
            carry = c;
        }
        assert_eq!((total, carry), (11, 0));
    }
}
