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

/// Number of cache slots (64 KiB of descriptors per thread).
pub(crate) const CACHE_SLOTS: usize = 4096;
const SLOT_BITS: u32 = CACHE_SLOTS.trailing_zeros();
const _: () = assert!(CACHE_SLOTS.is_power_of_two());

/// Direct-mapped PC -> descriptor cache, tagged with the module table
/// generation it was filled from.
#[repr(C)]
pub(crate) struct DescriptorCache {
    generation: u32,
    /// Some slot was filled since the cache was last emptied.
    filled: bool,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    slots: [Slot; CACHE_SLOTS],
}

// SAFETY: integers, an enum whose 0 is `Kind::Empty`, and a bool: all-zero
// is a valid empty cache.
unsafe impl Zeroable for DescriptorCache {}

impl DescriptorCache {
    #[inline(always)]
    fn index(key: usize) -> usize {
        (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (usize::BITS - SLOT_BITS)
    }

    /// Empty the cache if it was filled from another module table.
    #[inline]
    pub(crate) fn sync_generation(&mut self, generation: u32) {
        if self.generation != generation {
            if self.filled {
                self.slots
                    .iter_mut()
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
        let s = &self.slots[Self::index(key)];
        if s.key == key && s.desc.kind != Kind::Empty && s.desc.first == first {
            self.hits += 1;
            Some(s.desc)
        } else {
            self.misses += 1;
            None
        }
    }

    #[inline]
    pub(crate) fn put(&mut self, key: usize, desc: Descriptor) {
        self.filled = true;
        self.slots[Self::index(key)] = Slot { key, desc };
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
    }
}
