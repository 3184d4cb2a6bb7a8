//! Anonymous memory by direct mmap/munmap/mremap: the library's own
//! mappings (arenas, tables, stacks), optionally on huge pages or faulted
//! in up front; a shared mapping of a file of its own (the memory
//! journal); and the process's peak resident set (getrusage).
//!
//! Must never: call malloc or libc's mmap (either may be hooked by the
//! profiler itself), or unmap memory it did not map.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU8, Ordering};

use super::errno::{Errno, ErrnoGuard};
use super::raw::raw_syscall;

/// Anonymous private read/write mapping of `len` bytes, or null.
pub fn mmap_anon(len: usize) -> *mut u8 {
    map_anon(len, false).unwrap_or(core::ptr::null_mut())
}

/// Anonymous private read/write mapping of `len` bytes (zero-filled;
/// faulted in now with `populate`, so that a signal handler never takes the
/// page faults of first use): its address, or the errno of the failure.
/// Where the kernel gives anonymous memory transparent huge pages unasked
/// ([`thp_always`]), the mapping is advised out of them first: a region
/// of ours that uses a few pages (a stack, the dump's region, chunks that
/// merged into one mapping) would otherwise cost 2 MiB on its first touch
/// (sqlite3 under `-mp`: 1.5 MB more peak RSS).
#[link_section = "igprof_hot"]
pub fn map_anon(len: usize, populate: bool) -> Result<*mut u8, Errno> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if !thp_always() {
        return map(
            len,
            flags | if populate { libc::MAP_POPULATE } else { 0 },
            -1,
        );
    }
    let p = map(len, flags, -1)?;
    // SAFETY: advice on the mapping just made; it changes no contents.
    unsafe { madvise(p as usize, len, libc::MADV_NOHUGEPAGE) };
    if populate && !populate_write(p, len) {
        // A kernel without MADV_POPULATE_WRITE (before 5.14): a write to
        // each page faults it in.
        let page = page_size();
        for at in (0..len).step_by(page) {
            // SAFETY: inside the mapping just made, read/write.
            unsafe { core::ptr::write_volatile(p.add(at), 0) };
        }
    }
    Ok(p)
}

/// Whether the kernel backs anonymous memory with transparent huge pages
/// without being asked (`/sys/kernel/mm/transparent_hugepage/enabled` is
/// "[always]", the default of RHEL and its rebuilds; Debian and Ubuntu
/// have "madvise"). Read once, by raw system calls (this can run in a
/// signal handler).
#[link_section = "igprof_hot"]
fn thp_always() -> bool {
    /// 0: not read yet; 1: no; 2: yes.
    static MODE: AtomicU8 = AtomicU8::new(0);
    match MODE.load(Ordering::Relaxed) {
        0 => {
            let yes = read_thp_always();
            MODE.store(1 + yes as u8, Ordering::Relaxed);
            yes
        }
        mode => mode == 2,
    }
}

#[cold]
fn read_thp_always() -> bool {
    let path = b"/sys/kernel/mm/transparent_hugepage/enabled\0";
    let mut buf = [0u8; 16];
    // SAFETY: raw system calls on a NUL-terminated path and a buffer on
    // this stack; the descriptor is closed before returning.
    unsafe {
        let fd = raw_syscall(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                (libc::O_RDONLY | libc::O_CLOEXEC) as usize,
                0,
                0,
                0,
            ],
        );
        if fd < 0 {
            return false;
        }
        let n = raw_syscall(
            libc::SYS_read,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        );
        raw_syscall(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]);
        n > 0 && says_always(&buf[..n as usize])
    }
}

/// Whether the text of `transparent_hugepage/enabled` selects "always"
/// (the selected mode is the one in brackets).
fn says_always(text: &[u8]) -> bool {
    text.starts_with(b"[always]")
}

/// A read/write mmap of `len` bytes with `flags`, of `fd` from its start.
fn map(len: usize, flags: i32, fd: i32) -> Result<*mut u8, Errno> {
    // SAFETY: a new mapping at an address the kernel chooses touches no
    // existing memory.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            core::ptr::null_mut::<c_void>(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd as libc::c_long,
            0 as libc::c_long,
        )
    };
    if p < 0 {
        Err(Errno::last())
    } else {
        Ok(p as *mut u8)
    }
}

/// A shared read/write mapping of the first `len` bytes of the file open
/// as `fd` (which may be closed afterwards): its address, or the errno.
pub fn map_shared_file(fd: i32, len: usize) -> Result<*mut u8, Errno> {
    map(len, libc::MAP_SHARED, fd)
}

