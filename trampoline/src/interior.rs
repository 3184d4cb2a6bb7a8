//! Entries into a function's first bytes from elsewhere in its object: a
//! branch, or a stored code pointer (a GOT slot filled by an IFUNC
//! resolver, a function table), whose target lies strictly inside the
//! bytes a hook would overwrite. The install sequence's own sweep sees
//! only the function's body (to its symbol size); code elsewhere that
//! enters a few bytes in (glibc's `__memcpy_avx512_unaligned_erms` is
//! `memmove`'s entry + 3, reached through libc's internal GOT) would land
//! in the middle of the patch.
//!
//! What is found: x86-64 `call`/`jmp`/`jcc` with a 32-bit displacement
//! anywhere in the object's executable segments (a byte scan: a false
//! match needs 4 bytes to equal a displacement into a few-byte window)
//! and any branch decoded in the 144 bytes before the function (glibc's
//! `mempcpy` ends with a short `jmp` to `memmove` + 3); AArch64 `b`/`bl`
//! (every aligned word); 8-byte-aligned words equal to an address in the
//! window in every readable segment. Not found: short branches from code
//! after the function (the install's own sweep covers the function's
//! body), computed targets, other objects' pointers.
//!
//! Owns: the scans (pure functions over bytes, tested on any host) and
//! [`interior_entry`], which runs them over the loaded object holding a
//! function.
//!
//! Must never: read outside an object's readable segments, or be called
//! from a signal handler (it allocates and calls `dl_iterate_phdr`).

use crate::image::Image;

/// Something that enters `[lo, hi)` from outside the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InteriorEntry {
    /// A direct branch at this address.
    Branch { at: u64, target: u64 },
    /// A stored code pointer at this address.
    Pointer { at: u64, target: u64 },
}

impl core::fmt::Display for InteriorEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InteriorEntry::Branch { at, target } => {
                write!(f, "a branch at {at:#x} enters it at {target:#x}")
            }
            InteriorEntry::Pointer { at, target } => {
                write!(f, "a code pointer at {at:#x} enters it at {target:#x}")
            }
        }
    }
}

/// x86-64: the first `call rel32` (E8), `jmp rel32` (E9) or `jcc rel32`
/// (0F 80-8F) in `code` (at run-time address `addr`) whose target is in
/// `[lo, hi)`.
///
/// Each form ends with its displacement: one at offset `p` targets
/// `addr + p + 4 + disp`, so a target in a small window fixes the upper
/// 16 bits of the displacement wanted at each `p` (two values at most
/// over 16 offsets). Sixteen offsets are compared on those two bytes at
/// once (SSE2, part of x86-64), and only the offsets that pass are looked
/// at whole: a scan of libc's 1.9 MB in 0.6 ms instead of 2.8 (every
/// `-fp` function is checked against its whole object). No two forms
/// share a `p`, so the first hit is the first branch.
pub fn x86_64_branch_into(code: &[u8], addr: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
    if hi <= lo {
        return None;
    }
    let width = hi - lo;
    let branch_at = |p: usize| -> Option<InteriorEntry> {
        let disp = i32::from_le_bytes([code[p], code[p + 1], code[p + 2], code[p + 3]]);
        let target = addr
            .wrapping_add(p as u64 + 4)
            .wrapping_add(disp as i64 as u64);
        if target.wrapping_sub(lo) >= width {
            return None;
        }
        let at = match code[p - 1] {
            0xe8 | 0xe9 => p - 1,
            0x80..=0x8f if p >= 2 && code[p - 2] == 0x0f => p - 2,
            _ => return None,
        };
        Some(InteriorEntry::Branch {
            at: addr + at as u64,
            target,
        })
    };
    // Offsets p with a whole displacement after an opcode byte.
    let end = code.len().saturating_sub(3);
    match by_upper_halves(code, addr, lo, width, &branch_at) {
        Ok(found) => Some(found),
        Err(rest) => (rest..end).find_map(branch_at),
    }
}

