//! Memory accounting: what an allocation or a free does to the counters.
//!
//! Owns the counter slots of the memory profiler and their update rules:
//!
//! - MEM_TOTAL: (calls, bytes, bytes) per allocating stack; owner thread only.
//! - MEM_MAX: (calls, largest single allocation, 0) as IgProf writes it.
//! - MEM_LIVE: (blocks live, bytes live, per-stack peak of bytes live);
//!   updated atomically because a free on another thread is charged to the
//!   allocating stack (found in the live table).
//! - MEM_LIVE_AT_PEAK (igprof-rs only): (blocks, bytes) that each stack had
//!   live at the moment the whole process's live bytes were highest.
//!
//! MEM_LIVE_AT_PEAK is kept without ever visiting all nodes: a process-wide
//! peak epoch advances whenever the process's live total reaches a new
//! maximum. Before a node's live value changes, if the node's snapshot is
//! from an older epoch, its current live value (its value at the latest
//! peak, since it has not changed since) is saved with the current epoch.
//! At dump time a node whose snapshot carries the current epoch reports the
//! snapshot, any other node reports its live value (unchanged since the
//! peak). One thread: exact. Several threads: exact up to the operations in
//! flight on other threads at the peak moment (at most one per thread).
//!
//! Sampled mode (`--sample-bytes`, see [`super::sample`]): a recorded
//! allocation adds the calls and bytes it stands for to every counter, and
//! its live-table entry keeps that packed weight, so its free subtracts
//! exactly what it added.
//!
//! Shared updates are plain stores while the process is [`crate::base::solo`].
//!
//! Must never: allocate, lock (beyond a live-table shard), or panic.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::base::counters::{self, CounterId};
use crate::base::live::{Block, LiveMem};
use crate::base::solo;
use crate::base::thread::Guard;
use crate::base::tree::{Counter, Node};

/// Live heap blocks of the process (the program's, as seen by the hooks).
pub static LIVE: LiveMem = LiveMem::new();

const NONE: usize = usize::MAX;
static TOTAL: AtomicUsize = AtomicUsize::new(NONE);
static MAX: AtomicUsize = AtomicUsize::new(NONE);
static LIVE_SLOT: AtomicUsize = AtomicUsize::new(NONE);
static AT_PEAK: AtomicUsize = AtomicUsize::new(NONE);

/// Bytes live in the whole process, the highest value seen, and the epoch
/// of that peak (see the module docs).
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_EPOCH: AtomicU64 = AtomicU64::new(1);

/// Enables the memory counters (before the registry freezes).
pub fn register_counters() {
    if !crate::base::options::get().mem {
        return;
    }
    for id in [
        CounterId::MemTotal,
        CounterId::MemMax,
        CounterId::MemLive,
        CounterId::MemLiveAtPeak,
    ] {
        counters::enable(id);
    }
    register_since_mark();
}

/// Remembers the slots (after the registry froze).
pub fn init_slots() {
    let s = |id| counters::slot(id).unwrap_or(NONE);
    TOTAL.store(s(CounterId::MemTotal), Ordering::Relaxed);
    MAX.store(s(CounterId::MemMax), Ordering::Relaxed);
    LIVE_SLOT.store(s(CounterId::MemLive), Ordering::Relaxed);
    AT_PEAK.store(s(CounterId::MemLiveAtPeak), Ordering::Relaxed);
    init_since_mark();
}

/// The process's live bytes now and at their highest.
pub fn process_live() -> (u64, u64) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        PEAK_BYTES.load(Ordering::Relaxed),
    )
}

#[inline]
fn counter(node: *const Node, slot: usize) -> Option<&'static Counter> {
    if slot == NONE {
        return None;
    }
    // SAFETY: nodes are never freed; slot < nslots (set from the registry).
    Some(unsafe { &*node }.counter(slot))
}

/// Saves `node`'s live value as its value at the latest peak if its
/// snapshot is older than that peak (see the module docs).
#[inline]
fn snapshot_before_change(node: *const Node) {
    snapshot_in(
        node,
        AT_PEAK.load(Ordering::Relaxed),
        LIVE_SLOT.load(Ordering::Relaxed),
    )
}

