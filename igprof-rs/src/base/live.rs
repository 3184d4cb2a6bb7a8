//! The live-resource tables: which heap blocks and which file descriptors
//! are alive right now, and which call-tree node acquired each.
//!
//! Owns [`LiveMem`] (block address -> (size, node)) and [`LiveFds`]
//! (descriptor -> node). A release looks the resource up here and is
//! charged to the node that acquired it, whichever thread releases it. The
//! dump reads both tables for IgProf's `LK` records.
//!
//! `LiveMem` is split into [`SHARDS`] open-addressing tables (linear probing
//! with backward-shift deletion, so no tombstones pile up under churn), each
//! behind a spin lock held for a few loads and stores. A block's shard and
//! home slot come from its region of 512 bytes of address space: the
//! region's hash picks the shard and a group of 32 slots there, the block's
//! 16-byte granule its slot in the group. Blocks a program makes one after
//! the other, mostly neighbours in its heap, so share cache lines and pages
//! of the table instead of each costing a miss at a random place in
//! megabytes (a multi-threaded node under -mp: 7% less wall time). The lock is never
//! taken re-entrantly: callers hold their thread's profiler guard, and a
//! signal handler that interrupts a holder on the same thread does not reach
//! this table (the memory module defers such events until the guard is
//! released). Another thread that holds a shard lock always makes progress,
//! so waiting for it cannot deadlock. While the process is
//! [`crate::base::solo`], its one thread is the only user (dumps included) and
//! no lock is taken. After fork the child starts with empty,
//! unlocked tables ([`LiveMem::reset`]): the parent's blocks are the parent's.
//!
//! `LiveFds` is one atomic slot per possible descriptor (up to the
//! RLIMIT_NOFILE hard limit, reserved lazily with mmap), so acquire and
//! release are a single atomic swap: exact without any lock.
//!
//! Storage comes from anonymous mmap only, never from the program's malloc
//! and never from the library's global allocator (which is not signal-safe).
//!
//! Must never: call malloc or the global allocator, take a lock other than a
//! shard's spin lock, or panic.

use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use crate::base::tree::Node;
use crate::sys;

/// Number of independently locked parts of [`LiveMem`].
pub const SHARDS: usize = 64;
const SHARD_BITS: u32 = 6;
const INITIAL_CAP: usize = 128;

/// One live block: its address (0 = empty slot), size and acquiring node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Block {
    pub addr: usize,
    pub size: u64,
    pub node: *const Node,
}

const EMPTY: Block = Block {
    addr: 0,
    size: 0,
    node: core::ptr::null(),
};

struct ShardState {
    slots: *mut Block,
    /// capacity - 1 (capacity is a power of two), 0 before the first insert.
    mask: usize,
    len: usize,
}

struct Shard {
    lock: AtomicBool,
    /// The slot array's address with log2 of its capacity in the low bits
    /// (0: no array), stored with the lock held whenever the array
    /// changes; read without the lock, and only to prefetch
    /// ([`LiveMem::prefetch_insert`]): a stale value costs a useless
    /// prefetch, never a wrong answer.
    hint: AtomicUsize,
    state: UnsafeCell<ShardState>,
}

// SAFETY: `state` is only touched with `lock` held, or by the process's
// only thread while it is solo.
unsafe impl Sync for Shard {}

#[inline]
fn mix(addr: usize) -> usize {
    // Heap addresses are 16-byte aligned and clustered: multiply to spread.
    let h = (addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 31)
}

/// Granules (16 bytes) of a region.
const REGION_BITS: u32 = 5;

/// The hash of `addr`'s region (2^REGION_BITS granules): splitmix64's
/// finaliser, whose low bits (the shard) and next ones (the group) are
/// spread even for consecutive regions.
#[inline]
fn region_mix(addr: usize) -> usize {
    let mut z = (addr >> (4 + REGION_BITS)) as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as usize
}

/// The shard of `addr`: the same for a whole region.
#[inline]
fn shard_index(addr: usize) -> usize {
    region_mix(addr) & (SHARDS - 1)
}

/// The home slot of `addr` in a shard of `mask + 1` slots: its region's
/// group of 2^REGION_BITS slots, there its granule's slot.
#[inline]
fn home(addr: usize, mask: usize) -> usize {
    let group = (region_mix(addr) >> SHARD_BITS) << REGION_BITS;
    (group | ((addr >> 4) & ((1 << REGION_BITS) - 1))) & mask
}

impl Shard {
    const fn new() -> Self {
        Shard {
            lock: AtomicBool::new(false),
            hint: AtomicUsize::new(0),
            state: UnsafeCell::new(ShardState {
                slots: null_mut(),
                mask: 0,
                len: 0,
            }),
        }
    }

    #[inline]
    fn lock(&self) -> ShardGuard<'_> {
        if crate::base::solo::solo() {
            // The only thread that touches the table (see the module docs).
            return ShardGuard {
                shard: self,
                locked: false,
            };
        }
        sys::spin_lock(&self.lock);
        ShardGuard {
            shard: self,
            locked: true,
        }
    }
}

struct ShardGuard<'a> {
    shard: &'a Shard,
    /// Whether the lock was taken (not while the process is solo).
    locked: bool,
}

