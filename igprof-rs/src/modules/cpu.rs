//! The sampling profiler (-pp, -pu, -pr) and the per-thread timers that
//! also drive other sampling consumers (the energy module).
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
//! event's hrtimer, 7-8 us on this VM: every 8 samples it doubled the
//! handler's mean cost, 1.8 us -> 0.9 us per sample at 64.)
//!
//! The handler walks the interrupted stack and ticks PERF_TICKS on the
//! leaf's path in the thread's own tree: no lock, no allocation (the tree
//! takes memory straight from mmap).
//!
//! POSIX-timer samples are weighted by the time of their clock since the
//! previous sample (thread CPU time, user time for -pu, wall time for -pr),
//! in whole intervals with the remainder carried over (see `ticks_for`).
//!
//! A sample that lands while the thread is inside profiler code (a hook:
//! the program called malloc or open) is the program's time: it is charged
//! to the program's stack when the thread leaves the profiler
//! ([`settle_pending`]). A sample is dropped (and counted) only when no
//! stack or node could be stored.
//!
//! Must never: allocate, lock, use stdio, or leave errno changed, in the
//! handler; deliver our timer signals to the program's own handler.

use core::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::base::counters::{self, CounterId};
use crate::base::options::{self, PerfClock, Sampler};
use crate::base::sys::{self, PerfDelivery};
use crate::base::thread::{self, Guard, ThreadState};

/// The signal our samplers send (0 when nothing is sampled); see [`signal`].
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The chosen kind of sampler, a [`Sampler`] other than `Auto` (as u8).
static MODE: AtomicU8 = AtomicU8::new(Sampler::Timer as u8);
/// `si_perf_data` of our sigtrap samples ("igprof-r").
const COOKIE: u64 = 0x6967_7072_6f66_2d72;

/// The signal our samplers send: SIGTRAP with sigtrap perf events, SIGPROF
/// otherwise, 0 when the process is not sampled (the program then keeps
/// every signal to itself).
pub fn signal() -> i32 {
    SIGNAL.load(Ordering::Relaxed)
}

fn mode() -> Sampler {
    match MODE.load(Ordering::Relaxed) {
        m if m == Sampler::Sigtrap as u8 => Sampler::Sigtrap,
        m if m == Sampler::Sigprof as u8 => Sampler::Sigprof,
        _ => Sampler::Timer,
    }
}

/// Whether a sigtrap task-clock event opens on the calling thread (Linux
/// 5.13+, perf events allowed): the errno otherwise.
fn probe_sigtrap() -> Result<(), i32> {
    let how = PerfDelivery::Sigtrap { cookie: COOKIE };
    let (fd, ring) = sys::perf_task_clock_open(sys::gettid(), 1_000_000_000, false, how, 0)?;
    sys::perf_close(fd, ring);
    Ok(())
}

/// How the `-e` events of this process signal their threads: SIGTRAP
/// (sigtrap events), else SIGPROF through fasync; None when nothing is
/// sampled.
pub fn event_delivery() -> Option<PerfDelivery> {
    match signal() {
        libc::SIGTRAP => Some(PerfDelivery::Sigtrap {
            cookie: EVENT_COOKIE,
        }),
        0 => None,
        signo => Some(PerfDelivery::Fasync { signo }),
    }
}

/// Chooses the sampler and its signal (constructor, before the handler is
/// installed and before any hook): `--sampler`, else sigtrap when a probe
/// event on this thread opens, else sigprof. -pr always uses timers.
pub fn choose_sampler() {
    let o = options::get();
    if !o.needs_timers() {
        // -e alone: its events raise SIGTRAP, or where the kernel has no
        // sigtrap events (or --sampler sigprof/timer) wake a ring that
        // sends SIGPROF; no timer of ours runs.
        if o.samples_events() {
            let trap =
                matches!(o.sampler, Sampler::Auto | Sampler::Sigtrap) && probe_sigtrap().is_ok();
            let (mode, sig) = if trap {
                (Sampler::Sigtrap, libc::SIGTRAP)
            } else {
                (Sampler::Sigprof, libc::SIGPROF)
            };
            MODE.store(mode as u8, Ordering::Relaxed);
            SIGNAL.store(sig, Ordering::Relaxed);
        }
        return;
    }
    // -pr samples with sigtrap events too (CPU time, plus off-CPU time
    // charged after each context switch: see the module doc); with any
    // other sampler it uses wall-clock POSIX timers.
    let want = match (o.perf, o.sampler) {
        (_, Sampler::Auto) => Sampler::Sigtrap,
        (Some(PerfClock::Real), Sampler::Sigtrap) => Sampler::Sigtrap,
        (Some(PerfClock::Real), _) => Sampler::Timer,
        (_, s) => s,
    };
    let got = match want {
        Sampler::Sigtrap => match probe_sigtrap() {
            Ok(()) => Sampler::Sigtrap,
            Err(e) => {
                if o.sampler == Sampler::Sigtrap || o.debug {
                    crate::igprof_log!(
                        "sigtrap perf events are not available (errno {e}, Linux 5.13+ needed); sampling with SIGPROF"
                    );
                }
                Sampler::Sigprof
            }
        },
        s => s,
    };
    MODE.store(got as u8, Ordering::Relaxed);
    let sig = if got == Sampler::Sigtrap {
        libc::SIGTRAP
    } else {
        libc::SIGPROF
    };
    SIGNAL.store(sig, Ordering::Relaxed);
    if o.debug {
        let name = match got {
            Sampler::Sigtrap => "sigtrap",
            Sampler::Sigprof => "sigprof",
            _ => "timer",
        };
        crate::igprof_log!("sampler {name} (signal {sig})");
    }
}

