//! The keeper's watch of the process's memory cgroup: the limit found at
//! the keeper's start (raw reads into its stack, base/cgroup.rs parsing),
//! and the usage less the page cache (`memory.stat`'s file lists, which
//! reclaim empties before the OOM killer is called) looked at as it nears
//! the limit, by the keeper every
//! [`WATCH_NS`] and at the kernel's threshold eventfd (cgroup v1), and by the
//! program's memory hooks as its heap grows: a snapshot is asked for at
//! each of [`thresholds`] (85%, 92% and 97% of the limit, then 256 and 64
//! MiB below it where those are higher), the evidence that remains
//! when the OOM killer strikes. With `--snapshot-above SIZE` the watch is
//! of the process's RSS instead (`/proc/PID/statm`, by the keeper every
//! [`WATCH_NS`]): one snapshot each time it rises above SIZE.
//!
//! Must never: allocate, touch TLS or errno, or call into libc (it runs in
//! the keeper while the program lives, and in the program's hooks).

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::raw::{self, raw_close, raw_open, read_file, write_decimal};

/// The memory limit watched (0: none). Set by the keeper once it found
/// it, after the paths below: a reader that sees it sees them.
pub(super) static LIMIT: AtomicU64 = AtomicU64::new(0);
/// Whether [`LIMIT`] is `--snapshot-above`'s RSS threshold (the usage is
/// the program's RSS) rather than a cgroup's limit.
static RSS: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// How often the keeper reads the usage while a limit is watched.
pub(super) const WATCH_NS: u64 = 50_000_000;
/// A snapshot is asked for as the usage reaches each of these shares of
/// the limit (per mille), and then each of [`SNAPSHOT_BELOW`]: the last one
/// written before an OOM kill holds nearly everything; once the usage fell
/// below [`REARM_PER_MILLE`], each may be taken again.
const SNAPSHOT_PER_MILLE: [u64; 3] = [850, 920, 970];
/// Bytes below the limit at which a snapshot is also asked for, where
/// that is above the last share: 3% of a container's 16 GiB is 491 MiB
/// of growth that the last snapshot before the OOM killer would miss.
/// None closer than 16 MiB: a snapshot needs memory of its own (up to a
/// few MiB for a large profile), and one taken where a program levels off
/// just below its limit must not be what pushes it over.
const SNAPSHOT_BELOW: [u64; 3] = [256 << 20, 64 << 20, 16 << 20];
const REARM_PER_MILLE: u64 = 750;

/// The usage below which the snapshots may be taken again (for the RSS
/// watch, `limit` is `--snapshot-above`'s threshold).
#[link_section = "igprof_hot"]
fn rearm_below(limit: u64) -> u64 {
    limit / 1000 * REARM_PER_MILLE
}
/// The most thresholds [`thresholds`] gives.
pub(super) const MAX_THRESHOLDS: usize = SNAPSHOT_PER_MILLE.len() + SNAPSHOT_BELOW.len();

/// The usages at which a snapshot is asked for under `limit`, rising, and
/// how many there are: each of [`SNAPSHOT_PER_MILLE`], then each of
/// [`SNAPSHOT_BELOW`] that lies above the one before (a limit above
/// about 2 GiB).
#[link_section = "igprof_hot"]
pub(super) fn thresholds(limit: u64) -> ([u64; MAX_THRESHOLDS], usize) {
    let mut t = [0u64; MAX_THRESHOLDS];
    let mut n = 0;
    for m in SNAPSHOT_PER_MILLE {
        t[n] = limit / 1000 * m;
        n += 1;
    }
    for below in SNAPSHOT_BELOW {
        let at = limit.saturating_sub(below);
        if at > t[n - 1] {
            t[n] = at;
            n += 1;
        }
    }
    (t, n)
}

/// A NUL-terminated path written by the keeper before it sets [`LIMIT`]
/// and only read once [`LIMIT`] is set (or by the keeper itself).
struct PathCell(core::cell::UnsafeCell<[u8; 512]>);
// SAFETY: written only before LIMIT is published (Release) and read only
// after it is seen (Acquire); see the statics below.
unsafe impl Sync for PathCell {}

impl PathCell {
    const fn new() -> Self {
        PathCell(core::cell::UnsafeCell::new([0; 512]))
    }

