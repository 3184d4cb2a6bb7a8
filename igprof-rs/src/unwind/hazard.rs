//! Hazard slots: which module table each walk is reading, so that a
//! refresh frees a replaced table only once no walk can still be reading it.
//! (The slots hold the table's address only: any type of table will do.)
//!
//! Owns: the process-wide, lock-free, grow-only list of slots. A slot is
//! claimed by a `ThreadUnwinder` for its life (or briefly by `module_of`),
//! set while a walk reads a table and cleared after. Never allocates through
//! malloc (slots come in mmap'ed pages that are never unmapped), never
//! locks: claiming, protecting and clearing are async-signal-safe.
//!
//! Protocol (hazard pointers): a reader stores the table pointer in its
//! slot, then checks that the published pointer is still the same; the
//! writer swaps in the new table, then frees an old one only if no slot
//! holds it. All of it in SeqCst order, so a reader either sees the new
//! table or is seen by the writer.

use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use super::mem::{MapError, MmapSlice, Zeroable};

/// One reader's slot, on a cache line of its own.
#[repr(C, align(64))]
pub(crate) struct Hazard {
    table: AtomicPtr<()>,
    claimed: AtomicBool,
    next: AtomicPtr<Hazard>,
}

// SAFETY: atomics of pointers and a bool: all-zero is an unclaimed,
// unlinked, clear slot.
unsafe impl Zeroable for Hazard {}

/// Slots per mapped page.
const PER_PAGE: usize = 4096 / core::mem::size_of::<Hazard>();

static SLOTS: AtomicPtr<Hazard> = AtomicPtr::new(core::ptr::null_mut());

impl Hazard {
    /// Claim a free slot (mapping a new page of slots if all are taken).
    pub(crate) fn claim() -> Result<&'static Hazard, MapError> {
        let mut p = SLOTS.load(Ordering::Acquire);
        // SAFETY: slots are never unmapped, so every pointer in the list is
        // valid for 'static.
        while let Some(h) = unsafe { p.as_ref() } {
            if h.claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(h);
            }
            p = h.next.load(Ordering::Acquire);
        }
        let page: &'static [Hazard] = MmapSlice::<Hazard>::zeroed(PER_PAGE)?.leak();
        page[0].claimed.store(true, Ordering::Relaxed);
        for pair in page.windows(2) {
            pair[0]
                .next
                .store(&pair[1] as *const Hazard as *mut Hazard, Ordering::Relaxed);
        }
        let first = &page[0] as *const Hazard as *mut Hazard;
        let last = &page[PER_PAGE - 1];
        let mut head = SLOTS.load(Ordering::Acquire);
        loop {
            last.next.store(head, Ordering::Relaxed);
            match SLOTS.compare_exchange(head, first, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        // SAFETY: the page is leaked, so its slots live for 'static.
        Ok(unsafe { &*first })
    }

    /// Read the table published in `source`, keeping it from being freed
    /// until `clear`. Null when none is published.
    #[inline]
    pub(crate) fn protect<T>(&self, source: &AtomicPtr<T>) -> *const T {
        let mut p = source.load(Ordering::SeqCst);
        loop {
            self.table.store(p as *mut (), Ordering::SeqCst);
            let again = source.load(Ordering::SeqCst);
            if again == p {
                return p;
            }
            p = again;
        }
    }

    /// The walk is done with its table.
    #[inline]
    pub(crate) fn clear(&self) {
        self.table.store(core::ptr::null_mut(), Ordering::Release);
    }

    /// Give the slot back.
    pub(crate) fn release(&self) {
        self.clear();
        self.claimed.store(false, Ordering::Release);
    }
}

/// True if some slot holds `table`.
pub(crate) fn in_use<T>(table: *const T) -> bool {
    let mut p = SLOTS.load(Ordering::SeqCst);
    // SAFETY: slots are never unmapped.
    while let Some(h) = unsafe { p.as_ref() } {
        if core::ptr::eq(h.table.load(Ordering::SeqCst), table as *const ()) {
            return true;
        }
        p = h.next.load(Ordering::Acquire);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_pages_grow() {
        let a = Hazard::claim().unwrap();
        let b = Hazard::claim().unwrap();
        assert!(!core::ptr::eq(a, b));
        let many: Vec<&Hazard> = (0..PER_PAGE + 3)
            .map(|_| Hazard::claim().unwrap())
            .collect();
        let fake = 0x1234_5678usize as *mut u64;
        let src = AtomicPtr::new(fake);
        assert_eq!(many[PER_PAGE + 2].protect(&src), fake as *const _);
        assert!(in_use(fake));
        many[PER_PAGE + 2].clear();
        assert!(!in_use(fake));
        a.release();
        for h in &many {
            h.release();
        }
        b.release();
    }
}
