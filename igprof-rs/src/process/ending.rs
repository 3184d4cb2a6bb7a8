//! The process's final profile: written once, whichever way the process
//! ends (exit, `_exit`, abort, a fatal signal, kill of itself, exec), with
//! the `-d` report of what it held and cost.
//!
//! Must never: write a second final profile for one image, or write one
//! from a process that is not ours (`run::is_own_process`).

use crate::base::thread;
use crate::output::{self, DumpStats};

/// In a fork child, or after an exec that failed: the process writes its
/// final profile again when it ends.
pub fn allow_final_again() {
    output::final_undone();
}

/// Call-tree nodes up to which the final dump's memory comes from one
/// region (`alloc::final_arena`): a small cc1 has 19,000
/// (its dump needs about 2.3 MiB), cc1plus on a template-heavy file 375,000.
const SMALL_DUMP_NODES: usize = 50_000;
/// Below this many nodes the region costs more than it saves: zeroing its
/// first huge page was a third of an empty profile's dump (a profiled
/// no-op's), where the usual allocator takes a few small pages.
const TINY_DUMP_NODES: usize = 1_000;
/// What a small dump takes from the region, faulted in before it starts:
/// a part that does not grow with the tree (the writer's buffers) and a
/// part per node. Not libdeflate's compressor (198 KiB), made only for a
/// text of 64 KiB or more (`output::deflate::STORE_BELOW`), which a tree
/// that big overruns the guess with anyway: sqlite3's 2,700 nodes write
/// 63 KB of text, stored, and took 350 KiB of the region, against 541
/// KiB faulted in when the compressor was counted (its peak RSS 23.76 ->
/// 23.49 MB, medians of 6). Measured before: a small cc1's 19,450
/// nodes 2.2-2.5 MiB, another's 12,560 2.3 MiB, sqlite3's 2,700 nodes
/// 0.54 MiB, gcc's 1,200 0.51 MiB (before the names and the text's buffer
/// were made smaller: 3.1-4.0 MiB for the 19,450). More would only
/// add to the process's peak RSS (zeroed pages never used); less costs a
/// page fault per 4 KiB beyond it. The nodes counted are those the dump
/// writes (`thread::total_nodes`): a fork child also holds its parent's
/// trees, and when they were counted the children of a shell script (a
/// pyenv shim's bash under `-mp`) had 450-730 KiB faulted in for dumps
/// that took 30-170 KiB. A tree whose nodes are mostly uncharged still
/// takes less than the guess (sqlite3: 290-370 KiB of 541). Faulting in
/// less ahead and the rest a step at a time as the dump reaches it added
/// 0.2-0.3 MB to perl's and python3's peaks (a vector's unused capacity
/// faulted in too), so the guess stays.
const DUMP_BYTES_FIXED: usize = 96 << 10;
const DUMP_BYTES_PER_NODE: usize = 96;

/// The end-of-process dump (exit, _exit, abort, kill of self, exec): once.
pub fn final_dump(reason: &str) -> bool {
    if !crate::base::run::active() || output::final_begins() {
        return false;
    }
    // The process is ending: the ending thread's time since its last
    // sample is charged, then sampling stops so the profile ends here (and
    // no sample lands in the dump itself).
    if let Some(t) = thread::current() {
        crate::sampler::charge_tail(t);
    }
    crate::process::stop_sampling();
    if crate::base::options::get().timeline_ns() != 0 {
        crate::process::timeline_point_here();
    }
    let written = write_final(reason, false);
    let execing = crate::base::run::execing();
    if let (Ok(path), false) = (written.as_deref(), execing) {
        after_final_dump(path);
    }
    if let Err(Unwritten::LeftToKeeper) = written {
        // The keeper writes it once the process has ended.
        return false;
    }
    // Written or not, the image has said what became of its profile.
    crate::process::keeper::image_ended(execing);
    written.is_ok()
}