const SI_TIMER: i32 = -2;

static TICK_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// A consumer of every timer sample besides PERF_TICKS (e.g. energy).
/// Called in signal context with the thread's guard and the sample's
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

/// Enables PERF_TICKS if a perf clock is selected (before counters freeze).
pub fn register_counters() {
    if options::get().perf.is_some() {
        counters::enable(CounterId::PerfTicks);
    }
}

/// After counters are frozen: remembers the slot for the handler.
pub fn init_slots() {
    if let Some(s) = counters::slot(CounterId::PerfTicks) {
        TICK_SLOT.store(s, Ordering::Relaxed);
    }
}

/// Installs our handler for [`signal`] with the real sigaction (nothing to
/// do when the process is not sampled).
pub fn install_handler() -> Result<(), i32> {
    if signal() == 0 {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid starting point; fields set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = handler as *const () as usize;
    // On the thread's alternate stack where it has one: Go runs goroutines
    // on stacks of a few KiB with its heap below, and gives every thread a
    // signal stack for handlers like this one.
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
    // Every signal blocked while a sample is taken: a program handler that
    // interrupted it and left by longjmp (SIGALRM timeouts, SIGSEGV
    // recovery) would leave the thread marked inside the profiler for good.
    // SAFETY: sa_mask is a valid sigset_t.
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    crate::hook::real_sigaction(signal(), &sa, core::ptr::null_mut())
}

fn clock_for(tid: i32) -> libc::clockid_t {
    match options::get().perf {
        Some(PerfClock::Real) => libc::CLOCK_MONOTONIC,
        _ => sys::thread_cpu_clock(tid),
    }
}

fn next_interval(t: &ThreadState) -> u64 {
    let base = options::get().interval_ns;
    let spread = base / 5;
    base - base / 10
        + if spread > 0 {
            t.sampler.clock.next_random() % spread
        } else {
            0
        }
}

/// Starts sampling the calling thread (its state must be registered).
///
/// -pp / -pu use a task-clock perf event on the thread (sigtrap or sigprof,
/// see the module doc). When perf events are not allowed
/// (perf_event_paranoid, seccomp) they fall back to a POSIX timer on the
/// thread CPU clock, which the kernel only checks at the scheduler tick
/// (HZ): intervals below the tick are then coarser. -pr uses a POSIX
/// CLOCK_MONOTONIC timer.
pub fn start_thread(t: &'static ThreadState) {
    let o = options::get();
    if !o.needs_timers() || t.sampler.timer.load(Ordering::Relaxed) >= 0 || has_event(t) {
        return;
    }
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
                    if !PERF_UNAVAILABLE.swap(true, Ordering::Relaxed) && o.debug {
                        no_perf_events(e);
                    }
                }
            }
        }
    }
    t.sampler.clock.clock_seen.set(sampled_clock_ns());
    t.sampler.clock.clock_credit.set(0);
    match sys::timer_create_for_thread(clock_for(t.tid()), signal(), t.tid(), timer_cookie(t.tid()))
    {
        Ok(id) => {
            mark(&OUR_TIMERS, id);
            t.sampler.timer.store(id, Ordering::Release);
            sys::timer_arm_once(id, next_interval(t));
        }
        Err(e) => no_timer(t.tid(), e),
    }
}

/// Says why a thread is not sampled: out of line, so that the line buffer
/// is not in [`start_thread`]'s frame on every thread's (maybe small) stack.
#[cold]
#[inline(never)]
fn no_timer(tid: i32, e: i32) {
    crate::igprof_log!(
        "cannot create the sampling timer of thread {tid} (errno {e}); it is not sampled"
    );
}

#[cold]
#[inline(never)]
fn no_perf_events(e: i32) {
    crate::igprof_log!(
        "perf_event_open(task-clock) failed (errno {e}); sampling with CPU-clock timers (scheduler-tick resolution)"
    );
}

