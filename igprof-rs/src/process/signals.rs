//! Keeps the sampling signal ([`crate::sampler::signal`]: SIGTRAP with sigtrap perf
//! events, else SIGPROF) ours while the program believes it owns it. The
//! other signal, and every signal of an unsampled process, is left alone.
//!
//! Policy (documented in the README): our per-thread samplers always reach
//! our handler. The program's own view of the signal is kept in a shadow:
//! `sigaction`/`signal` store the program's action and return the previous
//! shadow action, without touching the real one; `sigprocmask` /
//! `pthread_sigmask` never really block the signal, but remember per thread
//! that the program asked for it and report it as blocked. A signal that is
//! not from our samplers (the program's own `setitimer(ITIMER_PROF)`, `kill`,
//! `raise(SIGTRAP)`, an `int3`) is forwarded to the program's handler as it
//! would have been delivered: held while the program "blocks" it and
//! delivered when it unblocks, ignored under SIG_IGN, fatal under SIG_DFL,
//! and run with the program's `sa_mask` (plus the signal itself unless
//! SA_NODEFER) blocked; the signal itself is held in the shadow for the
//! handler's duration rather than blocked for real, so sampling goes on.
//!
//! Must never: block the sampling signal for real, or let the program
//! replace our handler.

use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::base::thread;
use crate::hook::orig;
use crate::sampler::signal as sampling_signal;
use crate::sys;

/// The program's SIGPROF action: handler, flags, and mask (first word).
static PROG_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PROG_FLAGS: AtomicI32 = AtomicI32::new(0);
static PROG_MASK: AtomicU64 = AtomicU64::new(0);

fn shadow_get(old: *mut libc::sigaction) {
    if old.is_null() {
        return;
    }
    // SAFETY: old is a valid out-pointer from the program.
    unsafe {
        core::ptr::write_bytes(old, 0, 1);
        (*old).sa_sigaction = PROG_HANDLER.load(Ordering::Acquire);
        (*old).sa_flags = PROG_FLAGS.load(Ordering::Relaxed);
        *(&mut (*old).sa_mask as *mut libc::sigset_t as *mut u64) =
            PROG_MASK.load(Ordering::Relaxed);
    }
}

fn shadow_set(act: *const libc::sigaction) {
    // SAFETY: act is a valid pointer from the program.
    unsafe {
        PROG_FLAGS.store((*act).sa_flags, Ordering::Relaxed);
        PROG_MASK.store(
            *(&(*act).sa_mask as *const libc::sigset_t as *const u64),
            Ordering::Relaxed,
        );
        PROG_HANDLER.store((*act).sa_sigaction, Ordering::Release);
    }
}

/// Before the sampling handler replaces it in a running process (`igprof
/// --attach`): the program's action on the sampling signal becomes its
/// shadow action.
pub fn adopt_program_action() {
    let sig = sampling_signal();
    if sig == 0 {
        return;
    }
    // SAFETY: a zeroed sigaction is valid; the kernel fills it.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    if crate::hook::real_sigaction(sig, core::ptr::null(), &mut old).is_ok() {
        shadow_set(&old);
        ADOPTED.store(true, Ordering::Release);
    }
}

/// Set while the program's action adopted by [`adopt_program_action`]
/// is to be given back.
static ADOPTED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// At a detach (or a failed attach): the program's action (its shadow) is
/// the sampling signal's real action again.
pub fn restore_program_action() {
    let sig = sampling_signal();
    if sig == 0 || !ADOPTED.swap(false, Ordering::AcqRel) {
        return;
    }
    // SAFETY: a zeroed sigaction is valid; shadow_get fills it.
    let mut act: libc::sigaction = unsafe { core::mem::zeroed() };
    shadow_get(&mut act);
    if let Err(e) = crate::hook::real_sigaction(sig, &act, core::ptr::null_mut()) {
        crate::igprof_log!("cannot give signal {sig} its action back (errno {e})");
    }
}

