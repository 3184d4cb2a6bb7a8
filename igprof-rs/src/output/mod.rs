//! Writing profiles: merging every thread's tree, naming addresses, and
//! writing IgProf's format (format::write) into a file, gzipped whole by
//! libdeflate (`deflate`) a gzip member of 256 KiB of text at a time.
//!
//! This file owns the dump's common path ([`dump_to`]: one dump at a time,
//! the room it needs, its statistics; what triggers one is `process/`'s).
//! The steps are files of their own, in the order a dump runs them:
//! `merge` (every thread's tree into one), `resolve` and `names` (naming
//! addresses), `records` (IgProf's records), `file` and `deflate` (the
//! file, gzipped), `path` (the output file name), `error` (why a dump
//! failed).
//!
//! How records name addresses: each distinct address
//! of the profile is named once per dump by `names` (the names `dladdr`
//! gives, from a per-object index; dumps never run in signal context).
//! Unknown names are written as IgProf does, `@?0x<address>`, and
//! igprof-analyse resolves them from the object and offset. With
//! `IGPROF_NAMES_CHECK=1` in the environment, every dump also writes
//! `<file>.dladdr`, the same profile named by `dladdr` itself, for
//! `bench/names-compare`. Dumps run with profiling paused on the dumping thread; other
//! threads keep sampling into their own trees, which are safe to read
//! concurrently.
//!
//! Must never: run from a signal handler, fork a compressor, or write a
//! partial file under the final name, or write through a link planted at
//! the name (see `create_output`).

mod deflate;
mod error;
mod file;
pub mod journal;
mod merge;
pub mod names;
pub mod path;
mod records;
mod resolve;
pub mod timeline;
mod view;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::base::counters;
use crate::base::thread;

pub use error::DumpError;
pub use file::prepare_for_setuid;
use file::write_named;
use merge::{Leak, Leaks, Merged};
pub use resolve::remember_objects;
use resolve::Naming;
use view::{ProfileTree, Single};

static DUMPING: AtomicBool = AtomicBool::new(false);

/// Set when the image's final profile is begun (an exit's, an exec's,
/// the keeper's): it is written once, and no snapshot starts after it.
/// One begun after the final profile was written would replace it, or be
/// cut short by the process's end and leave its temporaries beside it
/// (`PROFILE.journal.tmp`).
static FINAL_BEGUN: AtomicBool = AtomicBool::new(false);

/// The final profile's dump begins (see [`FINAL_BEGUN`]); before its
/// [`dump_after_others`], so that a snapshot taking the dump after it
/// sees this. Returns whether it had begun already.
pub fn final_begins() -> bool {
    FINAL_BEGUN.swap(true, Ordering::AcqRel)
}

/// Whether the final profile has been begun (see [`FINAL_BEGUN`]).
pub fn final_begun() -> bool {
    FINAL_BEGUN.load(Ordering::Acquire)
}

/// In a fork child, or after an exec that failed: the image writes its
/// final profile again when it ends, and snapshots until then.
pub fn final_undone() {
    FINAL_BEGUN.store(false, Ordering::Release);
}

/// In a fork child: no dump is in progress in this process.
pub fn reset_after_fork() {
    resolve::reset_after_fork();
    DUMPING.store(false, Ordering::Release);
    // The temporary a parent's thread was writing is the parent's: the
    // child's keeper must never remove it.
    file::forget_unfinished();
    KEPT_COUNT.store(0, Ordering::Relaxed);
    timeline::reset_after_fork();
}

/// What a dump contained.
#[derive(Default, Debug, Clone, Copy)]
pub struct DumpStats {
    pub nodes: usize,
    pub samples: u64,
    pub dropped: u64,
    pub truncated: u64,
    pub handler_ns: u64,
    /// Thread states (and so call trees) dumped: at most the peak number
    /// of threads alive at once, since new threads adopt ended ones' states.
    pub states: usize,
    /// Distinct code addresses named, and how many of them from `.symtab`.
    pub addresses: usize,
    pub from_symtab: usize,
    /// CPU time spent naming them, and on the whole dump (merge, name,
    /// write), on the dumping thread.
    pub naming_ns: u64,
    pub dump_ns: u64,
    /// CPU time merging the threads' trees (before naming).
    pub merge_ns: u64,
    /// With `IGPROF_NAMES_CHECK`: CPU time of the second profile, named by
    /// `dladdr` (naming and writing).
    pub dladdr_naming_ns: Option<u64>,
    /// The threads' descriptor caches (samples and hooks alike).
    pub descriptors: crate::unwind::CacheStats,
}

