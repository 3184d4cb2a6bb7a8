//! IgProf's empty-memory profilers (-ep, -ei, -eu): how much of the memory
//! a program allocates it never uses.
//!
//! Semantics (igprof-rs; the counter is MEM_EMPTY, charged to the stack
//! that allocated the block, whichever thread frees it):
//!
//! - At every free (and at realloc, for the old block) the block's whole
//!   4 KiB pages are inspected: only pages lying entirely inside the block
//!   count, partial pages at its ends never do. A block with at least one
//!   counted page adds one call and the counted pages' bytes.
//! - `-ep`: a page counts when it is still all zero bytes. Fresh memory from
//!   the kernel is zero, recycled heap memory usually is not, so this finds
//!   big allocations whose pages were never written.
//! - `-ei`: new blocks are first filled with the byte 0xa5, and a page
//!   counts when it is all zeros at free: memory the program initialised
//!   to zero and never put anything else in (zero-initialisation it did
//!   not need, or data that stayed empty), whatever the allocator recycled.
//! - `-eu`: new blocks are first filled with the byte 0xa5, and a page
//!   counts when it still holds only that pattern: pages the program never
//!   wrote at all (a page it cleared to zero is "used").
//!
//! calloc'd and realloc'd blocks are never filled (their contents are the
//! program's), so under -ei/-eu they count as under -ep for zero pages.
//! Blocks still live at exit are not inspected.
//!
//! Must never: read outside the block, allocate, or lock.

use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::base::counters::{self, CounterId};
use crate::base::live::Block;
use crate::base::options::EmptyMode;

const PAGE: usize = 4096;
const PATTERN: u8 = 0xa5;

/// 0 = off, 1 = -ep, 2 = -ei, 3 = -eu.
static MODE: AtomicU8 = AtomicU8::new(0);
static SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Enables MEM_EMPTY when an empty-memory profiler was asked for.
pub fn register_counters() {
    if let Some(m) = crate::base::options::get().empty {
        counters::enable(CounterId::MemEmpty);
        MODE.store(
            match m {
                EmptyMode::Ep => 1,
                EmptyMode::Ei => 2,
                EmptyMode::Eu => 3,
            },
            Ordering::Relaxed,
        );
    }
}

pub fn init_slots() {
    if let Some(s) = counters::slot(CounterId::MemEmpty) {
        SLOT.store(s, Ordering::Relaxed);
    }
}

#[inline]
pub fn active() -> bool {
    MODE.load(Ordering::Relaxed) != 0
}

/// The byte value a counted page holds in this mode (zero for -ep and
/// -ei, the fill pattern for -eu).
fn untouched_byte() -> u8 {
    if MODE.load(Ordering::Relaxed) == 3 {
        PATTERN
    } else {
        0
    }
}

/// -ei/-eu: fills a new block with the pattern (malloc family, not
/// calloc/realloc).
pub fn fill(addr: usize, size: usize) {
    if MODE.load(Ordering::Relaxed) >= 2 {
        // SAFETY: [addr, addr+size) is the block the allocator just returned.
        unsafe { core::ptr::write_bytes(addr as *mut u8, PATTERN, size) };
    }
}

/// Bytes of the whole pages inside [addr, addr+size) holding only `byte`.
pub fn untouched_bytes(addr: usize, size: usize, byte: u8) -> u64 {
    let first = (addr + PAGE - 1) & !(PAGE - 1);
    let end = (addr + size) & !(PAGE - 1);
    let word = usize::from_ne_bytes([byte; core::mem::size_of::<usize>()]);
    let mut n = 0u64;
    let mut p = first;
    while p + PAGE <= end {
        // SAFETY: the page lies inside the live block (checked above) and
        // is aligned for usize reads.
        let page = unsafe {
            core::slice::from_raw_parts(p as *const usize, PAGE / core::mem::size_of::<usize>())
        };
        if page.iter().all(|&w| w == word) {
            n += PAGE as u64;
        }
        p += PAGE;
    }
    n
}

/// A block is being freed: charges its untouched pages to its stack.
pub fn on_free(b: &Block) {
    let slot = SLOT.load(Ordering::Relaxed);
    let size = super::epoch::bytes(b.size);
    if slot == usize::MAX || size < PAGE as u64 {
        return;
    }
    let n = untouched_bytes(b.addr, size as usize, untouched_byte());
    if n > 0 {
        // SAFETY: nodes are never freed; slot is an enabled counter.
        unsafe { &*b.node }.counter(slot).tick_shared(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_whole_pages_with_the_byte() {
        let mut v = vec![0u8; 6 * PAGE];
        let base = v.as_mut_ptr() as usize;
        let start = ((base + PAGE - 1) & !(PAGE - 1)) + 100; // not page-aligned
        let off = start - base;
        // Block of 4 pages + 100 bytes starting 100 bytes into a page: whole
        // pages inside it are the 2nd..4th (3 pages).
        let size = 4 * PAGE;
        assert_eq!(untouched_bytes(start, size, 0), 3 * PAGE as u64);
        // Touch one byte in the second whole page.
        v[off + (PAGE - 100) + PAGE + 7] = 1;
        assert_eq!(untouched_bytes(start, size, 0), 2 * PAGE as u64);
        // A pattern-filled region.
        v.iter_mut().for_each(|b| *b = PATTERN);
        assert_eq!(untouched_bytes(start, size, PATTERN), 3 * PAGE as u64);
        assert_eq!(untouched_bytes(start, size, 0), 0);
        assert_eq!(untouched_bytes(start, PAGE, 0), 0, "no whole page inside");
    }
}
