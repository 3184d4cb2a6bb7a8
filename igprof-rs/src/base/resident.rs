//! Pages of loaded objects' read-only segments that a step of the profiler
//! faulted in itself, given back when the step is over.
//!
//! The dump names addresses by reading each object's dynamic symbol table
//! in memory (`output/names.rs`). A program that exports its symbols
//! (cc1plus: 2.4 MB of `.gnu.hash`, `.dynsym` and `.dynstr`) has those
//! pages mapped into the process by the reading, and as the final dump
//! comes at the end of the run, where a compiler's memory is highest, they
//! land on its peak RSS. [`Fresh`] notes which pages of an object's
//! read-only, non-executable segments are present before such a step
//! (`/proc/self/pagemap`), and [`Fresh::give_back`] unmaps those present
//! after it that were not before (`MADV_DONTNEED`): the page cache keeps
//! them, and the program's own pages stay as they were. The unwinder's
//! module table does the same around each new object's `.eh_frame_hdr`,
//! whose first bytes it reads to find `.eh_frame` ([`Fresh::around`]):
//! most objects' frames are never unwound, and the 64 KiB the kernel maps
//! around that one read stayed resident in every profiled process (sqlite3:
//! six libraries, about 150 KiB).
//!
//! At a final dump, which unwinds nothing, the pages of every loaded
//! object's unwind tables that the run's walks read go too
//! ([`give_back_unwind_tables`]).
//!
//! Owns: reading the present bits, and which segments may be given back:
//! not writable, not executable, whole pages, in an object without text
//! relocations ([`whole_pages_of_segments`], shared with `code_pages`).
//!
//! Must never: drop a page that was present before the step, or a page of
//! a writable or text-relocated segment (a private copy: dropped, it would
//! read the file's bytes again); run in a signal handler (it allocates).

use std::os::unix::fs::FileExt;

/// A pagemap entry's bits 63 (the page is present) and 61 (a file page or
/// shared memory, not a private anonymous copy), in its last byte.
const PRESENT: u8 = 0x80;
const FILE: u8 = 0x20;

/// How far around an address a read can fault file pages in: past the
/// 64 KiB around a fault that the kernel maps by default
/// (`fault_around_bytes`).
pub const FAULT_AROUND: usize = 128 << 10;

/// `/proc/self/pagemap`, opened once for a series of steps.
pub struct Pagemap(std::fs::File);

impl Pagemap {
    /// None where the kernel refuses it (then nothing is given back).
    pub fn open() -> Option<Pagemap> {
        std::fs::File::open("/proc/self/pagemap").ok().map(Pagemap)
    }

    /// Whether each page of `start..end` (page-aligned) is present in the
    /// process; None when it cannot be read.
    fn present(&self, start: usize, end: usize, page: usize) -> Option<Vec<bool>> {
        self.pages_with(start, end, page, PRESENT)
    }

    /// Whether each page of `start..end` (page-aligned) is present in the
    /// process as the file's own page (not a private copy that a write
    /// made); None when they cannot be read.
    fn present_from_file(&self, start: usize, end: usize, page: usize) -> Option<Vec<bool>> {
        self.pages_with(start, end, page, PRESENT | FILE)
    }

    /// Whether the last byte of each page's entry has all the bits of `bits`.
    fn pages_with(&self, start: usize, end: usize, page: usize, bits: u8) -> Option<Vec<bool>> {
        let n = (end - start) / page;
        let mut raw = vec![0u8; n * 8];
        self.0
            .read_exact_at(&mut raw, (start / page * 8) as u64)
            .ok()?;
        Some(raw.chunks_exact(8).map(|e| e[7] & bits == bits).collect())
    }

    /// Bytes of the pages of `start..end` (page-aligned) present in the
    /// process; None when they cannot be read.
    pub fn present_bytes(&self, start: usize, end: usize, page: usize) -> Option<usize> {
        Some(
            self.present(start, end, page)?
                .iter()
                .filter(|&&p| p)
                .count()
                * page,
        )
    }
}

