//! Facts about this run of the profiler in this process, set at start-up
//! (and around fork and exec) by `process/`, read by every layer: whether
//! profiling is on (and recording: `-pd` and its toggles), the process it
//! started in, the launcher's process, the
//! program's name and executable, which exec'd image of its process
//! this is, and whether the program is a Go one (cgo).
//!
//! Also the memory profiler's epoch (`--marks`), which the program
//! (`igprof_mark()`) and the watcher (`--mark-every`) move on at any time.
//!
//! Must never: change after start-up except through the process layer's
//! fork and exec paths (the epoch excepted).

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::sys;

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Whether events are recorded (`-pd`, `igprof_enable`/`igprof_disable`,
/// the toggle signal); releases of what was recorded always are.
static RECORDING: AtomicBool = AtomicBool::new(true);
static PID: AtomicI32 = AtomicI32::new(0);
/// See [`started_ns`].
static STARTED_NS: AtomicU64 = AtomicU64::new(0);
/// The pid the launcher exec'd into (IGPROF_ROOT_PID); 0 if unknown.
static ROOT_PID: AtomicI32 = AtomicI32::new(0);
/// How many profiled images this process (pid) ran before this one through
/// exec: 0 for the first.
static EXEC_GEN: AtomicU32 = AtomicU32::new(0);
/// Set while the image is about to be replaced by exec.
static EXECING: AtomicBool = AtomicBool::new(false);

/// Facts about the profiled program, fixed at start-up.
pub struct Info {
    /// The program as launched (`argv[0]`), for the header's N=().
    pub program: Vec<u8>,
    /// Absolute path of the executable (/proc/self/exe).
    pub exe: Vec<u8>,
    /// The working directory when the image started (empty if unknown):
    /// relative profile names are taken from it.
    pub start_dir: Vec<u8>,
    /// The real user id when the image started: besides the effective
    /// user, the one whose files the profile may be written into in place
    /// after the program gave up its privileges.
    pub start_uid: u32,
}

static INFO: OnceLock<Info> = OnceLock::new();

pub fn info() -> &'static Info {
    INFO.get_or_init(|| Info {
        program: b"<unknown>".to_vec(),
        exe: b"<unknown>".to_vec(),
        start_dir: Vec::new(),
        // SAFETY: getuid has no preconditions.
        start_uid: unsafe { libc::getuid() },
    })
}

pub fn set_info(i: Info) {
    let _ = INFO.set(i);
}

/// Whether this process is being profiled.
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Whether new events (samples, allocations, descriptors opened) are
/// recorded now. Async-signal-safe.
#[inline]
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Turns recording on or off; returns whether it was on. Async-signal-safe.
pub fn set_recording(on: bool) -> bool {
    RECORDING.swap(on, Ordering::AcqRel)
}

/// Profiling is on (the end of start-up).
pub fn set_active() {
    ACTIVE.store(true, Ordering::Release);
}

/// Profiling stops in this process (`igprof --detach`): nothing is
/// recorded or dumped from now on.
pub fn set_inactive() {
    ACTIVE.store(false, Ordering::Release);
}

/// Set when the library was loaded into a running process by `igprof
/// --attach` rather than preloaded (see `process/attach.rs`).
static ATTACHED: AtomicBool = AtomicBool::new(false);

/// Whether `igprof --attach` loaded the library into this process.
#[inline]
pub fn attached() -> bool {
    ATTACHED.load(Ordering::Relaxed)
}

pub fn set_attached() {
    ATTACHED.store(true, Ordering::Release);
}

/// The process profiling started in (start-up, fork child), and when:
/// now (the profile's header says it, see [`started_ns`]).
pub fn set_pid(pid: i32) {
    PID.store(pid, Ordering::Relaxed);
    STARTED_NS.store(
        sys::clock_ns(libc::CLOCK_REALTIME).unwrap_or(0),
        Ordering::Relaxed,
    );
}

/// When this process (image, or fork child) started being profiled, in
/// nanoseconds of CLOCK_REALTIME: a file a JIT wrote under this pid before
/// it was written by another process (igprof-analyse checks its maps).
pub fn started_ns() -> u64 {
    STARTED_NS.load(Ordering::Relaxed)
}

/// False in a child made without our fork hook (vfork, posix_spawn,
/// clone): such a child shares or copies our memory but is not "us".
pub fn is_own_process() -> bool {
    active() && sys::getpid() == PID.load(Ordering::Relaxed)
}

/// The launcher's pid (0: unknown).
pub fn root_pid() -> i32 {
    ROOT_PID.load(Ordering::Relaxed)
}

pub fn set_root_pid(pid: i32) {
    ROOT_PID.store(pid, Ordering::Relaxed);
}

/// How many profiled images of this pid came before this one.
pub fn exec_generation() -> u32 {
    EXEC_GEN.load(Ordering::Relaxed)
}

pub fn set_exec_generation(g: u32) {
    EXEC_GEN.store(g, Ordering::Relaxed);
}

/// Whether this image is about to be replaced by exec.
pub fn execing() -> bool {
    EXECING.load(Ordering::Acquire)
}

pub fn set_execing(v: bool) {
    EXECING.store(v, Ordering::Release);
}

/// In a fork child with `-pk`: whether the live-resource tables the parent
/// had are kept too (they are consistent only if the parent had one
/// thread: no other could have been half-way through an update).
pub fn fork_keeps_tables() -> bool {
    crate::base::options::get().fork_keep && crate::base::solo::solo()
}

/// Whether this is the image the user started (the launcher's pid, its
/// first image), or the launcher is not known.
pub fn is_first_image() -> bool {
    let root = root_pid();
    (root == 0 || root == sys::getpid()) && exec_generation() == 0
}

// ---- epochs (`--marks`) ----

/// The current epoch: 0 until the first mark, then how many marks were
/// made (`igprof_mark()`, `--mark-every`), at most [`EPOCH_MAX`].
static EPOCH: AtomicU32 = AtomicU32::new(0);
/// Whether this run takes marks (`--marks`, `--mark-every`; set at start-up).
static MARKS: AtomicBool = AtomicBool::new(false);

/// The last epoch a mark can start: what an allocation remembers of it
/// must fit 16 bits.
pub const EPOCH_MAX: u32 = u16::MAX as u32;

/// Start-up: whether this run takes marks.
pub fn set_marks(on: bool) {
    MARKS.store(on, Ordering::Release);
}

/// The current epoch (0: no mark yet, or marks off).
#[inline(always)]
pub fn epoch() -> u32 {
    EPOCH.load(Ordering::Relaxed)
}

/// Starts a new epoch: Some(its number), None when the run takes no marks.
/// Signal-safe. Past [`EPOCH_MAX`] marks the last epoch goes on.
pub fn mark() -> Option<u32> {
    if !MARKS.load(Ordering::Acquire) {
        return None;
    }
    let e = EPOCH
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            Some((e + 1).min(EPOCH_MAX))
        })
        .unwrap_or(0);
    Some((e + 1).min(EPOCH_MAX))
}

/// Whether the program links Go's cgo runtime (it defines
/// `_cgo_topofstack`), looked up once.
pub fn is_go_program() -> bool {
    static GO: OnceLock<bool> = OnceLock::new();
    *GO.get_or_init(|| trampoline::global_symbol(c"_cgo_topofstack").is_some())
}
