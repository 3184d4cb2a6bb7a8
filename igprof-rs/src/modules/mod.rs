//! The contract between the runtime and a profiler module, and the
//! registry of the modules built into the library.
//!
//! A profiler module (CPU sampling, memory, empty memory, descriptors,
//! energy, instrumented functions, function calls, mappings...) is one [`Module`] value: what selects it, how the start-up
//! line names it, its counters, and the moments of the process it takes
//! part in. The runtime (start-up, threads, fork, exec) and the dump writer
//! reach modules only through this contract and never name one.
//!
//! Owns: the contract and the registry (set once, at start-up, from the
//! list in `lib.rs`).
//!
//! Must never: import anything but `base/`: modules import this, not the
//! reverse.
//!
//! # How to add a profiler module
//!
//! The steps, with what each must not forget, are in docs/internals.md
//! ("How to add a profiler module"): an option (`base/options.rs`, with its
//! flag in `Options::selected`/`deselect`, and the launcher), counters
//! (`base/counters.rs`), a folder `modules/<name>/` with a `pub const
//! MODULE: Module` made with [`Module::new`] and the hooks it takes part in
//! (`Module { start: ..., ..Module::new(...) }`), one line in the registry
//! list of `lib.rs`, and end-to-end tests. A module may use `base/`,
//! `hook/`, `unwind/` and `sampler/`, never `output/` or `process/`.

pub mod calls;
pub mod cpu;
pub mod energy;
pub mod event;
pub mod fd;
pub mod finst;
pub mod jit;
pub mod mem;
pub mod mmap;

use std::sync::OnceLock;

use crate::base::options::Options;
use crate::base::thread::ThreadState;
use crate::base::tree::Node;

