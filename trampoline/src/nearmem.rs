//! Executable pages for trampolines and entry stubs, allocated within a
//! given reach of a target address (x86-64: +-2 GiB; AArch64: +-128 MiB).
//!
//! Owns: the list of trampoline pages of this process and their fill level.
//! Many pieces of code share one page (bump allocation, aligned to the
//! architecture's code alignment). Pages are read+execute once written: a
//! write makes the page read+write+execute for the duration of the copy
//! (so threads running earlier trampolines in it never fault), then
//! read+execute again. If the system refuses writable+executable mappings,
//! the page is made read+write only for the copy (then a thread running an
//! older trampoline of that page during the copy would fault; documented).
//! Memory is never freed: a thread may still be inside a trampoline after
//! its hook is uninstalled.
//!
//! Must never: be called from a signal handler or a hook (it allocates and
//! takes a lock); write outside the pages it mapped.

use crate::arch::{within, Arch};
use crate::error::Reason;
use crate::maps;
use crate::patch::{open_writable, protect};
use std::sync::Mutex;

struct Page {
    base: u64,
    len: u64,
    used: u64,
}

static PAGES: Mutex<Vec<Page>> = Mutex::new(Vec::new());

/// Page size of the host.
#[link_section = "igprof_hot"]
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Lowest address worth mapping (`vm.mmap_min_addr`, at least 64 KiB).
fn mmap_min_addr() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/mmap_min_addr")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0)
        .max(0x10000)
}

/// Place code within `A::NEAR_REACH` of `near`: reserve `max_len` bytes
/// (every byte in reach), call `gen` with the address the code will live at,
/// copy the bytes it returns (at most `max_len`) there, flush the
/// instruction cache, and return the address.
pub fn place<A: Arch>(
    near: u64,
    max_len: usize,
    gen: impl FnOnce(u64) -> Result<Vec<u8>, Reason>,
) -> Result<u64, Reason> {
    place_within::<A>(near, A::NEAR_REACH, max_len, gen)
}

/// As [`place`] with an explicit reach (e.g. `u64::MAX / 4` for "anywhere").
pub fn place_within<A: Arch>(
    near: u64,
    reach: u64,
    max_len: usize,
    gen: impl FnOnce(u64) -> Result<Vec<u8>, Reason>,
) -> Result<u64, Reason> {
    let align = A::CODE_ALIGN as u64;
    let max_len = max_len as u64;
    let mut pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    let fits = |p: &Page| fit(p, near, reach, max_len, align);
    let found = pages
        .iter()
        .enumerate()
        .find_map(|(i, p)| fits(p).map(|at| (i, at)));
    let (idx, at) = match found {
        Some(x) => x,
        None => {
            let page = new_page_near(near, reach, max_len)?;
            pages.push(page);
            let i = pages.len() - 1;
            let at = fits(&pages[i]).ok_or(Reason::NoMemoryInReach { near, reach })?;
            (i, at)
        }
    };
    let code = gen(at)?;
    if code.len() as u64 > max_len {
        // An architecture module broke its MAX_TRAMPOLINE_LEN/STUB_LEN
        // promise: refuse rather than overrun the reservation.
        return Err(Reason::Unrelocatable {
            at: near,
            what: format!(
                "{} emitted {} bytes, more than the {max_len} reserved",
                A::NAME,
                code.len()
            ),
        });
    }
    let p = &mut pages[idx];
    write_into_page(p.base, p.len, at, &code)?;
    A::flush_icache(at, code.len());
    p.used = at + code.len() as u64 - p.base;
    Ok(at)
}

/// First aligned address in `p` where `len` bytes fit, all within `reach` of `near`.
fn fit(p: &Page, near: u64, reach: u64, len: u64, align: u64) -> Option<u64> {
    let at = (p.base + p.used + align - 1) & !(align - 1);
    let end = at + len;
    (end <= p.base + p.len && within(near, at, reach) && within(near, end, reach)).then_some(at)
}

/// Map a fresh page (or several, for `len` > one page) within reach of `near`.
fn new_page_near(near: u64, reach: u64, len: u64) -> Result<Page, Reason> {
    new_page_near_with(near, reach, len, || {
        maps::read_self().map_err(|e| Reason::Protect(e.raw_os_error().unwrap_or(0)))
    })
}

