//! Plans kept between processes: for a function's exact bytes, the plan of
//! its hook and the record of its taken instructions (`Arch::record`),
//! so that hooking it again needs no decoding.
//!
//! On x86-64 the decoder (iced-x86) builds its tables once per process
//! before it decodes anything, a large share of what a profiled no-op
//! process costs (docs/benchmarks.md), paid again by every process of a
//! build.
//! A plan is a pure function of the function's bytes (its whole body when
//! its size is known: the back-jump scan reads all of it), its size and
//! the patch length; the record adds nothing that depends on where the
//! function or the trampoline is. So an entry is keyed by a 64-bit hash of
//! the bytes, their length, the size and the patch length, and a process
//! that finds every function it hooks here never decodes.
//!
//! Owns: the table of known plans, its file format ([`export`],
//! [`import`]) and the key. The caller (the profiler) decides where the
//! bytes are kept; a table from another build of the trampoline code must
//! not be imported (the caller names its files by its own build).
//!
//! Must never: give a plan for other bytes than it was made for (the key
//! covers every byte the planning read), or accept a damaged entry (each
//! carries a checksum; `Arch::relocate_known` also checks the record
//! against the code and refuses what does not fit).

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::arch::Plan;

const MAGIC: [u8; 8] = *b"IGPRPLN1";
/// hash (8), length (4), size (8; u64::MAX = unknown), patch length (1).
const KEY: usize = 21;
/// Entries a table holds (a profiler hooks a few dozen functions).
const MAX_ENTRIES: usize = 4096;

pub(crate) type Key = [u8; KEY];

struct Table {
    entries: BTreeMap<Key, (Plan, Vec<u8>)>,
    /// Entries were added since the last [`import`] or [`export`].
    added: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    entries: BTreeMap::new(),
    added: false,
});

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn hash(bytes: &[u8]) -> u64 {
    // `DefaultHasher::new` has fixed keys: the same hash in every process
    // of a build.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// The key of planning `code` (size `size`) for a patch of `patch_len`.
pub(crate) fn key(code: &[u8], size: Option<u64>, patch_len: usize) -> Key {
    let mut k = [0u8; KEY];
    k[..8].copy_from_slice(&hash(code).to_le_bytes());
    k[8..12].copy_from_slice(&(code.len() as u32).to_le_bytes());
    k[12..20].copy_from_slice(&size.unwrap_or(u64::MAX).to_le_bytes());
    k[20] = patch_len as u8;
    k
}

/// The plan and record known for `key`.
pub(crate) fn get(key: &Key) -> Option<(Plan, Vec<u8>)> {
    table().entries.get(key).cloned()
}

/// Remembers `plan` and `record` for `key` (made by `Arch::plan` and
/// `Arch::record` for the key's code).
pub(crate) fn put(key: Key, plan: Plan, record: Vec<u8>) {
    let mut t = table();
    if t.entries.len() < MAX_ENTRIES && !t.entries.contains_key(&key) {
        t.entries.insert(key, (plan, record));
        t.added = true;
    }
}

/// How many plans the table holds.
pub fn len() -> usize {
    table().entries.len()
}

/// Whether the table holds no plan.
pub fn is_empty() -> bool {
    len() == 0
}

/// The whole table as bytes, when plans were added since the last
/// [`import`] or `export` (None: nothing new to keep).
pub fn export() -> Option<Vec<u8>> {
    let mut t = table();
    if !t.added {
        return None;
    }
    t.added = false;
    Some(table_bytes(t.entries.len(), t.entries.iter()))
}

/// `count` entries in the format [`import`] reads.
fn table_bytes<'a>(
    count: usize,
    entries: impl Iterator<Item = (&'a Key, &'a (Plan, Vec<u8>))>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + count * 64);
    out.extend(MAGIC);
    out.extend((count as u32).to_le_bytes());
    for (key, (plan, record)) in entries {
        let at = out.len();
        out.extend(key);
        out.extend([plan.keep as u8, plan.taken as u8, plan.instructions as u8]);
        out.extend((record.len() as u16).to_le_bytes());
        out.extend(record);
        let sum = hash(&out[at..]);
        out.extend(sum.to_le_bytes());
    }
    out
}

/// A table of the one entry `key`, for another process to [`import`].
pub(crate) fn entry_bytes(key: Key, plan: Plan, record: Vec<u8>) -> Vec<u8> {
    table_bytes(1, [(&key, &(plan, record))].into_iter())
}

/// Plans a function's hook in another process, whose tables (the
/// decoder's) then never take this one's memory: given the bytes, their
/// run-time address, the symbol's size and the patch length, it returns
/// what [`crate::plan_entry`] returned there, or None.
pub type Planner =
    fn(code: &[u8], addr: u64, size: Option<u64>, patch_len: usize) -> Option<Vec<u8>>;

/// The [`Planner`] asked for plans not in the table (0: none).
static PLANNER: AtomicUsize = AtomicUsize::new(0);

