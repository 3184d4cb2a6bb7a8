//! The library in a running process: `igprof --attach PID` loads it with
//! the process's own `dlopen` and calls [`attach`] on one of its threads
//! while ptrace holds every other thread stopped; `igprof --detach PID`
//! calls [`detach`] the same way (`launcher/src/attach/`).
//!
//! Owns: the attached start-up (the preloaded one's sequence without what
//! the program would see: no watcher thread, no keeper, no handler of the
//! dump, toggle, mark or fatal signals, lines kept in `igprof_attach_log`
//! rather than written to the program's stderr), the late registration of
//! the threads that were running before it, the detach (final profile,
//! every patched byte restored, recording off) and a second attach (the
//! same hooks written again, a fresh profile).
//!
//! Must never: patch a function while a stopped thread's next instruction
//! lies inside the bytes the patch covers (the launcher passes their
//! addresses: [`crate::hook::avoid_pcs`]); leave a hook installed after a
//! detach or a failed attach; unload the library (threads may be inside
//! its code, or in a trampoline, when the detach runs).

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::base::{options, run, thread};
use crate::modules::Module;

/// [`attach`]'s results, read by the launcher.
pub const ATTACHED: i32 = 0;
/// Start-up failed; the lines say why. Nothing stays hooked.
pub const FAILED: i32 = 1;
/// A stopped thread was inside bytes a patch covers and could not be
/// moved to its trampoline (a later attach only): nothing stays hooked;
/// the launcher lets the threads run a moment and tries again.
pub const THREAD_INSIDE: i32 = 2;
/// The process is already profiled (preloaded, or attached and not
/// detached).
pub const ALREADY: i32 = 3;
/// A second attach asked for other modules than the first one started.
pub const OTHER_MODULES: i32 = 4;

/// Whether an attach has started the modules once (a second one reuses them).
static STARTED_ONCE: AtomicBool = AtomicBool::new(false);
/// A first attach waited for a lock another thread held and the launcher
/// let the threads run: hooks written before then stay until
/// [`unhook`], called next with every thread stopped.
pub const HELD_OFF: i32 = 5;
/// A later attach met the same: nothing was written; try again.
pub const HELD_OFF_AGAIN: i32 = 6;
/// As [`HELD_OFF_AGAIN`], but the launcher stopped the other threads again
/// while this call held the loader's lock ([`stopped_under_loader_lock`]):
/// the launcher calls again at once, every thread still stopped.
pub const RESTOPPED: i32 = 7;

/// The hand-shake of [`stopped_under_loader_lock`]: 1 while a call asks
/// the launcher to stop the other threads again, 2 once it has, 3 when it
/// could not. Cleared at the start of each call.
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static igprof_attach_restop: AtomicU64 = AtomicU64::new(0);

/// How long a call holding the loader's lock waits for the launcher to
/// stop the other threads (it polls every 20 ms).
const RESTOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Set when a first attach stopped with modules started part-way.
static PART_WAY: AtomicBool = AtomicBool::new(false);
/// Whether the profiler is attached now.
static ATTACHED_NOW: AtomicBool = AtomicBool::new(false);
/// How many attaches have started profiling (the profile names count them).
static ATTACHES: AtomicU32 = AtomicU32::new(0);
/// The module flags the first attach started, to compare a second's with.
static FIRST_MODULES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

fn module_flags(o: &options::Options) -> Vec<&'static str> {
    o.selected().into_iter().map(|(flag, _)| flag).collect()
}

/// A thread `igprof --attach` stopped: its id, its thread pointer (`fs`
/// base) and its next instruction.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Stopped {
    pub tid: u64,
    pub tp: u64,
    pub pc: u64,
}