/// Each module's `after_final_dump` with the final profile's path.
fn after_final_dump(path: &str) {
    crate::process::each_module(|m| {
        if let Some(f) = m.after_final_dump {
            f(path)
        }
    });
}

/// The keeper's dump for an image that ended without its own (`how`: how
/// it ended): the same profile, with one line saying so. The image's
/// threads are gone: nothing of theirs (timers, descriptors) is touched,
/// and a dump they were writing when they died is written again.
pub fn final_dump_by_keeper(how: &str) {
    if !crate::base::run::active() {
        return;
    }
    output::final_begins();
    output::forget_unfinished_dump();
    if let Ok(path) = write_final(&format!("{how}, by the keeper"), true) {
        after_final_dump(&path);
    }
}

/// Why [`write_final`] wrote no profile.
enum Unwritten {
    /// The process holds every descriptor its limit allows: none for the
    /// file. Its keeper, which holds few, writes the profile once the
    /// process has ended.
    LeftToKeeper,
    /// Said in a line; no profile.
    Lost,
}

/// Writes the final profile (see [`final_dump`]); `by_keeper`: the
/// keeper's dump, the program's threads gone, with one line even without
/// `-d`. Returns where it was written.
fn write_final(reason: &str, by_keeper: bool) -> Result<String, Unwritten> {
    let path = output::path::output_path();
    let debug = crate::base::options::get().debug;
    // Not for a keeper writing a dead process's profile: a zombie's files
    // have no resident set to speak of.
    let rss_before =
        (debug && !by_keeper).then(|| crate::process::keeper::facts::read(crate::sys::getpid()));
    // The dump's memory comes at the process's end, often at its peak: the
    // lookup tables of the trees that take no more nodes go first.
    thread::release_lookup_tables(by_keeper);
    let mut unwind_tables_given = 0;
    let (dumped, saved) = thread::paused(|| {
        let write = || {
            // A file that cannot be created where it was asked for (the
            // directory gone, or never writable) goes to the temporary
            // directory instead: the run's profile is not lost.
            let dumped = match output::dump_after_others(&path) {
                Err(
                    e @ (output::DumpError::Create { .. }
                    | output::DumpError::Refused { .. }
                    | output::DumpError::Rename { .. }),
                ) => match output::path::fallback_path(&path) {
                    Some(alt) => match output::dump_after_others(&alt) {
                        Ok(stats) => Ok((stats, Some((alt, e)))),
                        Err(_) => Err(e),
                    },
                    None => Err(e),
                },
                r => r.map(|stats| (stats, None)),
            };
            crate::base::code_pages::between_steps();
            let saved = {
                let _fsize = crate::base::limits::FsizeGuard::block();
                crate::unwind::save_descriptors()
            };
            (dumped, saved)
        };
        let nodes = thread::total_nodes();
        let steps = nodes >= TINY_DUMP_NODES || crate::base::code_pages::given_back();
        if steps {
            // The library's code pages that ran the program's hooks leave
            // the resident set: the dump's own code (most of the library's
            // text, with the kernel's fault-around) takes their place
            // instead of adding to them (a small cc1's peak: 0.3 MiB less),
            // and so between the dump's steps. Not for a tiny process that
            // never gave them back, whose dump would fault them back in for
            // no gain worth its time.
            crate::base::code_pages::give_back_again();
            // And the objects' unwind tables, which the dump does not read.
            if !by_keeper {
                unwind_tables_given = crate::base::resident::give_back_unwind_tables(
                    crate::base::code_pages::own_program_headers().map(|(bias, _)| bias),
                );
            }
        }
        crate::base::code_pages::give_back_between_steps(steps);
        if (TINY_DUMP_NODES..=SMALL_DUMP_NODES).contains(&nodes) {
            let ahead = DUMP_BYTES_FIXED + nodes * DUMP_BYTES_PER_NODE;
            let r = crate::base::alloc::final_arena(ahead, write);
            crate::igprof_debug!(
                "final dump: its region gave {} KiB for {nodes} nodes ({} KiB faulted in ahead)",
                crate::base::alloc::final_arena_used() >> 10,
                ahead >> 10
            );
            r
        } else {
            write()
        }
    });
    let steps_kib = crate::base::code_pages::steps_resident_kib();
    crate::base::code_pages::give_back_between_steps(false);
    let opts = crate::base::options::get();
    if opts.debug {
        log_saved_descriptors(&saved);
        if unwind_tables_given > 0 {
            crate::igprof_log!(
                "final dump: {} KiB of the loaded objects' unwind tables given back",
                unwind_tables_given >> 10
            );
        }
        if !steps_kib.is_empty() {
            let kib: Vec<String> = steps_kib.iter().map(|k| k.to_string()).collect();
            crate::igprof_log!(
                "final dump: the library's code and read-only data resident at the end of each step: {} KiB",
                kib.join(", ")
            );
        }
    }
    if let Some([_, rss, peak]) = rss_before {
        let [_, rss_after, peak_after] = crate::process::keeper::facts::read(crate::sys::getpid());
        let mib = |k: u64| k as f64 / 1024.0;
        let known = [rss, rss_after, peak, peak_after]
            .iter()
            .all(|&k| k != crate::process::keeper::facts::UNKNOWN);
        if known {
            crate::igprof_log!(
                "final dump: RSS {:.1} -> {:.1} MiB, peak RSS {:.1} -> {:.1} MiB",
                mib(rss),
                mib(rss_after),
                mib(peak),
                mib(peak_after)
            );
        }
    }
    match dumped {
        Ok((stats, instead)) => {
            let path = match instead {
                Some((alt, e)) => {
                    crate::igprof_log!(
                        "could not write the profile at {reason} ({e}); wrote {alt} instead"
                    );
                    alt
                }
                None => path,
            };
            if opts.debug || stats.dropped > 0 || by_keeper {
                crate::igprof_log!(
                    "wrote {} at {reason}: {} samples, {} dropped (taken inside the profiler or no memory), {} truncated stacks, {} thread states",
                    path,
                    stats.samples,
                    stats.dropped,
                    stats.truncated,
                    stats.states
                );
            }
            let (threads, ns) = crate::sampler::unsampled();
            // Not for less than an interval in all: a short process's
            // threads are sampled only by chance, which says nothing new.
            if threads > 0 && ns as f64 >= crate::sampler::tick_seconds() * 1e9 {
                crate::igprof_log!(
                    "{threads} thread(s) ran {:.0} ms in all but no sample reached them (a thread that runs less than the interval, -i, is sampled only by chance; CPU-clock timers, used where perf events are refused, fire only on the scheduler tick): that time is not in the profile",
                    ns as f64 / 1e6
                );
            }
            let late = crate::sampler::late_off_cpu();
            if opts.debug && late > 0 {
                crate::igprof_log!(
                    "-pr: {:.0} ms off the CPU charged at a later sample, signal or thread end, not as the thread ran again: a context switch whose SIGTRAP the kernel dropped (as it does while another is pending), or time the thread's CPU clock leaves out",
                    late as f64 * crate::sampler::tick_seconds() * 1e3
                );
            }
            if opts.debug {
                log_handler_cost(&stats);
                log_dump_time(&stats);
            }
            Ok(path)
        }
        Err(e)
            if e.out_of_descriptors()
                && !by_keeper
                && !crate::base::run::execing()
                && crate::process::keeper::leave_final_dump() =>
        {
            crate::igprof_log!(
                "could not write the profile at {reason}: {e}; its keeper writes it once the process has ended"
            );
            Err(Unwritten::LeftToKeeper)
        }
        Err(e) => {
            crate::igprof_log!("could not write the profile at {reason}: {e}");
            Err(Unwritten::Lost)
        }
    }
}

