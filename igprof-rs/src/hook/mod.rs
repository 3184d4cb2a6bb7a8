//! Hook plumbing shared by every layer that hooks a function: the chain
//! pointers of the process-wide hooks ([`orig`]), one install sequence
//! ([`install`]: the chain is published before the patch goes live), and
//! the real `sigaction` that bypasses our own hook, and whether a call of
//! the dynamic loader is in progress.
//!
//! Owns: chain pointer storage and installation. Which functions are
//! hooked, and what the replacements do, belongs to the layers above
//! (`process/hooks.rs`, `modules/mem`, `modules/fd`).
//!
//! Must never: import anything above `base/`, or call a hooked function
//! other than through its chain pointer.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::sys;

/// The function a `clone()` child runs.
pub type CloneFn = extern "C" fn(*mut c_void) -> c_int;

/// Chain pointers of the hooked functions (0 = not hooked).
pub mod orig {
    use super::*;

    pub type PthreadCreate = unsafe extern "C" fn(
        *mut libc::pthread_t,
        *const libc::pthread_attr_t,
        extern "C" fn(*mut c_void) -> *mut c_void,
        *mut c_void,
    ) -> c_int;
    pub type Fork = unsafe extern "C" fn() -> libc::pid_t;
    pub type Execve =
        unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    pub type Sigaction =
        unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
    pub type Signal = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;
    pub type Mask =
        unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
    pub type Exit = unsafe extern "C" fn(c_int) -> !;
    pub type Abort = unsafe extern "C" fn() -> !;
    pub type Kill = unsafe extern "C" fn(libc::pid_t, c_int) -> c_int;
    pub type Raise = unsafe extern "C" fn(c_int) -> c_int;
    pub type Dlopen = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    pub type Dlclose = unsafe extern "C" fn(*mut c_void) -> c_int;
    pub type Longjmp = unsafe extern "C" fn(*mut c_void, c_int) -> !;
    pub type SetId1 = unsafe extern "C" fn(libc::uid_t) -> c_int;
    pub type SetId2 = unsafe extern "C" fn(libc::uid_t, libc::uid_t) -> c_int;
    pub type SetId3 = unsafe extern "C" fn(libc::uid_t, libc::uid_t, libc::uid_t) -> c_int;
    /// glibc's variadic `clone`, called with all seven arguments (the last
    /// three are read by the kernel only when `flags` asks for them).
    pub type Clone = unsafe extern "C" fn(
        super::CloneFn,
        *mut c_void,
        c_int,
        *mut c_void,
        *mut libc::pid_t,
        *mut c_void,
        *mut libc::pid_t,
    ) -> c_int;

    /// One chain pointer (`$s`, 0 = not hooked) and its typed getter `$f`.
    macro_rules! chains {
        ($($f:ident, $s:ident, $t:ty;)*) => {$(
            pub(crate) static $s: AtomicUsize = AtomicUsize::new(0);
            #[inline]
            pub fn $f() -> Option<$t> {
                let p = $s.load(Ordering::Acquire);
                // SAFETY: only chain pointers of functions of type $t are stored in $s.
                (p != 0).then(|| unsafe { core::mem::transmute::<usize, $t>(p) })
            }
        )*};
    }
    chains! {
        pthread_create, PTHREAD_CREATE, PthreadCreate;
        clone, CLONE, Clone;
        fork, FORK, Fork;
        execve, EXECVE, Execve;
        sigaction, SIGACTION, Sigaction;
        signal, SIGNAL, Signal;
        sigprocmask, SIGPROCMASK, Mask;
        pthread_sigmask, PTHREAD_SIGMASK, Mask;
        exit_, EXIT_, Exit;
        abort, ABORT, Abort;
        kill, KILL, Kill;
        raise, RAISE, Raise;
        dlopen, DLOPEN, Dlopen;
        dlclose, DLCLOSE, Dlclose;
        siglongjmp, SIGLONGJMP, Longjmp;
        longjmp_chk, LONGJMP_CHK, Longjmp;
        setuid, SETUID, SetId1;
        seteuid, SETEUID, SetId1;
        setreuid, SETREUID, SetId2;
        setresuid, SETRESUID, SetId3;
    }
}

/// Why a core hook could not be installed.
#[derive(Debug)]
pub enum InstallError {
    Lookup {
        name: &'static str,
        err: trampoline::LookupError,
    },
    Hook {
        name: &'static str,
        err: trampoline::HookError,
    },
}

impl core::fmt::Display for InstallError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InstallError::Lookup { name, err } => write!(f, "cannot find {name}: {err}"),
            InstallError::Hook { name, err } => write!(f, "cannot hook {name}: {err}"),
        }
    }
}

/// Hooks `name` in libc with `replacement`, storing the chain in `slot`.
pub fn install(
    name: &'static str,
    replacement: *const (),
    slot: &AtomicUsize,
) -> Result<(), InstallError> {
    let sym = trampoline::find_function(name, Some("libc.so.6"))
        .map_err(|err| InstallError::Lookup { name, err })?;
    // Publish the chain before the patch goes live: a call that reaches the
    // replacement in between (another thread) must find it.
    let prepared =
        trampoline::prepare(&sym, replacement).map_err(|err| InstallError::Hook { name, err })?;
    slot.store(prepared.chain() as usize, Ordering::Release);
    let hook = match prepared.enable() {
        Ok(h) => h,
        Err(err) => {
            slot.store(0, Ordering::Release);
            return Err(InstallError::Hook { name, err });
        }
    };
    // The hook stays installed for the life of the process.
    core::mem::forget(hook);
    Ok(())
}

/// sigaction through the original function (our hook bypassed).
pub(crate) fn real_sigaction(
    sig: i32,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> Result<(), i32> {
    // SAFETY: pointers are null or valid, as for sigaction(2).
    let r = unsafe {
        match orig::sigaction() {
            Some(f) => f(sig, act, old),
            None => libc::sigaction(sig, act, old),
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(sys::errno())
    }
}

/// Calls of dlopen/dlclose in progress (see [`in_loader`]).
static IN_LOADER: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Whether a dlopen or dlclose is in progress: the loader's object list
/// may be half-updated, so the calling thread must not dump from a signal
/// handler (`process/watcher.rs`).
pub fn in_loader() -> bool {
    IN_LOADER.load(core::sync::atomic::Ordering::Acquire) != 0
}

/// Runs a call of the dynamic loader counted in [`IN_LOADER`].
pub fn loading<R>(f: impl FnOnce() -> R) -> R {
    use core::sync::atomic::Ordering;
    IN_LOADER.fetch_add(1, Ordering::AcqRel);
    let r = f();
    IN_LOADER.fetch_sub(1, Ordering::AcqRel);
    r
}
