//! Frame descriptors kept between processes: one file per object, named by
//! the object's GNU build-id, in the user's cache directory.
//!
//! Deriving a descriptor from DWARF means evaluating the FDE's call-frame
//! program up to the address (framehop took about a microsecond; the
//! direct reader of `cfi.rs` a third of that): a small compiler run under
//! `-mp` derives about 4,000, and every process of a build derives the
//! same ones again. Here a process reads, when it builds its module table,
//! the descriptors earlier processes derived for the objects it has
//! loaded; a descriptor-cache miss looks there before deriving; and the
//! descriptors it derived itself are added to the files when it ends.
//!
//! A descriptor is a pure function of an object's unwind tables, the
//! offset of the address in the object and whether it is an interrupted PC
//! or a return address. A file holds, besides the descriptors sorted by
//! (offset << 1 | first), what they were derived from: the object's
//! build-id, the offsets of its text and `.eh_frame_hdr`, the machine, and
//! the build-id of the libigprof.so that derived them (a rebuilt profiler
//! may describe frames differently). A file that does not match all of it,
//! or whose contents do not check out (size, order, every descriptor), is
//! ignored and replaced at the next save. Objects without a build-id are
//! not stored.
//!
//! The directory is used only when it is owned by the effective user and
//! no other user may write into it (checked at [`configure`] and each time
//! it is opened), and its files only when they are regular files of that
//! user reached without a link (`safefs::PrivateDir`): descriptors steer
//! the walk through the program's stack and hook plans steer code
//! patching, so a file someone else could have written is never trusted.
//!
//! Owns: the file format, the process's registry of stored objects, and
//! the log of descriptors derived here. Files are read (copied into memory,
//! never mapped: a file truncated by someone else would raise SIGBUS in the
//! program) when the module table is rebuilt and written when the process
//! ends, outside signal context, under an unpredictable name created
//! exclusively and renamed over the file.
//! From a walk only [`lookup`] (reads what was loaded) and [`record`]
//! (atomics in a mapping made by [`configure`]) run: no allocation, no
//! lock, no system call. Without [`configure`] nothing is read or written.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::descriptor::{Descriptor, Kind};
use super::mem::{MmapSlice, Zeroable};
use safefs::PrivateDir;
pub(crate) use trampoline::image::build_id_in_notes;

/// Changes whenever the file layout changes.
const MAGIC: [u8; 8] = *b"IGPRUWD1";
const HEADER: usize = 128;
const ENTRY: usize = 16;
/// Descriptors a file may hold (1 MiB, read by every process that loads
/// the object): more than the call sites of a large program that appear
/// on its stacks. A file that would grow beyond it is left as it is.
const MAX_ENTRIES: usize = 1 << 16;
/// Descriptors one process can log for saving (a 1.5 MiB mapping whose
/// pages are only touched as entries are logged).
const LOG_CAPACITY: usize = 1 << 16;

#[cfg(target_arch = "x86_64")]
const MACHINE: u32 = 62;
#[cfg(target_arch = "aarch64")]
const MACHINE: u32 = 183;

/// What an object's descriptors are derived from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(C)]
pub(crate) struct Ident {
    /// The GNU build-id (`build_id_len` bytes of it; 0: none).
    pub build_id: [u8; 32],
    pub build_id_len: u8,
    /// Text start and end, `.eh_frame_hdr` start and length, as offsets
    /// from the load bias.
    pub layout: [u64; 4],
}

// SAFETY: integers and byte arrays; all-zero is "no build-id".
unsafe impl Zeroable for Ident {}

impl Ident {
    pub(crate) fn build_id(&self) -> &[u8] {
        &self.build_id[..self.build_id_len as usize]
    }
}

/// An object's place in the registry, as a module-table entry holds it:
/// its loaded descriptors (address and length of the sorted entries) and
/// its number for the log (0: not stored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Stored {
    entries: (usize, usize),
    pub(crate) object: u32,
}

