//! The descriptor-function replacements installed with trampolines.
//!
//! Owns the chain pointers of the hooked descriptor functions in libc. Each
//! replacement calls the original through its chain pointer, returns its
//! result unchanged with the `errno` it left, and records only what
//! succeeded. A descriptor is released *before* the real close (after it,
//! another thread may already have been given the same number).
//!
//! stdio: fopen/fopen64/tmpfile/tmpfile64 are hooked themselves and count
//! the stream's descriptor at the caller of fopen (the `open` libc makes
//! inside them is not counted again); fclose releases the stream's
//! descriptor (libc closes it with an internal call no hook sees). fdopen
//! creates no descriptor and is not hooked. `open`/`open64` and the other
//! aliases sharing one address are hooked once.
//!
//! Must never: call a hooked function except through its chain pointer
//! while recording, allocate, or change the program's view of the call.

use core::ffi::{c_char, c_int, c_uint};

use crate::hook::{hook_table, Hooked};
use crate::modules::mem::site::{self, FD_OUTER};
use crate::sys::ErrnoGuard;

hook_table! {
    /// The hooked descriptor functions, with the signatures their
    /// originals are called with (`mode` of the open family is read by
    /// the original only when `flags` ask for it, as from the variadic
    /// call).
    enum F {
        Open => fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
        Open64 => fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
        Openat => fn openat(dir: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
        Openat64 => fn openat64(dir: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
        Creat => fn creat(path: *const c_char, mode: libc::mode_t) -> c_int;
        Creat64 => fn creat64(path: *const c_char, mode: libc::mode_t) -> c_int;
        Close => fn close(fd: c_int) -> c_int;
        CloseRange => fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
        Dup => fn dup(old: c_int) -> c_int;
        Dup2 => fn dup2(old: c_int, new: c_int) -> c_int;
        Dup3 => fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
        Pipe => fn pipe(fds: *mut c_int) -> c_int;
        Pipe2 => fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
        Socket => fn socket(d: c_int, t: c_int, p: c_int) -> c_int;
        Socketpair => fn socketpair(d: c_int, t: c_int, p: c_int, sv: *mut c_int) -> c_int;
        Accept => fn accept(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> c_int;
        Accept4 => fn accept4(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t, f: c_int) -> c_int;
        EpollCreate => fn epoll_create(n: c_int) -> c_int;
        EpollCreate1 => fn epoll_create1(f: c_int) -> c_int;
        Eventfd => fn eventfd(init: c_uint, f: c_int) -> c_int;
        TimerfdCreate => fn timerfd_create(c: c_int, f: c_int) -> c_int;
        Signalfd => fn signalfd(fd: c_int, mask: *const libc::sigset_t, f: c_int) -> c_int;
        MemfdCreate => fn memfd_create(name: *const c_char, f: c_uint) -> c_int;
        InotifyInit => fn inotify_init() -> c_int;
        InotifyInit1 => fn inotify_init1(f: c_int) -> c_int;
        Fopen => fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
        Fopen64 => fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
        Tmpfile => fn tmpfile() -> *mut libc::FILE;
        Tmpfile64 => fn tmpfile64() -> *mut libc::FILE;
        Fclose => fn fclose(f: *mut libc::FILE) -> c_int;
    }
}

fn list() -> [(F, &'static str, *const ()); N] {
    use F::*;
    [
        (Open, "open", open_hook as *const ()),
        (Open64, "open64", open64_hook as *const ()),
        (Openat, "openat", openat_hook as *const ()),
        (Openat64, "openat64", openat64_hook as *const ()),
        (Creat, "creat", creat_hook as *const ()),
        (Creat64, "creat64", creat64_hook as *const ()),
        (Close, "close", close_hook as *const ()),
        (CloseRange, "close_range", close_range_hook as *const ()),
        (Dup, "dup", dup_hook as *const ()),
        (Dup2, "dup2", dup2_hook as *const ()),
        (Dup3, "dup3", dup3_hook as *const ()),
        (Pipe, "pipe", pipe_hook as *const ()),
        (Pipe2, "pipe2", pipe2_hook as *const ()),
        (Socket, "socket", socket_hook as *const ()),
        (Socketpair, "socketpair", socketpair_hook as *const ()),
        (Accept, "accept", accept_hook as *const ()),
        (Accept4, "accept4", accept4_hook as *const ()),
        (EpollCreate, "epoll_create", epoll_create_hook as *const ()),
        (
            EpollCreate1,
            "epoll_create1",
            epoll_create1_hook as *const (),
        ),
        (Eventfd, "eventfd", eventfd_hook as *const ()),
        (
            TimerfdCreate,
            "timerfd_create",
            timerfd_create_hook as *const (),
        ),
        (Signalfd, "signalfd", signalfd_hook as *const ()),
        (MemfdCreate, "memfd_create", memfd_create_hook as *const ()),
        (InotifyInit, "inotify_init", inotify_init_hook as *const ()),
        (
            InotifyInit1,
            "inotify_init1",
            inotify_init1_hook as *const (),
        ),
        (Fopen, "fopen", fopen_hook as *const ()),
        (Fopen64, "fopen64", fopen64_hook as *const ()),
        (Tmpfile, "tmpfile", tmpfile_hook as *const ()),
        (Tmpfile64, "tmpfile64", tmpfile64_hook as *const ()),
        (Fclose, "fclose", fclose_hook as *const ()),
    ]
}

/// Installs every descriptor hook found in libc (aliases once).
pub fn install() {
    let mut hooked = Hooked::default();
    for (f, name, repl) in list() {
        let Ok(sym) = trampoline::find_function(name, Some("libc.so.6")) else {
            crate::igprof_debug!("-fd: {name} is not in this libc");
            continue;
        };
        if let Err(err) = hooked.hook(&sym, repl, |c| CHAIN.set(f as usize, c)) {
            crate::igprof_log!("-fd: cannot hook {name}: {err}; continuing without it");
        }
    }
}

// ---- recording ----

/// `fd` was created by the caller (if it is a descriptor).
#[inline]
fn created(fd: c_int) {
    if fd < 0 || !crate::base::run::recording() {
        return;
    }
    let _e = ErrnoGuard::save();
    site::event(
        super::KIND_ACQUIRE,
        fd as usize,
        0,
        super::replay,
        |g, h| {
            if let Some(n) = site::caller_node(g, h, FD_OUTER) {
                super::acquire(g, n, fd);
            }
        },
    );
}

/// `fd` is about to be closed.
#[inline]
fn closing(fd: c_int) {
    if fd < 0 {
        return;
    }
    let _e = ErrnoGuard::save();
    if site::recording() {
        site::defer_now(super::KIND_RELEASE, fd as usize, 0, super::replay);
        return;
    }
    super::release(fd);
}

fn stream_created(f: *mut libc::FILE) {
    if !f.is_null() {
        let _e = ErrnoGuard::save();
        // SAFETY: f is a stream the real function just returned.
        let fd = unsafe { libc::fileno(f) };
        drop(_e);
        created(fd);
    }
}

// ---- the replacements ----

extern "C" fn open_hook(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let fd = chain::open(path, flags, mode);
    created(fd);
    fd
}

extern "C" fn open64_hook(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let fd = chain::open64(path, flags, mode);
    created(fd);
    fd
}

extern "C" fn openat_hook(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    let fd = chain::openat(dir, path, flags, mode);
    created(fd);
    fd
}

extern "C" fn openat64_hook(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    let fd = chain::openat64(dir, path, flags, mode);
    created(fd);
    fd
}

extern "C" fn creat_hook(path: *const c_char, mode: libc::mode_t) -> c_int {
    let fd = site::with_outer(FD_OUTER, || chain::creat(path, mode));
    created(fd);
    fd
}

extern "C" fn creat64_hook(path: *const c_char, mode: libc::mode_t) -> c_int {
    let fd = site::with_outer(FD_OUTER, || chain::creat64(path, mode));
    created(fd);
    fd
}

extern "C" fn close_hook(fd: c_int) -> c_int {
    closing(fd);
    chain::close(fd)
}

extern "C" fn close_range_hook(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags as c_uint & libc::CLOSE_RANGE_CLOEXEC == 0 && first <= last {
        let end = (last as u64).min(super::LIVE.limit() as u64);
        let mut fd = first as u64;
        while fd <= end {
            if !super::LIVE.get(fd as c_int).is_null() {
                closing(fd as c_int);
            }
            fd += 1;
        }
    }
    chain::close_range(first, last, flags)
}

extern "C" fn dup_hook(old: c_int) -> c_int {
    let fd = chain::dup(old);
    created(fd);
    fd
}

/// dup2/dup3: `new` now refers to `old`'s file; whatever `new` was before
/// is released (by the acquire replacing it in the live table).
extern "C" fn dup2_hook(old: c_int, new: c_int) -> c_int {
    let fd = chain::dup2(old, new);
    if fd >= 0 && old != new {
        created(fd);
    }
    fd
}

extern "C" fn dup3_hook(old: c_int, new: c_int, flags: c_int) -> c_int {
    let fd = chain::dup3(old, new, flags);
    created(fd);
    fd
}

fn created_pair(r: c_int, fds: *mut c_int) {
    if r == 0 && !fds.is_null() {
        // SAFETY: on success the real call filled fds[0] and fds[1].
        let (a, b) = unsafe { (*fds, *fds.add(1)) };
        created(a);
        created(b);
    }
}

extern "C" fn pipe_hook(fds: *mut c_int) -> c_int {
    let r = chain::pipe(fds);
    created_pair(r, fds);
    r
}

extern "C" fn pipe2_hook(fds: *mut c_int, flags: c_int) -> c_int {
    let r = chain::pipe2(fds, flags);
    created_pair(r, fds);
    r
}

extern "C" fn socket_hook(d: c_int, t: c_int, p: c_int) -> c_int {
    let fd = chain::socket(d, t, p);
    created(fd);
    fd
}

extern "C" fn socketpair_hook(d: c_int, t: c_int, p: c_int, sv: *mut c_int) -> c_int {
    let r = chain::socketpair(d, t, p, sv);
    created_pair(r, sv);
    r
}

extern "C" fn accept_hook(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> c_int {
    let fd = chain::accept(s, a, l);
    created(fd);
    fd
}

extern "C" fn accept4_hook(
    s: c_int,
    a: *mut libc::sockaddr,
    l: *mut libc::socklen_t,
    f: c_int,
) -> c_int {
    let fd = chain::accept4(s, a, l, f);
    created(fd);
    fd
}

extern "C" fn epoll_create_hook(n: c_int) -> c_int {
    let fd = chain::epoll_create(n);
    created(fd);
    fd
}

extern "C" fn epoll_create1_hook(f: c_int) -> c_int {
    let fd = chain::epoll_create1(f);
    created(fd);
    fd
}

extern "C" fn eventfd_hook(init: c_uint, f: c_int) -> c_int {
    let fd = chain::eventfd(init, f);
    created(fd);
    fd
}

extern "C" fn timerfd_create_hook(c: c_int, f: c_int) -> c_int {
    let fd = chain::timerfd_create(c, f);
    created(fd);
    fd
}

extern "C" fn signalfd_hook(fd: c_int, mask: *const libc::sigset_t, f: c_int) -> c_int {
    let r = chain::signalfd(fd, mask, f);
    // signalfd(-1, ...) creates a descriptor; signalfd(fd, ...) updates one.
    if fd == -1 {
        created(r);
    }
    r
}

extern "C" fn memfd_create_hook(name: *const c_char, f: c_uint) -> c_int {
    let fd = chain::memfd_create(name, f);
    created(fd);
    fd
}

extern "C" fn inotify_init_hook() -> c_int {
    let fd = chain::inotify_init();
    created(fd);
    fd
}

extern "C" fn inotify_init1_hook(f: c_int) -> c_int {
    let fd = chain::inotify_init1(f);
    created(fd);
    fd
}

extern "C" fn fopen_hook(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let f = site::with_outer(FD_OUTER, || chain::fopen(path, mode));
    stream_created(f);
    f
}

extern "C" fn fopen64_hook(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let f = site::with_outer(FD_OUTER, || chain::fopen64(path, mode));
    stream_created(f);
    f
}

extern "C" fn tmpfile_hook() -> *mut libc::FILE {
    let f = site::with_outer(FD_OUTER, chain::tmpfile);
    stream_created(f);
    f
}

extern "C" fn tmpfile64_hook() -> *mut libc::FILE {
    let f = site::with_outer(FD_OUTER, chain::tmpfile64);
    stream_created(f);
    f
}

extern "C" fn fclose_hook(f: *mut libc::FILE) -> c_int {
    if !f.is_null() {
        let e = ErrnoGuard::save();
        // SAFETY: f is the program's open stream (fclose requires it).
        let fd = unsafe { libc::fileno(f) };
        drop(e);
        closing(fd);
    }
    site::with_outer(FD_OUTER, || chain::fclose(f))
}
