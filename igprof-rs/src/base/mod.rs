//! The base every layer but `sys/` and `unwind/` stands on: the `igprof:`
//! messages, options, the library's own memory, counters, call trees,
//! live-resource tables, per-thread state and its re-entrancy guard, and
//! stack traces of the running thread.
//!
//! Must never: import anything outside `base/` but `sys/` and `unwind/` (modules,
//! output and process are above it), or hold profiling policy (what a
//! profiler counts, when a profile is written).

pub mod alloc;
pub mod cgroup;
pub mod code_pages;
pub mod counters;
pub mod limits;
pub mod live;
pub mod log;
pub mod mem_calls;
// Only where nothing unwinds (the release library); tests and benchmarks
// built from these sources unwind through the real unwinder.
#[cfg(panic = "abort")]
mod nounwind;
pub mod options;
pub mod resident;
pub mod run;
pub mod solo;
pub mod thread;
pub mod tls;
pub mod trace;
pub mod tree;
