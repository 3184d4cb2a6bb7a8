//! Samples that landed while the thread ran profiler code: they are the
//! program's time, and are charged to the program's stack as the thread
//! leaves the profiler ([`settle_pending`], the runtime's leave hook).
//!
//! Must never: run outside the owning thread's guard, or charge a
//! profiler frame (the walk starts at the program code that called in).

use core::sync::atomic::Ordering;

use super::ticks::charge;
use crate::base::thread::Guard;

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
        if node.is_null() {
            t.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            // SAFETY: node is a live node of this tree.
            charge(unsafe { &*node }, k);
        }
    }
}
