//! Merging every thread's call tree into one tree of the profile, keyed
//! by stack, with the live resources of each node and where merged nodes
//! came from.
//!
//! Owns the dump's fast hash map ([`HashMap`]) and the merged tree
//! ([`Merged`]).
//!
//! Must never: change a thread's tree (other threads keep sampling into
//! theirs while it is read).

use std::collections::HashMap as StdHashMap;

use crate::base::counters::{self, Merge};
use crate::base::tree::Node;

/// The dump's maps are keyed by addresses and node ids, which need no
/// protection against chosen collisions: a multiply-rotate hash (FxHash's)
/// instead of SipHash, a third of the merge's time on a large profile.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl core::hash::Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type HashMap<K, V> = StdHashMap<K, V, core::hash::BuildHasherDefault<FastHasher>>;

/// Addresses of synthetic top-level functions (below any code address).
pub(super) const SYNTHETIC_BASE: usize = 0x100;

/// `Merged::value_at` of a node whose counters are all zero.
pub(super) const NO_VALUES: u32 = u32::MAX;

pub(super) struct MNode {
    pub(super) addr: usize,
    pub(super) first_child: u32,
    /// The last of the children (appended to in O(1)).
    pub(super) last_child: u32,
    pub(super) next_sibling: u32,
}

/// One live resource at a dump: the node that acquired it (a thread
/// tree's node address, or a merged node's id), its counter slot, its
/// address and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Leak {
    pub(super) node: usize,
    pub(super) slot: usize,
    pub(super) addr: u64,
    pub(super) size: u64,
}

/// The live resources of a dump in one vector sorted by (node, slot,
/// address), so that a node's are one slice: 32 bytes a resource, where a
/// map of vectors cost a compiler's dump (29,000 live blocks) 2.6 MB of
/// peak memory. With the counter slots that hold any (a bit each): the
/// writer asks for every counter of every node, and under `-mp` only
/// MEM_LIVE's can have some, so three searches in four are skipped.
#[derive(Default)]
pub(super) struct Leaks {
    all: Vec<Leak>,
    slots: u64,
}

impl Leaks {
    pub(super) fn new(mut all: Vec<Leak>) -> Self {
        all.sort_unstable_by_key(|l| (l.node, l.slot, l.addr));
        let slots = all.iter().fold(0u64, |m, l| m | Self::bit(l.slot));
        Leaks { all, slots }
    }

    /// Counter slot `slot`'s bit of the mask; a slot past its 64 bits sets
    /// (and is looked for under) every bit, so it is always searched.
    fn bit(slot: usize) -> u64 {
        1u64.checked_shl(slot as u32).unwrap_or(!0)
    }

    /// The resources of counter `slot` at `node` (empty when none).
    pub(super) fn of(&self, node: usize, slot: usize) -> &[Leak] {
        if self.slots & Self::bit(slot) == 0 {
            return &[];
        }
        let lo = self
            .all
            .partition_point(|l| (l.node, l.slot) < (node, slot));
        let n = self.all[lo..].partition_point(|l| (l.node, l.slot) == (node, slot));
        &self.all[lo..lo + n]
    }
}

/// All threads' trees merged by path of addresses.
pub(super) struct Merged {
    pub(super) nodes: Vec<MNode>,
    /// Per node: where its nslots (ticks, value, peak) start in `values`,
    /// or [`NO_VALUES`] while they are all zero (most nodes are callers
    /// that carry no counts of their own: a quarter of a compiler's -mp
    /// profile has any).
    pub(super) value_at: Vec<u32>,
    pub(super) values: Vec<(u64, u64, u64)>,
    pub(super) index: HashMap<(u32, usize), u32>,
    pub(super) nslots: usize,
    /// Thread-tree nodes that hold live resources (for LK records) ->
    /// the merged node each went into (`u32::MAX` until merged). Only
    /// those: a table of every node's origin cost a compiler's dump more
    /// than its merge (the vector's growth, its sort, its page faults).
    pub(super) origin: HashMap<usize, u32>,
    /// The live resources, keyed by merged node.
    pub(super) leaks: Leaks,
    /// Names of synthetic top-level functions (address SYNTHETIC_BASE + i).
    pub(super) synthetic: Vec<&'static str>,
    /// The modules' readers of counters stored in another form.
    pub(super) stored_forms: Vec<crate::modules::DumpValueFn>,
}

