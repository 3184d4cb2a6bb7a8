//! The stack memo: skip the stack walk when an allocation comes from the
//! same stack as one the thread had before.
//!
//! A stack walk is a pure function of the registers it starts from, the
//! stack words it reads and the unwind tables. The hot allocation hooks
//! are entered through small naked stubs ([`super::hooks::entry`]) that pass the
//! program's stack pointer and frame pointer at the call (AArch64: and the
//! link register) to the hook. A full walk records the stack words it
//! depends on in the program's frames (`unwind::ReadLog`: return-address
//! slots, CFA-relative slots, signal frames, saved frame pointers that a
//! later frame used: about one or two words a frame); the memo keeps the
//! stack pointer and return address at the call (and the frame pointer
//! when the walk used it), the (offset from the stack pointer, value)
//! pairs, the module table generation and the call-tree node. A later
//! event with the same registers and the same values at those addresses
//! gets that node without walking: it is what the walk would return,
//! whatever else on the stack changed (locals, spilled registers,
//! arguments, a frame pointer register used for data). Anything different
//! is a miss and walks as usual.
//!
//! The remembered walks are a small set-associative table per thread,
//! chosen by stack pointer and return address: a program's allocation
//! sites recur within a few hundred events (sqlite3 inserting rows: all
//! but 229 of its 4 million allocations hit). After many misses in a row
//! the memo rests for a while, so that programs whose stacks always differ
//! pay almost nothing for it. `IGPROF_MEMO_CHECK=1` walks on every hit too
//! and counts hits that would have given another node (`-d` says).
//!
//! Not used for calls on an alternate signal stack (the walk may continue
//! on another stack), while another hook of ours is active on the thread,
//! for walks cut by the depth limit, or for walks whose record cannot be
//! replayed (a first frame other than the caller's, a read outside the
//! thread's stack above the call, a refused read, more words than a slot
//! holds: see `unwind::ReadLog`). A dlopen/dlclose between two events
//! changes the module table generation: a miss.
//!
//! Must never: read outside the thread's stack above the program's stack
//! pointer, allocate in a hook (the table is mapped with the thread's
//! other extras), or lock.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::base::thread::ThreadState;
use crate::base::tree::Node;
use crate::unwind::ReadLog;

/// Registers of the program at the call of a hooked function.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct EntryRegs {
    pub sp: usize,
    pub fp: usize,
    /// The return address when it is in a register (AArch64 LR); 0 on x86-64.
    pub lr: usize,
}

/// Misses in a row after which the memo rests, and for how many events: a
/// miss costs a set scan and a copy of the words, a tenth of a walk, so the
/// memo rests late and briefly (cc1plus, whose stacks are often new: 77% of
/// its allocations hit, 70% with 64 and 4096).
const MISS_LIMIT: u32 = 256;
const REST: u32 = 1024;

/// Sets of the memo table, chosen by the stack pointer and return address
/// at the call, and walks remembered per set. A program's allocation sites
/// recur within a few hundred events (sqlite3 inserting rows: all but 229
/// of its 4 million stacks were among the previous 256).
const SETS: usize = 32;
const WAYS: usize = 32;
const _: () = assert!(WAYS <= 32, "a set's ways are a u32 bit mask");
/// Stack words the remembered walks of a thread share (a ring: storing a
/// walk overwrites the oldest words, and the walks that had them are
/// forgotten), and the most one walk may have. 32768 words hold all 1024
/// walks of 32 words (sqlite3's) or the last 300 of 100 (cc1plus's).
const POOL: usize = 32768;
const MAX_WORDS: usize = 256;
const _: () = assert!(POOL.is_power_of_two() && MAX_WORDS <= POOL);

/// Hits and misses, counted per thread in one of `SHARDS` cache lines
/// (by thread id) without a locked instruction: a hit costs a few
/// nanoseconds, and a shared atomic counter cost as much as the rest of it.
/// Two threads that share a shard may lose a count to each other.
const SHARDS: usize = 64;

#[repr(align(64))]
struct Shard {
    hits: AtomicU64,
    misses: AtomicU64,
}

static COUNTS: [Shard; SHARDS] = [const {
    Shard {
        hits: AtomicU64::new(0),
        misses: AtomicU64::new(0),
    }
}; SHARDS];

