//! Writing a patch into live code: protection changes and the store itself.
//!
//! Owns: making the target's pages writable (read+write+execute, because
//! other threads keep running code in the same pages), the store, restoring
//! the original protection, and the instruction-cache flush.
//!
//! Guarantees about a thread that concurrently *enters* the function at its
//! first patched byte (what a caller does):
//! - patch within one aligned 8-byte word (always the case on AArch64, where
//!   the patch is one aligned 4-byte instruction): one atomic 8-byte store;
//!   the thread sees either the old or the new bytes.
//! - x86-64, patch within one aligned 16-byte block: one `lock cmpxchg16b`;
//!   same guarantee.
//! - otherwise (x86-64 patches crossing a 16-byte boundary; AArch64 far
//!   patches of 4 or 5 instructions): the architecture's branch-to-itself
//!   (`Arch::SELF_LOOP`: x86-64 `jmp .`, AArch64 `b .`) is stored
//!   atomically over the first bytes, then the tail is written, then the
//!   real first bytes are stored atomically, with an instruction-cache
//!   flush after each step; a thread entering meanwhile spins until the
//!   patch is complete. On AArch64 the first instruction is 4-aligned, so
//!   `b .` and the real first instruction always fit one aligned 8-byte
//!   word. If even the self-loop cannot be stored atomically (x86-64: its
//!   2 bytes straddle a 16-byte boundary) or the architecture has none,
//!   the tail is written first and the head (up to the next 8-byte
//!   boundary, one store) last, and a thread entering during the write may
//!   execute a mix.
//!
//! AArch64 caveat (near `b` and far patch alike): a 4-aligned instruction
//! store is single-copy atomic, so a fetch sees the old or the new word,
//! never a torn one; but the ARM ARM promises which of the two a concurrent
//! thread executes only when both are among B, BL, BRK, HVC, ISB, NOP, SMC,
//! SVC. Replacing an arbitrary first instruction by `b` (and `b .` by
//! `ldr x16`) is outside that list, as it is for every user-space hooking
//! library; it relies on real cores fetching either word.
//!
//! A thread that is *already inside* the taken bytes (between their first
//! and last instruction) when the patch lands is not protected by any of
//! these; install hooks before such threads exist or accept that window.
//!
//! Inside [`batch`] (a series of installations at start-up), the whole
//! code mapping that holds a written page is made writable at its first
//! write and stays read+write+execute until the batch ends, when it gets
//! its original protection back: each hook otherwise costs two
//! `mprotect`s of the target's page and two of the trampoline page, each
//! splitting and merging mappings and flushing the TLB (126 calls in a
//! profiled `/bin/true`, a tenth of its start-up; 37 with one range per
//! written page, 7 with one per mapping).
//!
//! Must never: write outside `[at, at+len)` (neighbouring bytes in a merged
//! word are written back with the values just read, under the install lock);
//! leave a page writable after the batch that opened it, or keep one open
//! that could only be made read+write (code in it would stop running).

use crate::arch::Arch;
use crate::error::Reason;
use crate::maps;
use std::sync::atomic::{AtomicU64, Ordering};

/// Write `bytes` at `at` in live code with the guarantees in the module docs,
/// flushing the instruction cache (`A::flush_icache`) after each step.
pub fn write_code<A: Arch>(at: u64, bytes: &[u8]) -> Result<(), Reason> {
    let io = |e: std::io::Error| Reason::Protect(e.raw_os_error().unwrap_or(0));
    let mut map = maps::read_self().map_err(io)?;
    let page = crate::nearmem::page_size();
    let first = at & !(page - 1);
    let last = (at + bytes.len() as u64 - 1) & !(page - 1);
    // Remember each page's protection to restore it afterwards, and the
    // mapping it lies in.
    let mut pages = Vec::new();
    let mut p = first;
    while p <= last {
        if maps::find(&map, p).is_none() {
            map = maps::read_self_fresh().map_err(io)?;
        }
        let m = maps::find(&map, p).ok_or(Reason::NotMapped { addr: p })?;
        let prot = (if m.read { libc::PROT_READ } else { 0 })
            | (if m.write { libc::PROT_WRITE } else { 0 })
            | (if m.exec { libc::PROT_EXEC } else { 0 });
        pages.push((p, prot, (m.start, m.end - m.start)));
        p += page;
    }
    let mut closing = Vec::new();
    for &(p, prot, mapping) in &pages {
        if open_writable(p, page, prot, Some(mapping))? {
            closing.push((p, prot));
        }
    }
    // SAFETY: every byte of [at, at+len) is in a page made writable above;
    // the caller holds the install lock, so no one else patches these words.
    unsafe { store(at, bytes, A::SELF_LOOP, A::flush_icache) };
    for &(p, prot) in &closing {
        protect(p, page, prot)?;
    }
    Ok(())
}

