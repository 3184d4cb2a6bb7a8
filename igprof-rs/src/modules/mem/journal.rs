//! The journal's records: from a snapshot near the memory limit on, each
//! allocation and free, descriptor opened and closed, and sample's PERF
//! ticks also goes to `PROFILE.journal`, a file mapped `MAP_SHARED`, so
//! that the counts between that snapshot and an OOM kill outlive the
//! process (the written pages belong to the file's page cache).
//! igprof-analyse applies the journal to the snapshot. The file,
//! its header and module table are made by `output::journal`; the layout
//! is `igprof_format::journal`'s.
//!
//! Owns: the journal in use and the one being made while a snapshot is
//! written ([`begin_next`], [`promote`], [`abandon_next`], [`close`]):
//! between the two, the hooks append to both, so that the changes made
//! during the snapshot's write are in the journal that follows it (the
//! snapshot reads the counters at its start, and its write may last
//! seconds under memory pressure, while other threads allocate). Also the
//! appends of the hooks ([`alloc`], [`free`], [`restore`]) and the sets
//! of nodes whose stack each journal already holds.
//!
//! Must never: allocate, lock, make a system call or write outside a
//! mapping's record area in an append (the sampling handler appends too);
//! cost a hook more than one load while no journal is open.

use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use igprof_format::journal::{self as layout, SLOT_WORDS};

use crate::base::tree::Node;

/// The journal in use and the next one (their first word), or null.
static MAP: AtomicPtr<u64> = AtomicPtr::new(null_mut());
static NEXT: AtomicPtr<u64> = AtomicPtr::new(null_mut());
/// How many of the two are set: the hooks' one load.
static OPEN: AtomicU32 = AtomicU32::new(0);
/// Hooks inside an append: a mapping taken out is unmapped only at 0.
static WRITERS: AtomicU32 = AtomicU32::new(0);
/// Header word holding the journal's generation, which tags [`SEEN`].
pub const W_GENERATION: usize = layout::W_RECORDS_AT + 1;

/// Nodes whose stack a journal holds, tagged with its generation in the
/// top byte; one table per parity of the generation, so that the journal
/// in use and the next one do not evict each other's entries (a
/// direct-mapped cache: a miss writes the stack once more, which the
/// reader takes as the same stack).
const SEEN_SLOTS: usize = 4096;
static SEEN: [[AtomicUsize; SEEN_SLOTS]; 2] =
    [const { [const { AtomicUsize::new(0) }; SEEN_SLOTS] }; 2];

/// Whether a journal is open (one relaxed load, for the hooks).
#[inline(always)]
pub fn on() -> bool {
    OPEN.load(Ordering::Relaxed) != 0
}

pub use layout::Family;

/// An allocation at `addr` by `node`'s stack (a descriptor `addr` of the
/// descriptor profiler): `calls` and `bytes` it counts for, `largest`
/// for MEM_MAX.
pub fn alloc(family: Family, node: *const Node, addr: usize, calls: u64, bytes: u64, largest: u64) {
    let kind = layout::ALLOC | family.code() << 8;
    append(node, [kind, addr as u64, calls, bytes, largest]);
}

/// A free of the block at `addr` (a close of descriptor `addr`) that
/// `node`'s stack allocated.
pub fn free(family: Family, node: *const Node, addr: usize, calls: u64, bytes: u64) {
    append(
        node,
        [
            layout::FREE | family.code() << 8,
            addr as u64,
            calls,
            bytes,
            0,
        ],
    );
}

/// The block at `addr` given back to `node`'s stack (a failed realloc).
pub fn restore(node: *const Node, addr: usize, calls: u64, bytes: u64) {
    append(node, [layout::RESTORE, addr as u64, calls, bytes, 0]);
}

/// `ticks` PERF ticks worth `value` charged to `node` (the sampling
/// handler: nothing here locks or allocates).
pub fn ticks(node: *const Node, ticks: u64, value: u64) {
    append(node, [layout::TICKS, ticks, value, 0, 0]);
}

/// Makes `map` the next journal: the hooks write to it too from now on.
///
/// # Safety
/// `map` is a writable mapping laid out as `igprof_format::journal` says
/// (header and module table written), owned by the journal from now on.
pub unsafe fn begin_next(map: *mut u64) {
    let old = NEXT.swap(map, Ordering::SeqCst);
    debug_assert!(old.is_null());
    OPEN.fetch_add(1, Ordering::SeqCst);
}

/// The next journal becomes the one in use; the one it replaces goes.
pub fn promote() {
    let next = NEXT.swap(null_mut(), Ordering::SeqCst);
    if next.is_null() {
        return;
    }
    let old = MAP.swap(next, Ordering::SeqCst);
    if !old.is_null() {
        OPEN.fetch_sub(1, Ordering::SeqCst);
        drop_when_unused(old);
    }
}

