//! The library's own memory: a `#[global_allocator]` over anonymous mmap,
//! and a signal-safe bump region for call-tree storage.
//!
//! Owns all memory the library uses. Nothing here ever calls the program's
//! malloc (which may be trampolined by the memory profiler, and whose locks
//! the interrupted program may hold). Small blocks come from power-of-two
//! size classes (16 B .. 32 KiB) carved from 256 KiB mmap chunks, each class
//! behind a spin lock; large blocks are their own mapping. While the final
//! profile is written ([`final_arena`]), every block comes from one region
//! instead and nothing is given back; so while the instruction decoder
//! builds its tables ([`tables_region`]), in a region of their own.
//!
//! Must never: be called from signal context (the size-class spin locks could
//! be held by the interrupted code; a debug check aborts if it happens), or
//! be left locked across fork (the fork hook calls [`lock_all`] /
//! [`unlock_all`] around the real fork). [`Bump`] is the exception: it is
//! per-owner, lock-free and uses only mmap, so signal handlers may use it.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::sys;

const MIN_SHIFT: usize = 4;
const MAX_SHIFT: usize = 15;
const CLASSES: usize = MAX_SHIFT - MIN_SHIFT + 1;
const CHUNK: usize = 256 * 1024;
const PAGE: usize = 4096;

struct FreeBlock {
    next: *mut FreeBlock,
}

struct ClassState {
    free: *mut FreeBlock,
    bump: usize,
    end: usize,
}

struct Class {
    lock: AtomicBool,
    state: UnsafeCell<ClassState>,
}

// SAFETY: `state` is only touched while `lock` is held.
unsafe impl Sync for Class {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_CLASS: Class = Class {
    lock: AtomicBool::new(false),
    state: UnsafeCell::new(ClassState {
        free: core::ptr::null_mut(),
        bump: 0,
        end: 0,
    }),
};

static CLASS: [Class; CLASSES] = [EMPTY_CLASS; CLASSES];

impl Class {
    fn lock(&self) {
        sys::spin_lock(&self.lock);
    }
    fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }
}

/// Takes every size-class lock (before fork, so the child inherits none held
/// by a thread that does not exist in it).
pub fn lock_all() {
    for c in CLASS.iter() {
        c.lock();
    }
}

/// Whether no size class is locked. In a process with one thread, a held
/// lock means the calling thread was interrupted inside this allocator.
pub fn all_unlocked() -> bool {
    CLASS
        .iter()
        .all(|c| !c.lock.load(core::sync::atomic::Ordering::Acquire))
}

/// Releases what [`lock_all`] took (in parent and child after fork).
pub fn unlock_all() {
    for c in CLASS.iter() {
        c.unlock();
    }
}

fn class_of(size: usize, align: usize) -> Option<usize> {
    let need = size.max(align).max(1 << MIN_SHIFT);
    let shift = (usize::BITS - (need - 1).leading_zeros()) as usize;
    if shift > MAX_SHIFT {
        None
    } else {
        Some(shift - MIN_SHIFT)
    }
}

fn round_pages(n: usize) -> usize {
    (n + PAGE - 1) & !(PAGE - 1)
}

/// Says whether the calling thread is in our signal handler (set at
/// start-up: `thread::in_sampling_handler`, which this layer cannot name).
static SIGNAL_PROBE: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Sets the probe of `assert_not_in_signal` (start-up).
pub fn set_signal_probe(f: fn() -> bool) {
    SIGNAL_PROBE.store(f as usize, Ordering::Release);
}

/// Aborts (with a message) if the global allocator is used in our signal handler.
#[inline]
fn assert_not_in_signal() {
    let p = SIGNAL_PROBE.load(Ordering::Relaxed);
    if p == 0 {
        return;
    }
    // SAFETY: only `fn() -> bool` pointers are stored in SIGNAL_PROBE.
    let in_signal = unsafe { core::mem::transmute::<usize, fn() -> bool>(p) };
    if in_signal() {
        crate::igprof_log!("BUG: allocation inside the signal handler; aborting");
        // SAFETY: abort never returns.
        unsafe { libc::abort() };
    }
}

