//! The core hooks, installed with trampolines (trampoline/): thread creation,
//! fork, exec, the signal functions, the ways a process ends (_exit, abort,
//! kill/raise of itself), longjmp out of profiler code, dlopen/dlclose, the
//! setuid family (a process that gives up its privileges must still be
//! able to write its profile), and ptrace(PTRACE_TRACEME).
//!
//! Owns the list of core hooks (their chain pointers are `hook::orig`). Every
//! replacement passes straight through when the calling thread is already
//! inside the profiler, preserves errno and return values, and calls the
//! original through its chain pointer.
//!
//! Must never: call a hooked function except through its chain pointer while
//! the thread is marked busy; allocate from signal context.

use core::ffi::{c_char, c_int, c_void};

use crate::base::thread;
use crate::hook::{install, loading, orig, CloneFn};
use crate::sys;

/// Installs every core hook; failures are reported (one line each) and the
/// run continues without that hook.
pub fn install_core() {
    use orig::*;
    let list: [(&'static str, *const (), Core); 21] = [
        (
            "sigaction",
            crate::process::signals::sigaction_hook as *const (),
            Core::SIGACTION,
        ),
        (
            "signal",
            crate::process::signals::signal_hook as *const (),
            Core::SIGNAL,
        ),
        (
            "sigprocmask",
            crate::process::signals::sigprocmask_hook as *const (),
            Core::SIGPROCMASK,
        ),
        (
            "pthread_sigmask",
            crate::process::signals::pthread_sigmask_hook as *const (),
            Core::PTHREAD_SIGMASK,
        ),
        (
            "pthread_create",
            pthread_create_hook as *const (),
            Core::PTHREAD_CREATE,
        ),
        ("clone", clone_hook as *const (), Core::CLONE),
        ("fork", fork_hook as *const (), Core::FORK),
        ("execve", execve_hook as *const (), Core::EXECVE),
        ("_exit", exit_hook as *const (), Core::EXIT_),
        ("abort", abort_hook as *const (), Core::ABORT),
        ("kill", kill_hook as *const (), Core::KILL),
        ("raise", raise_hook as *const (), Core::RAISE),
        ("dlopen", dlopen_hook as *const (), Core::DLOPEN),
        ("dlclose", dlclose_hook as *const (), Core::DLCLOSE),
        // longjmp and _longjmp are the same code as siglongjmp in glibc.
        ("siglongjmp", siglongjmp_hook as *const (), Core::SIGLONGJMP),
        (
            "__longjmp_chk",
            longjmp_chk_hook as *const (),
            Core::LONGJMP_CHK,
        ),
        ("setuid", setuid_hook as *const (), Core::SETUID),
        ("seteuid", seteuid_hook as *const (), Core::SETEUID),
        ("setreuid", setreuid_hook as *const (), Core::SETREUID),
        ("setresuid", setresuid_hook as *const (), Core::SETRESUID),
        ("ptrace", ptrace_hook as *const (), Core::PTRACE),
    ];
    for (name, f, slot) in list {
        if let Err(e) = install(name, f, slot) {
            crate::igprof_log!("{e}; continuing without that hook");
        } else {
            crate::igprof_debug!("hooked {name}");
        }
    }
    set_sanitizer_death_callback();
}

/// A sanitizer runtime (ASan, LSan, TSan; UBSan with halt_on_error) ends
/// the process after its reports (LeakSanitizer's at exit, an ASan error)
/// with a raw exit_group, past the `_exit` hook and the library destructor:
/// its death callback, called first, writes the profile. Found as dlsym
/// finds it, asked only when a loaded object defines the name
/// ([`trampoline::global_symbol`]: most programs have no sanitizer, and a
/// failed dlsym leaves its error text for the program's `dlerror()`). A program that
/// sets its own callback replaces this one (its run then ends without a
/// profile when the sanitizer ends it).
fn set_sanitizer_death_callback() {
    let Some(f) = trampoline::global_symbol(c"__sanitizer_set_death_callback") else {
        return;
    };
    // SAFETY: the sanitizer interface's
    // `void __sanitizer_set_death_callback(void (*callback)(void))`.
    let set: extern "C" fn(Option<extern "C" fn()>) = unsafe { core::mem::transmute(f) };
    set(Some(sanitizer_death));
}

extern "C" fn sanitizer_death() {
    dump_before_end("sanitizer exit", || true);
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
    if thread::is_busy() {
        // SAFETY: plain forward.
        return unsafe { real(path, argv, envp) };
    }
    if !crate::process::is_own_process() {
        // A child that vfork or posix_spawn made (shared memory, another
        // pid): nothing but the exec, and a line if the program it runs
        // cannot be profiled (the check allocates nothing).
        aside(|| say_if_unprofiled(path, envp, false));
        // SAFETY: plain forward.
        return unsafe { real(path, argv, envp) };
    }
    crate::process::before_exec();
    // SAFETY: envp is the program's argument, as execve(2) takes it.
    let env = thread::paused(|| unsafe { crate::process::exec_env(envp) });
    aside(|| say_if_unprofiled(path, envp, true));
    let envp = env.as_ref().map_or(envp, |e| e.as_ptr());
    // SAFETY: forward, with the environment extended as exec_env says.
    let r = unsafe { real(path, argv, envp) };
    let e = sys::ErrnoGuard::save();
    crate::process::exec_failed();
    drop(e);
    r
}

/// The line for an exec of `path` (with environment `envp`) whose image
/// will run unprofiled, if it will; `own_process`: not a vfork or
/// posix_spawn child, so the line names where this image's profile was
/// written before the exec. Allocates nothing unless it names it.
fn say_if_unprofiled(path: *const c_char, envp: *const *const c_char, own_process: bool) {
    if path.is_null() {
        return;
    }
    // SAFETY: execve's path, a NUL-terminated string.
    let p = unsafe { core::ffi::CStr::from_ptr(path) };
    // SAFETY: envp as execve(2) takes it (null or null-terminated).
    if let Some(why) = unsafe { crate::process::unprofiled_exec(p, envp) } {
        let profile = own_process.then(crate::output::path::output_path);
        crate::process::say_unprofiled_exec(p.to_bytes(), why, profile.as_deref());
    }
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
pub(crate) fn dump_before_end(how: &str, ends: impl FnOnce() -> bool) {
    if !thread::is_busy() && crate::process::is_own_process() && ends() {
        aside(|| {
            crate::process::ending::final_dump(how);
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
    crate::hook::real_sigaction(sig, core::ptr::null(), &mut old).is_ok()
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

extern "C" fn dlopen_hook(file: *const c_char, mode: c_int) -> *mut c_void {
    let real = orig::dlopen().expect("dlopen hook without chain");
    // SAFETY: plain forward.
    let h = loading(|| unsafe { real(file, mode) });
    if !h.is_null() && !thread::is_busy() {
        aside(crate::process::objects_changed);
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
        aside(crate::process::objects_changed);
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
    let Some(t) = thread::current() else { return };
    // The modules are told even when the thread is not busy: the free path
    // and a real realloc mark a hook record without the guard, and a jump
    // out of them must clear it too, or every later event of the thread
    // would be taken for a nested one and deferred.
    let busy = thread::is_busy();
    if busy {
        t.left_by_jump();
    }
    crate::process::each_module(|m| {
        if let Some(f) = m.left_by_jump {
            f(busy)
        }
    });
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

/// ptrace(PTRACE_TRACEME): the program makes its parent its tracer (an
/// anti-debugging check does, with no debugger there), which then stops
/// it at every signal it is sent and waits for the parent to resume it: a
/// sampling signal would stop it for good. Sampling ends here, before the
/// call (a signal already pending is delivered untraced), and one line
/// says so.
extern "C" fn ptrace_hook(
    req: c_int,
    pid: libc::pid_t,
    addr: *mut c_void,
    data: *mut c_void,
) -> libc::c_long {
    let real = orig::ptrace().expect("ptrace hook without chain");
    if req == libc::PTRACE_TRACEME as c_int
        && crate::sampler::signal() != 0
        && !thread::is_busy()
        && crate::process::is_own_process()
    {
        aside(|| {
            crate::process::stop_sampling();
            crate::igprof_log!(
                "ptrace(PTRACE_TRACEME): sampling ends here (its tracer, the parent, would stop the program at every sampling signal)"
            );
        });
    }
    // SAFETY: plain forward of the four words glibc's ptrace reads.
    unsafe { real(req, pid, addr, data) }
}

extern "C" fn setresuid_hook(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int {
    let real = orig::setresuid().expect("setresuid hook without chain");
    before_setuid(euid);
    // SAFETY: plain forward.
    unsafe { real(ruid, euid, suid) }
}
