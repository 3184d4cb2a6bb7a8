//! Raw system calls used by the runtime, gathered in one place.
//!
//! Owns every direct `syscall(2)` of the runtime (write, mmap, timers, tids,
//! signals to self). Each wrapper is async-signal-safe: it goes straight to
//! the kernel, takes no lock and allocates nothing. Callers that run inside
//! a signal handler save and restore `errno` themselves ([`ErrnoGuard`]).
//! Must never: call into libc functions that may lock or allocate.

use core::ffi::c_void;

/// Restores `errno` when dropped, so hooks and handlers leave it untouched.
/// Keeps the thread's errno slot, so a hook finds it once.
pub struct ErrnoGuard {
    slot: *mut i32,
    value: i32,
}

impl ErrnoGuard {
    #[inline]
    pub fn save() -> Self {
        let slot = errno_slot();
        // SAFETY: the calling thread's errno slot (`errno_slot`), valid for
        // the lifetime of the thread; the guard is dropped on the thread
        // that made it (it is not Send: it holds a raw pointer).
        let value = unsafe { *slot };
        ErrnoGuard { slot, value }
    }
}

impl Drop for ErrnoGuard {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `save`: this thread's slot, the thread still runs.
        unsafe { *self.slot = self.value };
    }
}

/// The error number of a failed system call: what `errno` held after it,
/// or what a wrapper of this file returned for it. Shown as the bare
/// number ("errno 13" reads as before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's last error number ([`errno`]).
    pub fn last() -> Errno {
        Errno(errno())
    }
}

impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The last OS error number of this thread.
pub fn errno() -> i32 {
    // SAFETY: see ErrnoGuard::save.
    unsafe { *errno_slot() }
}

/// errno's offset from the thread pointer, once [`learn_errno_offset`]
/// found it (`NO_OFFSET` before).
static ERRNO_OFFSET: core::sync::atomic::AtomicIsize =
    core::sync::atomic::AtomicIsize::new(NO_OFFSET);
const NO_OFFSET: isize = isize::MIN;

/// The calling thread's errno. glibc's errno is an initial-exec TLS
/// variable of libc.so: `__errno_location` adds one constant, the same for
/// every thread, to the thread pointer. That constant is learnt once
/// ([`learn_errno_offset`]) and added here, without the call through the
/// PLT (two per allocation and free: 1.3% of a profiled perl's time).
#[inline(always)]
fn errno_slot() -> *mut i32 {
    let off = ERRNO_OFFSET.load(core::sync::atomic::Ordering::Relaxed);
    if off == NO_OFFSET {
        // SAFETY: returns the calling thread's errno slot.
        return unsafe { libc::__errno_location() };
    }
    thread_pointer().wrapping_add_signed(off) as *mut i32
}

/// Learns errno's offset from the thread pointer (library start-up).
pub fn learn_errno_offset() {
    // SAFETY: returns the calling thread's errno slot.
    let slot = unsafe { libc::__errno_location() } as usize;
    let off = slot.wrapping_sub(thread_pointer()) as isize;
    if off != NO_OFFSET {
        ERRNO_OFFSET.store(off, core::sync::atomic::Ordering::Relaxed);
    }
}

/// The thread pointer: what glibc's TLS accesses add their offsets to.
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the thread pointer (the TCB's self-pointer at fs:0,
    // which glibc's `__errno_location` reads too); no other memory, stack
    // or flags touched.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    // SAFETY: reads tpidr_el0 into a register; nothing else touched.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
    }
    tp
}