impl Merged {
    pub(super) fn new(nslots: usize) -> Self {
        let mut m = Merged {
            nodes: Vec::new(),
            value_at: Vec::new(),
            values: Vec::new(),
            index: HashMap::default(),
            nslots,
            origin: HashMap::default(),
            leaks: Leaks::default(),
            synthetic: Vec::new(),
            stored_forms: Vec::new(),
        };
        m.push(0);
        m
    }

    pub(super) fn push(&mut self, addr: usize) -> u32 {
        let id = self.nodes.len() as u32;
        self.nodes.push(MNode {
            addr,
            first_child: u32::MAX,
            last_child: u32::MAX,
            next_sibling: u32::MAX,
        });
        self.value_at.push(NO_VALUES);
        id
    }

    /// The counters of node `id`, None while all are zero.
    pub(super) fn values_of(&self, id: u32) -> Option<&[(u64, u64, u64)]> {
        let at = self.value_at[id as usize];
        (at != NO_VALUES).then(|| &self.values[at as usize..at as usize + self.nslots])
    }

    /// The counters of node `id`, made (zero) if it had none.
    pub(super) fn values_of_mut(&mut self, id: u32) -> &mut [(u64, u64, u64)] {
        let mut at = self.value_at[id as usize];
        if at == NO_VALUES {
            at = self.values.len() as u32;
            self.value_at[id as usize] = at;
            self.values
                .extend(std::iter::repeat_n((0, 0, 0), self.nslots));
        }
        &mut self.values[at as usize..at as usize + self.nslots]
    }

    pub(super) fn child(&mut self, parent: u32, addr: usize) -> u32 {
        match self.index.get(&(parent, addr)) {
            Some(&c) => c,
            // Appended at the end of the sibling list: first-seen order.
            None => self.fresh_child(parent, addr, true),
        }
    }

    /// Room for `more` nodes, so that a large merge does not regrow and
    /// rehash its tables as it goes.
    pub(super) fn reserve(&mut self, more: usize) {
        self.nodes.reserve(more);
        self.value_at.reserve(more);
    }

    /// A new child `addr` of `parent`, known not to be one already (its
    /// parent had no children before this merge, or the index said so).
    /// `indexed`: entered in the index, for later merges to find.
    pub(super) fn fresh_child(&mut self, parent: u32, addr: usize, indexed: bool) -> u32 {
        let c = self.push(addr);
        if indexed {
            self.index.insert((parent, addr), c);
        }
        let p = &mut self.nodes[parent as usize];
        let last = core::mem::replace(&mut p.last_child, c);
        if last == u32::MAX {
            p.first_child = c;
        } else {
            self.nodes[last as usize].next_sibling = c;
        }
        c
    }

    pub(super) fn add(&mut self, into: u32, from: &Node, merges: &[Merge]) {
        // All zero, in every form (`modules::DumpValueFn`).
        if !from.is_charged() {
            return;
        }
        for (s, merge) in merges.iter().enumerate() {
            // A module may store a counter in another form than it is written.
            let stored = self.stored_forms.iter().find_map(|f| f(from, s));
            let (t, v, p) = stored.unwrap_or_else(|| from.get(s));
            if (t, v, p) == (0, 0, 0) {
                // Adds nothing under any merge rule.
                continue;
            }
            let cur = &mut self.values_of_mut(into)[s];
            match merge {
                Merge::Sum => *cur = (cur.0 + t, cur.1 + v, cur.2 + p),
                Merge::Max => *cur = (cur.0 + t, cur.1.max(v), cur.2.max(p)),
                Merge::Live => *cur = (cur.0.wrapping_add(t), cur.1.wrapping_add(v), cur.2.max(p)),
            }
        }
    }