/// Opens and enables the calling thread's sampling perf event.
///
/// A sigtrap event is held by a one-page mapping and its descriptor closed
/// at once, so the program never sees a descriptor of ours (it could close
/// it, reuse its number, or run out of descriptors one early). When the
/// mapping is refused (the locked-memory limit for perf mappings), and for
/// the sigprof sampler (whose signal names the descriptor), the descriptor
/// is kept, moved up out of the program's way.
fn open_event(t: &'static ThreadState, user_only: bool, how: PerfDelivery) -> Result<(), i32> {
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
                        return Err(sys::errno());
                    }
                    t.sampler.perf_ring.store(hold, Ordering::Release);
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
    mark(&OUR_FDS, fd);
    t.sampler.perf_ring.store(ring, Ordering::Release);
    t.sampler.perf_fd.store(fd, Ordering::Release);
    if sys::perf_enable(fd) {
        return Ok(());
    }
    let e = sys::errno();
    stop_thread(t);
    Err(e)
}

/// -pr with sigtrap events: a second event on the thread signals it after
/// every context switch, once it runs again in user space, so that the
/// time it spent off the CPU is charged where it waited ([`off_cpu_ticks`]).
/// Nothing to do for the other clocks. On failure the task-clock event is
/// closed too (the caller falls back to wall-clock timers).
fn open_switch_event(t: &'static ThreadState) -> Result<(), i32> {
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
            t.sampler.switch_hold.store(hold, Ordering::Release);
            Ok(())
        }
        Err(e) => {
            release_event(t);
            Err(e)
        }
    }
}

/// `si_perf_data` of the context-switch events of -pr ("igprof-s").
const SWITCH_COOKIE: u64 = 0x6967_7072_6f66_2d73;

/// `si_perf_data` of the `-e` events: this ("igprofe") with the event's
/// index in the low byte.
pub const EVENT_COOKIE: u64 = 0x6967_7072_6f66_6500;