    /// Writes `parts` joined and NUL-terminated; false when too long.
    fn set(&self, parts: &[&[u8]]) -> bool {
        // SAFETY: see the Sync impl: no reader until LIMIT is published.
        let buf = unsafe { &mut *self.0.get() };
        let mut n = 0;
        for p in parts {
            if n + p.len() + 1 > buf.len() {
                buf[0] = 0;
                return false;
            }
            buf[n..n + p.len()].copy_from_slice(p);
            n += p.len();
        }
        buf[n] = 0;
        true
    }

    fn ptr(&self) -> usize {
        self.0.get() as usize
    }

    fn is_set(&self) -> bool {
        // SAFETY: see the Sync impl.
        unsafe { (*self.0.get())[0] != 0 }
    }
}

/// The program's snapshot call (`Calls::snapshot_near_limit`, as usize;
/// set once by `configure`).
pub(super) static SNAPSHOT: AtomicUsize = AtomicUsize::new(0);

/// The file holding the usage held against [`LIMIT`].
static USAGE_PATH: PathCell = PathCell::new();
/// cgroup v1's `cgroup.event_control` beside it (empty on v2): where the
/// keeper registers an eventfd that the kernel signals as the usage
/// crosses the snapshot threshold, so a fast-growing process is caught
/// between two reads.
static CONTROL_PATH: PathCell = PathCell::new();

