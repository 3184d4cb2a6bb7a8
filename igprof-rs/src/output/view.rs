//! What the records are written from: the call tree of the profile as
//! [`ProfileTree`] gives it, either the tree [`Merged`] built from every
//! thread's, or, when one thread's tree is the whole profile (a
//! single-threaded process: compilers, most tools), that tree itself
//! ([`Single`]), read in place instead of copied. A compiler's copy was a
//! tenth of its peak memory under `-mp`.
//!
//! Owns the trait and [`Single`]. Must never: change a thread's tree, or
//! order children differently from [`Merged`] (the same profile, byte for
//! byte, whichever is used).

use super::merge::{HashMap, Leak, Leaks, Merged, SYNTHETIC_BASE};
use crate::base::tree::{Node, ALLOCATOR_MMAP, TRUNCATED};

/// A node of the profile's tree (its root: [`ProfileTree::ROOT`]).
pub(super) trait ProfileTree {
    type Id: Copy;
    /// Counters per node.
    fn nslots(&self) -> usize;
    /// The root's children, in the order they are written.
    fn top(&self, out: &mut Vec<Self::Id>);
    /// `id`'s children, in the order they are written.
    fn children(&self, id: Self::Id, out: &mut Vec<Self::Id>);
    fn addr(&self, id: Self::Id) -> usize;
    /// `id`'s counters into `out` (nslots of them); false when all are zero.
    fn values(&self, id: Self::Id, out: &mut [(u64, u64, u64)]) -> bool;
    /// The live resources of counter `slot` at `id`.
    fn leaks(&self, id: Self::Id, slot: usize) -> &[Leak];
    /// Names of the synthetic top-level functions (address SYNTHETIC_BASE + i).
    fn synthetic(&self) -> &[&'static str];
    /// Nodes besides the root.
    fn len(&self) -> usize;
    /// The distinct code addresses of the tree (not the synthetic
    /// functions', the truncation marker or the allocator-mapping leaf),
    /// sorted.
    fn code_addresses(&self) -> Vec<usize>;
}

/// Whether `a` is the address of code (not a marker of the tree's own).
pub(super) fn is_code(a: usize, synthetic: usize) -> bool {
    a != TRUNCATED
        && a != ALLOCATOR_MMAP
        && !(SYNTHETIC_BASE..SYNTHETIC_BASE + synthetic).contains(&a)
}

impl ProfileTree for Merged {
    type Id = u32;

    fn nslots(&self) -> usize {
        self.nslots
    }

    fn top(&self, out: &mut Vec<u32>) {
        self.children(0, out)
    }

    fn children(&self, id: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut c = self.nodes[id as usize].first_child;
        while c != u32::MAX {
            out.push(c);
            c = self.nodes[c as usize].next_sibling;
        }
    }

    fn addr(&self, id: u32) -> usize {
        self.nodes[id as usize].addr
    }

    fn values(&self, id: u32, out: &mut [(u64, u64, u64)]) -> bool {
        match self.values_of(id) {
            Some(v) => {
                out.copy_from_slice(v);
                true
            }
            None => false,
        }
    }

    fn leaks(&self, id: u32, slot: usize) -> &[Leak] {
        self.leaks.of(id as usize, slot)
    }

    fn synthetic(&self) -> &[&'static str] {
        &self.synthetic
    }

    fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    fn code_addresses(&self) -> Vec<usize> {
        let n = self.synthetic.len();
        let mut v: Vec<usize> = self.nodes[1..]
            .iter()
            .map(|m| m.addr)
            .filter(|&a| is_code(a, n))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// One thread's tree as the profile, with the synthetic top-level
/// functions (kept in a small [`Merged`] of their own) after its nodes.
pub(super) struct Single<'t> {
    pub(super) root: &'t Node,
    pub(super) nodes: usize,
    /// Counters stored in another form (the modules' readers).
    pub(super) stored_forms: Vec<crate::modules::DumpValueFn>,
    /// The live resources, keyed by tree node address.
    pub(super) leaks: Leaks,
    /// The synthetic functions (children of its root only).
    pub(super) extra: Merged,
}

/// A node of a [`Single`]: the thread tree's, or a synthetic one.
#[derive(Clone, Copy)]
pub(super) enum SingleId<'t> {
    Tree(&'t Node),
    Extra(u32),
}

impl<'t> ProfileTree for Single<'t> {
    type Id = SingleId<'t>;

    fn nslots(&self) -> usize {
        self.extra.nslots
    }

    fn top(&self, out: &mut Vec<SingleId<'t>>) {
        self.children(SingleId::Tree(self.root), out);
        let mut extra = Vec::new();
        self.extra.children(0, &mut extra);
        out.extend(extra.into_iter().map(SingleId::Extra));
    }

    fn children(&self, id: SingleId<'t>, out: &mut Vec<SingleId<'t>>) {
        out.clear();
        if let SingleId::Tree(n) = id {
            out.extend(n.children().map(|k| {
                k.prefetch_below();
                SingleId::Tree(k)
            }));
        }
    }

    fn addr(&self, id: SingleId<'t>) -> usize {
        match id {
            SingleId::Tree(n) => n.addr,
            SingleId::Extra(e) => self.extra.nodes[e as usize].addr,
        }
    }

    fn values(&self, id: SingleId<'t>, out: &mut [(u64, u64, u64)]) -> bool {
        match id {
            SingleId::Tree(n) => {
                // An uncharged node's values are all zero, in every form
                // (`modules::DumpValueFn`): most nodes of a call tree
                // (14,000 of a small cc1's 19,500) are only callers.
                if !n.is_charged() {
                    return false;
                }
                let mut any = false;
                for (s, o) in out.iter_mut().enumerate() {
                    let v = self
                        .stored_forms
                        .iter()
                        .find_map(|f| f(n, s))
                        .unwrap_or_else(|| n.get(s));
                    any |= v != (0, 0, 0);
                    *o = v;
                }
                any
            }
            SingleId::Extra(e) => self.extra.values(e, out),
        }
    }

    fn leaks(&self, id: SingleId<'t>, slot: usize) -> &[Leak] {
        match id {
            SingleId::Tree(n) => self.leaks.of(n as *const Node as usize, slot),
            SingleId::Extra(_) => &[],
        }
    }

    fn synthetic(&self) -> &[&'static str] {
        &self.extra.synthetic
    }

    fn len(&self) -> usize {
        self.nodes + self.extra.len()
    }

    fn code_addresses(&self) -> Vec<usize> {
        let mut seen: HashMap<usize, ()> = HashMap::default();
        let mut stack = vec![self.root];
        while let Some(n) = stack.pop() {
            for c in n.children() {
                if is_code(c.addr, 0) {
                    seen.insert(c.addr, ());
                }
                stack.push(c);
            }
        }
        let mut v: Vec<usize> = seen.into_keys().collect();
        v.sort_unstable();
        v
    }
}
