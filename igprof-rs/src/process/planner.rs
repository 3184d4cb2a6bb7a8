//! The hook planner: a process of its own that plans the start-up hooks
//! whose plans no earlier run kept (`hook::plans`), so that the
//! instruction decoder's tables (iced-x86 on x86-64: about 360 KiB, kept
//! for the rest of a process once it has decoded) are built in its memory
//! and leave with it, instead of staying in the program's whole run.
//!
//! Owns the planner's life: made at the first plan the start-up batch asks
//! for (as trampoline's `known::Planner`), ended and reaped when the batch
//! is over ([`finish`]), and the shared mapping through which it is asked.
//!
//! What the program sees of it: nothing it can wait for or be signalled
//! by. It is made by `clone` without `CLONE_VM`, a copy of the process
//! whose memory then goes its own way (what it allocates is its own), with
//! exit signal 0 (no SIGCHLD), and reaped here before the program's code
//! runs. It blocks every signal, dies with its creator (PR_SET_PDEATHSIG),
//! leaves no core file, and touches no descriptor (it holds copies of the
//! program's for its short life, as any fork child does); it is given the
//! bytes to plan in the shared mapping and answers there.
//!
//! What it costs, measured on a first run of `/bin/true` under `-mp` (29
//! hooks to plan; 2 virtual CPUs; `bench/noop-cost`, 200 alternating
//! rounds, `IGPROF_CACHE_DIR=none`): 2.35 ms CPU and 2.42 ms wall through
//! the launcher, against 1.96 / 1.96 ms with the plans made in the program
//! (`IGPROF_PLANNER=0`) and 1.62 / 1.64 ms with them known (the clone
//! 0.05-0.07 ms, its end and reaping 0.06 ms, the 29 questions 0.5 ms, the
//! first of them building the decoder's tables, the pages both processes
//! then write copied); sqlite3 under `-mp` (200,000 inserts), peak RSS
//! 23.91 -> 23.44 MB (medians of 5, unprofiled 21.6). Runs whose plans are
//! all known (every run after the first with the same library) make none.
//!
//! Must never: be made while the process has other threads (its copy of
//! memory could hold a lock that one of them held) or outside the
//! start-up batch; leave a process behind; wait for an answer without a
//! limit. Wherever it cannot be made, or does not answer in time (then it
//! is killed and reaped), the hooks are planned in the program, as before.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::sys;

/// The shared mapping: the header, the bytes to plan, the answer.
const SHARED_BYTES: usize = 1 << 20;
/// Where the bytes to plan start (after the header).
const CODE_AT: usize = 64;
/// Room for an answer (a table of one plan: a few dozen bytes).
const ANSWER_BYTES: usize = 4096;
/// The most bytes of a function that can be sent (larger: planned here).
const CODE_MAX: usize = SHARED_BYTES - CODE_AT - ANSWER_BYTES;
const ANSWER_AT: usize = SHARED_BYTES - ANSWER_BYTES;
/// The planner's stack (mapped without reserve: only what it touches).
const STACK_BYTES: usize = 256 << 10;
/// How long one answer may take before the planner is given up (a first
/// one builds the decoder's tables: about 0.5 ms here).
const ANSWER_LIMIT_NS: u64 = 2_000_000_000;

/// `Header::state`: the planner waits for a question.
const IDLE: u32 = 0;
/// A question is in the mapping.
const ASKED: u32 = 1;
/// The answer is in the mapping.
const ANSWERED: u32 = 2;
/// The planner is to exit.
const QUIT: u32 = 3;

/// The start of the shared mapping. Every field is atomic: the two
/// processes write and read them, ordered by `state` (Release, Acquire).
#[repr(C)]
struct Header {
    state: AtomicU32,
    patch_len: AtomicU32,
    code_len: AtomicU32,
    /// 0: no plan (the function cannot be hooked as asked).
    answer_len: AtomicU32,
    addr: AtomicU64,
    /// u64::MAX: unknown.
    size: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<Header>() <= CODE_AT);