impl ShardGuard<'_> {
    #[inline]
    fn st(&mut self) -> &mut ShardState {
        // SAFETY: the lock is held for the guard's lifetime (or the process is solo).
        unsafe { &mut *self.shard.state.get() }
    }

    /// [`ShardState::grow`], publishing the new array in the shard's hint.
    /// Rare (a shard doubles), so out of line; in the hot section all the
    /// same, as a running program's shards keep growing.
    #[cold]
    #[inline(never)]
    #[link_section = "igprof_hot"]
    fn grow(&mut self, first: &FirstPages) -> bool {
        let grown = self.st().grow(first);
        if grown {
            let st = self.st();
            let hint = st.slots as usize | (st.mask + 1).trailing_zeros() as usize;
            self.shard.hint.store(hint, Ordering::Relaxed);
        }
        grown
    }
}

/// Bits of a shard's hint that hold log2 of its capacity: the array
/// starts a page (mmap), and a capacity is below 2^64.
const HINT_LOG2: usize = 63;

impl Drop for ShardGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.locked {
            self.shard.lock.store(false, Ordering::Release);
        }
    }
}

/// A table's first arrays for its shards: one page each, all mapped by one
/// system call on the table's first insert into any shard, instead of one
/// mapping per shard (64 mmap calls and 64 mappings in every program that
/// keeps more than a few blocks). A shard takes the next page when it
/// first needs an array (backed then, by a write: one fault), and gives
/// it back (`MADV_DONTNEED`) when it outgrows it.
struct FirstPages {
    base: AtomicPtr<u8>,
    /// Pages handed out: at most [`SHARDS`], as a shard takes one only
    /// while it has no array, and has one until [`LiveMem::reset`], which
    /// starts over.
    taken: AtomicUsize,
}

impl FirstPages {
    const fn new() -> Self {
        FirstPages {
            base: AtomicPtr::new(null_mut()),
            taken: AtomicUsize::new(0),
        }
    }

    /// Bytes of a first array's page: a page, or more where
    /// [`INITIAL_CAP`] slots do not fit one.
    fn stride() -> usize {
        let page = sys::page_size();
        (INITIAL_CAP * core::mem::size_of::<Block>()).div_ceil(page) * page
    }

    /// A zeroed array of [`INITIAL_CAP`] slots for a shard (its lock
    /// held), its pages backed, or None if memory is refused.
    fn take(&self) -> Option<*mut Block> {
        let stride = Self::stride();
        let mut base = self.base.load(Ordering::Acquire);
        if base.is_null() {
            let ours = sys::map_anon(SHARDS * stride, false).ok()?;
            base = match self.base.compare_exchange(
                null_mut(),
                ours,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => ours,
                Err(theirs) => {
                    // Another shard's first insert mapped them meanwhile.
                    // SAFETY: our own mapping, never published.
                    unsafe { sys::munmap(ours, SHARDS * stride) };
                    theirs
                }
            };
        }
        let i = self.taken.fetch_add(1, Ordering::Relaxed);
        if i >= SHARDS {
            return None;
        }
        let array = base.wrapping_add(i * stride);
        for at in (0..stride).step_by(sys::page_size()) {
            // SAFETY: a page of this shard's part of the mapping, zero: a
            // write of zero backs it (a probe's read first would map the
            // zero page and fault again on the first store).
            unsafe { core::ptr::write_volatile(array.add(at), 0) };
        }
        Some(array as *mut Block)
    }

    /// Gives back the memory of an outgrown array of `cap` slots.
    fn give_back(&self, slots: *mut Block, cap: usize) {
        let stride = Self::stride();
        let base = self.base.load(Ordering::Acquire) as usize;
        let at = slots as usize;
        if base != 0 && at >= base && at < base + SHARDS * stride {
            // SAFETY: the page(s) this shard took; its slots have moved
            // and nothing reads them again.
            unsafe { sys::madvise(at, stride, libc::MADV_DONTNEED) };
        } else {
            // SAFETY: the array is ours alone (lock held) and no longer used.
            unsafe { sys::munmap(slots as *mut u8, cap * core::mem::size_of::<Block>()) };
        }
    }

    /// In a forked child: the parent's pages are abandoned (copies of its
    /// slots, as its other arrays are).
    fn reset(&self) {
        self.base.store(null_mut(), Ordering::Release);
        self.taken.store(0, Ordering::Relaxed);
    }
}

impl ShardState {
    #[inline]
    fn slot(&mut self, i: usize) -> &mut Block {
        // SAFETY: i <= mask and slots has mask+1 entries (callers mask i).
        unsafe { &mut *self.slots.add(i) }
    }

    #[inline]
    fn at(&self, i: usize) -> Block {
        // SAFETY: i <= mask and slots has mask+1 entries (callers mask i).
        unsafe { *self.slots.add(i) }
    }

    fn grow(&mut self, first: &FirstPages) -> bool {
        let old_cap = if self.slots.is_null() {
            0
        } else {
            self.mask + 1
        };
        let cap = if old_cap == 0 {
            INITIAL_CAP
        } else {
            old_cap * 2
        };
        let bytes = cap * core::mem::size_of::<Block>();
        // Populated: probes read before they write, and a rehash touches
        // every page (one fault per page instead of two).
        let new = match old_cap {
            0 => first.take(),
            _ => None,
        };
        let new =
            new.unwrap_or_else(|| sys::map_anon(bytes, true).unwrap_or(null_mut()) as *mut Block);
        if new.is_null() {
            return false;
        }
        let (old, old_mask) = (self.slots, self.mask);
        self.slots = new;
        self.mask = cap - 1;
        for i in 0..old_cap {
            // SAFETY: i < old capacity.
            let b = unsafe { *old.add(i) };
            if b.addr != 0 {
                self.place(b);
            }
        }
        if !old.is_null() {
            first.give_back(old, old_mask + 1);
        }
        true
    }