/// The process dies by `sig` and its profile could not be written (no
/// watcher thread, or the signal interrupted the profiler itself, which may
/// hold what a dump needs): says so, unless the keeper will write it.
/// Signal context.
pub fn final_dump_from_signal(sig: i32) {
    if crate::base::run::active() && !output::final_begun() && !crate::process::keeper::watching() {
        crate::igprof_log!(
            "{} (default action) ends the process; no profile written",
            crate::sys::signal_name(sig)
        );
    }
}

/// `-d`: the sampling handler's CPU time per sample (when there were
/// samples), and how the unwinder's frame descriptor cache did.
fn log_handler_cost(stats: &DumpStats) {
    if let Some((median, p99)) = crate::sampler::cost::percentiles() {
        let mean = stats.handler_ns.checked_div(stats.samples).unwrap_or(0);
        crate::igprof_log!(
            "sampling handler CPU time per sample: mean {mean} ns, median {median} ns, 99th percentile {p99} ns (thread CPU clock; percentiles to 19%)"
        );
    }
    let d = stats.descriptors;
    crate::igprof_log!(
        "frame descriptors: {} hits, {} misses ({} of them found in the descriptor store), {} frames unwound by framehop",
        d.hits,
        d.misses,
        d.stored,
        d.framehop
    );
    let (direct, differ) = crate::unwind::direct_cfi_stats();
    crate::igprof_log!("frame descriptors derived from CFI rows directly: {direct}");
    let repeats = crate::unwind::store::repeats();
    if repeats > 0 {
        crate::igprof_log!(
            "frame descriptors derived again (a dlopen or dlclose empties the caches): {repeats}, kept once for the descriptor store"
        );
    }
    if crate::unwind::cfi_checking() {
        crate::igprof_log!(
            "CFI check: {differ} of {direct} direct derivations differ from framehop's"
        );
    }
    if crate::unwind::store::checking() {
        crate::igprof_log!(
            "descriptor store check: {} of {} stored descriptors differ from a fresh derivation",
            d.stored_differ,
            d.stored
        );
    }
}

