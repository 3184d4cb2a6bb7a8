//! Call trees: one per thread state (a new thread adopts the state, tree
//! included, of a thread that ended: see `thread.rs`), nodes keyed by
//! return address. A node that is charged (the node [`CallTree::node_for`]
//! returns, or [`CallTree::charged`] was asked for) carries one (ticks,
//! value, peak) triple per enabled counter; the others (most: the callers
//! of a profile's sites) carry none, which reads as zeros.
//!
//! Owns node layout, the per-thread child lookup, and counter updates.
//! Only the owning thread inserts (from its signal handler or hooks), so
//! the sampling path takes no lock; the lookup table is private to the owner
//! and may be rebuilt at will. Other threads (the dumper; a thread freeing
//! memory another thread allocated) only read the append-only node graph
//! (children are published with a release store after the node is complete)
//! and update counters atomically.
//!
//! Must never: allocate through the global allocator (nodes and tables come
//! from the tree's own [`Bump`] region, which is signal-safe), lock, or move
//! or free a node once published.

use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::base::alloc::Bump;
use crate::{base::counters, base::solo, sys};

/// Address of the synthetic outermost node that marks a truncated stack.
pub const TRUNCATED: usize = 1;
/// Address of the synthetic leaf under which a mapping that an allocation
/// function made for its own use is charged (`-mm`): named `<allocator mmap>`.
pub const ALLOCATOR_MMAP: usize = 2;

/// One counter of a node.
#[repr(C)]
pub struct Counter {
    pub ticks: AtomicU64,
    pub value: AtomicU64,
    pub peak: AtomicU64,
}

impl Counter {
    /// Owner-thread accumulate: ticks += 1, value += amount, peak = max(peak, value).
    #[inline]
    pub fn tick(&self, amount: u64) {
        let t = self.ticks.load(Ordering::Relaxed);
        self.ticks.store(t + 1, Ordering::Relaxed);
        let v = self.value.load(Ordering::Relaxed) + amount;
        self.value.store(v, Ordering::Relaxed);
        if v > self.peak.load(Ordering::Relaxed) {
            self.peak.store(v, Ordering::Relaxed);
        }
    }

    /// Owner-thread accumulate of `ticks` events worth `amount` in total.
    #[inline]
    pub fn add(&self, ticks: u64, amount: u64) {
        let t = self.ticks.load(Ordering::Relaxed);
        self.ticks.store(t + ticks, Ordering::Relaxed);
        let v = self.value.load(Ordering::Relaxed) + amount;
        self.value.store(v, Ordering::Relaxed);
        if v > self.peak.load(Ordering::Relaxed) {
            self.peak.store(v, Ordering::Relaxed);
        }
    }

    /// Any-thread accumulate (atomic read-modify-write, plain while the
    /// process is [`crate::base::solo`]).
    #[inline]
    pub fn tick_shared(&self, amount: u64) {
        self.add_shared(1, amount);
    }

    /// Any-thread accumulate of `ticks` events worth `amount` in total.
    #[inline]
    pub fn add_shared(&self, ticks: u64, amount: u64) {
        self.add_shared_in(solo::solo(), ticks, amount)
    }

    /// [`Self::add_shared`] with the caller's [`solo::solo`] answer
    /// (`one`), read once for several updates.
    #[inline(always)]
    pub fn add_shared_in(&self, one: bool, ticks: u64, amount: u64) {
        solo::add_in(one, &self.ticks, ticks);
        let v = solo::add_in(one, &self.value, amount);
        solo::max_in(one, &self.peak, v);
    }

    /// IgProf's max counter: ticks += 1, value = max(value, amount).
    #[inline]
    pub fn record_max(&self, amount: u64) {
        solo::add(&self.ticks, 1);
        solo::max(&self.value, amount);
    }

    /// A live resource released (possibly by another thread).
    #[inline]
    pub fn release_shared(&self, amount: u64) {
        self.release_many(1, amount);
    }

    /// `ticks` live resources worth `amount` released (any thread).
    #[inline]
    pub fn release_many(&self, ticks: u64, amount: u64) {
        self.release_many_in(solo::solo(), ticks, amount)
    }

    /// [`Self::release_many`] with the caller's [`solo::solo`] answer.
    #[inline(always)]
    pub fn release_many_in(&self, one: bool, ticks: u64, amount: u64) {
        solo::sub_in(one, &self.ticks, ticks);
        solo::sub_in(one, &self.value, amount);
    }

    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.ticks.load(Ordering::Relaxed),
            self.value.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }
}