/// The shared mapping (0: none).
static SHARED: AtomicUsize = AtomicUsize::new(0);
/// The planner's stack mapping (0: none).
static STACK: AtomicUsize = AtomicUsize::new(0);
/// The planner's pid (0: none running).
static PID: AtomicI32 = AtomicI32::new(0);
/// The pid of the process that made it, for the planner to notice that
/// its creator is gone.
static CREATOR: AtomicI32 = AtomicI32::new(0);
/// This thread's CPU set is narrowed to one CPU until [`unpin`].
static PINNED: AtomicBool = AtomicBool::new(false);
/// A planner was tried in this batch (made or not): no second one.
static TRIED: AtomicBool = AtomicBool::new(false);
/// Plans it answered, and the time spent waiting for them (`-d`).
static ANSWERED_COUNT: AtomicU32 = AtomicU32::new(0);
static WAITED_NS: AtomicU64 = AtomicU64::new(0);
/// How long its `clone` took, and its end and reaping (`-d`).
static MADE_NS: AtomicU64 = AtomicU64::new(0);
static ENDED_NS: AtomicU64 = AtomicU64::new(0);
/// Why there was none, for `-d` (empty: there was, or none was needed).
static WHY_NOT: AtomicUsize = AtomicUsize::new(0);
const WHY: [&str; 4] = [
    "",
    "the process has other threads",
    "no memory for its mapping",
    "the kernel refused its process",
];

/// Offers the planner to the start-up batch's hooks (`allowed`: not an
/// attach, not turned off, where the decoder builds tables); it is made at
/// the first plan asked for.
pub fn offer(allowed: bool) {
    TRIED.store(false, Ordering::Release);
    WHY_NOT.store(0, Ordering::Release);
    ANSWERED_COUNT.store(0, Ordering::Release);
    WAITED_NS.store(0, Ordering::Release);
    if allowed && cfg!(target_arch = "x86_64") {
        trampoline::known::set_planner(Some(plan));
    }
}

/// Ends the planner at the end of the start-up batch (the batch's plans
/// are all made): it exits and is reaped. Returns what to say under `-d`.
pub fn finish() -> Option<String> {
    trampoline::known::set_planner(None);
    let pid = PID.load(Ordering::Acquire);
    if pid > 0 {
        let started = sys::monotonic_ns();
        if let Some(h) = header() {
            h.state.store(QUIT, Ordering::Release);
            sys::futex_wake_shared(&h.state);
        }
        reap(pid, false);
        ENDED_NS.store(sys::monotonic_ns() - started, Ordering::Release);
    }
    unpin();
    unmap();
    let n = ANSWERED_COUNT.load(Ordering::Acquire);
    let why = WHY[WHY_NOT.load(Ordering::Acquire).min(WHY.len() - 1)];
    if n > 0 {
        Some(format!(
            "hook planner: {n} plans made in a process of its own, answered in {:.1} ms (the decoder's tables stayed there; made in {} us, ended in {} us)",
            WAITED_NS.load(Ordering::Acquire) as f64 / 1e6,
            MADE_NS.load(Ordering::Acquire) / 1000,
            ENDED_NS.load(Ordering::Acquire) / 1000,
        ))
    } else if !why.is_empty() {
        Some(format!("hook planner: none, plans made here: {why}"))
    } else {
        None
    }
}

fn header() -> Option<&'static Header> {
    let p = SHARED.load(Ordering::Acquire);
    // SAFETY: SHARED holds a live mapping of SHARED_BYTES (page-aligned,
    // zero-filled at first), whose start is the header.
    (p != 0).then(|| unsafe { &*(p as *const Header) })
}

