//! The live-range table of `-mm`: the program's anonymous mappings that
//! are still mapped, each with the call-tree node charged for it.
//!
//! Owns a sorted array of disjoint `[start, end)` ranges in memory of its
//! own (one anonymous mapping made by raw system call at start-up, touched
//! page by page as it fills) and a spin lock around it. Removing an address
//! range cuts what overlaps it: a whole range goes, a head or tail is
//! trimmed, a hole in the middle splits one range into two. Every change
//! is reported to the caller (node, bytes, change in the number of ranges)
//! so that it can keep MMAP_LIVE equal to what the table holds.
//!
//! Must never: allocate, call libc's mmap or munmap (they are hooked), or
//! be entered by a signal handler that interrupted its holder on the same
//! thread (callers hold the thread's "recording" mark, so such a handler
//! defers its event instead: `site::event`, `site::unrecorded`).

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::base::tree::Node;

/// One live mapping (or what is left of it).
#[derive(Clone, Copy)]
pub struct Range {
    pub start: usize,
    pub end: usize,
    pub node: *mut Node,
}

/// Ranges the table can hold: well above the kernel's default limit on a
/// process's mappings (vm.max_map_count, 65530).
pub const CAPACITY: usize = 1 << 18;

/// The table could not take a range (no memory at start-up, or full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// What a removal did to one range's owner: `bytes` unmapped, and the
/// number of ranges it has changed by `pieces` (-1: gone, +1: split).
pub type Released<'a> = &'a mut dyn FnMut(*mut Node, usize, i64);

struct Inner {
    base: *mut Range,
    len: usize,
}

/// The table (one per process).
pub struct Ranges {
    lock: AtomicBool,
    inner: UnsafeCell<Inner>,
}

// SAFETY: `inner` is only read or written with `lock` held.
unsafe impl Sync for Ranges {}

impl Ranges {
    pub const fn new() -> Self {
        Ranges {
            lock: AtomicBool::new(false),
            inner: UnsafeCell::new(Inner {
                base: core::ptr::null_mut(),
                len: 0,
            }),
        }
    }

    /// Maps the table's memory (start-up, once).
    pub fn init(&self) -> Result<(), Full> {
        let p = crate::sys::mmap_anon(CAPACITY * core::mem::size_of::<Range>()) as *mut Range;
        if p.is_null() {
            return Err(Full);
        }
        self.with(|t| t.base = p);
        Ok(())
    }

    /// Forgets every range (a fork child whose profile starts empty; its
    /// only thread may have been forked while another held the lock).
    pub fn reset(&self) {
        self.lock.store(false, Ordering::Release);
        self.with(|t| t.len = 0);
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        crate::sys::spin_lock(&self.lock);
        // SAFETY: the lock is held: no other reference to inner exists.
        let r = f(unsafe { &mut *self.inner.get() });
        self.lock.store(false, Ordering::Release);
        r
    }

    /// Removes `[start, end)` from every range it overlaps.
    pub fn remove(&self, start: usize, end: usize, released: Released) {
        self.with(|t| t.remove(start, end, released));
    }

    /// Adds `[start, end)` for `node`, first removing whatever overlaps it.
    pub fn insert(
        &self,
        start: usize,
        end: usize,
        node: *mut Node,
        released: Released,
    ) -> Result<(), Full> {
        self.with(|t| {
            t.remove(start, end, released);
            t.insert_at(start, end, node)
        })
    }

    /// Moves a mapping: removes `[old, old_end)`, and when any of it was in
    /// the table (or, for an `old_end == old` duplicate of a shared
    /// mapping, when `old` is), adds `[new, new_end)` for `node()`. Returns
    /// whether it did.
    pub fn replace(
        &self,
        (old, old_end): (usize, usize),
        (new, new_end): (usize, usize),
        node: impl FnOnce() -> *mut Node,
        released: Released,
    ) -> Result<bool, Full> {
        self.with(|t| {
            let tracked = if old_end > old {
                let mut any = false;
                t.remove(old, old_end, &mut |n, b, p| {
                    any = true;
                    released(n, b, p)
                });
                any
            } else {
                t.containing(old).is_some()
            };
            if !tracked {
                return Ok(false);
            }
            let n = node();
            if n.is_null() {
                return Ok(false);
            }
            t.remove(new, new_end, released);
            t.insert_at(new, new_end, n).map(|_| true)
        })
    }

    /// Visits every range: `f(node, start, length)`.
    pub fn for_each(&self, f: &mut dyn FnMut(*mut Node, usize, usize)) {
        self.with(|t| {
            for r in t.slice() {
                f(r.node, r.start, r.end - r.start)
            }
        })
    }
}

impl Default for Ranges {
    fn default() -> Self {
        Self::new()
    }
}