/// The module that owns the [`EVENT_COOKIE`] events (modules/event).
#[derive(Clone, Copy)]
pub struct EventSamples {
    /// The events the thread holds, one bit per index (signal context).
    pub held: fn(&ThreadState) -> u8,
    /// Their descriptors where they signal through fasync, by index (-1:
    /// none), to recognise their SIGPROFs (signal context).
    pub fds: fn(&ThreadState) -> [i32; 8],
    /// Takes a sample of event `i` (signal context, the thread inside our
    /// handler, with its guard): `uc` the context the kernel passed to
    /// the handler, `addr` the event's data address (`si_addr`, 0 without
    /// one).
    pub sample: fn(&Guard, u8, *mut libc::c_void, usize),
    /// A sample of event `i` that came while the thread ran profiler code:
    /// the profiler's own event, not charged (signal context).
    pub inside: fn(&'static ThreadState, u8),
}

static EVENT_SAMPLES: std::sync::OnceLock<EventSamples> = std::sync::OnceLock::new();

/// Sets the owner of the `-e` events (start-up, before any is opened).
pub fn set_event_samples(e: EventSamples) {
    let _ = EVENT_SAMPLES.set(e);
}

/// An `-e` event's sample: charged by its module unless recording is off
/// or the thread is inside the profiler.
fn event_sample(
    t: &'static ThreadState,
    e: &EventSamples,
    i: u8,
    uc: *mut libc::c_void,
    addr: usize,
) {
    if !crate::base::run::recording() {
        return;
    }
    let Some(guard) = t.enter() else {
        (e.inside)(t, i);
        return;
    };
    t.set_in_signal(true);
    (e.sample)(&guard, i, uc, addr);
    t.set_in_signal(false);
    drop(guard);
}

/// -pr: ticks for the time the thread spent off the CPU (blocked, or
/// runnable and waiting) since the last charge: wall time minus the
/// thread's CPU time (which its task-clock samples count), in whole
/// intervals with the remainder carried.
fn off_cpu_ticks(t: &ThreadState) -> u64 {
    let (wall, cpu) = (sys::monotonic_ns(), sys::thread_cpu_ns());
    let off = wall
        .saturating_sub(t.sampler.clock.wall_mark.get())
        .saturating_sub(cpu.saturating_sub(t.sampler.clock.cpu_mark.get()));
    t.sampler.clock.wall_mark.set(wall);
    t.sampler.clock.cpu_mark.set(cpu);
    let iv = options::get().interval_ns;
    let credit = t.sampler.clock.clock_credit.get() + off;
    t.sampler.clock.clock_credit.set(credit % iv);
    credit / iv
}

/// A perf event samples every `period` ns of thread time (the interval
/// with its random part): remembered so that each sample counts for what it
/// stands for ([`ticks_for`]).
fn set_event_period(t: &ThreadState, period: u64) {
    t.sampler.clock.clock_seen.set(period);
    t.sampler.clock.clock_credit.set(0);
}

/// Set once a perf mapping was refused: events keep their descriptor.
static HOLD_REFUSED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether the thread's sampler is a perf event (held by descriptor or mapping).
fn has_event(t: &ThreadState) -> bool {
    t.sampler.perf_fd.load(Ordering::Relaxed) >= 0
        || t.sampler.perf_ring.load(Ordering::Relaxed) != 0
}

/// Where the profiler's own descriptors go: high enough to stay out of the
/// way of programs that expect the lowest free numbers.
pub fn high_fd_base() -> i32 {
    (sys::nofile_limit().min(1 << 20) as i32 - 128).max(3)
}

static PERF_UNAVAILABLE: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

/// Stops sampling the calling thread (thread exit, exec).
pub fn stop_thread(t: &ThreadState) {
    let id = t.sampler.timer.swap(-1, Ordering::AcqRel);
    if id >= 0 {
        sys::timer_delete(id);
    }
    release_event(t);
}

/// Ends the thread's perf event, whichever way it is held.
fn release_event(t: &ThreadState) {
    let fd = t.sampler.perf_fd.swap(-1, Ordering::AcqRel);
    let ring = t.sampler.perf_ring.swap(0, Ordering::AcqRel);
    if fd >= 0 {
        sys::perf_close(fd, ring);
    } else if ring != 0 {
        sys::perf_release(ring);
    }
    let switch = t.sampler.switch_hold.swap(0, Ordering::AcqRel);
    if switch != 0 {
        sys::perf_release(switch);
    }
}

/// In a forked child: the parent's samplers are not ours (perf descriptors
/// are inherited and would keep signalling the parent's threads' owner).
pub fn forget_inherited(t: &ThreadState) {
    t.sampler.timer.store(-1, Ordering::Release);
    release_event(t);
}

/// The kernel timer id of an SI_TIMER siginfo (the `_timer._tid` field).
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn timer_id_of(info: *const libc::siginfo_t) -> i32 {
    *((info as *const u8).add(16) as *const i32)
}

/// The value an SI_TIMER siginfo carries (the `_timer._sigval` field): the
/// `sigev_value` the timer was made with.
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn timer_value_of(info: *const libc::siginfo_t) -> u64 {
    *((info as *const u8).add(24) as *const u64)
}

/// The value a sampling timer of thread `tid` carries in its signals: our
/// timers are recognised by it where the timer id in the siginfo is not the
/// one timer_create returned (qemu-user hands the program its own ids).
fn timer_cookie(tid: i32) -> u64 {
    COOKIE ^ ((tid as u32 as u64) << 32)
}

/// Whether `v` is the value of one of our sampling timers (any thread's).
fn is_timer_cookie(v: u64) -> bool {
    v & 0xffff_ffff == COOKIE & 0xffff_ffff
}

/// The descriptor of a SIGPOLL-style siginfo (the `_sigpoll._fd` field).
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn poll_fd_of(info: *const libc::siginfo_t) -> i32 {
    *((info as *const u8).add(24) as *const i32)
}

/// The `si_perf_data` of a TRAP_PERF siginfo (`_sigfault._perf._data`).
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn perf_data_of(info: *const libc::siginfo_t) -> u64 {
    *((info as *const u8).add(24) as *const u64)
}

const POLL_IN: i32 = 1;
const POLL_HUP: i32 = 6;

/// Timer ids and descriptors our samplers ever used (bit sets). A signal
/// from one of them that is not the thread's current sampler (one still
/// pending when the sampler was stopped) is ours too, and ignored.
const BITSET_WORDS: usize = 1024;
static OUR_FDS: [AtomicU64; BITSET_WORDS] = [const { AtomicU64::new(0) }; BITSET_WORDS];
static OUR_TIMERS: [AtomicU64; BITSET_WORDS] = [const { AtomicU64::new(0) }; BITSET_WORDS];

/// Records that descriptor `fd` is one of our sampling events (its
/// signals, even late ones after it ended, are never the program's).
pub fn mark_fd_ours(fd: i32) {
    mark(&OUR_FDS, fd);
}

fn mark(set: &[AtomicU64; BITSET_WORDS], n: i32) {
    if n >= 0 && (n as usize) < BITSET_WORDS * 64 {
        set[n as usize / 64].fetch_or(1 << (n % 64), Ordering::Release);
    }
}

fn marked(set: &[AtomicU64; BITSET_WORDS], n: i32) -> bool {
    n >= 0
        && (n as usize) < BITSET_WORDS * 64
        && set[n as usize / 64].load(Ordering::Acquire) & (1 << (n % 64)) != 0
}

/// Who sent this signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The calling thread's current sampler.
    Sampler,
    /// The calling thread's context-switch event (-pr): it ran again.
    Switched,
    /// The calling thread's `-e` event of this index.
    Event(u8),
    /// A sampler of ours that was stopped (or another thread's): ignore.
    Stale,
    /// The program (its own itimer, kill, ...): forward.
    Program,
}

/// What a sampling-signal delivery says about where it came from (the
/// fields of its siginfo that its code makes valid).
#[derive(Clone, Copy, Debug)]
enum Delivery {
    /// A sigtrap perf event's SIGTRAP, with its `si_perf_data`.
    Perf { data: u64 },
    /// A POSIX timer's signal: its timer id and `sigev_value`.
    Timer { id: i32, value: u64 },
    /// A perf event's fasync SIGPROF: the event's descriptor.
    Poll { fd: i32 },
    /// Anything else (kill, raise, the program's own itimer...).
    Other,
}