/// The cgroup's `memory.stat`, whose page cache the usage is taken without
/// (reclaim frees it before the OOM killer is called: a program that read
/// big files sits at its limit long before it runs out of memory).
static STAT_PATH: PathCell = PathCell::new();
/// Whether [`STAT_PATH`] is cgroup v2's (how its fields are named).
static STAT_V2: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Room for the text of `memory.stat` (the fields read come in its first
/// 2 KiB on v1 and v2).
const STAT_BYTES: usize = 4096;
/// Where the program's memory hooks read `memory.stat` (a hook's thread
/// may have a small stack; the keeper reads it on its own), one thread at
/// a time: a thread that finds it taken skips that look.
struct StatBuffer(core::cell::UnsafeCell<[u8; STAT_BYTES]>);
// SAFETY: used only by the holder of STAT_BUSY (see read_usage).
unsafe impl Sync for StatBuffer {}
static STAT_BUF: StatBuffer = StatBuffer(core::cell::UnsafeCell::new([0; STAT_BYTES]));
static STAT_BUSY: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Whether the last usage read left the page cache out (for the lines that
/// give it).
static CACHE_LEFT_OUT: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The pressure (PSI) file watched beside the limit: the cgroup's own
/// `memory.pressure` (v2), else the system's `/proc/pressure/memory`.
static PRESSURE_PATH: PathCell = PathCell::new();
/// The trigger written to it: tasks stalled on memory for 100 ms of a
/// 2 s window (5%; a window of whole 2 s units is what the kernel allows
/// a user who is not root).
const PRESSURE_TRIGGER: &[u8] = b"some 100000 2000000";
/// [`PRESSURE_TRIGGER`] in words, for the snapshot's line.
pub const PRESSURE_MEANS: &str = "tasks stalled on memory for 100 ms of 2 s";
/// One snapshot per episode of pressure: another only after no event
/// came for this long.
const PRESSURE_QUIET_NS: u64 = 10_000_000_000;
/// When the last pressure event came (CLOCK_MONOTONIC ns; 0: never).
static PRESSURE_LAST: AtomicU64 = AtomicU64::new(0);
/// Set as a snapshot is asked for because of pressure, taken by the
/// watcher's line ([`pressure_asked`]).
static PRESSURE_ASKED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The keeper, at its start: finds the limit of the process's memory
/// cgroup (base/cgroup.rs, raw reads into its stack) and, where there is
/// one, publishes it for the watch. The program pays nothing for it.
pub(super) fn find_memory_limit(program: i32) {
    use crate::base::cgroup;
    let above = crate::base::options::get().snapshot_above;
    if above != 0 {
        // /proc/PID/statm, PID in decimal.
        let mut pid = [0u8; 20];
        let n = write_decimal(&mut pid, program as u64);
        if USAGE_PATH.set(&[b"/proc/", &pid[..n], b"/statm"]) {
            PRESSURE_PATH.set(&[b"/proc/pressure/memory"]);
            RSS.store(true, Ordering::Relaxed);
            LIMIT.store(above, Ordering::Release);
        }
        return;
    }
    let mut text = [0u8; 2048];
    let Some(n) = read_file(b"/proc/self/cgroup\0", &mut text) else {
        return;
    };
    let mut dir = [0u8; 400];
    let Some((len, version)) = cgroup::memory_dir(&text[..n], &mut dir) else {
        return;
    };
    let dir = &dir[..len];
    let limit = cgroup::lowest_limit(dir, version, |path| {
        let mut buf = [0u8; 32];
        let n = read_file(path, &mut buf)?;
        Some(cgroup::leading_number(&buf[..n]))
    });
    let Some(limit) = limit else { return };
    if !USAGE_PATH.set(&[dir, b"/", version.usage_file()]) {
        return;
    }
    STAT_PATH.set(&[dir, b"/", version.stat_file()]);
    STAT_V2.store(version == cgroup::Version::V2, Ordering::Relaxed);
    if version == cgroup::Version::V1 {
        CONTROL_PATH.set(&[dir, b"/cgroup.event_control"]);
        PRESSURE_PATH.set(&[b"/proc/pressure/memory"]);
    } else {
        PRESSURE_PATH.set(&[dir, b"/memory.pressure"]);
    }
    LIMIT.store(limit, Ordering::Release);
    cgroup::check_as_heap_grows(limit, check_near_limit);
}

/// Opens the pressure file of the watch with its trigger ([`PRESSURE_TRIGGER`]):
/// a descriptor to poll for POLLPRI, or -1 (no limit watched, no PSI in
/// this kernel, or a trigger refused). Raw system calls.
pub(super) fn pressure_fd() -> i32 {
    if LIMIT.load(Ordering::Acquire) == 0 || !PRESSURE_PATH.is_set() {
        return -1;
    }
    let fd = raw_open(
        PRESSURE_PATH.ptr() as *const u8,
        libc::O_RDWR | libc::O_NONBLOCK,
    );
    if fd < 0 {
        return -1;
    }
    // The kernel reads the trigger with its terminating NUL.
    let mut t = [0u8; 32];
    t[..PRESSURE_TRIGGER.len()].copy_from_slice(PRESSURE_TRIGGER);
    // SAFETY: writes the trigger from this stack to our descriptor.
    let n = unsafe {
        raw::call(
            libc::SYS_write,
            [
                fd as usize,
                t.as_ptr() as usize,
                PRESSURE_TRIGGER.len() + 1,
                0,
                0,
                0,
            ],
        )
    };
    if n < 0 {
        raw_close(fd);
        return -1;
    }
    fd
}

/// The keeper saw a pressure event (`now`: CLOCK_MONOTONIC ns): the first
/// of an episode asks for a snapshot.
pub(super) fn on_pressure(now: u64) {
    let last = PRESSURE_LAST.swap(now.max(1), Ordering::AcqRel);
    if last != 0 && now.saturating_sub(last) < PRESSURE_QUIET_NS {
        return;
    }
    PRESSURE_ASKED.store(true, Ordering::Release);
    let usage = read_usage(Some(&mut [0; STAT_BYTES])).unwrap_or(1).max(1);
    ask_snapshot(usage, LIMIT.load(Ordering::Acquire));
}

/// A new keeper's watch starts with no episode of pressure.
pub(super) fn forget_pressure() {
    PRESSURE_LAST.store(0, Ordering::Release);
    PRESSURE_ASKED.store(false, Ordering::Release);
}

/// Whether the snapshot being written was asked for because of memory
/// pressure (once: the flag is taken).
pub fn pressure_asked() -> bool {
    PRESSURE_ASKED.swap(false, Ordering::AcqRel)
}

/// The pressure file watched, for the snapshot's line.
pub fn pressure_file() -> &'static str {
    // SAFETY: written before LIMIT is published, NUL-terminated; only
    // asked for after a pressure snapshot, so after it was set.
    let buf = unsafe { &*PRESSURE_PATH.0.get() };
    let n = buf.iter().position(|b| *b == 0).unwrap_or(0);
    core::str::from_utf8(&buf[..n]).unwrap_or("")
}

/// Registers v1 memory thresholds at `thresholds` bytes: an eventfd the
/// kernel signals when the usage crosses any of them (-1 where that cannot
/// be done: cgroup v2, or no permission on the control file). Raw system
/// calls.
pub(super) fn threshold_eventfd(thresholds: &[u64]) -> i32 {
    if !CONTROL_PATH.is_set() || !USAGE_PATH.is_set() {
        return -1;
    }
    // NUL-terminated paths, written before LIMIT was set.
    let (control, usage) = (CONTROL_PATH.ptr(), USAGE_PATH.ptr());
    // SAFETY: eventfd2(0, EFD_CLOEXEC).
    let efd = unsafe {
        raw::call(
            libc::SYS_eventfd2,
            [0, libc::EFD_CLOEXEC as usize, 0, 0, 0, 0],
        )
    };
    let ufd = raw_open(usage as *const u8, libc::O_RDONLY);
    let cfd = raw_open(control as *const u8, libc::O_WRONLY);
    let ok = efd >= 0
        && ufd >= 0
        && cfd >= 0
        && thresholds.iter().all(|&threshold| {
            let mut line = [0u8; 64];
            let mut len = 0;
            for (i, v) in [efd as u64, ufd as u64, threshold].into_iter().enumerate() {
                if i > 0 {
                    line[len] = b' ';
                    len += 1;
                }
                len += write_decimal(&mut line[len..], v);
            }
            // SAFETY: writes the line from this stack to our descriptor.
            let n = unsafe {
                raw::call(
                    libc::SYS_write,
                    [cfd as usize, line.as_ptr() as usize, len, 0, 0, 0],
                )
            };
            n == len as isize
        });
    // The registration holds the usage file; the eventfd is kept.
    for fd in [ufd, cfd] {
        if fd >= 0 {
            raw_close(fd);
        }
    }
    if ok {
        efd as i32
    } else {
        if efd >= 0 {
            raw_close(efd as i32);
        }
        -1
    }
}

/// The cgroup's usage less its page cache (raw system calls only; the
/// whole usage where `memory.stat` cannot be read), or with
/// `--snapshot-above` the RSS; None where it cannot be read. `memory.stat`
/// is read into `room` (the keeper's stack), or with None into
/// [`STAT_BUF`], and not at all (None) while another thread holds that.
#[link_section = "igprof_hot"]
fn read_usage(room: Option<&mut [u8]>) -> Option<u64> {
    if LIMIT.load(Ordering::Acquire) == 0 {
        return None;
    }
    // SAFETY: LIMIT is set, so USAGE_PATH is written and NUL-terminated.
    let path = unsafe { &*USAGE_PATH.0.get() };
    let mut buf = [0u8; 64];
    let n = read_file(path, &mut buf)?;
    if RSS.load(Ordering::Relaxed) {
        // statm: size resident ... in pages.
        return super::facts::statm_rss_bytes(&buf[..n]);
    }
    let usage = crate::base::cgroup::leading_number(&buf[..n])?;
    // Below the share that re-arms the snapshots, the usage less the cache
    // is too: what it says is the same, and `memory.stat` (costlier: v2
    // flushes the cgroup's statistics to read it) is not read.
    let limit = LIMIT.load(Ordering::Acquire);
    if !STAT_PATH.is_set() || usage < rearm_below(limit) {
        CACHE_LEFT_OUT.store(false, Ordering::Relaxed);
        return Some(usage);
    }
    let cache = match room {
        Some(room) => stat_cache(room),
        None => {
            if STAT_BUSY.swap(true, Ordering::Acquire) {
                return None;
            }
            // SAFETY: STAT_BUSY is ours until released below.
            let cache = stat_cache(unsafe { &mut *STAT_BUF.0.get() });
            STAT_BUSY.store(false, Ordering::Release);
            cache
        }
    };
    CACHE_LEFT_OUT.store(cache.is_some(), Ordering::Relaxed);
    Some(usage.saturating_sub(cache.unwrap_or(0)))
}

/// The page cache of the cgroup's `memory.stat`, read into `room`.
#[link_section = "igprof_hot"]
fn stat_cache(room: &mut [u8]) -> Option<u64> {
    // SAFETY: STAT_PATH is set (checked by the caller) and was written
    // before LIMIT was published, NUL-terminated.
    let stat = unsafe { &*STAT_PATH.0.get() };
    let version = if STAT_V2.load(Ordering::Relaxed) {
        crate::base::cgroup::Version::V2
    } else {
        crate::base::cgroup::Version::V1
    };
    read_file(stat, room).and_then(|n| crate::base::cgroup::file_cache(&room[..n], version))
}

/// Whether the usage last read for the watch left the page cache out.
pub fn cache_left_out() -> bool {
    CACHE_LEFT_OUT.load(Ordering::Relaxed)
}

/// How many of [`thresholds`] were crossed (and their
/// snapshots asked for) since the usage was last below [`REARM_PER_MILLE`].
pub(super) static CROSSED: AtomicU32 = AtomicU32::new(0);

/// The program's memory hooks' look at the usage as the heap grows
/// (base/cgroup.rs): [`check_near`] with the shared buffer.
fn check_near_limit() {
    check_near(None)
}

/// The keeper's look at the usage (its watch): [`check_near`] with a
/// buffer on its own stack.
#[link_section = "igprof_hot"]
pub(super) fn check_near_limit_from_keeper() {
    check_near(Some(&mut [0; STAT_BYTES]))
}

/// Looks at the usage (`memory.stat` read into `room`, see
/// [`read_usage`]) and asks the program for a snapshot when it crossed a
/// threshold: raw system calls only, no allocation.
#[link_section = "igprof_hot"]
fn check_near(room: Option<&mut [u8]>) {
    let limit = LIMIT.load(Ordering::Acquire);
    let Some(usage) = read_usage(room) else {
        return;
    };
    if RSS.load(Ordering::Relaxed) {
        // One snapshot per rise above the threshold.
        if usage < rearm_below(limit) {
            CROSSED.store(0, Ordering::Release);
        } else if usage >= limit && CROSSED.swap(1, Ordering::AcqRel) == 0 {
            ask_snapshot(usage, limit);
        }
        return;
    }
    let (at, n) = thresholds(limit);
    let reached = at[..n].iter().filter(|&&t| usage >= t).count() as u32;
    if usage < rearm_below(limit) {
        CROSSED.store(0, Ordering::Release);
    } else if reached > CROSSED.fetch_max(reached, Ordering::AcqRel) {
        ask_snapshot(usage, limit);
    }
}

/// Whether the watch is of the RSS (`--snapshot-above`), not a cgroup.
pub fn watching_rss() -> bool {
    RSS.load(Ordering::Relaxed)
}

/// Asks the program for a snapshot at `usage` of `limit`.
fn ask_snapshot(usage: u64, limit: u64) {
    let f = SNAPSHOT.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: only Calls::snapshot_near_limit is stored in SNAPSHOT.
        let f = unsafe { core::mem::transmute::<usize, fn(u64, u64, fn(&AtomicU32))>(f) };
        f(usage, limit, futex_wake_raw);
    }
}

