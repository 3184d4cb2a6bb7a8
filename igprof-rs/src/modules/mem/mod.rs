//! The memory profiler (-mp, -mo) and the empty-memory profilers (-ep,
//! -ei, -eu).
//!
//! Owns: which allocation functions are hooked ([`hooks`]), what each
//! event does to the counters ([`account`]), the empty-page inspection
//! ([`empty`]), pool blocks of the client API ([`client`]), and the
//! hook-side plumbing shared with the descriptor profiler ([`site`]:
//! caller's node, nested-event queue). Also the dump writer's view of live
//! resources ([`leaks`], and MEM_LIVE_AT_PEAK's stored form:
//! `account::at_peak_view`) and the header's heap-against-RSS note
//! ([`rss`]).
//!
//! Counters: MEM_TOTAL, MEM_MAX, MEM_LIVE as IgProf (see [`account`]),
//! MEM_LIVE_AT_PEAK (what each stack had live when the whole process's live
//! heap was highest) and, with -ep/-ei/-eu, MEM_EMPTY (see [`empty`]).
//! `-mo none` (default) counts requested bytes, `-mo include` the
//! allocator's usable size of the block (malloc_usable_size), `-mo delta`
//! the difference (the allocator's rounding); call counts are the same in
//! every mode. With `--sample-bytes N` only a sample of the allocations is
//! recorded, each standing for the calls and bytes it represents
//! ([`sample`]).
//!
//! Must never: use the program's allocator for itself, take a lock the
//! interrupted program may hold, or let a hook change what the program sees.

pub mod account;
pub mod client;
pub mod empty;
pub mod epoch;
pub mod fronts;
pub mod hooks;
pub mod journal;
pub mod memo;
pub mod rss;
pub mod sample;
pub mod scanned;
pub mod site;
pub mod spans;

use core::sync::atomic::{AtomicU8, Ordering};

use crate::base::options::{self, MemOverhead};
use crate::base::tree::Node;
use crate::modules::{Module, StartError};

static OVERHEAD: AtomicU8 = AtomicU8::new(0);

/// The -mo mode of this run.
#[inline]
pub fn overhead() -> MemOverhead {
    match OVERHEAD.load(Ordering::Relaxed) {
        0 => MemOverhead::None,
        1 => MemOverhead::Include,
        _ => MemOverhead::Delta,
    }
}

/// Whether the allocation functions need hooks in this run.
pub fn wanted() -> bool {
    let o = options::get();
    o.mem || o.empty.is_some()
}

/// Looks the counter slots up (after the registry froze).
pub fn init_slots() {
    account::init_slots();
    empty::init_slots();
    OVERHEAD.store(
        match options::get().mem_overhead {
            MemOverhead::None => 0,
            MemOverhead::Include => 1,
            MemOverhead::Delta => 2,
        },
        Ordering::Relaxed,
    );
}

/// The memory profiler in the runtime's module registry.
pub const MODULE: Module = Module {
    describe: |o| {
        Some(
            if o.marks {
                "memory (MEM_TOTAL, MEM_MAX, MEM_LIVE, MEM_LIVE_AT_PEAK, MEM_LIVE_SINCE_MARK)"
            } else {
                "memory (MEM_TOTAL, MEM_MAX, MEM_LIVE, MEM_LIVE_AT_PEAK)"
            }
            .into(),
        )
    },
    register_counters: |_| account::register_counters(),
    start: |_| start(),
    thread_end: Some(|_| site::release_thread_extras()),
    left_by_jump: Some(site::jumped_out),
    fork_child: Some(after_fork_child),
    before_threads: Some(account::flush_recent),
    leaks: Some(leaks),
    dump_value: Some(|node, slot| {
        account::at_peak_view(node, slot).or_else(|| account::since_mark_view(node, slot))
    }),
    before_dump: Some(before_dump),
    header_note: Some(header_note),
    objects_changed: Some(fronts::objects_changed),
    ..Module::new("-mp", |o| o.mem)
};