/// `-d`: what the process added to the descriptor store.
fn log_saved_descriptors(saved: &crate::unwind::store::SaveReport) {
    let Some(dir) = crate::unwind::store::dir() else {
        return;
    };
    crate::igprof_log!(
        "descriptor store {}: {} descriptors added for {} objects",
        dir.display(),
        saved.added,
        saved.objects
    );
    if let Some(e) = &saved.error {
        crate::igprof_log!("descriptor store not written: {e}");
    }
}

/// `-d`: how long the dump took and how much of it was naming; where the
/// profiler's memory went.
fn log_dump_time(stats: &DumpStats) {
    let mut m = crate::base::tree::TreeMemory::default();
    for t in thread::all() {
        m += t.tree().memory();
    }
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    crate::igprof_log!(
        "memory of the profiler: call trees {:.1} MiB ({} nodes {:.1} MiB, counters of the {} charged {:.1} MiB, lookup tables {:.1} MiB); its allocator {:.1} MiB mapped, resident only where used (names, the dump's buffers, start-up's tables)",
        mib(m.node_bytes + m.counter_bytes + m.table_bytes),
        m.nodes,
        mib(m.node_bytes),
        m.charged,
        mib(m.counter_bytes),
        mib(m.table_bytes),
        mib(crate::base::alloc::mapped_bytes())
    );
    let ms = |ns: u64| ns as f64 / 1e6;
    crate::igprof_log!(
        "dump: {} nodes merged in {:.1} ms, {} addresses named in {:.1} ms ({} from .symtab), {:.1} ms in all (thread CPU time)",
        stats.nodes,
        ms(stats.merge_ns),
        stats.addresses,
        ms(stats.naming_ns),
        stats.from_symtab,
        ms(stats.dump_ns)
    );
    if let Some(ns) = stats.dladdr_naming_ns {
        crate::igprof_log!(
            "dump: the same profile named by dladdr and written in {:.1} ms (IGPROF_NAMES_CHECK)",
            ms(ns)
        );
    }
}
