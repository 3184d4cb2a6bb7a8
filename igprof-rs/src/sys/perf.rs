//! perf_event_open(2) and what is done with its descriptors: the attr
//! layout, sampling events (task clock, `-e` kinds, context switches) whose
//! overflows reach their thread by sigtrap or fasync, counting groups and
//! their reads, ring and hold mappings, period changes.
//!
//! Must never: choose a sampler or decide what to do with a sample (that is
//! `sampler/`'s), or leave an event of ours to survive exec.

use core::ffi::c_void;

use super::errno::Errno;
use super::io::move_fd_up;

/// `/proc/sys/kernel/perf_event_paranoid`, for messages ("?" if unread).
pub fn perf_event_paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// What decides whether this process may open perf events: the
/// `perf_event_paranoid` level as read ("?" if unread) and whether its
/// effective capabilities hold CAP_PERFMON (or CAP_SYS_ADMIN, which
/// implies it), which no level refuses.
pub struct PerfRights {
    pub paranoid: String,
    pub perfmon: bool,
}

impl PerfRights {
    /// This process's, read from /proc (not in signal context).
    pub fn of_this_process() -> PerfRights {
        let eff = super::own_status("CapEff").and_then(|h| u64::from_str_radix(&h, 16).ok());
        PerfRights {
            paranoid: perf_event_paranoid(),
            perfmon: eff.is_some_and(|c| c & (1 << 38 | 1 << 21) != 0),
        }
    }

    /// Whether errno `e` of perf_event_open is perf_event_paranoid 2
    /// refusing kernel mode to a process without CAP_PERFMON: the same
    /// event counting user mode only would open.
    pub fn refused_kernel_mode(&self, e: i32) -> bool {
        matches!(e, libc::EACCES | libc::EPERM) && !self.perfmon && self.paranoid == "2"
    }
}

/// Why perf_event_open refused an event with errno `e`, in words a user
/// can act on (the end of the one line that names the event);
/// `kernel_mode`: whether the event counts kernel mode. A refusal that
/// neither the paranoid level nor a missing CAP_PERFMON explains is a
/// seccomp filter's (a container's) or a security module's.
pub fn perf_open_refusal(e: i32, kernel_mode: bool, rights: &PerfRights) -> String {
    let paranoid = &rights.paranoid;
    match e {
        libc::ENOSYS => "not implemented here (ENOSYS: no perf events; qemu-user has none)".into(),
        libc::EACCES | libc::EPERM if rights.perfmon => "refused by a seccomp filter (a container's?) or a security module: this process has CAP_PERFMON".into(),
        libc::EACCES | libc::EPERM => match paranoid.parse::<i32>() {
            Ok(p) if p >= 3 => format!(
                "refused: perf_event_paranoid {p} allows none without CAP_PERFMON (sysctl kernel.perf_event_paranoid=2 allows user mode)"
            ),
            Ok(2) if kernel_mode => "refused: perf_event_paranoid 2 allows counting kernel mode only with CAP_PERFMON (or sysctl kernel.perf_event_paranoid=1)".into(),
            Ok(p) => format!(
                "refused by a seccomp filter (a container's?) or a security module: perf_event_paranoid {p} allows it"
            ),
            Err(_) => format!(
                "refused (perf_event_paranoid unreadable: {paranoid}): CAP_PERFMON allows it"
            ),
        },
        libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP => format!(
            "not supported here (errno {e}: this machine's PMU does not count it, or the PMU cannot sample; virtual machines often have no hardware PMU)"
        ),
        libc::EINVAL => "the kernel refused its attributes (EINVAL: a term out of range, or a kernel without sigtrap perf events, Linux 5.13+)".into(),
        libc::EMFILE | libc::ENFILE => format!("no descriptor left (errno {e})"),
        _ => format!("perf_event_open failed (errno {e})"),
    }
}

/// `struct perf_event_attr`, 136 bytes (PERF_ATTR_SIZE_VER8): the fields
/// igprof sets by name, the rest zero. `size` tells the kernel how much of
/// it to read (a shorter, older layout such as [`PERF_ATTR_SIZE_VER0`] is
/// accepted by every kernel; a longer one by kernels that know it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfEventAttr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub rest: [u64; 9],
}

const _: () = assert!(core::mem::size_of::<PerfEventAttr>() == 136);

/// The first published perf_event_attr layout, up to `config1`.
pub const PERF_ATTR_SIZE_VER0: u32 = 64;

pub const PERF_TYPE_SOFTWARE: u32 = 1;

pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;

const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;

const PERF_FLAG_FD_CLOEXEC: u64 = 8;

const FLAG_DISABLED: u64 = 1 << 0;

const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;

const FLAG_EXCLUDE_HV: u64 = 1 << 6;

const FLAG_REMOVE_ON_EXEC: u64 = 1 << 36;

const FLAG_SIGTRAP: u64 = 1 << 37;

/// Index of `sig_data` (byte 120 of the attr) in [`PerfEventAttr::rest`].
const REST_SIG_DATA: usize = 7;

/// `si_code` of a SIGTRAP raised by a perf event with `sigtrap` set.
pub const TRAP_PERF: i32 = 6;

const PERF_EVENT_IOC_ENABLE: u64 = 0x2400;

const PERF_EVENT_IOC_PERIOD: u64 = 0x4008_2404;

const F_SETSIG: i32 = 10;

const F_SETOWN_EX: i32 = 15;

const F_OWNER_TID: i32 = 0;

/// Size of the ring buffer mapped on each sampling perf event: the control
/// page and one data page.
pub const PERF_RING_BYTES: usize = 2 * 4096;

/// perf_event_open(2) with a close-on-exec descriptor and no group: the
/// descriptor or the errno (EINVAL for an `attr.size` beyond the struct).
pub fn perf_event_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> Result<i32, Errno> {
    perf_event_open_in(attr, pid, cpu, -1)
}

/// [`perf_event_open`] as a member of the group whose leader is `group_fd`
/// (-1: a new group).
fn perf_event_open_in(
    attr: &PerfEventAttr,
    pid: i32,
    cpu: i32,
    group_fd: i32,
) -> Result<i32, Errno> {
    if attr.size as usize > core::mem::size_of::<PerfEventAttr>() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: attr is a valid perf_event_attr with at least `size` bytes;
    // the other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid,
            cpu,
            group_fd,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        Err(Errno::last())
    } else {
        Ok(fd as i32)
    }
}

/// How a sampling perf event's overflow reaches its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfDelivery {
    /// `attr.sigtrap`: the kernel raises SIGTRAP (si_code [`TRAP_PERF`],
    /// `si_perf_data` = `cookie`) in the thread itself, from task work on its
    /// way back to user space. No ring buffer, no wake-up interrupt. Linux
    /// 5.13+; the event is removed at exec (the kernel requires it).
    Sigtrap { cookie: u64 },
    /// A ring buffer whose wake-up (every sample) sends `signo` to the
    /// thread through fasync (F_SETOWN_EX). Costs an extra interrupt per
    /// sample (irq_work), which a VM turns into exits.
    Fasync { signo: i32 },
}

/// A per-thread task-clock perf event that signals thread `tid` (the
/// caller: sigtrap events may only target their own thread) every
/// `period_ns` of its CPU time, as `how` says; kernel-mode samples are
/// skipped with `user_only`. hrtimer-driven, so not limited to the
/// scheduler tick like POSIX CPU-clock timers; no system call per sample.
/// The event starts disabled ([`perf_enable`]). The descriptor is moved up
/// to `min_fd` or above so that it does not take the low numbers the
/// program expects. Returns (fd, ring mapping or 0) or the errno.
pub fn perf_task_clock_open(
    tid: i32,
    period_ns: u64,
    user_only: bool,
    how: PerfDelivery,
    min_fd: i32,
) -> Result<(i32, usize), Errno> {
    let mut attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_TASK_CLOCK,
        sample_period: period_ns,
        flags: FLAG_DISABLED | FLAG_EXCLUDE_HV | if user_only { FLAG_EXCLUDE_KERNEL } else { 0 },
        ..Default::default()
    };
    match how {
        PerfDelivery::Sigtrap { cookie } => {
            attr.flags |= FLAG_SIGTRAP | FLAG_REMOVE_ON_EXEC;
            attr.rest[REST_SIG_DATA] = cookie;
        }
        PerfDelivery::Fasync { .. } => attr.wakeup_events = 1,
    }
    let fd = perf_event_open(&attr, tid, -1)?;
    let fd = if min_fd > 0 {
        move_fd_up(fd, min_fd)
    } else {
        fd
    };
    match how {
        PerfDelivery::Fasync { signo } => fasync(fd, tid, signo).map(|ring| (fd, ring)),
        PerfDelivery::Sigtrap { .. } => Ok((fd, 0)),
    }
}

