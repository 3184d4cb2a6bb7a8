//! The core hooks, installed with trampolines (DESIGN.md): thread creation,
//! fork, exec, the signal functions, the ways a process ends (_exit, abort,
//! kill/raise of itself), longjmp out of profiler code, dlopen/dlclose, and
//! the setuid family (a process
//! that gives up its privileges must still be able to write its profile).
//!
//! Owns the list of core hooks and their chain pointers ([`orig`]). Every
//! replacement passes straight through when the calling thread is already
//! inside the profiler, preserves errno and return values, and calls the
//! original through its chain pointer.
//!
//! Must never: call a hooked function except through its chain pointer while
//! the thread is marked busy; allocate from signal context.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::sys;
use crate::base::thread;

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

/// Installs every core hook; failures are reported (one line each) and the
/// run continues without that hook.
pub fn install_core() {
    use orig::*;
    let list: [(&'static str, *const (), &AtomicUsize); 20] = [
        (
            "sigaction",
            crate::process::signals::sigaction_hook as *const (),
            &SIGACTION,
        ),
        (
            "signal",
            crate::process::signals::signal_hook as *const (),
            &SIGNAL,
        ),
        (
            "sigprocmask",
            crate::process::signals::sigprocmask_hook as *const (),
            &SIGPROCMASK,
        ),
        (
            "pthread_sigmask",
            crate::process::signals::pthread_sigmask_hook as *const (),
            &PTHREAD_SIGMASK,
        ),
        (
            "pthread_create",
            pthread_create_hook as *const (),
            &PTHREAD_CREATE,
        ),
        ("clone", clone_hook as *const (), &CLONE),
        ("fork", fork_hook as *const (), &FORK),
        ("execve", execve_hook as *const (), &EXECVE),
        ("_exit", exit_hook as *const (), &EXIT_),
        ("abort", abort_hook as *const (), &ABORT),
        ("kill", kill_hook as *const (), &KILL),
        ("raise", raise_hook as *const (), &RAISE),
        ("dlopen", dlopen_hook as *const (), &DLOPEN),
        ("dlclose", dlclose_hook as *const (), &DLCLOSE),
        // longjmp and _longjmp are the same code as siglongjmp in glibc.
        ("siglongjmp", siglongjmp_hook as *const (), &SIGLONGJMP),
        ("__longjmp_chk", longjmp_chk_hook as *const (), &LONGJMP_CHK),
        ("setuid", setuid_hook as *const (), &SETUID),
        ("seteuid", seteuid_hook as *const (), &SETEUID),
        ("setreuid", setreuid_hook as *const (), &SETREUID),
        ("setresuid", setresuid_hook as *const (), &SETRESUID),
    ];
    for (name, f, slot) in list {
        if let Err(e) = install(name, f, slot) {
            crate::igprof_log!("{e}; continuing without that hook");
        } else {
            crate::igprof_debug!("hooked {name}");
        }
    }
}

// ---- threads ----

struct StartArgs {
    f: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
}

extern "C" fn thread_start(p: *mut c_void) -> *mut c_void {
    // SAFETY: p is the Box<StartArgs> made by pthread_create_hook.
    let a = unsafe { Box::from_raw(p as *mut StartArgs) };
    let (f, arg) = (a.f, a.arg);
    thread::paused(|| drop(a));
    crate::process::thread_begin();
    f(arg)
}

extern "C" fn pthread_create_hook(
    th: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    f: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let real = orig::pthread_create().expect("pthread_create hook without chain");
    crate::process::before_thread_create();
    if thread::is_busy() || !crate::process::active() {
        // SAFETY: forwarding the program's arguments unchanged.
        return unsafe { real(th, attr, f, arg) };
    }
    let boxed = thread::paused(|| Box::into_raw(Box::new(StartArgs { f, arg })));
    // SAFETY: thread_start takes ownership of boxed.
    let r = unsafe { real(th, attr, thread_start, boxed as *mut c_void) };
    if r != 0 {
        // SAFETY: the thread was not created, so boxed is still ours.
        thread::paused(|| drop(unsafe { Box::from_raw(boxed) }));
    }
    r
}

/// The function a `clone()` child runs.
pub type CloneFn = extern "C" fn(*mut c_void) -> c_int;

struct CloneArgs {
    f: CloneFn,
    arg: *mut c_void,
    top: usize,
}

/// A raw `clone()` that makes a thread of this process without a TLS of its
/// own (no `CLONE_SETTLS`): the child shares its creator's TLS, so it is
/// registered by thread id (see `thread::current`) and its function is
/// wrapped to start and end its sampling. pthread_create does not come
/// here (glibc calls its internal clone); other clones pass through.
#[allow(clippy::too_many_arguments)]
extern "C" fn clone_hook(
    f: CloneFn,
    stack: *mut c_void,
    flags: c_int,
    arg: *mut c_void,
    ptid: *mut libc::pid_t,
    tls: *mut c_void,
    ctid: *mut libc::pid_t,
) -> c_int {
    let real = orig::clone().expect("clone hook without chain");
    if flags & libc::CLONE_VM != 0 && flags & libc::CLONE_VFORK == 0 {
        // A thread, or a process sharing this memory, that runs alongside.
        crate::process::before_thread_create();
    }
    let thread_flags = libc::CLONE_VM | libc::CLONE_THREAD;
    if flags & thread_flags != thread_flags
        || flags & libc::CLONE_SETTLS != 0
        || stack.is_null()
        || thread::is_busy()
        || !crate::process::is_own_process()
    {
        // SAFETY: forwarding the program's arguments unchanged.
        return unsafe { real(f, stack, flags, arg, ptid, tls, ctid) };
    }
    thread::expect_shared_tls();
    let boxed = thread::paused(|| {
        Box::into_raw(Box::new(CloneArgs {
            f,
            arg,
            top: stack as usize,
        }))
    });
    // SAFETY: clone_start takes ownership of boxed in the child.
    let r = unsafe {
        real(
            clone_start,
            stack,
            flags,
            boxed as *mut c_void,
            ptid,
            tls,
            ctid,
        )
    };
    if r == -1 {
        let e = sys::ErrnoGuard::save();
        // SAFETY: no child was made, so boxed is still ours.
        thread::paused(|| drop(unsafe { Box::from_raw(boxed) }));
        drop(e);
    }
    r
}

extern "C" fn clone_start(p: *mut c_void) -> c_int {
    // SAFETY: p is the Box<CloneArgs> made by clone_hook.
    let a = unsafe { Box::from_raw(p as *mut CloneArgs) };
    let (f, arg, top) = (a.f, a.arg, a.top);
    drop(a);
    let t = crate::process::shared_tls_thread_begin(top);
    let r = f(arg);
    if let Some(t) = t {
        crate::process::end_thread(t);
    }
    r
}

// ---- processes ----

extern "C" fn fork_hook() -> libc::pid_t {
    let real = orig::fork().expect("fork hook without chain");
    if thread::is_busy() {
        // SAFETY: plain forward.
        return unsafe { real() };
    }
    let g = thread::current().and_then(|t| t.enter());
    crate::process::before_fork();
    // SAFETY: plain forward.
    let pid = unsafe { real() };
    let e = sys::ErrnoGuard::save();
    if pid == 0 {
        drop(g);
        crate::process::after_fork_child();
    } else {
        crate::process::after_fork_parent();
        drop(g);
    }
    drop(e);
    pid
}

extern "C" fn execve_hook(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let real = orig::execve().expect("execve hook without chain");
    // In a vfork/posix_spawn child (shared memory, different pid) or inside
    // the profiler: just exec.
    if thread::is_busy() || !crate::process::is_own_process() {
        // SAFETY: plain forward.
        return unsafe { real(path, argv, envp) };
    }
    crate::process::before_exec();
    // SAFETY: envp is the program's argument, as execve(2) takes it.
    let env = thread::paused(|| unsafe { crate::process::exec_env(envp) });
    let envp = env.as_ref().map_or(envp, |e| e.as_ptr());
    // SAFETY: forward, with the environment extended as exec_env says.
    let r = unsafe { real(path, argv, envp) };
    let e = sys::ErrnoGuard::save();
    crate::process::exec_failed();
    drop(e);
    r
}

/// Runs profiler code from a hook: the program's errno is kept and hooks
/// that `f` triggers pass through.
fn aside(f: impl FnOnce()) {
    let _errno = sys::ErrnoGuard::save();
    thread::paused(f);
}

/// Writes the profile before the process ends through `how`, if `ends()`
/// says it will (checked only outside the profiler and in our own process,
/// not in a vfork child).
fn dump_before_end(how: &str, ends: impl FnOnce() -> bool) {
    if !thread::is_busy() && crate::process::is_own_process() && ends() {
        aside(|| {
            crate::output::final_dump(how);
        });
    }
}

extern "C" fn exit_hook(status: c_int) -> ! {
    let real = orig::exit_().expect("_exit hook without chain");
    dump_before_end("_exit", || true);
    // SAFETY: plain forward.
    unsafe { real(status) }
}

extern "C" fn abort_hook() -> ! {
    let real = orig::abort().expect("abort hook without chain");
    dump_before_end("abort", || true);
    // SAFETY: plain forward.
    unsafe { real() }
}

/// Whether delivering `sig` to ourselves will end the process (its action
/// is the default and the default is to terminate or dump core).
fn fatal_to_self(sig: c_int) -> bool {
    const FATAL: [c_int; 16] = [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGABRT,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGKILL,
        libc::SIGUSR1,
        libc::SIGSEGV,
        libc::SIGUSR2,
        libc::SIGPIPE,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGSYS,
    ];
    if !FATAL.contains(&sig) {
        return false;
    }
    if sig == libc::SIGKILL {
        return true;
    }
    // SAFETY: a zeroed sigaction is a valid out-buffer.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    crate::process::signals::real_sigaction(sig, core::ptr::null(), &mut old).is_ok()
        && old.sa_sigaction == libc::SIG_DFL
}

extern "C" fn kill_hook(pid: libc::pid_t, sig: c_int) -> c_int {
    let real = orig::kill().expect("kill hook without chain");
    dump_before_end("kill", || {
        (pid == sys::getpid() || pid == 0) && fatal_to_self(sig)
    });
    // SAFETY: plain forward.
    unsafe { real(pid, sig) }
}

extern "C" fn raise_hook(sig: c_int) -> c_int {
    let real = orig::raise().expect("raise hook without chain");
    dump_before_end("raise", || fatal_to_self(sig));
    // SAFETY: plain forward.
    unsafe { real(sig) }
}

// ---- dynamic loading ----

/// Calls of dlopen/dlclose in progress (see [`in_loader`]).
static IN_LOADER: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Whether a dlopen or dlclose is in progress: the loader's object list
/// may be half-updated, so the calling thread must not dump from a signal
/// handler (`watcher.rs`).
pub fn in_loader() -> bool {
    IN_LOADER.load(core::sync::atomic::Ordering::Acquire) != 0
}

/// Runs a call of the dynamic loader counted in [`IN_LOADER`].
fn loading<R>(f: impl FnOnce() -> R) -> R {
    use core::sync::atomic::Ordering;
    IN_LOADER.fetch_add(1, Ordering::AcqRel);
    let r = f();
    IN_LOADER.fetch_sub(1, Ordering::AcqRel);
    r
}

extern "C" fn dlopen_hook(file: *const c_char, mode: c_int) -> *mut c_void {
    let real = orig::dlopen().expect("dlopen hook without chain");
    // SAFETY: plain forward.
    let h = loading(|| unsafe { real(file, mode) });
    if !h.is_null() && !thread::is_busy() {
        aside(crate::process::modules_changed);
    }
    h
}

extern "C" fn dlclose_hook(handle: *mut c_void) -> c_int {
    let real = orig::dlclose().expect("dlclose hook without chain");
    if !thread::is_busy() && crate::process::active() {
        aside(crate::output::remember_objects);
    }
    // SAFETY: plain forward.
    let r = loading(|| unsafe { real(handle) });
    if r == 0 && !thread::is_busy() {
        aside(crate::process::modules_changed);
    }
    r
}

// ---- non-local exits ----

/// Before a longjmp: the profiler never calls it, so a thread that is
/// inside the profiler here runs a program signal handler that interrupted
/// profiler code (a SIGALRM timeout, a SIGSEGV recovery) and is about to
/// leave it for good. Without this the thread would stay marked busy: never
/// sampled again, its allocations no longer counted.
fn before_longjmp() {
    if let Some(t) = thread::current().filter(|_| thread::is_busy()) {
        t.left_by_jump();
        crate::modules::mem::site::left_by_jump();
    }
}

extern "C" fn siglongjmp_hook(env: *mut c_void, val: c_int) -> ! {
    let real = orig::siglongjmp().expect("siglongjmp hook without chain");
    before_longjmp();
    // SAFETY: plain forward.
    unsafe { real(env, val) }
}

extern "C" fn longjmp_chk_hook(env: *mut c_void, val: c_int) -> ! {
    let real = orig::longjmp_chk().expect("__longjmp_chk hook without chain");
    before_longjmp();
    // SAFETY: plain forward.
    unsafe { real(env, val) }
}

// ---- privileges ----

/// Before the effective user changes to `euid` (-1: unchanged): the output
/// file is prepared while the process may still create it (a daemon that
/// drops root could not write its profile into the user's directory).
fn before_setuid(euid: libc::uid_t) {
    if euid != libc::uid_t::MAX
        // SAFETY: geteuid has no preconditions.
        && euid != unsafe { libc::geteuid() }
        && !thread::is_busy()
        && crate::process::is_own_process()
    {
        aside(|| crate::output::prepare_for_setuid(euid));
    }
}

extern "C" fn setuid_hook(uid: libc::uid_t) -> c_int {
    let real = orig::setuid().expect("setuid hook without chain");
    before_setuid(uid);
    // SAFETY: plain forward.
    unsafe { real(uid) }
}

extern "C" fn seteuid_hook(euid: libc::uid_t) -> c_int {
    let real = orig::seteuid().expect("seteuid hook without chain");
    before_setuid(euid);
    // SAFETY: plain forward.
    unsafe { real(euid) }
}

extern "C" fn setreuid_hook(ruid: libc::uid_t, euid: libc::uid_t) -> c_int {
    let real = orig::setreuid().expect("setreuid hook without chain");
    before_setuid(euid);
    // SAFETY: plain forward.
    unsafe { real(ruid, euid) }
}

extern "C" fn setresuid_hook(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int {
    let real = orig::setresuid().expect("setresuid hook without chain");
    before_setuid(euid);
    // SAFETY: plain forward.
    unsafe { real(ruid, euid, suid) }
}
