//! Making the journal for each snapshot from one near the memory limit on,
//! and removing it once the final profile is written. The records are
//! `modules::mem::journal`'s, the layout `igprof_format::journal`'s.
//!
//! Owns: when a journal is made (for each snapshot from the one that
//! [`arm`]s it: made before the snapshot is written, in place beside it
//! once it is, replacing the journal of the previous one), its file
//! (`PROFILE.journal`, its blocks allocated in full, so that no write
//! through the mapping can fail), its header and module table.
//!
//! Must never: run in a hook or a signal handler (it allocates and makes
//! files), or leave a journal beside a final profile.

use core::sync::atomic::{AtomicU64, Ordering};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;

use igprof_format::journal as layout;

use crate::modules::mem::journal as records;

/// The memory limit a snapshot neared (0: no journal is wanted).
static ARMED: AtomicU64 = AtomicU64::new(0);
/// Journals opened by this image (tags the hooks' cache of stacks written).
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The `dumped` note of the dump written last (ns since the epoch): a
/// journal names the snapshot it follows by it, its pid and its size.
static DUMPED_NS: AtomicU64 = AtomicU64::new(0);

/// The dump being written says it was written at `ns`.
pub(super) fn note_dumped(ns: u64) {
    DUMPED_NS.store(ns, Ordering::Relaxed);
}

/// The profile the open journal follows. Taken with `try_lock` only: the
/// keeper's final dump may follow a snapshot its program died writing.
static FOLLOWS: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Journal sizes: an eighth of the limit, within these bounds.
const SMALLEST: u64 = 1 << 20;
const LARGEST: u64 = 64 << 20;

/// The snapshot being written was asked for because the process's memory
/// nears `limit` bytes: from it on, each snapshot has a journal, where a
/// counter it keeps is profiled (PERF_TICKS, the memory's, the
/// descriptors').
pub fn arm(limit: u64) {
    use crate::base::counters::{slot, CounterId};
    if [CounterId::PerfTicks, CounterId::MemLive, CounterId::FdLive]
        .iter()
        .any(|&c| slot(c).is_some())
    {
        ARMED.store(limit, Ordering::Relaxed);
    }
}

/// The journal beside the profile at `path`.
pub fn path_of(path: &str) -> String {
    format!("{path}.journal")
}

/// A journal made for the snapshot being written: its mapping, and its
/// file under a temporary name until the snapshot is in place.
pub(super) struct Pending {
    map: *mut u64,
    tmp: String,
    begun: core::cell::Cell<bool>,
    /// Told the snapshot's size ([`Pending::identify`]).
    identified: core::cell::Cell<bool>,
}

impl Pending {
    /// The hooks write to this journal from now on: called as the
    /// snapshot starts to read the live blocks and the counters. A change
    /// made before the snapshot's read is then in both, which
    /// igprof-analyse tells by the live blocks' addresses (journal.rs).
    pub(super) fn begin(&self) {
        if !self.begun.replace(true) {
            // SAFETY: laid out as the format says; the journal's from now on.
            unsafe { records::begin_next(self.map) };
        }
    }

    /// The snapshot is written, `size` bytes, and about to take its name:
    /// the journal names it (its `dumped` note's time and its size, with
    /// the pid) from now on, so that a process killed between the
    /// snapshot's rename and the journal's leaves a `PROFILE.journal.tmp`
    /// that igprof-analyse finds is the snapshot's.
    pub(super) fn identify(&self, size: u64) {
        let dumped_us = DUMPED_NS.load(Ordering::Relaxed) / 1000;
        for (i, v) in [(layout::W_DUMPED_US, dumped_us), (layout::W_SIZE, size)] {
            // SAFETY: the journal stays mapped until promoted or
            // abandoned, after the snapshot is written.
            unsafe { records::header(self.map, i) }.store(v, Ordering::Release);
        }
        self.identified.set(true);
    }
}

/// Before a snapshot is written to `path`: when a journal is wanted,
/// makes the one that will follow it, for the dump to [`Pending::begin`]
/// as it reads the counters (then it takes a while, seconds under memory
/// pressure, to name and write them). Says why not in one line.
pub(super) fn before_snapshot(path: &str) -> Option<Pending> {
    let limit = ARMED.load(Ordering::Relaxed);
    if limit == 0 {
        return None;
    }
    match make(path, limit) {
        Ok(p) => Some(p),
        Err(why) => {
            crate::igprof_log!(
                "cannot keep a journal of the memory counts after the snapshot {path}: {why}; \
                 the snapshot holds the counts up to its own time"
            );
            None
        }
    }
}

