//! Install a hook on a function by patching its first instructions.
//!
//! See docs/internals.md ("Trampolines"). This crate knows nothing about profiling.
//!
//! # Using it
//!
//! ```no_run
//! let malloc = trampoline::find_function("malloc", Some("libc.so.6")).unwrap();
//! # extern "C" fn my_malloc(_: usize) -> *mut u8 { std::ptr::null_mut() }
//! let hook = trampoline::install(&malloc, my_malloc as *const ()).unwrap();
//! let original: extern "C" fn(usize) -> *mut u8 = unsafe { std::mem::transmute(hook.chain()) };
//! # let _ = original;
//! hook.uninstall().unwrap();
//! ```
//!
//! - [`install`] (or [`prepare`] + [`Prepared::enable`] to publish the
//!   chain pointer before any call can reach the replacement) /
//!   [`Hook::chain`] / [`Hook::uninstall`]; [`probe`] answers
//!   "can this be hooked, how many bytes would be taken" changing nothing.
//! - [`find_function`] / [`find_function_versioned`]: address and size.
//! - [`interior::interior_entry`]: whether other code of the object enters
//!   a function inside the bytes a hook would overwrite.
//! - Errors are typed: [`HookError`] = function name + address + [`Reason`].
//!
//! # Structure (for the architecture ports)
//!
//! - [`arch`]: the [`arch::Arch`] trait. Each architecture is a unit struct
//!   implementing it with PURE functions only (bytes and addresses in, bytes
//!   or [`Reason`] out): `plan`, `relocate`, `verify`, `near_patch`,
//!   `far_patch`, `stub`, `filler`, plus constants (reach, patch lengths,
//!   max trampoline length, optional `SELF_LOOP` for multi-step patch
//!   writes) and `flush_icache` (no-op unless the host is that
//!   architecture). `x86_64::X86_64` and `aarch64::Aarch64` both compile on
//!   every host; `arch::Host` picks the host one (the only
//!   `cfg(target_arch)` choice). The survey example and the byte-exact tests
//!   call the pure functions directly.
//! - Process-state modules, shared by both architectures and generic over
//!   `A: Arch`: `maps` (/proc/self/maps parsing, free ranges within a reach),
//!   `nearmem` (trampoline pages within `A::NEAR_REACH`, many per page, RX
//!   after writing), `patch` (protection changes, atomic store, icache
//!   flush), `hook` (install/uninstall sequence), `symbols` (dlsym/dlvsym,
//!   ELF symbol tables), `objscan` (one loaded object's file symbol tables,
//!   local symbols included, for names a caller wants).
//! - Install sequence: read bytes -> `A::plan` -> `nearmem::place` with
//!   `A::relocate` -> `A::near_patch` (or an `A::stub` entry when the
//!   replacement is out of reach) + `A::filler` -> `patch::write_code`.
//!   When no memory is free within `A::NEAR_REACH` (or with
//!   [`prepare_far`]): `A::plan` with `A::FAR_PATCH_LEN`, trampoline
//!   anywhere, `A::far_patch`.
//! - [`survey`]: the same pure functions over the exported functions of an
//!   ELF file (x86-64 or AArch64 by `e_machine`), used by `examples/survey.rs`.

pub mod aarch64;
pub mod arch;
mod error;
mod hook;
pub mod image;
pub mod interior;
pub mod known;
pub mod maps;
mod nearmem;
pub mod objscan;
mod patch;
pub mod survey;
mod symbols;
pub mod x86_64;

pub use arch::Plan;
pub use error::{HookError, LookupError, Reason};
pub use hook::{Hook, Prepared, Probe};
pub use nearmem::page_size;
pub use symbols::{
    data_symbols, defined, defined_at, find_function, find_function_versioned, global_symbol,
    loaded_objects, object_base_of, DataSymbols, Symbol,
};

/// Runs `f`, a series of installations (a profiler's start-up), paying
/// the per-hook set-up once: `/proc/self/maps` is read once
/// ([`maps::batch`]) and each page written stays writable until `f`
/// returns, when its protection is restored (`patch::batch`).
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    maps::batch(|| patch::batch(f))
}

/// Hook `target` so that every call goes to `replacement` (a function with
/// the same signature and ABI). The returned [`Hook::chain`] runs the
/// original behaviour. If other threads may call the target while it is
/// being hooked, the replacement can run before this returns: use
/// [`prepare`] to publish `chain` first. Not for use from a signal handler
/// or a hook.
pub fn install(target: &Symbol, replacement: *const ()) -> Result<Hook, HookError> {
    prepare(target, replacement)?.enable()
}

/// First half of [`install`]: build the trampoline (so [`Prepared::chain`]
/// is known) without touching the target; [`Prepared::enable`] writes the patch.
pub fn prepare(target: &Symbol, replacement: *const ()) -> Result<Prepared, HookError> {
    hook::prepare_with::<arch::Host>(target, replacement, false)
}

/// As [`prepare`], but always with the far patch form (an absolute jump of
/// `Arch::FAR_PATCH_LEN` bytes, trampoline anywhere). [`prepare`] falls back
/// to it by itself when no memory is free within the near reach; this is
/// for callers (and tests) that want that form regardless.
pub fn prepare_far(target: &Symbol, replacement: *const ()) -> Result<Prepared, HookError> {
    hook::prepare_with::<arch::Host>(target, replacement, true)
}

/// Whether `target` can be hooked and how (bytes kept, taken, instructions),
/// changing nothing in the process.
pub fn probe(target: &Symbol) -> Result<Probe, HookError> {
    hook::probe_with::<arch::Host>(target)
}

/// The plan of a patch of `patch_len` bytes on `code` (a function's bytes
/// as read at `addr`, of `size`), as a table of one entry: what a
/// [`known::Planner`] answers from the process it plans in.
pub fn plan_entry(code: &[u8], addr: u64, size: Option<u64>, patch_len: usize) -> Option<Vec<u8>> {
    hook::plan_entry::<arch::Host>(code, addr, size, patch_len)
}