/// Replacement of sigaction.
pub(crate) extern "C" fn sigaction_hook(
    sig: i32,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> i32 {
    if sig == sampling_signal() && sig != 0 && !thread::is_busy() {
        let _e = sys::ErrnoGuard::save();
        shadow_get(old);
        if !act.is_null() {
            shadow_set(act);
        }
        return 0;
    }
    if !thread::is_busy() {
        // SAFETY: the program's own arguments to sigaction.
        if let Some(r) = unsafe { crate::process::fatal::sigaction(sig, act, old) } {
            return r;
        }
    }
    let _g = thread::current().and_then(|t| t.enter());
    // SAFETY: forwarding the program's arguments unchanged.
    unsafe {
        match orig::sigaction() {
            Some(f) => f(sig, act, old),
            None => libc::sigaction(sig, act, old),
        }
    }
}

/// Replacement of signal (and bsd_signal).
pub extern "C" fn signal_hook(sig: i32, handler: libc::sighandler_t) -> libc::sighandler_t {
    if sig == sampling_signal() && sig != 0 && !thread::is_busy() {
        let old = PROG_HANDLER.swap(handler, Ordering::AcqRel);
        PROG_FLAGS.store(libc::SA_RESTART, Ordering::Relaxed);
        PROG_MASK.store(0, Ordering::Relaxed);
        return old;
    }
    if !thread::is_busy() {
        if let Some(r) = crate::process::fatal::signal(sig, handler) {
            return r;
        }
    }
    let _g = thread::current().and_then(|t| t.enter());
    // SAFETY: forwarding the program's arguments unchanged.
    unsafe {
        match orig::signal() {
            Some(f) => f(sig, handler),
            None => libc::signal(sig, handler),
        }
    }
}

type MaskFn = unsafe extern "C" fn(i32, *const libc::sigset_t, *mut libc::sigset_t) -> i32;

fn mask_common(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
    real: Option<MaskFn>,
    fallback: MaskFn,
) -> i32 {
    let t = thread::current();
    let sig = sampling_signal();
    let busy = thread::is_busy() || sig == 0;
    let g = t.and_then(|t| t.enter());
    let prev_blocked = t.is_some_and(|t| t.shadow.blocks.get());
    let mut copy: libc::sigset_t;
    let mut set_ptr = set;
    let mut wants_block: Option<bool> = None;
    if !set.is_null() && !busy {
        // SAFETY: set is a valid sigset from the program; we edit a copy.
        unsafe {
            copy = *set;
            let has = libc::sigismember(&copy, sig) == 1;
            wants_block = shadow_block_after(how, has);
            if has {
                libc::sigdelset(&mut copy, sig);
            }
            set_ptr = &copy;
        }
    }
    // SAFETY: forwarding valid pointers.
    let r = unsafe { real.unwrap_or(fallback)(how, set_ptr, old) };
    // Leave the profiler before a held signal is delivered: the program's
    // handler runs as the program's code.
    drop(g);
    if r == 0 && !busy {
        if !old.is_null() && prev_blocked {
            // SAFETY: old was filled by the real call.
            unsafe { libc::sigaddset(old, sig) };
        }
        match (t, wants_block) {
            (Some(t), Some(true)) => t.shadow.blocks.set(true),
            (Some(t), Some(false)) => {
                end_shadow_block(t, sig);
                crate::process::sampling_signal_unblocked(t);
            }
            _ => {}
        }
    }
    r
}

/// What a sigprocmask/pthread_sigmask call (`how`, its set holding the
/// sampling signal or not) does to the program's shadow block of that
/// signal: Some(blocked after the call), or None when it leaves it as it
/// was (the signal itself is never really blocked).
fn shadow_block_after(how: i32, set_has_signal: bool) -> Option<bool> {
    match how {
        libc::SIG_BLOCK => set_has_signal.then_some(true),
        libc::SIG_UNBLOCK => set_has_signal.then_some(false),
        libc::SIG_SETMASK => Some(set_has_signal),
        _ => None,
    }
}

/// Times a held signal is sent again when the kernel dropped it.
const RESENDS: usize = 4;

/// The program unblocked the sampling signal on `t` (in the shadow; the
/// thread runs program code, where the signal is never really blocked):
/// deliver what the block held back, before the unblocking call returns.
///
/// A signal below SIGRTMIN is pending at most once per thread: when one of
/// our samplers' is pending as `tgkill` queues ours (it came during the
/// system call), the kernel drops ours and says nothing. Both would have
/// reached the handler as the call returned, so an unchanged count of
/// arrivals means it was dropped: it is sent again.
fn end_shadow_block(t: &thread::ThreadState, sig: i32) {
    t.shadow.blocks.set(false);
    if t.shadow.pending.replace(false) {
        for _ in 0..RESENDS {
            let before = t.shadow.arrivals.get();
            sys::tgkill(t.tid(), sig);
            if t.shadow.arrivals.get() != before {
                break;
            }
        }
    }
}

unsafe extern "C" fn libc_sigprocmask(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> i32 {
    libc::sigprocmask(how, set, old)
}
unsafe extern "C" fn libc_pthread_sigmask(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> i32 {
    libc::pthread_sigmask(how, set, old)
}

/// Replacement of sigprocmask.
pub extern "C" fn sigprocmask_hook(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> i32 {
    mask_common(how, set, old, orig::sigprocmask(), libc_sigprocmask)
}

/// Replacement of pthread_sigmask.
pub extern "C" fn pthread_sigmask_hook(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> i32 {
    mask_common(how, set, old, orig::pthread_sigmask(), libc_pthread_sigmask)
}

/// A sampling-signal delivery that is not from our samplers: deliver it as
/// the program set up. Runs in signal context.
pub fn forward_program_signal(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let t = thread::current();
    if let Some(t) = t {
        t.shadow
            .arrivals
            .set(t.shadow.arrivals.get().wrapping_add(1));
    }
    // One held while the handler ran is delivered as the handler returns,
    // in the same interrupted context, as the kernel delivers a signal
    // left pending at sigreturn (a `tgkill` here could not be: every
    // signal is blocked in our handler, and a sampler's pending one would
    // make the kernel drop it).
    while deliver(sig, info, uc, t) {}
}

/// Delivers one program signal as the program set up; true when another
/// arrived, held, while the program's handler ran.
fn deliver(
    sig: i32,
    info: *mut libc::siginfo_t,
    uc: *mut libc::c_void,
    t: Option<&thread::ThreadState>,
) -> bool {
    let h = PROG_HANDLER.load(Ordering::Acquire);
    if h == libc::SIG_IGN {
        return false;
    }
    if h == libc::SIG_DFL {
        // Default action (terminate; SIGTRAP also dumps core): the profile
        // first, then die the way the program would have.
        crate::process::fatal::die_after_dump(sig);
        return false;
    }
    if let Some(t) = t {
        if t.shadow.blocks.get() {
            t.shadow.pending.set(true);
            return false;
        }
    }
    let flags = PROG_FLAGS.load(Ordering::Relaxed);
    if flags & libc::SA_RESETHAND != 0 {
        PROG_HANDLER.store(libc::SIG_DFL, Ordering::Release);
    }
    // The kernel would run the handler with the interrupted context's mask
    // plus sa_mask (and the signal itself unless SA_NODEFER) blocked: the
    // other signals for real, ours in the shadow (a second one is held and
    // delivered after the handler). Our handler itself runs with every
    // signal blocked, so this mask is set explicitly; a handler that
    // leaves by longjmp keeps it, as it would unprofiled.
    // SAFETY: uc is the kernel's ucontext for this delivery; all-zero
    // sigsets are empty sets; the first word of a sigset_t holds signals
    // 1..64; rt_sigprocmask gets valid pointers.
    let saved = unsafe {
        let mut mask: libc::sigset_t = (*(uc as *const libc::ucontext_t)).uc_sigmask;
        *(&mut mask as *mut libc::sigset_t as *mut u64) |= PROG_MASK.load(Ordering::Relaxed);
        libc::sigdelset(&mut mask, sig);
        let mut saved: libc::sigset_t = core::mem::zeroed();
        sys::rt_sigprocmask(libc::SIG_SETMASK, &mask, &mut saved);
        saved
    };
    // Not blocked in the shadow here (that returned above): block it there
    // for the handler's duration unless SA_NODEFER.
    if let Some(t) = t.filter(|_| flags & libc::SA_NODEFER == 0) {
        t.shadow.blocks.set(true);
    }
    // SAFETY: the program installed this handler for the signal with these flags.
    unsafe {
        if flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                core::mem::transmute(h);
            f(sig, info, uc);
        } else {
            let f: extern "C" fn(i32) = core::mem::transmute(h);
            f(sig);
        }
    }
    // SAFETY: restoring the mask saved above.
    unsafe { sys::rt_sigprocmask(libc::SIG_SETMASK, &saved, core::ptr::null_mut()) };
    // As sigreturn restores the mask from before the handler (where the
    // signal was not blocked), whatever the handler did to it.
    t.is_some_and(|t| {
        t.shadow.blocks.set(false);
        t.shadow.pending.replace(false)
    })
}

#[cfg(test)]
mod tests {
    use super::shadow_block_after;

    #[test]
    fn the_programs_mask_calls_move_its_shadow_block_as_they_would_the_real_one() {
        use libc::{SIG_BLOCK, SIG_SETMASK, SIG_UNBLOCK};
        assert_eq!(shadow_block_after(SIG_BLOCK, true), Some(true));
        assert_eq!(shadow_block_after(SIG_BLOCK, false), None);
        assert_eq!(shadow_block_after(SIG_UNBLOCK, true), Some(false));
        assert_eq!(shadow_block_after(SIG_UNBLOCK, false), None);
        assert_eq!(shadow_block_after(SIG_SETMASK, true), Some(true));
        assert_eq!(shadow_block_after(SIG_SETMASK, false), Some(false));
        assert_eq!(shadow_block_after(99, true), None);
    }
}