/// Space kept away from, on each side of a range the kernel refused as
/// already mapped: the mapping there was missing from the snapshot, and
/// may be larger than the range asked for.
const REFUSED_MARGIN: u64 = 1 << 20;

/// [`new_page_near`] with the process's mappings from `read_maps`. A
/// snapshot of the maps can miss mappings made after it was read: the
/// library's own allocator maps memory while the maps are parsed, and the
/// kernel puts a new mapping in the same gap nearest the libraries that
/// this search prefers. A range the kernel refuses (EEXIST, or a mapping
/// placed elsewhere where the flag is taken as a hint) is therefore
/// kept away from, with [`REFUSED_MARGIN`] around it, in the searches
/// that follow, whether or not a fresh snapshot shows what is there.
fn new_page_near_with(
    near: u64,
    reach: u64,
    len: u64,
    mut read_maps: impl FnMut() -> Result<std::sync::Arc<Vec<maps::Mapping>>, Reason>,
) -> Result<Page, Reason> {
    let page = page_size();
    let size = len.div_ceil(page) * page;
    let low = mmap_min_addr();
    let mut refused: Vec<maps::Mapping> = Vec::new();
    for _attempt in 0..8 {
        let map = read_maps()?;
        let found = if refused.is_empty() {
            maps::free_near(&map, near, reach, size, page, low)
        } else {
            let mut all: Vec<maps::Mapping> = map.iter().chain(&refused).cloned().collect();
            all.sort_by_key(|m| m.start);
            maps::free_near(&all, near, reach, size, page, low)
        };
        let Some(addr) = found else {
            return Err(Reason::NoMemoryInReach { near, reach });
        };
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a
        // fresh anonymous private mapping has no aliasing.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                size as usize,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        let refuse = |refused: &mut Vec<maps::Mapping>| {
            refused.push(maps::Mapping {
                start: addr.saturating_sub(REFUSED_MARGIN) & !(page - 1),
                end: addr.saturating_add(size + REFUSED_MARGIN),
                read: false,
                write: false,
                exec: false,
                path: String::new(),
            })
        };
        if p == libc::MAP_FAILED {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::EEXIST {
                refuse(&mut refused);
                maps::invalidate();
                continue;
            }
            return Err(Reason::Protect(errno));
        }
        if p as u64 == addr {
            maps::note_mapped(addr, addr + size, true, false, true);
        } else {
            maps::invalidate();
        }
        if p as u64 != addr {
            // Old kernels and qemu-user ignore MAP_FIXED_NOREPLACE and
            // treat it as a hint, which they do not take where something
            // is mapped: as refused.
            // SAFETY: unmapping the mapping we just created.
            unsafe { libc::munmap(p, size as usize) };
            refuse(&mut refused);
            continue;
        }
        return Ok(Page {
            base: addr,
            len: size,
            used: 0,
        });
    }
    Err(Reason::NoMemoryInReach { near, reach })
}

/// Copy `code` to `at` inside the page block `[base, base+len)` we mapped.
fn write_into_page(base: u64, len: u64, at: u64, code: &[u8]) -> Result<(), Reason> {
    use libc::{PROT_EXEC, PROT_READ, PROT_WRITE};
    // [base, base+len) is a mapping this module created and never unmaps.
    // Inside a batch it stays writable until the batch ends (patch::batch).
    let close = match open_writable(base, len, PROT_READ | PROT_EXEC, None) {
        Ok(close) => close,
        Err(_) => {
            protect(base, len, PROT_READ | PROT_WRITE)?;
            true
        }
    };
    debug_assert!(at >= base && at + code.len() as u64 <= base + len);
    // SAFETY: the destination lies inside our writable mapping (checked by
    // the caller's fit computation), and does not overlap `code`.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len()) };
    if close {
        protect(base, len, PROT_READ | PROT_EXEC)?;
    }
    Ok(())
}

