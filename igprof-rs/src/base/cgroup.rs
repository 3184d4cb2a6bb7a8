//! The memory limit of the process's cgroup, and where to read how much of
//! it is used: what the keeper watches to take a snapshot before the OOM
//! killer strikes.
//!
//! Owns the reading of `/proc/self/cgroup` into the cgroup's directory
//! (cgroup v1's `memory` controller at `/sys/fs/cgroup/memory`, cgroup v2's
//! unified tree at `/sys/fs/cgroup`, the mount points of nearly every
//! system and of containers) and the limit that applies there, the lowest
//! of the cgroup's and its ancestors'. Everything works on byte buffers the
//! caller owns and on a `read` function it passes, without allocation: the
//! keeper runs it while the program lives, with raw system calls only. The
//! tests run it on recorded inputs.
//!
//! Also owns the cheap trigger by which the memory profiler's own
//! accounting asks for a look at the usage ([`live_peak`]): the keeper's
//! periodic look can come too late for a process that fills its last 15%
//! in a few milliseconds.
//!
//! Must never: allocate, or report a limit that is "no limit" in disguise
//! (v1's page-rounded `LONG_MAX`, v2's `max`).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Which cgroup hierarchy holds the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The file of a cgroup directory holding its limit.
    pub fn limit_file(self) -> &'static [u8] {
        match self {
            Version::V1 => b"memory.limit_in_bytes",
            Version::V2 => b"memory.max",
        }
    }

    /// The file holding the usage held against the limit.
    pub fn usage_file(self) -> &'static [u8] {
        match self {
            Version::V1 => b"memory.usage_in_bytes",
            Version::V2 => b"memory.current",
        }
    }

    /// The file of the cgroup's statistics, page cache among them.
    pub const fn stat_file(self) -> &'static [u8] {
        b"memory.stat"
    }
}

/// The bytes of page cache on the file LRU lists (what reclaim frees
/// before the OOM killer is called), from the text of `memory.stat`: v1's
/// `total_inactive_file` + `total_active_file` (the cgroup and those below
/// it, as the usage counts them; the cgroup's own figures where the totals
/// are missing), v2's `inactive_file` + `active_file`. Shared memory is not
/// among them (it sits on the anonymous lists). None where either is
/// missing.
#[link_section = "igprof_hot"]
pub fn file_cache(stat: &[u8], version: Version) -> Option<u64> {
    // Whole lines only: a buffer too small for the file ends mid-line.
    let whole = stat.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let stat = &stat[..whole];
    let field = |name: &[u8]| {
        stat.split(|&b| b == b'\n').find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(b" ")?;
            leading_number(rest)
        })
    };
    let pair =
        |inactive: &[u8], active: &[u8]| Some(field(inactive)?.saturating_add(field(active)?));
    match version {
        Version::V1 => pair(b"total_inactive_file", b"total_active_file")
            .or_else(|| pair(b"inactive_file", b"active_file")),
        Version::V2 => pair(b"inactive_file", b"active_file"),
    }
}

const V1_MEMORY_MOUNT: &[u8] = b"/sys/fs/cgroup/memory";
const V2_MOUNT: &[u8] = b"/sys/fs/cgroup";

/// Limits at or above this are "unlimited" (v1 writes LONG_MAX rounded
/// down to a page).
const UNLIMITED: u64 = 1 << 62;

/// Writes the directory of the process's memory cgroup, from the text of
/// `/proc/self/cgroup`, into `out`; returns its length and the hierarchy.
/// None for the root cgroup (it has no limit, and most processes live
/// there), without a memory controller, or when `out` is too small.
pub fn memory_dir(cgroup: &[u8], out: &mut [u8]) -> Option<(usize, Version)> {
    let mut v2 = None;
    for line in cgroup.split(|&b| b == b'\n') {
        let mut f = line.splitn(3, |&b| b == b':');
        let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if ctrls.split(|&b| b == b',').any(|c| c == b"memory") {
            return join(out, V1_MEMORY_MOUNT, path).map(|n| (n, Version::V1));
        }
        if ctrls.is_empty() {
            v2 = Some(path);
        }
    }
    join(out, V2_MOUNT, v2?).map(|n| (n, Version::V2))
}

/// `mount` + `path` into `out` (None for the root path or no room).
fn join(out: &mut [u8], mount: &[u8], path: &[u8]) -> Option<usize> {
    if path.is_empty() || path == b"/" {
        return None;
    }
    let n = mount.len() + path.len();
    if n > out.len() {
        return None;
    }
    out[..mount.len()].copy_from_slice(mount);
    out[mount.len()..n].copy_from_slice(path);
    Some(n)
}