/// An anonymous read/write mapping of `len` bytes shared with the
/// processes this one makes afterwards (not copied on their fork): its
/// address, or the errno.
pub fn map_anon_shared(len: usize) -> Result<*mut u8, Errno> {
    map(len, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1)
}

/// Transparent huge pages' size on x86-64 and on AArch64 with 4 KiB pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// [`mmap_anon`] for a region of at least [`HUGE_PAGE`] bytes that will be
/// filled from its start (a call tree's nodes): aligned to 2 MiB and marked
/// `MADV_HUGEPAGE`, so that where transparent huge pages are enabled
/// ("always" or "madvise") each 2 MiB costs one page fault instead of 512
/// (a twentieth of the time), and a fraction of the teardown at exit.
/// Where they are not, the same as [`mmap_anon`]. Null on failure.
pub fn mmap_anon_huge(len: usize) -> *mut u8 {
    let raw = mmap_anon(len + HUGE_PAGE);
    if raw.is_null() {
        return raw;
    }
    let start = (raw as usize).next_multiple_of(HUGE_PAGE);
    // Less than HUGE_PAGE before `start`, so the rest of it after the end.
    let head = start - raw as usize;
    // SAFETY: both pieces lie in the mapping just made, outside
    // [start, start + len), and nothing refers to them.
    unsafe {
        if head > 0 {
            munmap(raw, head);
        }
        munmap((start + len) as *mut u8, HUGE_PAGE - head);
    }
    // SAFETY: advice on our own mapping; a kernel without THP refuses it.
    unsafe { madvise(start, len, libc::MADV_HUGEPAGE) };
    start as *mut u8
}

/// Faults in the whole pages of `p..p+len` for writing, in one system
/// call (`MADV_POPULATE_WRITE`, Linux 5.14): for a table about to be
/// filled at random places, whose pages would otherwise each take two
/// faults (a read maps the zero page, the first write copies it). Does
/// nothing where the kernel does not have it. Errno is kept.
/// Returns whether the kernel did it.
#[link_section = "igprof_hot"]
pub fn populate_write(p: *mut u8, len: usize) -> bool {
    const MADV_POPULATE_WRITE: i32 = 23;
    match whole_pages(p, len) {
        // SAFETY: advice on pages of a mapping of ours; populating changes
        // no contents (zero pages stay zero).
        Some((start, bytes)) => unsafe { madvise(start, bytes, MADV_POPULATE_WRITE) },
        None => true,
    }
}

/// madvise(2) by a raw system call (errno is kept; no libc, so a signal
/// handler or the keeper may call it): whether the kernel took the
/// advice.
///
/// # Safety
/// `start..start+len` must be whole pages of a mapping of this process,
/// and an advice that drops pages (`MADV_DONTNEED`) only where nothing is
/// lost: memory nothing will read again, or the file's own pages.
#[link_section = "igprof_hot"]
pub unsafe fn madvise(start: usize, len: usize, advice: i32) -> bool {
    raw_syscall(libc::SYS_madvise, [start, len, advice as usize, 0, 0, 0]) == 0
}

/// The whole pages inside `p..p+len`: their start and length (None if
/// there is none).
fn whole_pages(p: *mut u8, len: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let (start, end) = (
        (p as usize).next_multiple_of(page),
        (p as usize + len) & !(page - 1),
    );
    (start < end).then_some((start, end - start))
}

/// The size of a page of this machine (4 KiB where sysconf has no answer).
pub fn page_size() -> usize {
    trampoline::page_size() as usize
}

/// Whether every page of `start..start + len` is mapped in this process
/// (`mincore` fails on a range with a hole). Raw system calls: errno is
/// untouched. For memory of others that may have been unmapped, before it
/// is read.
pub fn mapped(start: usize, len: usize) -> bool {
    let page = page_size();
    let Some(end) = start.checked_add(len.max(1)) else {
        return false;
    };
    let mut at = start & !(page - 1);
    let end = (end + page - 1) & !(page - 1);
    let mut vec = [0u8; 64];
    while at < end {
        let pages = ((end - at) / page).min(vec.len());
        // SAFETY: mincore writes one byte per page asked into `vec`,
        // which holds `pages` bytes or more; it reads no memory.
        let r = unsafe {
            raw_syscall(
                libc::SYS_mincore,
                [at, pages * page, vec.as_mut_ptr() as usize, 0, 0, 0],
            )
        };
        if r < 0 {
            return false;
        }
        at += pages * page;
    }
    true
}

