//! The sampling signal's handler: installed once for the process with the
//! real sigaction, it asks [`origin`](super::origin) who sent the signal,
//! forwards the program's signals to the program, ignores stale ones,
//! passes `-e` samples to their module, and for the thread's own sampler
//! re-arms it, weighs the sample ([`ticks`](super::ticks)) and walks the
//! interrupted stack into the thread's own tree, then calls every sample
//! consumer. A sample that lands while the thread runs profiler code is
//! left pending for [`settle`](super::settle).
//!
//! Must never: allocate, lock, use stdio, or leave errno changed, in the
//! handler; deliver our samplers' signals to the program's own handler.

use core::sync::atomic::Ordering;

use super::choice::signal;
use super::life::rearm;
use super::origin::{origin, Origin};
use super::ticks::{
    charge, late_off_cpu_ticks, late_off_cpu_ticks_at_sample, off_cpu_ticks, ticks_for,
};
use super::{EventSamples, ProgramSignal, SampleConsumer, CONSUMERS, EVENT_SAMPLES, FORWARD};
use crate::base::options;
use crate::base::thread::{self, Guard, ThreadState};
use crate::sys::{self, Errno};

/// Installs our handler for [`signal`] with the real sigaction (nothing to
/// do when the process is not sampled).
pub fn install_handler() -> Result<(), Errno> {
    if signal() == 0 {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid starting point; fields set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = entry();
    // In a Go program (cgo's `_cgo_topofstack` defined), on the thread's
    // alternate stack: Go runs goroutines on stacks of a few KiB with its
    // heap below, and gives every thread a signal stack big enough. Not
    // elsewhere: a C program's alternate stack may be MINSIGSTKSZ, too small
    // for a sample.
    let go = crate::base::run::is_go_program();
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | if go { libc::SA_ONSTACK } else { 0 };
    // Every signal blocked while a sample is taken: a program handler that
    // interrupted it and left by longjmp (SIGALRM timeouts, SIGSEGV
    // recovery) would leave the thread marked inside the profiler for good,
    // and an asynchronous cancellation would unwind through the walk.
    sa.sa_mask = sys::handler_mask();
    crate::hook::real_sigaction(signal(), &sa, core::ptr::null_mut()).map_err(Errno)
}

/// Whether the sampling signal's real action is still our handler: a
/// program may have reset it by a raw `rt_sigaction` system call, which
/// no hook sees (chromium's children between fork and exec).
pub fn handler_installed() -> bool {
    if signal() == 0 {
        return false;
    }
    // SAFETY: a zeroed sigaction is a valid out-buffer.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    crate::hook::real_sigaction(signal(), core::ptr::null(), &mut old).is_ok()
        && old.sa_sigaction == entry()
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

// The handler's entry (a shim that aligns the stack on x86-64), beside it.
sys::signal_entry!(entry, "igprof_sampler_entry", "igprof_hot", handler);

#[link_section = "igprof_hot"]
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
            // -pr: a signal of the program's own pending when the thread
            // runs again makes the kernel drop the SIGTRAP of its
            // context-switch event; the wait is charged here, where the
            // thread waited, before the program's handler runs.
            if let Some(t) = t {
                let late = late_off_cpu_ticks(t);
                if late > 0 {
                    take_sample(t, uc, late, handler_clock());
                }
            }
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
    let start = handler_clock();
    let ticks = if switched {
        off_cpu_ticks(t)
    } else {
        rearm(t);
        ticks_for(t) + late_off_cpu_ticks_at_sample(t)
    };
    if ticks == 0 && switched {
        // Off the CPU for less than what is still owed of an interval.
        return;
    }
    take_sample(t, uc, ticks, start);
}

/// -d: the thread's CPU clock as the handler starts, to time it (one
/// system call at each end; wall time would count preemption and the
/// other threads of a busy machine). None without -d.
#[link_section = "igprof_hot"]
fn handler_clock() -> Option<u64> {
    options::debug().then(sys::thread_cpu_ns)
}

/// Charges `ticks` to the stack the signal interrupted (`uc`), or holds
/// them for the program's stack when the thread is inside the profiler;
/// nothing while recording is off. `start`: [`handler_clock`] at the
/// handler's start.
#[link_section = "igprof_hot"]
fn take_sample(t: &'static ThreadState, uc: *mut libc::c_void, ticks: u64, start: Option<u64>) {
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
    if let Some(start) = start {
        let ns = sys::thread_cpu_ns().saturating_sub(start);
        t.stats.handler_ns.fetch_add(ns, Ordering::Relaxed);
        super::cost::record(ns);
    }
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
#[link_section = "igprof_hot"]
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
#[link_section = "igprof_hot"]
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

#[link_section = "igprof_hot"]
fn sample(g: &Guard, uc: *mut libc::c_void, k: u64) {
    let t = g.state();
    // SAFETY: uc is the context the kernel gave our handler (`handler`),
    // on this thread.
    let node = unsafe { interrupted_node(g, uc) };
    if !node.is_null() {
        t.sampler.last_sample.store(node, Ordering::Release);
        // SAFETY: node is a live node of this tree.
        charge(unsafe { &*node }, k);
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
