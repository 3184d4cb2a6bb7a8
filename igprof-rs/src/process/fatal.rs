//! Signals whose default action ends the process (SIGTERM from a batch
//! system or a parent's `terminate()`, SIGINT from Ctrl-C, SIGHUP, SIGPIPE
//! in a pipeline, a crash's SIGSEGV...): the profile is written first, then
//! the process dies by the same signal, with the same status and core dump
//! as unprofiled.
//!
//! Owns our handler for those signals while the program leaves them at
//! SIG_DFL, and the program's view of them: `sigaction`/`signal` that set
//! SIG_DFL install ours instead, a query reports SIG_DFL where ours is in
//! place, and any other action (a handler, SIG_IGN) is the program's for
//! real. The handler asks the watcher thread for the final dump
//! ([`crate::process::watcher::dump_before_death`]), or writes it itself in a
//! process without one ([`crate::process::watcher::final_dump_here`]), restores
//! SIG_DFL and lets the signal take its course.
//!
//! SIGKILL cannot be caught: the keeper (keeper/) writes the profile of
//! a process killed that way.
//!
//! Must never: keep a signal the program handles or ignores, or return
//! from a fatal signal into the program.

use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use crate::{base::thread, sys};

/// The signals handled here (the sampling signal is `signals`'s).
const WATCHED: [i32; 13] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGUSR1,
    libc::SIGSEGV,
    libc::SIGUSR2,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGXCPU,
];

/// Bit `sig` set: our handler is installed for `sig` (the program sees SIG_DFL).
static OURS: AtomicU64 = AtomicU64::new(0);

fn watched(sig: i32) -> bool {
    WATCHED.contains(&sig)
        && sig != crate::sampler::signal()
        && sig != crate::base::options::get().dump_signal
        && sig != crate::base::options::get().toggle_signal
        && !(crate::base::options::get().marks && sig == crate::base::options::get().mark_signal)
}

fn ours(sig: i32) -> bool {
    OURS.load(Ordering::Acquire) & (1 << sig) != 0
}

fn our_action() -> libc::sigaction {
    // SAFETY: a zeroed sigaction is valid; fields set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = entry();
    sa.sa_flags = libc::SA_SIGINFO;
    // Nothing of the program runs on this thread until it dies (and no
    // asynchronous cancellation unwinds out of the profile's writing).
    sa.sa_mask = sys::handler_mask();
    sa
}

/// Installs our handler for every watched signal the program left at
/// SIG_DFL (constructor, after the core hooks).
pub fn install() {
    for sig in WATCHED {
        if !watched(sig) {
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid out-buffer.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        if crate::hook::real_sigaction(sig, core::ptr::null(), &mut old).is_ok()
            && old.sa_sigaction == libc::SIG_DFL
            && crate::hook::real_sigaction(sig, &our_action(), core::ptr::null_mut()).is_ok()
        {
            OURS.fetch_or(1 << sig, Ordering::AcqRel);
        }
    }
}

// The handler's entry (a shim that aligns the stack on x86-64).
crate::sys::signal_entry!(entry, "igprof_fatal_entry", ".text", handler);

extern "C" fn handler(sig: i32, info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this signal (SA_SIGINFO).
    let code = unsafe { (*info).si_code };
    let fault = code > 0
        && matches!(
            sig,
            libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL
        );
    if fault && (thread::is_busy() || !crate::base::alloc::all_unlocked()) {
        // A fault raised by an instruction of the profiler itself: waiting
        // for the thread to leave profiler code would run that instruction
        // again and again. No profile: the process dies now, as it would.
        let _e = sys::ErrnoGuard::save();
        crate::process::ending::final_dump_from_signal(sig);
        restore_default(sig);
        return;
    }
    die_after_dump(sig);
}

/// `sig`'s action goes back to SIG_DFL (ours is no longer in place).
fn restore_default(sig: i32) {
    OURS.fetch_and(!(1 << sig), Ordering::AcqRel);
    // SAFETY: a zeroed sigaction with SIG_DFL is valid.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    let _ = crate::hook::real_sigaction(sig, &sa, core::ptr::null_mut());
}

/// The process dies by `sig` under its default action: write the profile
/// (through the watcher), restore SIG_DFL and deliver `sig` again, now
/// unblocked, so the process ends as it would have. Signal context.
pub fn die_after_dump(sig: i32) {
    let _e = sys::ErrnoGuard::save();
    if thread::is_busy() {
        // The signal interrupted the profiler on this thread (a hook, or
        // the profile being written at exit), which may hold what a dump
        // needs: the death waits until it leaves ([`die_if_pending`]).
        let _ = PENDING_DEATH.compare_exchange(0, sig, Ordering::AcqRel, Ordering::Relaxed);
        thread::request_after_leave();
        return;
    }
    if !crate::process::watcher::dump_before_death(sig)
        && !crate::process::watcher::final_dump_here(sig)
    {
        crate::process::ending::final_dump_from_signal(sig);
    }
    restore_default(sig);
    // SAFETY: a set with one signal, for unblocking it.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigaddset(&mut set, sig);
        sys::rt_sigprocmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
    }
    // A signal raised by an instruction (SIGSEGV, SIGBUS, SIGFPE, SIGILL)
    // comes again when the handler returns; any other is sent again.
    sys::tgkill(sys::gettid(), sig);
}