/// Makes sampling event `fd` signal thread `tid` with `signo` at every
/// sample: a read-only (overwrite-mode) ring whose wake-up (wakeup_events
/// = 1) sends the signal through fasync (F_SETOWN_EX to the thread, the
/// descriptor in `si_fd`). Returns the ring mapping; on failure closes
/// `fd` and returns the errno.
fn fasync(fd: i32, tid: i32, signo: i32) -> Result<usize, Errno> {
    // SAFETY: fcntl/mmap/munmap/close on our own descriptor with valid arguments.
    unsafe {
        let fail = |fd: i32, ring: usize| {
            let e = Errno::last();
            if ring != 0 {
                libc::syscall(libc::SYS_munmap, ring, PERF_RING_BYTES);
            }
            libc::syscall(libc::SYS_close, fd);
            Err(e)
        };
        let ring = libc::syscall(
            libc::SYS_mmap,
            core::ptr::null_mut::<c_void>(),
            PERF_RING_BYTES,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd as libc::c_long,
            0 as libc::c_long,
        );
        if ring < 0 {
            return fail(fd, 0);
        }
        let ring = ring as usize;
        let owner = [F_OWNER_TID, tid];
        if libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFL, libc::O_ASYNC) < 0
            || libc::syscall(libc::SYS_fcntl, fd, F_SETSIG, signo) < 0
            || libc::syscall(libc::SYS_fcntl, fd, F_SETOWN_EX, owner.as_ptr()) < 0
        {
            return fail(fd, ring);
        }
        Ok(ring)
    }
}

/// A per-thread sampling event of `kind` on the calling thread `tid`
/// whose every sample signals it with `signo` through fasync (for kernels
/// without sigtrap events, or `--sampler sigprof`): the descriptor, moved
/// to `min_fd` or above (kept: the signal names it), and its ring mapping.
/// Starts disabled ([`perf_enable`]).
pub fn perf_fasync_open(
    kind: &PerfEventKind,
    tid: i32,
    period: u64,
    signo: i32,
    min_fd: i32,
) -> Result<(i32, usize), Errno> {
    let mut attr = sigtrap_attr(kind, period, 0);
    attr.flags &= !(FLAG_SIGTRAP | FLAG_REMOVE_ON_EXEC);
    attr.wakeup_events = 1;
    let fd = move_fd_up(perf_event_open(&attr, tid, -1)?, min_fd);
    fasync(fd, tid, signo).map(|ring| (fd, ring))
}

/// What a [`perf_sigtrap_open`] event counts: the attr fields an event
/// specification decides (`-e`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfEventKind {
    pub type_: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    /// Skid constraint, 0 to 3.
    pub precise_ip: u8,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    pub exclude_hv: bool,
    /// Each sample's data address (`PERF_SAMPLE_ADDR`: the faulting
    /// address of a page fault), delivered as the SIGTRAP's `si_addr`.
    pub sample_addr: bool,
    /// Each sample's raw PMU data (`PERF_SAMPLE_RAW`: AMD IBS registers),
    /// written to the event's ring buffer ([`perf_map_ring`]).
    pub sample_raw: bool,
    /// The period is a frequency (samples per second), the kernel varying
    /// the period to keep it (`attr.freq`).
    pub freq: bool,
}

const FLAG_EXCLUDE_USER: u64 = 1 << 4;

const FLAG_FREQ: u64 = 1 << 10;

const FLAG_PRECISE_SHIFT: u32 = 15;

const PERF_SAMPLE_ADDR: u64 = 1 << 3;

const PERF_SAMPLE_RAW: u64 = 1 << 10;

/// Index of `config2` (byte 64 of the attr) in [`PerfEventAttr::rest`].
const REST_CONFIG2: usize = 0;

/// A per-thread event of `kind` on the calling thread `tid` that raises
/// SIGTRAP (si_perf_data `cookie`) in it every `period` events, from task
/// work on its way back to user space; removed at exec. Starts disabled
/// ([`perf_enable`]). The descriptor or the errno.
pub fn perf_sigtrap_open(
    kind: &PerfEventKind,
    tid: i32,
    period: u64,
    cookie: u64,
) -> Result<i32, Errno> {
    perf_event_open(&sigtrap_attr(kind, period, cookie), tid, -1)
}