/// Address space a dump may need besides what the program holds: the
/// final dump's region (`alloc::final_arena`) and the compressor's state,
/// then per call-tree node its merged copy, counters and text.
const DUMP_MEMORY_BASE: usize = 12 << 20;
const DUMP_MEMORY_PER_NODE: usize = 512;

/// Why the dump being written is a snapshot (its header's note:
/// `igprof_format::notes::SNAPSHOT`); None while a final profile or a dump
/// asked for by the program is written. Set and read with `try_lock` only:
/// the keeper's dump may follow a snapshot its program died writing.
static SNAPSHOT_WHY: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The note of the dump being written, if it is a snapshot.
pub(super) fn snapshot_why() -> Option<String> {
    SNAPSHOT_WHY.try_lock().ok().and_then(|w| w.clone())
}

fn set_snapshot_why(why: Option<&str>) {
    if let Ok(mut w) = SNAPSHOT_WHY.try_lock() {
        *w = why.map(str::to_string);
    }
}

/// Writes the current profile of every thread to `path`.
pub fn dump_to(path: &str) -> Result<DumpStats, DumpError> {
    dump_as(path, None)
}

/// [`dump_to`] for a snapshot: a dump written while the process runs,
/// which its header says (`why`: near the memory limit, periodic,
/// requested), so that a reader of a profile that was not replaced by the
/// final one learns that the process did not end normally.
pub fn dump_snapshot(path: &str, why: &str) -> Result<DumpStats, DumpError> {
    dump_as(path, Some(why))
}

fn dump_as(path: &str, why: Option<&str>) -> Result<DumpStats, DumpError> {
    if DUMPING.swap(true, Ordering::AcqRel) {
        return Err(DumpError::Busy);
    }
    // Read with the dump taken: a snapshot that takes it after the final
    // dump let it go sees FINAL_BEGUN.
    let refused = if why.is_some() && final_begun() {
        Some(DumpError::Ending)
    } else if !crate::base::run::active() {
        Some(DumpError::NotProfiling)
    } else {
        None
    };
    if let Some(e) = refused {
        DUMPING.store(false, Ordering::Release);
        return Err(e);
    }
    set_snapshot_why(why);
    // A program that lowered RLIMIT_AS may leave no room for the dump's
    // memory: an allocation failing halfway would abort the program.
    let nodes = thread::total_nodes();
    let needed = DUMP_MEMORY_BASE + nodes.saturating_mul(DUMP_MEMORY_PER_NODE);
    let room = match crate::base::limits::AddressSpaceRoom::make(needed) {
        Ok(room) => room,
        Err(limit) => {
            set_snapshot_why(None);
            DUMPING.store(false, Ordering::Release);
            return Err(DumpError::NoMemory { needed, limit });
        }
    };
    let pending = why.and_then(|_| journal::before_snapshot(path));
    let r = dump_locked(path, pending.as_ref());
    drop(room);
    match why {
        Some(_) => journal::after_snapshot(path, pending, r.is_ok()),
        None if r.is_ok() => journal::after_final(path),
        None => {}
    }
    set_snapshot_why(None);
    DUMPING.store(false, Ordering::Release);
    r
}

/// How many periodic snapshots an image keeps under names of their own;
/// older ones are removed as new ones come.
pub const KEPT_SNAPSHOTS: usize = 240;

/// When the snapshots kept were taken (ms since the process started), a
/// ring written only by the watcher (periodic snapshots are its own);
/// [`KEPT_COUNT`] of them so far (a fork child starts again from 0).
static KEPT: [AtomicU64; KEPT_SNAPSHOTS] = [const { AtomicU64::new(0) }; KEPT_SNAPSHOTS];
static KEPT_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Keeps the snapshot just written at `path` also as
/// `path::snapshot_path` (a hard link: nothing is written twice), so that
/// a run's snapshots form its timeline; the oldest beyond
/// [`KEPT_SNAPSHOTS`] go. Nothing where `path` is a device or a FIFO, or
/// where the name exists (nothing is replaced or followed).
pub fn keep_snapshot(path: &str) {
    if path::is_device_or_pipe(path.as_bytes()) {
        return;
    }
    let now = crate::sys::clock_ns(libc::CLOCK_REALTIME).unwrap_or(0);
    let ms = now.saturating_sub(crate::base::run::started_ns()) / 1_000_000;
    let name = path::snapshot_path(path, ms);
    if let Err(e) = std::fs::hard_link(path, &name) {
        crate::igprof_debug!("snapshot not kept as {name}: {e}");
        return;
    }
    let n = KEPT_COUNT.load(Ordering::Relaxed);
    let slot = &KEPT[n % KEPT_SNAPSHOTS];
    if n >= KEPT_SNAPSHOTS {
        let _ = std::fs::remove_file(path::snapshot_path(path, slot.load(Ordering::Relaxed)));
    }
    slot.store(ms, Ordering::Relaxed);
    KEPT_COUNT.store(n + 1, Ordering::Relaxed);
}

