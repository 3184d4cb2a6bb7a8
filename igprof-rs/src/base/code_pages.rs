//! The library's own code and read-only data pages, given back to the
//! kernel once start-up is over.
//!
//! Start-up runs most of the library's code once (options, hook planning
//! with its instruction decoder, the descriptor store, module tables), and
//! the kernel maps file pages around each fault, so by the end of it
//! nearly all of the library's 2 MB of text and read-only data are mapped
//! in the program and counted in its resident set, though a running
//! program uses a small part of them (its hooks, the sampler, the unwinder,
//! and the dump at the end). [`give_back`] unmaps those pages from the
//! process (`MADV_DONTNEED`); they stay in the page cache, shared with
//! every other process, and the pages the program still runs fault back in
//! on first use. A profiled process's peak RSS is then about 1 MB closer to
//! the unprofiled one's (docs/benchmarks.md, "Design figures").
//!
//! Owns: finding the library's own read-only loadable segments and the
//! advice on them.
//!
//! Must never: touch a writable segment (relocated data lives only in a
//! private copy: dropped, it would read the file's bytes again), or run
//! when the object has text relocations (its text is then a private copy
//! too).

/// One loadable segment of the library: start and end addresses.
type Segment = (usize, usize);

/// What [`find`] collects: the object holding `probe`, its read-only
/// segments, and whether it may not be given back.
struct Found {
    probe: usize,
    segments: [Segment; 8],
    n: usize,
    found: bool,
    refused: bool,
}

/// Unmaps the library's read-only pages from the process; returns the bytes
/// advised (0 where nothing was: the object not found, text relocations).
/// Start-up only (it takes the loader's lock).
pub fn give_back() -> usize {
    let mut f = Found {
        probe: give_back as fn() -> usize as usize,
        segments: [(0, 0); 8],
        n: 0,
        found: false,
        refused: false,
    };
    // SAFETY: the callback reads the loader's headers and writes only `f`.
    unsafe { libc::dl_iterate_phdr(Some(find), (&mut f as *mut Found).cast()) };
    if !f.found || f.refused {
        return 0;
    }
    let _e = crate::sys::ErrnoGuard::save();
    let mut bytes = 0;
    for &(start, end) in &f.segments[..f.n] {
        // SAFETY: whole pages of a read-only segment of this object, never
        // written (no text relocations): dropping them loses nothing, and
        // they read back from the file on the next touch.
        if unsafe { libc::syscall(libc::SYS_madvise, start, end - start, libc::MADV_DONTNEED) } == 0
        {
            bytes += end - start;
        }
    }
    bytes
}

/// dl_iterate_phdr's callback: fills the [`Found`] of the object whose
/// loaded segments hold its probe address.
unsafe extern "C" fn find(
    info: *mut libc::dl_phdr_info,
    _: usize,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: data is the Found passed by give_back; info is valid for the
    // call.
    let (f, info) = unsafe { (&mut *data.cast::<Found>(), &*info) };
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr as usize;
    let page = crate::sys::page_size();
    // SAFETY: the loader's description of a loaded object, inside the call.
    if !unsafe { trampoline::image::may_hold(info, f.probe, page) } {
        return 0;
    }
    f.found = true;
    let (segments, n) = (&mut f.segments, &mut f.n);
    f.refused =
        !super::resident::whole_pages_of_segments(base, phdrs, libc::PF_W, page, |start, end| {
            if *n < segments.len() {
                segments[*n] = (start, end);
                *n += 1;
            }
        });
    1
}