/// A call-tree node.
#[repr(C)]
pub struct Node {
    pub addr: usize,
    pub parent: *const Node,
    first_child: AtomicPtr<Node>,
    next_sibling: AtomicPtr<Node>,
    /// [`counters::nslots`] counters once the node is charged, else null.
    counters: AtomicPtr<Counter>,
}

/// What a write to an uncharged node's counter lands on (see
/// [`Node::counter`]): never read.
static SINK: [Counter; counters::COUNT] = [const {
    Counter {
        ticks: AtomicU64::new(0),
        value: AtomicU64::new(0),
        peak: AtomicU64::new(0),
    }
}; counters::COUNT];

impl Node {
    /// The counter in `slot` (< nslots) of a charged node, to update. Every
    /// writer holds a charged node (one `node_for` or `charged` returned);
    /// an uncharged one (a bug) gets a counter nobody reads.
    #[inline]
    pub fn counter(&self, slot: usize) -> &Counter {
        debug_assert!(slot < counters::nslots());
        let c = self.counters.load(Ordering::Acquire);
        debug_assert!(!c.is_null(), "a counter of an uncharged node");
        if c.is_null() {
            return &SINK[slot];
        }
        // SAFETY: a charged node's block holds nslots counters.
        unsafe { &*c.add(slot) }
    }

    /// The counter in `slot`'s (ticks, value, peak): zeros for a node that
    /// was never charged.
    #[inline]
    pub fn get(&self, slot: usize) -> (u64, u64, u64) {
        let c = self.counters.load(Ordering::Acquire);
        if c.is_null() {
            return (0, 0, 0);
        }
        // SAFETY: a charged node's block holds nslots counters.
        unsafe { &*c.add(slot) }.get()
    }

    /// Whether the node carries counters.
    #[inline]
    pub fn is_charged(&self) -> bool {
        !self.counters.load(Ordering::Relaxed).is_null()
    }

    /// Starts loading what a walk of the tree reads next at this node: its
    /// first child and its counters. A dump's walk reaches each node by a
    /// pointer read from its parent or previous sibling, so each is a
    /// cache miss. First children are most nodes of a compiler's tree (it
    /// branches little), and a node's first child is read only once the
    /// node itself is written (and, but for the first of them, its earlier
    /// siblings' subtrees), which gives the load time to arrive.
    #[inline]
    pub fn prefetch_below(&self) {
        sys::prefetch(self.first_child.load(Ordering::Relaxed) as *const u8);
        sys::prefetch(self.counters.load(Ordering::Relaxed) as *const u8);
    }

    /// Iterates the children (in reverse insertion order).
    pub fn children(&self) -> Children<'_> {
        Children {
            next: self.first_child.load(Ordering::Acquire),
            _p: core::marker::PhantomData,
        }
    }
}

pub struct Children<'a> {
    next: *mut Node,
    _p: core::marker::PhantomData<&'a Node>,
}

impl<'a> Iterator for Children<'a> {
    type Item = &'a Node;
    fn next(&mut self) -> Option<&'a Node> {
        if self.next.is_null() {
            return None;
        }
        // SAFETY: published nodes are complete and never freed.
        let n = unsafe { &*self.next };
        self.next = n.next_sibling.load(Ordering::Acquire);
        Some(n)
    }
}

/// A lookup-table slot: a node's address (below 2^48, as every user-space
/// address Linux gives without a hint above it) with the top 16 bits of
/// its `hash(parent, addr)` above it, compared before the node is read;
/// 0 when empty. Eight bytes rather than sixteen: the table is a large
/// part of a big profile's memory.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
struct Slot(u64);

const NODE_BITS: u32 = 48;
/// The node's bits of a slot; the hash's are the others.
const NODE_MASK: u64 = (1 << NODE_BITS) - 1;

impl Slot {
    const EMPTY: Slot = Slot(0);

    /// None when the node's address does not fit below the tag.
    fn new(hash: usize, node: *mut Node) -> Option<Slot> {
        let p = node as u64;
        (p >> NODE_BITS == 0).then_some(Slot(p | Self::tag(hash)))
    }

    #[inline]
    fn tag(hash: usize) -> u64 {
        (hash as u64) & !NODE_MASK
    }

    #[inline]
    fn node(self) -> *mut Node {
        (self.0 & NODE_MASK) as *mut Node
    }

