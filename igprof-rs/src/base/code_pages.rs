//! The library's own code and read-only data pages, given back to the
//! kernel once start-up is over, and again before a final dump.
//!
//! Start-up runs most of the library's code once (options, hook planning
//! with its instruction decoder, the descriptor store, module tables), and
//! the kernel maps file pages around each fault, so by the end of it
//! nearly all of the library's 2 MB of text and read-only data are mapped
//! in the program and counted in its resident set, though a running
//! program uses a small part of them (its hooks, the sampler, the unwinder,
//! and the dump at the end). [`give_back_again`] unmaps those pages from
//! the process (`MADV_DONTNEED`); they stay in the page cache, shared with
//! every other process, and the pages the program still runs fault back in
//! on first use. A profiled process's peak RSS is then about 1 MB closer to
//! the unprofiled one's (docs/benchmarks.md, "Design figures"). [`find`]
//! notes the segments at start-up. Where a keeper runs, it gives the pages
//! back a little after start-up (process/keeper): a process that ends
//! before then, most of a build's short commands, never pays for the
//! advice nor for the faults that bring back the dump's pages.
//!
//! What faults back in is whole 64 KiB windows (the kernel maps the pages
//! around each fault), so code spread over the library's 1.4 MB of text
//! brings most of it back. The functions a long process keeps running
//! after start-up (the keeper's watch, the sampling handler and its walk,
//! the memory hooks with their stack memo, live table and CFI reading,
//! the library's memcpy/memset) carry `#[link_section = "igprof_hot"]`:
//! the linker gathers them in one section of under 64 KiB after `.text`,
//! at most two windows (sqlite3 under -mp, -pp or -pr: 92 KiB of the
//! library's code resident while it runs, 452 KiB under -mp before the
//! section;
//! tests/tests/footprint.rs). A function that runs on every sample or
//! allocation belongs there, and so does one that runs every few dozen of
//! them (re-arming a sampler): one call keeps its whole window resident.
//! Code of start-up, of the dump and of rare events does not (the section
//! would outgrow its window). The linker script (`igprof-rs/dump-code.ld`)
//! also puts there the closures and generic instances of the functions
//! marked (named after them; the attribute does not reach them, and a
//! build that stops inlining one moves it to `.text`), their jump tables
//! (LLVM gives each function's a section `.rodata.<function>`), the
//! 16-byte constants (`.rodata.cst16`, 2.4 KiB) and the statics the hot
//! code reads, which carry `#[link_section = ".rodata.igprof_hot_data"]`:
//! in `.rodata` each kept a 64 KiB window of read-only data resident.
//! Code of other crates (framehop, gimli, core) cannot be marked so and
//! still costs its windows when it runs.
//!
//! The final dump's code (merging, naming, writing, the descriptor store's
//! save: about 190 KiB, the standard library's formatting and the gzip
//! compressor included) is gathered by the linker instead, in a section
//! `igprof_dump` after `.text`: `igprof-rs/dump-code.ld` lists its
//! functions by name, in the order the dump's steps first run them, and
//! `scripts/dump-code-order` writes that list from the dump as traced under
//! gdb. A step then faults in a few windows of it, not most of the text:
//! sqlite3's dump steps left 1.3-1.6 MB of the library resident, now
//! 0.5-0.8 MB (`-d` says it; tests/tests/footprint.rs checks it).
//!
//! Owns: finding the library's own read-only loadable segments and the
//! advice on them.
//!
//! Must never: touch a writable segment (relocated data lives only in a
//! private copy: dropped, it would read the file's bytes again), or run
//! when the object has text relocations (its text is then a private copy
//! too).

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One loadable segment of the library: start and end addresses.
type Segment = (usize, usize);

/// What [`find`] collects of the library (the object holding [`find`]): its read-only
/// segments, and whether it may not be given back.
struct Found {
    segments: [Segment; 8],
    n: usize,
    refused: bool,
}

/// The segments [`find`] found, for [`give_back_again`]: start and
/// end of each, `SEGMENTS_FOUND` of them (0 until start-up is over or
/// where nothing may be given back). The library is never unloaded, so
/// they stay valid for the process's life (and a fork child's).
static SEGMENTS: [(AtomicUsize, AtomicUsize); 8] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; 8];
static SEGMENTS_FOUND: AtomicUsize = AtomicUsize::new(0);

/// The library's load bias and a copy of its program headers, made by
/// [`find`] ([`own_program_headers`]).
static OWN_PHDRS: std::sync::OnceLock<(usize, Box<[libc::Elf64_Phdr]>)> =
    std::sync::OnceLock::new();

/// The library's load bias and a copy of its program headers (None before
/// [`find`] found them). The loader's lie in the first page of the file,
/// with the dynamic symbol tables: a final dump that reads them (the
/// naming lists every object's segments) faults that 64 KiB window back
/// in, and nothing else of the dump touches it.
pub fn own_program_headers() -> Option<(usize, &'static [libc::Elf64_Phdr])> {
    OWN_PHDRS.get().map(|(bias, phdrs)| (*bias, &phdrs[..]))
}

/// Whether [`give_back_again`] has unmapped the pages since start-up, and
/// whether the final dump asks for it between its steps too
/// ([`between_steps`]).
static GIVEN_BACK: AtomicBool = AtomicBool::new(false);
static STEPS: AtomicBool = AtomicBool::new(false);

