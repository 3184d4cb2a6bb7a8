//! Stack traces for the injected profiler: cached per-PC frame descriptors,
//! derived on a miss from the CFI row (x86-64) or by framehop, signal frames
//! walked through their saved context.
//!
//! This module owns: the module table (which code is mapped where, and where
//! its `.eh_frame_hdr` / `.eh_frame` live), the per-thread descriptor cache,
//! and the stack walk itself. It must never, from a signal handler or a hook:
//! allocate (through the program's malloc or anything else), take a lock,
//! call `dl_iterate_phdr`/`dladdr`, do file IO (only [`refresh()`] and
//! [`save_descriptors()`] read or write files), or read memory outside the
//! thread's stack bounds / the signal frame / mapped unwind data. Of the
//! rest of the library it uses only `sys` (raw system calls: mmap,
//! errno), nothing that holds the runtime's state.
//!
//! # API (what the runtime calls)
//!
//! Outside signal context (constructor, thread start, after dlopen/dlclose):
//!
//! * [`refresh()`] builds the module table with `dl_iterate_phdr` and swaps it
//!   in atomically. Call it once from the library constructor before the first
//!   trace, and again after every successful `dlopen` / `dlclose` (from the
//!   hook, after the real call returns). Until the first `refresh()` every
//!   trace ends with [`TraceEnd::NoModuleTable`].
//! * [`StackBounds::for_current_thread()`] reads the calling thread's stack
//!   range (`pthread_getattr_np`) and its alternate signal stack, if any.
//!   Call at thread start (it may allocate inside glibc). Call
//!   [`StackBounds::update_altstack`] again if the program installs a
//!   `sigaltstack` later (the runtime's sigaltstack hook, if any).
//! * [`ThreadUnwinder::new()`] creates the per-thread unwinder (descriptor
//!   cache and framehop scratch space). One per thread; it is `!Sync`/`!Send`
//!   and must only be used by the thread that owns it.
//!
//! Anywhere (async-signal-safe): [`module_of`]`(pc)` gives the object that
//! contains `pc` in the current table (path, load bias, text range), e.g.
//! to write `F=(object)+offset` in a dump. The path is never freed, so it
//! stays valid after the object is unloaded.
//!
//! In signal context or in a hook (async-signal-safe, no allocation, no lock):
//!
//! * [`ThreadUnwinder::trace_from_ucontext`]`(uc, &bounds, &mut out)` — for a
//!   timer sample: `uc` is the third argument of an `SA_SIGINFO` handler.
//!   `out[0]` is the interrupted PC, then the return addresses outward.
//! * [`ThreadUnwinder::trace_here`]`(&bounds, &mut out)` — inside a hook
//!   (malloc, open, ...): every leading frame whose PC lies in the profiler's
//!   own shared object (libigprof.so) is skipped, so `out[0]` is the return
//!   address into the code that called the hooked function (for a trampoline
//!   hook: into the application function that called `malloc`).
//!   [`ThreadUnwinder::trace_program_here`] leaves out the profiler's
//!   frames between the program's too (a hook interrupted by a signal
//!   whose handler's event is traced); the hooks' own walks and the
//!   sampler's ucontext walks of a profiled program do the same.
//!
//! Both write at most `out.len()` addresses (the caller's depth limit, e.g.
//! [`DEFAULT_MAX_DEPTH`]) and return a [`Trace`]: `depth` entries of
//! `out` are valid, and `end` says why the walk stopped. `trace.truncated()`
//! is true when the buffer filled before the outermost frame (mark it in the
//! profile). A broken frame (a read outside the stack, a stack pointer that
//! does not move outward) ends the trace with [`TraceEnd::Broken`]; the
//! frames found so far are kept. Addresses are as found on the stack: entry 0
//! of a ucontext trace is an instruction address, every later entry is a
//! return address (the instruction after the call), except the entry after a
//! signal frame (`__restore_rt`), which is again an interrupted PC.
//!
//! A `ThreadUnwinder` is re-entrancy safe: if a signal interrupts a trace on
//! the same thread and the handler traces with the same `ThreadUnwinder`, the
//! inner call returns at once with [`TraceEnd::Reentered`] (count it as a
//! dropped sample) and the outer trace continues unharmed.
//!
//! # How it works
//!
//! A trace reads the registers (x86-64: rip, rsp, rbp) from the ucontext or
//! the current frame, then per frame looks up the PC in a fixed-size,
//! two-way set-associative per-thread cache of compact frame descriptors
//! (CFA = rsp or rbp + offset, return address and saved rbp at fixed
//! offsets from the CFA, or "signal frame", or "end of stack"). A hit costs
//! a lookup and two or three bounded loads. A miss derives the descriptor
//! from the mapped `.eh_frame_hdr`/`.eh_frame`: on x86-64 from the PC's CFI
//! row read directly (`cfi.rs`) when that reader follows every step as
//! gimli would, otherwise from framehop's rule for the PC
//! (`MustNotAllocateDuringUnwind`); if the rule cannot be expressed
//! compactly (a DWARF expression, say) that one frame is unwound with
//! framehop directly. Before deriving, a miss on a return address looks in
//! the descriptor store (`store.rs`): the descriptors earlier processes
//! derived for the same object (same build-id), read from the user's cache
//! directory when the module table is built; what this process derives is
//! added to it at exit ([`save_descriptors`]; [`store::configure`] turns it
//! on).
//! The cache is tagged with the module table generation, so a
//! dlopen/dlclose invalidates it.
//!
//! Module tables are built outside signal context and published with an
//! `AtomicPtr`; the table's own arrays live in mmap'ed memory. A walk reads
//! the table under a hazard slot of its `ThreadUnwinder` (one SeqCst store
//! and load per walk, no shared cache line), and a refresh frees a replaced
//! table once no slot holds it (at that refresh or a later one). A refresh
//! that finds nothing loaded or unloaded since the last (glibc's
//! `dlpi_adds`/`dlpi_subs`) keeps the table and costs one `dl_iterate_phdr`
//! pass. Object paths live in a never-freed arena, so the `&'static` path of
//! [`module_of`] stays valid after the object and its table are gone.
//! framehop's per-module objects are built with the crate's global
//! allocator (in libigprof.so the runtime's mmap allocator, never the
//! program's malloc) at refresh time and freed with their table, outside
//! signal context.
//!
//! dlclose: the table lists an object until the `refresh()` after its
//! `dlclose`. A walk on another thread that meets an address of that object
//! in this window (only a corrupt stack or a program that unloads code
//! another thread still runs can) would read its unmapped unwind data.
//! Calling `refresh()` right after the real `dlclose` returns keeps the
//! window to that refresh.
//!
//! Stacks: only the thread's stack and alternate signal stack are read. A
//! program that runs code on stacks of its own (coroutines, `makecontext`)
//! gets traces that stop at the first frame there (`ReadOutsideStack`).
//!
//! Files: `walk.rs` (the per-thread unwinder and the walk loop), `step.rs`
//! (one frame: applying a descriptor, deriving one from framehop, framehop
//! itself), `descriptor.rs` (encoding and cache), `modules.rs` (module
//! table), `store.rs` (descriptors kept between processes),
//! `stack.rs` (bounds and the bounded reader), `readlog.rs` (the
//! record of a walk's stack reads for the `-mp` stack memo), `mem.rs` (mmap).
//! Architectures: `x86_64.rs` and `aarch64.rs` supply only registers, the
//! signal frame layout and the return trampoline's code; on AArch64 a
//! descriptor may also say "return address still in LR" (leaf frames).