#[inline]
#[link_section = "igprof_hot"]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Stack memo hits so far, all threads.
pub fn hits() -> u64 {
    COUNTS.iter().map(|s| s.hits.load(Ordering::Relaxed)).sum()
}

/// Stack memo misses so far (events that walked while the memo was not
/// resting), all threads.
pub fn misses() -> u64 {
    COUNTS
        .iter()
        .map(|s| s.misses.load(Ordering::Relaxed))
        .sum()
}

/// `IGPROF_MEMO_CHECK=1`: every hit also walks, and a hit whose node is not
/// the walk's is counted (a test of the memo's soundness; `-d` reports it).
static CHECK: AtomicU8 = AtomicU8::new(CHECK_UNKNOWN);
const CHECK_UNKNOWN: u8 = 2;
static CHECKED: AtomicU64 = AtomicU64::new(0);
static WRONG: AtomicU64 = AtomicU64::new(0);

/// Whether hits are checked (read from the environment at start-up).
#[inline]
#[link_section = "igprof_hot"]
pub fn checking() -> bool {
    CHECK.load(Ordering::Relaxed) == 1
}

/// Reads `IGPROF_MEMO_CHECK` (module start-up, before any hook is
/// installed).
pub fn init_check() {
    if CHECK.load(Ordering::Relaxed) == CHECK_UNKNOWN {
        let on = std::env::var_os("IGPROF_MEMO_CHECK").is_some_and(|v| v == "1");
        CHECK.store(on as u8, Ordering::Relaxed);
    }
}

/// A checked hit: the memo's node and the walk's.
#[link_section = "igprof_hot"]
pub fn checked(memo: *mut Node, walked: *mut Node) {
    CHECKED.fetch_add(1, Ordering::Relaxed);
    if memo != walked {
        WRONG.fetch_add(1, Ordering::Relaxed);
    }
}

/// `-d`: what the check found.
pub fn report_check() {
    if checking() {
        crate::igprof_log!(
            "stack memo check: {} hits walked again, {} gave another node",
            CHECKED.load(Ordering::Relaxed),
            WRONG.load(Ordering::Relaxed)
        );
    }
}

/// One remembered walk (all zero: unused).
#[repr(C)]
struct Slot {
    /// The program's stack pointer and return address at the call.
    sp: usize,
    ret: usize,
    /// Its frame pointer at the call, when the walk used it.
    fp: usize,
    node: *mut Node,
    /// Where its words start in the pool (a position that only grows).
    start: u64,
    /// Words the walk read (0: unused slot).
    len: u32,
    generation: u32,
    fp_used: bool,
    /// The way that hit after this one last time (a hint: tried first by
    /// the next lookup that misses this way; a program's allocation
    /// stacks through one call site come round in the same order).
    succ: u8,
    /// The walk's first word (offset and value), also in the pool: a scan
    /// of a set's ways rejects a walk on it without reading the pool.
    first_off: u32,
    first_val: usize,
}
const _: () = assert!(
    core::mem::size_of::<Slot>() == 64,
    "a slot is one cache line"
);

/// The pool of remembered stack words: where each is, in bytes above the
/// stack pointer at the call, and its value.
#[repr(C)]
struct Pool {
    offsets: [u32; POOL],
    values: [usize; POOL],
}

/// The table of remembered walks (`SETS * WAYS` slots) and their pool, in
/// a mapping of their own, zero-filled and touched only as it is used;
/// before the slots, one 32-bit tag per slot (a hash of its stack pointer
/// and return address, 0 when unused), so that a lookup scans a set's 128
/// bytes of tags instead of its 2048 bytes of slots.
struct Table {
    base: *mut u8,
    /// Pool position of the next word stored.
    head: u64,
}

const TAGS_BYTES: usize = SETS * WAYS * core::mem::size_of::<u32>();
const SLOTS_BYTES: usize = SETS * WAYS * core::mem::size_of::<Slot>();
const TABLE_BYTES: usize = TAGS_BYTES + SLOTS_BYTES + core::mem::size_of::<Pool>();
const _: () = assert!(TAGS_BYTES.is_multiple_of(core::mem::align_of::<Slot>()));
const _: () = assert!((TAGS_BYTES + SLOTS_BYTES).is_multiple_of(core::mem::align_of::<Pool>()));

impl Table {
    #[link_section = "igprof_hot"]
    fn new() -> Option<Table> {
        let p = crate::sys::mmap_anon(TABLE_BYTES);
        (!p.is_null()).then_some(Table { base: p, head: 0 })
    }

