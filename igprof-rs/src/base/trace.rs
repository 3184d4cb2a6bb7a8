//! The runtime's view of stack tracing: one call per sample or hook event.
//!
//! Owns the adapter between the runtime (thread states, depth limit,
//! dropped-sample accounting) and the `unwind` module,
//! which does the actual walk from cached frame descriptors and framehop.
//!
//! Must never: allocate, lock, or read memory outside the thread's stack
//! (the unwinder guarantees the latter for every read).

use crate::base::thread::ThreadState;
use crate::unwind::TraceEnd;

/// A finished walk: `depth` valid entries, whether frames remained beyond
/// the depth limit, and whether the walk was refused (re-entered).
#[derive(Clone, Copy, Debug)]
pub struct Walk {
    pub depth: usize,
    pub truncated: bool,
    pub refused: bool,
}

fn walk_of(t: crate::unwind::Trace) -> Walk {
    Walk {
        depth: t.depth,
        truncated: t.truncated(),
        refused: matches!(t.end, TraceEnd::Reentered | TraceEnd::NoModuleTable) && t.depth == 0,
    }
}

const NONE: Walk = Walk {
    depth: 0,
    truncated: false,
    refused: true,
};

/// Stack trace of the context a signal interrupted. `out[0]` is the PC, or,
/// when the signal interrupted the profiler's own code (a hook), the return
/// address into the program code that called it.
///
/// # Safety
/// `uc` must be the `ucontext_t` passed to an SA_SIGINFO handler running on
/// the thread that owns `ts`.
#[link_section = "igprof_hot"]
pub unsafe fn from_ucontext(ts: &ThreadState, uc: *const libc::c_void, out: &mut [usize]) -> Walk {
    let bounds = with_current_altstack(*ts.bounds);
    match &ts.unwinder {
        Some(u) => on_walk_stack(ts, || {
            // SAFETY: as the caller guarantees.
            walk_of(unsafe { u.trace_program_from_ucontext(uc, &bounds, out) })
        }),
        None => NONE,
    }
}

/// The thread's bounds, with the alternate signal stack it is running on
/// now if that is not the one known at thread start (a program may set one
/// up at any time). Our handler (and a hook) runs on the stack the code it
/// traces was on, so its own stack pointer tells. Signal-safe: one system
/// call, and only when running outside the known stacks.
fn with_current_altstack(mut b: crate::unwind::StackBounds) -> crate::unwind::StackBounds {
    let sp = crate::base::thread::stack_pointer();
    let within = |(lo, hi): (usize, usize)| lo <= sp && sp < hi;
    if within(b.stack) || within(b.altstack) {
        return b;
    }
    // SAFETY: a zeroed stack_t is a valid out-buffer; no new stack is set.
    let mut ss: libc::stack_t = unsafe { core::mem::zeroed() };
    let _e = crate::sys::ErrnoGuard::save();
    // SAFETY: sigaltstack with a null new stack only reads the current one.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sigaltstack,
            core::ptr::null::<libc::stack_t>(),
            &mut ss,
        )
    };
    if r == 0 && ss.ss_flags & libc::SS_ONSTACK != 0 {
        let lo = ss.ss_sp as usize;
        b.altstack = (lo, lo + ss.ss_size);
    }
    b
}

/// Stack trace of the code that called into the profiler (a hooked
/// function): the profiler's own frames are skipped, `out[0]` is the return
/// address into the caller of the hooked function.
#[inline(never)]
pub fn here(ts: &ThreadState, out: &mut [usize]) -> Walk {
    here_logged(ts, out, None)
}

/// [`here`], recording the stack words the walk reads into `log` (begun by
/// the caller; see `unwind::ReadLog`).
#[inline(never)]
#[link_section = "igprof_hot"]
pub fn here_logged(
    ts: &ThreadState,
    out: &mut [usize],
    log: Option<&crate::unwind::ReadLog>,
) -> Walk {
    let regs = crate::unwind::ThreadUnwinder::capture();
    let bounds = with_current_altstack(*ts.bounds);
    let w = match &ts.unwinder {
        Some(u) => on_walk_stack(ts, || {
            walk_of(u.trace_from_regs_logged(regs, &bounds, out, log))
        }),
        None => NONE,
    };
    // This frame, whose registers were captured, stays alive until the walk
    // is done.
    core::hint::black_box(&regs);
    w
}

/// Runs a walk on the thread's walk stack, so that what it needs (several
/// KiB to parse DWARF) never comes from the program's stack, which may be a
/// 16 KiB thread stack or a small alternate signal stack. A walk that is
/// already on it (a signal handler nested in one) goes on where it is.
fn on_walk_stack(ts: &ThreadState, f: impl FnOnce() -> Walk) -> Walk {
    let lo = ts.walk_stack;
    let sp = crate::base::thread::stack_pointer();
    if lo == 0 || (lo <= sp && sp < lo + crate::base::thread::WALK_STACK) {
        return f();
    }
    // SAFETY: the state's own mapping, used only by its owner thread, and
    // not in use (the thread is not on it, checked above).
    unsafe { crate::sys::run_on_stack(lo, crate::base::thread::WALK_STACK, f) }
}

/// Builds the unwinder's module table (start-up, after dlopen/dlclose).
pub fn modules_changed() {
    if let Err(e) = crate::unwind::refresh() {
        crate::igprof_log!("could not rebuild the module table for stack traces: {e}");
    }
}