    /// Adds the modules' synthetic top-level functions (their counts that
    /// belong to no stack), after whatever the tree holds.
    pub(super) fn add_modules_synthetic(&mut self) {
        crate::modules::each(crate::base::options::get(), |m| {
            if let Some(f) = m.synthetic {
                f(&mut |name, slot, ticks, value| self.add_synthetic(name, slot, ticks, value))
            }
        });
    }

    /// Adds `ticks`/`value` (peak = value) to counter `slot` of the synthetic
    /// top-level function `name`.
    pub(super) fn add_synthetic(
        &mut self,
        name: &'static str,
        slot: usize,
        ticks: u64,
        value: u64,
    ) {
        let i = match self.synthetic.iter().position(|&n| n == name) {
            Some(i) => i,
            None => {
                self.synthetic.push(name);
                self.synthetic.len() - 1
            }
        };
        let node = self.child(0, SYNTHETIC_BASE + i);
        let cur = &mut self.values_of_mut(node)[slot];
        *cur = (cur.0 + ticks, cur.1 + value, cur.2 + value);
    }

    /// Merges the subtree under `from` (a tree node) into merged node `into`.
    /// `last`: no tree is merged after this one, so the nodes it adds need
    /// no index entries (each (parent, address) of one tree comes once).
    pub(super) fn merge_tree(&mut self, into: u32, from: &Node, last: bool) {
        let merges: Vec<Merge> = (0..self.nslots)
            .map(|s| counters::def_of_slot(s).merge)
            .collect();
        // Nodes made by this merge: their children are all new too.
        let made = self.nodes.len() as u32;
        let mut stack: Vec<(u32, &Node)> = vec![(into, from)];
        while let Some((m, n)) = stack.pop() {
            self.add(m, n, &merges);
            if !self.origin.is_empty() {
                if let Some(o) = self.origin.get_mut(&(n as *const Node as usize)) {
                    *o = m;
                }
            }
            let fresh = m >= made && self.nodes[m as usize].first_child == u32::MAX;
            for c in n.children() {
                let known = if fresh {
                    None
                } else {
                    self.index.get(&(m, c.addr)).copied()
                };
                let mc = known.unwrap_or_else(|| self.fresh_child(m, c.addr, !last));
                stack.push((mc, c));
            }
        }
    }

    /// The merged node of thread-tree node `node`, if it was one of the
    /// nodes asked for in `origin` and merged.
    pub(super) fn origin_of(&self, node: usize) -> Option<u32> {
        self.origin.get(&node).copied().filter(|&m| m != u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::{Leak, Leaks};

    fn leak(node: usize, slot: usize, addr: u64) -> Leak {
        Leak {
            node,
            slot,
            addr,
            size: addr * 2,
        }
    }

    #[test]
    fn a_nodes_leaks_of_one_counter_are_one_sorted_slice() {
        let l = Leaks::new(vec![
            leak(7, 2, 30),
            leak(5, 2, 10),
            leak(7, 2, 20),
            leak(7, 70, 40),
            leak(7, 3, 50),
        ]);
        let addrs = |node, slot| l.of(node, slot).iter().map(|l| l.addr).collect::<Vec<_>>();
        assert_eq!(addrs(7, 2), [20, 30]);
        assert_eq!(addrs(5, 2), [10]);
        assert_eq!(addrs(7, 3), [50]);
        assert_eq!(addrs(7, 70), [40], "a slot past the mask's bits");
        assert!(addrs(7, 0).is_empty() && addrs(6, 2).is_empty() && addrs(5, 3).is_empty());
        assert!(Leaks::new(Vec::new()).of(7, 2).is_empty());
    }
}
