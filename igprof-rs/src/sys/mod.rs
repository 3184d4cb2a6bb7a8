//! Raw system calls used by the runtime, gathered in one place: the lowest
//! layer of the library, one concern per file (errno, io, mem, task, clock,
//! timer, signal, perf, futex, stack, raw), re-exported here so that callers name
//! `crate::sys::gettid` whichever file holds it.
//!
//! Owns every direct `syscall(2)` of the runtime (write, mmap, timers, tids,
//! signals to self). Each wrapper is async-signal-safe: it goes straight to
//! the kernel, takes no lock and allocates nothing. Callers that run inside
//! a signal handler save and restore `errno` themselves ([`ErrnoGuard`]).
//! Wrappers whose callers handle a failure return `Result<_, Errno>`.
//!
//! Must never: call into libc functions that may lock or allocate, or name
//! any other module of the crate (everything else is built on it, so a
//! `use crate::` here would make a circle).

mod clock;
mod errno;
mod futex;
mod io;
mod mem;
mod perf;
mod raw;
mod signal;
mod stack;
mod task;
mod timer;

pub use clock::*;
pub use errno::*;
pub use futex::*;
pub use io::*;
pub use mem::*;
pub use perf::*;
pub use raw::*;
pub use signal::*;
pub use stack::*;
pub use task::*;
pub use timer::*;