/// Pages a [`batch`] keeps read+write+execute: (start, length, protection
/// to restore), and how many batches are running.
struct Open {
    depth: u32,
    pages: Vec<(u64, u64, i32)>,
}

static OPEN: std::sync::Mutex<Open> = std::sync::Mutex::new(Open {
    depth: 0,
    pages: Vec::new(),
});

/// Makes `[p, p+len)` read+write+execute for a write. Returns whether the
/// caller must put `restore` back after its write (false: a batch keeps
/// the range open and restores it when it ends). Inside a batch, the whole
/// of `mapping` (start, length: the mapping of protection `restore` that
/// holds the range) is opened at once when given: the hooks of a library
/// land on a dozen or more of its pages, and opening each split the
/// mapping in three and merged it back at the end, two `mprotect`s per
/// page (a tenth of the kernel time of a profiled `/bin/true`).
pub(crate) fn open_writable(
    p: u64,
    len: u64,
    restore: i32,
    mapping: Option<(u64, u64)>,
) -> Result<bool, Reason> {
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if open
        .pages
        .iter()
        .any(|&(q, qlen, _)| q <= p && p + len <= q + qlen)
    {
        return Ok(false);
    }
    const RWX: i32 = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    if open.depth == 0 {
        protect(p, len, RWX)?;
        return Ok(true);
    }
    let whole = mapping.filter(|&(start, mlen)| start <= p && p + len <= start + mlen);
    let (p, len) = match whole {
        Some(m) if protect(m.0, m.1, RWX).is_ok() => m,
        _ => {
            protect(p, len, RWX)?;
            (p, len)
        }
    };
    open.pages.push((p, len, restore));
    Ok(false)
}

/// Runs `f` (a series of installations) with the pages it writes kept
/// writable until it returns (see the module docs); their protections are
/// restored whatever `f` did.
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    OPEN.lock().unwrap_or_else(|e| e.into_inner()).depth += 1;
    let r = f();
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.depth -= 1;
    if open.depth == 0 {
        let mut pages = core::mem::take(&mut open.pages);
        pages.sort_unstable();
        // Neighbours with the same protection are restored in one call.
        let mut runs: Vec<(u64, u64, i32)> = Vec::with_capacity(pages.len());
        for (p, len, prot) in pages {
            match runs.last_mut() {
                Some((q, qlen, qprot)) if *q + *qlen == p && *qprot == prot => *qlen += len,
                _ => runs.push((p, len, prot)),
            }
        }
        for (p, len, prot) in runs {
            // A failure leaves the range writable and executable, as an
            // unbatched write that failed to restore it would.
            let _ = protect(p, len, prot);
        }
    }
    r
}