/// The attr of a [`perf_sigtrap_open`] event.
pub fn sigtrap_attr(kind: &PerfEventKind, period: u64, cookie: u64) -> PerfEventAttr {
    let mut attr = PerfEventAttr {
        type_: kind.type_,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: kind.config,
        sample_period: period,
        sample_type: if kind.sample_addr {
            PERF_SAMPLE_ADDR
        } else {
            0
        } | if kind.sample_raw { PERF_SAMPLE_RAW } else { 0 },
        flags: FLAG_DISABLED
            | FLAG_SIGTRAP
            | FLAG_REMOVE_ON_EXEC
            | (kind.precise_ip.min(3) as u64) << FLAG_PRECISE_SHIFT
            | if kind.freq { FLAG_FREQ } else { 0 }
            | kind.exclude_flags(),
        config1: kind.config1,
        ..Default::default()
    };
    attr.rest[REST_CONFIG2] = kind.config2;
    attr.rest[REST_SIG_DATA] = cookie;
    attr
}

impl PerfEventKind {
    /// Why this event did not open with errno `e`
    /// ([`perf_open_refusal`] for its mode and this process's rights).
    pub fn refusal(&self, e: i32) -> String {
        perf_open_refusal(e, !self.exclude_kernel, &PerfRights::of_this_process())
    }

    /// The attr flags of the privilege levels this kind leaves out.
    fn exclude_flags(&self) -> u64 {
        let bit = |on: bool, flag: u64| if on { flag } else { 0 };
        bit(self.exclude_user, FLAG_EXCLUDE_USER)
            | bit(self.exclude_kernel, FLAG_EXCLUDE_KERNEL)
            | bit(self.exclude_hv, FLAG_EXCLUDE_HV)
    }
}

/// `read_format` of a counting group: `nr, time_enabled, time_running,
/// value[nr]` in one read of its leader.
const READ_FORMAT_GROUP: u64 = 1 | 2 | 8;

const PERF_IOC_FLAG_GROUP: u64 = 1;

/// A counting (not sampling) event of `kind` on the calling thread `tid`,
/// in the group led by `leader` (-1: it leads a new group, which starts
/// disabled: [`perf_enable_group`]). The descriptor or the errno.
pub fn perf_counter_open(kind: &PerfEventKind, tid: i32, leader: i32) -> Result<i32, Errno> {
    let mut attr = PerfEventAttr {
        type_: kind.type_,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: kind.config,
        read_format: READ_FORMAT_GROUP,
        flags: if leader < 0 { FLAG_DISABLED } else { 0 } | kind.exclude_flags(),
        config1: kind.config1,
        ..Default::default()
    };
    attr.rest[REST_CONFIG2] = kind.config2;
    perf_event_open_in(&attr, tid, -1, leader)
}

/// The count of a single event (no read_format) by `read(2)`.
/// Async-signal-safe.
pub fn perf_read_count(fd: i32) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into our own u64.
    let got = unsafe { libc::syscall(libc::SYS_read, fd, &mut v as *mut u64, 8) };
    (got == 8).then_some(v)
}

/// Starts a group opened by [`perf_counter_open`], all its members at once.
pub fn perf_enable_group(leader: i32) -> bool {
    // SAFETY: ioctl on our own perf descriptor.
    unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            leader,
            PERF_EVENT_IOC_ENABLE,
            PERF_IOC_FLAG_GROUP as libc::c_ulong,
        ) == 0
    }
}

/// Reads a counting group of `n` events through its leader: (time
/// enabled, time running, counts) into `out[..n]`; false if the read
/// failed. Async-signal-safe.
pub fn perf_read_group(leader: i32, out: &mut [u64]) -> Option<(u64, u64)> {
    let mut buf = [0u64; 3 + 16];
    let n = out.len().min(16);
    let want = (3 + n) * 8;
    // SAFETY: reading into our own buffer of `want` bytes or more.
    let got = unsafe { libc::syscall(libc::SYS_read, leader, buf.as_mut_ptr(), want) };
    if got != want as libc::c_long || buf[0] as usize != n {
        return None;
    }
    out[..n].copy_from_slice(&buf[3..3 + n]);
    Some((buf[1], buf[2]))
}

const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;

/// A per-thread perf event on the calling thread `tid` that raises SIGTRAP
/// (si_perf_data `cookie`) after every context switch away from it, when
/// it next returns to user space: from task work, so a blocking system
/// call is never interrupted (the signal comes once it has returned).
/// Enabled from the start; the descriptor is the caller's to hold.
pub fn perf_switch_open(tid: i32, cookie: u64) -> Result<i32, Errno> {
    let mut attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CONTEXT_SWITCHES,
        sample_period: 1,
        flags: FLAG_EXCLUDE_HV | FLAG_SIGTRAP | FLAG_REMOVE_ON_EXEC,
        ..Default::default()
    };
    attr.rest[REST_SIG_DATA] = cookie;
    perf_event_open(&attr, tid, -1)
}