/// `igprof --attach`: profiles this running process from now on with the
/// option words `raw`; `threads`: the process's other threads, stopped
/// (no patch may cover their next instruction but at its first byte; the
/// sampled ones are given states and samplers here).
///
/// A thread stopped inside bytes a patch covers is moved to the same
/// instruction in the trampoline: its `pc` is rewritten here, for the
/// launcher to set.
pub fn attach(modules: &'static [&'static Module], raw: &[u8], threads: &mut [Stopped]) -> i32 {
    crate::base::log::capture_lines();
    crate::hook::begin_call();
    igprof_attach_restop.store(0, Ordering::SeqCst);
    if ATTACHED_NOW.load(Ordering::Acquire) || (run::active() && !run::attached()) {
        crate::igprof_log!("the process is already profiled by igprof");
        return ALREADY;
    }
    if PART_WAY.load(Ordering::Acquire) {
        crate::igprof_log!(
            "an earlier attach stopped part-way: the process cannot be attached to again"
        );
        return FAILED;
    }
    let pcs: Vec<u64> = threads.iter().map(|t| t.pc).collect();
    THREADS_OUT.store(threads.as_mut_ptr(), Ordering::Release);
    THREADS_OUT_LEN.store(threads.len(), Ordering::Release);
    crate::hook::avoid_pcs(&pcs, Some(report_move));
    let r = match if STARTED_ONCE.load(Ordering::Acquire) {
        again(raw)
    } else {
        first(modules, raw)
    } {
        HELD_OFF_AGAIN if stopped_under_loader_lock() => RESTOPPED,
        r => r,
    };
    if r == ATTACHED {
        for (t, pc) in threads.iter_mut().zip(crate::hook::moved_pcs()) {
            t.pc = pc;
        }
    }
    crate::hook::avoid_pcs(&[], None);
    THREADS_OUT_LEN.store(0, Ordering::Release);
    if r == ATTACHED {
        ATTACHED_NOW.store(true, Ordering::Release);
        ATTACHES.fetch_add(1, Ordering::AcqRel);
        sample_others(threads);
    }
    r
}

/// Takes and releases the locks start-up takes that another thread may
/// hold: the loader's (dl_iterate_phdr's, and dlsym's) and the calling
/// thread's malloc arena.
fn take_start_up_locks() {
    extern "C" fn first_object(_: *mut libc::dl_phdr_info, _: usize, _: *mut libc::c_void) -> i32 {
        1
    }
    // SAFETY: a callback that reads nothing and stops at the first object.
    unsafe { libc::dl_iterate_phdr(Some(first_object), core::ptr::null_mut()) };
    // SAFETY: a symbol look-up by a NUL-terminated name; the result is
    // not used.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    // SAFETY: the program's malloc and free, outside any hook of ours (the
    // first attach has written none); a null result is fine to free.
    unsafe { libc::free(libc::malloc(64)) };
}

/// After a call that waited for a lock while the other threads ran (and
/// wrote nothing): takes the loader's lock (dl_iterate_phdr's) and, while
/// holding it, has the launcher stop the other threads again; true once
/// it has. A thread that takes that lock again within milliseconds of
/// letting it go (a loop of dl_iterate_phdr: unwinders before glibc 2.35's
/// _dl_find_object) would otherwise hold it at every later try, each of
/// which would wait for it and be held off in turn. The call then returns
/// at once, so this lock is never held while another is taken.
fn stopped_under_loader_lock() -> bool {
    extern "C" fn ask(_: *mut libc::dl_phdr_info, _: usize, stopped: *mut libc::c_void) -> i32 {
        igprof_attach_restop.store(1, Ordering::SeqCst);
        let until = std::time::Instant::now() + RESTOP_WITHIN;
        let answer = loop {
            match igprof_attach_restop.load(Ordering::SeqCst) {
                1 if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                a => break a,
            }
        };
        igprof_attach_restop.store(0, Ordering::SeqCst);
        // SAFETY: `stopped` is the bool passed to dl_iterate_phdr below,
        // alive for the length of that call.
        unsafe { *stopped.cast::<bool>() = answer == 2 };
        1
    }
    let mut stopped = false;
    // SAFETY: the callback writes only `stopped`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(ask), (&raw mut stopped).cast()) };
    stopped
}

/// The launcher's array of the stopped threads during an attach call.
static THREADS_OUT: AtomicPtr<Stopped> = AtomicPtr::new(core::ptr::null_mut());
static THREADS_OUT_LEN: AtomicUsize = AtomicUsize::new(0);

/// A thread is moved out of a patch's bytes: its new next instruction is
/// written into the launcher's array at once, before the patch, so that
/// a launcher that lets the threads run during a long call moves it first.
fn report_move(i: usize, pc: u64) {
    if i < THREADS_OUT_LEN.load(Ordering::Acquire) {
        // SAFETY: THREADS_OUT holds the attach call's array of
        // THREADS_OUT_LEN threads for the length of that call.
        unsafe {
            let t = THREADS_OUT.load(Ordering::Acquire).add(i);
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*t).pc), pc);
        }
    }
}