/// In the keeper: a dump the program's threads were writing when they
/// died will never finish.
pub fn forget_unfinished_dump() {
    file::remove_unfinished();
    set_snapshot_why(None);
    DUMPING.store(false, Ordering::Release);
}

/// [`dump_to`], after waiting (at most a minute) for a dump another thread
/// is writing (a snapshot just before exit must not cost the final profile).
pub fn dump_after_others(path: &str) -> Result<DumpStats, DumpError> {
    let deadline = crate::sys::monotonic_ns() + 60_000_000_000;
    loop {
        match dump_to(path) {
            Err(DumpError::Busy) if crate::sys::monotonic_ns() < deadline => {
                crate::sys::sleep_ns(1_000_000)
            }
            r => return r,
        }
    }
}

/// `journal`: the memory journal made for this snapshot, which the hooks
/// start writing to as the live blocks are read (see journal.rs).
fn dump_locked(path: &str, journal: Option<&journal::Pending>) -> Result<DumpStats, DumpError> {
    let started = crate::sys::thread_cpu_ns();
    crate::modules::each(crate::base::options::get(), |m| {
        if let Some(f) = m.before_dump {
            f()
        }
    });
    let nslots = counters::nslots();
    let mut stored_forms: Vec<crate::modules::DumpValueFn> = Vec::new();
    crate::modules::each(crate::base::options::get(), |m| {
        stored_forms.extend(m.dump_value)
    });
    // Live resources first: the merge notes where their nodes go. Counted
    // before they are copied, so that the vector is made once at its size
    // (a compiler's 29,000 live blocks, at the process's peak memory).
    let each_live = |f: &mut dyn FnMut(*const crate::base::tree::Node, usize, u64, u64)| {
        crate::modules::each(crate::base::options::get(), |md| {
            if let Some(leaks) = md.leaks {
                leaks(f)
            }
        })
    };
    if let Some(j) = journal {
        j.begin();
    }
    let mut count = 0;
    each_live(&mut |_, _, _, _| count += 1);
    // A few more for what other threads acquire meanwhile.
    let mut live: Vec<Leak> = Vec::with_capacity(count + count / 64 + 16);
    each_live(&mut |node, slot, addr, size| {
        live.push(Leak {
            node: node as usize,
            slot,
            addr,
            size,
        })
    });
    let mut stats = DumpStats::default();
    let states: Vec<_> = thread::dumped().collect();
    for t in &states {
        stats.samples += t.stats.samples.load(Ordering::Relaxed);
        stats.dropped += t.stats.dropped.load(Ordering::Relaxed);
        stats.truncated += t.stats.truncated.load(Ordering::Relaxed);
        stats.handler_ns += t.stats.handler_ns.load(Ordering::Relaxed);
        if let Some(u) = &t.unwinder {
            let c = u.stats();
            stats.descriptors.hits += c.hits;
            stats.descriptors.misses += c.misses;
            stats.descriptors.framehop += c.framehop;
            stats.descriptors.stored += c.stored;
            stats.descriptors.stored_differ += c.stored_differ;
        }
        stats.states += 1;
    }
    let with_trees: Vec<_> = states
        .iter()
        .filter(|t| t.tree().root().is_some())
        .collect();
    // One tree is written from where it is, its counters read as it is
    // written; a journal needs them read at once, by the merge, unless no
    // other thread can change them meanwhile.
    let in_place = journal.is_none() || crate::base::solo::solo();
    if let ([only], true) = (with_trees.as_slice(), in_place) {
        // One tree is the profile: written from where it is (view.rs),
        // the synthetic functions in a tree of their own.
        let mut extra = Merged::new(nslots);
        extra.add_modules_synthetic();
        let leaks = Leaks::new(live);
        let tree = Single {
            root: only.tree().root().expect("filtered above"),
            nodes: only.tree().len(),
            stored_forms,
            leaks,
            extra,
        };
        stats.merge_ns = crate::sys::thread_cpu_ns() - started;
        write_tree(path, &tree, &mut stats, journal)?;
    } else {
        let mut merged = Merged::new(nslots);
        merged.stored_forms = stored_forms;
        merged.origin = live.iter().map(|l| (l.node, u32::MAX)).collect();
        let last_tree = with_trees.len().checked_sub(1);
        for (i, t) in with_trees.iter().enumerate() {
            let root = t.tree().root().expect("filtered above");
            merged.reserve(t.tree().len() + 1);
            merged.merge_tree(0, root, Some(i) == last_tree);
        }
        merged.add_modules_synthetic();
        stats.merge_ns = crate::sys::thread_cpu_ns() - started;
        // Keyed by merged node, in place.
        live.retain_mut(|l| match merged.origin_of(l.node) {
            Some(m) => {
                l.node = m as usize;
                true
            }
            None => false,
        });
        merged.leaks = Leaks::new(live);
        write_tree(path, &merged, &mut stats, journal)?;
    }
    stats.dump_ns = crate::sys::thread_cpu_ns() - started;
    Ok(stats)
}