// SAFETY: integers; all-zero is "not stored".
unsafe impl Zeroable for Stored {}

impl Stored {
    fn entries(&self) -> &'static [u8] {
        if self.entries.1 == 0 {
            return &[];
        }
        // SAFETY: made by `attach` from a leaked (never freed, never
        // written again) byte slice.
        unsafe { core::slice::from_raw_parts(self.entries.0 as *const u8, self.entries.1) }
    }
}

/// The key of a descriptor: the address's offset from the load bias and
/// whether it is an interrupted PC.
#[inline]
pub(crate) fn key(offset: usize, first: bool) -> u64 {
    (offset as u64) << 1 | first as u64
}

/// The loaded descriptor for `key`, if an earlier process derived it.
/// Async-signal-safe.
#[inline]
pub(crate) fn lookup(stored: &Stored, key: u64) -> Option<Descriptor> {
    let entries = stored.entries();
    let (mut lo, mut hi) = (0, entries.len() / ENTRY);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let e = &entries[mid * ENTRY..(mid + 1) * ENTRY];
        let k = u64::from_le_bytes(e[..8].try_into().unwrap());
        if k == key {
            return decode(e[8..].try_into().unwrap());
        }
        if k < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    None
}

/// One descriptor derived by this process, to be saved.
#[repr(C)]
struct Learned {
    /// `Stored::object`; 0 until the entry is complete.
    object: AtomicU32,
    key: AtomicU64,
    desc: AtomicU64,
}

// SAFETY: atomics of integers; all-zero is an incomplete (skipped) entry.
unsafe impl Zeroable for Learned {}

static DIR: OnceLock<PathBuf> = OnceLock::new();
/// `IGPROF_STORE_CHECK=1`: every descriptor the store answers is derived
/// again and compared (`-d` says how many differed; tests require none).
static CHECK: AtomicBool = AtomicBool::new(false);
static LOG: AtomicPtr<Learned> = AtomicPtr::new(core::ptr::null_mut());
static LOG_NEXT: AtomicUsize = AtomicUsize::new(0);
/// Slots of [`SEEN`] (8 KiB).
const SEEN_SLOTS: usize = 2048;
/// For a hash of (object, key), the log entries (+ 1) that last logged
/// keys of that hash, two ways per set:
/// a descriptor derived again is not logged again. Every dlopen and
/// dlclose empties the threads' descriptor caches, so a program that
/// loads libraries as it runs derives its hot descriptors again after
/// each; logged each time, they filled the log (1.5 MiB resident) with
/// repeats and left no room for new ones. Lossy (two keys may share a
/// slot, two threads may log one key at once): a repeat then logged is
/// merged away by [`Registry::save`].
static SEEN: [AtomicU32; SEEN_SLOTS] = [const { AtomicU32::new(0) }; SEEN_SLOTS];
/// Derivations [`SEEN`] kept out of the log (`-d`).
static REPEATS: AtomicU64 = AtomicU64::new(0);

/// Store descriptors in `dir` (created when first written; a relative
/// path is taken from the current directory now, not at exit). Call once,
/// before the first module table is built; later calls change nothing.
/// A directory that exists but fails the checks (see the module's docs)
/// leaves the store off for this process: the error says why.
pub fn configure(dir: PathBuf) -> Result<(), safefs::Error> {
    if DIR.get().is_some() {
        return Ok(());
    }
    let dir = match std::env::current_dir() {
        Ok(cwd) if dir.is_relative() => cwd.join(dir),
        _ => dir,
    };
    PrivateDir::check(&dir)?;
    let Ok(log) = MmapSlice::<Learned>::zeroed_lazy(LOG_CAPACITY) else {
        return Ok(());
    };
    LOG.store(log.leak().as_mut_ptr(), Ordering::Release);
    CHECK.store(
        std::env::var_os("IGPROF_STORE_CHECK").is_some_and(|v| v == "1"),
        Ordering::Relaxed,
    );
    let _ = DIR.set(dir);
    Ok(())
}