/// write(2) until done or failed; returns false on failure.
pub fn write_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: bytes is a valid readable slice for its length.
        let n = unsafe { libc::syscall(libc::SYS_write, fd, bytes.as_ptr(), bytes.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Anonymous private read/write mapping of `len` bytes, or null.
pub fn mmap_anon(len: usize) -> *mut u8 {
    map_anon(len, false).unwrap_or(core::ptr::null_mut())
}

/// Anonymous private read/write mapping of `len` bytes (zero-filled;
/// faulted in now with `populate`, so that a signal handler never takes the
/// page faults of first use): its address, or the errno of the failure.
pub fn map_anon(len: usize, populate: bool) -> Result<*mut u8, i32> {
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: an anonymous mapping has no preconditions beyond its arguments.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            core::ptr::null_mut::<c_void>(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1 as libc::c_long,
            0 as libc::c_long,
        )
    };
    if p < 0 {
        Err(errno())
    } else {
        Ok(p as *mut u8)
    }
}

/// Transparent huge pages' size on x86-64 and on AArch64 with 4 KiB pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// [`mmap_anon`] for a region of at least [`HUGE_PAGE`] bytes that will be
/// filled from its start (a call tree's nodes): aligned to 2 MiB and marked
/// `MADV_HUGEPAGE`, so that where transparent huge pages are enabled
/// ("always" or "madvise") each 2 MiB costs one page fault instead of 512
/// (a twentieth of the time), and a fraction of the teardown at exit.
/// Where they are not, the same as [`mmap_anon`]. Null on failure.
pub fn mmap_anon_huge(len: usize) -> *mut u8 {
    const MADV_HUGEPAGE: libc::c_long = 14;
    let raw = mmap_anon(len + HUGE_PAGE);
    if raw.is_null() {
        return raw;
    }
    let start = (raw as usize).next_multiple_of(HUGE_PAGE);
    // Less than HUGE_PAGE before `start`, so the rest of it after the end.
    let head = start - raw as usize;
    // SAFETY: both pieces lie in the mapping just made, outside
    // [start, start + len), and nothing refers to them.
    unsafe {
        if head > 0 {
            munmap(raw, head);
        }
        munmap((start + len) as *mut u8, HUGE_PAGE - head);
    }
    let _errno = ErrnoGuard::save();
    // SAFETY: advice on our own mapping; a kernel without THP refuses it.
    unsafe { libc::syscall(libc::SYS_madvise, start, len, MADV_HUGEPAGE) };
    start as *mut u8
}

/// Faults in the whole pages of `p..p+len` for writing, in one system
/// call (`MADV_POPULATE_WRITE`, Linux 5.14): for a table about to be
/// filled at random places, whose pages would otherwise each take two
/// faults (a read maps the zero page, the first write copies it). Does
/// nothing where the kernel does not have it. Errno is kept.
pub fn populate_write(p: *mut u8, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_long = 23;
    let page = 4096;
    let (start, end) = (
        (p as usize).next_multiple_of(page),
        (p as usize + len) & !(page - 1),
    );
    if start < end {
        let _e = ErrnoGuard::save();
        // SAFETY: advice on pages of a mapping of ours; populating changes
        // no contents (zero pages stay zero).
        unsafe { libc::syscall(libc::SYS_madvise, start, end - start, MADV_POPULATE_WRITE) };
    }
}

/// munmap(2).
///
/// # Safety
/// `p..p+len` must be a mapping made by [`mmap_anon`] that nothing uses any more.
pub unsafe fn munmap(p: *mut u8, len: usize) {
    libc::syscall(libc::SYS_munmap, p, len);
}

/// mremap(2) with MREMAP_MAYMOVE; null on failure.
///
/// # Safety
/// `p..p+old` must be a mapping made by [`mmap_anon`].
pub unsafe fn mremap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
    let r = libc::syscall(libc::SYS_mremap, p, old, new, libc::MREMAP_MAYMOVE);
    if r < 0 {
        core::ptr::null_mut()
    } else {
        r as *mut u8
    }
}

pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// The pid of the process whose profile this one writes: its own, except
/// in the keeper (process/keeper/), which writes a dead program's.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    let own = unsafe { libc::syscall(libc::SYS_getpid) as i32 };
    let [keeper, program] = &STANDS_FOR;
    if own == keeper.load(core::sync::atomic::Ordering::Relaxed) {
        program.load(core::sync::atomic::Ordering::Relaxed)
    } else {
        own
    }
}