/// Where [`place`] would put `len` bytes near `near` right now, without
/// mapping or writing anything (used by [`crate::probe`]).
pub fn would_place(near: u64, reach: u64, len: u64, align: u64) -> Option<u64> {
    let pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(at) = pages.iter().find_map(|p| fit(p, near, reach, len, align)) {
        return Some(at);
    }
    drop(pages);
    let map = maps::read_self().ok()?;
    let page = page_size();
    maps::free_near(
        &map,
        near,
        reach,
        len.div_ceil(page) * page,
        page,
        mmap_min_addr(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Host;

    /// Reads of the maps that miss a mapping (as the library's allocator
    /// makes one while the maps are parsed) at every read: the refused
    /// range is kept away from, and a page is found beside it.
    #[test]
    fn a_mapping_every_snapshot_misses_is_kept_away_from() {
        let page = page_size();
        let near = a_mapping_every_snapshot_misses_is_kept_away_from as *const () as u64;
        let low = mmap_min_addr();
        // Where the search would go, mapped behind the snapshot's back (other
        // tests' threads map memory too: a few tries).
        let (target, hidden) = (0..20)
            .find_map(|_| {
                let now = maps::read_self().unwrap();
                let target = maps::free_near(&now, near, Host::NEAR_REACH, 4 * page, page, low)?;
                // SAFETY: a fresh anonymous mapping where no mapping is.
                let hidden = unsafe {
                    libc::mmap(
                        target as *mut libc::c_void,
                        (4 * page) as usize,
                        libc::PROT_READ,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                (hidden as u64 == target).then_some((target, hidden))
            })
            .expect("the test's own mapping where the search would go");
        // Every read misses the hidden mapping, and sees what else was
        // mapped meanwhile (other tests' threads place pages near here too).
        let mut reads = 0;
        let got = new_page_near_with(near, Host::NEAR_REACH, 64, || {
            reads += 1;
            let mut m = (*maps::read_self().unwrap()).clone();
            m.retain(|x| !(x.start <= target && target < x.end));
            Ok(std::sync::Arc::new(m))
        });
        let got = got.expect("a page beside the hidden mapping");
        assert!(
            reads >= 2,
            "the refused range was tried first ({reads} reads)"
        );
        assert!(
            got.base + got.len <= target || got.base >= target + 4 * page,
            "{:#x} overlaps the hidden mapping at {target:#x}",
            got.base
        );
        assert!(within(near, got.base, Host::NEAR_REACH));
        // SAFETY: both mappings were made here and nothing uses them.
        unsafe {
            libc::munmap(got.base as *mut libc::c_void, got.len as usize);
            libc::munmap(hidden, (4 * page) as usize);
        }
    }

    /// Many pieces share one page, each aligned and within reach, and the
    /// page is read+execute (not writable) once written.
    #[test]
    fn packs_many_pieces_per_page_read_execute() {
        let near = packs_many_pieces_per_page_read_execute as *const () as u64;
        let mut placed = Vec::new();
        for i in 0..20u8 {
            let at = place::<Host>(near, 64, |_| Ok(vec![i; 40])).unwrap();
            placed.push(at);
        }
        let page = page_size();
        let first_page = placed[0] & !(page - 1);
        let same_page = placed
            .iter()
            .filter(|&&a| a & !(page - 1) == first_page)
            .count();
        assert!(
            same_page >= 10,
            "only {same_page} of 20 pieces share the first page"
        );
        for (i, &at) in placed.iter().enumerate() {
            assert_eq!(at % Host::CODE_ALIGN as u64, 0);
            assert!(within(near, at, Host::NEAR_REACH));
            // SAFETY: `place` wrote 40 bytes there and the page stays mapped.
            let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, 40) };
            assert!(bytes.iter().all(|&b| b == i as u8), "piece {i} intact");
        }
        let map = maps::read_self().unwrap();
        let m = maps::find(&map, placed[0]).unwrap();
        assert!(m.read && m.exec && !m.write, "{m:?}");
    }

    #[test]
    fn refuses_when_nothing_is_in_reach() {
        // A reach of one byte around an address inside our own code: the
        // page there is mapped, so no page fits.
        let near = refuses_when_nothing_is_in_reach as *const () as u64;
        let r = place_within::<Host>(near, 1, 16, |_| Ok(vec![0; 16]));
        assert_eq!(r, Err(Reason::NoMemoryInReach { near, reach: 1 }));
    }
}
