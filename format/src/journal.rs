//! The journal beside a snapshot: `PROFILE.journal`, the allocations and
//! frees, descriptors opened and closed and PERF ticks a process counted
//! after the snapshot it wrote near its memory limit, in a file the
//! process mapped `MAP_SHARED` so that they survive an OOM kill (the
//! pages belong to the file, not to the process). The library writes it
//! (`igprof-rs`' `modules::mem::journal`), igprof-analyse applies it to
//! the snapshot.
//!
//! Owns: the file's layout (the constants below) and its parsing
//! ([`Journal::parse`]).
//!
//! Must never: panic on any input (a journal is read after its writer was
//! killed, at any point of any record).
//!
//! # Layout
//!
//! Little-endian 64-bit words. The header is the first [`HEADER_BYTES`]:
//! word [`W_MAGIC`] is [`MAGIC`], then the pid, and the time written in
//! the `dumped` note (microseconds since the epoch) and the file size of
//! the snapshot it follows (a journal whose snapshot was replaced is not
//! applied; a copy of the two files still is), the capacity and cursor in
//! slots, where the module table and the records start, and how many
//! records did not fit. The module
//! table lists, for each loaded object, `start, end, base, len` and the
//! path's `len` bytes padded to 8: the base is what the profile's object
//! offsets count from (`dladdr`'s `dli_fbase`). Records are slots of
//! [`SLOT_BYTES`]; a slot's first word (kind in its low byte) is written
//! last, so a slot the process died writing reads as empty (kind 0).
//!
//! - [`ALLOC`]: node, address, calls, bytes, largest (MEM_MAX's value);
//! - [`FREE`]: node, address, calls, bytes (of the block's allocation);
//! - [`RESTORE`]: as FREE, the block given back to its stack (a failed
//!   `realloc`): MEM_LIVE only;
//!
//!   bits 8..16 of these three's first word say whose counters they
//!   change ([`Family`]): the memory profiler's, or the descriptor
//!   profiler's (the address is then the descriptor, its bytes 1);
//! - [`TICKS`]: node, ticks, value: PERF_TICKS of the samples taken;
//! - [`PATH`]: node, then its stack, innermost first, 6 addresses here and
//!   7 in each of the [`CONT`] slots that follow it; bits 8..32 of its
//!   first word hold the stack's depth. A node is an opaque number naming
//!   a stack within one journal; records before its PATH may name it.

/// `IGPRJNL1` as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"IGPRJNL1");
pub const HEADER_BYTES: usize = 4096;
pub const SLOT_BYTES: usize = 64;
pub const SLOT_WORDS: usize = SLOT_BYTES / 8;

/// Header words.
pub const W_MAGIC: usize = 0;
pub const W_PID: usize = 1;
/// The snapshot's `dumped` note in microseconds, and its file's size.
pub const W_DUMPED_US: usize = 2;
pub const W_SIZE: usize = 4;
/// Capacity of the record area, in slots.
pub const W_CAPACITY: usize = 5;
/// Slots taken so far (may pass the capacity: those did not fit).
pub const W_CURSOR: usize = 6;
/// Byte offset and length of the module table.
pub const W_MODULES_AT: usize = 7;
pub const W_MODULES_LEN: usize = 8;
/// Byte offset of the first record slot.
pub const W_RECORDS_AT: usize = 9;

/// Record kinds (low byte of a slot's first word).
pub const ALLOC: u64 = 1;
pub const FREE: u64 = 2;
pub const RESTORE: u64 = 3;
pub const PATH: u64 = 4;
pub const CONT: u64 = 5;
pub const TICKS: u64 = 6;

/// Whose counters an ALLOC, FREE or RESTORE changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Family {
    /// MEM_TOTAL, MEM_MAX, MEM_LIVE, MEM_LIVE_AT_PEAK.
    #[default]
    Memory,
    /// FD_USED, FD_LIVE.
    Descriptors,
}

