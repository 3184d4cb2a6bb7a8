//! The memory limit of the process's cgroup, and where to read how much of
//! it is used: what the keeper watches to take a snapshot before the OOM
//! killer strikes.
//!
//! Owns the reading of `/proc/self/cgroup` and `/proc/self/mountinfo`
//! (cgroup v1's `memory` controller and cgroup v2's unified tree, whatever
//! their mount points, inside a cgroup namespace too) into the file that
//! holds the usage and the limit that applies, the lowest of the cgroup's
//! and its ancestors'. Pure functions over the files' text, so the tests
//! run on recorded inputs.
//!
//! Also owns the cheap trigger by which the memory profiler's own
//! accounting asks for a look at the usage ([`live_peak`]): the keeper's
//! periodic look can come too late for a process that fills its last 15%
//! in a few milliseconds.
//!
//! Must never: read files where allocation is not allowed ([`memory_limit`]
//! is for start-up only), or report a limit that is "no limit" in disguise
//! (v1's page-rounded `LONG_MAX`, v2's `max`).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::path::{Path, PathBuf};

/// Live heap bytes at which the memory profiler next calls [`CHECK`]
/// (u64::MAX: never), and the step between calls.
static NEXT_CHECK: AtomicU64 = AtomicU64::new(u64::MAX);
static STEP: AtomicU64 = AtomicU64::new(0);
/// The look at the usage (a `fn()` set by [`check_as_heap_grows`]).
static CHECK: AtomicUsize = AtomicUsize::new(0);

/// The process's heap is watched against `limit`: each time its live bytes
/// reach a new peak a 32nd of the limit above the last look, `check` runs
/// (on the allocating thread, inside the memory hook: it must not allocate).
pub fn check_as_heap_grows(limit: u64, check: fn()) {
    CHECK.store(check as usize, Ordering::Release);
    STEP.store((limit / 32).max(1), Ordering::Relaxed);
    NEXT_CHECK.store(0, Ordering::Release);
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

/// A memory limit and the file whose first number is the usage held
/// against it.
#[derive(Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    pub limit: u64,
    pub usage_file: PathBuf,
}

/// Limits at or above this are "unlimited" (v1 writes LONG_MAX rounded
/// down to a page).
const UNLIMITED: u64 = 1 << 62;

/// The limit of this process's memory cgroup, if it has one.
pub fn memory_limit() -> Option<MemoryLimit> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    find(
        &cgroup,
        || std::fs::read_to_string("/proc/self/mountinfo").ok(),
        |p| std::fs::read_to_string(p).ok(),
    )
}

/// Where the controllers are mounted on nearly every system: tried before
/// /proc/self/mountinfo is read (it can be long, and every profiled process
/// starts here).
const V1_MEMORY_MOUNT: &str = "/sys/fs/cgroup/memory";
const V2_MOUNT: &str = "/sys/fs/cgroup";

/// [`memory_limit`] over the given texts; `mountinfo` reads the mount
/// table when the usual mount points do not hold the cgroup; `read` reads
/// a cgroup file.
pub fn find(
    cgroup: &str,
    mountinfo: impl Fn() -> Option<String>,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<MemoryLimit> {
    // v1: "N:memory:/path" (the controller may share a line: "N:cpu,memory:/p").
    let v1 = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls.split(',').any(|c| c == "memory").then_some(path)
    });
    if let Some(path) = v1 {
        // The root cgroup has no limit (and most processes live there).
        if path == "/" {
            return None;
        }
        let usual = Path::new(V1_MEMORY_MOUNT).join(path.trim_start_matches('/'));
        let dir = if read(&usual.join("memory.limit_in_bytes")).is_some() {
            usual
        } else {
            mounted_dir(&mountinfo()?, path, |fs, opts| {
                fs == "cgroup" && opts.split(',').any(|o| o == "memory")
            })?
        };
        return lowest_up_the_tree(&dir, "memory.limit_in_bytes", &read).map(|limit| MemoryLimit {
            limit,
            usage_file: dir.join("memory.usage_in_bytes"),
        });
    }
    // v2: "0::/path".
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let usual = Path::new(V2_MOUNT).join(path.trim_start_matches('/'));
    let dir = if read(&usual.join("memory.current")).is_some() {
        usual
    } else {
        mounted_dir(&mountinfo()?, path, |fs, _| fs == "cgroup2")?
    };
    lowest_up_the_tree(&dir, "memory.max", &read).map(|limit| MemoryLimit {
        limit,
        usage_file: dir.join("memory.current"),
    })
}