/// Finds the library's read-only segments, for [`give_back_again`];
/// returns their bytes (0 where nothing may be given back: the object not
/// found, text relocations). Start-up only (it takes the loader's lock);
/// advises nothing itself.
pub fn find() -> usize {
    let probe = find as fn() -> usize as usize;
    let page = crate::sys::page_size();
    let f = trampoline::image::first_object(|info| {
        // SAFETY: the loader's description of a loaded object, inside the
        // walk.
        if !unsafe { trampoline::image::may_hold(info, probe, page) } {
            return None;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let phdrs =
            unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let _ = OWN_PHDRS.set((base, phdrs.into()));
        let mut f = Found {
            segments: [(0, 0); 8],
            n: 0,
            refused: false,
        };
        let (segments, n) = (&mut f.segments, &mut f.n);
        f.refused = !super::resident::whole_pages_of_segments(
            base,
            phdrs,
            libc::PF_W,
            page,
            |start, end| {
                if *n < segments.len() {
                    segments[*n] = (start, end);
                    *n += 1;
                }
            },
        );
        Some(f)
    });
    let Some(f) = f.filter(|f| !f.refused) else {
        return 0;
    };
    for (slot, &(start, end)) in SEGMENTS.iter().zip(&f.segments[..f.n]) {
        slot.0.store(start, Ordering::Relaxed);
        slot.1.store(end, Ordering::Relaxed);
    }
    SEGMENTS_FOUND.store(f.n, Ordering::Release);
    f.segments[..f.n].iter().map(|(s, e)| e - s).sum()
}

/// Unmaps the pages of the segments [`find`] found, as many of them as
/// are present: once start-up is over (by the keeper, a little later),
/// and again before the final dump, whose code (merging, naming, writing)
/// then replaces the running program's hooks and unwinder in the resident
/// set instead of adding to them at the process's end, often its peak.
/// Takes no lock, allocates nothing and touches no errno (raw system
/// calls: the keeper calls it on the program's TLS); returns the bytes
/// advised (0 before [`find`]).
#[link_section = "igprof_hot"]
pub fn give_back_again() -> usize {
    let n = SEGMENTS_FOUND.load(Ordering::Acquire);
    let mut bytes = 0;
    for (start, end) in SEGMENTS[..n]
        .iter()
        .map(|(s, e)| (s.load(Ordering::Relaxed), e.load(Ordering::Relaxed)))
    {
        // SAFETY: whole pages of a read-only segment of this object, never
        // written (no text relocations): dropping them loses nothing, and
        // they read back from the file on the next touch, also in a thread
        // running them now.
        if unsafe { crate::sys::madvise(start, end - start, libc::MADV_DONTNEED) } {
            bytes += end - start;
        }
    }
    if bytes > 0 {
        GIVEN_BACK.store(true, Ordering::Relaxed);
    }
    bytes
}

/// Whether the pages have been given back since start-up (by the keeper
/// a little after it, or at its end): the code resident since is what the
/// run used, and giving it back again costs only the faults of what runs
/// next.
pub fn given_back() -> bool {
    GIVEN_BACK.load(Ordering::Relaxed)
}

/// The final dump's steps (naming, writing, saving descriptors) each use
/// code of their own, spread over the library's text, and the kernel maps
/// 64 KiB around each fault: given back between them, the pages of a step
/// leave before the next one faults its own in, and the dump's peak is
/// its largest step's, not their sum. `on` while a final dump runs in a
/// process whose pages were given back since start-up ([`given_back`]):
/// a short process's dump would only fault them in again.
pub fn give_back_between_steps(on: bool) {
    if on {
        // A dump's own steps are noted, not those of an earlier one (a
        // final dump written again after an exec that failed).
        STEPS_NOTED.store(0, Ordering::Relaxed);
    }
    STEPS.store(on, Ordering::Relaxed);
}

/// Between two steps of the final dump: gives the pages back where
/// [`give_back_between_steps`] asked for it.
pub fn between_steps() {
    if STEPS.load(Ordering::Relaxed) {
        note_step();
        give_back_again();
    }
}

/// KiB of the library's code and read-only data resident at the end of
/// each step of the final dump so far (`-d` only; at most [`STEP_NOTES`]).
static STEP_KIB: [AtomicUsize; STEP_NOTES] = [const { AtomicUsize::new(0) }; STEP_NOTES];
static STEPS_NOTED: AtomicUsize = AtomicUsize::new(0);
const STEP_NOTES: usize = 4;

/// Under `-d`, notes how much of the library's read-only segments a step
/// of the final dump left resident (read from `/proc/self/pagemap`).
#[cold]
fn note_step() {
    if !crate::base::options::get().debug {
        return;
    }
    let Some(map) = crate::base::resident::Pagemap::open() else {
        return;
    };
    let page = crate::sys::page_size();
    let n = SEGMENTS_FOUND.load(Ordering::Acquire);
    let bytes: usize = SEGMENTS[..n]
        .iter()
        .filter_map(|(s, e)| {
            map.present_bytes(s.load(Ordering::Relaxed), e.load(Ordering::Relaxed), page)
        })
        .sum();
    let i = STEPS_NOTED.fetch_add(1, Ordering::Relaxed);
    if let Some(slot) = STEP_KIB.get(i) {
        slot.store(bytes >> 10, Ordering::Relaxed);
    }
}

/// The final dump's last step is over: the KiB [`between_steps`] noted at
/// the end of each step, this one's too (empty without `-d` or where the
/// pages were not given back between the steps).
pub fn steps_resident_kib() -> Vec<usize> {
    if STEPS.load(Ordering::Relaxed) {
        note_step();
    }
    let n = STEPS_NOTED.load(Ordering::Relaxed).min(STEP_NOTES);
    STEP_KIB[..n]
        .iter()
        .map(|k| k.load(Ordering::Relaxed))
        .collect()
}
