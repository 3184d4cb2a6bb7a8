//! The mapping profiler (-mm): MMAP_TOTAL and MMAP_LIVE.
//!
//! Owns what a mapping, an unmap or a remap does to the counters. Only
//! anonymous mappings (MAP_ANONYMOUS) are the program's memory; a file
//! mapping is not counted, though one made with MAP_FIXED over a counted
//! range ends that part of it, as the kernel does.
//!
//! - MMAP_TOTAL is (calls, bytes mapped) per calling stack: each anonymous
//!   mmap, and each mremap of a counted mapping (worth its new size, as
//!   IgProf counts realloc).
//! - MMAP_LIVE is (ranges, bytes, peak) still mapped per stack; an
//!   unmap by any thread releases from the stack that mapped. An unmap of
//!   part of a mapping releases exactly that part (a hole in the middle
//!   leaves two ranges); one that spans several mappings releases each
//!   overlap. An mremap that succeeds moves the counted part of the old
//!   range to the stack of the mremap call, at the new address and size
//!   (realloc's rule in IgProf: the last resizer owns the block).
//!
//! Lengths are rounded up to the page as the kernel does. A mapping made
//! inside an allocation function ([`allocator`]) is charged to the
//! `<allocator mmap>` leaf below the allocating stack. Mappings the
//! profiler makes for itself are raw system calls (`sys::mem`) that no hook
//! sees; libc calls the profiler makes inside its own code pass through
//! (`site::event`).
//!
//! Must never: allocate, change a call's result or errno, or touch the
//! range table from a signal handler that interrupted its holder (events
//! seen then are deferred with their stack: `site::event`).

pub mod allocator;
pub mod hooks;
pub mod ranges;

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::base::counters::{self, CounterId};
use crate::base::thread::Guard;
use crate::base::tree::{Counter, Node, ALLOCATOR_MMAP};
use crate::modules::mem::site;
use crate::modules::StartError;
use crate::sys::ErrnoGuard;

/// The program's anonymous mappings still mapped.
pub static LIVE: ranges::Ranges = ranges::Ranges::new();

/// Mappings that could not be kept (table full, or a deferred remap too
/// large to describe): reported at the dump when non-zero, and with -d.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

const NONE: usize = usize::MAX;
static TOTAL_SLOT: AtomicUsize = AtomicUsize::new(NONE);
static LIVE_SLOT: AtomicUsize = AtomicUsize::new(NONE);
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The mapping profiler in the runtime's module registry.
pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe: |_| Some("anonymous mappings (MMAP_TOTAL, MMAP_LIVE)".into()),
    register_counters: |_| {
        counters::enable(CounterId::MmapTotal);
        counters::enable(CounterId::MmapLive);
    },
    start: |_| start(),
    thread_end: Some(|_| site::release_thread_extras()),
    left_by_jump: Some(site::jumped_out),
    fork_child: Some(reset_after_fork),
    leaks: Some(leaks),
    ..crate::modules::Module::new("-mm", |o| o.mmap)
};

/// Slots, table, allocator ranges, hooks (start-up, guard held).
fn start() -> Result<(), StartError> {
    TOTAL_SLOT.store(
        counters::slot(CounterId::MmapTotal).unwrap_or(NONE),
        Ordering::Relaxed,
    );
    LIVE_SLOT.store(
        counters::slot(CounterId::MmapLive).unwrap_or(NONE),
        Ordering::Relaxed,
    );
    PAGE.store(crate::sys::page_size(), Ordering::Relaxed);
    LIVE.init()
        .map_err(|_| StartError::refused("no memory for the table of live mappings"))?;
    allocator::init();
    if !hooks::install() {
        return Err(StartError::refused("mmap or munmap could not be hooked"));
    }
    Ok(())
}

#[inline]
fn counter(node: *const Node, slot: &AtomicUsize) -> Option<&'static Counter> {
    let slot = slot.load(Ordering::Relaxed);
    if slot == NONE || node.is_null() {
        return None;
    }
    // SAFETY: nodes are never freed; slot < nslots.
    Some(unsafe { &*node }.counter(slot))
}