/// Bytes of the mapping that holds a perf event without its descriptor.
const PERF_HOLD_BYTES: usize = 4096;

/// Keeps the perf event of `fd` alive without the descriptor: maps its
/// control page (a mapping holds a reference to the event's file), so the
/// caller can close `fd` and the program sees no descriptor of ours.
/// Returns the mapping, or the errno (e.g. EPERM past the locked-memory
/// limit for perf mappings).
pub fn perf_hold(fd: i32) -> Result<usize, Errno> {
    perf_map(fd, PERF_HOLD_BYTES, libc::PROT_READ)
}

/// mmap(2) of `bytes` of our perf descriptor `fd`, shared, with `prot`.
fn perf_map(fd: i32, bytes: usize, prot: i32) -> Result<usize, Errno> {
    // SAFETY: mapping our own perf descriptor, shared.
    let m = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            core::ptr::null_mut::<c_void>(),
            bytes,
            prot,
            libc::MAP_SHARED,
            fd as libc::c_long,
            0 as libc::c_long,
        )
    };
    if m < 0 {
        Err(Errno::last())
    } else {
        Ok(m as usize)
    }
}

/// Maps the ring buffer of the perf event of `fd`: its control page and
/// `bytes` - 4096 of data (a power of two pages), writable so that the
/// reader can say how far it read (`data_tail`). Like [`perf_hold`], the
/// mapping keeps the event alive once `fd` is closed. The mapping or the
/// errno.
pub fn perf_map_ring(fd: i32, bytes: usize) -> Result<usize, Errno> {
    perf_map(fd, bytes, libc::PROT_READ | libc::PROT_WRITE)
}

/// Unmaps a ring mapped by [`perf_map_ring`] with the same `bytes`.
pub fn perf_unmap_ring(ring: usize, bytes: usize) {
    // SAFETY: unmapping our own perf mapping, no longer used.
    unsafe { libc::syscall(libc::SYS_munmap, ring, bytes) };
}

/// Ends a perf event held by [`perf_hold`] (its last reference).
pub fn perf_release(hold: usize) {
    // SAFETY: unmapping our own perf mapping, no longer used.
    unsafe { libc::syscall(libc::SYS_munmap, hold, PERF_HOLD_BYTES) };
}

/// Starts a perf event opened by [`perf_task_clock_open`].
pub fn perf_enable(fd: i32) -> bool {
    // SAFETY: ioctl on our own perf descriptor.
    unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            fd,
            PERF_EVENT_IOC_ENABLE,
            0 as libc::c_ulong,
        ) == 0
    }
}

/// Changes the sampling period of a perf event (from its next sample on).
#[link_section = "igprof_hot"]
pub fn perf_set_period(fd: i32, period_ns: u64) {
    let p = period_ns;
    // SAFETY: ioctl on our own perf descriptor with a valid argument.
    unsafe { libc::syscall(libc::SYS_ioctl, fd, PERF_EVENT_IOC_PERIOD, &p) };
}

