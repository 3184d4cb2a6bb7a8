//! Which kind of sampler the process uses, and the signal it sends.
//!
//! Owns: the choice made once at start-up ([`choose_sampler`]: `--sampler`,
//! else sigtrap perf events when a probe event opens, else sigprof; -pr
//! without sigtrap events on POSIX timers), the sampling signal
//! ([`signal`]) and how `-e` events signal their threads
//! ([`event_delivery`]).
//!
//! Must never: change the choice after start-up (the handler and every
//! thread's sampler rely on one signal for the process).

use core::sync::atomic::{AtomicI32, AtomicU8, Ordering};

use super::{COOKIE, EVENT_COOKIE};
use crate::base::options::{self, PerfClock, Sampler};
use crate::sys::{self, Errno, PerfDelivery};

/// The signal our samplers send (0 when nothing is sampled); see [`signal`].
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The chosen kind of sampler, a [`Sampler`] other than `Auto` (as u8).
static MODE: AtomicU8 = AtomicU8::new(Sampler::Timer as u8);

/// The signal our samplers send: SIGTRAP with sigtrap perf events, SIGPROF
/// otherwise, 0 when the process is not sampled (the program then keeps
/// every signal to itself).
pub fn signal() -> i32 {
    SIGNAL.load(Ordering::Relaxed)
}

pub(super) fn mode() -> Sampler {
    match MODE.load(Ordering::Relaxed) {
        m if m == Sampler::Sigtrap as u8 => Sampler::Sigtrap,
        m if m == Sampler::Sigprof as u8 => Sampler::Sigprof,
        _ => Sampler::Timer,
    }
}

/// Whether a sigtrap task-clock event opens on the calling thread (Linux
/// 5.13+, perf events allowed) as this process's samplers will open
/// theirs: counting kernel mode for -pp and -pr, user mode only for -pu
/// and for `-e` alone (which only asks whether sigtrap events exist; its
/// events choose their own modes). The errno otherwise.
fn probe_sigtrap() -> Result<(), Errno> {
    let how = PerfDelivery::Sigtrap { cookie: COOKIE };
    let perf = options::get().perf;
    let user_only = matches!(perf, Some(PerfClock::User) | None);
    let (fd, ring) = sys::perf_task_clock_open(sys::gettid(), 1_000_000_000, user_only, how, 0)?;
    sys::perf_close(fd, ring);
    Ok(())
}

/// Why a task-clock event was refused with errno `e`, in words (`-d`'s
/// line on the sampler, and the line saying that timers sample instead):
/// [`sys::perf_open_refusal`] for the clock the samplers count, and where
/// kernel mode alone was refused to `-pp`, that `-pu` would sample.
pub(super) fn task_clock_refusal(e: Errno) -> String {
    let rights = sys::PerfRights::of_this_process();
    let perf = options::get().perf;
    let kernel_mode = !matches!(perf, Some(PerfClock::User) | None);
    let words = sys::perf_open_refusal(e.0, kernel_mode, &rights);
    if perf == Some(PerfClock::Cpu) && rights.refused_kernel_mode(e.0) {
        format!("{words}; -pu samples user-mode time with perf events")
    } else {
        words
    }
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

/// Whether no process traces this one. A debugger (gdb) stops the
/// program at every SIGTRAP it is sent, and sigtrap perf events send one
/// per sample; SIGPROF it passes on without stopping or printing (gdb's
/// default). So a traced process's automatic choice is SIGPROF (through
/// a ring; -pr: POSIX timers), said in one line. A tracer that attaches
/// later is not seen (`--sampler sigprof` then).
fn not_under_a_tracer() -> bool {
    let Some((pid, comm)) = sys::tracer() else {
        return true;
    };
    crate::igprof_log!(
        "traced by process {pid}{}: samples come by SIGPROF, which debuggers pass on (perf events' SIGTRAP would stop the program at each one)",
        if comm.is_empty() { String::new() } else { format!(" ({comm})") }
    );
    false
}

/// Chooses the sampler and its signal (constructor, before the handler is
/// installed and before any hook): `--sampler`, else sigtrap when a probe
/// event on this thread opens, else sigprof. -pr always uses timers.
/// `attaching`: `igprof --attach` is loading the library, and the tracer
/// is the launcher itself, for the attach only.
pub fn choose_sampler(attaching: bool) {
    let o = options::get();
    // Asked only where a sampling signal is chosen (a tracer is said).
    let traced = || o.sampler == Sampler::Auto && !attaching && !not_under_a_tracer();
    if !o.needs_timers() {
        // -e alone: its events raise SIGTRAP, or where the kernel has no
        // sigtrap events (or --sampler sigprof/timer) wake a ring that
        // sends SIGPROF; no timer of ours runs.
        if o.samples_events() {
            let trap = match o.sampler {
                Sampler::Auto => !traced() && probe_sigtrap().is_ok(),
                Sampler::Sigtrap => probe_sigtrap().is_ok(),
                _ => false,
            };
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
    // other sampler it uses wall-clock POSIX timers. A traced process
    // (a debugger's) samples with SIGPROF: see [`not_under_a_tracer`].
    let traced = traced();
    let want = match (o.perf, o.sampler) {
        (Some(PerfClock::Real), Sampler::Auto) if traced => Sampler::Timer,
        (_, Sampler::Auto) if traced => Sampler::Sigprof,
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
                        "sigtrap perf events: {}; sampling with SIGPROF",
                        task_clock_refusal(e)
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
