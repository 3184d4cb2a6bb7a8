//! -mp's epochs (`--marks`, `--mark-every`, `igprof_mark()`): every live
//! block remembers the epoch it was allocated in, and the dump writes
//! MEM_LIVE_SINCE_MARK, the blocks allocated since the last mark that are
//! still live, per stack: "what grew since this point and stayed".
//!
//! Owns: how a live-table entry of the exact mode keeps its epoch (above
//! bit 48 of its stored size: a block's size fits 48 bits) and reading the
//! size back out of an entry ([`bytes`]). The counter is gathered from the
//! live table before each dump (`account::gather_since_mark`): no counter
//! is updated on the allocation path.
//!
//! Must never: tag an entry of the sampled mode (its stored value is a
//! packed weight with no spare bits; `--marks` is refused with
//! `--sample-bytes`), or let a tagged size reach a counter.

use crate::base::run;

/// Where the epoch sits in a stored size.
const SHIFT: u32 = 48;
/// The size part of a stored size.
const SIZE_MASK: u64 = (1 << SHIFT) - 1;

/// What the live table keeps for a block of `size` bytes in exact mode:
/// the size, with the current epoch above it once a mark was made.
#[inline(always)]
pub fn tagged(size: u64) -> u64 {
    match run::epoch() {
        0 => size,
        e => size.min(SIZE_MASK) | (e as u64) << SHIFT,
    }
}

/// The size of an exact-mode entry (its epoch left out).
#[inline(always)]
pub fn bytes(stored: u64) -> u64 {
    stored & SIZE_MASK
}

/// The epoch an exact-mode entry was allocated in (0: before any mark).
#[inline(always)]
pub fn epoch_of(stored: u64) -> u32 {
    (stored >> SHIFT) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_keeps_its_size_and_epoch_apart() {
        let stored = 12345 | 7 << SHIFT;
        assert_eq!((bytes(stored), epoch_of(stored)), (12345, 7));
        assert_eq!(bytes(tagged(99)), 99);
    }
}