/// The offsets of [`x86_64_branch_into`] 16 at a time, on the upper half
/// of the displacement they would need (x86-64: SSE2): the branch found,
/// or the offset from which the rest is to be looked at one by one.
#[cfg(target_arch = "x86_64")]
fn by_upper_halves(
    code: &[u8],
    addr: u64,
    lo: u64,
    width: u64,
    branch_at: &dyn Fn(usize) -> Option<InteriorEntry>,
) -> Result<InteriorEntry, usize> {
    use core::arch::x86_64::*;
    let end = code.len().saturating_sub(3);
    let mut p = 1;
    if width > 1 << 12 {
        return Err(p);
    }
    // The upper 16 bits of the displacement wanted at p for target lo + k.
    let upper = |p: usize, k: u64| {
        (lo.wrapping_sub(addr.wrapping_add(p as u64 + 4))
            .wrapping_add(k)
            >> 16) as u16
    };
    while p + 16 <= end {
        // The wanted displacements over p..p+16 span 15 + width values:
        // the upper halves of the two extremes cover them.
        let (a, b) = (upper(p + 15, 0), upper(p, width - 1));
        // SAFETY: SSE2 is part of x86-64; code[p + 2..p + 19] is in
        // bounds (p + 16 <= end = len - 3).
        let mut mask = unsafe {
            let v2 = _mm_loadu_si128(code.as_ptr().add(p + 2) as *const __m128i);
            let v3 = _mm_loadu_si128(code.as_ptr().add(p + 3) as *const __m128i);
            let is =
                |v, x: u16, shift: u32| _mm_cmpeq_epi8(v, _mm_set1_epi8((x >> shift) as u8 as i8));
            let ma = _mm_and_si128(is(v3, a, 8), is(v2, a, 0));
            let mb = _mm_and_si128(is(v3, b, 8), is(v2, b, 0));
            _mm_movemask_epi8(_mm_or_si128(ma, mb)) as u32
        };
        while mask != 0 {
            if let Some(e) = branch_at(p + mask.trailing_zeros() as usize) {
                return Ok(e);
            }
            mask &= mask - 1;
        }
        p += 16;
    }
    Err(p)
}

/// Elsewhere every offset is looked at one by one.
#[cfg(not(target_arch = "x86_64"))]
fn by_upper_halves(
    _: &[u8],
    _: u64,
    _: u64,
    _: u64,
    _: &dyn Fn(usize) -> Option<InteriorEntry>,
) -> Result<InteriorEntry, usize> {
    Err(1)
}

/// x86-64: a short or near branch decoded in the `before` bytes that end
/// at `end` (the function's start: the code placed just before it, where
/// an 8-bit branch can come from) whose target is in `[lo, hi)`. The bytes
/// are decoded from each of the first 16 offsets; a decoding that reaches
/// `end` exactly (x86 decoding falls into step within a few instructions)
/// is taken as the code there.
///
/// Decoding builds iced-x86's tables (359 KiB, 0.45 ms in a process that
/// has its hooks' plans): it is done only where some bytes could be such
/// a branch ([`may_branch_before`]), before 3% of libc's functions.
pub fn x86_64_branch_before(before: &[u8], end: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
    if !may_branch_before(before, end, lo, hi) {
        return None;
    }
    decoded_branch_before(before, end, lo, hi)
}

/// Whether bytes of `before` (ending at `end`) look like a branch into
/// `[lo, hi)` at some offset, whatever the instructions' boundaries: an
/// opcode of a near branch (`jmp`/`jcc`/`loop`/`jrcxz` rel8, `call`/`jmp`
/// rel32, `jcc` rel32) followed by a displacement, the last bytes of its
/// instruction (prefixes come before the opcode, and iced-x86 decodes
/// 64-bit branches with an operand-size prefix as these), that reaches
/// the window. Every branch the decoding can find is one of these.
fn may_branch_before(before: &[u8], end: u64, lo: u64, hi: u64) -> bool {
    let start = end.wrapping_sub(before.len() as u64);
    let inside = |next: usize, disp: i64| {
        let t = start.wrapping_add(next as u64).wrapping_add(disp as u64);
        lo <= t && t < hi
    };
    (1..before.len()).any(|q| {
        let op = before[q - 1];
        let rel8 =
            matches!(op, 0xeb | 0x70..=0x7f | 0xe0..=0xe3) && inside(q + 1, before[q] as i8 as i64);
        let rel32 = q + 4 <= before.len()
            && (matches!(op, 0xe8 | 0xe9)
                || (q >= 2 && before[q - 2] == 0x0f && (0x80..=0x8f).contains(&op)))
            && inside(
                q + 4,
                i32::from_le_bytes([before[q], before[q + 1], before[q + 2], before[q + 3]]) as i64,
            );
        rel8 || rel32
    })
}

