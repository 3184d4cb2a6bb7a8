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

pub mod alloc;
pub mod counters;
pub mod dump;
pub mod energy;
pub mod fatal;
pub mod fd; // -fd (helper "memfd")
pub mod hooks;
pub mod live; // live-resource tables (helper "memfd")
pub mod log;
pub mod mem; // -mp, -ep/-ei/-eu
pub mod module; // the profiler-module contract and registry
pub mod names; // naming addresses at dump time
pub mod nrg; // -np glue over energy/
pub mod options;
pub mod perf;
pub mod runtime;
pub mod signals;
pub mod solo; // one thread: no resident thread of ours, no locked updates
pub mod sys;
pub mod thread;
pub mod trace;
pub mod tree;
pub mod unwind;
pub mod watcher;

/// The library never uses the program's malloc (which may be hooked).
#[global_allocator]
static GLOBAL: alloc::IgAlloc = alloc::IgAlloc;

/// The profiler modules built into the library, in the order they start
/// (see `module.rs`, "How to add a profiler module").
static MODULES: &[&module::Module] = &[
    &perf::MODULE,
    &mem::MODULE,
    &mem::EMPTY_MODULE,
    &fd::MODULE,
    &nrg::MODULE,
];

extern "C" fn igprof_init() {
    runtime::init(MODULES);
}

extern "C" fn igprof_fini() {
    runtime::fini();
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
    runtime::dump_now(p)
}