/// `[addr, addr + len)` with `len` rounded up to the page; None for what
/// the kernel refuses (an unaligned address, an empty or wrapping range).
fn pages(addr: usize, len: usize) -> Option<(usize, usize)> {
    let page = PAGE.load(Ordering::Relaxed);
    let len = len.checked_add(page - 1)? & !(page - 1);
    if !addr.is_multiple_of(page) || len == 0 {
        return None;
    }
    Some((addr, addr.checked_add(len)?))
}

/// Releases what the table dropped from `node`'s MMAP_LIVE.
fn released(node: *mut Node, bytes: usize, pieces: i64) {
    if let Some(c) = counter(node, &LIVE_SLOT) {
        match pieces {
            p if p < 0 => c.release_many(p.unsigned_abs(), bytes as u64),
            0 => c.release_many(0, bytes as u64),
            p => {
                c.release_many(0, bytes as u64);
                c.add_shared(p as u64, 0);
            }
        }
    }
}

/// The node a mapping of this stack is charged to: the `<allocator mmap>`
/// leaf below it when an allocation function made it.
fn charged(g: &Guard, node: *mut Node) -> *mut Node {
    if !allocator::in_allocator(node) {
        return node;
    }
    // SAFETY: the owner thread (the guard is of its current state); the
    // tree is not borrowed elsewhere while a hook records.
    let tree = unsafe { g.state().tree_mut(g) };
    let leaf = tree.child(node, ALLOCATOR_MMAP);
    tree.charged(leaf)
}

/// `node` is charged for `bytes` more, in a new range (owner thread).
fn charge(node: *mut Node, bytes: usize) {
    if let Some(c) = counter(node, &TOTAL_SLOT) {
        c.tick(bytes as u64);
    }
    if let Some(c) = counter(node, &LIVE_SLOT) {
        c.tick_shared(bytes as u64);
    }
}

