//! A thread's record of its events: one zero-filled page of its own
//! (what each event is held by, its period and counts, the -pf counting
//! group, the -c groups), made when the thread opens its events, and the
//! reads of it that any context may do (which events are held, their
//! fasync descriptors, what a frequency event counted since its previous
//! sample).
//!
//! Must never: allocate or lock in the readers (signal context), or free
//! a record while its thread state exists.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use super::table::MAX_EVENTS;
use super::{count, userpage};
use crate::base::thread::ThreadState;
use crate::sys;

/// A thread's events (one page of its own, zero-filled: nothing held).
#[repr(C)]
pub(super) struct PerThread {
    /// The mapping that holds each event (0: none).
    pub(super) hold: [AtomicUsize; MAX_EVENTS],
    /// Its descriptor + 1 where it could not be held by a mapping (0: none).
    pub(super) fd: [AtomicI32; MAX_EVENTS],
    /// Its ring where it signals through fasync (0: none; its descriptor
    /// is kept then: the signal names it).
    pub(super) ring: [AtomicUsize; MAX_EVENTS],
    /// The period each event samples with now.
    pub(super) period: [AtomicU64; MAX_EVENTS],
    /// Samples since the period was drawn.
    pub(super) since: [AtomicU32; MAX_EVENTS],
    /// With a frequency: the event's count at its previous sample, and the
    /// node of that sample (where the count after it goes at the end).
    pub(super) counted: [AtomicU64; MAX_EVENTS],
    pub(super) last_node: [core::sync::atomic::AtomicPtr<crate::base::tree::Node>; MAX_EVENTS],
    /// The events held, one bit per index.
    pub(super) held: AtomicU8,
    /// -oc: wall-clock and thread CPU time at the thread's previous switch
    /// back onto the CPU (ns).
    pub(super) wall_mark: AtomicU64,
    pub(super) cpu_mark: AtomicU64,
    /// -c: the thread's counting groups.
    pub(super) count: count::PerThread,
    /// The registers' fingerprint at the previous sample of a fault event.
    pub(super) fault_regs: AtomicU64,
    /// -pf: a counting group of page faults and major faults (leader's
    /// descriptor + 1, 0: none; its member's), and their counts at the
    /// previous read.
    pub(super) fault_fd: AtomicI32,
    pub(super) major_fd: AtomicI32,
    pub(super) faults: AtomicU64,
    pub(super) majors: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<PerThread>() <= 4096);

/// The thread's record, made on first use (not in signal context).
pub(super) fn record(t: &ThreadState) -> Option<&PerThread> {
    let mut p = t.events.load(Ordering::Acquire);
    if p.is_null() {
        p = sys::mmap_anon(4096);
        if p.is_null() {
            return None;
        }
        t.events.store(p, Ordering::Release);
    }
    // SAFETY: a zero-filled page of ours (a valid PerThread: all atomics
    // zero), never unmapped while the state exists.
    Some(unsafe { &*(p as *const PerThread) })
}

/// The record if the thread has one (any context).
pub(super) fn existing(t: &ThreadState) -> Option<&PerThread> {
    let p = t.events.load(Ordering::Acquire);
    // SAFETY: as in `record`.
    (!p.is_null()).then(|| unsafe { &*(p as *const PerThread) })
}

pub(super) fn held(t: &ThreadState) -> u8 {
    existing(t).map_or(0, |r| r.held.load(Ordering::Relaxed))
}

/// The descriptors of the thread's events that signal through fasync.
pub(super) fn fds(t: &ThreadState) -> [i32; MAX_EVENTS] {
    let mut v = [-1; MAX_EVENTS];
    if let Some(r) = existing(t) {
        for (i, f) in v.iter_mut().enumerate() {
            if r.ring[i].load(Ordering::Relaxed) != 0 {
                *f = r.fd[i].load(Ordering::Relaxed) - 1;
            }
        }
    }
    v
}

/// With a frequency: what event `i` counted since its previous sample
/// (rdpmc where its page allows, else read(2)), the kernel having chosen
/// the period.
/// `own`: called on the thread the event counts (rdpmc reads the calling
/// CPU's counters, so only then).
pub(super) fn counted_since(r: &PerThread, i: usize, own: bool) -> u64 {
    // The event's first page: its holding mapping's, or its ring's.
    let page = r.hold[i].load(Ordering::Relaxed) | r.ring[i].load(Ordering::Relaxed);
    let hold = if own { page } else { 0 };
    // SAFETY: the event's page, mapped by open_one on this thread, which
    // is the one it counts (we are in its own signal handler).
    let now = (hold != 0)
        .then(|| unsafe { userpage::read_now(hold as *const u8) })
        .flatten()
        .map(|got| got.count)
        .or_else(|| sys::perf_read_count(r.fd[i].load(Ordering::Relaxed) - 1));
    match now {
        Some(c) => c.saturating_sub(r.counted[i].swap(c, Ordering::Relaxed)),
        None => 0,
    }
}

/// The node a CPU sample landed on, if it could be stored (`node` not
/// null).
///
/// # Safety
/// `node` is null or a node of a thread's call tree (nodes are never freed,
/// so the reference stays valid for the life of the process).
pub(super) unsafe fn sampled_node(
    node: *mut crate::base::tree::Node,
) -> Option<&'static crate::base::tree::Node> {
    // SAFETY: guaranteed by the caller.
    unsafe { node.as_ref() }
}