/// With a sampling module, every other thread gets its state and its
/// sampler now (a thread that makes no hooked call would otherwise never
/// be sampled). Their ends are not seen (no key destructor of theirs):
/// their samplers stop at the detach.
fn sample_others(threads: &[Stopped]) {
    let o = options::get();
    if !o.needs_timers() && !o.samples_events() && o.count_groups().next().is_none() {
        return;
    }
    let me = crate::sys::gettid();
    for s in threads.iter().filter(|s| s.tid as i32 != me) {
        let tid = s.tid as i32;
        let bounds =
            crate::unwind::StackBounds::for_thread(s.tp as libc::pthread_t).unwrap_or_default();
        // SAFETY: the thread is stopped by the launcher and tp is its
        // thread pointer, as the launcher read it.
        match unsafe { thread::register_other(tid, s.tp as usize, o.max_depth, bounds) } {
            Some(t) => super::begin_other_thread(t),
            None => crate::igprof_log!("thread {tid}: no memory for its state; it is not sampled"),
        }
    }
}

/// The first attach: the preloaded start-up's sequence, attached.
fn first(modules: &'static [&'static Module], raw: &[u8]) -> i32 {
    // Start-up takes locks a stopped thread may hold: the loader's, and
    // through libc (pthread_getattr_np, dlsym) the program's malloc's. If
    // one is held, the launcher lets the threads run and no more code may
    // be written; found once modules have started, the process could not
    // be attached to again. Taken once here first, before anything
    // starts: a wait here only costs a retry.
    take_start_up_locks();
    if crate::hook::others_ran() {
        return HELD_OFF_AGAIN;
    }
    super::set_up(modules);
    run::set_attached();
    thread::set_late_register(late_thread_begin);
    let started = super::start(raw, super::How::Attach);
    if crate::hook::held_off() {
        // The launcher let the other threads run (this call waited for a
        // lock one held): the hooks written before stay until its next
        // call, with every thread stopped, removes them (unhook). Modules
        // started part-way cannot start again.
        crate::process::stop_sampling();
        run::set_recording(false);
        PART_WAY.store(true, Ordering::Release);
        UNHOOK_PENDING.store(true, Ordering::Release);
        crate::igprof_log!(
            "the attach waited for a lock another thread held, so no more code could be patched: the process runs on unprofiled and cannot be attached to again"
        );
        return HELD_OFF;
    }
    if crate::hook::refused_for_thread_inside() {
        // Modules started part-way cannot start again: this process
        // cannot be attached to any more (a thread stopped in the middle
        // of a prologue whose bytes a trampoline had to relocate).
        undo();
        PART_WAY.store(true, Ordering::Release);
        crate::igprof_log!(
            "a thread was stopped inside the first bytes of a function to hook, which cannot be moved: the process runs on unprofiled and cannot be attached to again"
        );
        return FAILED;
    }
    match started {
        Ok(()) => {
            STARTED_ONCE.store(true, Ordering::Release);
            *FIRST_MODULES.lock().unwrap_or_else(|e| e.into_inner()) = module_flags(options::get());
            ATTACHED
        }
        Err(super::Unprofiled) => {
            undo();
            FAILED
        }
    }
}

/// A later attach: the hooks the first one installed are written again
/// and the profile starts afresh (the earlier attach's was written at its
/// detach); options other than the modules may change.
fn again(raw: &[u8]) -> i32 {
    let o = match options::parse(raw) {
        Ok(o) => o,
        Err(e) => {
            crate::igprof_log!("{e}");
            return FAILED;
        }
    };
    let first = FIRST_MODULES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if module_flags(&o) != first {
        crate::igprof_log!(
            "this process was attached to with {} before: the library it has loaded profiles those only; attach with the same modules",
            first.join(" ")
        );
        return OTHER_MODULES;
    }
    // SAFETY: every other thread of the process is stopped by the
    // launcher, and none of ours runs (no watcher in an attached process).
    unsafe { options::init(o) };
    for t in thread::all() {
        t.stale.store(true, Ordering::Release);
    }
    // SAFETY: every other thread is stopped by the launcher (see above).
    unsafe { thread::forget_all_threads() };
    crate::output::reset_after_fork();
    super::ending::allow_final_again();
    run::set_pid(crate::sys::getpid());
    if crate::hook::restore_all() != 0 {
        if crate::hook::held_off() {
            // Nothing written (all or nothing): tried again with every
            // thread stopped.
            return HELD_OFF_AGAIN;
        }
        undo();
        return if crate::hook::refused_for_thread_inside() {
            THREAD_INSIDE
        } else {
            FAILED
        };
    }
    // The detach gave the sampling signal back to the program.
    super::signals::adopt_program_action();
    if let Err(e) = crate::sampler::install_handler() {
        crate::igprof_log!("cannot install the sampling signal's handler (errno {e})");
        undo();
        return FAILED;
    }
    run::set_recording(!options::get().start_disabled);
    run::set_active();
    if let Some(t) = thread::register_current(options::get().max_depth) {
        super::restart_thread(t);
    }
    ATTACHED
}