/// The lowest limit of `dir` and its ancestors, up to the first that has
/// no limit file (the mount point itself has none). `read(path)` reads a
/// NUL-terminated file path and returns its text's leading number, None
/// for a missing file, Some(None) for "max" or no number.
pub fn lowest_limit(
    dir: &[u8],
    version: Version,
    mut read: impl FnMut(&[u8]) -> Option<Option<u64>>,
) -> Option<u64> {
    let name = version.limit_file();
    let mut buf = [0u8; 512];
    let mut len = dir.len();
    let mut lowest: Option<u64> = None;
    loop {
        let total = len + 1 + name.len() + 1;
        if total > buf.len() {
            return None;
        }
        buf[..len].copy_from_slice(&dir[..len]);
        buf[len] = b'/';
        buf[len + 1..total - 1].copy_from_slice(name);
        buf[total - 1] = 0;
        match read(&buf[..total]) {
            None => break,
            Some(v) => {
                if let Some(l) = v.filter(|&l| l < UNLIMITED) {
                    lowest = Some(lowest.map_or(l, |m| m.min(l)));
                }
            }
        }
        match dir[..len].iter().rposition(|&b| b == b'/') {
            Some(0) | None => break,
            Some(i) => len = i,
        }
    }
    lowest
}

/// The leading decimal number of a file's text (None for "max" and other
/// text).
#[link_section = "igprof_hot"]
pub fn leading_number(text: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    let mut any = false;
    for &d in text.iter().take_while(|b| b.is_ascii_digit()) {
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
        any = true;
    }
    any.then_some(v)
}

/// Live heap bytes at which the memory profiler next calls [`CHECK`]
/// (u64::MAX: never), and the step between calls.
static NEXT_CHECK: AtomicU64 = AtomicU64::new(u64::MAX);
static STEP: AtomicU64 = AtomicU64::new(0);
/// The look at the usage (a `fn()` set by [`check_as_heap_grows`]).
static CHECK: AtomicUsize = AtomicUsize::new(0);

/// The process's heap is watched against `limit`: each time its live bytes
/// reach a new peak a 32nd of the limit (8 MiB at most, so that the
/// snapshot 16 MiB below a large limit is not stepped over) above the
/// last look, `check` runs (on the allocating thread, inside the memory
/// hook: it must not allocate). Atomic stores only: the keeper calls it.
pub fn check_as_heap_grows(limit: u64, check: fn()) {
    CHECK.store(check as usize, Ordering::Release);
    STEP.store((limit / 32).clamp(1, 8 << 20), Ordering::Relaxed);
    NEXT_CHECK.store(0, Ordering::Release);
}

/// No look until [`check_as_heap_grows`] again (a fork child, before its
/// keeper found the limit).
pub fn stop_checks() {
    NEXT_CHECK.store(u64::MAX, Ordering::Release);
}

/// The process's live heap reached a new peak of `now` bytes (the memory
/// profiler's accounting). One load and compare unless a look is due.
#[inline]
pub fn live_peak(now: u64) {
    if now >= NEXT_CHECK.load(Ordering::Relaxed) {
        look(now);
    }
}