mod cfi;
mod descriptor;
mod hazard;
mod mem;
mod modules;
mod readlog;
mod stack;
mod step;
pub mod store;
mod walk;

#[cfg(test)]
mod tests;

// Both architectures compile, and their pure tests run, on every host;
// the host's is the one the walk uses.
mod aarch64;
mod x86_64;
#[cfg(target_arch = "aarch64")]
use aarch64 as arch;
#[cfg(target_arch = "x86_64")]
use x86_64 as arch;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the unwinder supports x86-64 and AArch64 only");

pub use cfi::{checking as cfi_checking, stats as direct_cfi_stats};
pub use mem::MapError;
pub use modules::{
    generation, listed_objects, module_of, save_descriptors, ModuleInfo, RefreshError,
};
pub use readlog::{ReadLog, CAPACITY as READ_LOG_CAPACITY};
pub use stack::{StackBounds, StackBoundsError};
#[doc(hidden)]
pub use walk::FramehopCache;
pub use walk::{CacheStats, ThreadUnwinder};

/// Builds the module table and publishes it (see the module docs); the
/// first call also reads `IGPROF_CFI_CHECK` (`cfi.rs`).
pub fn refresh() -> Result<(), RefreshError> {
    cfi::init_check();
    modules::refresh()
}

/// A depth limit for callers that have none of their own (the unwinder's
/// tests and benchmarks); libigprof passes `--depth` (default 1024).
pub const DEFAULT_MAX_DEPTH: usize = 512;

/// The result of one stack walk: how many entries of the output buffer are
/// valid and why the walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Number of valid addresses at the start of the output buffer.
    pub depth: usize,
    /// Why the walk stopped.
    pub end: TraceEnd,
}

impl Trace {
    /// True when the output buffer filled before the outermost frame was
    /// reached: the profile should mark this stack as truncated.
    pub fn truncated(&self) -> bool {
        self.end == TraceEnd::Truncated
    }
}

/// Why a stack walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceEnd {
    /// The outermost frame was reached (return address 0, or no return
    /// address according to the unwind info, e.g. `_start`, `clone3`).
    Outermost,
    /// The output buffer (the depth limit) filled while frames remained.
    Truncated,
    /// A frame could not be unwound; the frames before it are valid.
    Broken(BrokenFrame),
    /// The same `ThreadUnwinder` was already walking on this thread (a signal
    /// interrupted a trace); nothing was written.
    Reentered,
    /// [`refresh()`] was never called, so no module table exists.
    NoModuleTable,
}

/// What was wrong with the frame that ended a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokenFrame {
    /// A stack read at `addr` fell outside the thread's stack bounds.
    ReadOutsideStack { addr: usize },
    /// The caller's stack pointer `new_sp` was not above the callee's `sp`.
    NoProgress { sp: usize, new_sp: usize },
    /// framehop could not unwind the frame at `pc`.
    Unwinder { pc: usize },
    /// `pc` lies in no loaded object (JIT code or a corrupt return
    /// address): it is the last entry of the trace.
    NotInAnyObject { pc: usize },
    /// `pc` is at or above the architecture's end of user space
    /// (`USER_END`): no process runs code there, so it is a corrupt return
    /// address read from the stack and is not part of the trace.
    NotUserCode { pc: usize },
}
