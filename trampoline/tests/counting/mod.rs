//! Counting replacements for libc functions, shared by the live libc hook
//! tests (`libc_hooks`, `aarch64_libc`): a const-initialised thread-local
//! "measured" flag, one [`Slot`] per function (calls counted, chain
//! pointer), and replacements that count and then call the chain.
//!
//! Must never: allocate or take a lock in a replacement (they run inside
//! malloc/free and from several threads at once).

// Each test binary hooks a subset of these functions.
#![allow(dead_code)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

thread_local! {
    /// True on a worker thread inside its measured window.
    pub static MEASURED: Cell<bool> = const { Cell::new(false) };
}

/// Set this thread's measured flag.
pub fn set_measured(on: bool) {
    MEASURED.with(|m| m.set(on));
}

/// Per hooked function: calls counted in measured windows, chain pointer.
pub struct Slot {
    pub calls: AtomicUsize,
    pub chain: AtomicUsize,
}

impl Slot {
    pub const fn new() -> Slot {
        Slot {
            calls: AtomicUsize::new(0),
            chain: AtomicUsize::new(0),
        }
    }

    /// Count the call if made in a measured window; return the chain.
    fn enter(&self) -> usize {
        if MEASURED.with(|m| m.get()) {
            self.calls.fetch_add(1, SeqCst);
        }
        self.chain.load(SeqCst)
    }
}

pub static GETPID: Slot = Slot::new();
pub static STRLEN: Slot = Slot::new();
pub static MALLOC: Slot = Slot::new();
pub static FREE: Slot = Slot::new();
pub static OPEN: Slot = Slot::new();
pub static CLOSE: Slot = Slot::new();

// Each slot's chain holds the trampoline of the libc function of the same
// type, stored before the hook was enabled.
pub extern "C" fn r_getpid() -> libc::pid_t {
    // SAFETY: the slot's chain is this function's trampoline (same type).
    let f: extern "C" fn() -> libc::pid_t = unsafe { std::mem::transmute(GETPID.enter()) };
    f()
}
pub extern "C" fn r_strlen(s: *const c_char) -> usize {
    // SAFETY: the slot's chain is this function's trampoline (same type).
    let f: extern "C" fn(*const c_char) -> usize = unsafe { std::mem::transmute(STRLEN.enter()) };
    f(s)
}
pub extern "C" fn r_malloc(n: usize) -> *mut c_void {
    // SAFETY: the slot's chain is this function's trampoline (same type).
    let f: extern "C" fn(usize) -> *mut c_void = unsafe { std::mem::transmute(MALLOC.enter()) };
    f(n)
}
pub extern "C" fn r_free(p: *mut c_void) {
    // SAFETY: the slot's chain is this function's trampoline (same type).
    let f: extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(FREE.enter()) };
    f(p)
}
pub extern "C" fn r_open(path: *const c_char, flags: c_int, mode: libc::c_uint) -> c_int {
    // SAFETY: the slot's chain is this function's trampoline (same type).
    let f: extern "C" fn(*const c_char, c_int, libc::c_uint) -> c_int =
        unsafe { std::mem::transmute(OPEN.enter()) };
    f(path, flags, mode)
}
pub extern "C" fn r_close(fd: c_int) -> c_int {
    // SAFETY: the slot's chain is this function's trampoline (same type).
    let f: extern "C" fn(c_int) -> c_int = unsafe { std::mem::transmute(CLOSE.enter()) };
    f(fd)
}
