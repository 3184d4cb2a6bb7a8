//! libigprof.so: the profiler injected with LD_PRELOAD. Its architecture
//! is described in docs/internals.md.
//!
//! Layers, each importing only from those below it (`scripts/import-graph`
//! checks that no files import each other in a circle); data flows one way: event -> stack trace -> call tree ->
//! dump.
//!
//! - `sys/` raw system calls, one concern per file; names nothing else;
//! - `unwind/` stack walking (of the rest, only `sys/`'s system calls);
//! - `base/` messages, options, the library's own memory,
//!   counters, call trees, live tables, per-thread state and its guard, the
//!   run's facts, stack traces of the running thread;
//! - `hook/` hook plumbing: chain pointers, install sequence, real sigaction;
//! - `modules/` the profiler-module contract and registry, and the modules
//!   (cpu, mem, fd, mmap, energy, finst, event, calls): adding one is a folder there and a line in
//!   `MODULES` below (see `modules/mod.rs`, "How to add a profiler module");
//! - `output/` the dump: merging, naming, writing, the file name;
//! - `process/` start-up and life cycle, the process hooks, signals, the
//!   watcher thread.
//!
//! This file holds only the layers, the registry of modules, the exported C
//! symbols and the constructor and destructor entries.

#![allow(clippy::missing_safety_doc)]
#![cfg_attr(not(test), deny(clippy::undocumented_unsafe_blocks))]

pub mod base;
pub mod hook;
pub mod modules;
pub mod output;
pub mod process;
pub mod sampler;
pub mod sys;
pub mod unwind;

/// The library never uses the program's malloc (which may be hooked).
#[global_allocator]
static GLOBAL: base::alloc::IgAlloc = base::alloc::IgAlloc;

/// The profiler modules built into the library, in the order they start
/// (see `modules/mod.rs` and docs/internals.md, "How to add a profiler module").
static MODULES: &[&modules::Module] = &[
    &modules::cpu::MODULE,
    &modules::mem::MODULE,
    &modules::mem::EMPTY_MODULE,
    &modules::fd::MODULE,
    &modules::mmap::MODULE,
    &modules::energy::glue::MODULE,
    &modules::finst::MODULE,
    &modules::event::MODULE,
    &modules::calls::MODULE,
    &modules::jit::MODULE,
];

// The program finds errno as it left it (zero at start, as C promises):
// start-up and the end read and write files, and some are missing.
extern "C" fn igprof_init() {
    let _errno = sys::ErrnoGuard::save();
    process::init(MODULES);
}

extern "C" fn igprof_fini() {
    let _errno = sys::ErrnoGuard::save();
    process::fini();
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = igprof_init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = igprof_fini;

/// Writes a snapshot of the profile so far to `path` (NULL: the run's output
/// file). Returns 0 on success, -1 if not profiling or the write failed.
#[no_mangle]
pub unsafe extern "C" fn igprof_dump_now(path: *const core::ffi::c_char) -> i32 {
    if process::attach::caller_busy() {
        // Only a launcher's call can land inside the profiler.
        return process::attach::CALLER_BUSY;
    }
    let p = if path.is_null() {
        None
    } else {
        Some(core::ffi::CStr::from_ptr(path).to_bytes())
    };
    process::dump_now(p)
}

/// `igprof --attach`: profiles this running process from now on with
/// the option words `options` (NUL-terminated); `threads`/`n`: the
/// threads the launcher stopped (id, thread pointer, next instruction;
/// the instruction is rewritten for a thread to move out of a patch).
/// Returns one of `process::attach`'s results; lines are kept in
/// `igprof_attach_log`.
#[no_mangle]
pub unsafe extern "C" fn igprof_attach(
    options: *const core::ffi::c_char,
    threads: *mut process::attach::Stopped,
    n: usize,
) -> i32 {
    let _errno = sys::ErrnoGuard::save();
    if process::attach::caller_busy() {
        return process::attach::CALLER_BUSY;
    }
    let raw = core::ffi::CStr::from_ptr(options).to_bytes();
    let threads = if threads.is_null() {
        &mut [][..]
    } else {
        core::slice::from_raw_parts_mut(threads, n)
    };
    process::attach::attach(MODULES, raw, threads)
}

/// `igprof --detach`, first step: writes the profile and stops every
/// sampler. 0, or -1 if not attached.
#[no_mangle]
pub extern "C" fn igprof_detach() -> i32 {
    let _errno = sys::ErrnoGuard::save();
    if process::attach::caller_busy() {
        return process::attach::CALLER_BUSY;
    }
    process::attach::detach()
}

/// `igprof --detach`, second step, every other thread stopped: restores
/// every patched byte and the program's sampling signal action, and stops
/// recording; the library stays loaded. See `process::attach::unhook`.
#[no_mangle]
pub extern "C" fn igprof_detach_unhook() -> i32 {
    let _errno = sys::ErrnoGuard::save();
    if process::attach::caller_busy() {
        return process::attach::CALLER_BUSY;
    }
    process::attach::unhook()
}

/// Turns recording on (after `-pd`, or `igprof_disable()`): samples,
/// allocations and descriptors opened from now on are recorded. Returns 1
/// if recording was already on, 0 if it was off, -1 if not profiled.
#[no_mangle]
pub extern "C" fn igprof_enable() -> i32 {
    process::set_recording(true)
}

/// Starts a new epoch of the memory profiler (`igprof -mp --marks`):
/// MEM_LIVE_SINCE_MARK then holds what is allocated from now on and still
/// live at the dump. Returns the new epoch's number (1 for the first
/// mark), or -1 when the run takes no marks (not profiled, or without
/// `--marks`). Signal-safe.
#[no_mangle]
pub extern "C" fn igprof_mark() -> i32 {
    base::run::mark().map_or(-1, |e| e as i32)
}

/// Turns recording off: nothing new is recorded until `igprof_enable()`
/// (what was recorded stays, and its releases still count). Returns 1 if
/// recording was on, 0 if it was off, -1 if not profiled.
#[no_mangle]
pub extern "C" fn igprof_disable() -> i32 {
    process::set_recording(false)
}

/// A custom pool handed out a block of `size` bytes at `ptr`: with -mp it
/// is recorded as an allocation of the caller (see `include/igprof.h`).
/// Does nothing otherwise.
#[no_mangle]
pub extern "C" fn igprof_alloc_event(ptr: *mut core::ffi::c_void, size: usize) {
    modules::mem::client::alloc_event(ptr, size)
}

/// A custom pool took back the block at `ptr` (recorded by
/// [`igprof_alloc_event`]): with -mp it leaves the live blocks. Does
/// nothing otherwise.
#[no_mangle]
pub extern "C" fn igprof_free_event(ptr: *mut core::ffi::c_void) {
    modules::mem::client::free_event(ptr)
}

/// Called by a program built with `-finstrument-functions` at the entry of
/// each instrumented function (glibc's own is a no-op; the preload puts
/// this one first). Does nothing unless -finst profiles this process.
#[no_mangle]
pub extern "C" fn __cyg_profile_func_enter(
    this_fn: *mut core::ffi::c_void,
    _call_site: *mut core::ffi::c_void,
) {
    modules::finst::enter(this_fn as usize)
}

/// Called before each instrumented function returns (see
/// [`__cyg_profile_func_enter`]).
#[no_mangle]
pub extern "C" fn __cyg_profile_func_exit(
    this_fn: *mut core::ffi::c_void,
    _call_site: *mut core::ffi::c_void,
) {
    modules::finst::exit(this_fn as usize)
}