    /// Puts `b` in the first free slot of its probe sequence (no duplicate check).
    fn place(&mut self, b: Block) {
        let mut i = home(b.addr, self.mask);
        while self.at(i).addr != 0 {
            i = (i + 1) & self.mask;
        }
        *self.slot(i) = b;
    }

    fn find(&self, addr: usize) -> Option<usize> {
        if self.slots.is_null() {
            return None;
        }
        let mut i = home(addr, self.mask);
        loop {
            let a = self.at(i).addr;
            if a == addr {
                return Some(i);
            }
            if a == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes slot `i`, shifting later entries of the cluster back so that
    /// every entry stays reachable from its home slot.
    fn delete_at(&mut self, mut i: usize) {
        let mask = self.mask;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let b = self.at(j);
            if b.addr == 0 {
                break;
            }
            let home = home(b.addr, mask);
            // Move b back into the hole at i unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                *self.slot(i) = b;
                i = j;
            }
        }
        *self.slot(i) = EMPTY;
        self.len -= 1;
    }
}

/// What the recent cache stores instead of a block's address: the address
/// with bits 48-62 flipped, never a user-space pointer (x86-64 and AArch64,
/// also with AArch64's top-byte-ignore). The cache is part of the library's
/// static data, which LeakSanitizer scans for pointers at exit: a real
/// address there would make every leaked block it holds look reachable,
/// and an ASan-built program's leak report and exit status would change
/// under -mp. (The shards are anonymous mmap, which it does not scan.) An
/// empty slot stores `HIDE` (address 0).
const HIDE: usize = !(usize::MAX >> 16) & (usize::MAX >> 1);

/// An empty recent-cache slot as stored.
const RECENT_EMPTY: Block = Block {
    addr: HIDE,
    ..EMPTY
};

/// Writes a recent-cache slot one 8-byte field at a time (see
/// [`LiveMem::insert`]); the address hidden ([`HIDE`]).
#[inline(always)]
fn set_fields(slot: &mut Block, addr: usize, size: u64, node: *const Node) {
    // SAFETY: three aligned fields of a live &mut Block.
    unsafe {
        core::ptr::write_volatile(&mut slot.addr, addr ^ HIDE);
        core::ptr::write_volatile(&mut slot.size, size);
        core::ptr::write_volatile(&mut slot.node, node);
    }
}

/// Reads a recent-cache slot one 8-byte field at a time (the address as
/// it is, not as stored).
#[inline(always)]
fn fields(slot: &Block) -> Block {
    // SAFETY: three aligned fields of a live &Block.
    unsafe {
        Block {
            addr: core::ptr::read_volatile(&slot.addr) ^ HIDE,
            size: core::ptr::read_volatile(&slot.size),
            node: core::ptr::read_volatile(&slot.node),
        }
    }
}

/// Why a resource could not be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveError {
    /// mmap refused memory for a bigger table; the resource is not tracked.
    OutOfMemory { wanted_slots: usize },
    /// The descriptor is beyond the RLIMIT_NOFILE hard limit seen at start-up.
    FdOutOfRange { fd: i32, limit: usize },
}

impl core::fmt::Display for LiveError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LiveError::OutOfMemory { wanted_slots } => {
                write!(
                    f,
                    "no memory for a live-block table of {wanted_slots} slots"
                )
            }
            LiveError::FdOutOfRange { fd, limit } => {
                write!(
                    f,
                    "descriptor {fd} is above the descriptor limit {limit} seen at start-up"
                )
            }
        }
    }
}

/// Slots of [`LiveMem`]'s cache of recent blocks (24 KiB, direct-mapped).
const RECENT: usize = 1024;

/// Live heap blocks: address -> (size, acquiring node).
///
/// While the process is [`crate::base::solo`], a block is first kept in a
/// small direct-mapped cache of recent blocks (`recent`), and goes to the
/// hashed shards only when a newer block takes its slot: most blocks are
/// freed soon after they are made (83% of perl's frees find their block
/// among the last 256 made, 90% among 1024), and the shards, megabytes
/// in all, cost a cache miss per insert and per remove of a block with
/// no recent neighbour (see the module docs). The
/// cache is emptied into the shards before a second thread exists
/// ([`LiveMem::flush_recent`]) and is not used after.
pub struct LiveMem {
    shards: [Shard; SHARDS],
    first: FirstPages,
    recent: UnsafeCell<[Block; RECENT]>,
    /// Tests: behave as in a solo process whatever the process is.
    always_solo: bool,
}

// SAFETY: `recent` is only touched by the process's only thread while it is
// solo (and by the dumper on that same thread); the shards lock themselves.
unsafe impl Sync for LiveMem {}

impl Default for LiveMem {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveMem {
    pub const fn new() -> Self {
        LiveMem {
            shards: [const { Shard::new() }; SHARDS],
            first: FirstPages::new(),
            recent: UnsafeCell::new([RECENT_EMPTY; RECENT]),
            always_solo: false,
        }
    }

    /// Whether the recent cache is in use (the process is solo).
    #[inline]
    fn solo(&self) -> bool {
        self.always_solo || crate::base::solo::solo()
    }