/// Closes a sampling perf event and unmaps its ring.
pub fn perf_close(fd: i32, ring: usize) {
    // SAFETY: our own mapping and descriptor, no longer used.
    unsafe {
        if ring != 0 {
            libc::syscall(libc::SYS_munmap, ring, PERF_RING_BYTES);
        }
        libc::syscall(libc::SYS_close, fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rights(paranoid: &str, perfmon: bool) -> PerfRights {
        PerfRights {
            paranoid: paranoid.into(),
            perfmon,
        }
    }

    #[test]
    fn a_refusal_names_the_paranoid_level_or_what_else_refused_it() {
        for e in [libc::EACCES, libc::EPERM] {
            let kernel = perf_open_refusal(e, true, &rights("2", false));
            assert!(
                kernel.starts_with(
                    "refused: perf_event_paranoid 2 allows counting kernel mode only with CAP_PERFMON"
                ),
                "{kernel}"
            );
            assert!(rights("2", false).refused_kernel_mode(e));
            assert!(!rights("2", true).refused_kernel_mode(e));
            for (p, kernel_mode) in [("3", false), ("4", true)] {
                let none = perf_open_refusal(e, kernel_mode, &rights(p, false));
                assert!(
                    none.starts_with(&format!(
                        "refused: perf_event_paranoid {p} allows none without CAP_PERFMON"
                    )),
                    "{none}"
                );
                assert!(!rights(p, false).refused_kernel_mode(e));
            }
            for (p, kernel_mode) in [("2", false), ("1", true), ("-1", true)] {
                let filter = perf_open_refusal(e, kernel_mode, &rights(p, false));
                assert!(
                    filter.starts_with("refused by a seccomp filter"),
                    "{filter}"
                );
                assert!(
                    filter.ends_with(&format!("perf_event_paranoid {p} allows it")),
                    "{filter}"
                );
            }
            // CAP_PERFMON: no level refuses it.
            for p in ["2", "3", "?"] {
                let filter = perf_open_refusal(e, true, &rights(p, true));
                assert!(
                    filter.starts_with("refused by a seccomp filter")
                        && filter.ends_with("this process has CAP_PERFMON"),
                    "{filter}"
                );
            }
            let unread = perf_open_refusal(e, true, &rights("?", false));
            assert!(unread.contains("unreadable: ?"), "{unread}");
        }
        assert!(!rights("2", false).refused_kernel_mode(libc::EINVAL));
        let none = rights("2", false);
        for e in [libc::ENOENT, libc::ENODEV, libc::EOPNOTSUPP] {
            let s = perf_open_refusal(e, false, &none);
            assert!(
                s.starts_with(&format!("not supported here (errno {e}:")),
                "{s}"
            );
        }
        assert!(perf_open_refusal(libc::ENOSYS, true, &none).contains("qemu-user"));
        assert!(perf_open_refusal(libc::EINVAL, true, &none).contains("Linux 5.13+"));
        for e in [libc::EMFILE, libc::ENFILE] {
            assert_eq!(
                perf_open_refusal(e, false, &none),
                format!("no descriptor left (errno {e})")
            );
        }
        assert_eq!(
            perf_open_refusal(libc::EBUSY, false, &none),
            format!("perf_event_open failed (errno {})", libc::EBUSY)
        );
    }

    #[test]
    fn paranoid_is_the_sysctl_or_a_question_mark() {
        let p = perf_event_paranoid();
        match std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid") {
            Ok(s) => assert_eq!(p, s.trim()),
            Err(_) => assert_eq!(p, "?"),
        }
    }

    /// The bytes of a sampling event's attr, field by field at the offsets
    /// of include/uapi/linux/perf_event.h (`struct perf_event_attr`,
    /// PERF_ATTR_SIZE_VER8), against what `sigtrap_attr` builds.
    #[test]
    fn sigtrap_attr_is_byte_exact() {
        let kind = PerfEventKind {
            type_: 4,
            config: 0x01c0,
            config1: 0x10001,
            config2: 7,
            precise_ip: 2,
            exclude_user: false,
            exclude_kernel: true,
            exclude_hv: true,
            sample_addr: true,
            sample_raw: true,
            freq: false,
        };
        let attr = sigtrap_attr(&kind, 100_000, 0x6967_7072_6f66_6503);
        // SAFETY: PerfEventAttr is plain data of 136 bytes (asserted).
        let got: [u8; 136] = unsafe { core::mem::transmute(attr) };
        let mut want = [0u8; 136];
        let mut put = |at: usize, bytes: &[u8]| want[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &4u32.to_le_bytes()); // type
        put(4, &136u32.to_le_bytes()); // size
        put(8, &0x01c0u64.to_le_bytes()); // config
        put(16, &100_000u64.to_le_bytes()); // sample_period
        put(24, &(8u64 | 1 << 10).to_le_bytes()); // sample_type: PERF_SAMPLE_ADDR | RAW
                                                  // disabled (bit 0), exclude_kernel (5), exclude_hv (6),
                                                  // precise_ip 2 (bits 15-16), remove_on_exec (36), sigtrap (37).
        put(
            40,
            &(1u64 | 1 << 5 | 1 << 6 | 2 << 15 | 1 << 36 | 1 << 37).to_le_bytes(),
        );
        put(56, &0x10001u64.to_le_bytes()); // config1
        put(64, &7u64.to_le_bytes()); // config2
        put(120, &0x6967_7072_6f66_6503u64.to_le_bytes()); // sig_data
        assert_eq!(got, want);

        // A frequency: the freq bit (10), sample_freq in the period's place.
        let f = sigtrap_attr(
            &PerfEventKind {
                freq: true,
                ..PerfEventKind::default()
            },
            999,
            0,
        );
        assert_eq!((f.flags & (1 << 10), f.sample_period), (1 << 10, 999));
    }
}