/// Size of the final dump's region: a dump that needs more takes the rest
/// from the size classes and mappings as usual. Small: the first touch of
/// a huge page is a large page fault, and now and then a compaction that
/// costs many times more.
const ARENA_BYTES: usize = 8 << 20;

/// The final dump's region: [lo, hi), next free byte at `cur`; `on` while
/// allocations come from it.
struct Arena {
    on: AtomicBool,
    lo: AtomicUsize,
    hi: AtomicUsize,
    cur: AtomicUsize,
}

static ARENA: Arena = Arena::new();

/// Runs `f` (a small final dump: the process is ending) with every
/// allocation of the global allocator served from one region, which is
/// never given back. A small dump's memory is a few MiB made once and
/// dropped at the end: from the size classes and per-block mappings it
/// cost a small compiler's dump hundreds of page faults and dozens of
/// mmap/mremap/munmap calls; from the region, whose first `expected` bytes
/// are faulted in by one system call (`MADV_POPULATE_WRITE`), it costs
/// none. (In huge pages instead, the region faulted in 2 MiB at a time:
/// as fast, and 2 MiB more of peak RSS.) The region's last block is freed
/// or resized in place (a temporary, a growing vector); any other freed
/// block is not reused. Not for a big dump, which frees and allocates much
/// more than it keeps: without reuse, and copying where mremap grew blocks
/// in place, cc1plus's dump took twice as long. Blocks that outlive `f`
/// stay valid (the region is never unmapped). Where the region cannot be
/// mapped, or once it is full, allocation goes on as usual.
pub fn final_arena<R>(expected: usize, f: impl FnOnce() -> R) -> R {
    ARENA.serving(ARENA_BYTES, expected, f)
}

/// Bytes the final dump's region has handed out (0 where it was never
/// made), for `-d`.
pub fn final_arena_used() -> usize {
    ARENA.used()
}

/// Size of the region of [`tables_region`]: the decoder's tables take
/// about 0.4 MiB; past the region, blocks come from the size classes.
/// Under 2 MiB, so that no transparent huge page can back it.
const TABLES_BYTES: usize = 1 << 20;

/// The instruction decoder's tables' region (see [`tables_region`]).
static TABLES: Arena = Arena::new();

/// Runs `f` (the instruction decoder building its tables, once in a
/// process) with every allocation served from a region of its own, each
/// block its own size: iced-x86 makes about 8,000 blocks it never frees,
/// 2,300 of them of 72 bytes, which the size classes would hold in blocks
/// of 128. Its pages are faulted in as it fills (mapped without being
/// populated). Blocks freed meanwhile are not reused, but for the
/// region's last one. Where the region cannot be mapped, allocation goes
/// on as usual.
pub fn tables_region(f: &mut dyn FnMut()) {
    TABLES.serving(TABLES_BYTES, 0, f)
}

/// Bytes the region of [`tables_region`] has handed out, for `-d`.
pub fn tables_region_used() -> usize {
    TABLES.used()
}

/// The region that holds `p`, if one does.
fn region_of(p: *mut u8) -> Option<&'static Arena> {
    [&ARENA, &TABLES].into_iter().find(|a| a.holds(p))
}

impl Arena {
    const fn new() -> Self {
        Arena {
            on: AtomicBool::new(false),
            lo: AtomicUsize::new(0),
            hi: AtomicUsize::new(0),
            cur: AtomicUsize::new(0),
        }
    }

    /// Runs `f` with every allocation served from the region (made at
    /// its first use: `len` bytes, the first `ahead` of them faulted in),
    /// and as before after it. Where the region cannot be mapped, `f`
    /// runs with the usual allocation.
    fn serving<R>(&self, len: usize, ahead: usize, f: impl FnOnce() -> R) -> R {
        if self.lo.load(Ordering::Acquire) == 0 {
            let p = sys::mmap_anon(len);
            if !p.is_null() {
                sys::populate_write(p, ahead.min(len));
                self.set_region(p, len);
            }
        }
        let was = self
            .on
            .swap(self.lo.load(Ordering::Acquire) != 0, Ordering::AcqRel);
        let r = f();
        self.on.store(was, Ordering::Release);
        r
    }