/// After the snapshot was written to `path` (`written`) or not: the
/// journal made for it follows it under `PROFILE.journal`, replacing the
/// one that followed the previous snapshot; or it goes.
pub(super) fn after_snapshot(path: &str, pending: Option<Pending>, written: bool) {
    let Some(p) = pending else { return };
    // Begun if the dump got that far; given to the journal either way,
    // which unmaps it as it goes.
    p.begin();
    let placed = (written && p.identified.get())
        .then(|| {
            std::fs::rename(&p.tmp, path_of(path))
                .map_err(|e| format!("cannot rename {}: {e}", p.tmp))
        })
        .transpose();
    match placed {
        Ok(Some(())) => {
            records::promote();
            if let Ok(mut f) = FOLLOWS.try_lock() {
                *f = path.to_string();
            }
            crate::igprof_debug!(
                "journal of the memory counts after the snapshot: {}",
                path_of(path)
            );
        }
        Ok(None) | Err(_) => {
            records::abandon_next();
            let _ = std::fs::remove_file(&p.tmp);
            if let Err(why) = placed {
                crate::igprof_log!("cannot keep a journal after the snapshot {path}: {why}");
            }
        }
    }
}

/// After a dump that is not a snapshot was written to `path`: if it is
/// the final profile of the snapshots the journals follow (or would
/// have: a snapshot the process died writing, whose journal the keeper
/// finds begun), the journals go, files included.
pub(super) fn after_final(path: &str) {
    let other = FOLLOWS
        .try_lock()
        .is_ok_and(|f| !f.is_empty() && *f != path);
    if !records::on() || other {
        return;
    }
    records::close();
    ARMED.store(0, Ordering::Relaxed);
    let _ = std::fs::remove_file(path_of(path));
    let _ = std::fs::remove_file(format!("{}.tmp", path_of(path)));
}

/// In a fork child, whatever it profiles: the parent's journals are not
/// the child's to write (its profile has a name of its own).
pub fn reset_after_fork() {
    if let Ok(mut f) = FOLLOWS.try_lock() {
        f.clear();
    }
    records::reset_after_fork();
}

/// Makes the journal for a snapshot to be written to `path`, under a
/// temporary name, its header and module table written.
fn make(path: &str, limit: u64) -> Result<Pending, String> {
    if super::path::is_device_or_pipe(path.as_bytes()) {
        return Err("the profile is not a regular file".into());
    }
    let table = module_table();
    let records_at = (layout::HEADER_BYTES + table.len()).next_multiple_of(4096);
    let capacity = ((limit / 8).clamp(SMALLEST, LARGEST) as usize) / layout::SLOT_BYTES;
    let len = records_at + capacity * layout::SLOT_BYTES;
    let tmp = format!("{}.tmp", path_of(path));
    let _fsize = crate::base::limits::FsizeGuard::block();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(|e| format!("{tmp}: {e}"))?;
    let fail = |what: String| {
        let _ = std::fs::remove_file(&tmp);
        what
    };
    // Blocks allocated now: a write through the mapping to a hole of a
    // full file system would raise SIGBUS in the program.
    // SAFETY: fallocate on our own descriptor.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(fail(format!(
            "cannot allocate {} KiB for {tmp}: {e}",
            len >> 10
        )));
    }
    let map = crate::sys::map_shared_file(file.as_raw_fd(), len)
        .map_err(|e| fail(format!("cannot map {tmp}: {e}")))?;
    drop(file);
    let words = map as *mut u64;
    let header = [
        (layout::W_MAGIC, layout::MAGIC),
        (layout::W_PID, crate::sys::getpid() as u64),
        (layout::W_CAPACITY, capacity as u64),
        (layout::W_CURSOR, 0),
        (layout::W_MODULES_AT, layout::HEADER_BYTES as u64),
        (layout::W_MODULES_LEN, table.len() as u64),
        (layout::W_RECORDS_AT, records_at as u64),
        (
            records::W_GENERATION,
            GENERATION.fetch_add(1, Ordering::Relaxed) + 1,
        ),
    ];
    // SAFETY: a fresh mapping of `len` bytes, no one else's yet; the header
    // and the table lie below `records_at`.
    unsafe {
        for (i, v) in header {
            words.add(i).write(v);
        }
        core::ptr::copy_nonoverlapping(table.as_ptr(), map.add(layout::HEADER_BYTES), table.len());
    }
    Ok(Pending {
        map: words,
        tmp,
        begun: core::cell::Cell::new(false),
        identified: core::cell::Cell::new(false),
    })
}

/// The module table: (start, end, base, path length) and the path padded
/// to 8 bytes, for each loaded object's address range.
fn module_table() -> Vec<u8> {
    let exe = crate::base::run::info().exe.clone();
    let mut t = Vec::new();
    for (lo, hi, o) in super::names::object_ranges(&exe) {
        for w in [lo, hi, o.base, o.path.len()] {
            t.extend_from_slice(&(w as u64).to_le_bytes());
        }
        t.extend_from_slice(&o.path);
        t.resize(t.len().next_multiple_of(8), 0);
    }
    t
}