/// A failed attach leaves nothing hooked and records nothing.
fn undo() {
    crate::process::stop_sampling();
    super::signals::restore_program_action();
    crate::hook::remove_all();
    run::set_inactive();
}

/// `igprof --detach` (or the end of `--for`), first step: the profile
/// is written and every sampler stopped. Writing waits for threads inside
/// the profiler to leave it, so the launcher may let the other threads run
/// meanwhile: nothing is unpatched here. Returns 0, or -1 when not
/// attached; the lines say what was written.
pub fn detach() -> i32 {
    crate::base::log::capture_lines();
    if !ATTACHED_NOW.swap(false, Ordering::AcqRel) {
        crate::igprof_log!("the process is not attached to");
        return -1;
    }
    if !super::ending::final_dump("detach") {
        crate::igprof_log!("no profile written");
    }
    UNHOOK_PENDING.store(true, Ordering::Release);
    0
}

/// Any entry of the launcher's: the thread it called on was stopped
/// inside the profiler (it may hold a lock the call needs); nothing was
/// done, call on another thread.
pub const CALLER_BUSY: i32 = 0x1b5;

/// Whether the thread a launcher's call runs on was stopped where it may
/// hold a lock the call needs: inside the profiler, or inside a hook
/// where the profiler's per-thread state is not entered (a free taking a
/// block out of the live table holds a shard of it, a thread met first
/// after an attach registers itself, a hook's real `realloc` holds the
/// allocator's own lock: `site::may_hold_lock`).
pub fn caller_busy() -> bool {
    crate::base::thread::is_busy() || crate::modules::mem::site::may_hold_lock()
}

/// Set between [`detach`] and [`unhook`].
static UNHOOK_PENDING: AtomicBool = AtomicBool::new(false);

/// [`unhook`]: every patched byte restored.
pub const UNHOOKED: i32 = 0;
/// [`unhook`]: a stopped thread holds the hook registry; let the threads
/// run a little and call again.
pub const BUSY: i32 = 1;
/// [`unhook`]: some functions could not be restored (the lines say which).
pub const NOT_RESTORED: i32 = 2;
/// [`unhook`]: no [`detach`] before it.
pub const NOT_DETACHING: i32 = 3;

/// The second step of a detach, while every other thread is stopped (the
/// launcher never lets them run during it): the program's own action back
/// on the sampling signal, every patched byte restored, recording off. It
/// waits for nothing another thread may hold: where one holds the hook
/// registry it returns [`BUSY`] at once.
pub fn unhook() -> i32 {
    crate::base::log::capture_lines();
    crate::hook::begin_call();
    if !UNHOOK_PENDING.load(Ordering::Acquire) {
        return NOT_DETACHING;
    }
    let Some(failed) = crate::hook::try_remove_all() else {
        return BUSY;
    };
    UNHOOK_PENDING.store(false, Ordering::Release);
    // Samplers stopped (detach): the program's own action back on the
    // sampling signal. A sample already raised is taken away by the
    // launcher before the threads go on.
    super::signals::restore_program_action();
    run::set_inactive();
    if failed != 0 {
        crate::igprof_log!("{failed} hooked functions could not be restored");
        return NOT_RESTORED;
    }
    UNHOOKED
}

/// A thread that was running before the attach, met in a hook.
fn late_thread_begin() -> Option<&'static thread::ThreadState> {
    if !run::active() {
        return None;
    }
    let t = thread::register_current(options::get().max_depth)?;
    super::adopt_thread(t);
    Some(t)
}
