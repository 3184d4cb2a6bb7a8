//! Compact frame descriptors and the per-thread cache that maps a PC to one.
//!
//! Owns: the descriptor encoding (architecture-neutral: CFA from the stack
//! or frame pointer plus an offset, return address and saved frame pointer
//! at fixed slots from the CFA) and a fixed-size direct-mapped cache of them.
//! Never allocates; the cache lives in the thread unwinder's mapping.

use super::mem::Zeroable;

/// How to find the caller's frame from a frame whose PC maps to this
/// descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// An unused cache slot (all-zero memory).
    Empty = 0,
    /// CFA = SP + cfa_offset.
    CfaSp,
    /// CFA = FP + cfa_offset.
    CfaFp,
    /// No caller: the unwind info says the return address is undefined.
    Outermost,
    /// The PC is the signal return trampoline: the interrupted registers are
    /// in the ucontext at SP.
    SignalFrame,
    /// The rule does not fit this encoding: unwind this frame with framehop.
    Framehop,
}

/// A compact unwind rule for one PC (8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Descriptor {
    /// Offset from the SP or FP to the CFA, in bytes.
    pub cfa_offset: i32,
    /// Where the return address is saved, in 8-byte words from the CFA.
    pub ra_slot_by_8: i8,
    /// Where the caller's FP is saved, in 8-byte words from the CFA; 0 means
    /// the FP is unchanged by this frame.
    pub fp_slot_by_8: i8,
    pub kind: Kind,
    /// The key was an interrupted PC (looked up as is), not a return address.
    pub first: bool,
}

impl Descriptor {
    pub(crate) const fn new(
        kind: Kind,
        cfa_offset: i32,
        ra_slot_by_8: i8,
        fp_slot_by_8: i8,
        first: bool,
    ) -> Self {
        Descriptor {
            cfa_offset,
            ra_slot_by_8,
            fp_slot_by_8,
            kind,
            first,
        }
    }

    pub(crate) const fn of_kind(kind: Kind, first: bool) -> Self {
        Descriptor {
            cfa_offset: 0,
            ra_slot_by_8: 0,
            fp_slot_by_8: 0,
            kind,
            first,
        }
    }
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    key: usize,
    desc: Descriptor,
}

const _: () = assert!(core::mem::size_of::<Descriptor>() == 8);
const _: () = assert!(core::mem::size_of::<Slot>() == 16);

/// Number of cache slots (64 KiB of descriptors per thread), in sets of two.
pub(crate) const CACHE_SLOTS: usize = 4096;
const WAYS: usize = 2;
const SETS: usize = CACHE_SLOTS / WAYS;
const SET_BITS: u32 = SETS.trailing_zeros();
const _: () = assert!(SETS.is_power_of_two());

/// Two-way set-associative PC -> descriptor cache, tagged with the module
/// table generation it was filled from. A new entry goes to way 0 and
/// moves the previous one to way 1, so a lookup hit never writes.
#[repr(C)]
pub(crate) struct DescriptorCache {
    generation: u32,
    /// Some slot was filled since the cache was last emptied.
    filled: bool,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    /// Misses answered by the descriptor store.
    pub(crate) stored: u64,
    /// With `IGPROF_STORE_CHECK`: of those, how many a fresh derivation
    /// described otherwise.
    pub(crate) stored_differ: u64,
    /// Frames whose rule no descriptor can hold (unwound by framehop).
    pub(crate) framehop: u64,
    sets: [[Slot; WAYS]; SETS],
}

// SAFETY: integers, an enum whose 0 is `Kind::Empty`, and a bool: all-zero
// is a valid empty cache.
unsafe impl Zeroable for DescriptorCache {}

impl DescriptorCache {
    #[inline(always)]
    fn set(key: usize) -> usize {
        (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (usize::BITS - SET_BITS)
    }

    /// Empty the cache if it was filled from another module table.
    #[inline]
    pub(crate) fn sync_generation(&mut self, generation: u32) {
        if self.generation != generation {
            if self.filled {
                self.sets
                    .iter_mut()
                    .flatten()
                    .for_each(|s| s.desc.kind = Kind::Empty);
                self.filled = false;
            }
            self.generation = generation;
        }
    }

    /// The descriptor for lookup address `key` (an interrupted PC when
    /// `first`, a return address minus one otherwise).
    #[inline(always)]
    pub(crate) fn get(&mut self, key: usize, first: bool) -> Option<Descriptor> {
        let set = &self.sets[Self::set(key)];
        let hit = |s: &Slot| s.key == key && s.desc.kind != Kind::Empty && s.desc.first == first;
        let found = if hit(&set[0]) {
            Some(set[0].desc)
        } else if hit(&set[1]) {
            Some(set[1].desc)
        } else {
            None
        };
        match found {
            Some(_) => self.hits += 1,
            None => self.misses += 1,
        }
        found
    }

    #[inline]
    pub(crate) fn put(&mut self, key: usize, desc: Descriptor) {
        self.filled = true;
        let set = &mut self.sets[Self::set(key)];
        set[1] = set[0];
        set[0] = Slot { key, desc };
    }
}

#[cfg(test)]
mod tests {
    use super::super::mem::MmapSlice;
    use super::*;

    #[test]
    fn hit_miss_generation_and_first_flag() {
        let mut m = MmapSlice::<DescriptorCache>::zeroed(1).unwrap();
        let c = &mut m.as_mut_slice()[0];
        c.sync_generation(7);
        assert_eq!(c.get(0x401000, false), None);
        let d = Descriptor {
            cfa_offset: 16,
            ra_slot_by_8: -1,
            fp_slot_by_8: -2,
            kind: Kind::CfaSp,
            first: false,
        };
        c.put(0x401000, d);
        assert_eq!(c.get(0x401000, false), Some(d));
        assert_eq!(
            c.get(0x401000, true),
            None,
            "a return-address rule is not an interrupted-PC rule"
        );
        assert_eq!(c.get(0x401001, false), None);
        c.sync_generation(7);
        assert_eq!(c.get(0x401000, false), Some(d));
        c.sync_generation(8);
        assert_eq!(
            c.get(0x401000, false),
            None,
            "new module table empties the cache"
        );
        assert_eq!((c.hits, c.misses), (2, 4));
        // Two keys of one set both stay; a third evicts the older.
        let same_set: Vec<usize> = (0x500000..)
            .filter(|&k| DescriptorCache::set(k) == DescriptorCache::set(0x401000))
            .take(3)
            .collect();
        for &k in &same_set[..2] {
            c.put(k, d);
        }
        assert!(c.get(same_set[0], false).is_some() && c.get(same_set[1], false).is_some());
        c.put(same_set[2], d);
        assert!(c.get(same_set[0], false).is_none(), "oldest evicted");
        assert!(c.get(same_set[1], false).is_some() && c.get(same_set[2], false).is_some());
    }
}