impl Inner {
    fn slice(&mut self) -> &mut [Range] {
        if self.base.is_null() {
            return &mut [];
        }
        // SAFETY: base holds CAPACITY ranges, the first len initialised.
        unsafe { core::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// Index of the first range that ends after `addr`.
    fn first_ending_after(&mut self, addr: usize) -> usize {
        self.slice().partition_point(|r| r.end <= addr)
    }

    fn containing(&mut self, addr: usize) -> Option<usize> {
        let i = self.first_ending_after(addr);
        (i < self.len && self.slice()[i].start <= addr).then_some(i)
    }

    fn insert_at(&mut self, start: usize, end: usize, node: *mut Node) -> Result<(), Full> {
        if self.base.is_null() || self.len == CAPACITY {
            return Err(Full);
        }
        let i = self.first_ending_after(start);
        // SAFETY: i <= len < CAPACITY: the ranges from i move up by one
        // within the mapping, and slot i is then written.
        unsafe {
            core::ptr::copy(self.base.add(i), self.base.add(i + 1), self.len - i);
            self.base.add(i).write(Range { start, end, node });
        }
        self.len += 1;
        Ok(())
    }

    fn remove_at(&mut self, i: usize) {
        // SAFETY: i < len: the ranges after i move down by one.
        unsafe { core::ptr::copy(self.base.add(i + 1), self.base.add(i), self.len - i - 1) };
        self.len -= 1;
    }

    fn remove(&mut self, start: usize, end: usize, released: Released) {
        if start >= end {
            return;
        }
        let mut i = self.first_ending_after(start);
        while i < self.len {
            let r = self.slice()[i];
            if r.start >= end {
                break;
            }
            let (lo, hi) = (r.start.max(start), r.end.min(end));
            let bytes = hi - lo;
            if lo == r.start && hi == r.end {
                self.remove_at(i);
                released(r.node, bytes, -1);
                continue;
            }
            if lo == r.start {
                self.slice()[i].start = hi;
                released(r.node, bytes, 0);
            } else if hi == r.end {
                self.slice()[i].end = lo;
                released(r.node, bytes, 0);
            } else {
                // A hole: the range keeps its head, and its tail becomes a
                // range of its own (or, with the table full, is dropped
                // with the hole, so the counters still match the table).
                self.slice()[i].end = lo;
                if self.insert_at(hi, r.end, r.node).is_ok() {
                    released(r.node, bytes, 1);
                } else {
                    released(r.node, r.end - lo, 0);
                }
                return;
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: usize) -> *mut Node {
        (0x1000 * i) as *mut Node
    }

    fn table() -> Ranges {
        let t = Ranges::new();
        t.init().unwrap();
        t
    }

    fn ranges(t: &Ranges) -> Vec<(usize, usize, usize)> {
        let mut v = Vec::new();
        t.for_each(&mut |n, s, l| v.push((n as usize / 0x1000, s, s + l)));
        v
    }

    fn release_log(t: &Ranges, s: usize, e: usize) -> Vec<(usize, usize, i64)> {
        let mut v = Vec::new();
        t.remove(s, e, &mut |n, b, p| v.push((n as usize / 0x1000, b, p)));
        v
    }

    #[test]
    fn unmaps_cut_heads_tails_holes_and_spans() {
        let t = table();
        let mut none = |_: *mut Node, _: usize, _: i64| panic!("nothing overlaps");
        t.insert(100, 200, node(1), &mut none).unwrap();
        t.insert(300, 400, node(2), &mut none).unwrap();
        assert_eq!(release_log(&t, 100, 120), vec![(1, 20, 0)], "head");
        assert_eq!(release_log(&t, 180, 200), vec![(1, 20, 0)], "tail");
        assert_eq!(release_log(&t, 140, 150), vec![(1, 10, 1)], "hole");
        assert_eq!(
            ranges(&t),
            vec![(1, 120, 140), (1, 150, 180), (2, 300, 400)]
        );
        assert_eq!(
            release_log(&t, 130, 350),
            vec![(1, 10, 0), (1, 30, -1), (2, 50, 0)],
            "a span over three ranges and the gaps between them"
        );
        assert_eq!(ranges(&t), vec![(1, 120, 130), (2, 350, 400)]);
        assert_eq!(release_log(&t, 0, 1000), vec![(1, 10, -1), (2, 50, -1)]);
        assert!(ranges(&t).is_empty());
    }

    #[test]
    fn a_mapping_over_live_ranges_replaces_them() {
        let t = table();
        let mut none = |_: *mut Node, _: usize, _: i64| {};
        t.insert(100, 200, node(1), &mut none).unwrap();
        let mut log = Vec::new();
        t.insert(150, 250, node(2), &mut |n, b, p| {
            log.push((n as usize / 0x1000, b, p))
        })
        .unwrap();
        assert_eq!(log, vec![(1, 50, 0)]);
        assert_eq!(ranges(&t), vec![(1, 100, 150), (2, 150, 250)]);
    }

    #[test]
    fn a_move_carries_tracked_ranges_only() {
        let t = table();
        let mut none = |_: *mut Node, _: usize, _: i64| {};
        t.insert(100, 200, node(1), &mut none).unwrap();
        let moved = t.replace((500, 600), (700, 900), || node(3), &mut none);
        assert_eq!(moved, Ok(false), "not ours (a file mapping)");
        let moved = t.replace((100, 200), (700, 900), || node(3), &mut none);
        assert_eq!(moved, Ok(true));
        assert_eq!(ranges(&t), vec![(3, 700, 900)]);
        let grown = t.replace((700, 900), (700, 1000), || node(4), &mut none);
        assert_eq!(grown, Ok(true), "grown in place");
        assert_eq!(ranges(&t), vec![(4, 700, 1000)]);
    }
}