/// The empty-memory profilers in the runtime's module registry (they share
/// the memory profiler's hooks and live table).
pub const EMPTY_MODULE: Module = Module {
    describe: |_| Some("empty memory (MEM_EMPTY)".into()),
    register_counters: |_| empty::register_counters(),
    start: |_| start(),
    thread_end: Some(|_| site::release_thread_extras()),
    left_by_jump: Some(site::jumped_out),
    fork_child: Some(after_fork_child),
    before_threads: Some(account::flush_recent),
    objects_changed: Some(fronts::objects_changed),
    ..Module::new("-ep/-ei/-eu", |o| o.empty.is_some())
};

/// The module's header notes: sampling, then heap against RSS.
fn header_note() -> Option<String> {
    let notes: Vec<String> = [
        Some(sample::describe()).filter(|s| !s.is_empty()),
        rss::note(),
        crate::base::run::attached().then(|| {
            format!(
                "attached while running: {} frees of blocks allocated before the attach not counted",
                account::FREED_FROM_BEFORE.load(Ordering::Relaxed)
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!notes.is_empty()).then(|| notes.join("; "))
}

static STARTED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Slots, then hooks (once, whichever of -mp / -ep... asks first).
fn start() -> Result<(), StartError> {
    if STARTED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    init_slots();
    let o = options::get();
    sample::init(o.sample_bytes, o.sample_seed);
    if sample::active() {
        crate::igprof_debug!(
            "memory: {}: one allocation recorded per {} bytes on average, counting for the calls and bytes it stands for",
            sample::describe(),
            sample::mean()
        );
    }
    memo::init_check();
    // -pf with -mp: faults inside large blocks go to their allocating
    // stack; -ibs with -mp: sampled accesses inside any block.
    if o.page_faults && o.mem && !sample::active() && !spans::enable(spans::SPAN_MIN) {
        crate::igprof_log!("-pf -mp: no memory for the large-block index; MEM_FAULTS not recorded");
    }
    if o.ibs_objects() && !sample::active() && !spans::enable(spans::SMALL_SPAN_MIN) {
        crate::igprof_log!("-ibs -mp: no memory for the block index; IBS_OBJ_* not recorded");
    }
    install();
    if !hooks::hooked(hooks::Func::Malloc) || !hooks::hooked(hooks::Func::Free) {
        return Err(StartError::refused("malloc or free could not be hooked"));
    }
    Ok(())
}

/// The symbol version of glibc's first release on this architecture.
#[cfg(target_arch = "aarch64")]
const GLIBC_BASE_VERSION: &str = "GLIBC_2.17";
#[cfg(not(target_arch = "aarch64"))]
const GLIBC_BASE_VERSION: &str = "GLIBC_2.2.5";

fn object_of(addr: u64) -> Option<&'static [u8]> {
    crate::unwind::module_of(addr as usize).map(|m| m.path)
}

/// Installs the allocation hooks (start-up, guard held). Failures are
/// reported one line each; the run continues without that function.
pub fn install() {
    site::init_libc_range();
    // The allocator the process uses is whoever defines `malloc` first.
    // (A non-PIE program that calls malloc exports a PLT entry for it,
    // which is not a definition.)
    let malloc = trampoline::find_function("malloc", None)
        .ok()
        .filter(trampoline::defined);
    let malloc_obj = malloc.as_ref().and_then(|s| object_of(s.addr));
    let is_libc = |p: &[u8]| p.ends_with(b"/libc.so.6") || p == b"libc.so.6";
    let glibc = malloc_obj.is_none_or(is_libc);
    // Look names up in the allocator's object, the main program included,
    // whose own symbols dlsym cannot reach by its path (a search of every
    // object for a name nobody defines reads their symbol tables: slow).
    let names: Vec<&str> = hooks::funcs().iter().map(|f| f.1).collect();
    let alloc_defs: Option<Vec<trampoline::Symbol>> = match &malloc {
        Some(m) if !glibc => allocator_definitions(m.addr, &names),
        _ => None,
    };
    let mut hooked = crate::hook::Hooked::default();
    for (f, name, repl, allocator_only) in hooks::funcs() {
        if allocator_only && glibc {
            // C++ operators count only when the allocator itself defines
            // them (tcmalloc); libstdc++'s call malloc.
            continue;
        }
        // cfree is only a compatibility symbol of glibc: dlsym does not see
        // it, and the fallback reads the whole library file to find it.
        let found = match &alloc_defs {
            None if name == "cfree" => {
                trampoline::find_function_versioned(name, GLIBC_BASE_VERSION, Some("libc.so.6"))
            }
            Some(defs) => match defs.iter().find(|s| s.name == name) {
                Some(s) => Ok(s.clone()),
                None => trampoline::find_function(name, Some("libc.so.6")),
            },
            None => trampoline::find_function(name, Some("libc.so.6")),
        };
        let Ok(sym) = found else {
            continue;
        };
        if allocator_only {
            // C++ operators count only when the allocator itself defines
            // them (tcmalloc); libstdc++'s call malloc.
            let obj = object_of(sym.addr);
            if obj.is_none() || obj != malloc_obj || malloc_obj.is_some_and(is_libc) {
                continue;
            }
        }
        if let Err(err) = hooked.hook(&sym, repl, |c| hooks::set_chain(f, c)) {
            crate::igprof_log!(
                "{}; continuing without it",
                crate::hook::InstallError::Hook { name, err }
            );
        }
    }
    if let Some(o) = malloc_obj.filter(|p| !is_libc(p)) {
        crate::igprof_log!(
            "memory: the program's allocator is {}",
            crate::base::log::Bytes(o)
        );
    }
    fronts::install(hooked);
}

/// The definitions of `names` in the object that defines the process's
/// `malloc` (at `malloc`), read from its file's symbol tables.
fn allocator_definitions(malloc: u64, names: &[&str]) -> Option<Vec<trampoline::Symbol>> {
    let (path, base) = trampoline::loaded_objects()
        .into_iter()
        .filter(|(_, base)| *base <= malloc)
        .max_by_key(|(_, base)| *base)?;
    let scan =
        trampoline::objscan::scan_object(&path, base, trampoline::objscan::Tables::All, &|n| {
            names.iter().any(|&w| n.is(w))
        })?;
    Some(scan.functions)
}

/// In a forked child: the parent's live blocks are the parent's.
fn after_fork_child() {
    if !crate::base::run::fork_keeps_tables() {
        account::reset_after_fork();
    }
    site::tls(|h| sample::after_fork_child(&h.sampler));
    site::spare_after_fork();
}

// ---- the dump writer's view ----

/// Before each dump: the counts since the last mark gathered; the events
/// that could not be recorded, if any; under `-d`, those counts with the
/// stack memo's and the size of the live-block table.
fn before_dump() {
    account::gather_since_mark();
    let lost = site::LOST.load(Ordering::Relaxed);
    if lost > 0 || options::debug() {
        crate::igprof_log!(
            "memory/descriptor events not recorded: {lost}; recorded late from signal handlers: {}; on threads unknown to the profiler: {}; frees of blocks from before an attach: {}; stack memo hits {} misses {}",
            site::DEFERRED.load(Ordering::Relaxed),
            site::UNKNOWN_THREAD.load(Ordering::Relaxed),
            account::FREED_FROM_BEFORE.load(Ordering::Relaxed),
            memo::hits(),
            memo::misses()
        );
        memo::report_check();
    }
    if options::debug() {
        let bytes = site::with_outer(site::IN_RECORD, || account::LIVE.table_bytes());
        crate::igprof_log!(
            "memory: the live-block table takes {:.1} MiB (sized for the most blocks live at once)",
            bytes as f64 / (1u64 << 20) as f64
        );
    }
}

/// Live heap blocks for `LK` records under MEM_LIVE: `f(node, slot,
/// address, size)` for each (outside signal context).
pub fn leaks(f: &mut dyn FnMut(*const Node, usize, u64, u64)) {
    if let Some(slot) = account::live_slot() {
        let mut v: Vec<crate::base::live::Block> = Vec::new();
        // Marked as recording so that a signal handler's free on this
        // thread is deferred instead of waiting for a shard we hold.
        site::with_outer(site::IN_RECORD, || account::LIVE.for_each(|b| v.push(*b)));
        // In the live table's order: the dump sorts every module's by
        // node, counter and address (`output::merge::Leaks`).
        for b in v {
            // Sampled: the bytes the block stands for, so the LK sizes of
            // a stack add up to its MEM_LIVE.
            f(b.node, slot, b.addr as u64, sample::weight_of(b.size).1);
        }
    }
}