/// The keeper's pid and the program's whose profile it writes (0: none).
static STANDS_FOR: [core::sync::atomic::AtomicI32; 2] = [
    core::sync::atomic::AtomicI32::new(0),
    core::sync::atomic::AtomicI32::new(0),
];

/// In the keeper, once the program is gone: [`getpid`] answers `program`.
pub fn stand_for(program: i32) {
    // SAFETY: getpid has no arguments and cannot fail.
    let own = unsafe { libc::syscall(libc::SYS_getpid) as i32 };
    STANDS_FOR[1].store(program, core::sync::atomic::Ordering::Relaxed);
    STANDS_FOR[0].store(own, core::sync::atomic::Ordering::Relaxed);
}

pub fn sched_yield() {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_sched_yield) };
}

/// Takes a spin lock (`false` = free): spins briefly, then yields the CPU
/// between attempts, so a holder that was preempted can finish. For the
/// profiler's short critical sections (a few loads and stores).
pub fn spin_lock(lock: &core::sync::atomic::AtomicBool) {
    use core::sync::atomic::Ordering;
    let mut spins = 0u32;
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins > 64 {
            sched_yield();
        } else {
            core::hint::spin_loop();
        }
    }
}

fn timespec_ns(ts: &libc::timespec) -> u64 {
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds of `clock` through clock_gettime(2) as a system call.
fn syscall_clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clock, &mut ts) };
    timespec_ns(&ts)
}

/// Nanoseconds of `clock` through the vDSO (no system call for the
/// ordinary clocks; clock_gettime is async-signal-safe), or None when the
/// clock is invalid (such as the CPU clock of a thread that is gone).
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; a bad clock id is an error return.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| timespec_ns(&ts))
}

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    syscall_clock_ns(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds of CLOCK_MONOTONIC through the vDSO (no system call).
#[inline]
pub fn fast_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// CPU time of the calling thread in nanoseconds (clock_gettime of
/// CLOCK_THREAD_CPUTIME_ID: a system call, async-signal-safe).
pub fn thread_cpu_ns() -> u64 {
    syscall_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// User CPU time of the calling thread in nanoseconds (getrusage RUSAGE_THREAD).
pub fn thread_user_ns() -> u64 {
    // SAFETY: rusage is plain data; the kernel fills it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    unsafe { libc::syscall(libc::SYS_getrusage, libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_utime.tv_sec as u64 * 1_000_000_000 + ru.ru_utime.tv_usec as u64 * 1000
}

/// The clock id of thread `tid`'s CPU-time clock (the kernel's
/// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)); any thread of the process
/// may read it.
pub fn thread_cpu_clock(tid: i32) -> libc::clockid_t {
    ((!(tid as libc::clockid_t)) << 3) | 4 | 2
}

/// The kernel's `struct sigevent` (64 bytes) for SIGEV_THREAD_ID timers.
#[repr(C)]
struct KernelSigevent {
    value: u64,
    signo: i32,
    notify: i32,
    tid: i32,
    pad: [i32; 11],
}

const SIGEV_THREAD_ID: i32 = 4;

/// A kernel POSIX timer that sends `signo` to thread `tid` when `clock`
/// expires. Returns the kernel timer id or the errno.
pub fn timer_create_for_thread(
    clock: libc::clockid_t,
    signo: i32,
    tid: i32,
    value: u64,
) -> Result<i32, i32> {
    let mut ev = KernelSigevent {
        value: 0,
        signo,
        notify: SIGEV_THREAD_ID,
        tid,
        pad: [0; 11],
    };
    let mut id: i32 = -1;
    ev.value = value;
    // SAFETY: ev and id are valid for the call; the kernel copies ev.
    let r = unsafe { libc::syscall(libc::SYS_timer_create, clock, &mut ev, &mut id) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(id)
    }
}

/// Arms `timer` once, `ns` from now (no interval: the handler re-arms).
pub fn timer_arm_once(timer: i32, ns: u64) -> bool {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: (ns / 1_000_000_000) as i64,
            tv_nsec: (ns % 1_000_000_000) as i64,
        },
    };
    // SAFETY: spec is valid; a null old-value pointer is allowed.
    unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            timer,
            0,
            &spec,
            core::ptr::null_mut::<c_void>(),
        ) == 0
    }
}

