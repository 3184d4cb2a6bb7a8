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

use crate::base::sys::ErrnoGuard;
use crate::hook::{Chains, Hooked};
use crate::modules::mem::site::{self, FD_OUTER};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum F {
    Open,
    Open64,
    Openat,
    Openat64,
    Creat,
    Creat64,
    Close,
    CloseRange,
    Dup,
    Dup2,
    Dup3,
    Pipe,
    Pipe2,
    Socket,
    Socketpair,
    Accept,
    Accept4,
    EpollCreate,
    EpollCreate1,
    Eventfd,
    TimerfdCreate,
    Signalfd,
    MemfdCreate,
    InotifyInit,
    InotifyInit1,
    Fopen,
    Fopen64,
    Tmpfile,
    Tmpfile64,
    Fclose,
}
const N: usize = 30;

static CHAIN: Chains<N> = Chains::new();

type Open = unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int;
type Openat = unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int;
type Creat = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;
type Int1 = unsafe extern "C" fn(c_int) -> c_int;
type Int2 = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Int3 = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type Int0 = unsafe extern "C" fn() -> c_int;
type CloseRange = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
type Pipe = unsafe extern "C" fn(*mut c_int) -> c_int;
type Pipe2 = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type Socketpair = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_int) -> c_int;
type Accept = unsafe extern "C" fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> c_int;
type Accept4 =
    unsafe extern "C" fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t, c_int) -> c_int;
type Eventfd = unsafe extern "C" fn(c_uint, c_int) -> c_int;
type Signalfd = unsafe extern "C" fn(c_int, *const libc::sigset_t, c_int) -> c_int;
type Memfd = unsafe extern "C" fn(*const c_char, c_uint) -> c_int;
type Fopen = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
type Tmpfile = unsafe extern "C" fn() -> *mut libc::FILE;
type Fclose = unsafe extern "C" fn(*mut libc::FILE) -> c_int;

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
        |t, h| {
            if let Some(n) = site::caller_node(t, h, FD_OUTER) {
                super::acquire(n, fd);
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
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged (mode is read by open
    // only when flags ask for it, as from the variadic call).
    let fd = unsafe { CHAIN.get::<Open>(F::Open as usize)(path, flags, mode) };
    created(fd);
    fd
}

extern "C" fn open64_hook(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: as open_hook.
    let fd = unsafe { CHAIN.get::<Open>(F::Open64 as usize)(path, flags, mode) };
    created(fd);
    fd
}

extern "C" fn openat_hook(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    // SAFETY: as open_hook.
    let fd = unsafe { CHAIN.get::<Openat>(F::Openat as usize)(dir, path, flags, mode) };
    created(fd);
    fd
}

extern "C" fn openat64_hook(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    // SAFETY: as open_hook.
    let fd = unsafe { CHAIN.get::<Openat>(F::Openat64 as usize)(dir, path, flags, mode) };
    created(fd);
    fd
}

extern "C" fn creat_hook(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Creat>(F::Creat as usize)(path, mode)
    });
    created(fd);
    fd
}

extern "C" fn creat64_hook(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Creat>(F::Creat64 as usize)(path, mode)
    });
    created(fd);
    fd
}

extern "C" fn close_hook(fd: c_int) -> c_int {
    closing(fd);
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    unsafe { CHAIN.get::<Int1>(F::Close as usize)(fd) }
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
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    unsafe { CHAIN.get::<CloseRange>(F::CloseRange as usize)(first, last, flags) }
}

extern "C" fn dup_hook(old: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int1>(F::Dup as usize)(old) };
    created(fd);
    fd
}

/// dup2/dup3: `new` now refers to `old`'s file; whatever `new` was before
/// is released (by the acquire replacing it in the live table).
extern "C" fn dup2_hook(old: c_int, new: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int2>(F::Dup2 as usize)(old, new) };
    if fd >= 0 && old != new {
        created(fd);
    }
    fd
}

extern "C" fn dup3_hook(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int3>(F::Dup3 as usize)(old, new, flags) };
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
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let r = unsafe { CHAIN.get::<Pipe>(F::Pipe as usize)(fds) };
    created_pair(r, fds);
    r
}

extern "C" fn pipe2_hook(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let r = unsafe { CHAIN.get::<Pipe2>(F::Pipe2 as usize)(fds, flags) };
    created_pair(r, fds);
    r
}

extern "C" fn socket_hook(d: c_int, t: c_int, p: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int3>(F::Socket as usize)(d, t, p) };
    created(fd);
    fd
}

extern "C" fn socketpair_hook(d: c_int, t: c_int, p: c_int, sv: *mut c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let r = unsafe { CHAIN.get::<Socketpair>(F::Socketpair as usize)(d, t, p, sv) };
    created_pair(r, sv);
    r
}

extern "C" fn accept_hook(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Accept>(F::Accept as usize)(s, a, l) };
    created(fd);
    fd
}

extern "C" fn accept4_hook(
    s: c_int,
    a: *mut libc::sockaddr,
    l: *mut libc::socklen_t,
    f: c_int,
) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Accept4>(F::Accept4 as usize)(s, a, l, f) };
    created(fd);
    fd
}

extern "C" fn epoll_create_hook(n: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int1>(F::EpollCreate as usize)(n) };
    created(fd);
    fd
}

extern "C" fn epoll_create1_hook(f: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int1>(F::EpollCreate1 as usize)(f) };
    created(fd);
    fd
}

extern "C" fn eventfd_hook(init: c_uint, f: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Eventfd>(F::Eventfd as usize)(init, f) };
    created(fd);
    fd
}

extern "C" fn timerfd_create_hook(c: c_int, f: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int2>(F::TimerfdCreate as usize)(c, f) };
    created(fd);
    fd
}

extern "C" fn signalfd_hook(fd: c_int, mask: *const libc::sigset_t, f: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let r = unsafe { CHAIN.get::<Signalfd>(F::Signalfd as usize)(fd, mask, f) };
    // signalfd(-1, ...) creates a descriptor; signalfd(fd, ...) updates one.
    if fd == -1 {
        created(r);
    }
    r
}

extern "C" fn memfd_create_hook(name: *const c_char, f: c_uint) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Memfd>(F::MemfdCreate as usize)(name, f) };
    created(fd);
    fd
}

extern "C" fn inotify_init_hook() -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int0>(F::InotifyInit as usize)() };
    created(fd);
    fd
}

extern "C" fn inotify_init1_hook(f: c_int) -> c_int {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let fd = unsafe { CHAIN.get::<Int1>(F::InotifyInit1 as usize)(f) };
    created(fd);
    fd
}

extern "C" fn fopen_hook(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let f = site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Fopen>(F::Fopen as usize)(path, mode)
    });
    stream_created(f);
    f
}

extern "C" fn fopen64_hook(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let f = site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Fopen>(F::Fopen64 as usize)(path, mode)
    });
    stream_created(f);
    f
}

extern "C" fn tmpfile_hook() -> *mut libc::FILE {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let f = site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Tmpfile>(F::Tmpfile as usize)()
    });
    stream_created(f);
    f
}

extern "C" fn tmpfile64_hook() -> *mut libc::FILE {
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    let f = site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Tmpfile>(F::Tmpfile64 as usize)()
    });
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
    // SAFETY: the chain has this function's type and is set before its hook runs; forwarding the program's call unchanged.
    site::with_outer(FD_OUTER, || unsafe {
        CHAIN.get::<Fclose>(F::Fclose as usize)(f)
    })
}