    #[inline]
    fn shard(&self, addr: usize) -> &Shard {
        &self.shards[shard_index(addr)]
    }

    /// The recent-cache slot of `addr`, while the process is solo.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    fn recent_slot(&self, addr: usize) -> Option<&mut Block> {
        if !self.solo() {
            return None;
        }
        // SAFETY: solo: the only thread that touches the table is this one,
        // and it holds no other reference into `recent` (every use is one
        // call deep, and a signal handler that interrupts it defers its
        // events: module docs).
        Some(unsafe { &mut (*self.recent.get())[self.recent_index(addr)] })
    }

    /// The recent-cache slot that `addr` takes.
    #[inline(always)]
    fn recent_index(&self, addr: usize) -> usize {
        (mix(addr) >> SHARD_BITS) & (RECENT - 1)
    }

    /// Bytes of the shards' slot arrays (each mapped and populated whole
    /// as its shard grew; they never shrink), for `-d`.
    pub fn table_bytes(&self) -> usize {
        let slots = |s: &Shard| {
            let mut g = s.lock();
            let st = g.st();
            if st.slots.is_null() {
                0
            } else {
                st.mask + 1
            }
        };
        self.shards.iter().map(slots).sum::<usize>() * core::mem::size_of::<Block>()
    }

    /// Records block `addr`. If `addr` was already recorded (its free was
    /// not seen, e.g. it happened before profiling started), the stale
    /// entry is replaced and returned so the caller can release it. (With
    /// the recent cache, a stale entry in the shards is found, and
    /// returned, when the new block moves there.)
    #[inline(always)]
    pub fn insert(
        &self,
        addr: usize,
        size: u64,
        node: *const Node,
    ) -> Result<Option<Block>, LiveError> {
        debug_assert!(addr != 0);
        let Some(slot) = self.recent_slot(addr) else {
            return self.insert_shard(Block { addr, size, node });
        };
        let older = fields(slot);
        // Stored (and read back by `remove`) one 8-byte field at a time: a
        // free often follows its malloc within nanoseconds, and a 16-byte
        // access over two 8-byte ones stalls store forwarding (a third of
        // the allocation path's time on alloc_churn). Volatile keeps the
        // compiler from merging the fields into one 16-byte access.
        set_fields(slot, addr, size, node);
        if older.addr == addr {
            return Ok(Some(older));
        }
        if older.addr == 0 {
            return Ok(None);
        }
        // The older block moves to the shards; a stale entry found there
        // is released by the caller like one of `addr`'s.
        self.insert_shard(older)
            .inspect_err(|_| set_fields(slot, older.addr, older.size, older.node))
    }

    #[inline(never)]
    #[link_section = "igprof_hot"]
    fn insert_shard(&self, b: Block) -> Result<Option<Block>, LiveError> {
        let mut g = self.shard(b.addr).lock();
        let st = g.st();
        if let Some(i) = st.find(b.addr) {
            let old = st.at(i);
            *st.slot(i) = b;
            return Ok(Some(old));
        }
        if st.slots.is_null() || (st.len + 1) * 4 > (st.mask + 1) * 3 {
            let wanted = if st.slots.is_null() {
                INITIAL_CAP
            } else {
                (st.mask + 1) * 2
            };
            if !g.grow(&self.first) {
                return Err(LiveError::OutOfMemory {
                    wanted_slots: wanted,
                });
            }
        }
        let st = g.st();
        st.place(b);
        st.len += 1;
        Ok(None)
    }

    /// Forgets block `addr` and returns what was recorded for it.
    #[inline(always)]
    pub fn remove(&self, addr: usize) -> Option<Block> {
        if let Some(slot) = self.recent_slot(addr) {
            if slot.addr == addr ^ HIDE {
                // Field by field (see `insert`).
                let b = fields(slot);
                set_fields(slot, 0, 0, core::ptr::null());
                return Some(b);
            }
        }
        self.remove_shard(addr)
    }

    /// Starts loading the table slot that [`LiveMem::insert`] of `addr`
    /// will probe first, for a caller with work to do before inserting
    /// (the allocation's stack walk): the probe's cache miss, most of an
    /// insert into megabytes of table, then overlaps that work. While the
    /// process is solo the slot is the one of the recent block that `addr`
    /// will move to the shards, if any. Reads only; safe anywhere the
    /// table may be used.
    #[inline(always)]
    pub fn prefetch_insert(&self, addr: usize) {
        let target = match self.recent_addr(addr) {
            Some(older) if older == 0 || older == addr => return,
            Some(older) => older,
            None => addr,
        };
        self.prefetch_home(target);
    }

    /// As [`LiveMem::prefetch_insert`], for [`LiveMem::remove`] of `addr`
    /// (nothing while the recent cache holds it).
    #[inline(always)]
    pub fn prefetch_remove(&self, addr: usize) {
        if self.recent_addr(addr) != Some(addr) {
            self.prefetch_home(addr);
        }
    }