    #[inline]
    fn matches(self, hash: usize) -> bool {
        self.0 & !NODE_MASK == Self::tag(hash)
    }
}

/// How many slots ahead a rehash starts loading a slot's node.
const REHASH_AHEAD: usize = 16;

/// The table grows (doubles) when more than this share of it (in
/// quarters) would be taken: linear probing stays short at 3/4.
const MAX_LOAD_QUARTERS: usize = 3;

/// One thread's call tree.
pub struct CallTree {
    root: *mut Node,
    table: *mut Slot,
    mask: usize,
    len: usize,
    bump: Bump,
    nslots: usize,
    /// Nodes that could not be created (out of memory); the sample is dropped.
    pub failed: u64,
    /// Nodes given counters ([`Self::charged`]).
    charged: usize,
    /// The lookup table's pages were given back ([`Self::release_table`]):
    /// it is rebuilt before the next node is made.
    released: bool,
}

/// What a call tree holds in memory, in bytes (see [`CallTree::memory`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct TreeMemory {
    pub nodes: usize,
    pub charged: usize,
    pub node_bytes: usize,
    pub counter_bytes: usize,
    pub table_bytes: usize,
}

impl core::ops::AddAssign for TreeMemory {
    fn add_assign(&mut self, o: TreeMemory) {
        self.nodes += o.nodes;
        self.charged += o.charged;
        self.node_bytes += o.node_bytes;
        self.counter_bytes += o.counter_bytes;
        self.table_bytes += o.table_bytes;
    }
}

// SAFETY: the tree is mutated only by its owner; other threads read the
// published node graph, which is built for concurrent reading.
unsafe impl Send for CallTree {}
// SAFETY: as for Send just above.
unsafe impl Sync for CallTree {}

/// Puts `s` in the first empty slot of its probe sequence in `table`
/// (mask+1 slots, not full: the load stays under [`MAX_LOAD_QUARTERS`]).
#[inline]
fn insert_into(table: *mut Slot, mask: usize, hash: usize, s: Slot) {
    let mut i = hash & mask;
    loop {
        // SAFETY: i <= mask, and the table has mask+1 slots.
        let e = unsafe { &mut *table.add(i) };
        if *e == Slot::EMPTY {
            *e = s;
            return;
        }
        i = (i + 1) & mask;
    }
}