    #[inline]
    #[link_section = "igprof_hot"]
    fn tags(&self, i: usize) -> &[u32; WAYS] {
        // SAFETY: i < SETS; the mapping starts with SETS * WAYS tags,
        // zero-filled, owned by self.
        unsafe { &*(self.base.cast::<u32>().add(i * WAYS) as *const [u32; WAYS]) }
    }

    #[inline]
    #[link_section = "igprof_hot"]
    fn tags_mut(&mut self, i: usize) -> &mut [u32; WAYS] {
        // SAFETY: as in `tags`, with exclusive access through &mut self.
        unsafe { &mut *(self.base.cast::<u32>().add(i * WAYS) as *mut [u32; WAYS]) }
    }

    #[inline]
    #[link_section = "igprof_hot"]
    fn set(&self, i: usize) -> &[Slot; WAYS] {
        // SAFETY: i < SETS; the SETS * WAYS slots follow the tags (aligned,
        // asserted), zero-filled (a valid, unused Slot), owned by self.
        unsafe { &*(self.base.add(TAGS_BYTES).cast::<Slot>().add(i * WAYS) as *const [Slot; WAYS]) }
    }

    #[inline]
    #[link_section = "igprof_hot"]
    fn set_mut(&mut self, i: usize) -> &mut [Slot; WAYS] {
        // SAFETY: as in `set`, with exclusive access through &mut self.
        unsafe {
            &mut *(self.base.add(TAGS_BYTES).cast::<Slot>().add(i * WAYS) as *mut [Slot; WAYS])
        }
    }

    #[inline]
    #[link_section = "igprof_hot"]
    fn pool(&self) -> &Pool {
        // SAFETY: the pool follows the slots in the mapping, suitably
        // aligned (asserted), zero-filled plain data, owned by self.
        unsafe { &*(self.base.add(TAGS_BYTES + SLOTS_BYTES) as *const Pool) }
    }

    #[inline]
    #[link_section = "igprof_hot"]
    fn pool_mut(&mut self) -> &mut Pool {
        // SAFETY: as in `pool`, with exclusive access through &mut self.
        unsafe { &mut *(self.base.add(TAGS_BYTES + SLOTS_BYTES) as *mut Pool) }
    }

    /// Whether `s`'s words are still in the pool.
    #[inline]
    #[link_section = "igprof_hot"]
    fn intact(&self, s: &Slot) -> bool {
        self.head - s.start <= POOL as u64
    }

    #[link_section = "igprof_hot"]
    fn clear(&mut self) {
        for i in 0..SETS {
            for s in self.set_mut(i) {
                s.len = 0;
            }
            *self.tags_mut(i) = [0; WAYS];
        }
    }
}

impl Drop for Table {
    #[link_section = "igprof_hot"]
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced.
        unsafe { crate::sys::munmap(self.base, TABLE_BYTES) };
    }
}

/// The thread's remembered walks, and the record the next walk fills.
pub struct StackMemo {
    owner: *const ThreadState,
    /// None when no memory could be mapped: the memo is never used.
    table: Option<Table>,
    /// Per set: the way the next stored walk replaces.
    next: [u8; SETS],
    /// Per set: the way of the last hit, tried before the others (perl
    /// calls malloc from many stacks with the same registers, so a set's
    /// hits move between its ways and a scan from way 0 is long).
    last_hit: [u8; SETS],
    misses: u32,
    rest: u32,
    log: ReadLog,
}

/// The set of an event (its stack pointer and return address at the
/// call), and its tag in the set (never 0).
#[inline]
#[link_section = "igprof_hot"]
fn set_of(sp: usize, ret: usize) -> (usize, u32) {
    let h = (sp ^ ret.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u64;
    ((h >> (64 - SETS.trailing_zeros())) as usize, (h as u32) | 1)
}

/// The program's frame that called the hooked function: its return
/// address and stack pointer there (x86-64: the return address is the word
/// at SP; AArch64: it is in LR and SP is unchanged). `usable` checked that
/// SP lies in the thread's stack.
#[inline]
#[link_section = "igprof_hot"]
fn caller_frame(r: &EntryRegs) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: sp + 8 <= hi of this thread's stack (usable()), which is
        // mapped above the running program's stack pointer.
        let ret = unsafe { core::ptr::read_unaligned(r.sp as *const usize) };
        (ret, r.sp + 8)
    }
    #[cfg(target_arch = "aarch64")]
    {
        (r.lr, r.sp)
    }
}

