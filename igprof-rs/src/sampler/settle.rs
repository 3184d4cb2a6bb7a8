//! Samples that landed while the thread ran profiler code: they are the
//! program's time, and are charged to the program's stack as the thread
//! leaves the profiler ([`settle_pending`], the runtime's leave hook).
//!
//! Must never: run outside the owning thread's guard, or charge a
//! profiler frame (the walk starts at the program code that called in).

use core::sync::atomic::Ordering;

use super::ticks::tick_slot;
use crate::base::thread::ThreadState;

/// Charges the samples that landed while the thread was inside profiler
/// code to the stack of the program code that called into it (profiler
/// frames skipped). Called as profiler code is left, guard still held.
#[inline]
pub fn settle_pending(t: &'static ThreadState) {
    if t.sampler.clock.pending_ticks.get() != 0 {
        settle_slow(t);
    }
}

#[cold]
#[inline(never)]
fn settle_slow(t: &'static ThreadState) {
    // A sample taken meanwhile adds to the pending ticks again: a few rounds at most.
    for _ in 0..4 {
        let k = t.sampler.clock.pending_ticks.replace(0);
        if k == 0 {
            return;
        }
        // SAFETY: the owning thread, still inside its guard.
        let buf = unsafe { t.trace_buf() };
        let walk = crate::base::trace::here(t, buf);
        t.stats.samples.fetch_add(1, Ordering::Relaxed);
        if walk.refused {
            t.stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // SAFETY: owner thread, guard held.
        let node = unsafe { t.tree_mut() }.node_for(&buf[..walk.depth], walk.truncated);
        let slot = tick_slot();
        if node.is_null() {
            t.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else if slot != usize::MAX {
            // SAFETY: node is a live node of this tree.
            unsafe { &*node }.counter(slot).add(k, k);
        }
    }
}