/// The present pages of some read-only ranges before a step (see the
/// module docs).
pub struct Fresh<'p> {
    map: &'p Pagemap,
    page: usize,
    /// (start, end, present before) of each range.
    ranges: Vec<(usize, usize, Vec<bool>)>,
}

impl<'p> Fresh<'p> {
    /// Notes the present pages within `reach` bytes of `addr` in the
    /// read-only, non-executable PT_LOAD segment that holds it, in the
    /// object whose program headers are `phdrs`, loaded at `bias`: the
    /// pages a read at `addr` can fault in (the kernel maps the file's
    /// pages around a fault). None where none may be given back.
    pub fn around(
        map: &'p Pagemap,
        bias: usize,
        phdrs: &[libc::Elf64_Phdr],
        page: usize,
        addr: usize,
        reach: usize,
    ) -> Option<Fresh<'p>> {
        Self::near(map, bias, phdrs, page, &[(addr, addr)], reach)
    }

    /// As [`Fresh::around`] for reads anywhere in each of `spans` (start,
    /// end): the pages within `reach` bytes of a span, in the read-only,
    /// non-executable segment that holds its start.
    pub fn near(
        map: &'p Pagemap,
        bias: usize,
        phdrs: &[libc::Elf64_Phdr],
        page: usize,
        spans: &[(usize, usize)],
        reach: usize,
    ) -> Option<Fresh<'p>> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        let ok = whole_pages_of_segments(bias, phdrs, libc::PF_W | libc::PF_X, page, |s, e| {
            for &(lo, hi) in spans {
                if s <= lo && lo < e {
                    let from = lo.saturating_sub(reach) & !(page - 1);
                    let to = hi.saturating_add(reach) & !(page - 1);
                    ranges.push((s.max(from), e.min(to)));
                }
            }
        });
        ranges.retain(|&(s, e)| s < e);
        // Spans near each other: one range, each page read once.
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        if !ok || merged.is_empty() {
            return None;
        }
        Self::of_ranges(map, &merged, page)
    }

    /// Notes the present pages of `ranges` (page-aligned, read-only
    /// mappings of files).
    pub fn of_ranges(
        map: &'p Pagemap,
        ranges: &[(usize, usize)],
        page: usize,
    ) -> Option<Fresh<'p>> {
        let ranges: Vec<_> = ranges
            .iter()
            .filter_map(|&(s, e)| Some((s, e, map.present(s, e, page)?)))
            .collect();
        (!ranges.is_empty()).then_some(Fresh { map, page, ranges })
    }

    /// Unmaps the pages of the ranges present now that were not before;
    /// returns their bytes.
    pub fn give_back(self) -> usize {
        self.ranges
            .iter()
            .map(|(start, end, before)| {
                drop_file_pages(self.map, *start, *end, self.page, |i| before[i])
            })
            .sum()
    }
}

/// Unmaps every page of `start..end` (whole pages of a read-only,
/// non-executable segment of an object without text relocations, as
/// [`whole_pages_of_segments`] gives them) that the process has as the
/// file's own page; returns their bytes. For memory the process will not
/// read again, or only rarely (a final dump's view of the objects' unwind
/// tables): they read back from the file if it does.
pub fn give_back_file_pages(map: &Pagemap, start: usize, end: usize, page: usize) -> usize {
    drop_file_pages(map, start, end, page, |_| false)
}