/// [`x86_64_branch_before`] by decoding.
fn decoded_branch_before(before: &[u8], end: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    crate::x86_64::tables_built();
    let start = end - before.len() as u64;
    for s in 0..before.len().min(16) {
        let mut d = Decoder::with_ip(64, &before[s..], start + s as u64, DecoderOptions::NONE);
        let mut found = None;
        while d.can_decode() {
            let ins = d.decode();
            if ins.is_invalid() {
                break;
            }
            if matches!(
                ins.flow_control(),
                FlowControl::UnconditionalBranch
                    | FlowControl::ConditionalBranch
                    | FlowControl::Call
            ) {
                let target = ins.near_branch_target();
                if found.is_none() && lo <= target && target < hi {
                    found = Some(InteriorEntry::Branch {
                        at: ins.ip(),
                        target,
                    });
                }
            }
        }
        if d.ip() == end && found.is_some() {
            return found;
        }
    }
    None
}

/// AArch64: the first `b`/`bl` (aligned words) in `code` whose target is
/// in `[lo, hi)`.
pub fn aarch64_branch_into(code: &[u8], addr: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
    let skew = ((4 - (addr & 3)) & 3) as usize;
    for (k, w) in code.get(skew..)?.chunks_exact(4).enumerate() {
        let insn = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        if insn & 0x7c00_0000 != 0x1400_0000 {
            continue;
        }
        let at = addr + (skew + 4 * k) as u64;
        let imm = ((insn << 6) as i32 >> 6) as i64 * 4;
        let target = at.wrapping_add(imm as u64);
        if lo <= target && target < hi {
            return Some(InteriorEntry::Branch { at, target });
        }
    }
    None
}

/// The first 8-byte-aligned little-endian word of `data` (at run-time
/// address `addr`) that is an address in `[lo, hi)`.
///
/// A word in a small window has the upper 48 bits of `lo` or of `hi - 1`:
/// on x86-64 eight words are compared on those at a time (SSE2) and only
/// the ones that match are looked at whole (the data of an object is
/// mostly other words, its pointers mostly elsewhere).
pub fn pointer_into(data: &[u8], addr: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
    if hi <= lo {
        return None;
    }
    let skew = ((8 - (addr & 7)) & 7) as usize;
    let words = data.get(skew..)?;
    let word_at = |k: usize| -> Option<InteriorEntry> {
        let v = u64::from_le_bytes(words[8 * k..8 * k + 8].try_into().ok()?);
        (lo <= v && v < hi).then(|| InteriorEntry::Pointer {
            at: addr + (skew + 8 * k) as u64,
            target: v,
        })
    };
    match words_by_upper_bits(words, lo, hi, &word_at) {
        Ok(found) => Some(found),
        Err(rest) => (rest..words.len() / 8).find_map(word_at),
    }
}

/// The words of [`pointer_into`] eight at a time on their upper 48 bits
/// (x86-64: SSE2): the pointer found, or the word from which the rest is
/// to be looked at one by one.
#[cfg(target_arch = "x86_64")]
fn words_by_upper_bits(
    words: &[u8],
    lo: u64,
    hi: u64,
    word_at: &dyn Fn(usize) -> Option<InteriorEntry>,
) -> Result<InteriorEntry, usize> {
    use core::arch::x86_64::*;
    let n = words.len() / 8;
    let mut k = 0;
    if hi - lo > 1 << 12 {
        return Err(k);
    }
    // SAFETY: SSE2 is part of x86-64; every load reads words[8k..8k+64],
    // in bounds while k + 8 <= n.
    unsafe {
        // Per word: its low half's upper 16 bits, its high half whole.
        let keep = _mm_set_epi32(-1, 0xffff_0000u32 as i32, -1, 0xffff_0000u32 as i32);
        let wanted = |v: u64| {
            let (low, high) = ((v as u32 & 0xffff_0000) as i32, (v >> 32) as i32);
            _mm_set_epi32(high, low, high, low)
        };
        let (a, b) = (wanted(lo), wanted(hi - 1));
        // Both halves of a word equal to one of a, b: 0xff in its byte lane
        // of the mask (a false match, mixing halves of a and b, is looked
        // at whole and refused).
        let eq = |j: usize| {
            let v = _mm_and_si128(
                _mm_loadu_si128(words.as_ptr().add(8 * j) as *const __m128i),
                keep,
            );
            _mm_or_si128(_mm_cmpeq_epi32(v, a), _mm_cmpeq_epi32(v, b))
        };
        while k + 8 <= n {
            let e = [eq(k), eq(k + 2), eq(k + 4), eq(k + 6)];
            let any = _mm_or_si128(_mm_or_si128(e[0], e[1]), _mm_or_si128(e[2], e[3]));
            if _mm_movemask_epi8(any) != 0 {
                for (i, e) in e.iter().enumerate() {
                    let m = _mm_movemask_epi8(*e) as u32;
                    for half in 0..2 {
                        if (m >> (8 * half)) & 0xff == 0xff {
                            if let Some(found) = word_at(k + 2 * i + half) {
                                return Ok(found);
                            }
                        }
                    }
                }
            }
            k += 8;
        }
    }
    Err(k)
}

