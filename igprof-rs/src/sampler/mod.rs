//! The sampler: the engine that interrupts each profiled thread at
//! intervals of its CPU time (or wall time) and charges the interrupted
//! stack. The CPU module (-pp, -pu, -pr: PERF_TICKS) is its main user;
//! energy (-np) and `-e` events take their samples through it too.
//!
//! Each profiled thread owns its own sampler that signals only that thread.
//! One kind of sampler is chosen for the process at start-up
//! ([`choose_sampler`], `--sampler` to force one):
//! - sigtrap (-pp / -pu, default when the kernel has it, Linux 5.13+): a
//!   task-clock perf event on the thread (hrtimer-driven, so 1 ms and 100 us
//!   intervals are honoured; -pu skips kernel-mode samples) with
//!   `attr.sigtrap`: the kernel raises SIGTRAP in the thread from task work
//!   on its way back to user space. No ring buffer and no wake-up interrupt,
//!   which on a VM is most of a sample's cost (bench/pp-bench measures it).
//!   Our SIGTRAPs carry si_code TRAP_PERF and our cookie in si_perf_data;
//!   every other SIGTRAP (int3, raise, the program's own perf events) goes
//!   to the program as it set up (`signals`).
//! - sigprof: the same event, whose overflow wakes a mapped ring buffer and
//!   sends SIGPROF through fasync (F_SETOWN_EX to the thread).
//! - -pr with sigtrap events: the task-clock event above for the time on
//!   the CPU, and a context-switch event (period 1, sigtrap) whose SIGTRAP
//!   comes when the thread runs in user space again after being switched
//!   out: the handler charges the wall time it spent off the CPU (wall
//!   minus thread CPU time since the last charge) to the stack where it
//!   waited. Both signals come from task work on the way back to user
//!   space, so no blocking call (poll, select, nanosleep, read, futex) is
//!   ever interrupted, which a wall-clock timer signal does (EINTR). Time a
//!   thread is still blocked in when the profile is written is not counted.
//! - timer, the fallback when perf events are refused (perf_event_paranoid,
//!   seccomp), and -pr without sigtrap events: a POSIX timer
//!   (SIGEV_THREAD_ID) on the thread CPU
//!   clock or on CLOCK_MONOTONIC sending SIGPROF (SIGTRAP when the process
//!   uses sigtrap and one thread's event could not be opened), one-shot and
//!   re-armed by every expiry with a jittered interval. CPU-clock POSIX
//!   timers only fire on the scheduler tick, so there intervals below the
//!   tick become the tick.
//!
//! A perf event's period is re-randomised (+-10%) every 64 samples against
//! aliasing: each run of 64 samples has its own period, so no phase stays
//! locked to the program's own periodic work. (The ioctl restarts the
//! event's hrtimer, which costs more than the rest of a sample: doing it
//! every 8 samples doubled the handler's mean cost: docs/benchmarks.md.)
//!
//! The handler walks the interrupted stack and ticks PERF_TICKS on the
//! leaf's path in the thread's own tree: no lock, no allocation (the tree
//! takes memory straight from mmap).
//!
//! POSIX-timer samples are weighted by the time of their clock since the
//! previous sample (thread CPU time, user time for -pu, wall time for -pr),
//! in whole intervals with the remainder carried over (`ticks`). The time
//! after a thread's last sample is charged to that sample's stack as the
//! thread ends ([`charge_tail`]); a thread no timer signal ever reached
//! (a loaded machine) is counted apart and named by the final dump.
//!
//! A sample that lands while the thread is inside profiler code (a hook:
//! the program called malloc or open) is the program's time: it is charged
//! to the program's stack when the thread leaves the profiler
//! ([`settle_pending`]). A sample is dropped (and counted) only when no
//! stack or node could be stored.
//!
//! Files, one concern each: `choice` (which sampler, which signal), `life`
//! (a thread's sampler started, re-armed, stopped), `perf` (its perf
//! events), `timer` (its POSIX timer), `origin` (who sent a signal),
//! `handler` (the signal handler and the walk into the tree), `ticks` (what
//! a sample is worth), `settle` (samples taken inside profiler code),
//! `cost` (the handler's own time, `-d`). This file holds what they share:
//! the cookies our signals carry and what other layers plug in (sample
//! consumers, the owner of `-e` events, where the program's signals go).
//!
//! Layer: below `modules/` and `process/`, which use it; above `base/`,
//! `unwind/` and `hook/` (the real sigaction), which it uses.
//!
//! Must never: name a profiler module, `output/` or `process/` (they plug
//! in here instead); allocate, lock, use stdio, or leave errno changed, in
//! the handler; deliver our timer signals to the program's own handler.