/// Unmaps from the process the pages of every loaded object's unwind
/// tables (`.eh_frame_hdr` to the end of its segment, where `.eh_frame`
/// follows it) that it has as the file's own pages; returns their bytes.
/// For a final dump, which unwinds nothing: a `-pp` run reads the tables
/// of every object its samples fall in, and the kernel maps 64 KiB around
/// each read, so they hold a few hundred KiB of the process's resident
/// set (sqlite3: libc's and libsqlite3's, 300 KiB) when the dump's own
/// memory comes on top of its peak. Pages of a read-only, non-executable
/// segment only, of objects without text relocations; a page written since
/// it was mapped stays. The objects are listed by `dl_iterate_phdr`, whose
/// lock keeps each one mapped while it is looked at (the module table may
/// still hold one that a thread paused inside `dlclose` unmapped). The
/// program's own reads of them (an exception thrown after the dump) fault
/// them back in. The object loaded at bias `skip` is left alone (the
/// library's own: its frames are never unwound, and its headers are read
/// from a copy). Outside signal context.
pub fn give_back_unwind_tables(skip: Option<usize>) -> usize {
    let Some(map) = Pagemap::open() else {
        return 0;
    };
    let page = crate::sys::page_size();
    let mut bytes = 0;
    trampoline::image::each_object(|info| {
        if info.dlpi_phdr.is_null() || skip == Some(info.dlpi_addr as usize) {
            return;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let phdrs =
            unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let Some(hdr) = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME) else {
            return;
        };
        let Some(seg) = phdrs.iter().find(|p| {
            p.p_type == libc::PT_LOAD
                && p.p_vaddr <= hdr.p_vaddr
                && hdr.p_vaddr < p.p_vaddr + p.p_filesz
        }) else {
            return;
        };
        let lo = (base + hdr.p_vaddr as usize).next_multiple_of(page);
        let hi = (base + (seg.p_vaddr + seg.p_filesz) as usize) & !(page - 1);
        whole_pages_of_segments(base, phdrs, libc::PF_W | libc::PF_X, page, |start, end| {
            let (start, end) = (start.max(lo), end.min(hi));
            if start < end {
                bytes += give_back_file_pages(&map, start, end, page);
            }
        });
    });
    bytes
}

/// Unmaps the pages of `start..end` present as the file's own pages,
/// except those whose index `keep` says to keep; returns their bytes.
fn drop_file_pages(
    map: &Pagemap,
    start: usize,
    end: usize,
    page: usize,
    keep: impl Fn(usize) -> bool,
) -> usize {
    let _e = crate::sys::ErrnoGuard::save();
    // Only the file's own pages: a private copy (a page written since it
    // was mapped) holds what the file does not.
    let Some(now) = map.present_from_file(start, end, page) else {
        return 0;
    };
    let mut bytes = 0;
    let mut i = 0;
    while i < now.len() {
        if !now[i] || keep(i) {
            i += 1;
            continue;
        }
        let run = (i..now.len()).take_while(|&j| now[j] && !keep(j)).count();
        let at = start + i * page;
        // SAFETY: whole pages of a file mapping that is not writable, in an
        // object without text relocations (the callers' ranges), present
        // now as the file's own pages: dropping them loses nothing, and
        // they read back from the file.
        if unsafe { crate::sys::madvise(at, run * page, libc::MADV_DONTNEED) } {
            bytes += run * page;
        }
        i += run;
    }
    bytes
}