impl Family {
    /// The family's number in a record (bits 8..16 of its first word).
    pub const fn code(self) -> u64 {
        match self {
            Family::Memory => 0,
            Family::Descriptors => 1,
        }
    }
    fn of(hdr: u64) -> Option<Family> {
        match (hdr >> 8) & 0xff {
            0 => Some(Family::Memory),
            1 => Some(Family::Descriptors),
            _ => None,
        }
    }
}
/// Addresses of a stack in a PATH slot and in a CONT slot.
pub const PATH_FIRST: usize = SLOT_WORDS - 2;
pub const PATH_MORE: usize = SLOT_WORDS - 1;

/// Slots a PATH record of `depth` addresses takes.
pub fn path_slots(depth: usize) -> usize {
    1 + depth.saturating_sub(PATH_FIRST).div_ceil(PATH_MORE)
}

/// One loaded object of the module table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub start: u64,
    pub end: u64,
    pub base: u64,
    pub path: String,
}

/// A change to one stack's memory counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Alloc {
        family: Family,
        addr: u64,
        calls: u64,
        bytes: u64,
        largest: u64,
    },
    Free {
        family: Family,
        addr: u64,
        calls: u64,
        bytes: u64,
    },
    Restore {
        family: Family,
        addr: u64,
        calls: u64,
        bytes: u64,
    },
    Ticks {
        ticks: u64,
        value: u64,
    },
}

/// A parsed journal.
#[derive(Debug, Default)]
pub struct Journal {
    pub pid: u64,
    /// The snapshot it follows: its `dumped` note in microseconds since
    /// the epoch, and its file's size.
    pub snapshot: (u64, u64),
    pub modules: Vec<Module>,
    /// Stacks by node, innermost address first.
    pub paths: std::collections::HashMap<u64, Vec<u64>>,
    /// The changes in the order they were written: (node, change).
    pub changes: Vec<(u64, Change)>,
    /// Records that did not fit in the file.
    pub dropped: u64,
    /// Slots found empty or broken (a record its writer did not finish).
    pub unfinished: u64,
}

/// Why a journal cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalError {
    NotAJournal,
    /// The header points outside the file (at byte `at`).
    Damaged {
        at: usize,
    },
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalError::NotAJournal => write!(f, "not an igprof memory journal"),
            JournalError::Damaged { at } => {
                write!(
                    f,
                    "damaged memory journal (its header points past byte {at})"
                )
            }
        }
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    b.get(i * 8..i * 8 + 8)
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
}

/// The size of the snapshot a journal follows, read from the first words
/// of its header (`head`, at least `(W_SIZE + 1) * 8` bytes), or None when
/// they are not a journal's: enough to pass over a journal of another
/// dump without reading the rest.
pub fn snapshot_size(head: &[u8]) -> Option<u64> {
    (word(head, W_MAGIC) == MAGIC).then(|| word(head, W_SIZE))
}