/// The next journal goes (its snapshot was not written).
pub fn abandon_next() {
    let next = NEXT.swap(null_mut(), Ordering::SeqCst);
    if !next.is_null() {
        OPEN.fetch_sub(1, Ordering::SeqCst);
        drop_when_unused(next);
    }
}

/// No journal any more (the final profile is written).
pub fn close() {
    abandon_next();
    let old = MAP.swap(null_mut(), Ordering::SeqCst);
    if !old.is_null() {
        OPEN.fetch_sub(1, Ordering::SeqCst);
        drop_when_unused(old);
    }
}

/// Unmaps a journal taken out of use once no hook writes to it; left
/// mapped when one still does after 100 ms.
fn drop_when_unused(m: *mut u64) {
    let deadline = crate::sys::monotonic_ns() + 100_000_000;
    while WRITERS.load(Ordering::SeqCst) != 0 {
        if crate::sys::monotonic_ns() > deadline {
            return;
        }
        crate::sys::sleep_ns(100_000);
    }
    // SAFETY: a journal's header words; no hook holds it (WRITERS was 0
    // after it was taken out).
    unsafe {
        let len = header(m, layout::W_RECORDS_AT).load(Ordering::Relaxed) as usize
            + header(m, layout::W_CAPACITY).load(Ordering::Relaxed) as usize * layout::SLOT_BYTES;
        crate::sys::munmap(m as *mut u8, len);
    }
}

/// In a fork child (its own memory, one thread): the parent's journals
/// are not the child's to write; their mappings go, and a count of the
/// parent's other threads inside an append with them.
pub fn reset_after_fork() {
    WRITERS.store(0, Ordering::Relaxed);
    OPEN.store(0, Ordering::Relaxed);
    for m in [
        MAP.swap(null_mut(), Ordering::Relaxed),
        NEXT.swap(null_mut(), Ordering::Relaxed),
    ] {
        if !m.is_null() {
            drop_when_unused(m);
        }
    }
}

fn append(node: *const Node, w: [u64; 5]) {
    WRITERS.fetch_add(1, Ordering::SeqCst);
    for m in [MAP.load(Ordering::SeqCst), NEXT.load(Ordering::SeqCst)] {
        if m.is_null() {
            continue;
        }
        // SAFETY: `m` stays mapped while WRITERS counts this append
        // (drop_when_unused); nodes are never freed.
        unsafe {
            note_path(m, node);
            if let Some(s) = reserve(m, 1) {
                let body = [node as u64, w[1], w[2], w[3], w[4], 0, 0];
                publish(s, w[0], &body);
            }
        }
    }
    WRITERS.fetch_sub(1, Ordering::SeqCst);
}

/// The header word `i` of the journal at `m`, as an atomic.
///
/// # Safety
/// `m` is a live journal mapping.
pub(crate) unsafe fn header(m: *mut u64, i: usize) -> &'static AtomicU64 {
    // SAFETY: the header lies inside the mapping; words are 8-aligned.
    unsafe { &*(m.add(i) as *const AtomicU64) }
}

/// `n` consecutive slots of the record area, or None when they do not fit
/// (the cursor, past the capacity, then counts them as dropped).
///
/// # Safety
/// `m` is a live journal mapping.
unsafe fn reserve(m: *mut u64, n: u64) -> Option<*mut u64> {
    // SAFETY: header words of a live mapping.
    let (cap, at) = unsafe {
        (
            header(m, layout::W_CAPACITY).load(Ordering::Relaxed),
            header(m, layout::W_RECORDS_AT).load(Ordering::Relaxed) as usize,
        )
    };
    // SAFETY: as above.
    let first = unsafe { header(m, layout::W_CURSOR) }.fetch_add(n, Ordering::Relaxed);
    if first + n > cap {
        return None;
    }
    // SAFETY: slots first..first+n lie within the capacity, inside the mapping.
    Some(unsafe { m.add(at / 8 + first as usize * SLOT_WORDS) })
}

/// Writes a slot's body, then its first word (`hdr`) last: a reader of a
/// slot its writer died in finds kind 0.
///
/// # Safety
/// `s` is a reserved slot.
unsafe fn publish(s: *mut u64, hdr: u64, body: &[u64; SLOT_WORDS - 1]) {
    for (k, &v) in body.iter().enumerate() {
        // SAFETY: word k+1 of the slot.
        unsafe { s.add(k + 1).write_volatile(v) };
    }
    // SAFETY: word 0 of the slot, 8-aligned.
    unsafe { (*(s as *const AtomicU64)).store(hdr, Ordering::Release) };
}

