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
/// reach a new peak a 32nd of the limit above the last look, `check` runs
/// (on the allocating thread, inside the memory hook: it must not
/// allocate). Atomic stores only: the keeper calls it.
pub fn check_as_heap_grows(limit: u64, check: fn()) {
    CHECK.store(check as usize, Ordering::Release);
    STEP.store((limit / 32).max(1), Ordering::Relaxed);
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