/// Names `tree`'s addresses and writes it to `path` (and, with
/// `IGPROF_NAMES_CHECK`, beside it named by dladdr). `journal`, the
/// snapshot's, is told the file's size before the file takes its name.
fn write_tree<T: ProfileTree>(
    path: &str,
    tree: &T,
    stats: &mut DumpStats,
    journal: Option<&journal::Pending>,
) -> Result<(), DumpError> {
    stats.nodes = tree.len();
    let gzip = crate::base::options::get().gzip || path.ends_with(".gz");
    let exe = &crate::base::run::info().exe;
    let named_at = crate::sys::thread_cpu_ns();
    let addrs = tree.code_addresses();
    let names = crate::output::names::name_all(&addrs, exe);
    stats.naming_ns = crate::sys::thread_cpu_ns() - named_at;
    crate::base::code_pages::between_steps();
    if crate::base::options::get().debug {
        if names.given_back > 0 {
            crate::igprof_log!(
                "dump: {} KiB of the symbol tables read to name addresses given back",
                names.given_back >> 10
            );
        }
        for (file, e) in &names.symtab_errors {
            crate::igprof_log!(
                "dump: no names from the .symtab of {}: {e}",
                crate::base::log::Bytes(file)
            );
        }
    }
    stats.addresses = addrs.len();
    stats.from_symtab = addrs
        .iter()
        .filter(|&&a| names.source(a) == Some(crate::output::names::Source::Symtab))
        .count();
    let identify = journal.map(|j| move |size| j.identify(size));
    let complete = identify.as_ref().map(|f| f as &dyn Fn(u64));
    write_named(path, gzip, tree, &Naming::Index(names), complete)?;
    if names_check() {
        let at = crate::sys::thread_cpu_ns();
        write_named(&format!("{path}.dladdr"), gzip, tree, &Naming::Dladdr, None)?;
        stats.dladdr_naming_ns = Some(crate::sys::thread_cpu_ns() - at);
    }
    Ok(())
}

/// Whether `IGPROF_NAMES_CHECK` asks for a second profile named by `dladdr`.
fn names_check() -> bool {
    std::env::var_os("IGPROF_NAMES_CHECK").is_some_and(|v| !v.is_empty() && v != "0")
}

#[cfg(test)]
mod tests {
    use super::merge::SYNTHETIC_BASE;
    use super::resolve::resolve;
    use super::*;
    use crate::base::counters::{self, CounterId};
    use crate::base::tree::CallTree;
    use crate::base::tree::TRUNCATED;

    #[test]
    fn no_snapshot_starts_once_the_final_dump_has_begun() {
        final_begins();
        let r = dump_snapshot("/nonexistent/p.gz", "periodic");
        final_undone();
        assert!(matches!(r, Err(DumpError::Ending)), "{r:?}");
        // Otherwise refused here only because this test process profiles
        // nothing; the dump is free again either way.
        let r = dump_snapshot("/nonexistent/p.gz", "periodic");
        assert!(matches!(r, Err(DumpError::NotProfiling)), "{r:?}");
        assert!(!DUMPING.load(Ordering::Acquire));
    }

