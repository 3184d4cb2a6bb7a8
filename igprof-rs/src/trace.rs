//! The runtime's view of stack tracing: one call per sample or hook event,
//! independent of how the unwinder works.
//!
//! Owns the adapter between the runtime and the `unwind` module (helper
//! "unwind"). Until its `ThreadUnwinder` lands this walks frame pointers
//! with every read bounded by the thread's stack, which is only correct for
//! code built with frame pointers.
//!
//! Must never: allocate, lock, or read memory outside the thread's stack.

use crate::thread::ThreadState;

/// A finished walk: `depth` valid entries, and whether frames remained.
#[derive(Clone, Copy, Debug)]
pub struct Walk {
    pub depth: usize,
    pub truncated: bool,
}

/// Stack trace of the context a signal interrupted. `out[0]` is the PC.
///
/// # Safety
/// `uc` must be the `ucontext_t` passed to an SA_SIGINFO handler running on
/// the thread that owns `ts`.
pub unsafe fn from_ucontext(ts: &ThreadState, uc: *const libc::c_void, out: &mut [usize]) -> Walk {
    let uc = &*(uc as *const libc::ucontext_t);
    #[cfg(target_arch = "x86_64")]
    let (pc, fp) = (
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize,
        uc.uc_mcontext.gregs[libc::REG_RBP as usize] as usize,
    );
    #[cfg(target_arch = "aarch64")]
    let (pc, fp) = (uc.uc_mcontext.pc as usize, uc.uc_mcontext.regs[29] as usize);
    walk_frame_pointers(ts, pc, fp, out)
}

fn walk_frame_pointers(ts: &ThreadState, pc: usize, mut fp: usize, out: &mut [usize]) -> Walk {
    if out.is_empty() {
        return Walk {
            depth: 0,
            truncated: true,
        };
    }
    out[0] = pc;
    let mut n = 1;
    let (lo, hi) = (ts.stack_lo, ts.stack_hi);
    loop {
        // The frame record is [saved fp, return address] at fp.
        if fp < lo || fp.checked_add(16).is_none_or(|e| e > hi) || fp % 8 != 0 {
            return Walk {
                depth: n,
                truncated: false,
            };
        }
        // SAFETY: fp..fp+16 lies inside this thread's mapped stack.
        let (next, ra) = unsafe { (*(fp as *const usize), *((fp + 8) as *const usize)) };
        if ra == 0 {
            return Walk {
                depth: n,
                truncated: false,
            };
        }
        if n == out.len() {
            return Walk {
                depth: n,
                truncated: true,
            };
        }
        out[n] = ra;
        n += 1;
        if next <= fp {
            return Walk {
                depth: n,
                truncated: false,
            };
        }
        fp = next;
    }
}

/// dlopen/dlclose happened: refresh the unwinder's module tables.
pub fn modules_changed() {}
