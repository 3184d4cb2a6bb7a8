//! Calls a Rust program makes to the igprof-rs profiler: custom pool blocks
//! for the memory profiler ([`alloc_event`], [`free_event`]), a snapshot
//! ([`dump_now`]) and recording on and off ([`enable`], [`disable`]). The
//! C programs' equivalent is `include/igprof.h`.
//!
//! Run unprofiled, every call is a no-op (the query ones return -1); run
//! under `igprof` (which preloads libigprof.so), they reach the profiler.
//! Each function's address is looked up with `dlsym` the first time it is
//! called and cached in an atomic: later calls cost a relaxed load and a
//! test (figures in docs/benchmarks.md). The crate has no dependencies;
//! the program links `dlsym` from the C library.
//!
//! Owns only the lookup and the calls; must never dereference a pointer it
//! is given, or call `dlsym` again once a name is known (found or absent).

#![no_std]

use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicUsize, Ordering};

#[link(name = "dl")]
extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// glibc's RTLD_DEFAULT: search the global scope (the program and what it
/// loaded, LD_PRELOAD first).
const RTLD_DEFAULT: *mut c_void = core::ptr::null_mut();

/// Not looked up yet.
const UNKNOWN: usize = 0;
/// Looked up, and no loaded object defines it.
const ABSENT: usize = 1;

/// One exported function of libigprof.so, its address cached.
struct Sym {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Sym {
    const fn new(name: &'static CStr) -> Sym {
        Sym {
            name,
            addr: AtomicUsize::new(UNKNOWN),
        }
    }

    /// The function's address, or None when the profiler is not loaded.
    #[inline(always)]
    fn get(&self) -> Option<usize> {
        match self.addr.load(Ordering::Relaxed) {
            ABSENT => None,
            UNKNOWN => self.look_up(),
            a => Some(a),
        }
    }

    /// First call: asks the dynamic linker (two threads may both ask; they
    /// get the same answer).
    #[cold]
    #[inline(never)]
    fn look_up(&self) -> Option<usize> {
        // SAFETY: RTLD_DEFAULT is a valid handle and the name is
        // NUL-terminated; dlsym has no other precondition.
        let a = unsafe { dlsym(RTLD_DEFAULT, self.name.as_ptr()) } as usize;
        let stored = if a == 0 { ABSENT } else { a };
        self.addr.store(stored, Ordering::Relaxed);
        (a != 0).then_some(a)
    }
}

static DUMP_NOW: Sym = Sym::new(c"igprof_dump_now");
static ENABLE: Sym = Sym::new(c"igprof_enable");
static DISABLE: Sym = Sym::new(c"igprof_disable");
static MARK: Sym = Sym::new(c"igprof_mark");
static ALLOC_EVENT: Sym = Sym::new(c"igprof_alloc_event");
static FREE_EVENT: Sym = Sym::new(c"igprof_free_event");

/// Whether the profiler's library is loaded in this process.
pub fn loaded() -> bool {
    ENABLE.get().is_some()
}

/// A custom pool (arena, free list, slab) handed out the block of `size`
/// bytes at `ptr`. Under `igprof -mp` it is recorded as a malloc'd block
/// is: charged to the caller's stack, in every memory counter, for `size`
/// bytes whatever -mo says; with `--sample-bytes` it is sampled as malloc's
/// blocks are. Does nothing otherwise. The pointer is never dereferenced.
///
/// A block that starts at the address of another live recorded block (the
/// pool's own chunk, if it came from the global allocator) replaces that
/// block's record: start the first block after a header.
#[inline]
pub fn alloc_event<T>(ptr: *const T, size: usize) {
    if let Some(a) = ALLOC_EVENT.get() {
        // SAFETY: the address libigprof.so exports for this name, with
        // this signature (include/igprof.h).
        let f: extern "C" fn(*mut c_void, usize) = unsafe { core::mem::transmute(a) };
        f(ptr as *mut c_void, size)
    }
}

/// The custom pool took back the block at `ptr` (reported with
/// [`alloc_event`]): it leaves MEM_LIVE. A pointer that is no recorded
/// block is ignored (but one that is a live block of the global allocator
/// takes that block's record out: report only the pool's blocks).
#[inline]
pub fn free_event<T>(ptr: *const T) {
    if let Some(a) = FREE_EVENT.get() {
        // SAFETY: as in alloc_event.
        let f: extern "C" fn(*mut c_void) = unsafe { core::mem::transmute(a) };
        f(ptr as *mut c_void)
    }
}

/// Writes a snapshot of the profile so far to `path` (None: the run's
/// output file). Returns 0 on success, -1 if not profiled or the write
/// failed.
pub fn dump_now(path: Option<&CStr>) -> i32 {
    match DUMP_NOW.get() {
        Some(a) => {
            // SAFETY: as in alloc_event; the path outlives the call.
            let f: extern "C" fn(*const c_char) -> c_int = unsafe { core::mem::transmute(a) };
            f(path.map_or(core::ptr::null(), CStr::as_ptr))
        }
        None => -1,
    }
}

/// Turns recording on (after `igprof -pd`, or [`disable`]). Returns 1 if it
/// was already on, 0 if it was off, -1 if not profiled.
pub fn enable() -> i32 {
    switch(&ENABLE)
}

/// Turns recording off until [`enable`] (what was recorded stays, and its
/// releases still count). Returns 1 if it was on, 0 if it was off, -1 if
/// not profiled.
pub fn disable() -> i32 {
    switch(&DISABLE)
}

/// Starts a new epoch of the memory profiler (`igprof -mp --marks`): the
/// new epoch's number, or -1 when the run takes no marks.
pub fn mark() -> i32 {
    switch(&MARK)
}

fn switch(s: &Sym) -> i32 {
    match s.get() {
        Some(a) => {
            // SAFETY: as in alloc_event.
            let f: extern "C" fn() -> c_int = unsafe { core::mem::transmute(a) };
            f()
        }
        None => -1,
    }
}