/// A fatal signal that arrived while its thread was inside the profiler.
static PENDING_DEATH: AtomicI32 = AtomicI32::new(0);

/// Called as a thread has left profiler code: a fatal signal deferred by
/// [`die_after_dump`] now takes its course.
#[inline]
pub fn die_if_pending() {
    if PENDING_DEATH.load(Ordering::Relaxed) != 0 {
        let sig = PENDING_DEATH.swap(0, Ordering::AcqRel);
        if sig != 0 {
            // Blocked as in our handler: nothing of the program runs on
            // this thread any more.
            let all = sys::handler_mask();
            // SAFETY: a valid set, for blocking every signal on this thread.
            unsafe { sys::rt_sigprocmask(libc::SIG_BLOCK, &all, core::ptr::null_mut()) };
            die_after_dump(sig);
        }
    }
}

/// The program's `sigaction(sig, act, old)` for a watched signal: Some(result)
/// when handled here, None when `sig` is not ours to mediate.
///
/// # Safety
/// `act` is null or points to a valid `sigaction`; `old` is null or valid
/// for writing one (what the program passed to `sigaction`).
pub unsafe fn sigaction(
    sig: i32,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> Option<i32> {
    if !(1..64).contains(&sig) || !watched(sig) || !crate::process::active() {
        return None;
    }
    let was_ours = ours(sig);
    let ours_now = our_action();
    // SAFETY: act is null or a valid sigaction from the program.
    let to_dfl = !act.is_null() && unsafe { (*act).sa_sigaction } == libc::SIG_DFL;
    let real_act = if to_dfl { &ours_now as *const _ } else { act };
    if let Err(e) = crate::hook::real_sigaction(sig, real_act, old) {
        // SAFETY: setting the caller's errno, as sigaction would.
        unsafe { *libc::__errno_location() = e };
        return Some(-1);
    }
    if !act.is_null() {
        if to_dfl {
            OURS.fetch_or(1 << sig, Ordering::AcqRel);
        } else {
            OURS.fetch_and(!(1 << sig), Ordering::AcqRel);
        }
    }
    if was_ours && !old.is_null() {
        // SAFETY: old is a valid out-pointer the real call filled.
        unsafe {
            core::ptr::write_bytes(old, 0, 1);
            (*old).sa_sigaction = libc::SIG_DFL;
        }
    }
    Some(0)
}

/// The program's `signal(sig, handler)` for a watched signal.
pub fn signal(sig: i32, h: libc::sighandler_t) -> Option<libc::sighandler_t> {
    if !(1..64).contains(&sig) || !watched(sig) || !crate::process::active() {
        return None;
    }
    // SAFETY: a zeroed sigaction is valid; signal() is BSD semantics.
    let mut act: libc::sigaction = unsafe { core::mem::zeroed() };
    act.sa_sigaction = h;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: a zeroed sigaction is a valid out-buffer.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: both point to values on this frame.
    match unsafe { sigaction(sig, &act, &mut old) } {
        Some(0) => Some(old.sa_sigaction),
        _ => Some(libc::SIG_ERR),
    }
}