/// Gives the whole pages of `p..p+len` back to the kernel
/// (`MADV_DONTNEED`): they read as zeros if touched again. For memory of
/// ours that nothing will read any more but that cannot be unmapped (it
/// lies inside a larger region). Errno is kept. In the hot section: a
/// call tree's lookup table gives its old pages back here as it grows,
/// while the program runs.
#[link_section = "igprof_hot"]
pub fn discard(p: *mut u8, len: usize) {
    if let Some((start, bytes)) = whole_pages(p, len) {
        // SAFETY: whole pages of a private mapping of ours that nothing
        // reads any more.
        unsafe { madvise(start, bytes, libc::MADV_DONTNEED) };
    }
}

/// munmap(2).
///
/// # Safety
/// `p..p+len` must be a mapping made by [`mmap_anon`] that nothing uses any more.
pub unsafe fn munmap(p: *mut u8, len: usize) {
    libc::syscall(libc::SYS_munmap, p, len);
}

/// mremap(2) with MREMAP_MAYMOVE; null on failure.
///
/// # Safety
/// `p..p+old` must be a mapping made by [`mmap_anon`].
pub unsafe fn mremap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
    let r = libc::syscall(libc::SYS_mremap, p, old, new, libc::MREMAP_MAYMOVE);
    if r < 0 {
        core::ptr::null_mut()
    } else {
        r as *mut u8
    }
}

/// The process's peak resident set size in bytes (getrusage RUSAGE_SELF
/// `ru_maxrss`), or None if the kernel refuses.
pub fn peak_rss_bytes() -> Option<u64> {
    let _e = ErrnoGuard::save();
    // SAFETY: rusage is plain data; the kernel fills it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    let r = unsafe { libc::syscall(libc::SYS_getrusage, libc::RUSAGE_SELF, &mut ru) };
    (r == 0).then_some(ru.ru_maxrss as u64 * 1024)
}

/// Asks the CPU to start loading the cache line at `p` for reading: a
/// hint, which never faults (any address will do) and changes nothing the
/// program can see.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch(p.cast::<i8>(), core::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint that never faults.
    unsafe {
        core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_with_a_hole_is_not_mapped() {
        let page = page_size();
        let p = mmap_anon(200 * page) as usize;
        assert!(mapped(p, 200 * page));
        assert!(mapped(p + 10, 1));
        // SAFETY: one page of the mapping just made, used by nothing.
        unsafe { munmap((p + 150 * page) as *mut u8, page) };
        assert!(mapped(p, 150 * page));
        assert!(
            !mapped(p, 200 * page),
            "the hole is past the first 64 pages asked"
        );
        assert!(!mapped(p + 150 * page + 8, 8));
        assert!(mapped(p + 151 * page, 49 * page));
        assert!(!mapped(usize::MAX - 10, 100));
        // SAFETY: the rest of the mapping, used by nothing.
        unsafe {
            munmap(p as *mut u8, 150 * page);
            munmap((p + 151 * page) as *mut u8, 49 * page);
        }
    }

    #[test]
    fn the_selected_huge_page_mode_is_the_bracketed_one() {
        assert!(says_always(b"[always] madvise never\n"));
        assert!(!says_always(b"always [madvise] never\n"));
        assert!(!says_always(b"always madvise [never]\n"));
        assert!(!says_always(b""));
    }

    #[test]
    fn a_mapping_is_advised_out_of_huge_pages_where_they_are_always_on() {
        let len = 4 << 20;
        let p = map_anon(len, false).unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        // The mapping that holds `p` (it may have merged with a neighbour).
        let holds = |l: &&str| {
            let range = l.split(' ').next().unwrap_or_default();
            let mut ends = range.split('-').map(|x| usize::from_str_radix(x, 16));
            matches!((ends.next(), ends.next()), (Some(Ok(lo)), Some(Ok(hi)))
                if lo <= p as usize && (p as usize) < hi)
        };
        let flags = smaps
            .lines()
            .skip_while(|l| !holds(l))
            .find(|l| l.starts_with("VmFlags:"))
            .unwrap_or_else(|| panic!("no mapping holds {p:?}"))
            .to_string();
        assert_eq!(flags.contains(" nh"), thp_always(), "{flags}");
        // SAFETY: the mapping made above, used by nothing.
        unsafe { munmap(p, len) };
    }
}