    #[test]
    fn threads_merge_by_path_with_each_counters_rule() {
        let _g = counters::TEST_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counters::reset_for_test();
        counters::enable(CounterId::PerfTicks);
        counters::enable(CounterId::MemMax);
        counters::enable(CounterId::MemLive);
        let (ticks, max, live) = (
            counters::slot(CounterId::PerfTicks).unwrap(),
            counters::slot(CounterId::MemMax).unwrap(),
            counters::slot(CounterId::MemLive).unwrap(),
        );
        let mut a = CallTree::new();
        let mut b = CallTree::new();
        // SAFETY (all derefs below): nodes returned by node_for are live.
        let n = a.node_for(&[0x30, 0x20, 0x10], false);
        let live_in_a = n as usize;
        unsafe { &*n }.counter(ticks).add(3, 3);
        unsafe { &*n }.counter(max).record_max(100);
        unsafe { &*n }.counter(live).tick_shared(64);
        let n = b.node_for(&[0x30, 0x20, 0x10], false);
        unsafe { &*n }.counter(ticks).add(2, 2);
        unsafe { &*n }.counter(max).record_max(40);
        unsafe { &*n }.counter(live).tick_shared(16);
        unsafe { &*n }.counter(live).tick_shared(16);
        unsafe { &*n }.counter(live).release_shared(16);
        let n = b.node_for(&[0x31, 0x20, 0x10], false);
        let live_in_b = n as usize;
        unsafe { &*n }.counter(ticks).add(1, 1);

        let mut m = Merged::new(counters::nslots());
        // Nodes holding live resources: where they are merged is noted.
        m.origin = [(live_in_a, u32::MAX), (live_in_b, u32::MAX)]
            .into_iter()
            .collect();
        m.merge_tree(0, a.root().unwrap(), false);
        m.merge_tree(0, b.root().unwrap(), true);
        m.add_synthetic("<unattributed>", ticks, 1, 7);
        m.add_synthetic("<unattributed>", ticks, 1, 5);
        // root, 0x10, 0x20, 0x30, 0x31, synthetic
        assert_eq!(m.nodes.len(), 6);
        let find = |m: &Merged, path: &[usize]| {
            // By the children lists: the last tree's nodes are not indexed.
            let mut id = 0u32;
            for &addr in path {
                let mut c = m.nodes[id as usize].first_child;
                while m.nodes[c as usize].addr != addr {
                    c = m.nodes[c as usize].next_sibling;
                }
                id = c;
            }
            id as usize
        };
        let leaf = find(&m, &[0x10, 0x20, 0x30]);
        let v = |id: usize, s: usize| m.values_of(id as u32).map_or((0, 0, 0), |v| v[s]);
        assert_eq!(v(leaf, ticks), (5, 5, 5), "PERF_TICKS adds up");
        assert_eq!(v(leaf, max), (2, 100, 0), "MEM_MAX keeps the largest");
        assert_eq!(
            v(leaf, live),
            (2, 80, 64),
            "MEM_LIVE adds what is live, keeps the largest peak"
        );
        assert_eq!(v(find(&m, &[0x10, 0x20, 0x31]), ticks), (1, 1, 1));
        assert_eq!(m.origin_of(live_in_a), Some(leaf as u32));
        assert_eq!(
            m.origin_of(live_in_b),
            Some(find(&m, &[0x10, 0x20, 0x31]) as u32)
        );
        assert_eq!(m.origin_of(n as usize + 8), None, "not asked for");
        assert_eq!(
            v(find(&m, &[0x10, 0x20]), ticks),
            (0, 0, 0),
            "callers carry no self counts"
        );
        let synth = find(&m, &[SYNTHETIC_BASE]);
        assert_eq!(v(synth, ticks), (2, 12, 12));
        assert_eq!(m.synthetic, vec!["<unattributed>"]);
        assert_eq!(
            resolve(SYNTHETIC_BASE, b"", &m.synthetic, &Naming::Dladdr).name,
            b"<unattributed>"
        );
        assert_eq!(
            resolve(TRUNCATED, b"", &m.synthetic, &Naming::Dladdr).name,
            b"@igprof_stack_truncated"
        );
    }
}
