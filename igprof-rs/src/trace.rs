//! The runtime's view of stack tracing: one call per sample or hook event.
//!
//! Owns the adapter between the runtime (thread states, depth limit,
//! dropped-sample accounting) and the `unwind` module (helper "unwind"),
//! which does the actual walk from cached frame descriptors and framehop.
//!
//! Must never: allocate, lock, or read memory outside the thread's stack
//! (the unwinder guarantees the latter for every read).

use crate::thread::ThreadState;
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
pub unsafe fn from_ucontext(ts: &ThreadState, uc: *const libc::c_void, out: &mut [usize]) -> Walk {
    match &ts.unwinder {
        Some(u) => walk_of(u.trace_program_from_ucontext(uc, &ts.bounds, out)),
        None => NONE,
    }
}

/// Stack trace of the code that called into the profiler (a hooked
/// function): the profiler's own frames are skipped, `out[0]` is the return
/// address into the caller of the hooked function.
#[inline(never)]
pub fn here(ts: &ThreadState, out: &mut [usize]) -> Walk {
    match &ts.unwinder {
        Some(u) => walk_of(u.trace_here(&ts.bounds, out)),
        None => NONE,
    }
}

/// Builds the unwinder's module table (start-up, after dlopen/dlclose).
pub fn modules_changed() {
    if let Err(e) = crate::unwind::refresh() {
        crate::igprof_log!("could not rebuild the module table for stack traces: {e}");
    }
}