/// Calls `each(start, end)` with the whole pages of each PT_LOAD segment,
/// among the program headers `phdrs` of an object loaded at `bias`, that
/// has none of the flags `excluded` (`PF_W`, or `PF_W | PF_X`; a page
/// shared with another segment stays out). False, and no call, where the
/// object has text relocations: its read-only segments are then private
/// copies, which must never be given back.
pub(crate) fn whole_pages_of_segments(
    bias: usize,
    phdrs: &[libc::Elf64_Phdr],
    excluded: u32,
    page: usize,
    mut each: impl FnMut(usize, usize),
) -> bool {
    if trampoline::image::text_relocated(bias, phdrs) {
        return false;
    }
    for ph in phdrs
        .iter()
        .filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & excluded == 0)
    {
        let start = (bias + ph.p_vaddr as usize).next_multiple_of(page);
        let end = (bias + (ph.p_vaddr + ph.p_filesz) as usize) & !(page - 1);
        if start < end {
            each(start, end);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::AsRawFd;

    /// A private read-only mapping of a new file of `pages` pages whose
    /// page `i` holds `byte(i)`, with the directory to remove after.
    fn mapped_file(
        name: &str,
        pages: usize,
        byte: impl Fn(usize) -> u8,
    ) -> (usize, std::path::PathBuf) {
        let page = 4096;
        let dir = std::env::temp_dir().join(format!("igprof-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data");
        let bytes: Vec<u8> = (0..pages * page).map(|i| byte(i / page)).collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh read-only private mapping of our own file.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                pages * page,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (p as usize, dir)
    }

    /// A file mapped read-only: a page present before the step stays, the
    /// pages the step faulted in go, and the mapping still reads the file.
    #[test]
    fn only_the_pages_a_step_faulted_in_are_given_back() {
        let page = 4096;
        // A fault maps the cached pages around it (a 64 KiB window, or a
        // whole large folio of the page cache): the step reads pages that
        // are not mapped yet, wherever they are.
        const N: usize = 256;
        let (p, dir) = mapped_file("resident", N, |i| (i % 251) as u8 + 1);
        let read = |i: usize| unsafe { core::ptr::read_volatile((p + i * page) as *const u8) };
        let map = Pagemap::open().expect("pagemap");
        assert_eq!(read(0), 1);
        let present = |i| map.present(p + i * page, p + (i + 1) * page, page).unwrap()[0];
        if !present(0) {
            // qemu-user: the pagemap is the emulator's, not the guest's.
            eprintln!("no present bits in this process's pagemap: not run");
            return;
        }
        let fresh = Fresh::of_ranges(&map, &[(p, p + N * page)], page).unwrap();
        // Up to three pages not mapped before, each read after the last
        // (a read may map its neighbours).
        let mut touched = Vec::new();
        for i in 1..N {
            if touched.len() < 3 && !present(i) {
                assert_eq!(read(i), (i % 251) as u8 + 1);
                touched.push(i);
            }
        }
        if touched.is_empty() {
            eprintln!("every page was mapped by the first read: not run");
            return;
        }
        let given = fresh.give_back();
        assert!(present(0), "present before the step: kept");
        for &i in &touched {
            assert!(!present(i), "page {i} faulted in by the step: given back");
        }
        // Whatever was mapped around them went too, and nothing else: at
        // least the pages read, at most all but page 0.
        assert!(given >= touched.len() * page && given < N * page, "{given}");
        // The mapping reads the file as before.
        for i in 0..N {
            assert_eq!(read(i), (i % 251) as u8 + 1);
        }
        // SAFETY: our mapping, unused from here on.
        unsafe { libc::munmap(p as *mut libc::c_void, N * page) };
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every page present as the file's own goes; a page written since it
    /// was mapped (a private copy) stays with what was written, and the
    /// others read the file again.
    #[test]
    fn file_pages_go_and_a_written_page_stays() {
        let page = 4096;
        const N: usize = 32;
        let (p, dir) = mapped_file("resident-all", N, |i| i as u8 + 1);
        // SAFETY: inside our mapping.
        let read = |i: usize| unsafe { core::ptr::read_volatile((p + i * page) as *const u8) };
        let map = Pagemap::open().expect("pagemap");
        for i in 0..N {
            assert_eq!(read(i), i as u8 + 1);
        }
        let present = |i| map.present(p + i * page, p + (i + 1) * page, page).unwrap()[0];
        if !present(0) {
            // qemu-user: the pagemap is the emulator's, not the guest's.
            eprintln!("no present bits in this process's pagemap: not run");
            return;
        }
        // Page 5 written: a private copy of the file's page.
        // SAFETY: our mapping; made writable for one write, then read-only.
        unsafe {
            assert_eq!(
                libc::mprotect(
                    (p + 5 * page) as *mut libc::c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE
                ),
                0
            );
            core::ptr::write_volatile((p + 5 * page) as *mut u8, 0xEE);
            assert_eq!(
                libc::mprotect((p + 5 * page) as *mut libc::c_void, page, libc::PROT_READ),
                0
            );
        }
        let given = give_back_file_pages(&map, p, p + N * page, page);
        assert_eq!(given, (N - 1) * page);
        for i in (0..N).filter(|&i| i != 5) {
            assert!(!present(i), "page {i}: given back");
        }
        assert!(present(5), "the written page stays");
        assert_eq!(read(5), 0xEE);
        for i in (0..N).filter(|&i| i != 5) {
            assert_eq!(read(i), i as u8 + 1);
        }
        // SAFETY: our mapping, unused from here on.
        unsafe { libc::munmap(p as *mut libc::c_void, N * page) };
        let _ = std::fs::remove_dir_all(&dir);
    }
}