/// Elsewhere every word is looked at one by one.
#[cfg(not(target_arch = "x86_64"))]
fn words_by_upper_bits(
    _: &[u8],
    _: u64,
    _: u64,
    _: &dyn Fn(usize) -> Option<InteriorEntry>,
) -> Result<InteriorEntry, usize> {
    Err(0)
}

/// Bytes before a function searched for short branches (an 8-bit
/// displacement reaches 128 bytes back, plus the branch itself).
const BEFORE: usize = 144;

/// Bytes of an object's file read at a time ([`scan_file`]).
const CHUNK: usize = 64 << 10;
/// Bytes a chunk shares with the next: the longest pattern searched (an
/// 8-byte word), so that none is cut in two.
const OVERLAP: usize = 8;

/// The first branch or code pointer into `[lo, hi)` in `bytes` (at
/// run-time address `at`), of an executable segment (`exec`) or another.
fn scan(bytes: &[u8], at: u64, exec: bool, lo: u64, hi: u64) -> Option<InteriorEntry> {
    let branch = if !exec {
        None
    } else if cfg!(target_arch = "aarch64") {
        aarch64_branch_into(bytes, at, lo, hi)
    } else {
        x86_64_branch_into(bytes, at, lo, hi)
    };
    branch.or_else(|| pointer_into(bytes, at, lo, hi))
}

/// What tells whether an object's file is the object loaded, copied
/// from it under the loader's lock: its path, program headers and notes.
struct LoadedFacts {
    path: std::path::PathBuf,
    identity: crate::image::LoadedIdentity,
}

impl LoadedFacts {
    /// The facts of `img`, when its file may be read in its place: a GNU
    /// build-id among its notes (without one, a file rebuilt in place
    /// could keep the program headers and differ in code) and no text
    /// relocations (its read-only segments are then the file's bytes).
    fn of(info: &libc::dl_phdr_info, img: &Image) -> Option<LoadedFacts> {
        let identity = img.identity();
        if !identity.has_build_id() || crate::image::text_relocated(img.bias, img.phdrs()) {
            return None;
        }
        let name = crate::image::object_name(info);
        let path = if name.is_empty() {
            "/proc/self/exe".into()
        } else {
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name).into()
        };
        Some(LoadedFacts { path, identity })
    }

    /// The object's file, when it holds the same program headers and notes.
    fn open(&self) -> Option<std::fs::File> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(&self.path).ok()?;
        let mut eh = [0u8; 64];
        file.read_exact_at(&mut eh, 0).ok()?;
        if eh[..4] != *b"\x7fELF" {
            return None;
        }
        let phoff = u64::from_le_bytes(eh[32..40].try_into().ok()?);
        let same = self.identity.file_matches(phoff, |off, want| {
            let mut b = vec![0u8; want.len()];
            file.read_exact_at(&mut b, off).map(|()| b == want)
        });
        same.ok()?.then_some(file)
    }
}

/// [`scan`] over `len` bytes of `file` from offset `off` (loaded at
/// `at`), a chunk at a time; Err when the file cannot be read.
fn scan_file(
    file: &std::fs::File,
    (off, len, at): (u64, usize, u64),
    exec: bool,
    lo: u64,
    hi: u64,
    buf: &mut Vec<u8>,
) -> Result<Option<InteriorEntry>, ()> {
    use std::os::unix::fs::FileExt;
    // Sized for the segment, up to a chunk, and kept for the next one:
    // a fresh chunk per segment cost more page faults than the scan (a
    // small library loaded and hooked in a loop).
    let want = len.min(CHUNK + OVERLAP);
    if buf.len() < want {
        buf.resize(want, 0);
    }
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK + OVERLAP);
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, off + done as u64)
            .map_err(|_| ())?;
        if let Some(e) = scan(chunk, at + done as u64, exec, lo, hi) {
            return Ok(Some(e));
        }
        if n < CHUNK + OVERLAP {
            break;
        }
        done += CHUNK;
    }
    Ok(None)
}