/// Writes `node`'s stack unless this journal has it.
///
/// # Safety
/// `m` is a live journal mapping; `node` a published tree node.
unsafe fn note_path(m: *mut u64, node: *const Node) {
    // SAFETY: a header word.
    let generation = unsafe { header(m, W_GENERATION) }.load(Ordering::Relaxed) as usize;
    let tag = (node as usize & ((1 << 56) - 1)) | (generation << 56);
    let at = (node as usize >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52;
    let slot = &SEEN[generation & 1][at % SEEN_SLOTS];
    if slot.load(Ordering::Acquire) == tag {
        return;
    }
    let depth = frames(node).count().min(0xff_ffff);
    let n = layout::path_slots(depth);
    // SAFETY: a live mapping.
    let Some(first) = (unsafe { reserve(m, n as u64) }) else {
        return;
    };
    let mut it = frames(node).take(depth);
    for k in 0..n {
        let mut body = [0u64; SLOT_WORDS - 1];
        let (hdr, from) = if k == 0 {
            body[0] = node as u64;
            (layout::PATH | (depth as u64) << 8, 1)
        } else {
            (layout::CONT, 0)
        };
        for (b, a) in body[from..].iter_mut().zip(&mut it) {
            *b = a;
        }
        // SAFETY: slot k of the n reserved.
        unsafe { publish(first.add(k * SLOT_WORDS), hdr, &body) };
    }
    slot.store(tag, Ordering::Release);
}

/// `node`'s stack, innermost first, without the root (the node without a
/// parent).
fn frames(mut n: *const Node) -> impl Iterator<Item = u64> {
    core::iter::from_fn(move || {
        // SAFETY: tree nodes are never freed; a parent is published before
        // its children.
        let nd = unsafe { n.as_ref()? };
        if nd.parent.is_null() {
            return None;
        }
        n = nd.parent;
        Some(nd.addr as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::counters::{self, CounterId};
    use crate::base::tree::CallTree;
    use igprof_format::journal::{Change, Journal};

    /// A journal of `slots` record slots in anonymous memory, as
    /// `output::journal` lays one out (no module table).
    fn mapping(slots: usize, generation: u64) -> (*mut u64, usize) {
        let len = layout::HEADER_BYTES + slots * layout::SLOT_BYTES;
        let m = crate::sys::mmap_anon(len) as *mut u64;
        assert!(!m.is_null());
        let words = [
            (layout::W_MAGIC, layout::MAGIC),
            (layout::W_CAPACITY, slots as u64),
            (layout::W_MODULES_AT, layout::HEADER_BYTES as u64),
            (layout::W_RECORDS_AT, layout::HEADER_BYTES as u64),
            (W_GENERATION, generation),
        ];
        for (i, v) in words {
            // SAFETY: header words of the fresh mapping.
            unsafe { m.add(i).write(v) };
        }
        (m, len)
    }

    fn read(m: *mut u64, len: usize) -> Journal {
        // SAFETY: the mapping's bytes (a copy taken while no hook writes).
        let bytes = unsafe { core::slice::from_raw_parts(m as *const u8, len) }.to_vec();
        Journal::parse(&bytes).unwrap()
    }

    #[test]
    fn deep_stacks_are_written_once_per_journal_and_read_back_whole() {
        let _g = counters::TEST_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counters::reset_for_test();
        counters::enable(CounterId::MemLive);
        let mut t = CallTree::new();
        // 20 frames, innermost first: a PATH slot and two continuations.
        let stack: Vec<usize> = (0..20).map(|i| 0x1000 + i * 0x10).collect();
        let node = t.node_for(&stack, false);
        let key = node as u64;
        let mine = |j: &Journal| -> Vec<Change> {
            j.changes
                .iter()
                .filter(|c| c.0 == key)
                .map(|c| c.1)
                .collect()
        };
        let (m, len) = mapping(64, 1);
        // SAFETY: laid out as the format says; the journal's from now on.
        unsafe { begin_next(m) };
        promote();
        alloc(Family::Memory, node, 0x500, 1, 100, 100);
        // A next journal (generation 2) while a snapshot is written: both
        // get the free, the next one its stack too.
        let (m2, len2) = mapping(5, 2);
        // SAFETY: as above.
        unsafe { begin_next(m2) };
        free(Family::Memory, node, 0x500, 1, 100);
        restore(node, 0x600, 1, 8);
        let j = read(m, len);
        assert_eq!(
            j.paths[&key],
            stack.iter().map(|&a| a as u64).collect::<Vec<_>>()
        );
        assert_eq!(
            mine(&j),
            [
                Change::Alloc {
                    family: Family::Memory,
                    addr: 0x500,
                    calls: 1,
                    bytes: 100,
                    largest: 100
                },
                Change::Free {
                    family: Family::Memory,
                    addr: 0x500,
                    calls: 1,
                    bytes: 100
                },
                Change::Restore {
                    family: Family::Memory,
                    addr: 0x600,
                    calls: 1,
                    bytes: 8
                }
            ]
        );
        assert_eq!(j.unfinished, 0);
        // The next journal becomes the one in use; it is 3 slots of stack
        // and 2 of changes full: one more does not fit.
        promote();
        ticks(node, 3, 3);
        let j = read(m2, len2);
        assert_eq!(j.paths[&key].len(), 20);
        assert_eq!(mine(&j).len(), 2);
        assert_eq!(j.dropped, 1);
        close();
        assert!(!on());
    }
}