/// Whether remembered walk `s` is the walk of an event with registers `r`
/// (return address `ret`) under module table `generation`. Inlined into
/// the lookup: called out of line, its arguments went through memory.
#[inline(always)]
#[link_section = "igprof_hot"]
fn repeats<const SCAN: bool>(
    s: &Slot,
    r: &EntryRegs,
    ret: usize,
    generation: u32,
    table: &Table,
    pool: &Pool,
) -> bool {
    // SAFETY: every word was checked when stored to lie in [r.sp, hi) of
    // this thread's stack (ReadLog's floor and top), which is mapped while
    // the thread runs at r.sp.
    let now = |o: u32| unsafe { core::ptr::read_unaligned((r.sp + o as usize) as *const usize) };
    if s.len == 0
        || s.sp != r.sp
        || s.ret != ret
        || (s.fp_used && s.fp != r.fp)
        || s.generation != generation
        || (SCAN && now(s.first_off) != s.first_val)
        || !table.intact(s)
    {
        return false;
    }
    // The walk's words: one run of the ring (see `store`), compared
    // without a branch per word (nearly every comparison of the last hit's
    // way is a hit). `SCAN`: a search of the other ways, where several
    // walks may share the registers (cc1: 78% of its lookups get there;
    // sqlite3's allocation wrapper, called from many places at one depth):
    // the first word (the caller's return address, where walks from one
    // call site to the allocator usually part) was compared alone first,
    // from the slot, which the other checks read already.
    let (at, n) = ((s.start as usize) & (POOL - 1), s.len as usize);
    let (offsets, values) = (&pool.offsets[at..at + n], &pool.values[at..at + n]);
    let diff = offsets
        .iter()
        .zip(values)
        .fold(0, |d, (&o, &v)| d | (now(o) ^ v));
    diff == 0
}

impl StackMemo {
    /// Maps memory: with the thread's other extras, not in a signal handler.
    #[link_section = "igprof_hot"]
    pub fn new() -> Self {
        StackMemo {
            owner: core::ptr::null(),
            table: Table::new(),
            next: [0; SETS],
            last_hit: [0; SETS],
            misses: 0,
            rest: 0,
            log: ReadLog::new(),
        }
    }

    /// Whether the memo should be consulted for this event.
    #[inline]
    #[link_section = "igprof_hot"]
    pub fn usable(&mut self, t: &ThreadState, r: &EntryRegs) -> bool {
        if self.rest > 0 {
            self.rest -= 1;
            return false;
        }
        let (lo, hi) = t.bounds.stack;
        self.table.is_some() && r.sp >= lo && r.sp + 8 <= hi
    }

    /// The node of a remembered walk that this event's walk would repeat.
    /// The way of the set's last hit is tried inline (nearly every hit of
    /// a program that repeats its stacks), the other ways out of line.
    #[inline(always)]
    #[link_section = "igprof_hot"]
    pub fn lookup(&mut self, t: &ThreadState, r: &EntryRegs) -> Option<*mut Node> {
        if let (true, Some(table)) = (core::ptr::eq(self.owner, t), &self.table) {
            let generation = crate::unwind::generation();
            let (ret, _) = caller_frame(r);
            let (set, tag) = set_of(r.sp, ret);
            let last = self.last_hit[set] as usize % WAYS;
            let slot = &table.set(set)[last];
            if table.tags(set)[last] == tag
                && repeats::<false>(slot, r, ret, generation, table, table.pool())
            {
                bump(&COUNTS[t.tid() as usize % SHARDS].hits);
                self.misses = 0;
                return Some(slot.node);
            }
        }
        self.lookup_other_ways(t, r)
    }