/// Visits leaked resources: `f(node, counter slot, address, size)`.
pub type LeaksFn = fn(&mut dyn FnMut(*const Node, usize, u64, u64));
/// Visits synthetic top-level functions: `f(name, counter slot, ticks, value)`.
pub type SyntheticFn = fn(&mut dyn FnMut(&'static str, usize, u64, u64));
/// The (ticks, value, peak) the dump writes for counter `slot` of a node,
/// when the module stores that counter in another form; None otherwise.
/// Asked of charged nodes only: the dump takes an uncharged node's values
/// as all zero, so a form must never give one a value (a module that
/// keeps a value for a node charges it).
pub type DumpValueFn = fn(&Node, usize) -> Option<(u64, u64, u64)>;

/// Why a module did not start ([`Module::start`]): the run goes on
/// without it.
#[derive(Debug, PartialEq, Eq)]
pub enum StartError {
    /// The module already said why (one line, or a line for each part it
    /// could not set up): nothing more to say.
    AlreadyReported,
    /// Why, in words: said as `<flag>: <why>; running without it`.
    Refused(String),
}

impl StartError {
    /// A [`StartError::Refused`] saying `why`.
    pub fn refused(why: impl core::fmt::Display) -> StartError {
        StartError::Refused(why.to_string())
    }

    /// The line to say for module `flag`, if any.
    pub fn line(&self, flag: &str) -> Option<String> {
        match self {
            StartError::AlreadyReported => None,
            StartError::Refused(why) => Some(format!("{flag}: {why}; running without it")),
        }
    }
}

/// A profiler module. Every hook but `wanted`, `register_counters` and
/// `start` is optional; the runtime calls each hook of every module the
/// options select, in registry order.
pub struct Module {
    /// The launcher flag(s) that select it, for messages ("-mp").
    pub flag: &'static str,
    /// What it profiles in this run, for the start-up line ("memory
    /// (MEM_TOTAL, ...)"); None to say nothing.
    pub describe: fn(&Options) -> Option<String>,
    /// Whether the options select it.
    pub wanted: fn(&Options) -> bool,
    /// Enables its counters (before the counter registry freezes).
    pub register_counters: fn(&Options),
    /// Starts it after the counters froze and the core hooks are in place
    /// (install its own hooks, open its sources). On an error the run
    /// continues without it (see [`StartError`]).
    pub start: fn(&Options) -> Result<(), StartError>,
    /// Per-thread set-up / teardown (not signal context).
    pub thread_begin: Option<fn(&'static ThreadState)>,
    pub thread_end: Option<fn(&'static ThreadState)>,
    /// In a forked child, before it runs again (reset what is the parent's).
    pub fork_child: Option<fn()>,
    /// Stops the sampling a thread does for itself (any thread's state,
    /// called by the thread that writes the final profile or execs): no
    /// sample may land in the final dump or be pending in a new image.
    pub thread_stop: Option<fn(&'static ThreadState)>,
    /// Starts it again on the calling thread: in a forked child once its
    /// one thread is registered (the parent's did not follow), and after
    /// an exec that failed.
    pub thread_restart: Option<fn(&'static ThreadState)>,
    /// The process is about to have a second thread (it still has one:
    /// what relied on being alone must be put in shared form now).
    pub before_threads: Option<fn()>,
    /// Before exec, before the profile is written (the calling thread is
    /// inside the profiler).
    pub before_exec: Option<fn()>,
    /// Before a dump reads the call trees (e.g. settle what is owed).
    pub before_dump: Option<fn()>,
    /// The calling thread is about to leave by longjmp, maybe out of a
    /// program signal handler that interrupted profiler code; `true` when
    /// it is inside the profiler (its guard is being given up): clear
    /// what marks it inside a hook of the module (signal context).
    pub left_by_jump: Option<fn(bool)>,
    /// After a successful dlopen or dlclose (not signal context; the
    /// calling thread is inside the profiler; the unwinder's module table
    /// is already refreshed), e.g. hook functions of new objects.
    pub objects_changed: Option<fn()>,
    /// Synthetic top-level functions of every dump (e.g. energy no thread
    /// is charged with).
    pub synthetic: Option<SyntheticFn>,
    /// Resources still alive at the dump, for `LK` records.
    pub leaks: Option<LeaksFn>,
    /// How a node's counter is read at dump time when stored differently.
    pub dump_value: Option<DumpValueFn>,
    /// A note after the program's name in the profile header (IgProf's
    /// grammar has no other room; its readers ignore the name), e.g. that
    /// the profile is sampled.
    pub header_note: Option<fn() -> Option<String>>,
    /// `T=` of the header, seconds per unit: the first selected module
    /// that has one sets it.
    pub header_tick: Option<fn(&Options) -> f64>,
    /// Once the final profile is written (by the process at its end, or
    /// by its keeper for a process that died without writing it; not at
    /// an exec, where the process lives on), given its path: e.g. files
    /// the process wrote to keep beside it (a runtime's JIT map).
    pub after_final_dump: Option<fn(&str)>,
}

impl Module {
    /// A module selected by `wanted`, with no hook: fill in the ones it
    /// takes part in with struct update syntax.
    pub const fn new(flag: &'static str, wanted: fn(&Options) -> bool) -> Module {
        Module {
            flag,
            describe: |_| None,
            wanted,
            register_counters: |_| {},
            start: |_| Ok(()),
            thread_begin: None,
            thread_end: None,
            fork_child: None,
            thread_stop: None,
            thread_restart: None,
            before_threads: None,
            before_exec: None,
            before_dump: None,
            left_by_jump: None,
            objects_changed: None,
            synthetic: None,
            leaks: None,
            dump_value: None,
            header_note: None,
            header_tick: None,
            after_final_dump: None,
        }
    }
}

static REGISTRY: OnceLock<&'static [&'static Module]> = OnceLock::new();

/// Sets the modules built into the library (start-up, once).
pub fn set_registry(modules: &'static [&'static Module]) {
    let _ = REGISTRY.set(modules);
}

/// Every module built into the library.
pub fn all() -> &'static [&'static Module] {
    REGISTRY.get().copied().unwrap_or(&[])
}

/// Whether a module built into the library has `flag`.
pub fn built(flag: &str) -> bool {
    all().iter().any(|m| m.flag == flag)
}

/// Runs `f` for every module the options select, in registry order.
pub fn each(o: &Options, mut f: impl FnMut(&'static Module)) {
    for m in all().iter().filter(|m| (m.wanted)(o)) {
        f(m)
    }
}

#[cfg(test)]
mod tests {
    use super::StartError;

    /// A refused start is said on one line naming the module; one the
    /// module already explained is not said again.
    #[test]
    fn a_refused_start_is_said_once() {
        assert_eq!(StartError::AlreadyReported.line("-fp"), None);
        assert_eq!(
            StartError::refused("malloc or free could not be hooked")
                .line("-mp")
                .as_deref(),
            Some("-mp: malloc or free could not be hooked; running without it")
        );
    }
}
