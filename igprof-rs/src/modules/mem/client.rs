//! The client API for custom pools: `igprof_alloc_event(ptr, size)` and
//! `igprof_free_event(ptr)` (exported in `lib.rs`, declared for C in
//! `include/igprof.h`), as valgrind's MALLOCLIKE/FREELIKE client requests.
//!
//! Owns what a pool event does: a pool block is recorded exactly as a
//! malloc'd block by the allocation hooks (charged to the stack of the
//! caller of `igprof_alloc_event`, same counters, the sampler deciding in
//! `--sample-bytes` mode), its size counted as given whatever -mo says
//! (the block has no allocator rounding the profiler could read), and its
//! free takes it out of the live table. A pool block usually lives inside
//! a larger malloc'd chunk, which is counted as well: which of the two the
//! program reports is its choice. A pool block that starts at the address
//! of another live recorded block (the chunk itself) replaces its record.
//!
//! Must never: do anything when the memory profiler (-mp) is not running,
//! touch the block, or change `errno`.

use core::ffi::c_void;

use super::{account, hooks};

/// Whether pool events are recorded: -mp runs (its counters have slots)
/// and the allocation hooks are in place.
#[inline]
fn active() -> bool {
    account::live_slot().is_some() && hooks::hooked(hooks::Func::Free)
}

/// A pool block of `size` bytes at `ptr` was handed out by the program.
pub fn alloc_event(ptr: *mut c_void, size: usize) {
    if active() {
        hooks::allocated_counted(ptr, size, false, None, |_, size| size as u64);
    }
}

/// The pool block at `ptr` was given back by the program.
pub fn free_event(ptr: *mut c_void) {
    if active() {
        hooks::freed(ptr);
    }
}