/// The stack of `node` mapped `[start, end)` (owner thread, inside
/// profiler code).
fn map(g: &Guard, node: *mut Node, start: usize, end: usize) {
    let n = charged(g, node);
    if n.is_null() {
        site::LOST.fetch_add(1, Ordering::Relaxed);
        return;
    }
    match LIVE.insert(start, end, n, &mut released) {
        Ok(()) => charge(n, end - start),
        Err(_) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `[start, end)` is no longer mapped (any thread).
fn unmap(start: usize, end: usize) {
    LIVE.remove(start, end, &mut released);
}

/// The stack of `node` moved `old` to `new` with mremap (owner thread,
/// inside profiler code).
fn remap(g: &Guard, node: *mut Node, old: (usize, usize), new: (usize, usize)) {
    let mut to = core::ptr::null_mut();
    let moved = LIVE.replace(
        old,
        new,
        || {
            to = charged(g, node);
            to
        },
        &mut released,
    );
    match moved {
        Ok(true) => charge(to, new.1 - new.0),
        Ok(false) => {}
        Err(_) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Deferred-event kinds of this module.
const KIND_MAP: u8 = 24;
const KIND_UNMAP: u8 = 25;
const KIND_REMAP: u8 = 26;

/// A page-aligned range in one word, for a deferred remap (whose event has
/// room for two): the address in 4 KiB units in the low 36 bits (below
/// 2^48), the length in 4 KiB units above (below 1 TiB).
fn pack((start, end): (usize, usize)) -> Option<usize> {
    let (a, l) = (start >> 12, (end - start) >> 12);
    (start & 0xfff == 0 && a < 1 << 36 && l < 1 << 28).then_some(a | l << 36)
}

fn unpack(w: usize) -> (usize, usize) {
    let start = (w & ((1 << 36) - 1)) << 12;
    (start, start + ((w >> 36) << 12))
}

/// Replays one deferred mapping event.
fn replay(g: &Guard, node: *mut Node, kind: u8, a: usize, b: u64) {
    match kind {
        KIND_MAP => map(g, node, a, a + b as usize),
        KIND_UNMAP => unmap(a, a + b as usize),
        KIND_REMAP if a != 0 => remap(g, node, unpack(a), unpack(b as usize)),
        _ => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ---- what the hooks call ----

/// A mapping of `len` bytes at `addr` succeeded; `anon`: MAP_ANONYMOUS.
pub fn mapped(addr: usize, len: usize, anon: bool) {
    let Some((start, end)) = pages(addr, len) else {
        return;
    };
    let _e = ErrnoGuard::save();
    if !anon || !crate::base::run::recording() {
        // Not counted, but it replaced whatever was mapped there.
        unmapping_range(start, end);
        return;
    }
    site::event(KIND_MAP, start, (end - start) as u64, replay, |g, h| {
        // Unmaps deferred before this call first: the kernel may have
        // given this mapping an address one of them freed.
        site::drain(g, h);
        match site::caller_node(g, h, 0) {
            Some(n) => map(g, n, start, end),
            None => unmap(start, end),
        }
    });
}

/// `len` bytes at `addr` are about to be unmapped.
pub fn unmapping(addr: usize, len: usize) {
    if let Some((start, end)) = pages(addr, len) {
        let _e = ErrnoGuard::save();
        unmapping_range(start, end);
    }
}

fn unmapping_range(start: usize, end: usize) {
    site::unrecorded(KIND_UNMAP, start, (end - start) as u64, replay, || {
        unmap(start, end)
    });
}

/// An mremap moved `old_len` bytes at `old` to `new_len` bytes at `new`
/// (`old_len` 0: the old range is still mapped).
pub fn remapped(old: usize, old_len: usize, new: usize, new_len: usize) {
    let _e = ErrnoGuard::save();
    // An old length of zero asks for a second mapping of a shared one (and
    // the hook passes zero for MREMAP_DONTUNMAP): the old range stays.
    let old = if old_len == 0 {
        pages(old, 1).map(|(s, _)| (s, s))
    } else {
        pages(old, old_len)
    };
    let (Some(old), Some(new)) = (old, pages(new, new_len)) else {
        return;
    };
    if !crate::base::run::recording() {
        unmapping_range(old.0, old.1);
        return;
    }
    let (a, b) = match (pack(old), pack(new)) {
        (Some(a), Some(b)) => (a, b),
        _ => (0, 0),
    };
    site::event(KIND_REMAP, a, b as u64, replay, |g, h| {
        // Unmaps deferred before this call first: the kernel may have
        // given this mapping an address one of them freed.
        site::drain(g, h);
        match site::caller_node(g, h, 0) {
            Some(n) => remap(g, n, old, new),
            None => unmap(old.0, old.1),
        }
    });
}

/// In a forked child: the parent's mappings belong to the parent's profile.
fn reset_after_fork() {
    if !crate::base::run::fork_keeps_tables() {
        LIVE.reset();
    }
}

/// Live mappings for `LK` records under MMAP_LIVE: (address, bytes).
fn leaks(f: &mut dyn FnMut(*const Node, usize, u64, u64)) {
    let slot = LIVE_SLOT.load(Ordering::Relaxed);
    if slot == NONE {
        return;
    }
    let mut v: Vec<(usize, usize, usize)> = Vec::new();
    // Marked as recording so that a signal handler's munmap on this
    // thread is deferred instead of waiting for the lock we hold.
    site::with_outer(site::IN_RECORD, || {
        LIVE.for_each(&mut |n, start, len| v.push((n as usize, start, len)))
    });
    for (n, start, len) in v {
        f(n as *const Node, slot, start as u64, len as u64);
    }
    let dropped = DROPPED.load(Ordering::Relaxed);
    if dropped > 0 || crate::base::options::debug() {
        crate::igprof_log!("-mm: mappings not kept (table full or too large): {dropped}");
    }
}

#[cfg(test)]
mod tests {
    use super::{pack, unpack};

    #[test]
    fn a_deferred_remap_keeps_its_ranges() {
        let r = (0x7fff_1234_5000, 0x7fff_1234_5000 + (3 << 20));
        assert_eq!(pack(r).map(unpack), Some(r));
        assert_eq!(pack((0x1000, 0x1000 + (1 << 40))), None, "1 TiB");
        assert_eq!(pack((1 << 48, (1 << 48) + 4096)), None);
    }
}
