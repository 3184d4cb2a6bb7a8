//! Large live heap blocks by address range, for "which block holds this
//! address" (`-pf` with `-mp`: a page fault inside a block is charged to
//! the stack that allocated it, MEM_FAULTS; `-ibs` with `-mp`: a sampled
//! access, IBS_OBJ_*).
//!
//! The live table finds a block by its start only. Blocks of at least the
//! size given to [`enable`] are also kept here, sorted by start, and found
//! by a binary search: [`SPAN_MIN`] for page faults (the heap pages that
//! hold smaller blocks are first written by the allocator itself, a
//! chunk's header, so their faults say little about the block), and
//! [`SMALL_SPAN_MIN`] for IBS, whose smaller blocks are found from the
//! live table by `account::block_holding`.
//!
//! Owns the sorted array (one mapping, made when enabled; fixed capacity,
//! [`DROPPED`] counts the blocks that did not fit) and its spin lock.
//!
//! Must never: allocate, or wait for the lock held by the calling thread
//! (the hooks take it while the thread is marked as recording, and
//! [`owner_of`], called from signal handlers, does not look then).

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::base::tree::Node;

/// Smallest block kept for page faults (bytes).
pub const SPAN_MIN: u64 = 64 << 10;
/// Smallest block kept when any access may be asked about (IBS).
pub const SMALL_SPAN_MIN: u64 = 4 << 10;
/// Most blocks kept at once.
const CAPACITY: usize = 1 << 16;

#[derive(Clone, Copy)]
#[repr(C)]
struct Span {
    start: usize,
    end: usize,
    node: *const Node,
}

static ON: AtomicBool = AtomicBool::new(false);
/// Smallest block kept in this run.
static MIN: AtomicU64 = AtomicU64::new(SPAN_MIN);
static LOCK: AtomicBool = AtomicBool::new(false);
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Blocks not kept because the array was full.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Starts keeping blocks of at least `min` bytes (start-up, before any
/// hook runs; the smallest `min` asked for wins). False when no memory
/// could be mapped.
pub fn enable(min: u64) -> bool {
    MIN.store(MIN.load(Ordering::Relaxed).min(min), Ordering::Relaxed);
    if active() {
        return true;
    }
    let p = crate::sys::mmap_anon(CAPACITY * core::mem::size_of::<Span>());
    if p.is_null() {
        return false;
    }
    BASE.store(p as usize, Ordering::Release);
    ON.store(true, Ordering::Release);
    true
}

/// Whether large blocks are kept.
#[inline]
pub fn active() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Runs `f` on the sorted spans under the lock.
fn locked<R>(f: impl FnOnce(&mut [Span], &mut usize) -> R) -> R {
    crate::sys::spin_lock(&LOCK);
    // SAFETY: BASE is a mapping of CAPACITY spans (enable), zero-filled
    // plain data, only touched under LOCK.
    let all = unsafe {
        core::slice::from_raw_parts_mut(BASE.load(Ordering::Acquire) as *mut Span, CAPACITY)
    };
    let mut len = LEN.load(Ordering::Relaxed);
    let r = f(all, &mut len);
    LEN.store(len, Ordering::Relaxed);
    LOCK.store(false, Ordering::Release);
    r
}

/// The smallest block kept.
pub fn min() -> u64 {
    MIN.load(Ordering::Relaxed)
}

/// A live block of `size` bytes at `start`, allocated by `node`.
pub fn insert(start: usize, size: u64, node: *const Node) {
    if size < min() {
        return;
    }
    locked(|all, len| {
        if *len == CAPACITY {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let i = all[..*len].partition_point(|s| s.start < start);
        if i < *len && all[i].start == start {
            // Its free was not seen: the new block replaces it.
            all[i] = Span {
                start,
                end: start + size as usize,
                node,
            };
            return;
        }
        all.copy_within(i..*len, i + 1);
        all[i] = Span {
            start,
            end: start + size as usize,
            node,
        };
        *len += 1;
    });
}

/// Block `start` of `size` bytes left the live table.
pub fn remove(start: usize, size: u64) {
    if size < min() {
        return;
    }
    locked(|all, len| {
        let i = all[..*len].partition_point(|s| s.start < start);
        if i < *len && all[i].start == start {
            all.copy_within(i + 1..*len, i);
            *len -= 1;
        }
    });
}

/// Lookups not made because the calling thread was inside a memory hook
/// (a signal that interrupted it, which may hold the lock).
pub static BUSY: AtomicU64 = AtomicU64::new(0);

/// The allocating node of the large live block that holds `addr`. None
/// also when the calling thread is inside a memory hook (counted in
/// [`BUSY`]): a signal handler that interrupted the free path, which
/// takes this lock without the profiler's guard, must not wait for it.
pub fn owner_of(addr: usize) -> Option<*const Node> {
    if !active() {
        return None;
    }
    if super::site::recording() {
        BUSY.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    locked(|all, len| {
        let i = all[..*len].partition_point(|s| s.start <= addr);
        (i > 0 && addr < all[i - 1].end).then(|| all[i - 1].node)
    })
}

/// In a forked child: the parent's blocks are the parent's.
pub fn reset() {
    if active() {
        locked(|_, len| *len = 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_block_that_holds_an_address() {
        assert!(enable(SPAN_MIN));
        let n = |i: usize| i as *const Node;
        insert(0x10_0000, SPAN_MIN, n(1));
        insert(0x40_0000, 4 * SPAN_MIN, n(2));
        insert(0x20_0000, SPAN_MIN, n(3));
        insert(0x90_0000, SPAN_MIN - 1, n(4)); // too small: not kept
        assert_eq!(owner_of(0x10_0000), Some(n(1)));
        assert_eq!(owner_of(0x10_0000 + SPAN_MIN as usize - 1), Some(n(1)));
        assert_eq!(owner_of(0x10_0000 + SPAN_MIN as usize), None);
        assert_eq!(owner_of(0x20_8000), Some(n(3)));
        assert_eq!(owner_of(0x43_ffff), Some(n(2)));
        assert_eq!(owner_of(0x90_0000), None);
        assert_eq!(owner_of(0xf_ffff), None);
        remove(0x20_0000, SPAN_MIN);
        assert_eq!(owner_of(0x20_8000), None);
        assert_eq!(owner_of(0x43_ffff), Some(n(2)));
        insert(0x40_0000, SPAN_MIN, n(5)); // same start: replaced
        assert_eq!(owner_of(0x40_0000), Some(n(5)));
        assert_eq!(owner_of(0x43_ffff), None);
        reset();
        assert_eq!(owner_of(0x10_0000), None);
    }
}