impl Journal {
    pub fn parse(b: &[u8]) -> Result<Journal, JournalError> {
        if b.len() < HEADER_BYTES || word(b, W_MAGIC) != MAGIC {
            return Err(JournalError::NotAJournal);
        }
        let mut j = Journal {
            pid: word(b, W_PID),
            snapshot: (word(b, W_DUMPED_US), word(b, W_SIZE)),
            ..Journal::default()
        };
        let damaged = |at: u64| JournalError::Damaged { at: at as usize };
        let (mat, mlen) = (word(b, W_MODULES_AT), word(b, W_MODULES_LEN));
        let mend = mat.checked_add(mlen).filter(|&e| e <= b.len() as u64);
        let table = &b[mat.min(b.len() as u64) as usize..mend.ok_or(damaged(mat))? as usize];
        let mut at = 0;
        while at + 32 <= table.len() {
            let len = word(table, at / 8 + 3) as usize;
            let path = table.get(at + 32..(at + 32).saturating_add(len));
            let Some(path) = path else {
                return Err(damaged(mat + at as u64));
            };
            j.modules.push(Module {
                start: word(table, at / 8),
                end: word(table, at / 8 + 1),
                base: word(table, at / 8 + 2),
                path: String::from_utf8_lossy(path).into_owned(),
            });
            at += 32 + len.div_ceil(8) * 8;
        }
        let rat = word(b, W_RECORDS_AT);
        if !rat.is_multiple_of(8) || rat > b.len() as u64 {
            return Err(damaged(rat));
        }
        let capacity = word(b, W_CAPACITY);
        let cursor = word(b, W_CURSOR);
        j.dropped = cursor.saturating_sub(capacity);
        let slots = cursor
            .min(capacity)
            .min(((b.len() as u64) - rat) / SLOT_BYTES as u64) as usize;
        let rec = &b[rat as usize..];
        let mut s = 0;
        while s < slots {
            let w = |k: usize| word(rec, s * SLOT_WORDS + k);
            let hdr = w(0);
            let family = Family::of(hdr);
            match (hdr & 0xff, family) {
                (ALLOC, Some(family)) => j.changes.push((
                    w(1),
                    Change::Alloc {
                        family,
                        addr: w(2),
                        calls: w(3),
                        bytes: w(4),
                        largest: w(5),
                    },
                )),
                (FREE | RESTORE, Some(family)) => {
                    let (addr, calls, bytes) = (w(2), w(3), w(4));
                    let c = if hdr & 0xff == FREE {
                        Change::Free {
                            family,
                            addr,
                            calls,
                            bytes,
                        }
                    } else {
                        Change::Restore {
                            family,
                            addr,
                            calls,
                            bytes,
                        }
                    };
                    j.changes.push((w(1), c));
                }
                (TICKS, _) => j.changes.push((
                    w(1),
                    Change::Ticks {
                        ticks: w(2),
                        value: w(3),
                    },
                )),
                (PATH, _) => {
                    let depth = ((hdr >> 8) & 0xff_ffff) as usize;
                    let n = path_slots(depth);
                    let whole = s + n <= slots
                        && (1..n).all(|k| word(rec, (s + k) * SLOT_WORDS) & 0xff == CONT);
                    if !whole {
                        j.unfinished += 1;
                        s += 1;
                        continue;
                    }
                    let mut stack = Vec::with_capacity(depth);
                    stack.extend((0..depth.min(PATH_FIRST)).map(|k| w(2 + k)));
                    for k in 1..n {
                        let left = depth - stack.len();
                        stack.extend(
                            (0..left.min(PATH_MORE))
                                .map(|i| word(rec, (s + k) * SLOT_WORDS + 1 + i)),
                        );
                    }
                    j.paths.insert(w(1), stack);
                    s += n;
                    continue;
                }
                // A continuation met on its own: its PATH was not finished.
                _ => j.unfinished += 1,
            }
            s += 1;
        }
        Ok(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(b: &mut [u8], i: usize, v: u64) {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// A journal with one module, a path of 9 addresses (two slots), an
    /// allocation, a free and `extra` slots as written.
    fn journal(extra: &[[u64; SLOT_WORDS]], capacity: u64) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES + 64 * SLOT_BYTES];
        put(&mut b, W_MAGIC, MAGIC);
        put(&mut b, W_PID, 42);
        put(&mut b, W_DUMPED_US, 2);
        put(&mut b, W_SIZE, 3);
        let m = 80;
        put(&mut b, m, 0x1000);
        put(&mut b, m + 1, 0x2000);
        put(&mut b, m + 2, 0x1000);
        put(&mut b, m + 3, 5);
        b[(m + 4) * 8..(m + 4) * 8 + 5].copy_from_slice(b"./app");
        put(&mut b, W_MODULES_AT, (m * 8) as u64);
        put(&mut b, W_MODULES_LEN, 40);
        put(&mut b, W_RECORDS_AT, HEADER_BYTES as u64);
        let mut slots: Vec<[u64; SLOT_WORDS]> = vec![
            [ALLOC, 7, 0x500, 1, 100, 100, 0, 0],
            [PATH | (9 << 8), 7, 1, 2, 3, 4, 5, 6],
            [CONT, 7, 8, 9, 0, 0, 0, 0],
            [FREE, 7, 0x500, 1, 100, 0, 0, 0],
            [ALLOC | 1 << 8, 7, 3, 1, 1, 0, 0, 0],
            [TICKS, 7, 2, 2, 0, 0, 0, 0],
            [ALLOC | 9 << 8, 7, 3, 1, 1, 0, 0, 0],
        ];
        slots.extend_from_slice(extra);
        for (s, slot) in slots.iter().enumerate() {
            for (k, &v) in slot.iter().enumerate() {
                put(&mut b, HEADER_BYTES / 8 + s * SLOT_WORDS + k, v);
            }
        }
        put(&mut b, W_CAPACITY, capacity);
        put(&mut b, W_CURSOR, slots.len() as u64);
        b
    }

    #[test]
    fn a_journal_reads_back_its_modules_paths_and_changes() {
        let j = Journal::parse(&journal(&[], 64)).unwrap();
        assert_eq!((j.pid, j.snapshot), (42, (2, 3)));
        assert_eq!(
            j.modules,
            [Module {
                start: 0x1000,
                end: 0x2000,
                base: 0x1000,
                path: "./app".into()
            }]
        );
        assert_eq!(j.paths[&7], (1..=9).collect::<Vec<u64>>());
        assert_eq!(
            j.changes.iter().map(|c| c.1).collect::<Vec<_>>(),
            [
                Change::Alloc {
                    family: Family::Memory,
                    addr: 0x500,
                    calls: 1,
                    bytes: 100,
                    largest: 100
                },
                Change::Free {
                    family: Family::Memory,
                    addr: 0x500,
                    calls: 1,
                    bytes: 100
                },
                Change::Alloc {
                    family: Family::Descriptors,
                    addr: 3,
                    calls: 1,
                    bytes: 1,
                    largest: 0
                },
                Change::Ticks { ticks: 2, value: 2 },
            ]
        );
        // A family this reader does not know is skipped, as unfinished.
        assert_eq!((j.dropped, j.unfinished), (0, 1));
    }

    #[test]
    fn unfinished_records_are_skipped_and_counted() {
        // A PATH whose continuation was never written, then an empty slot.
        let j = Journal::parse(&journal(
            &[[PATH | (9 << 8), 8, 1, 2, 3, 4, 5, 6], [0; SLOT_WORDS]],
            64,
        ))
        .unwrap();
        assert!(!j.paths.contains_key(&8));
        assert_eq!(j.unfinished, 3);
        assert_eq!(j.changes.len(), 4);
    }

    #[test]
    fn records_past_the_capacity_are_counted_as_dropped() {
        let j = Journal::parse(&journal(&[], 2)).unwrap();
        assert_eq!(j.dropped, 5);
        assert_eq!(j.changes.len(), 1, "the slots within the capacity only");
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        assert_eq!(
            Journal::parse(b"short").unwrap_err(),
            JournalError::NotAJournal
        );
        let mut b = journal(&[], 64);
        put(&mut b, W_MODULES_LEN, u64::MAX);
        assert!(matches!(
            Journal::parse(&b),
            Err(JournalError::Damaged { .. })
        ));
        let mut b = journal(&[], 64);
        put(&mut b, W_RECORDS_AT, 1 << 40);
        assert!(matches!(
            Journal::parse(&b),
            Err(JournalError::Damaged { .. })
        ));
        let mut b = journal(&[], 64);
        put(&mut b, W_CURSOR, u64::MAX);
        put(&mut b, W_CAPACITY, u64::MAX);
        Journal::parse(&b).unwrap();
    }
}