/// The calling thread's samplers, as [`origin_of`] needs them.
#[derive(Clone, Copy, Debug)]
struct Samplers {
    has_event: bool,
    /// The `-e` events the thread holds, one bit per index.
    held_events: u8,
    /// Their descriptors where they signal through fasync (-1: none).
    event_fds: [i32; 8],
    has_switch_event: bool,
    timer: i32,
    tid: i32,
    perf_fd: i32,
}

/// Where a sampling-signal delivery comes from: the thread's own sampler,
/// a sampler of ours that is not (or no longer) this thread's, or the
/// program. `ours_timer` / `ours_fd` say whether a timer id / descriptor
/// was ever one of our samplers.
fn origin_of(
    d: Delivery,
    t: Option<Samplers>,
    ours_timer: impl Fn(i32) -> bool,
    ours_fd: impl Fn(i32) -> bool,
) -> Origin {
    match d {
        Delivery::Perf { data } if data == COOKIE => {
            if t.is_some_and(|t| t.has_event) {
                Origin::Sampler
            } else {
                Origin::Stale
            }
        }
        Delivery::Perf { data } if data == SWITCH_COOKIE => {
            if t.is_some_and(|t| t.has_switch_event) {
                Origin::Switched
            } else {
                Origin::Stale
            }
        }
        Delivery::Perf { data } if data & !0xff == EVENT_COOKIE => {
            let i = (data & 0xff) as u8;
            if i < 8 && t.is_some_and(|t| t.held_events & 1 << i != 0) {
                Origin::Event(i)
            } else {
                Origin::Stale
            }
        }
        Delivery::Timer { id, value } => {
            if t.is_some_and(|t| t.timer == id || t.timer >= 0 && value == timer_cookie(t.tid)) {
                Origin::Sampler
            } else if ours_timer(id) || is_timer_cookie(value) {
                Origin::Stale
            } else {
                Origin::Program
            }
        }
        Delivery::Poll { fd } => {
            let event = t.and_then(|t| t.event_fds.iter().position(|&f| f >= 0 && f == fd));
            if t.is_some_and(|t| t.perf_fd == fd) {
                Origin::Sampler
            } else if let Some(i) = event {
                Origin::Event(i as u8)
            } else if ours_fd(fd) {
                Origin::Stale
            } else {
                Origin::Program
            }
        }
        _ => Origin::Program,
    }
}

fn origin(t: Option<&ThreadState>, code: i32, info: *const libc::siginfo_t) -> Origin {
    // SAFETY: info is the kernel's siginfo for this signal; each field is
    // read only under the code that makes it valid.
    let d = unsafe {
        if code == sys::TRAP_PERF && signal() == libc::SIGTRAP {
            Delivery::Perf {
                data: perf_data_of(info),
            }
        } else if code == SI_TIMER {
            Delivery::Timer {
                id: timer_id_of(info),
                value: timer_value_of(info),
            }
        } else if (code == POLL_HUP || code == POLL_IN) && signal() == libc::SIGPROF {
            Delivery::Poll {
                fd: poll_fd_of(info),
            }
        } else {
            Delivery::Other
        }
    };
    let events = EVENT_SAMPLES.get();
    let samplers = t.map(|t| Samplers {
        has_event: has_event(t),
        held_events: events.map_or(0, |e| (e.held)(t)),
        event_fds: events.map_or([-1; 8], |e| (e.fds)(t)),
        has_switch_event: t.sampler.switch_hold.load(Ordering::Relaxed) != 0,
        timer: t.sampler.timer.load(Ordering::Relaxed),
        tid: t.tid(),
        perf_fd: t.sampler.perf_fd.load(Ordering::Relaxed),
    });
    origin_of(
        d,
        samplers,
        |id| marked(&OUR_TIMERS, id),
        |fd| marked(&OUR_FDS, fd),
    )
}

/// Samples between period changes (see the module doc).
const JITTER_EVERY: u32 = 64;
/// Samples between renewals of a held event (a new event with a new
/// period): opening, mapping and ending an event costs about 60 us here,
/// so it is done less often than an ioctl.
const RENEW_EVERY: u32 = 512;

fn rearm(t: &'static ThreadState) {
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

/// Replaces a held sigtrap event by one with a new random period (signal
/// context: system calls only). The new event is held before the old one
/// ends, so the thread is never left unsampled; if it cannot be made, the
/// old one stays.
fn renew_held_event(t: &'static ThreadState) {
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
            let old = t.sampler.perf_ring.swap(new, Ordering::AcqRel);
            t.sampler.clock.clock_seen.set(period);
            if old != 0 {
                sys::perf_release(old);
            }
        }
        Ok(new) => sys::perf_release(new),
        Err(_) => {}
    }
}