/// A read-only segment left to read from the object's file: (file
/// offset, bytes in the file, run-time address, executable).
type FileSegment = (u64, usize, u64, bool);

/// Whether code or data of the loaded object holding `addr` enters
/// `[lo, hi)` (the bytes after a patch's first one) from outside the
/// function: the first such entry found.
///
/// The segments the program never writes are read from the object's file
/// when it is the one loaded ([`LoadedFacts`]), not through the mapping:
/// reading the mapping made every page of the object resident in the
/// program (`-fp` of one function of libLLVM: its peak resident set 49 ->
/// 165 MB). They are read after `dl_iterate_phdr` returns: its callback
/// holds the loader's lock, which the program's other threads take to
/// load or look up a library (and to unwind an exception, with a libgcc
/// older than glibc's `_dl_find_object`; scanning libLLVM held it 42-57 ms
/// a function). The writable segments, and every segment
/// of an object whose file is not the loaded one, are read in memory,
/// inside the callback.
pub fn interior_entry(addr: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
    let (found, facts, from_file) = in_object(addr as usize, |info, img| {
        if let Some(near) = branch_before(img, addr as usize, lo, hi) {
            return (Some(near), None, Vec::new());
        }
        let facts = LoadedFacts::of(info, img);
        let mut from_file: Vec<FileSegment> = Vec::new();
        for ph in readable_loads(img) {
            if facts.is_some() && ph.p_flags & libc::PF_W == 0 {
                // Beyond p_filesz a read-only segment is zeros: nothing to find.
                let exec = ph.p_flags & libc::PF_X != 0;
                from_file.push((ph.p_offset, ph.p_filesz as usize, start_of(img, ph), exec));
                continue;
            }
            let found = scan_in_memory(img, ph, lo, hi);
            if found.is_some() {
                return (found, None, Vec::new());
            }
        }
        (None, facts, from_file)
    })?;
    if found.is_some() || from_file.is_empty() {
        return found;
    }
    // Outside the loader's lock: the read-only segments from the file.
    let file = facts.and_then(|f| f.open());
    let mut buf = Vec::new();
    let mut unread = Vec::new();
    for &(off, len, at, exec) in &from_file {
        match file
            .as_ref()
            .map(|file| scan_file(file, (off, len, at), exec, lo, hi, &mut buf))
        {
            Some(Ok(Some(found))) => return Some(found),
            Some(Ok(None)) => {}
            _ => unread.push(at),
        }
    }
    if unread.is_empty() {
        return None;
    }
    // The file could not be read, or is not the loaded object: those
    // segments in memory, as for an object without a build-id.
    in_object(addr as usize, |_, img| {
        readable_loads(img)
            .filter(|ph| unread.contains(&start_of(img, ph)))
            .find_map(|ph| scan_in_memory(img, ph, lo, hi))
    })
    .flatten()
}

/// The run-time address of the segment `ph` of `img`.
fn start_of(img: &Image, ph: &libc::Elf64_Phdr) -> u64 {
    img.bias.wrapping_add(ph.p_vaddr as usize) as u64
}

/// [`scan`] over the loaded segment `ph` of `img`, read in memory.
fn scan_in_memory(img: &Image, ph: &libc::Elf64_Phdr, lo: u64, hi: u64) -> Option<InteriorEntry> {
    let at = start_of(img, ph);
    let exec = ph.p_flags & libc::PF_X != 0;
    img.bytes(at as usize, ph.p_memsz as usize)
        .and_then(|bytes| scan(bytes, at, exec, lo, hi))
}

/// x86-64: a short branch in the bytes just before the function at
/// `addr` into `[lo, hi)`.
fn branch_before(img: &Image, addr: usize, lo: u64, hi: u64) -> Option<InteriorEntry> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    img.load_segments()
        .iter()
        .find(|&&(start, end, exec)| exec && start <= addr && addr <= end)
        .and_then(|&(start, _, _)| {
            let from = addr.saturating_sub(BEFORE).max(start);
            img.bytes(from, addr - from)
        })
        .and_then(|b| x86_64_branch_before(b, addr as u64, lo, hi))
}

/// The readable, non-empty PT_LOAD program headers of `img`.
fn readable_loads(img: &Image) -> impl Iterator<Item = &libc::Elf64_Phdr> {
    img.phdrs()
        .iter()
        .filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_R != 0 && ph.p_memsz > 0)
}