/// The [`trampoline::known::Planner`]: the plan of `code` from the
/// planner, made at the first call; None where it cannot answer.
fn plan(code: &[u8], addr: u64, size: Option<u64>, patch_len: usize) -> Option<Vec<u8>> {
    if code.len() > CODE_MAX {
        return None;
    }
    let _e = sys::ErrnoGuard::save();
    if PID.load(Ordering::Acquire) <= 0 && !make() {
        return None;
    }
    let h = header()?;
    let base = SHARED.load(Ordering::Acquire) as *mut u8;
    let started = sys::monotonic_ns();
    h.patch_len.store(patch_len as u32, Ordering::Relaxed);
    h.code_len.store(code.len() as u32, Ordering::Relaxed);
    h.answer_len.store(0, Ordering::Relaxed);
    h.addr.store(addr, Ordering::Relaxed);
    h.size.store(size.unwrap_or(u64::MAX), Ordering::Relaxed);
    // SAFETY: the planner reads the bytes only once the state is ASKED,
    // stored after this; they fit (checked above).
    unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), base.add(CODE_AT), code.len()) };
    h.state.store(ASKED, Ordering::Release);
    sys::futex_wake_shared(&h.state);
    // Each wait ends with the answer's wake or after 10 ms, when the
    // planner is checked for life.
    let mut checked = started;
    loop {
        let s = h.state.load(Ordering::Acquire);
        if s == ANSWERED {
            break;
        }
        let now = sys::monotonic_ns();
        if now - checked >= 10_000_000 {
            checked = now;
            if now - started > ANSWER_LIMIT_NS || !alive() {
                give_up();
                return None;
            }
        }
        sys::futex_wait_shared(&h.state, s, Some(10_000_000));
    }
    let len = (h.answer_len.load(Ordering::Relaxed) as usize).min(ANSWER_BYTES);
    // SAFETY: the planner wrote `len` bytes at ANSWER_AT before it stored
    // ANSWERED, and writes nothing until asked again.
    let answer = unsafe { core::slice::from_raw_parts(base.add(ANSWER_AT), len) }.to_vec();
    h.state.store(IDLE, Ordering::Release);
    WAITED_NS.fetch_add(sys::monotonic_ns() - started, Ordering::AcqRel);
    if answer.is_empty() {
        return None;
    }
    ANSWERED_COUNT.fetch_add(1, Ordering::AcqRel);
    Some(answer)
}

