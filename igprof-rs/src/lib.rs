//! libigprof.so: the profiler injected with LD_PRELOAD. See DESIGN.md.
//!
//! Module ownership: `unwind` (stack traces), `energy` (RAPL sources and
//! attribution); the runtime (options, per-thread state, call trees, timers,
//! hooks, dumps) lives beside them:
//!
//! - `sys` raw system calls; `log` the `igprof:` stderr lines;
//!   `alloc` the library's own memory (global allocator, bump regions);
//! - `options` the `IGPROF` option string; `counters` the counter registry;
//!   `thread` per-thread state and the re-entrancy guard; `tree` call trees;
//! - `trace` the runtime's stack-trace adapter; `perf` timers and the
//!   sampling handler; `signals` sampling-signal ownership; `hooks` core hooks;
//! - `dump` profile writing, `names` naming its addresses; `runtime` start-up
//!   and life cycle.
//!
//! This file holds only the exported C symbols and the constructor and
//! destructor entries.

#![allow(clippy::missing_safety_doc)]
#![cfg_attr(not(test), deny(clippy::undocumented_unsafe_blocks))]

pub mod base;
pub mod hook;
pub mod modules;
pub mod output;
pub mod process;
pub mod unwind;

/// The library never uses the program's malloc (which may be hooked).
#[global_allocator]
static GLOBAL: base::alloc::IgAlloc = base::alloc::IgAlloc;

/// The profiler modules built into the library, in the order they start
/// (see `module.rs`, "How to add a profiler module").
static MODULES: &[&modules::Module] = &[
    &modules::cpu::MODULE,
    &modules::mem::MODULE,
    &modules::mem::EMPTY_MODULE,
    &modules::fd::MODULE,
    &modules::energy::glue::MODULE,
];

extern "C" fn igprof_init() {
    process::init(MODULES);
}

extern "C" fn igprof_fini() {
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
    let p = if path.is_null() {
        None
    } else {
        Some(core::ffi::CStr::from_ptr(path).to_bytes())
    };
    process::dump_now(p)
}