/// Wakes a waiter on a futex word of the program (the keeper shares its
/// memory, so the private futex is the same word).
fn futex_wake_raw(word: &AtomicU32) {
    let op = (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as usize;
    // SAFETY: FUTEX_WAKE on a valid word, one waiter.
    unsafe {
        raw::call(
            libc::SYS_futex,
            [word as *const AtomicU32 as usize, op, 1, 0, 0, 0],
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_large_limit_gets_snapshots_close_below_it() {
        // 96 MiB: the shares alone (16 MiB below is far under 97%).
        let (t, n) = thresholds(96 * MIB);
        assert_eq!(
            &t[..n],
            &[
                96 * MIB / 1000 * 850,
                96 * MIB / 1000 * 920,
                96 * MIB / 1000 * 970
            ]
        );
        // 1 GiB: 97% is 31 MiB below the limit; 16 MiB below comes after.
        let g1 = 1024 * MIB;
        let (t, n) = thresholds(g1);
        assert_eq!(&t[3..n], &[g1 - 16 * MIB]);
        // 4 GiB: 97% is 123 MiB below the limit; 64 and 16 MiB below
        // come after.
        let g4 = 4096 * MIB;
        let (t, n) = thresholds(g4);
        assert_eq!(&t[3..n], &[g4 - 64 * MIB, g4 - 16 * MIB]);
        // 16 GiB: 256, 64 and 16 MiB below, all above 97% (491 MiB below).
        let g16 = 16384 * MIB;
        let (t, n) = thresholds(g16);
        assert_eq!(&t[3..n], &[g16 - 256 * MIB, g16 - 64 * MIB, g16 - 16 * MIB]);
        assert!(t[..n].windows(2).all(|w| w[0] < w[1]), "{:?}", &t[..n]);
    }
}