#[inline]
fn hash(parent: usize, addr: usize) -> usize {
    let h = (parent.rotate_left(17) ^ addr).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

impl CallTree {
    /// An empty tree (lazy: memory is taken on first insert).
    pub const fn new() -> Self {
        CallTree {
            root: null_mut(),
            table: null_mut(),
            mask: 0,
            len: 0,
            bump: Bump::new(256 * 1024),
            nslots: 0,
            failed: 0,
            charged: 0,
            released: false,
        }
    }

    fn new_node(&mut self, parent: *const Node, addr: usize) -> *mut Node {
        let p = self.bump.alloc(core::mem::size_of::<Node>(), 8) as *mut Node;
        if !p.is_null() {
            // SAFETY: fresh memory the size of a node.
            unsafe {
                p.write(Node {
                    addr,
                    parent,
                    first_child: AtomicPtr::new(null_mut()),
                    next_sibling: AtomicPtr::new(null_mut()),
                    counters: AtomicPtr::new(null_mut()),
                })
            };
        }
        p
    }

    /// `n` (a node of this tree, or null) with its counters, given now if
    /// it had none: what a caller about to charge `n` asks for. Null when
    /// memory ran out.
    #[inline]
    pub(crate) fn charged(&mut self, n: *mut Node) -> *mut Node {
        if n.is_null() {
            return n;
        }
        // SAFETY: nodes of this tree are never freed.
        let node = unsafe { &*n };
        if node.is_charged() {
            return n;
        }
        let c = self
            .bump
            .alloc(self.nslots * core::mem::size_of::<Counter>(), 8)
            as *mut Counter;
        if c.is_null() {
            self.failed += 1;
            return null_mut();
        }
        // The block is zeroed (fresh bump memory comes from mmap) before it
        // is published.
        node.counters.store(c, Ordering::Release);
        self.charged += 1;
        n
    }

    fn ensure_init(&mut self) -> bool {
        if !self.root.is_null() {
            return true;
        }
        self.nslots = counters::nslots();
        let root = self.new_node(core::ptr::null(), 0);
        if root.is_null() || !self.grow(1024) {
            return false;
        }
        self.root = root;
        true
    }

    #[link_section = "igprof_hot"]
    fn grow(&mut self, cap: usize) -> bool {
        let bytes = cap * core::mem::size_of::<Slot>();
        let t = self.bump.alloc(bytes, 8) as *mut Slot;
        if t.is_null() {
            return false;
        }
        // Probes read the table before writing it: one fault per page
        // instead of two.
        sys::populate_write(t as *mut u8, bytes);
        let (old, old_cap) = (
            self.table,
            if self.table.is_null() {
                0
            } else {
                self.mask + 1
            },
        );
        self.table = t;
        self.mask = cap - 1;
        for i in 0..old_cap {
            // The node of a slot a few ahead starts loading now: the nodes
            // lie in the order they were made, not the table's, and each
            // read was a cache miss (a small cc1: 2% of its run under -mp).
            if i + REHASH_AHEAD < old_cap {
                // SAFETY: within the old table; slots are plain data.
                let ahead = unsafe { *old.add(i + REHASH_AHEAD) };
                sys::prefetch(ahead.node() as *const u8);
            }
            // SAFETY: i < old capacity; slots are plain data.
            let s = unsafe { *old.add(i) };
            if s != Slot::EMPTY {
                // SAFETY: slots hold live nodes of this tree.
                let n = unsafe { &*s.node() };
                self.insert_slot(hash(n.parent as usize, n.addr), s);
            }
        }
        // The old table stays in the bump region, its pages given back.
        if !old.is_null() {
            sys::discard(old as *mut u8, old_cap * core::mem::size_of::<Slot>());
        }
        true
    }

    fn insert_slot(&mut self, hash: usize, s: Slot) {
        insert_into(self.table, self.mask, hash, s)
    }

    /// Gives the lookup table's pages back to the kernel, the nodes staying
    /// as they are: for the final dump, which needs the memory (a
    /// compiler's table is 4 MiB) when the thread is done adding nodes.
    /// Should the thread add one after all, the table is first rebuilt from
    /// the nodes. Owner only.
    pub fn release_table(&mut self) {
        if self.table.is_null() || self.released {
            return;
        }
        // Whole pages only: a slot left on a page shared with nodes still
        // names its node rightly, and a lookup that misses rebuilds.
        sys::discard(
            self.table as *mut u8,
            (self.mask + 1) * core::mem::size_of::<Slot>(),
        );
        self.released = true;
    }

    /// Fills the lookup table again from the nodes, after
    /// [`Self::release_table`].
    #[cold]
    fn rebuild_table(&mut self) {
        self.released = false;
        let bytes = (self.mask + 1) * core::mem::size_of::<Slot>();
        // SAFETY: the table's mask+1 slots, ours alone (owner thread).
        unsafe { core::ptr::write_bytes(self.table as *mut u8, 0, bytes) };
        let (root, table, mask) = (self.root, self.table, self.mask);
        // Every node but the root is in the table (see `child`).
        self.for_each_node(|n| {
            if core::ptr::eq(n, root) {
                return;
            }
            let h = hash(n.parent as usize, n.addr);
            // It fitted when it was made (`Slot::new` in `child`).
            if let Some(s) = Slot::new(h, n as *const Node as *mut Node) {
                insert_into(table, mask, h, s);
            }
        });
    }

    /// The child of `parent` for `addr`, created if missing (uncharged:
    /// see [`Self::charged`]); null when out of memory.
    #[inline]
    #[link_section = "igprof_hot"]
    pub(crate) fn child(&mut self, parent: *mut Node, addr: usize) -> *mut Node {
        let h = hash(parent as usize, addr);
        let mut i = h & self.mask;
        loop {
            // SAFETY: i <= mask; the table has mask+1 slots.
            let e = unsafe { *self.table.add(i) };
            if e == Slot::EMPTY {
                break;
            }
            if e.matches(h) {
                // SAFETY: slots hold live nodes of this tree.
                let n = unsafe { &*e.node() };
                if n.addr == addr && core::ptr::eq(n.parent, parent) {
                    return e.node();
                }
            }
            i = (i + 1) & self.mask;
        }
        if self.released {
            self.rebuild_table();
            return self.child(parent, addr);
        }
        if (self.len + 1) * 4 > (self.mask + 1) * MAX_LOAD_QUARTERS
            && !self.grow((self.mask + 1) * 2)
        {
            self.failed += 1;
            return null_mut();
        }
        let n = self.new_node(parent, addr);
        if n.is_null() {
            self.failed += 1;
            return n;
        }
        let Some(slot) = Slot::new(h, n) else {
            self.failed += 1;
            return null_mut();
        };
        self.insert_slot(h, slot);
        self.len += 1;
        // Publish: the node is complete before it becomes reachable.
        // SAFETY: parent is a live node of this tree.
        let p = unsafe { &*parent };
        n_set_sibling(n, p.first_child.load(Ordering::Relaxed));
        p.first_child.store(n, Ordering::Release);
        n
    }

    /// The node for a stack given leaf first (`trace[0]` = PC), created as
    /// needed. A `truncated` stack hangs under the [`TRUNCATED`] marker.
    /// Null when memory ran out (or nothing is enabled).
    #[link_section = "igprof_hot"]
    pub fn node_for(&mut self, trace: &[usize], truncated: bool) -> *mut Node {
        if !self.ensure_init() {
            self.failed += 1;
            return null_mut();
        }
        let mut n = self.root;
        if truncated {
            n = self.child(n, TRUNCATED);
            if n.is_null() {
                return n;
            }
        }
        for &a in trace.iter().rev() {
            n = self.child(n, a);
            if n.is_null() {
                return n;
            }
        }
        self.charged(n)
    }

    /// The root (address 0) or None before the first insert.
    pub fn root(&self) -> Option<&Node> {
        if self.root.is_null() {
            None
        } else {
            // SAFETY: the root is never freed.
            Some(unsafe { &*self.root })
        }
    }

    /// Calls `f` on every published node, the root included, without
    /// allocating (a walk by parent and sibling links; concurrent inserts
    /// by the owner may or may not be seen).
    pub fn for_each_node(&self, mut f: impl FnMut(&Node)) {
        let Some(root) = self.root() else { return };
        let mut n: &Node = root;
        loop {
            f(n);
            if let Some(c) = n.children().next() {
                n = c;
                continue;
            }
            // Up until a node with a next sibling (or back at the root).
            loop {
                if core::ptr::eq(n, root) {
                    return;
                }
                let s = n.next_sibling.load(Ordering::Acquire);
                if !s.is_null() {
                    // SAFETY: published nodes are complete and never freed.
                    n = unsafe { &*s };
                    break;
                }
                // SAFETY: a non-root node's parent is a published node.
                n = unsafe { &*n.parent };
            }
        }
    }

    /// Its nodes, counters and lookup table in bytes (read by the dumper
    /// while the owner may still grow them: a figure for `-d`).
    pub fn memory(&self) -> TreeMemory {
        let nodes = self.len + (!self.root.is_null()) as usize;
        TreeMemory {
            nodes,
            charged: self.charged,
            node_bytes: nodes * core::mem::size_of::<Node>(),
            counter_bytes: self.charged * self.nslots * core::mem::size_of::<Counter>(),
            table_bytes: if self.table.is_null() {
                0
            } else {
                (self.mask + 1) * core::mem::size_of::<Slot>()
            },
        }
    }

    /// Number of nodes besides the root.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for CallTree {
    fn default() -> Self {
        Self::new()
    }
}

fn n_set_sibling(n: *mut Node, s: *mut Node) {
    // SAFETY: n is a fresh node not yet visible to other threads.
    unsafe { (*n).next_sibling.store(s, Ordering::Relaxed) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::counters::{self, CounterId};

    fn setup() -> std::sync::MutexGuard<'static, ()> {
        let g = counters::TEST_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counters::reset_for_test();
        counters::enable(CounterId::PerfTicks);
        counters::enable(CounterId::MemLive);
        g
    }

    #[test]
    fn builds_paths_and_counts_exactly() {
        let _g = setup();
        let mut t = CallTree::new();
        let slot = counters::slot(CounterId::PerfTicks).unwrap();
        // leaf first
        for _ in 0..3 {
            let n = t.node_for(&[0x30, 0x20, 0x10], false);
            unsafe { &*n }.counter(slot).tick(1);
        }
        let n = t.node_for(&[0x31, 0x20, 0x10], false);
        unsafe { &*n }.counter(slot).tick(1);
        assert_eq!(t.len(), 4);
        let root = t.root().unwrap();
        let top: Vec<_> = root.children().collect();
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].addr, 0x10);
        let mid: Vec<_> = top[0].children().collect();
        assert_eq!(mid[0].addr, 0x20);
        let mut leaves: Vec<_> = mid[0]
            .children()
            .map(|c| (c.addr, c.counter(slot).get()))
            .collect();
        leaves.sort();
        assert_eq!(leaves, vec![(0x30, (3, 3, 3)), (0x31, (1, 1, 1))]);
        let live = counters::slot(CounterId::MemLive).unwrap();
        assert_eq!(mid[0].counter(live).get(), (0, 0, 0));
    }

    #[test]
    fn every_node_is_visited_once() {
        let _g = setup();
        let mut t = CallTree::new();
        let mut seen = 0;
        t.for_each_node(|_| seen += 1);
        assert_eq!(seen, 0, "an empty tree has no root yet");
        // Siblings at several depths, a chain, and a leaf under the root.
        for path in [
            &[0x30, 0x20, 0x10][..],
            &[0x31, 0x20, 0x10],
            &[0x32, 0x21, 0x10],
            &[0x40, 0x33, 0x22, 0x11],
            &[0x12],
        ] {
            t.node_for(path, false);
        }
        let mut addrs = Vec::new();
        t.for_each_node(|n| addrs.push(n.addr));
        assert_eq!(addrs.len(), t.len() + 1, "{addrs:x?}");
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), t.len() + 1, "each once");
        assert_eq!(addrs[0], 0, "the root");
    }

    #[test]
    fn table_grows_and_truncation_is_marked() {
        let _g = setup();
        let mut t = CallTree::new();
        let deep: Vec<usize> = (0..5000).map(|i| 0x1000 + i * 16).collect();
        let n = t.node_for(&deep, true);
        assert!(!n.is_null());
        assert_eq!(t.len(), 5001);
        let root = t.root().unwrap();
        assert_eq!(root.children().next().unwrap().addr, TRUNCATED);
        // Same path again finds the same node.
        assert_eq!(t.node_for(&deep, true), n);
        // Depth of the leaf: walk parents.
        let mut d = 0;
        let mut p = n as *const Node;
        while !unsafe { &*p }.parent.is_null() {
            d += 1;
            p = unsafe { &*p }.parent;
        }
        assert_eq!(d, 5001);
    }

    /// A tree whose lookup table was given back finds its nodes again and
    /// makes no second node for a path it has (the table is rebuilt).
    #[test]
    fn a_released_table_is_rebuilt_before_a_node_is_made() {
        let _g = setup();
        let mut t = CallTree::new();
        // Enough paths for a table of several pages (8,192 slots).
        let path = |i: usize| [0x5000 + (i % 97) * 16, 0x4000 + (i / 97) * 16, 0x10];
        let leaves: Vec<*mut Node> = (0..5000).map(|i| t.node_for(&path(i), false)).collect();
        let len = t.len();
        assert!(t.memory().table_bytes >= 8 * 4096);
        t.release_table();
        // A path it has: the same node, nothing made.
        assert_eq!(t.node_for(&path(4321), false), leaves[4321]);
        assert_eq!(t.len(), len);
        // Every path still finds its own node.
        for (i, &n) in leaves.iter().enumerate() {
            assert_eq!(t.node_for(&path(i), false), n, "path {i}");
        }
        // A new path gets a new node, once.
        let fresh = t.node_for(&[0x7000, 0x4000, 0x10], false);
        assert_eq!(t.len(), len + 1);
        assert_eq!(t.node_for(&[0x7000, 0x4000, 0x10], false), fresh);
        // Released twice, or with a new path first: the same.
        t.release_table();
        t.release_table();
        let other = t.node_for(&[0x7010, 0x4000, 0x10], false);
        assert_eq!(t.len(), len + 2);
        assert_eq!(t.node_for(&path(17), false), leaves[17]);
        assert_eq!(t.node_for(&[0x7010, 0x4000, 0x10], false), other);
        let mut seen = 0;
        t.for_each_node(|_| seen += 1);
        assert_eq!(seen, len + 3, "the root and every node once");
    }

    #[test]
    fn shared_counter_updates() {
        let c = Counter {
            ticks: AtomicU64::new(0),
            value: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        };
        c.tick_shared(100);
        c.tick_shared(50);
        c.release_shared(100);
        assert_eq!(c.get(), (1, 50, 150));
        c.record_max(7);
        c.record_max(3);
        assert_eq!(c.get().1, 50);
    }
}