/// The lowest limit in file `name` of `dir` and its ancestors, up to the
/// first that has no such file (the mount point's parent).
fn lowest_up_the_tree(
    dir: &Path,
    name: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let mut limit = None::<u64>;
    let mut d = dir;
    while let Some(text) = read(&d.join(name)) {
        if let Some(l) = parse_limit(&text) {
            limit = Some(limit.map_or(l, |m| m.min(l)));
        }
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    limit
}

/// A limit file's value: None for "max" or unlimited.
pub fn parse_limit(text: &str) -> Option<u64> {
    let v = text.trim().parse::<u64>().ok()?;
    (v < UNLIMITED).then_some(v)
}

/// The directory of cgroup `path` in the mount that `is_mount(fstype,
/// super options)` selects: its mount point joined with `path` relative
/// to the mount's root (not "/" inside a cgroup namespace).
fn mounted_dir(
    mountinfo: &str,
    path: &str,
    is_mount: impl Fn(&str, &str) -> bool,
) -> Option<PathBuf> {
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        let (fs, _source, opts) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        if !is_mount(fs, opts) {
            continue;
        }
        let f: Vec<&str> = left.split(' ').collect();
        let (root, point) = (*f.get(3)?, *f.get(4)?);
        let rel = if root == "/" {
            path
        } else {
            path.strip_prefix(root).unwrap_or(path)
        };
        return Some(Path::new(point).join(rel.trim_start_matches('/')));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn reader(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        move |p| m.get(p).cloned()
    }

    /// Recorded on a Debian 12 machine with cgroup v1 (this project's CI).
    const V1_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/igprof-oom\n1:cpu:/\n";
    const V1_MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 25 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";

    #[test]
    fn a_v1_memory_cgroup_gives_the_lowest_limit_up_its_tree() {
        // Its own limit is unlimited, its parent's is 64 MiB.
        let r = reader(&[
            (
                "/sys/fs/cgroup/memory/igprof-oom/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "67108864\n"),
        ]);
        assert_eq!(
            find(V1_CGROUP, || Some(V1_MOUNTINFO.into()), r),
            Some(MemoryLimit {
                limit: 64 << 20,
                usage_file: "/sys/fs/cgroup/memory/igprof-oom/memory.usage_in_bytes".into()
            })
        );
        // LONG_MAX rounded to a page is no limit; the root cgroup has none.
        let r = reader(&[(
            "/sys/fs/cgroup/memory/igprof-oom/memory.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        assert_eq!(find(V1_CGROUP, || Some(V1_MOUNTINFO.into()), r), None);
        let no_files = |_: &Path| -> Option<String> { panic!("a file read for the root cgroup") };
        assert_eq!(find("4:memory:/\n", || None, no_files), None);
    }

    #[test]
    fn a_v2_cgroup_takes_the_lowest_limit_up_its_tree_in_a_namespace_too() {
        // Inside a cgroup namespace the mount's root is the namespace's.
        let mountinfo =
            "40 30 0:35 /user.slice /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let r = reader(&[
            ("/sys/fs/cgroup/app/job/memory.max", "max\n"),
            ("/sys/fs/cgroup/app/memory.max", "1073741824\n"),
            ("/sys/fs/cgroup/memory.max", "2147483648\n"),
        ]);
        assert_eq!(
            find("0::/user.slice/app/job\n", || Some(mountinfo.into()), r),
            Some(MemoryLimit {
                limit: 1 << 30,
                usage_file: "/sys/fs/cgroup/app/job/memory.current".into()
            })
        );
        let r = reader(&[("/sys/fs/cgroup/app/memory.max", "max\n")]);
        assert_eq!(
            find("0::/user.slice/app\n", || Some(mountinfo.into()), r),
            None
        );
    }

    #[test]
    fn the_usual_mount_point_spares_reading_the_mount_table() {
        let r = reader(&[(
            "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
            "1048576\n",
        )]);
        let no_mountinfo = || -> Option<String> { panic!("mountinfo read") };
        assert_eq!(
            find("4:memory:/job\n", no_mountinfo, r).unwrap().limit,
            1 << 20
        );
    }

    #[test]
    fn no_memory_controller_no_limit() {
        assert_eq!(
            find("1:cpu:/\n", || Some(V1_MOUNTINFO.into()), reader(&[])),
            None
        );
        assert_eq!(parse_limit("max"), None);
        assert_eq!(parse_limit(" 4096\n"), Some(4096));
    }
}