extern "C" fn handler(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = sys::ErrnoGuard::save();
    // SAFETY: the kernel passes a valid siginfo.
    let code = unsafe { (*info).si_code };
    let t = thread::current();
    let switched = match origin(t, code, info) {
        Origin::Sampler => false,
        Origin::Switched => true,
        Origin::Event(i) => {
            if let (Some(t), Some(e)) = (t, EVENT_SAMPLES.get()) {
                let addr = if code == sys::TRAP_PERF {
                    // SAFETY: a TRAP_PERF siginfo: `_sigfault._addr` is valid.
                    unsafe { *((info as *const u8).add(16) as *const usize) }
                } else {
                    // A fasync SIGPROF carries no data address.
                    0
                };
                event_sample(t, e, i, uc, addr);
            }
            return;
        }
        Origin::Stale => return,
        Origin::Program => {
            let f = FORWARD.load(Ordering::Acquire);
            if f != 0 {
                // SAFETY: only ProgramSignal pointers are stored in FORWARD.
                let f: ProgramSignal = unsafe { core::mem::transmute::<usize, ProgramSignal>(f) };
                f(sig, info, uc);
            }
            return;
        }
    };
    let Some(t) = t else { return };
    // -d: the handler's own CPU time (thread CPU clock, one system call at
    // each end): wall time would count preemption and the other threads
    // of a busy machine.
    let timed = options::debug();
    let start = if timed { sys::thread_cpu_ns() } else { 0 };

    let ticks = if switched {
        off_cpu_ticks(t)
    } else {
        rearm(t);
        ticks_for(t)
    };
    if ticks == 0 && switched {
        // Off the CPU for less than what is still owed of an interval.
        return;
    }
    if !crate::base::run::recording() {
        // -pd or igprof_disable(): the timers keep their rhythm, nothing
        // is charged.
        return;
    }
    let Some(guard) = t.enter() else {
        // The thread is inside the profiler (a hook: the program called
        // malloc, open...): the time is the program's. Charged to the
        // program's stack when the profiler code leaves ([`settle_pending`]).
        t.sampler
            .clock
            .pending_ticks
            .set(t.sampler.clock.pending_ticks.get() + ticks);
        return;
    };
    t.set_in_signal(true);
    sample(&guard, uc, ticks);
    t.set_in_signal(false);
    drop(guard);
    if timed {
        let ns = sys::thread_cpu_ns().saturating_sub(start);
        t.stats.handler_ns.fetch_add(ns, Ordering::Relaxed);
        cost::record(ns);
    }
}

/// The sampling handler's CPU time per sample (`-d`): a histogram with
/// four buckets per power of two (so percentiles are within 19%), filled
/// with relaxed atomic adds from the handler.
pub mod cost {
    use core::sync::atomic::{AtomicU64, Ordering};