/// `f` over the loaded object holding `addr`, inside `dl_iterate_phdr`
/// (the loader's lock held); None when no object holds it.
fn in_object<R>(addr: usize, f: impl FnOnce(&libc::dl_phdr_info, &Image) -> R) -> Option<R> {
    let mut f = Some(f);
    crate::image::first_object(|info| {
        // SAFETY: a loaded object, read only inside first_object's callback.
        let img = unsafe { Image::of(info) };
        img.load_segments()
            .iter()
            .any(|&(lo, hi, _)| lo <= addr && addr < hi)
            .then(|| f.take().map(|f| f(info, &img)))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan as first written, one offset at a time: the reference.
    fn branch_into_by_bytes(code: &[u8], addr: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
        for i in 0..code.len() {
            let len = match code[i] {
                0xe8 | 0xe9 if i + 5 <= code.len() => 5,
                0x0f if i + 6 <= code.len() && (0x80..=0x8f).contains(&code[i + 1]) => 6,
                _ => continue,
            };
            let d = i32::from_le_bytes(code[i + len - 4..i + len].try_into().unwrap());
            let target = addr
                .wrapping_add((i + len) as u64)
                .wrapping_add(d as i64 as u64);
            if lo <= target && target < hi {
                return Some(InteriorEntry::Branch {
                    at: addr + i as u64,
                    target,
                });
            }
        }
        None
    }

    #[test]
    fn the_fast_rel32_scan_finds_what_a_byte_by_byte_one_finds() {
        // Pseudo-random bytes, with branches planted into windows before,
        // inside and after the code, near and far (a displacement's upper
        // half changing inside a block of 16), and at every alignment.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut code: Vec<u8> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Zeros and 0xff as often as in code.
                match x % 7 {
                    0 => 0,
                    1 => 0xff,
                    _ => (x >> 24) as u8,
                }
            })
            .collect();
        let addr = 0x7f12_3456_0000u64;
        let windows = [
            (addr - 0x7fff_0005, 13),
            (addr - 70_000, 5),
            (addr + 65_530, 9),
            (addr + 100_003, 4),
            (addr + 199_990, 14),
            (addr + 0x7000_0000, 1),
        ];
        for (n, &(lo, w)) in windows.iter().enumerate() {
            for (k, form) in [&[0xe8u8][..], &[0xe9], &[0x0f, 0x84]].iter().enumerate() {
                let at = 1_000 + n * 30_011 + k * 7_919 + n;
                let end = addr + (at + form.len() + 4) as u64;
                let disp = (lo + (k as u64 % w)).wrapping_sub(end) as i64 as i32;
                code[at..at + form.len()].copy_from_slice(form);
                code[at + form.len()..at + form.len() + 4].copy_from_slice(&disp.to_le_bytes());
            }
        }
        for &(lo, w) in &windows {
            for (lo, hi) in [
                (lo, lo + w),
                (lo + 1, lo + w),
                (lo - 20, lo + 3),
                (lo, lo + 4096),
            ] {
                let want = branch_into_by_bytes(&code, addr, lo, hi);
                assert!(
                    want.is_some() || hi <= lo + 1,
                    "a planted branch into [{lo:#x}, {hi:#x})"
                );
                assert_eq!(
                    x86_64_branch_into(&code, addr, lo, hi),
                    want,
                    "[{lo:#x}, {hi:#x})"
                );
                for cut in [0, 1, 5, 17] {
                    assert_eq!(
                        x86_64_branch_into(&code[cut..], addr + cut as u64, lo, hi),
                        branch_into_by_bytes(&code[cut..], addr + cut as u64, lo, hi)
                    );
                }
            }
        }
        assert_eq!(x86_64_branch_into(&code, addr, addr + 5, addr + 5), None);
        // Displacements whose upper half changes among the 16 offsets
        // compared together (just below and at 0x1_0000): each found.
        for j in 0..24u64 {
            let at = 150_000 + 97 * j as usize;
            let disp = (0x1_0000 + j as i32) - 12;
            code[at] = 0xe8;
            code[at + 1..at + 5].copy_from_slice(&disp.to_le_bytes());
            let target = (addr + at as u64 + 5).wrapping_add(disp as i64 as u64);
            let want = branch_into_by_bytes(&code, addr, target, target + 4);
            assert!(want.is_some());
            assert_eq!(x86_64_branch_into(&code, addr, target, target + 4), want);
        }
    }

    #[test]
    fn x86_64_rel32_branches_into_the_window_are_found() {
        // At 0x1000: nop; call 0x2003 (e8, disp = 0x2003 - 0x1006).
        let mut code = vec![0x90, 0xe8];
        code.extend_from_slice(&(0x2003i32 - 0x1006).to_le_bytes());
        assert_eq!(
            x86_64_branch_into(&code, 0x1000, 0x2001, 0x2005),
            Some(InteriorEntry::Branch {
                at: 0x1001,
                target: 0x2003
            })
        );
        // The function's start itself is not inside the window.
        assert_eq!(x86_64_branch_into(&code, 0x1000, 0x2004, 0x2008), None);
        // jne rel32 (0f 85) backwards.
        let mut code = vec![0x0f, 0x85];
        code.extend_from_slice(&(0x0ff2i32 - 0x1006).to_le_bytes());
        assert_eq!(
            x86_64_branch_into(&code, 0x1000, 0x0ff1, 0x0ff5),
            Some(InteriorEntry::Branch {
                at: 0x1000,
                target: 0x0ff2
            })
        );
        // Too short to hold a displacement.
        assert_eq!(
            x86_64_branch_into(&[0x90, 0xe9, 1, 2], 0, 0, u64::MAX),
            None
        );
    }

    #[test]
    fn bytes_that_cannot_branch_into_the_window_are_not_decoded() {
        // Code before a function at 0x10000: instructions drawn at random
        // (some of them branches anywhere) with a branch of one of the
        // forms planted among them into the function's first bytes, or
        // not: wherever the decoding finds one, the check before it lets
        // it decode (same answers with and without it).
        let end = 0x10000u64;
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let plain: [&[u8]; 6] = [
            &[0x90],
            &[0x48, 0x89, 0xf8],
            &[0x48, 0x01, 0xd0],
            &[0x55],
            &[0x48, 0x8d, 0x44, 0x24, 0x08],
            &[0x0f, 0x1f, 0x40, 0x00],
        ];
        // (opcode bytes, rel8?)
        let forms: [(&[u8], bool); 7] = [
            (&[0xeb], true),
            (&[0x75], true),
            (&[0xe3], true),
            (&[0x66, 0xeb], true),
            (&[0xe9], false),
            (&[0xe8], false),
            (&[0x0f, 0x84], false),
        ];
        let (mut found, mut decoded, mut skipped) = (0, 0, 0);
        for trial in 0..3_000 {
            let mut code: Vec<u8> = Vec::new();
            let plant_at = if trial % 3 == 0 {
                usize::MAX
            } else {
                rnd() as usize % 120
            };
            while code.len() < BEFORE - 8 {
                if code.len() >= plant_at {
                    let (op, rel8) = forms[rnd() as usize % forms.len()];
                    let len = op.len() + if rel8 { 1 } else { 4 };
                    code.extend_from_slice(op);
                    // Filled once the code's length is known (below).
                    code.extend(std::iter::repeat_n(0u8, len - op.len()));
                    break;
                }
                let i = plain[rnd() as usize % plain.len()];
                code.extend_from_slice(i);
            }
            let planted = (plant_at != usize::MAX).then_some(code.len());
            while code.len() < BEFORE {
                code.push(0xcc);
            }
            let start = end - BEFORE as u64;
            if let Some(next) = planted {
                let target = end + 1 + rnd() % 6;
                let d = target.wrapping_sub(start + next as u64) as i64;
                let rel8 = matches!(code[next - 2], 0xeb | 0x75 | 0xe3);
                if rel8 {
                    if !(-128..128).contains(&d) {
                        continue;
                    }
                    code[next - 1] = d as i8 as u8;
                } else {
                    code[next - 4..next].copy_from_slice(&(d as i32).to_le_bytes());
                }
            }
            let want = decoded_branch_before(&code, end, end + 1, end + 7);
            assert_eq!(
                x86_64_branch_before(&code, end, end + 1, end + 7),
                want,
                "{code:02x?}"
            );
            found += want.is_some() as u32;
            if may_branch_before(&code, end, end + 1, end + 7) {
                decoded += 1;
            } else {
                skipped += 1;
            }
        }
        assert!(
            found > 500 && skipped > 500,
            "{found} found, {decoded} decoded, {skipped} skipped"
        );
    }

    #[test]
    fn x86_64_short_branches_just_before_the_function_are_found() {
        // glibc's shape: mempcpy at 0x0ff0 is `mov rax, rdi; add rax, rdx;
        // jmp 0x1003` (eb xx), then padding, then memmove at 0x1000.
        let mut before = vec![0xcc; 16];
        before[..3].copy_from_slice(&[0x48, 0x89, 0xf8]);
        before[3..6].copy_from_slice(&[0x48, 0x01, 0xd0]);
        // jmp at 0x0ff6, next ip 0x0ff8: disp = 0x1003 - 0x0ff8 = 0x0b.
        before[6..8].copy_from_slice(&[0xeb, 0x0b]);
        assert_eq!(
            x86_64_branch_before(&before, 0x1000, 0x1001, 0x1007),
            Some(InteriorEntry::Branch {
                at: 0x0ff6,
                target: 0x1003
            })
        );
        // A jump to the function's start is not inside the window.
        before[7] = 0x08;
        assert_eq!(x86_64_branch_before(&before, 0x1000, 0x1001, 0x1007), None);
    }

    #[test]
    fn aarch64_b_and_bl_into_the_window_are_found() {
        // Code at 0x1002 (two bytes of skew): nop at 0x1004, then at
        // 0x1008 bl +0x10 -> 0x1018.
        let bl = 0x9400_0004u32.to_le_bytes();
        let mut code = vec![0, 0];
        code.extend_from_slice(&0xd503_201fu32.to_le_bytes()); // nop
        code.extend_from_slice(&bl);
        assert_eq!(
            aarch64_branch_into(&code, 0x1002, 0x1018, 0x101c),
            Some(InteriorEntry::Branch {
                at: 0x1008,
                target: 0x1018
            })
        );
        // b -8 (backwards).
        let b = (0x1400_0000u32 | (0x03ff_ffff & (-2i32 as u32))).to_le_bytes();
        assert_eq!(
            aarch64_branch_into(&b, 0x2000, 0x1ff8, 0x1ffc),
            Some(InteriorEntry::Branch {
                at: 0x2000,
                target: 0x1ff8
            })
        );
        assert_eq!(aarch64_branch_into(&b, 0x2000, 0x1ff9, 0x2000), None);
    }

    /// [`pointer_into`] as first written, a word at a time: the reference.
    fn pointer_into_by_words(data: &[u8], addr: u64, lo: u64, hi: u64) -> Option<InteriorEntry> {
        let skew = ((8 - (addr & 7)) & 7) as usize;
        for (k, w) in data.get(skew..)?.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            if lo <= v && v < hi {
                return Some(InteriorEntry::Pointer {
                    at: addr + (skew + 8 * k) as u64,
                    target: v,
                });
            }
        }
        None
    }

    #[test]
    fn the_fast_pointer_scan_finds_what_a_word_by_word_one_finds() {
        // Words that are mostly pointers near the window (same upper 32
        // bits), some in the window, across a 64 KiB boundary, at every
        // skew and cut.
        let base = 0x7f12_3456_0000u64;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut data = Vec::new();
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let w = match i % 5 {
                0 => x,
                1 => 0,
                _ => base + (x % 0x4_0000),
            };
            data.extend_from_slice(&w.to_le_bytes());
        }
        let lo = base + 0xfff8;
        for (at, v) in [(9_001usize, lo + 3), (15_555, lo + 9), (19_990, lo)] {
            data[8 * at..8 * at + 8].copy_from_slice(&v.to_le_bytes());
        }
        for (lo, hi) in [
            (lo, lo + 14),
            (lo + 4, lo + 12),
            (lo + 1, lo + 2),
            (base, base + 4096),
        ] {
            for cut in [0usize, 1, 3, 8, 13] {
                for addr in [0x4000u64, 0x4003] {
                    let d = &data[cut..];
                    assert_eq!(
                        pointer_into(d, addr, lo, hi),
                        pointer_into_by_words(d, addr, lo, hi),
                        "[{lo:#x}, {hi:#x}) cut {cut} at {addr:#x}"
                    );
                }
            }
        }
        assert!(pointer_into(&data, 0x4000, lo, lo + 14).is_some());
        assert_eq!(pointer_into(&data, 0x4000, lo, lo), None);
    }

    #[test]
    fn aligned_code_pointers_into_the_window_are_found() {
        let mut data = vec![0u8; 4];
        data.extend_from_slice(&0x7f00_0000_1003u64.to_le_bytes());
        assert_eq!(
            pointer_into(&data, 0x4004, 0x7f00_0000_1001, 0x7f00_0000_1005),
            Some(InteriorEntry::Pointer {
                at: 0x4008,
                target: 0x7f00_0000_1003
            })
        );
        // Not aligned: not a stored pointer.
        assert_eq!(
            pointer_into(&data, 0x4000, 0x7f00_0000_1001, 0x7f00_0000_1005),
            None
        );
    }
}