/// Makes the planner (once a batch); false where it cannot be made.
fn make() -> bool {
    if TRIED.swap(true, Ordering::AcqRel) {
        return false;
    }
    let not = |why: usize| {
        WHY_NOT.store(why, Ordering::Release);
        false
    };
    if !crate::base::solo::libc_single_threaded() {
        return not(1);
    }
    let Ok(shared) = sys::map_anon_shared(SHARED_BYTES) else {
        return not(2);
    };
    SHARED.store(shared as usize, Ordering::Release);
    let stack = sys::mmap_anon(STACK_BYTES);
    if stack.is_null() {
        unmap();
        return not(2);
    }
    STACK.store(stack as usize, Ordering::Release);
    CREATOR.store(sys::getpid(), Ordering::Release);
    let top = (stack as usize + STACK_BYTES) & !15;
    let clone = crate::hook::real_clone();
    let _e = sys::ErrnoGuard::save();
    // This thread and the planner keep this thread's CPU as their only one
    // until the planner is reaped (`finish`, `give_up`): each question and
    // its answer are then two context switches. With the program's thread
    // free to move, the scheduler woke it on the other CPU at an answer in
    // about one run in three here, and each question then woke a halted
    // virtual CPU: 300-400 us a question, 5-12 ms for a batch of 29 that
    // takes 0.5 ms on one CPU.
    super::keeper::affinity::pin();
    PINNED.store(true, Ordering::Release);
    let started = sys::monotonic_ns();
    // No CLONE_VM: a copy of this process; exit signal 0: no SIGCHLD, so
    // reaped with __WCLONE.
    // SAFETY: serve runs on its own stack in its own copy of memory; the
    // process has one thread (checked above), so no lock is held there.
    let pid = unsafe {
        clone(
            serve,
            top as *mut libc::c_void,
            0,
            shared.cast(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    };
    MADE_NS.store(sys::monotonic_ns() - started, Ordering::Release);
    if pid <= 0 {
        unpin();
        unmap();
        return not(3);
    }
    PID.store(pid, Ordering::Release);
    true
}

/// Whether the planner still runs (reaped here if it ended).
fn alive() -> bool {
    let pid = PID.load(Ordering::Acquire);
    pid > 0 && !reaped(pid, true)
}

/// [`sys::reap_own_child`], forgetting the pid once it is gone.
fn reaped(pid: i32, nohang: bool) -> bool {
    let gone = sys::reap_own_child(pid, nohang);
    if gone {
        PID.store(0, Ordering::Release);
    }
    gone
}

/// Reaps the planner, which was told to quit (or, `kill`, is killed):
/// a moment for it to exit, then SIGKILL.
fn reap(pid: i32, kill: bool) {
    let _e = sys::ErrnoGuard::save();
    if !kill {
        // It exits as soon as it sees QUIT (tens of microseconds).
        let started = sys::monotonic_ns();
        while sys::monotonic_ns() - started < 100_000_000 {
            if reaped(pid, true) {
                return;
            }
            if let Some(h) = header() {
                sys::futex_wait_shared(&h.state, QUIT, Some(20_000));
            }
        }
    }
    // SAFETY: kill of our own child, not yet reaped (its pid is ours).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    reaped(pid, false);
}

/// The planner did not answer: it is killed and reaped, and the batch's
/// other hooks are planned here.
fn give_up() {
    trampoline::known::set_planner(None);
    let pid = PID.load(Ordering::Acquire);
    if pid > 0 {
        reap(pid, true);
    }
    unpin();
    unmap();
}

/// Gives this thread back the CPU set it had before the planner was made
/// (once: the planner was reaped, or could not be made).
fn unpin() {
    if PINNED.swap(false, Ordering::AcqRel) {
        super::keeper::affinity::restore();
    }
}

fn unmap() {
    for (m, len) in [(&SHARED, SHARED_BYTES), (&STACK, STACK_BYTES)] {
        let p = m.swap(0, Ordering::AcqRel);
        if p != 0 {
            // SAFETY: our own mapping of `len` bytes; nothing refers to it
            // once the planner is reaped (or was never made).
            unsafe { sys::munmap(p as *mut u8, len) };
        }
    }
}

/// The planner: answers questions until told to quit, or until its
/// creator is gone.
extern "C" fn serve(arg: *mut libc::c_void) -> libc::c_int {
    let base = arg as *mut u8;
    // SAFETY: the shared mapping made before the clone; its header.
    let h = unsafe { &*(base as *const Header) };
    // SAFETY: a full mask for this process's one thread; no libc state.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const libc::sigset_t,
            core::ptr::null_mut::<libc::sigset_t>(),
            core::mem::size_of::<libc::c_ulong>(),
        );
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // Were it to crash, no core file in the program's directory.
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    let creator = CREATOR.load(Ordering::Acquire);
    loop {
        // SAFETY: getppid has no failure.
        if unsafe { libc::getppid() } != creator {
            return 0;
        }
        match h.state.load(Ordering::Acquire) {
            QUIT => return 0,
            ASKED => {
                let len = (h.code_len.load(Ordering::Relaxed) as usize).min(CODE_MAX);
                let size = Some(h.size.load(Ordering::Relaxed)).filter(|&s| s != u64::MAX);
                // SAFETY: the creator wrote the bytes before storing ASKED,
                // and leaves them until ANSWERED.
                let code = unsafe { core::slice::from_raw_parts(base.add(CODE_AT), len) };
                let answer = trampoline::plan_entry(
                    code,
                    h.addr.load(Ordering::Relaxed),
                    size,
                    h.patch_len.load(Ordering::Relaxed) as usize,
                );
                let answer = answer
                    .filter(|a| a.len() <= ANSWER_BYTES)
                    .unwrap_or_default();
                // SAFETY: the answer's room in the mapping; the creator
                // reads it only after ANSWERED.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        answer.as_ptr(),
                        base.add(ANSWER_AT),
                        answer.len(),
                    )
                };
                h.answer_len.store(answer.len() as u32, Ordering::Relaxed);
                h.state.store(ANSWERED, Ordering::Release);
                sys::futex_wake_shared(&h.state);
            }
            s => sys::futex_wait_shared(&h.state, s, Some(100_000_000)),
        }
    }
}