    /// [`Self::lookup`] in the ways of the set other than its last hit's.
    #[inline(never)]
    #[link_section = "igprof_hot"]
    fn lookup_other_ways(&mut self, t: &ThreadState, r: &EntryRegs) -> Option<*mut Node> {
        if let (true, Some(table)) = (core::ptr::eq(self.owner, t), &self.table) {
            let generation = crate::unwind::generation();
            let (ret, _) = caller_frame(r);
            let pool = table.pool();
            let (set, tag) = set_of(r.sp, ret);
            let (tags, slots) = (table.tags(set), table.set(set));
            let last = self.last_hit[set] as usize % WAYS;
            // The way that followed the last hit's way before, then the
            // ways whose tag matches, as a bit mask (one vector compare of
            // the set's tags), tried in order.
            let succ = slots[last].succ as usize % WAYS;
            let mut hit = (succ != last
                && tags[succ] == tag
                && repeats::<true>(&slots[succ], r, ret, generation, table, pool))
            .then_some(succ);
            let mut ways = tags
                .iter()
                .enumerate()
                .fold(0u32, |m, (w, &t)| m | (u32::from(t == tag) << w))
                & !(1 << last)
                & !(1 << succ);
            while hit.is_none() && ways != 0 {
                let w = ways.trailing_zeros() as usize;
                ways &= ways - 1;
                if repeats::<true>(&slots[w], r, ret, generation, table, pool) {
                    hit = Some(w);
                }
            }
            if let Some(w) = hit {
                let node = slots[w].node;
                if let Some(table) = self.table.as_mut() {
                    table.set_mut(set)[last].succ = w as u8;
                }
                self.last_hit[set] = w as u8;
                self.misses = 0;
                bump(&COUNTS[t.tid() as usize % SHARDS].hits);
                return Some(node);
            }
        }
        self.misses += 1;
        bump(&COUNTS[t.tid() as usize % SHARDS].misses);
        if self.misses >= MISS_LIMIT {
            self.misses = 0;
            self.rest = REST;
        }
        None
    }

    /// The record for the walk of an event with registers `r`: its first
    /// program frame must be the caller's, every word it depends on in
    /// the thread's stack above the program's stack pointer.
    #[link_section = "igprof_hot"]
    pub fn begin(&self, t: &ThreadState, r: &EntryRegs) -> &ReadLog {
        self.log.begin(r.sp, t.bounds.stack.1, caller_frame(r));
        &self.log
    }

    /// Remembers a full walk's result: `node`, reached from registers `r`
    /// by the walk recorded since [`Self::begin`].
    #[link_section = "igprof_hot"]
    pub fn store(&mut self, t: &ThreadState, r: &EntryRegs, node: *mut Node) {
        let Some(table) = self.table.as_mut() else {
            return;
        };
        if !core::ptr::eq(self.owner, t) {
            // A new table is zero-filled already: clearing it would only
            // fault its 68 KiB of slots in (a short process's first walk).
            if !self.owner.is_null() {
                table.clear();
            }
            self.owner = t;
        }
        let Some(words) = self.log.words() else {
            return;
        };
        // Offsets from the stack pointer are kept in 32 bits.
        if words.is_empty()
            || words.len() > MAX_WORDS
            || t.bounds.stack.1 - r.sp > u32::MAX as usize
        {
            return;
        }
        let (ret, _) = caller_frame(r);
        let (set, tag) = set_of(r.sp, ret);
        let way = self.next[set] as usize % WAYS;
        self.next[set] = ((way + 1) % WAYS) as u8;
        // One run of the ring: words that would wrap past its end start
        // over at its beginning instead (the rest of the lap stays unused).
        let mut start = table.head;
        let at = (start as usize) & (POOL - 1);
        if at + words.len() > POOL {
            start += (POOL - at) as u64;
        }
        let at = (start as usize) & (POOL - 1);
        let pool = table.pool_mut();
        for (i, &(a, v)) in words.iter().enumerate() {
            // In [r.sp, stack end) (the record's floor and top): fits.
            pool.offsets[at + i] = (a - r.sp) as u32;
            pool.values[at + i] = v;
        }
        table.head = start + words.len() as u64;
        table.tags_mut(set)[way] = tag;
        let s = &mut table.set_mut(set)[way];
        s.sp = r.sp;
        s.ret = ret;
        s.fp_used = self.log.entry_fp_used();
        s.succ = way as u8;
        s.fp = r.fp;
        s.generation = self.log.generation();
        s.node = node;
        s.start = start;
        s.len = words.len() as u32;
        // Not empty (checked above); in [r.sp, stack end): fits.
        s.first_off = (words[0].0 - r.sp) as u32;
        s.first_val = words[0].1;
    }
}

impl Default for StackMemo {
    #[link_section = "igprof_hot"]
    fn default() -> Self {
        Self::new()
    }
}