pub mod cost;

mod choice;
mod handler;
mod life;
mod origin;
mod perf;
mod settle;
mod ticks;
mod timer;

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::base::thread::{Guard, ThreadState};

pub use choice::{choose_sampler, event_delivery, signal};
pub use handler::{handler_installed, install_handler, interrupted_node, interrupted_node_at};
pub use life::{
    charge_tail, forget_inherited, forget_parent_counts, start_thread, stop_thread, unsampled,
};
pub use origin::mark_fd_ours;
pub use perf::high_fd_base;
pub use settle::settle_pending;
pub use ticks::{late_off_cpu, set_tick_slot, tick_seconds};

/// Set while the image samples no more (its final profile, an exec, a
/// detach) until [`allow`]. A thread that was stopped or interrupted
/// while starting or renewing its sampler finishes after every sampler
/// was stopped: its new one must not outlive that (a detached process's
/// own SIGTRAP action would meet its samples).
static ENDED: AtomicBool = AtomicBool::new(false);

/// Sampling ends for the image: no sampler starts or is renewed after
/// this (call before stopping every thread's).
pub fn end_all() {
    ENDED.store(true, Ordering::SeqCst);
}

/// Samplers may start again (a forked child, a failed exec, an attach).
pub fn allow() {
    ENDED.store(false, Ordering::SeqCst);
}

/// Whether sampling has ended for the image (see [`end_all`]).
fn ended() -> bool {
    ENDED.load(Ordering::SeqCst)
}

/// `si_perf_data` of our sigtrap samples ("igprof-r").
const COOKIE: u64 = 0x6967_7072_6f66_2d72;

/// `si_perf_data` of the context-switch events of -pr ("igprof-s").
const SWITCH_COOKIE: u64 = 0x6967_7072_6f66_2d73;

/// `si_perf_data` of the `-e` events: this ("igprofe") with the event's
/// index in the low byte.
pub const EVENT_COOKIE: u64 = 0x6967_7072_6f66_6500;

/// Whether the thread's sampler is a perf event (held by descriptor or mapping).
fn has_event(t: &ThreadState) -> bool {
    t.sampler.perf_fd.load(Ordering::Relaxed) >= 0
        || t.sampler.perf_ring.load(Ordering::Relaxed) != 0
}

/// A consumer of every timer sample besides PERF_TICKS (e.g. energy).
/// Called in signal context with the thread's guard held and the sample's
/// node (null if the stack could not be stored); must be async-signal-safe.
pub type SampleConsumer = fn(&Guard, *mut crate::base::tree::Node);

const MAX_CONSUMERS: usize = 4;
static CONSUMERS: [AtomicUsize; MAX_CONSUMERS] = [const { AtomicUsize::new(0) }; MAX_CONSUMERS];

/// Delivers a signal that is not one of our samples to the program as it
/// set it up (signal context).
pub type ProgramSignal = fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// The [`ProgramSignal`] of the layer that keeps the program's view of the
/// sampling signal (0: none).
static FORWARD: AtomicUsize = AtomicUsize::new(0);

/// Sets where signals that are not our samples go (start-up, once).
pub fn set_program_signal(f: ProgramSignal) {
    FORWARD.store(f as usize, Ordering::Release);
}

/// Registers a sample consumer (start-up only, before threads start).
pub fn add_consumer(f: SampleConsumer) -> bool {
    for c in CONSUMERS.iter() {
        if c.compare_exchange(0, f as usize, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return true;
        }
    }
    false
}

/// The owner of the [`EVENT_COOKIE`] events (the `-e` module).
#[derive(Clone, Copy)]
pub struct EventSamples {
    /// The events the thread holds, one bit per index (signal context).
    pub held: fn(&ThreadState) -> u8,
    /// Their descriptors where they signal through fasync, by index (-1:
    /// none), to recognise their SIGPROFs (signal context).
    pub fds: fn(&ThreadState) -> [i32; 8],
    /// Takes a sample of event `i` (signal context, guard held, the
    /// thread inside our handler): `uc` the context the kernel passed to
    /// the handler, `addr` the event's data address (`si_addr`, 0 without
    /// one).
    pub sample: fn(&Guard, u8, *mut libc::c_void, usize),
    /// A sample of event `i` that came while the thread ran profiler code:
    /// the profiler's own event, not charged (signal context).
    pub inside: fn(&'static ThreadState, u8),
}

static EVENT_SAMPLES: OnceLock<EventSamples> = OnceLock::new();

/// Sets the owner of the `-e` events (start-up, before any is opened).
pub fn set_event_samples(e: EventSamples) {
    let _ = EVENT_SAMPLES.set(e);
}