pub fn timer_delete(timer: i32) {
    // SAFETY: deleting an unknown id only returns EINVAL.
    unsafe { libc::syscall(libc::SYS_timer_delete, timer) };
}

/// Sends `sig` to thread `tid` of this process.
pub fn tgkill(tid: i32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::syscall(libc::SYS_tgkill, getpid(), tid, sig) };
}

/// Whether the thread `tid` of this process still exists: false only when
/// `tgkill(pid, tid, 0)` fails with ESRCH (the task is gone and runs no more
/// code). Leaves errno as it was.
pub fn thread_alive(tid: i32) -> bool {
    let _e = ErrnoGuard::save();
    // SAFETY: plain syscall; signal 0 only checks that the target exists.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, getpid(), tid, 0) };
    r == 0 || errno() != libc::ESRCH
}

/// rt_sigprocmask(2) directly (bypasses any hook on the libc functions).
///
/// # Safety
/// `set` and `old` must be null or valid `sigset_t`.
pub unsafe fn rt_sigprocmask(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> i32 {
    libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8) as i32
}

/// Opens `path` (NUL-terminated) with `flags` and `mode`; fd or -errno.
pub fn open(path: &[u8], flags: i32, mode: u32) -> i32 {
    debug_assert!(path.last() == Some(&0));
    // SAFETY: path is NUL-terminated.
    let r = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), flags, mode) };
    if r < 0 {
        -errno()
    } else {
        r as i32
    }
}