/// `mprotect` of `[p, p+len)` (`p` page-aligned, part of an existing mapping).
pub(crate) fn protect(p: u64, len: u64, prot: i32) -> Result<(), Reason> {
    // SAFETY: p is page-aligned and part of an existing mapping (checked via maps).
    if unsafe { libc::mprotect(p as *mut libc::c_void, len as usize, prot) } != 0 {
        return Err(Reason::Protect(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    Ok(())
}

/// Merge `bytes` into the aligned 8-byte word containing them and store it atomically.
///
/// # Safety
/// `[at, at+len)` must lie in one aligned 8-byte word of writable memory.
unsafe fn store8(at: u64, bytes: &[u8]) {
    let base = at & !7;
    let off = (at - base) as usize;
    // SAFETY: base is 8-aligned and the word is writable (caller).
    let word = unsafe { &*(base as *const AtomicU64) };
    let mut b = word.load(Ordering::Relaxed).to_le_bytes();
    b[off..off + bytes.len()].copy_from_slice(bytes);
    word.store(u64::from_le_bytes(b), Ordering::SeqCst);
}

/// Merge `bytes` into the aligned 16-byte block containing them and store it
/// atomically with `lock cmpxchg16b`.
///
/// # Safety
/// `[at, at+len)` must lie in one aligned 16-byte block of writable memory.
#[cfg(target_arch = "x86_64")]
unsafe fn store16(at: u64, bytes: &[u8]) {
    let base = at & !15;
    let off = (at - base) as usize;
    loop {
        // SAFETY: 16 readable bytes at a 16-aligned address (caller).
        let old: [u8; 16] = unsafe { std::ptr::read_volatile(base as *const [u8; 16]) };
        let mut new = old;
        new[off..off + bytes.len()].copy_from_slice(bytes);
        let (old_lo, old_hi) = (
            u64::from_le_bytes(old[..8].try_into().unwrap()),
            u64::from_le_bytes(old[8..].try_into().unwrap()),
        );
        let (new_lo, new_hi) = (
            u64::from_le_bytes(new[..8].try_into().unwrap()),
            u64::from_le_bytes(new[8..].try_into().unwrap()),
        );
        let ok: u8;
        // SAFETY: cmpxchg16b on a 16-aligned writable address; rbx is
        // saved/restored around the instruction because LLVM reserves it.
        // The address is pinned to rdi: with `in(reg)` LLVM may pick rbx
        // itself, which the first xchg would replace by new_lo.
        unsafe {
            std::arch::asm!(
                "xchg {tmp}, rbx",
                "lock cmpxchg16b xmmword ptr [rdi]",
                "sete {ok}",
                "xchg {tmp}, rbx",
                in("rdi") base,
                tmp = inout(reg) new_lo => _,
                ok = out(reg_byte) ok,
                inout("rax") old_lo => _,
                inout("rdx") old_hi => _,
                in("rcx") new_hi,
                options(nostack),
            );
        }
        if ok != 0 {
            return;
        }
    }
}

/// Store `b` (at most 16 bytes) at `at` atomically if it lies in one
/// aligned 8-byte word (or, on x86-64, one aligned 16-byte block).
/// Returns false, writing nothing, when it does not.
///
/// # Safety
/// `[at, at+len)` must be writable and not concurrently written by others.
unsafe fn store_atomic(at: u64, b: &[u8]) -> bool {
    let len = b.len() as u64;
    if (at & 7) + len <= 8 {
        // SAFETY: fits in one aligned word (checked); writable (caller).
        unsafe { store8(at, b) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if (at & 15) + len <= 16 {
        // SAFETY: fits in one aligned 16-byte block (checked); writable (caller).
        unsafe { store16(at, b) };
        return true;
    }
    false
}

/// Store `bytes` at `at` as atomically as the layout allows (module docs):
/// one atomic store; else `spin` (the architecture's branch-to-itself)
/// atomically over the head, the tail, then the real head atomically; else
/// tail first, head last. `flush` runs after each step.
///
/// # Safety
/// `[at, at+len)` must be writable and not concurrently written by others.
unsafe fn store(at: u64, bytes: &[u8], spin: &[u8], flush: fn(u64, usize)) {
    // SAFETY (whole body): writable, no concurrent writers (caller).
    unsafe {
        if store_atomic(at, bytes) {
            return flush(at, bytes.len());
        }
        let k = spin.len();
        if k > 0 && k < bytes.len() && store_atomic(at, spin) {
            flush(at, k);
            write_plain(at + k as u64, &bytes[k..]);
            flush(at + k as u64, bytes.len() - k);
            store_atomic(at, &bytes[..k]);
            return flush(at, k);
        }
        // Last resort: tail first, head last (the head as large as one
        // aligned word allows, so at least its first byte is one store).
        let head = ((8 - (at & 7)) as usize).min(bytes.len());
        write_plain(at + head as u64, &bytes[head..]);
        flush(at + head as u64, bytes.len() - head);
        store_atomic(at, &bytes[..head]);
        flush(at, head);
    }
}

/// # Safety
/// `[at, at+len)` must be writable.
unsafe fn write_plain(at: u64, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        // SAFETY: in range (caller); volatile so the order is kept.
        unsafe { std::ptr::write_volatile((at + i as u64) as *mut u8, *b) };
    }
    std::sync::atomic::fence(Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Every layout path writes exactly the requested bytes and nothing else.
    #[test]
    fn store_writes_exactly_the_bytes() {
        #[repr(align(64))]
        struct Buf([u8; 64]);
        for off in 0..40u64 {
            for len in 1..=14usize {
                let mut b = Buf([0xcc; 64]);
                let base = b.0.as_mut_ptr() as u64;
                let new: Vec<u8> = (0..len as u8).map(|i| i + 1).collect();
                // SAFETY: writing inside our own buffer.
                unsafe { store(base + off, &new, &[0xeb, 0xfe], |_, _| {}) };
                for (i, &x) in b.0.iter().enumerate() {
                    let i = i as u64;
                    let want = if i >= off && i < off + len as u64 {
                        new[(i - off) as usize]
                    } else {
                        0xcc
                    };
                    assert_eq!(x, want, "off {off} len {len} byte {i}");
                }
            }
        }
    }

    /// 64-byte buffer aligned like a cache line, so offsets decide the layout.
    #[repr(align(64))]
    struct Buf([u8; 64]);

    /// One recorded store step: flushed address, length, whole buffer after.
    type Step = (u64, usize, Vec<u8>);

    thread_local! {
        /// Base of the buffer under test and the steps recorded so far.
        static STEPS: RefCell<(u64, Vec<Step>)> = const { RefCell::new((0, Vec::new())) };
    }

    /// The flush seam: records the whole buffer after each store step.
    fn record(at: u64, len: usize) {
        STEPS.with(|s| {
            let mut s = s.borrow_mut();
            // SAFETY: s.0 is the base of the live 64-byte test buffer.
            let now = unsafe { std::slice::from_raw_parts(s.0 as *const u8, 64) }.to_vec();
            s.1.push((at, len, now));
        });
    }

    /// Run `store` with AArch64's `SELF_LOOP` at `off` over a buffer of
    /// distinct old bytes; returns the old buffer and the recorded steps.
    fn aarch64_steps(off: u64, new: &[u8]) -> (Vec<u8>, Vec<Step>) {
        use crate::aarch64::Aarch64;
        let mut b = Buf([0; 64]);
        for (i, x) in b.0.iter_mut().enumerate() {
            *x = 0x40 + i as u8;
        }
        let old = b.0.to_vec();
        let base = b.0.as_mut_ptr() as u64;
        STEPS.with(|s| *s.borrow_mut() = (base, Vec::new()));
        // SAFETY: writing inside our own buffer.
        unsafe { store(base + off, new, Aarch64::SELF_LOOP, record) };
        let steps = STEPS.with(|s| std::mem::take(&mut s.borrow_mut().1));
        let steps = steps
            .into_iter()
            .map(|(at, len, now)| (at - base, len, now))
            .collect();
        (old, steps)
    }

    /// `old` with `bytes` at `off`.
    fn with(old: &[u8], off: u64, bytes: &[u8]) -> Vec<u8> {
        let mut v = old.to_vec();
        v[off as usize..off as usize + bytes.len()].copy_from_slice(bytes);
        v
    }

    #[test]
    fn aarch64_self_loop_is_b_to_itself() {
        use crate::aarch64::Aarch64;
        assert_eq!(Aarch64::SELF_LOOP, [0x00, 0x00, 0x00, 0x14]);
        let at = 0x40_1234;
        assert_eq!(Aarch64::near_patch(at, at).unwrap(), Aarch64::SELF_LOOP);
    }

    /// AArch64 far patch: `b .` over the first instruction (one store),
    /// then the rest, then the real first instruction (one store), a flush
    /// after each; the first instruction is never torn.
    #[test]
    fn aarch64_far_patch_spins_while_the_tail_is_written() {
        use crate::aarch64::Aarch64;
        for off in (0x10..=0x2c).step_by(4) {
            let new = Aarch64::far_patch(0x7f00_0000_0000 + off, 0x1234_5678_9abc_def0);
            let len = new.len();
            assert_eq!(len, if off % 8 == 0 { 16 } else { 20 });
            let (old, steps) = aarch64_steps(off, &new);
            let done = with(&old, off, &new);
            if cfg!(target_arch = "x86_64") && (off & 15) + len as u64 <= 16 {
                // An x86-64 host stores one aligned 16-byte block at once.
                assert_eq!(steps, vec![(off, len, done)], "off {off:#x}");
                continue;
            }
            let spin = with(&old, off, Aarch64::SELF_LOOP);
            let spin_tail = with(&spin, off + 4, &new[4..]);
            assert_eq!(
                steps,
                vec![
                    (off, 4, spin),
                    (off + 4, len - 4, spin_tail),
                    (off, 4, done)
                ],
                "off {off:#x}"
            );
        }
    }

    /// AArch64 near patch (`b`): one store of the 4-byte word, one flush.
    #[test]
    fn aarch64_near_patch_is_one_store() {
        use crate::aarch64::Aarch64;
        for off in (0x10..=0x2c).step_by(4) {
            let new = Aarch64::near_patch(0x40_0000 + off, 0x48_0000).unwrap();
            let (old, steps) = aarch64_steps(off, &new);
            assert_eq!(steps, vec![(off, 4, with(&old, off, &new))], "off {off:#x}");
        }
    }
}