    /// Serves blocks from `len` bytes at `p` once it is on.
    fn set_region(&self, p: *mut u8, len: usize) {
        self.cur.store(p as usize, Ordering::Relaxed);
        self.hi.store(p as usize + len, Ordering::Relaxed);
        self.lo.store(p as usize, Ordering::Release);
    }

    /// A block from the region, or null when it is off or full.
    #[inline]
    fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.on.load(Ordering::Relaxed) {
            return core::ptr::null_mut();
        }
        let hi = self.hi.load(Ordering::Relaxed);
        let mut cur = self.cur.load(Ordering::Relaxed);
        loop {
            let start = (cur + layout.align() - 1) & !(layout.align() - 1);
            let end = match start.checked_add(layout.size().max(1)) {
                Some(e) if e <= hi => e,
                _ => return core::ptr::null_mut(),
            };
            match self
                .cur
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return start as *mut u8,
                Err(now) => cur = now,
            }
        }
    }

    /// Moves the end of block `p..p+from` to `p+to` (`to` 0: the block is
    /// freed) where it is the region's last block and the region has the
    /// room; says whether it did. A freed temporary's memory, or a growing
    /// vector's, is then used again instead of the region's next pages (a
    /// small cc1's dump: 4.0-4.5 MiB of the region without, 3.3-3.9 with).
    fn resize_last(&self, p: *mut u8, from: usize, to: usize) -> bool {
        let (end, new_end) = (p as usize + from.max(1), p as usize + to);
        new_end <= self.hi.load(Ordering::Relaxed)
            && self
                .cur
                .compare_exchange(end, new_end, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Bytes handed out (0 where the region was never made).
    fn used(&self) -> usize {
        let lo = self.lo.load(Ordering::Acquire);
        if lo == 0 {
            0
        } else {
            self.cur.load(Ordering::Relaxed) - lo
        }
    }

    /// Whether `p` lies in the region.
    #[inline]
    fn holds(&self, p: *mut u8) -> bool {
        let p = p as usize;
        self.lo.load(Ordering::Relaxed) <= p && p < self.hi.load(Ordering::Relaxed)
    }
}

/// Set in the keeper once the program is gone (process/keeper/): a
/// killed thread may have held a class lock, or been half-way through a
/// free list, so from then on every block is new memory from
/// [`lone_alloc`] and nothing is reused or given back.
static LONE: AtomicBool = AtomicBool::new(false);
/// [`lone_alloc`]'s current region: next free byte and end.
static LONE_CUR: AtomicUsize = AtomicUsize::new(0);
static LONE_END: AtomicUsize = AtomicUsize::new(0);
/// Size of each region [`lone_alloc`] maps (more for a larger block).
const LONE_REGION: usize = 64 << 20;

/// See [`LONE`]: called by the keeper, the only thread left.
pub fn owned_by_one_thread() {
    LONE.store(true, Ordering::Release);
}

/// A block of new memory (one thread only: see [`LONE`]).
fn lone_alloc(layout: Layout) -> *mut u8 {
    let align = layout.align().max(16);
    let size = layout.size().max(1);
    let mut start = (LONE_CUR.load(Ordering::Relaxed) + align - 1) & !(align - 1);
    if LONE_CUR.load(Ordering::Relaxed) == 0 || start + size > LONE_END.load(Ordering::Relaxed) {
        let len = round_pages(size.max(LONE_REGION) + align);
        let p = sys::mmap_anon(len) as usize;
        if p == 0 {
            return core::ptr::null_mut();
        }
        LONE_END.store(p + len, Ordering::Relaxed);
        start = (p + align - 1) & !(align - 1);
    }
    LONE_CUR.store(start + size, Ordering::Relaxed);
    start as *mut u8
}

/// Bytes the global allocator has mapped for its size classes and large
/// blocks (not the final dump's region), for `-d`'s account of the
/// profiler's memory.
static MAPPED: AtomicUsize = AtomicUsize::new(0);

/// [`MAPPED`] now.
pub fn mapped_bytes() -> usize {
    MAPPED.load(Ordering::Relaxed)
}

/// The library's global allocator (installed in lib.rs).
pub struct IgAlloc;

// SAFETY: alloc/dealloc/realloc honour the layouts they are given (size and
// alignment classes of the allocator below) and never unwind.
unsafe impl GlobalAlloc for IgAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if LONE.load(Ordering::Relaxed) {
            return lone_alloc(layout);
        }
        assert_not_in_signal();
        let a = ARENA.alloc(layout);
        if !a.is_null() {
            return a;
        }
        let a = TABLES.alloc(layout);
        if !a.is_null() {
            return a;
        }
        match class_of(layout.size(), layout.align()) {
            Some(ci) => {
                let size = 1usize << (ci + MIN_SHIFT);
                let c = &CLASS[ci];
                c.lock();
                // SAFETY: we hold the class lock.
                let st = &mut *c.state.get();
                let p = if !st.free.is_null() {
                    let b = st.free;
                    st.free = (*b).next;
                    b as *mut u8
                } else {
                    if st.bump + size > st.end {
                        let chunk = sys::mmap_anon(CHUNK);
                        if chunk.is_null() {
                            c.unlock();
                            return core::ptr::null_mut();
                        }
                        MAPPED.fetch_add(CHUNK, Ordering::Relaxed);
                        st.bump = chunk as usize;
                        st.end = chunk as usize + CHUNK;
                    }
                    let p = st.bump as *mut u8;
                    st.bump += size;
                    p
                };
                c.unlock();
                p
            }
            None => {
                if layout.align() > PAGE {
                    return core::ptr::null_mut();
                }
                let p = sys::mmap_anon(round_pages(layout.size()));
                if !p.is_null() {
                    MAPPED.fetch_add(round_pages(layout.size()), Ordering::Relaxed);
                }
                p
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(region) = region_of(ptr) {
            // Reused only when it is the region's last block (final_arena,
            // tables_region).
            region.resize_last(ptr, layout.size(), 0);
            return;
        }
        if LONE.load(Ordering::Relaxed) {
            return;
        }
        match class_of(layout.size(), layout.align()) {
            Some(ci) => {
                let c = &CLASS[ci];
                c.lock();
                // SAFETY: we hold the class lock; ptr came from this class.
                let st = &mut *c.state.get();
                let b = ptr as *mut FreeBlock;
                (*b).next = st.free;
                st.free = b;
                c.unlock();
            }
            None => {
                MAPPED.fetch_sub(round_pages(layout.size()), Ordering::Relaxed);
                sys::munmap(ptr, round_pages(layout.size()))
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old_small = class_of(layout.size(), layout.align());
        let new_small = class_of(new_size, layout.align());
        // A block in a region (the final dump's, the decoder tables') is
        // resized in place where it is the region's last block; else it, or
        // one that should move there, is copied to a new block.
        let region = region_of(ptr);
        if region.is_some_and(|r| r.resize_last(ptr, layout.size(), new_size.max(1))) {
            return ptr;
        }
        let in_place = region.is_none()
            && !ARENA.on.load(Ordering::Relaxed)
            && !TABLES.on.load(Ordering::Relaxed)
            && !LONE.load(Ordering::Relaxed);
        match (old_small, new_small) {
            (Some(a), Some(b)) if a == b && in_place => ptr,
            (None, None) if in_place => {
                let (o, n) = (round_pages(layout.size()), round_pages(new_size));
                if o == n {
                    ptr
                } else {
                    let p = sys::mremap(ptr, o, n);
                    if !p.is_null() {
                        MAPPED.fetch_add(n, Ordering::Relaxed);
                        MAPPED.fetch_sub(o, Ordering::Relaxed);
                    }
                    p
                }
            }
            _ => {
                // SAFETY: new layout has the old alignment and a non-zero size.
                let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
                if !new.is_null() {
                    core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}

/// A single-owner bump region over mmap chunks: lock-free and usable from
/// signal handlers (mmap is a plain system call). Memory is never returned;
/// call-tree nodes live as long as the process.
pub struct Bump {
    cur: usize,
    end: usize,
    chunk: usize,
}

impl Bump {
    pub const fn new(chunk: usize) -> Self {
        Bump {
            cur: 0,
            end: 0,
            chunk,
        }
    }

    /// `size` zeroed bytes aligned to `align` (a power of two <= 4096), or null
    /// when the system is out of memory.
    #[link_section = "igprof_hot"]
    pub fn alloc(&mut self, size: usize, align: usize) -> *mut u8 {
        let start = (self.cur + align - 1) & !(align - 1);
        if self.cur == 0 || start + size > self.end {
            let len = round_pages(size.max(self.chunk));
            // Chunks grow to 2 MiB only in a tree that filled the smaller
            // ones (1.75 MiB): from there, huge pages.
            let p = if len >= sys::HUGE_PAGE {
                sys::mmap_anon_huge(len)
            } else {
                sys::mmap_anon(len)
            };
            if p.is_null() {
                return p;
            }
            // Grow chunks geometrically so big trees need few mappings.
            self.chunk = (self.chunk * 2).min(64 << 20);
            self.cur = p as usize + size;
            self.end = p as usize + len;
            return p;
        }
        self.cur = start + size;
        start as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_alignment() {
        assert_eq!(class_of(1, 1), Some(0));
        assert_eq!(class_of(16, 8), Some(0));
        assert_eq!(class_of(17, 8), Some(1));
        assert_eq!(class_of(8, 64), Some(2));
        assert_eq!(class_of(32768, 8), Some(CLASSES - 1));
        assert_eq!(class_of(32769, 8), None);
    }

    #[test]
    fn allocates_reuses_and_reallocates() {
        let a = IgAlloc;
        // SAFETY: layouts are valid and blocks are used within their size.
        unsafe {
            let l = Layout::from_size_align(40, 8).unwrap();
            let p = a.alloc(l);
            assert!(!p.is_null());
            p.write_bytes(0xab, 40);
            a.dealloc(p, l);
            let q = a.alloc(l);
            q.write_bytes(0xab, 40);
            let big = a.realloc(q, l, 100_000);
            assert_eq!(*big.add(39), 0xab);
            let bigger = a.realloc(big, Layout::from_size_align(100_000, 8).unwrap(), 1_000_000);
            assert_eq!(*bigger.add(0), 0xab);
            a.dealloc(bigger, Layout::from_size_align(1_000_000, 8).unwrap());
            let al = Layout::from_size_align(24, 256).unwrap();
            let r = a.alloc(al);
            assert_eq!(r as usize % 256, 0);
            a.dealloc(r, al);
        }
    }

    #[test]
    fn the_final_arena_serves_every_block_and_keeps_it() {
        let a = IgAlloc;
        let l = Layout::from_size_align(40, 8).unwrap();
        let page = Layout::from_size_align(64, 4096).unwrap();
        // SAFETY: layouts are valid and blocks are used within their size.
        let big = final_arena(1 << 20, || unsafe {
            let p = a.alloc(l);
            assert!(ARENA.holds(p), "a small block");
            p.write_bytes(0xcd, 40);
            let big = a.realloc(p, l, 100_000);
            assert!(ARENA.holds(big), "a large block");
            assert_eq!(*big.add(39), 0xcd, "realloc copies");
            let q = a.alloc(page);
            assert!(
                ARENA.holds(q) && (q as usize).is_multiple_of(4096),
                "aligned"
            );
            a.dealloc(q, page);
            big
        });
        // SAFETY: arena blocks are never unmapped; `big` was not freed.
        assert_eq!(unsafe { *big.add(0) }, 0xcd);
        // SAFETY: as above.
        unsafe {
            let n = a.alloc(l);
            assert!(!n.is_null() && !ARENA.holds(n), "back to the size classes");
            a.dealloc(n, l);
        }
    }

    #[test]
    fn the_decoder_tables_region_serves_blocks_while_on() {
        let a = IgAlloc;
        let l = Layout::from_size_align(72, 8).unwrap();
        let mut blocks = [core::ptr::null_mut::<u8>(); 3];
        tables_region(&mut || {
            for b in blocks.iter_mut() {
                // SAFETY: a valid layout.
                *b = unsafe { a.alloc(l) };
            }
        });
        // (Other tests' threads may allocate from it meanwhile: the blocks
        // are in order, at least their size apart, not necessarily
        // adjacent.)
        assert!(blocks.iter().all(|&b| TABLES.holds(b)), "in the region");
        assert!(blocks
            .windows(2)
            .all(|w| w[1] as usize >= w[0] as usize + 72));
        // SAFETY: blocks of `l`, used within their size.
        unsafe {
            blocks[0].write_bytes(0xab, 72);
            let grown = a.realloc(blocks[0], l, 4000);
            assert!(!TABLES.holds(grown), "moved out once the region is off");
            assert_eq!(*grown.add(71), 0xab, "realloc copies");
            a.dealloc(grown, Layout::from_size_align(4000, 8).unwrap());
            let n = a.alloc(l);
            assert!(!n.is_null() && !TABLES.holds(n), "back to the size classes");
            a.dealloc(n, l);
        }
    }

    #[test]
    fn the_final_arenas_last_block_is_freed_and_resized_in_place() {
        let region = sys::mmap_anon(1 << 16);
        assert!(!region.is_null());
        let arena = Arena::new();
        arena.set_region(region, 1 << 16);
        assert!(arena.alloc(Layout::new::<u64>()).is_null(), "off");
        arena.on.store(true, Ordering::Relaxed);
        let l = Layout::from_size_align(100, 16).unwrap();
        let a = arena.alloc(l);
        let b = arena.alloc(l);
        assert_eq!(a, region);
        assert!(!arena.resize_last(a, 100, 0), "not the last block: kept");
        assert!(arena.resize_last(b, 100, 0), "the last block: freed");
        assert_eq!(arena.alloc(l), b, "and its memory used again");
        assert!(arena.resize_last(b, 100, 5000), "grown in place");
        assert!(
            !arena.resize_last(b, 5000, 1 << 16),
            "not beyond the region"
        );
        let c = arena.alloc(l);
        assert_eq!(
            c as usize,
            b as usize + 5008,
            "after the grown block, aligned"
        );
        assert!(!arena.resize_last(b, 5000, 6000), "no longer the last");
        assert!(arena.holds(c) && !arena.holds(region.wrapping_add(1 << 16)));
        // SAFETY: the test's own mapping, no block of it used any more.
        unsafe { sys::munmap(region, 1 << 16) };
    }

    #[test]
    fn bump_aligns_and_grows() {
        let mut b = Bump::new(4096);
        let p = b.alloc(10, 8);
        let q = b.alloc(8, 64);
        assert_eq!(q as usize % 64, 0);
        assert!(q as usize >= p as usize + 10);
        let big = b.alloc(1 << 20, 16);
        // SAFETY: fresh mapping of 1 MiB.
        unsafe { big.add((1 << 20) - 1).write(1) };
    }

    #[test]
    fn chunks_of_2_mib_and_more_are_aligned_for_huge_pages() {
        let mut b = Bump::new(sys::HUGE_PAGE);
        for len in [sys::HUGE_PAGE, 2 * sys::HUGE_PAGE + 4096] {
            let p = b.alloc(len, 8);
            assert!(!p.is_null());
            assert_eq!(p as usize % sys::HUGE_PAGE, 0, "{len}");
            // SAFETY: a fresh mapping of at least `len` bytes.
            let s = unsafe { core::slice::from_raw_parts_mut(p, len) };
            assert!(s.iter().all(|&x| x == 0), "zero-filled");
            s.fill(0xa5);
        }
    }
}