pub fn close(fd: i32) {
    // SAFETY: closing our own descriptor.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Whether `path` (NUL-terminated) exists (faccessat F_OK).
pub fn exists(path: &[u8]) -> bool {
    // SAFETY: path is NUL-terminated.
    unsafe {
        libc::syscall(
            libc::SYS_faccessat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::F_OK,
            0,
        ) == 0
    }
}

/// rename(2) of NUL-terminated paths.
pub fn rename(from: &[u8], to: &[u8]) -> bool {
    // SAFETY: both paths are NUL-terminated.
    unsafe {
        libc::syscall(
            libc::SYS_renameat,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
        ) == 0
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
pub fn perf_event_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> Result<i32, i32> {
    perf_event_open_in(attr, pid, cpu, -1)
}

/// [`perf_event_open`] as a member of the group whose leader is `group_fd`
/// (-1: a new group).
fn perf_event_open_in(attr: &PerfEventAttr, pid: i32, cpu: i32, group_fd: i32) -> Result<i32, i32> {
    if attr.size as usize > core::mem::size_of::<PerfEventAttr>() {
        return Err(libc::EINVAL);
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
        Err(errno())
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

/// Our descriptor `fd` moved to the lowest free number at or above
/// `min_fd` (close-on-exec), out of the way of programs that expect the
/// lowest numbers; `fd` itself if that is refused.
pub fn move_fd_up(fd: i32, min_fd: i32) -> i32 {
    // SAFETY: fcntl and close on our own descriptor.
    unsafe {
        let high = libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, min_fd);
        if high < 0 {
            return fd;
        }
        libc::syscall(libc::SYS_close, fd);
        high as i32
    }
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
) -> Result<(i32, usize), i32> {
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
fn fasync(fd: i32, tid: i32, signo: i32) -> Result<usize, i32> {
    // SAFETY: fcntl/mmap/munmap/close on our own descriptor with valid arguments.
    unsafe {
        let fail = |fd: i32, ring: usize| {
            let e = errno();
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
) -> Result<(i32, usize), i32> {
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
) -> Result<i32, i32> {
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
            | if kind.exclude_user {
                FLAG_EXCLUDE_USER
            } else {
                0
            }
            | if kind.exclude_kernel {
                FLAG_EXCLUDE_KERNEL
            } else {
                0
            }
            | if kind.exclude_hv { FLAG_EXCLUDE_HV } else { 0 },
        config1: kind.config1,
        ..Default::default()
    };
    attr.rest[REST_CONFIG2] = kind.config2;
    attr.rest[REST_SIG_DATA] = cookie;
    attr
}

/// `read_format` of a counting group: `nr, time_enabled, time_running,
/// value[nr]` in one read of its leader.
const READ_FORMAT_GROUP: u64 = 1 | 2 | 8;
const PERF_IOC_FLAG_GROUP: u64 = 1;

/// A counting (not sampling) event of `kind` on the calling thread `tid`,
/// in the group led by `leader` (-1: it leads a new group, which starts
/// disabled: [`perf_enable_group`]). The descriptor or the errno.
pub fn perf_counter_open(kind: &PerfEventKind, tid: i32, leader: i32) -> Result<i32, i32> {
    let mut attr = PerfEventAttr {
        type_: kind.type_,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: kind.config,
        read_format: READ_FORMAT_GROUP,
        flags: if leader < 0 { FLAG_DISABLED } else { 0 }
            | if kind.exclude_user {
                FLAG_EXCLUDE_USER
            } else {
                0
            }
            | if kind.exclude_kernel {
                FLAG_EXCLUDE_KERNEL
            } else {
                0
            }
            | if kind.exclude_hv { FLAG_EXCLUDE_HV } else { 0 },
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
pub fn perf_switch_open(tid: i32, cookie: u64) -> Result<i32, i32> {
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
pub fn perf_hold(fd: i32) -> Result<usize, i32> {
    perf_map(fd, PERF_HOLD_BYTES, libc::PROT_READ)
}

/// mmap(2) of `bytes` of our perf descriptor `fd`, shared, with `prot`.
fn perf_map(fd: i32, bytes: usize, prot: i32) -> Result<usize, i32> {
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
        Err(errno())
    } else {
        Ok(m as usize)
    }
}

/// Maps the ring buffer of the perf event of `fd`: its control page and
/// `bytes` - 4096 of data (a power of two pages), writable so that the
/// reader can say how far it read (`data_tail`). Like [`perf_hold`], the
/// mapping keeps the event alive once `fd` is closed. The mapping or the
/// errno.
pub fn perf_map_ring(fd: i32, bytes: usize) -> Result<usize, i32> {
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

/// The soft limit on open descriptors.
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid out-pointer.
    unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            core::ptr::null::<libc::rlimit>(),
            &mut r,
        )
    };
    r.rlim_cur
}

/// futex(FUTEX_WAIT_PRIVATE): sleeps while `*word == expected`, at most
/// `timeout_ns` (None: without limit). Returns on a wake, a signal, a
/// timeout or a changed word; the caller re-checks the word.
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let _e = ErrnoGuard::save();
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a valid, aligned u32 for the call; tsp null or valid.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        )
    };
}

/// futex(FUTEX_WAKE_PRIVATE): wakes every thread waiting on `word`.
pub fn futex_wake(word: &core::sync::atomic::AtomicU32) {
    let _e = ErrnoGuard::save();
    // SAFETY: word is a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

/// Sleeps `ns` nanoseconds (restarted after signals).
pub fn sleep_ns(ns: u64) {
    let _e = ErrnoGuard::save();
    let mut ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let p: *mut libc::timespec = &mut ts;
    // SAFETY: p is valid for reading the request and writing the remainder.
    while unsafe { libc::syscall(libc::SYS_nanosleep, p, p) } != 0 && errno() == libc::EINTR {}
}

/// Runs `f` on the stack `[lo, lo + len)` instead of the calling thread's
/// (which may be a 16 KiB thread stack or a small alternate signal stack),
/// and returns its result. `f` must not unwind (the library aborts on
/// panic) and must not longjmp out.
///
/// # Safety
/// `[lo, lo + len)` is mapped read/write, belongs to the caller, and is not
/// in use by anything else until this returns.
pub unsafe fn run_on_stack<F: FnOnce() -> R, R>(lo: usize, len: usize, f: F) -> R {
    struct Call<F, R> {
        f: Option<F>,
        r: Option<R>,
    }
    extern "C" fn tramp<F: FnOnce() -> R, R>(call: *mut u8) {
        // SAFETY: `call` is the Call passed below, alive for the whole switch.
        let c = unsafe { &mut *(call as *mut Call<F, R>) };
        if let Some(f) = c.f.take() {
            c.r = Some(f());
        }
    }
    let mut call = Call {
        f: Some(f),
        r: None,
    };
    let top = (lo + len) & !15;
    let data = &mut call as *mut Call<F, R> as *mut u8;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: switches rsp to the caller's stack (16-aligned top), calls
    // tramp (C ABI, data in rdi) and restores rsp from a callee-saved
    // register; every register the C ABI lets tramp clobber is declared.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {f}",
            "mov rsp, r12",
            top = in(reg) top,
            f = sym tramp::<F, R>,
            in("rdi") data,
            out("r12") _,
            clobber_abi("C"),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above for AArch64: sp switched through x20 (callee-saved),
    // tramp called with data in x0.
    unsafe {
        core::arch::asm!(
            "mov x20, sp",
            "mov sp, {top}",
            "blr {f}",
            "mov sp, x20",
            top = in(reg) top,
            f = in(reg) tramp::<F, R> as *const () as usize,
            in("x0") data,
            out("x20") _,
            clobber_abi("C"),
        );
    }
    call.r.expect("run_on_stack: the function ran")
}

/// Runs `f` on a fresh 256 KiB stack of its own (mapped for the call):
/// set-up work whose frames are large (framehop's rule cache is built by
/// value) must not run on a thread's small stack. Not signal context.
pub fn with_big_stack<R>(f: impl FnOnce() -> R) -> R {
    const LEN: usize = 256 * 1024;
    let lo = mmap_anon(LEN);
    if lo.is_null() {
        return f();
    }
    // SAFETY: a fresh mapping of LEN bytes, ours alone until unmapped.
    let r = unsafe { run_on_stack(lo as usize, LEN, f) };
    // SAFETY: the mapping made above, no longer in use.
    unsafe { munmap(lo, LEN) };
    r
}

/// The name of a signal for messages ("SIGTERM"), or "a signal".
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Errno reads as the bare number in the messages that show one.
    #[test]
    fn an_errno_shows_as_its_number() {
        assert_eq!(format!("(errno {})", Errno(libc::EACCES)), "(errno 13)");
    }

    /// errno found from the thread pointer is libc's, on the thread that
    /// learnt the offset and on others, and a guard restores it.
    #[test]
    fn errno_from_the_thread_pointer_is_libcs() {
        learn_errno_offset();
        let check = || {
            // SAFETY: the calling thread's errno slot.
            assert_eq!(errno_slot(), unsafe { libc::__errno_location() });
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = 42 };
            {
                let _g = ErrnoGuard::save();
                // SAFETY: as above.
                unsafe { *libc::__errno_location() = 7 };
                assert_eq!(errno(), 7);
            }
            assert_eq!(errno(), 42);
        };
        check();
        let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(check)).collect();
        for t in threads {
            t.join().unwrap();
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