    const SUB: u32 = 2;
    const BUCKETS: usize = 64 << SUB;
    static HIST: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];

    fn bucket(ns: u64) -> usize {
        if ns < (1 << SUB) {
            return ns as usize;
        }
        let log = 63 - ns.leading_zeros();
        let frac = (ns >> (log - SUB)) & ((1 << SUB) - 1);
        (((log - SUB + 1) << SUB) as u64 + frac) as usize
    }

    /// The smallest value of bucket `b`.
    fn floor(b: usize) -> u64 {
        if b < (1 << SUB) {
            return b as u64;
        }
        let log = (b >> SUB) as u32 + SUB - 1;
        let frac = (b & ((1 << SUB) - 1)) as u64;
        (1u64 << log) | (frac << (log - SUB))
    }

    /// Signal-safe: one relaxed atomic add.
    pub fn record(ns: u64) {
        HIST[bucket(ns).min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The median and 99th percentile of the samples recorded so far (the
    /// lower bounds of their buckets), or None without samples.
    pub fn percentiles() -> Option<(u64, u64)> {
        let counts: Vec<u64> = HIST.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let at = |q: f64| {
            let want = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (b, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    return floor(b);
                }
            }
            floor(BUCKETS - 1)
        };
        Some((at(0.5), at(0.99)))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn buckets_are_monotonic_and_tight() {
            let mut last = 0;
            for ns in [
                0u64,
                1,
                3,
                4,
                5,
                7,
                8,
                9,
                15,
                16,
                1000,
                1023,
                1024,
                1_500_000,
                u64::MAX / 2,
            ] {
                let b = bucket(ns);
                assert!(b >= last, "{ns}");
                last = b;
                assert!(floor(b) <= ns, "{ns}: floor {}", floor(b));
                assert!(
                    ns < 4 || (ns - floor(b)) * 4 < ns,
                    "{ns}: floor {}",
                    floor(b)
                );
            }
            assert_eq!(floor(bucket(1024)), 1024);
            assert_eq!(floor(bucket(1280)), 1280);
        }
    }
}

/// Charges the samples that landed while the thread was inside profiler
/// code to the stack of the program code that called into it (profiler
/// frames skipped). Called as profiler code is left, by the guard's drop.
#[inline]
pub fn settle_pending(g: &Guard) {
    if g.state().sampler.clock.pending_ticks.get() != 0 {
        settle_slow(g);
    }
}

#[cold]
#[inline(never)]
fn settle_slow(g: &Guard) {
    let t = g.state();
    // A sample taken meanwhile adds to the pending ticks again: a few rounds at most.
    for _ in 0..4 {
        let k = t.sampler.clock.pending_ticks.replace(0);
        if k == 0 {
            return;
        }
        // SAFETY: the owning thread (its guard is being dropped); the
        // buffer is not borrowed elsewhere.
        let buf = unsafe { t.trace_buf(g) };
        let walk = crate::base::trace::here(t, buf);
        t.stats.samples.fetch_add(1, Ordering::Relaxed);
        if walk.refused {
            t.stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // SAFETY: owner thread; the tree is not borrowed elsewhere.
        let node = unsafe { t.tree_mut(g) }.node_for(&buf[..walk.depth], walk.truncated);
        let slot = TICK_SLOT.load(Ordering::Relaxed);
        if node.is_null() {
            t.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else if slot != usize::MAX {
            // SAFETY: node is a live node of this tree.
            unsafe { &*node }.counter(slot).add(k, k);
        }
    }
}

/// The reading of the clock a POSIX-timer sampler runs on.
fn sampled_clock_ns() -> u64 {
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
fn ticks_for(t: &ThreadState) -> u64 {
    if options::get().perf.is_none() {
        return 0;
    }
    let iv = options::get().interval_ns;
    let elapsed = if has_event(t) {
        // One event period (clock_seen holds it).
        t.sampler.clock.clock_seen.get()
    } else {
        let now = sampled_clock_ns();
        let e = now.saturating_sub(t.sampler.clock.clock_seen.get());
        t.sampler.clock.clock_seen.set(now);
        e
    };
    let (ticks, carry) = whole_intervals(t.sampler.clock.clock_credit.get(), elapsed, iv);
    t.sampler.clock.clock_credit.set(carry);
    ticks
}

/// `elapsed` nanoseconds of the sampled clock, plus the `carried`
/// remainder, in whole `interval`s: (ticks, remainder to carry). A run of
/// samples at a period 10% longer than the interval counts 10% more.
fn whole_intervals(carried: u64, elapsed: u64, interval: u64) -> (u64, u64) {
    let credit = carried + elapsed;
    (credit / interval, credit % interval)
}

/// The node of the stack a signal interrupted (`uc`), in the thread's own
/// tree; null when no stack or node could be stored (counted as dropped).
/// Counts the sample (unless its stack was refused) and a truncated stack.
/// Signal context, with the thread's guard `g`.
///
/// # Safety
/// `uc` must be the `ucontext_t` the kernel passed to this thread's
/// `SA_SIGINFO` handler for the signal being handled, and `g` the guard of
/// the thread that handles it.
pub unsafe fn interrupted_node(g: &Guard, uc: *mut libc::c_void) -> *mut crate::base::tree::Node {
    // SAFETY: as the caller guarantees.
    unsafe { interrupted_node_at(g, uc, None) }
}

/// [`interrupted_node`] with the leaf's address replaced by `leaf` when
/// given (a sample that names its own instruction, as IBS does, over the
/// callers found at the interrupt).
///
/// # Safety
/// As [`interrupted_node`].
pub unsafe fn interrupted_node_at(
    g: &Guard,
    uc: *mut libc::c_void,
    leaf: Option<usize>,
) -> *mut crate::base::tree::Node {
    let t = g.state();
    // SAFETY: the owning thread (caller); the buffer is not borrowed
    // elsewhere.
    let buf = unsafe { t.trace_buf(g) };
    // SAFETY: uc comes from the kernel for this thread's signal (caller).
    let walk = unsafe { crate::base::trace::from_ucontext(t, uc, buf) };
    if let (Some(pc), true) = (leaf, walk.depth > 0) {
        buf[0] = pc;
    }
    if walk.refused {
        t.stats.dropped.fetch_add(1, Ordering::Relaxed);
        return core::ptr::null_mut();
    }
    if walk.truncated {
        t.stats.truncated.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: owner thread; the tree is not borrowed elsewhere.
    let node = unsafe { t.tree_mut(g) }.node_for(&buf[..walk.depth], walk.truncated);
    t.stats.samples.fetch_add(1, Ordering::Relaxed);
    if node.is_null() {
        t.stats.dropped.fetch_add(1, Ordering::Relaxed);
    }
    node
}

fn sample(g: &Guard, uc: *mut libc::c_void, k: u64) {
    let t = g.state();
    // SAFETY: uc is the context the kernel gave our handler (`handler`),
    // on this thread.
    let node = unsafe { interrupted_node(g, uc) };
    if !node.is_null() {
        t.sampler.last_sample.store(node, Ordering::Release);
        let slot = TICK_SLOT.load(Ordering::Relaxed);
        if slot != usize::MAX {
            // SAFETY: node is a live node of this tree.
            let c = unsafe { &*node }.counter(slot);
            if k > 0 {
                c.add(k, k);
            }
        }
    }
    for c in CONSUMERS.iter() {
        let f = c.load(Ordering::Relaxed);
        if f == 0 {
            break;
        }
        // SAFETY: only SampleConsumer pointers are stored.
        let f: SampleConsumer = unsafe { core::mem::transmute::<usize, SampleConsumer>(f) };
        f(g, node);
    }
}

/// The sampling profiler in the module registry: PERF_TICKS, the header's
/// tick, the start-up line's first words. (The per-thread timers this
/// file runs serve every sample consumer, so the runtime starts and stops
/// them whenever [`Options::needs_timers`](crate::base::options::Options::needs_timers).)
pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe: describe_cpu,
    register_counters: |_| register_counters(),
    start: |_| {
        init_slots();
        Ok(())
    },
    header_tick: Some(|o| o.interval_ns as f64 / 1e9),
    ..crate::modules::Module::new("-pp", |o| o.perf.is_some())
};

fn describe_cpu(o: &options::Options) -> Option<String> {
    let (flag, what) = match o.perf? {
        PerfClock::Cpu => ("-pp", "CPU time"),
        PerfClock::User => ("-pu", "user CPU time"),
        PerfClock::Real => ("-pr", "wall-clock time"),
    };
    let iv = o.interval_ns;
    let ivs = if iv.is_multiple_of(1_000_000) {
        format!("{}ms", iv / 1_000_000)
    } else {
        format!("{}us", iv / 1000)
    };
    Some(format!("{flag} {what} every {ivs} per thread"))
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

    fn mine(has_event: bool) -> Samplers {
        Samplers {
            has_event,
            held_events: 0b101,
            event_fds: [-1, 11, -1, -1, -1, -1, -1, -1],
            has_switch_event: true,
            timer: 7,
            tid: 100,
            perf_fd: 9,
        }
    }

    #[test]
    fn a_delivery_is_ours_stale_or_the_programs() {
        let never = |_| false;
        let o = |d, t| origin_of(d, t, never, never);
        // sigtrap perf events: our cookie, the switch cookie, or the program's.
        assert_eq!(
            o(Delivery::Perf { data: COOKIE }, Some(mine(true))),
            Origin::Sampler
        );
        assert_eq!(
            o(Delivery::Perf { data: COOKIE }, Some(mine(false))),
            Origin::Stale
        );
        assert_eq!(o(Delivery::Perf { data: COOKIE }, None), Origin::Stale);
        let switch = Delivery::Perf {
            data: SWITCH_COOKIE,
        };
        assert_eq!(o(switch, Some(mine(true))), Origin::Switched);
        let no_switch = Samplers {
            has_switch_event: false,
            ..mine(true)
        };
        assert_eq!(o(switch, Some(no_switch)), Origin::Stale);
        assert_eq!(
            o(Delivery::Perf { data: 42 }, Some(mine(true))),
            Origin::Program
        );
        // -e events: held by the thread or not.
        let ev = |i| Delivery::Perf {
            data: EVENT_COOKIE | i,
        };
        assert_eq!(o(ev(0), Some(mine(true))), Origin::Event(0));
        assert_eq!(o(ev(2), Some(mine(false))), Origin::Event(2));
        assert_eq!(o(ev(1), Some(mine(true))), Origin::Stale);
        assert_eq!(o(ev(9), Some(mine(true))), Origin::Stale);
        assert_eq!(o(ev(0), None), Origin::Stale);
        // An -e event signalling through fasync: its descriptor.
        assert_eq!(
            o(Delivery::Poll { fd: 11 }, Some(mine(true))),
            Origin::Event(1)
        );
        // POSIX timers: this thread's by id or by its cookie, another of
        // ours by cookie or id, else the program's.
        let t = Some(mine(false));
        assert_eq!(o(Delivery::Timer { id: 7, value: 0 }, t), Origin::Sampler);
        let by_cookie = Delivery::Timer {
            id: 3,
            value: timer_cookie(100),
        };
        assert_eq!(o(by_cookie, t), Origin::Sampler);
        let other_thread = Delivery::Timer {
            id: 3,
            value: timer_cookie(101),
        };
        assert_eq!(o(other_thread, t), Origin::Stale);
        assert_eq!(o(Delivery::Timer { id: 3, value: 5 }, t), Origin::Program);
        let was_ours = origin_of(Delivery::Timer { id: 3, value: 5 }, t, |id| id == 3, never);
        assert_eq!(was_ours, Origin::Stale);
        // fasync SIGPROF: the thread's event descriptor, one of ours, or not.
        assert_eq!(o(Delivery::Poll { fd: 9 }, t), Origin::Sampler);
        assert_eq!(o(Delivery::Poll { fd: 10 }, t), Origin::Program);
        assert_eq!(
            origin_of(Delivery::Poll { fd: 10 }, t, never, |fd| fd == 10),
            Origin::Stale
        );
        // kill, raise, the program's own itimer.
        assert_eq!(o(Delivery::Other, t), Origin::Program);
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
