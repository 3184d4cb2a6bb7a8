//! libigprof.so: the profiler injected with LD_PRELOAD. See DESIGN.md.
//!
//! Module ownership: `unwind` (stack traces), `energy` (RAPL sources and
//! attribution); the runtime (options, per-thread state, call trees, timers,
//! hooks, dumps) lives beside them.
pub mod energy;
pub mod unwind;