    /// The address in `addr`'s recent-cache slot (0: none), while solo;
    /// read with a volatile load through a raw pointer, so that a signal
    /// handler which interrupts an update of the slot reads a stale value
    /// and nothing else.
    #[inline(always)]
    fn recent_addr(&self, addr: usize) -> Option<usize> {
        if !self.solo() {
            return None;
        }
        let i = self.recent_index(addr);
        // SAFETY: i < RECENT; a read of this thread's own static data.
        let stored =
            unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*self.recent.get())[i].addr)) };
        Some(stored ^ HIDE)
    }

    /// Where the home slot of `addr` is, as its shard's hint says (None:
    /// the shard has no array).
    #[inline(always)]
    fn hinted_home(&self, addr: usize) -> Option<usize> {
        let hint = self.shard(addr).hint.load(Ordering::Relaxed);
        if hint == 0 {
            return None;
        }
        let mask = (1usize << (hint & HINT_LOG2)) - 1;
        let slots = hint & !HINT_LOG2;
        Some(slots.wrapping_add(home(addr, mask) * core::mem::size_of::<Block>()))
    }

    /// Prefetches the home slot of `addr` in its shard and the line after
    /// it, as the shard's hint gives the array.
    #[inline(always)]
    fn prefetch_home(&self, addr: usize) {
        let Some(at) = self.hinted_home(addr) else {
            return;
        };
        sys::prefetch(at as *const u8);
        // A probe goes on through the following slots of its cluster (and
        // a removal shifts them back), often into the next cache line.
        sys::prefetch(at.wrapping_add(64) as *const u8);
    }

    #[inline(never)]
    #[link_section = "igprof_hot"]
    fn remove_shard(&self, addr: usize) -> Option<Block> {
        let mut g = self.shard(addr).lock();
        let st = g.st();
        let i = st.find(addr)?;
        let b = st.at(i);
        st.delete_at(i);
        Some(b)
    }

    /// What is recorded for `addr`, without removing it.
    pub fn get(&self, addr: usize) -> Option<Block> {
        if let Some(slot) = self.recent_slot(addr) {
            if slot.addr == addr ^ HIDE {
                return Some(fields(slot));
            }
        }
        let mut g = self.shard(addr).lock();
        let st = g.st();
        st.find(addr).map(|i| st.at(i))
    }

    /// Moves the recent blocks to the shards (the process is about to have
    /// a second thread; still solo). Calls `stale` with each stale entry
    /// the moves replace, and with each block that could not be moved.
    pub fn flush_recent(&self, mut stale: impl FnMut(&Block, bool)) {
        if !self.solo() {
            return;
        }
        for i in 0..RECENT {
            // SAFETY: solo (checked above): this thread is the only user.
            let b =
                fields(&unsafe { core::mem::replace(&mut (*self.recent.get())[i], RECENT_EMPTY) });
            if b.addr == 0 {
                continue;
            }
            match self.insert_shard(b) {
                Ok(Some(old)) => stale(&old, true),
                Ok(None) => {}
                Err(_) => stale(&b, false),
            }
        }
    }

    /// The recent cache's blocks (empty unless the process is solo).
    fn recent_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        (0..if self.solo() { RECENT } else { 0 })
            // SAFETY: solo: this thread is the only user.
            .map(move |i| fields(unsafe { &(*self.recent.get())[i] }))
            .filter(|b| b.addr != 0)
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.recent_blocks().count()
            + self
                .shards
                .iter()
                .map(|s| {
                    let mut g = s.lock();
                    g.st().len
                })
                .sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` for every live block, one shard at a time (each shard is
    /// locked while it is visited: `f` must not touch this table).
    pub fn for_each(&self, mut f: impl FnMut(&Block)) {
        for b in self.recent_blocks() {
            f(&b);
        }
        for s in self.shards.iter() {
            let mut g = s.lock();
            let st = g.st();
            if st.slots.is_null() {
                continue;
            }
            for i in 0..=st.mask {
                let b = st.at(i);
                if b.addr != 0 {
                    f(&b);
                }
            }
        }
    }

    /// In a forked child: every lock free, every table empty. The arrays
    /// are dropped without unmapping (another thread of the parent may have
    /// been inside one at fork time; its copy is simply abandoned).
    pub fn reset(&self) {
        // SAFETY: only the forking thread exists in the child.
        unsafe { *self.recent.get() = [RECENT_EMPTY; RECENT] };
        for s in self.shards.iter() {
            // SAFETY: only the forking thread exists in the child; nobody
            // holds or waits for the lock.
            let st = unsafe { &mut *s.state.get() };
            st.slots = null_mut();
            st.mask = 0;
            st.len = 0;
            s.hint.store(0, Ordering::Relaxed);
            s.lock.store(false, Ordering::Release);
        }
        self.first.reset();
    }
}

/// Live descriptors: one atomic node pointer per descriptor number.
pub struct LiveFds {
    slots: AtomicPtr<AtomicPtr<Node>>,
    limit: AtomicUsize,
}

impl Default for LiveFds {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveFds {
    pub const fn new() -> Self {
        LiveFds {
            slots: AtomicPtr::new(null_mut()),
            limit: AtomicUsize::new(0),
        }
    }

    /// Reserves one slot per descriptor below `limit` (start-up; pages are
    /// only backed when touched).
    pub fn init(&self, limit: usize) -> Result<(), LiveError> {
        let limit = limit.clamp(1024, 1 << 24);
        let p =
            sys::mmap_anon(limit * core::mem::size_of::<AtomicPtr<Node>>()) as *mut AtomicPtr<Node>;
        if p.is_null() {
            return Err(LiveError::OutOfMemory {
                wanted_slots: limit,
            });
        }
        self.limit.store(limit, Ordering::Relaxed);
        self.slots.store(p, Ordering::Release);
        Ok(())
    }

    #[inline]
    fn slot(&self, fd: i32) -> Result<&AtomicPtr<Node>, LiveError> {
        let limit = self.limit.load(Ordering::Relaxed);
        let p = self.slots.load(Ordering::Acquire);
        if fd < 0 || fd as usize >= limit || p.is_null() {
            return Err(LiveError::FdOutOfRange { fd, limit });
        }
        // SAFETY: fd < limit and the array has `limit` slots, never unmapped.
        Ok(unsafe { &*p.add(fd as usize) })
    }

    /// Records `fd` as acquired by `node`; returns the node it replaced
    /// (a descriptor whose close was not seen, e.g. closed by a raw system
    /// call or inherited), which the caller should release.
    pub fn acquire(&self, fd: i32, node: *const Node) -> Result<*const Node, LiveError> {
        Ok(self.slot(fd)?.swap(node as *mut Node, Ordering::AcqRel))
    }

    /// Forgets `fd`; returns its acquiring node (null if not tracked).
    pub fn release(&self, fd: i32) -> *const Node {
        match self.slot(fd) {
            Ok(s) => s.swap(null_mut(), Ordering::AcqRel),
            Err(_) => core::ptr::null(),
        }
    }

    /// The node that acquired `fd` (null if not tracked).
    pub fn get(&self, fd: i32) -> *const Node {
        match self.slot(fd) {
            Ok(s) => s.load(Ordering::Acquire),
            Err(_) => core::ptr::null(),
        }
    }

    /// Calls `f(fd, node)` for every tracked descriptor below `upto`.
    pub fn for_each(&self, upto: usize, mut f: impl FnMut(i32, *const Node)) {
        let limit = self.limit.load(Ordering::Relaxed).min(upto);
        let p = self.slots.load(Ordering::Acquire);
        if p.is_null() {
            return;
        }
        for fd in 0..limit {
            // SAFETY: fd < limit.
            let n = unsafe { &*p.add(fd) }.load(Ordering::Acquire);
            if !n.is_null() {
                f(fd as i32, n);
            }
        }
    }

    /// In a forked child: nothing tracked (the parent's descriptors were
    /// acquired in the parent's profile).
    pub fn reset(&self) {
        let limit = self.limit.load(Ordering::Relaxed);
        let p = self.slots.load(Ordering::Acquire);
        if p.is_null() {
            return;
        }
        for fd in 0..limit {
            // SAFETY: fd < limit.
            let s = unsafe { &*p.add(fd) };
            if !s.load(Ordering::Relaxed).is_null() {
                s.store(null_mut(), Ordering::Relaxed);
            }
        }
    }

    /// One past the highest descriptor that can be tracked.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table that uses its recent cache, as in a solo process.
    fn solo_table() -> &'static LiveMem {
        Box::leak(Box::new(LiveMem {
            always_solo: true,
            ..LiveMem::new()
        }))
    }

    /// The slot a probe for `addr` starts at, as the shard's array is.
    fn actual_home(t: &LiveMem, addr: usize) -> Option<usize> {
        let mut g = t.shard(addr).lock();
        let st = g.st();
        (!st.slots.is_null())
            .then(|| st.slots as usize + home(addr, st.mask) * core::mem::size_of::<Block>())
    }

    #[test]
    fn the_prefetch_hint_follows_each_shards_array() {
        let t: &LiveMem = Box::leak(Box::new(LiveMem::new()));
        let node = 0x10 as *const Node;
        let addrs: Vec<usize> = (0..40_000).map(|i| 0x7f00_0000_0000 + i * 48).collect();
        assert_eq!(t.hinted_home(addrs[0]), None);
        for (i, &a) in addrs.iter().enumerate() {
            t.insert_shard(Block {
                addr: a,
                size: 1,
                node,
            })
            .unwrap();
            // Every shard's array grows several times on the way.
            if i % 997 == 0 {
                for &b in &addrs[..=i] {
                    assert_eq!(t.hinted_home(b), actual_home(t, b), "block {b:#x}");
                }
            }
        }
        for &a in &addrs {
            assert!(t.hinted_home(a).is_some());
            assert_eq!(t.hinted_home(a), actual_home(t, a));
        }
        t.reset();
        assert!(addrs.iter().all(|&a| t.hinted_home(a).is_none()));
    }

    #[test]
    fn every_shards_first_array_is_a_page_of_one_mapping() {
        let t: &LiveMem = Box::leak(Box::new(LiveMem::new()));
        let node = 0x10 as *const Node;
        let arrays = |t: &LiveMem| -> Vec<usize> {
            t.shards
                .iter()
                .map(|s| {
                    // SAFETY: no other thread uses this table.
                    unsafe { (*s.state.get()).slots as usize }
                })
                .collect()
        };
        // One block per shard: no shard grows past its first array.
        let mut a = 0x7f00_0000_0000usize;
        while t.shards.iter().any(|s| s.hint.load(Ordering::Relaxed) == 0) {
            t.insert_shard(Block {
                addr: a,
                size: 1,
                node,
            })
            .unwrap();
            a += 512;
        }
        let base = t.first.base.load(Ordering::Relaxed) as usize;
        let stride = FirstPages::stride();
        let mut first = arrays(t);
        first.sort();
        let expected: Vec<usize> = (0..SHARDS).map(|i| base + i * stride).collect();
        assert_eq!(first, expected);
        // Growing moves every shard out of it; every block stays found.
        let mut all = Vec::new();
        for i in 0..20_000usize {
            let b = 0x7e00_0000_0000 + i * 48;
            t.insert_shard(Block {
                addr: b,
                size: 1,
                node,
            })
            .unwrap();
            all.push(b);
        }
        assert!(arrays(t)
            .iter()
            .all(|&x| x < base || x >= base + SHARDS * stride));
        assert!(all.iter().all(|&b| t.get(b).is_some()));
        // A forked child's table starts over with pages of its own.
        t.reset();
        assert!(t.first.base.load(Ordering::Relaxed).is_null());
        t.insert_shard(Block {
            addr: a,
            size: 1,
            node,
        })
        .unwrap();
        assert_eq!(t.get(a).map(|b| b.addr), Some(a));
        assert_eq!(t.first.taken.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_insert_prefetches_for_the_block_it_moves_to_the_shards() {
        let t = solo_table();
        let node = 0x10 as *const Node;
        let a = 0x5555_0000_0010usize;
        // Another address with the same recent slot.
        let b = (1..100_000)
            .map(|i| a + i * 16)
            .find(|&b| t.recent_index(b) == t.recent_index(a))
            .unwrap();
        assert_eq!(t.recent_addr(a), Some(0));
        t.insert(a, 1, node).unwrap();
        assert_eq!(t.recent_addr(b), Some(a), "b's insert would move a");
        t.insert(b, 1, node).unwrap();
        assert_eq!(t.recent_addr(a), Some(b));
        assert!(t.get(a).is_some() && actual_home(t, a) == t.hinted_home(a));
        assert_eq!(t.remove(b).map(|x| x.addr), Some(b));
        assert_eq!(t.recent_addr(b), Some(0));
    }

    #[test]
    fn the_recent_cache_and_the_shards_hold_every_block_once() {
        use std::collections::HashMap;
        let t = solo_table();
        let mut model: HashMap<usize, u64> = HashMap::new();
        let mut x: u64 = 12345;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let node = 0x10 as *const Node;
        // Addresses from a small range: recent-slot collisions and moves
        // to the shards happen all the time. As from a real allocator, an
        // address is handed out again only after its free.
        for round in 0..60_000u64 {
            let addr = 0x10_0000 + (next() % 20_000) as usize * 16;
            match model.entry(addr) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    assert_eq!(t.remove(addr).map(|b| b.size), Some(e.remove()), "{round}");
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    assert_eq!(t.insert(addr, round, node).unwrap(), None, "{round}");
                    e.insert(round);
                }
            }
            if round % 7919 == 0 {
                assert_eq!(t.len(), model.len(), "{round}");
            }
        }
        for (&a, &sz) in model.iter().take(500) {
            assert_eq!(t.get(a).map(|b| b.size), Some(sz));
        }
        let mut seen = 0;
        t.for_each(|b| {
            assert_eq!(model.get(&b.addr), Some(&b.size));
            seen += 1;
        });
        assert_eq!(seen, model.len());
        // Flushed: everything in the shards, nothing replaced twice.
        let mut replaced = 0;
        t.flush_recent(|_, r| replaced += r as usize);
        assert_eq!(replaced, 0);
        assert_eq!(t.len(), model.len());
        for (&a, &sz) in model.iter() {
            assert_eq!(t.remove(a).map(|b| b.size), Some(sz));
        }
        assert!(t.is_empty());
    }

    #[test]
    fn a_stale_block_is_released_when_its_address_reaches_the_shards_again() {
        let t = solo_table();
        let node = 0x10 as *const Node;
        // Two addresses with the same recent slot.
        let a = 0x20_0000usize;
        let slot = |x: usize| (mix(x) >> SHARD_BITS) & (RECENT - 1);
        let b = (1..100_000)
            .map(|k| a + 16 * k)
            .find(|&x| slot(x) == slot(a))
            .unwrap();
        t.insert(a, 1, node).unwrap();
        t.insert(b, 2, node).unwrap(); // a moves to the shards
                                       // a's free was missed; the allocator hands a out again.
        assert_eq!(t.insert(a, 3, node).unwrap(), None); // b moves to the shards
                                                         // When the new a moves to the shards it replaces the stale one,
                                                         // which is returned for release.
        let stale = t.insert(b, 4, node).unwrap();
        assert_eq!(stale.map(|s| (s.addr, s.size)), Some((a, 1)));
    }
    use std::collections::HashMap;

    fn n(i: usize) -> *const Node {
        (0x1000 + i * 64) as *const Node
    }

    #[test]
    fn insert_remove_matches_a_model_under_churn() {
        let t = LiveMem::new();
        let mut model: HashMap<usize, (u64, usize)> = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Addresses from a small 16-aligned range so that clusters,
            // wrap-around and reuse all happen.
            let addr = 0x5555_0000_0000usize + ((x % 30_000) as usize) * 16;
            if x & 1 == 0 {
                let old = t.insert(addr, step, n(step as usize % 7)).unwrap();
                let prev = model.insert(addr, (step, step as usize % 7));
                assert_eq!(old.map(|b| (b.size, b.node)), prev.map(|(s, k)| (s, n(k))));
            } else {
                let got = t.remove(addr);
                let want = model.remove(&addr);
                assert_eq!(got.map(|b| (b.size, b.node)), want.map(|(s, k)| (s, n(k))));
            }
        }
        assert_eq!(t.len(), model.len());
        let mut seen = 0;
        t.for_each(|b| {
            seen += 1;
            assert_eq!(model.get(&b.addr).map(|&(s, _)| s), Some(b.size));
        });
        assert_eq!(seen, model.len());
        for (&a, &(s, _)) in &model {
            assert_eq!(t.get(a).map(|b| b.size), Some(s));
        }
    }

    #[test]
    fn a_regions_blocks_share_a_shard_and_neighbouring_slots() {
        let mask = (1 << 16) - 1;
        let base = 0x5555_0000_0200usize;
        let first = home(base, mask);
        for k in 0..(1 << REGION_BITS) {
            let addr = base + 16 * k;
            assert_eq!(shard_index(addr), shard_index(base), "granule {k}");
            assert_eq!(home(addr, mask), first + k, "granule {k}");
        }
    }

    #[test]
    fn consecutive_regions_spread_over_every_shard_and_group() {
        // 1,024 regions of one heap: every shard gets at least a third of
        // its share, none more than twice it, and the groups of one shard
        // spread too.
        let mut per_shard = [0usize; SHARDS];
        let mut groups = std::collections::BTreeSet::new();
        for r in 0..1024usize {
            let addr = 0x5555_0000_0000 + (r << (4 + REGION_BITS));
            per_shard[shard_index(addr)] += 1;
            if shard_index(addr) == 0 {
                groups.insert(home(addr, (1 << 20) - 1) >> REGION_BITS);
            }
        }
        let share = 1024 / SHARDS;
        assert!(
            per_shard.iter().all(|&n| 3 * n >= share && n <= 2 * share),
            "{per_shard:?}"
        );
        assert_eq!(
            groups.len(),
            per_shard[0],
            "regions of shard 0 share a group"
        );
    }

    #[test]
    fn grows_far_beyond_initial_capacity_and_empties() {
        let t = LiveMem::new();
        assert_eq!(t.table_bytes(), 0);
        let count = SHARDS * INITIAL_CAP * 4;
        for i in 0..count {
            assert_eq!(t.insert(0x10_0000 + i * 16, i as u64, n(0)).unwrap(), None);
        }
        assert_eq!(t.len(), count);
        // Each shard: the smallest power of two from INITIAL_CAP on that
        // holds its blocks at most 3/4 full.
        let mut per_shard = [0usize; SHARDS];
        for i in 0..count {
            per_shard[shard_index(0x10_0000 + i * 16)] += 1;
        }
        let cap = |len: usize| {
            let mut c = INITIAL_CAP;
            while len * 4 > c * 3 {
                c *= 2;
            }
            c
        };
        let slots: usize = per_shard.iter().map(|&l| cap(l)).sum();
        assert_eq!(t.table_bytes(), slots * core::mem::size_of::<Block>());
        for i in 0..count {
            assert_eq!(t.remove(0x10_0000 + i * 16).map(|b| b.size), Some(i as u64));
        }
        assert!(t.is_empty());
        assert_eq!(t.remove(0x10_0000), None);
    }

    #[test]
    fn threads_freeing_each_others_blocks_leave_nothing() {
        let t: &'static LiveMem = Box::leak(Box::new(LiveMem::new()));
        let per = 50_000usize;
        let hs: Vec<_> = (0..8usize)
            .map(|k| {
                std::thread::spawn(move || {
                    // Thread k inserts its own range and removes thread (k+1)%8's,
                    // retrying until the owner has put each one in.
                    for i in 0..per {
                        t.insert(((k * per + i) + 1) * 16, 1, n(k)).unwrap();
                    }
                    let other = (k + 1) % 8;
                    let mut i = 0;
                    while i < per {
                        if t.remove(((other * per + i) + 1) * 16).is_some() {
                            i += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(t.is_empty());
    }

    #[test]
    fn reset_forgets_everything() {
        let t = LiveMem::new();
        t.insert(0x40, 1, n(1)).unwrap();
        t.reset();
        assert!(t.is_empty());
        assert_eq!(t.get(0x40), None);
        t.insert(0x40, 2, n(2)).unwrap();
        assert_eq!(t.get(0x40).map(|b| b.size), Some(2));
    }

    #[test]
    fn fd_slots_swap_exactly() {
        let f = LiveFds::new();
        assert!(f.acquire(3, n(1)).is_err(), "not initialised");
        f.init(4096).unwrap();
        assert_eq!(f.acquire(3, n(1)).unwrap(), core::ptr::null());
        assert_eq!(
            f.acquire(3, n(2)).unwrap(),
            n(1),
            "a replaced descriptor is reported"
        );
        assert_eq!(f.get(3), n(2));
        assert_eq!(f.release(3), n(2));
        assert_eq!(f.release(3), core::ptr::null());
        assert_eq!(
            f.acquire(4096, n(1)),
            Err(LiveError::FdOutOfRange {
                fd: 4096,
                limit: 4096
            })
        );
        assert_eq!(
            f.acquire(-1, n(1)),
            Err(LiveError::FdOutOfRange {
                fd: -1,
                limit: 4096
            })
        );
        f.acquire(7, n(3)).unwrap();
        let mut v = Vec::new();
        f.for_each(usize::MAX, |fd, node| v.push((fd, node)));
        assert_eq!(v, vec![(7, n(3))]);
        f.reset();
        assert_eq!(f.get(7), core::ptr::null());
    }
}