/// Sets (or, with None, removes) the planner asked before a hook is
/// planned here.
pub fn set_planner(p: Option<Planner>) {
    PLANNER.store(p.map_or(0, |f| f as usize), Ordering::Release);
}

/// Asks the [`Planner`], if one is set, for the plan of `code`; adds what
/// it answers as a plan made here (to be kept by the next [`export`]).
/// Returns whether the table gained the plan.
pub(crate) fn plan_elsewhere(code: &[u8], addr: u64, size: Option<u64>, patch_len: usize) -> bool {
    let p = PLANNER.load(Ordering::Acquire);
    if p == 0 {
        return false;
    }
    // SAFETY: only set_planner stores non-zero values, each a Planner.
    let planner: Planner = unsafe { core::mem::transmute::<usize, Planner>(p) };
    let Some(bytes) = planner(code, addr, size, patch_len) else {
        return false;
    };
    let added = import(&bytes);
    if added > 0 {
        table().added = true;
    }
    added > 0
}

/// Adds the plans of a table made by [`export`] (of this same build of the
/// trampoline code) that the table lacks; a damaged entry and everything
/// after it is left out. Returns how many were added.
pub fn import(bytes: &[u8]) -> usize {
    let Some(rest) = bytes.strip_prefix(&MAGIC) else {
        return 0;
    };
    let Some((count, mut rest)) = rest.split_first_chunk::<4>() else {
        return 0;
    };
    let count = u32::from_le_bytes(*count) as usize;
    let mut t = table();
    let mut added = 0;
    for _ in 0..count.min(MAX_ENTRIES) {
        let Some((entry, after)) = split_entry(rest) else {
            break;
        };
        rest = after;
        let (body, sum) = entry.split_at(entry.len() - 8);
        if hash(body).to_le_bytes() != sum {
            break;
        }
        let key: Key = body[..KEY].try_into().unwrap();
        let plan = Plan {
            keep: body[KEY] as usize,
            taken: body[KEY + 1] as usize,
            instructions: body[KEY + 2] as usize,
            patch_len: key[20] as usize,
        };
        let record = body[KEY + 5..].to_vec();
        if t.entries.len() < MAX_ENTRIES && !t.entries.contains_key(&key) {
            t.entries.insert(key, (plan, record));
            added += 1;
        }
    }
    added
}

/// The first entry of `b` (key, plan, record length and record, checksum)
/// and what follows it.
fn split_entry(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u16::from_le_bytes(b.get(KEY + 3..KEY + 5)?.try_into().ok()?) as usize;
    let end = KEY + 5 + len + 8;
    (b.len() >= end).then(|| b.split_at(end))
}

#[cfg(test)]
pub(crate) fn clear_for_test() {
    let mut t = table();
    t.entries.clear();
    t.added = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test: the table is process-wide.
    #[test]
    fn a_table_survives_export_and_import_and_refuses_damage() {
        clear_for_test();
        let plan = |taken| Plan {
            keep: 4,
            taken,
            instructions: 2,
            patch_len: 5,
        };
        let (k1, k2) = (
            key(b"first code", Some(10), 5),
            key(b"other code", None, 14),
        );
        assert_ne!(k1, k2);
        assert_eq!(k1, key(b"first code", Some(10), 5), "keys are stable");
        assert_ne!(
            k1,
            key(b"first code", Some(11), 5),
            "the size is in the key"
        );
        assert_ne!(
            k1,
            key(b"first code", Some(10), 14),
            "so is the patch length"
        );
        put(k1, plan(6), vec![1, 2, 3]);
        put(k2, plan(15), vec![4; 26]);
        let bytes = export().expect("new plans");
        assert!(export().is_none(), "nothing new since");
        clear_for_test();
        assert_eq!(import(&bytes), 2);
        assert_eq!(get(&k1), Some((plan(6), vec![1, 2, 3])));
        let mut p2 = plan(15);
        p2.patch_len = 14;
        assert_eq!(get(&k2), Some((p2, vec![4; 26])));
        assert!(export().is_none(), "imported plans are not new");
        assert_eq!(import(&bytes), 0, "known plans are not added twice");

        // Damage: a flipped byte in the first entry's record (entries are
        // in key order) stops the import there; truncation keeps the
        // entries before the cut; another format is refused.
        let first_is_k1 = k1 < k2;
        let mut flipped = bytes.clone();
        flipped[12 + KEY + 5] ^= 1;
        clear_for_test();
        assert_eq!(import(&flipped), 0);
        clear_for_test();
        assert_eq!(import(&bytes[..bytes.len() - 1]), 1);
        assert!(get(if first_is_k1 { &k1 } else { &k2 }).is_some());
        clear_for_test();
        assert_eq!(import(b"IGPRPLN0\x01\0\0\0"), 0);
        assert_eq!(import(&[]), 0);
        clear_for_test();
    }
}