/// The store's directory, opened and checked (`create`: made first, mode
/// 0700, where missing). Outside signal context.
pub(crate) fn open_dir(create: bool) -> Option<Result<PrivateDir, safefs::Error>> {
    DIR.get().map(|d| PrivateDir::open(d, create))
}

/// The most bytes a store file may hold.
const MAX_FILE: usize = HEADER + MAX_ENTRIES * ENTRY;

/// Whether store answers are checked against a fresh derivation.
#[inline]
pub(crate) fn checking() -> bool {
    CHECK.load(Ordering::Relaxed)
}

/// The directory descriptors are stored in, if any.
pub fn dir() -> Option<&'static Path> {
    DIR.get().map(PathBuf::as_path)
}

/// Logs a descriptor derived for `key` of object `object`, for the next
/// [`save`]. Async-signal-safe; does nothing for an object not stored or
/// once the log is full.
#[inline]
pub(crate) fn record(object: u32, key: u64, d: Descriptor) {
    let log = LOG.load(Ordering::Acquire);
    if object == 0 || log.is_null() {
        return;
    }
    // Two ways per set: two keys of one set are both remembered.
    let set = seen_set(object, key);
    let ways = &SEEN[set..set + 2];
    let mut free_way = None;
    for (w, seen) in ways.iter().enumerate() {
        let last = seen.load(Ordering::Acquire) as usize;
        if last == 0 {
            free_way.get_or_insert(w);
            continue;
        }
        // SAFETY: `last` - 1 < LOG_CAPACITY: an entry of the leaked
        // mapping claimed by an earlier call.
        let e = unsafe { &*log.add(last - 1) };
        if e.object.load(Ordering::Acquire) == object && e.key.load(Ordering::Relaxed) == key {
            REPEATS.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    let i = LOG_NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= LOG_CAPACITY {
        return;
    }
    // SAFETY: i < LOG_CAPACITY entries of the leaked mapping; this thread
    // alone claimed entry i.
    let e = unsafe { &*log.add(i) };
    e.key.store(key, Ordering::Relaxed);
    e.desc
        .store(u64::from_le_bytes(encode(d)), Ordering::Relaxed);
    e.object.store(object, Ordering::Release);
    // A full set gives up one of its ways, chosen by a bit of the key and
    // of the entry's place in the log.
    let w = free_way.unwrap_or((key as usize >> 1 ^ i) & 1);
    ways[w].store(i as u32 + 1, Ordering::Release);
}

/// The first of the two [`SEEN`] slots of `key` of `object`.
fn seen_set(object: u32, key: u64) -> usize {
    let h = (key ^ (object as u64) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 53) as usize & (SEEN_SLOTS - 2)
}

/// Descriptors derived again after they were logged, not logged twice.
pub fn repeats() -> u64 {
    REPEATS.load(Ordering::Relaxed)
}

/// The objects this process knows, in the order of their numbers.
pub(crate) struct Registry {
    known: Vec<(Ident, &'static [u8])>,
    /// Each known object's place in `known` (a refresh after every dlopen
    /// looks up every loaded object: hundreds in a Python program).
    index: BTreeMap<Ident, usize>,
    /// The build-id of the libigprof.so deriving descriptors here.
    producer: Option<Ident>,
}

impl Registry {
    pub(crate) const fn new() -> Self {
        Registry {
            known: Vec::new(),
            index: BTreeMap::new(),
            producer: None,
        }
    }

    /// Sets the profiler's own identity (found in the module table).
    pub(crate) fn set_producer(&mut self, producer: Ident) {
        self.producer.get_or_insert(producer);
    }

    /// [`Registry::attach`] for each object of a module table: the
    /// directory is opened and checked once for all of them (a refresh
    /// after a dlopen looks at every loaded object), and only if one of
    /// them is new.
    pub(crate) fn attach_all<'a>(
        &mut self,
        objects: impl Iterator<Item = (&'a Ident, &'a mut Stored)>,
    ) {
        let mut dir: Option<Option<PrivateDir>> = None;
        for (ident, stored) in objects {
            *stored = self.attach(ident, &mut dir);
        }
    }

    /// The registry entry for `ident`, its file read when first seen,
    /// through `dir` (opened here at the first object that needs it).
    /// Outside signal context (reads a file).
    fn attach(&mut self, ident: &Ident, dir: &mut Option<Option<PrivateDir>>) -> Stored {
        let (true, Some(producer)) = (DIR.get().is_some(), self.producer) else {
            return Stored::default();
        };
        if ident.build_id_len == 0 {
            return Stored::default();
        }
        let i = match self.index.get(ident) {
            Some(&i) => i,
            None => {
                let d = dir.get_or_insert_with(|| open_dir(false).and_then(Result::ok));
                let entries = d
                    .as_ref()
                    .and_then(|d| d.read(&file_of(ident), MAX_FILE).ok())
                    .and_then(|b| checked_entries(&b, ident, &producer).map(<[u8]>::to_vec))
                    .unwrap_or_default();
                self.known
                    .push((*ident, Box::leak(entries.into_boxed_slice())));
                self.index.insert(*ident, self.known.len() - 1);
                self.known.len() - 1
            }
        };
        let entries = self.known[i].1;
        Stored {
            entries: (entries.as_ptr() as usize, entries.len()),
            object: i as u32 + 1,
        }
    }

    /// Adds the descriptors this process derived to the objects' files.
    /// Outside signal context; other threads may go on logging (what they
    /// log after the snapshot is not saved).
    pub(crate) fn save(&self) -> SaveReport {
        let mut report = SaveReport::default();
        let Some(producer) = self.producer else {
            return report;
        };
        let mut learned = snapshot();
        if learned.is_empty() {
            return report;
        }
        let dir = match open_dir(true) {
            None => return report,
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                report.error = DIR.get().map(|d| format!("{}: {e}", d.display()));
                return report;
            }
        };
        learned.sort_unstable();
        learned.dedup_by_key(|e| (e.0, e.1));
        for group in learned.chunk_by(|a, b| a.0 == b.0) {
            let Some((ident, _)) = self.known.get(group[0].0 as usize - 1) else {
                continue;
            };
            let name = file_of(ident);
            let old = dir.read(&name, MAX_FILE).ok();
            let old = old
                .as_deref()
                .and_then(|b| checked_entries(b, ident, &producer))
                .unwrap_or(&[]);
            let new: Vec<(u64, [u8; 8])> = group.iter().map(|e| (e.1, e.2.to_le_bytes())).collect();
            let Some(merged) = merge(old, &new) else {
                continue;
            };
            match dir.write(&name, &encode_file(ident, &producer, &merged)) {
                Ok(()) => {
                    report.objects += 1;
                    report.added += merged.len() - old.len() / ENTRY;
                }
                Err(e) => {
                    report
                        .error
                        .get_or_insert_with(|| format!("{}/{name}: {e}", dir.path().display()));
                }
            }
        }
        report
    }
}

/// What [`Registry::save`] did.
#[derive(Debug, Default)]
pub struct SaveReport {
    /// Files written, and descriptors they gained.
    pub objects: usize,
    pub added: usize,
    /// The first failure, if any (the run goes on without it).
    pub error: Option<String>,
}

/// The complete entries of the log: (object, key, descriptor bytes).
fn snapshot() -> Vec<(u32, u64, u64)> {
    let log = LOG.load(Ordering::Acquire);
    if log.is_null() {
        return Vec::new();
    }
    let n = LOG_NEXT.load(Ordering::Relaxed).min(LOG_CAPACITY);
    (0..n)
        .filter_map(|i| {
            // SAFETY: i < LOG_CAPACITY entries of the leaked mapping.
            let e = unsafe { &*log.add(i) };
            let object = e.object.load(Ordering::Acquire);
            (object != 0).then(|| {
                (
                    object,
                    e.key.load(Ordering::Relaxed),
                    e.desc.load(Ordering::Relaxed),
                )
            })
        })
        .collect()
}

/// The name of `ident`'s file in the store's directory.
fn file_of(ident: &Ident) -> String {
    hex(ident.build_id())
}

/// A build-id as a file name.
pub(crate) fn hex(id: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut name = String::with_capacity(2 * id.len());
    for b in id {
        name.push(DIGITS[(b >> 4) as usize] as char);
        name.push(DIGITS[(b & 15) as usize] as char);
    }
    name
}

/// `old` (a file's checked entries) with the `new` keys it lacks, in key
/// order; None when it lacks none.
fn merge(old: &[u8], new: &[(u64, [u8; 8])]) -> Option<Vec<(u64, [u8; 8])>> {
    let old: Vec<(u64, [u8; 8])> = old
        .chunks_exact(ENTRY)
        .map(|e| {
            (
                u64::from_le_bytes(e[..8].try_into().unwrap()),
                e[8..].try_into().unwrap(),
            )
        })
        .collect();
    let mut out = Vec::with_capacity(old.len() + new.len());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                out.push(*a);
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.0 < b.0 => {
                out.push(*a);
                i += 1;
            }
            (Some(a), None) => {
                out.push(*a);
                i += 1;
            }
            (_, Some(b)) => {
                out.push(*b);
                j += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    (out.len() > old.len() && out.len() <= MAX_ENTRIES).then_some(out)
}

fn put_ident(out: &mut Vec<u8>, ident: &Ident) {
    out.extend_from_slice(&ident.build_id);
    out.push(ident.build_id_len);
    out.extend_from_slice(&[0; 7]);
}

fn encode_file(ident: &Ident, producer: &Ident, entries: &[(u64, [u8; 8])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + entries.len() * ENTRY);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&MACHINE.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    put_ident(&mut out, ident);
    for v in ident.layout {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_ident(&mut out, producer);
    debug_assert_eq!(out.len(), HEADER);
    for (k, d) in entries {
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(d);
    }
    out
}

/// The entries of file contents `b` if they were derived from `ident` by
/// `producer` and check out: the size the header says, keys strictly
/// increasing, every descriptor valid for its key.
fn checked_entries<'a>(b: &'a [u8], ident: &Ident, producer: &Ident) -> Option<&'a [u8]> {
    let mut expect = encode_file(ident, producer, &[]);
    let count = u32::from_le_bytes(b.get(12..16)?.try_into().ok()?) as usize;
    expect[12..16].copy_from_slice(&(count as u32).to_le_bytes());
    if b.get(..HEADER)? != &expect[..] || count > MAX_ENTRIES || b.len() != HEADER + count * ENTRY {
        return None;
    }
    let entries = &b[HEADER..];
    let mut last = None;
    for e in entries.chunks_exact(ENTRY) {
        let k = u64::from_le_bytes(e[..8].try_into().unwrap());
        let d = decode(e[8..].try_into().unwrap())?;
        if last.is_some_and(|l| l >= k) || d.first != (k & 1 == 1) {
            return None;
        }
        last = Some(k);
    }
    Some(entries)
}

fn encode(d: Descriptor) -> [u8; 8] {
    let o = d.cfa_offset.to_le_bytes();
    [
        o[0],
        o[1],
        o[2],
        o[3],
        d.ra_slot_by_8 as u8,
        d.fp_slot_by_8 as u8,
        d.kind as u8,
        d.first as u8,
    ]
}

fn decode(b: [u8; 8]) -> Option<Descriptor> {
    let kind = match b[6] {
        x if x == Kind::CfaSp as u8 => Kind::CfaSp,
        x if x == Kind::CfaFp as u8 => Kind::CfaFp,
        x if x == Kind::Outermost as u8 => Kind::Outermost,
        x if x == Kind::SignalFrame as u8 => Kind::SignalFrame,
        x if x == Kind::Framehop as u8 => Kind::Framehop,
        _ => return None,
    };
    let first = match b[7] {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some(Descriptor::new(
        kind,
        i32::from_le_bytes(b[..4].try_into().unwrap()),
        b[4] as i8,
        b[5] as i8,
        first,
    ))
}

/// The GNU build-id of the loaded object at `base` with program headers
/// `phdrs` (from its first note segment that has one).
///
/// # Safety
/// `phdrs` must be the loader's program headers of an object loaded at
/// `base` (its note segments lie in its loaded, readable segments).
pub(crate) unsafe fn build_id_of(base: usize, phdrs: &[libc::Elf64_Phdr]) -> Option<&'static [u8]> {
    phdrs
        .iter()
        .filter(|ph| ph.p_type == libc::PT_NOTE)
        .find_map(|ph| {
            // SAFETY: per the caller, a note segment of a loaded object.
            let notes = unsafe {
                core::slice::from_raw_parts(
                    (base + ph.p_vaddr as usize) as *const u8,
                    ph.p_memsz as usize,
                )
            };
            build_id_in_notes(notes, ph.p_align as usize)
        })
}

/// `dir` for the cache directory named by the environment:
/// `IGPROF_CACHE_DIR` (empty or `none`: no store), else
/// `$XDG_CACHE_HOME/igprof-rs`, else `$HOME/.cache/igprof-rs`; the
/// descriptors go in its `unwind` directory.
pub fn dir_from_env(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let base = match get("IGPROF_CACHE_DIR") {
        Some(d) if d.is_empty() || d.as_bytes() == b"none" => return None,
        Some(d) => PathBuf::from(d),
        None => match get("XDG_CACHE_HOME").filter(|d| d.as_bytes().starts_with(b"/")) {
            Some(d) => PathBuf::from(d).join("igprof-rs"),
            None => PathBuf::from(get("HOME").filter(|h| h.as_bytes().starts_with(b"/"))?)
                .join(".cache/igprof-rs"),
        },
    };
    Some(base.join("unwind"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(id: u8) -> Ident {
        let mut i = Ident {
            build_id_len: 20,
            layout: [0x1000, 0x9000, 0xa000, 0x40],
            ..Default::default()
        };
        i.build_id[..20].fill(id);
        i
    }

    fn d(kind: Kind, cfa: i32, first: bool) -> Descriptor {
        Descriptor::new(kind, cfa, -1, -2, first)
    }

    #[test]
    fn descriptors_round_trip_and_files_are_checked() {
        let (obj, me) = (ident(7), ident(9));
        let entries: Vec<(u64, [u8; 8])> = vec![
            (key(0x1234, false), encode(d(Kind::CfaSp, 16, false))),
            (key(0x1234, true), encode(d(Kind::CfaFp, 24, true))),
            (key(0x2000, false), encode(d(Kind::Framehop, 0, false))),
        ];
        let file = encode_file(&obj, &me, &entries);
        let got = checked_entries(&file, &obj, &me).expect("a good file");
        let stored = Stored {
            entries: (got.as_ptr() as usize, got.len()),
            object: 1,
        };
        assert_eq!(
            lookup(&stored, key(0x1234, false)),
            Some(d(Kind::CfaSp, 16, false))
        );
        assert_eq!(
            lookup(&stored, key(0x1234, true)),
            Some(d(Kind::CfaFp, 24, true))
        );
        assert_eq!(
            lookup(&stored, key(0x2000, false)),
            Some(d(Kind::Framehop, 0, false))
        );
        assert_eq!(lookup(&stored, key(0x1235, false)), None);
        assert_eq!(lookup(&Stored::default(), key(0x1234, false)), None);

        // Another object, another layout, another profiler build, another
        // size, a truncated file, keys out of order, a bad descriptor.
        assert!(checked_entries(&file, &ident(8), &me).is_none());
        let mut moved = obj;
        moved.layout[2] += 16;
        assert!(checked_entries(&file, &moved, &me).is_none());
        assert!(checked_entries(&file, &obj, &ident(1)).is_none());
        assert!(checked_entries(&file[..file.len() - 1], &obj, &me).is_none());
        assert!(checked_entries(&file[..HEADER - 1], &obj, &me).is_none());
        let swapped = encode_file(&obj, &me, &[entries[1], entries[0]]);
        assert!(checked_entries(&swapped, &obj, &me).is_none());
        let mut bad_kind = file.clone();
        bad_kind[HEADER + 8 + 6] = Kind::Empty as u8;
        assert!(checked_entries(&bad_kind, &obj, &me).is_none());
        let mut bad_first = file.clone();
        bad_first[HEADER + 8 + 7] = 1;
        assert!(checked_entries(&bad_first, &obj, &me).is_none());
        let mut big_count = file.clone();
        big_count[12..16].copy_from_slice(&4u32.to_le_bytes());
        assert!(checked_entries(&big_count, &obj, &me).is_none());
    }

    #[test]
    fn merging_keeps_order_and_reports_nothing_new() {
        let e = |k: u64| (k, encode(d(Kind::CfaSp, k as i32, k & 1 == 1)));
        let old = encode_file(&ident(1), &ident(2), &[e(2), e(6), e(10)]);
        let old = &old[HEADER..];
        let merged = merge(old, &[e(1), e(6), e(12)]).unwrap();
        assert_eq!(
            merged.iter().map(|x| x.0).collect::<Vec<_>>(),
            [1, 2, 6, 10, 12]
        );
        assert_eq!(merge(old, &[e(2), e(10)]), None, "nothing new: no write");
        assert_eq!(merge(&[], &[e(4)]).unwrap(), [e(4)]);
    }

    #[test]
    fn build_ids_are_found_among_notes() {
        let note = |name: &[u8], kind: u32, desc: &[u8], align: usize| {
            let mut v = Vec::new();
            v.extend((name.len() as u32).to_ne_bytes());
            v.extend((desc.len() as u32).to_ne_bytes());
            v.extend(kind.to_ne_bytes());
            v.extend(name);
            v.resize(v.len().next_multiple_of(align), 0);
            v.extend(desc);
            v.resize(v.len().next_multiple_of(align), 0);
            v
        };
        let id = [0xab; 20];
        let mut notes = note(b"GNU\0", 5, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 8);
        notes.extend(note(b"GNU\0", 3, &id, 8));
        assert_eq!(build_id_in_notes(&notes, 8), Some(&id[..]));
        let notes = [note(b"Go\0\0", 3, &[1; 8], 4), note(b"GNU\0", 3, &id, 4)].concat();
        assert_eq!(build_id_in_notes(&notes, 4), Some(&id[..]));
        assert_eq!(build_id_in_notes(&note(b"GNU\0", 1, &id, 4), 4), None);
        let cut = note(b"GNU\0", 3, &id, 4);
        assert_eq!(build_id_in_notes(&cut[..cut.len() - 4], 4), None);
    }

    #[test]
    fn the_directory_comes_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            dir_from_env(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/igprof-rs/unwind"))
        );
        assert_eq!(
            dir_from_env(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")])),
            Some(PathBuf::from("/x/igprof-rs/unwind"))
        );
        assert_eq!(
            dir_from_env(env(&[("HOME", "/h"), ("IGPROF_CACHE_DIR", "/c")])),
            Some(PathBuf::from("/c/unwind"))
        );
        assert_eq!(
            dir_from_env(env(&[("HOME", "/h"), ("IGPROF_CACHE_DIR", "none")])),
            None
        );
        assert_eq!(
            dir_from_env(env(&[("HOME", "/h"), ("IGPROF_CACHE_DIR", "")])),
            None
        );
        assert_eq!(dir_from_env(env(&[("HOME", "relative")])), None);
        assert_eq!(dir_from_env(env(&[])), None);
    }
}