#[cold]
#[inline(never)]
fn look(now: u64) {
    NEXT_CHECK.store(
        now.saturating_add(STEP.load(Ordering::Relaxed)),
        Ordering::Relaxed,
    );
    let f = CHECK.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: only `fn()` pointers are stored in CHECK.
        let check = unsafe { core::mem::transmute::<usize, fn()>(f) };
        check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Reads recorded files: path (without its NUL) -> text.
    fn reader(files: &[(&str, &str)]) -> impl FnMut(&[u8]) -> Option<Option<u64>> {
        let m: HashMap<Vec<u8>, String> = files
            .iter()
            .map(|(p, t)| (p.as_bytes().to_vec(), t.to_string()))
            .collect();
        move |p| {
            let p = p.strip_suffix(b"\0").expect("NUL-terminated");
            m.get(p).map(|t| leading_number(t.as_bytes()))
        }
    }

    fn limit(cgroup: &str, files: &[(&str, &str)]) -> Option<(String, u64)> {
        let mut dir = [0u8; 256];
        let (n, v) = memory_dir(cgroup.as_bytes(), &mut dir)?;
        let l = lowest_limit(&dir[..n], v, reader(files))?;
        Some((String::from_utf8(dir[..n].to_vec()).unwrap(), l))
    }

    /// Recorded on a Debian 12 machine with cgroup v1 (this project's CI).
    const V1_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/igprof-oom\n1:cpu:/\n";

    #[test]
    fn a_v1_memory_cgroup_gives_the_lowest_limit_up_its_tree() {
        // Its own limit is unlimited, its parent's 64 MiB; the mount point
        // (the root cgroup) has its own file, unlimited.
        let files = [
            (
                "/sys/fs/cgroup/memory/a/job/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
                "67108864\n",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ];
        assert_eq!(
            limit("4:memory:/a/job\n", &files),
            Some(("/sys/fs/cgroup/memory/a/job".into(), 64 << 20))
        );
        let files = [(
            "/sys/fs/cgroup/memory/igprof-oom/memory.limit_in_bytes",
            "100663296\n",
        )];
        assert_eq!(limit(V1_CGROUP, &files).unwrap().1, 96 << 20);
        // LONG_MAX rounded to a page is no limit.
        let files = [(
            "/sys/fs/cgroup/memory/igprof-oom/memory.limit_in_bytes",
            "9223372036854771712\n",
        )];
        assert_eq!(limit(V1_CGROUP, &files), None);
    }

    #[test]
    fn the_root_cgroup_reads_no_file() {
        let mut dir = [0u8; 256];
        assert_eq!(memory_dir(b"4:memory:/\n1:cpu:/\n", &mut dir), None);
        assert_eq!(memory_dir(b"0::/\n", &mut dir), None);
    }

    #[test]
    fn a_v2_cgroup_takes_the_lowest_limit_up_its_tree() {
        let files = [
            ("/sys/fs/cgroup/app/job/memory.max", "max\n"),
            ("/sys/fs/cgroup/app/memory.max", "1073741824\n"),
            ("/sys/fs/cgroup/memory.max", "2147483648\n"),
        ];
        assert_eq!(
            limit("0::/app/job\n", &files),
            Some(("/sys/fs/cgroup/app/job".into(), 1 << 30))
        );
        assert_eq!(
            limit("0::/app\n", &[("/sys/fs/cgroup/app/memory.max", "max\n")]),
            None
        );
    }

    /// Recorded `memory.stat` texts (Linux 6.18 v1 with a cgroup below,
    /// and a v2 one from Linux 6.1), cut to the lines around the fields.
    #[test]
    fn the_page_cache_is_the_file_lists_of_memory_stat() {
        let v1 = b"cache 9388032\nrss 1593344\nshmem 9166848\nmapped_file 7004160\n\
            inactive_anon 0\nactive_anon 1531904\ninactive_file 8192\nactive_file 212992\n\
            unevictable 9228288\nhierarchical_memory_limit 100663296\ntotal_cache 1064644608\n\
            total_rss 4595712\ntotal_inactive_anon 2859008\ntotal_active_anon 1568768\n\
            total_inactive_file 291028992\ntotal_active_file 764416000\ntotal_unevictable 9228288\n";
        assert_eq!(file_cache(v1, Version::V1), Some(291028992 + 764416000));
        // Without the hierarchy's totals: the cgroup's own.
        let own = b"cache 9388032\ninactive_file 8192\nactive_file 212992\n";
        assert_eq!(file_cache(own, Version::V1), Some(8192 + 212992));
        let v2 = b"anon 52305920\nfile 104857600\nkernel 2121728\nshmem 4096\n\
            file_mapped 0\nfile_dirty 0\ninactive_anon 52297728\nactive_anon 12288\n\
            inactive_file 83886080\nactive_file 20967424\nunevictable 0\n\
            workingset_refault_file 0\n";
        assert_eq!(file_cache(v2, Version::V2), Some(83886080 + 20967424));
        // A field missing, or cut off at the end of the buffer: no figure.
        assert_eq!(
            file_cache(b"inactive_file 4096\nactive_fi", Version::V2),
            None
        );
        assert_eq!(
            file_cache(b"inactive_file 4096\nactive_file 20", Version::V2),
            None
        );
        assert_eq!(file_cache(b"", Version::V1), None);
    }

    #[test]
    fn no_memory_controller_no_limit() {
        let mut dir = [0u8; 256];
        assert_eq!(memory_dir(b"1:cpu:/x\n", &mut dir), None);
        assert_eq!(leading_number(b"max\n"), None);
        assert_eq!(leading_number(b"4096\n"), Some(4096));
        // A path longer than the buffer is refused, not cut.
        let long = format!("0::/{}\n", "x".repeat(300));
        assert_eq!(memory_dir(long.as_bytes(), &mut dir), None);
    }
}