/// [`snapshot_before_change`] with the slots already read.
#[inline(always)]
fn snapshot_in(node: *const Node, at_slot: usize, live_slot: usize) {
    let (Some(at), Some(live)) = (counter(node, at_slot), counter(node, live_slot)) else {
        return;
    };
    let e = PEAK_EPOCH.load(Ordering::Acquire);
    if at.peak.load(Ordering::Relaxed) != e {
        at.ticks
            .store(live.ticks.load(Ordering::Relaxed), Ordering::Relaxed);
        at.value
            .store(live.value.load(Ordering::Relaxed), Ordering::Relaxed);
        at.peak.store(e, Ordering::Release);
    }
}

/// An allocation of `size` bytes at `addr` by the stack of `node` (owner
/// thread of `node`'s tree, inside profiler code: `_held`).
#[inline(always)]
pub fn on_alloc(_held: &Guard, node: *mut Node, addr: usize, size: u64) {
    if let Some(c) = counter(node, TOTAL.load(Ordering::Relaxed)) {
        c.tick(size);
    }
    if let Some(c) = counter(node, MAX.load(Ordering::Relaxed)) {
        // Owner-only update: plain load/store, IgProf's (calls, max, 0).
        c.ticks
            .store(c.ticks.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if size > c.value.load(Ordering::Relaxed) {
            c.value.store(size, Ordering::Relaxed);
        }
    }
    match LIVE.insert(addr, super::epoch::tagged(size), node) {
        Ok(Some(stale)) => release(&stale),
        Ok(None) => {}
        Err(_) => {
            super::site::LOST.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    if super::journal::on() {
        super::journal::alloc(super::journal::Family::Memory, node, addr, 1, size, size);
    }
    if super::spans::active() {
        super::spans::insert(addr, size, node);
    }
    // The slots and the solo flag read once for the updates below.
    let live_slot = LIVE_SLOT.load(Ordering::Relaxed);
    let Some(live) = counter(node, live_slot) else {
        return;
    };
    let one = solo::solo();
    snapshot_in(node, AT_PEAK.load(Ordering::Relaxed), live_slot);
    live.add_shared_in(one, 1, size);
    grow_process_live(one, size);
}

/// The process's live bytes grow by `bytes`; a new peak starts an epoch
/// (`one`: the process is [`solo`]).
#[inline]
fn grow_process_live(one: bool, bytes: u64) {
    let now = solo::add_in(one, &LIVE_BYTES, bytes);
    if now > PEAK_BYTES.load(Ordering::Relaxed) && now > solo::max_in(one, &PEAK_BYTES, now) {
        solo::add_in(one, &PEAK_EPOCH, 1);
        crate::base::cgroup::live_peak(now);
    }
}

/// A sampled allocation at `addr` by the stack of `node` (owner thread,
/// inside profiler code: `_held`): `stored` is its packed weight ([`super::sample::weigh`]),
/// `largest` its own accounted size, for MEM_MAX. The sampler's free
/// filter already counts `addr` ([`super::sample::remember`]).
#[inline]
pub fn on_alloc_sampled(_held: &Guard, node: *mut Node, addr: usize, stored: u64, largest: u64) {
    let (calls, bytes) = super::sample::unpack(stored);
    if let Some(c) = counter(node, TOTAL.load(Ordering::Relaxed)) {
        c.add(calls, bytes);
    }
    if let Some(c) = counter(node, MAX.load(Ordering::Relaxed)) {
        c.ticks
            .store(c.ticks.load(Ordering::Relaxed) + calls, Ordering::Relaxed);
        if largest > c.value.load(Ordering::Relaxed) {
            c.value.store(largest, Ordering::Relaxed);
        }
    }
    match LIVE.insert(addr, stored, node) {
        Ok(Some(stale)) => {
            // One entry for two counts in the filter.
            super::sample::forget(addr);
            release(&stale);
        }
        Ok(None) => {}
        Err(_) => {
            super::sample::forget(addr);
            super::site::LOST.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    if super::journal::on() {
        super::journal::alloc(
            super::journal::Family::Memory,
            node,
            addr,
            calls,
            bytes,
            largest,
        );
    }
    let Some(live) = counter(node, LIVE_SLOT.load(Ordering::Relaxed)) else {
        return;
    };
    snapshot_before_change(node);
    live.add_shared(calls, bytes);
    grow_process_live(solo::solo(), bytes);
}

/// Frees of blocks the profiler never saw allocated, in a process it was
/// attached to (`igprof --attach`): blocks from before the attach. They
/// change no counter; the header note and `-d` say how many.
pub static FREED_FROM_BEFORE: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// The live table's first probe for [`on_alloc`] of `addr` starts loading
/// now, while the caller walks the stack (a hint: changes nothing).
#[inline(always)]
pub fn expect_alloc(addr: usize) {
    LIVE.prefetch_insert(addr);
}

/// As [`expect_alloc`], for [`on_free`] of `addr`.
#[inline(always)]
pub fn expect_free(addr: usize) {
    LIVE.prefetch_remove(addr);
}

/// Block `addr` is being freed: forget it and release it from the stack
/// that allocated it. Returns what was recorded (None if untracked).
#[inline(always)]
pub fn on_free(addr: usize) -> Option<Block> {
    if addr == 0 {
        return None;
    }
    let Some(b) = LIVE.remove(addr) else {
        if crate::base::run::attached() && !super::sample::active() {
            FREED_FROM_BEFORE.fetch_add(1, Ordering::Relaxed);
        }
        return None;
    };
    if super::sample::active() {
        super::sample::forget(addr);
    }
    if super::empty::active() {
        super::empty::on_free(&b);
    }
    release(&b);
    Some(b)
}

/// The allocating node of the live block that holds `addr`, if any: a
/// block of at least `spans::min()` bytes from the span index, a smaller
/// one by looking up the block starts below `addr` (16-byte steps, the
/// allocator's alignment on both architectures) up to that size. The
/// first block found decides: blocks do not overlap, so if it ends before
/// `addr` no lower one can hold it. Signal context, for a thread that was
/// not in profiler code; None when it was inside a memory hook (which may
/// hold a table lock, or be half-way through an update of the recent
/// cache), as [`super::spans::owner_of`] says.
pub fn block_holding(addr: usize) -> Option<*const Node> {
    if super::site::recording() {
        super::spans::BUSY.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    if let Some(node) = super::spans::owner_of(addr) {
        return Some(node);
    }
    let lowest = addr.saturating_sub(super::spans::min() as usize);
    let mut start = addr & !15;
    while start > lowest {
        if let Some(b) = LIVE.get(start) {
            let size = super::sample::weight_of(b.size).1 as usize;
            return (addr < b.addr + size).then_some(b.node);
        }
        start -= 16;
    }
    None
}

/// Puts a block taken out by [`on_free`] back unchanged (a realloc that
/// failed: the old block is still the program's, with its old size and
/// stack).
pub fn restore(b: &Block) {
    if LIVE.insert(b.addr, b.size, b.node).is_err() {
        super::site::LOST.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if super::sample::active() {
        super::sample::remember(b.addr);
    }
    let (calls, bytes) = super::sample::weight_of(b.size);
    if super::spans::active() {
        super::spans::insert(b.addr, bytes, b.node);
    }
    if super::journal::on() {
        super::journal::restore(b.node, b.addr, calls, bytes);
    }
    if let Some(live) = counter(b.node, LIVE_SLOT.load(Ordering::Relaxed)) {
        snapshot_before_change(b.node);
        solo::add(&live.ticks, calls);
        solo::add(&live.value, bytes);
        solo::add(&LIVE_BYTES, bytes);
    }
}

#[inline(always)]
fn release(b: &Block) {
    let (calls, bytes) = super::sample::weight_of(b.size);
    if super::journal::on() {
        super::journal::free(super::journal::Family::Memory, b.node, b.addr, calls, bytes);
    }
    if super::spans::active() {
        super::spans::remove(b.addr, bytes);
    }
    let live_slot = LIVE_SLOT.load(Ordering::Relaxed);
    if let Some(live) = counter(b.node, live_slot) {
        let one = solo::solo();
        snapshot_in(b.node, AT_PEAK.load(Ordering::Relaxed), live_slot);
        live.release_many_in(one, calls, bytes);
        solo::sub_in(one, &LIVE_BYTES, bytes);
    }
}

/// The value the dump writes for MEM_LIVE_AT_PEAK on `node`, if `slot` is
/// that counter: (blocks, bytes, bytes) live on that stack at the peak.
pub fn at_peak_view(node: &Node, slot: usize) -> Option<(u64, u64, u64)> {
    if slot != AT_PEAK.load(Ordering::Relaxed) || !node.is_charged() {
        return None;
    }
    let at = node.counter(slot);
    let (t, v) = if at.peak.load(Ordering::Acquire) == PEAK_EPOCH.load(Ordering::Acquire) {
        (
            at.ticks.load(Ordering::Relaxed),
            at.value.load(Ordering::Relaxed),
        )
    } else {
        let live = node.counter(LIVE_SLOT.load(Ordering::Relaxed));
        (
            live.ticks.load(Ordering::Relaxed),
            live.value.load(Ordering::Relaxed),
        )
    };
    Some((t, v, v))
}

// ---- MEM_LIVE_SINCE_MARK (`--marks`, see `super::epoch`) ----

/// MEM_LIVE_SINCE_MARK's slot (`usize::MAX`: not in this run).
static SINCE_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Enables MEM_LIVE_SINCE_MARK when the run takes marks (start-up).
fn register_since_mark() {
    let o = crate::base::options::get();
    if o.mem && o.marks {
        counters::enable(CounterId::MemLiveSinceMark);
    }
}

/// Remembers the counter's slot (after the registry froze) and turns the
/// marks on.
fn init_since_mark() {
    if let Some(s) = counters::slot(CounterId::MemLiveSinceMark) {
        SINCE_SLOT.store(s, Ordering::Relaxed);
        crate::base::run::set_marks(true);
    }
}

/// Per node: (blocks, bytes) allocated in the current epoch and still
/// live, gathered by [`gather_since_mark`] for the dump's [`since_mark_view`].
static SINCE: std::sync::Mutex<Option<std::collections::HashMap<usize, (u64, u64)>>> =
    std::sync::Mutex::new(None);

/// Before a dump: gathers the live blocks of the current epoch, per node.
pub fn gather_since_mark() {
    if SINCE_SLOT.load(Ordering::Relaxed) == usize::MAX {
        return;
    }
    let current = crate::base::run::epoch();
    let mut m: std::collections::HashMap<usize, (u64, u64)> = Default::default();
    if current > 0 {
        // Marked as recording, as the leak records are read: a signal
        // handler's free on this thread is deferred instead of waiting
        // for a shard this thread holds.
        super::site::with_outer(super::site::IN_RECORD, || {
            LIVE.for_each(|b| {
                if super::epoch::epoch_of(b.size) == current {
                    let e = m.entry(b.node as usize).or_insert((0, 0));
                    e.0 += 1;
                    e.1 += super::epoch::bytes(b.size);
                }
            })
        });
    }
    *SINCE.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
}

/// The dump's value of MEM_LIVE_SINCE_MARK for `node`, if `slot` is it.
pub fn since_mark_view(node: &Node, slot: usize) -> Option<(u64, u64, u64)> {
    if slot != SINCE_SLOT.load(Ordering::Relaxed) {
        return None;
    }
    let since = SINCE.lock().unwrap_or_else(|e| e.into_inner());
    let (n, b) = since
        .as_ref()
        .and_then(|m| m.get(&(node as *const Node as usize)).copied())
        .unwrap_or((0, 0));
    Some((n, b, b))
}

/// The MEM_LIVE slot (for LK records), if enabled.
pub fn live_slot() -> Option<usize> {
    let s = LIVE_SLOT.load(Ordering::Relaxed);
    (s != NONE).then_some(s)
}

/// The process is about to have a second thread: the live table's recent
/// blocks go to its shared form (a stale entry they replace is released; a
/// block that finds no memory there is released and counted lost).
pub fn flush_recent() {
    LIVE.flush_recent(|b, replaced| {
        if !replaced {
            super::site::LOST.fetch_add(1, Ordering::Relaxed);
        }
        release(b);
    });
}

/// In a forked child: nothing live yet in this process's profile.
pub fn reset_after_fork() {
    LIVE.reset();
    super::spans::reset();
    LIVE_BYTES.store(0, Ordering::Relaxed);
    PEAK_BYTES.store(0, Ordering::Relaxed);
    PEAK_EPOCH.fetch_add(1, Ordering::Relaxed);
}
