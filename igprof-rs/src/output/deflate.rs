//! One-shot gzip compression of a dump's text with libdeflate.
//!
//! A dump's text is compressed once, whole, at the end of a process (every
//! process of a profiled `make` pays it). libdeflate at level 1 takes about
//! half the time of zlib-rs at level 3 for files a few percent larger
//! (docs/benchmarks.md, "Design figures"), but it needs the whole input
//! and output in memory: the caller streams through zlib-rs instead past
//! a size (see `output::file::GzipWriter`).
//!
//! Owns: the compressor's lifetime and its memory, which comes from the
//! profiler's own allocator (never the program's malloc, whose heap a dump
//! must leave as it was).
//! Must never: run in a signal handler (it allocates).

use core::ffi::c_void;

/// libdeflate's level for dumps (1..=12).
pub const LEVEL: i32 = 1;

/// Texts shorter than this are stored in the gzip member, not compressed
/// (level 0). libdeflate's fastest level clears a 128 KiB hash table for
/// every member it compresses, in a compressor of 198 KiB: for the few
/// KiB of a short process's profile that is most of the dump's page
/// faults (about 40 of a no-op's 330) and time, for a file a few KiB
/// smaller; for the 20 KiB of a `-pp` profile of sqlite3 it was a third
/// of what the dump added to the process's peak (116 KB of it). A stored
/// member is written here, without libdeflate (see [`stored`]); the file
/// is then as long as its text, at most 64 KiB.
pub const STORE_BELOW: usize = 64 << 10;

/// The level for a member of `len` bytes of text.
pub fn level_for(len: usize) -> i32 {
    if len < STORE_BELOW {
        0
    } else {
        LEVEL
    }
}

/// Bytes before each block from [`alloc`], holding its size.
const HEADER: usize = 16;

/// libdeflate's `malloc`: a block of the profiler's allocator with its
/// size in front.
unsafe extern "C" fn alloc(size: usize) -> *mut c_void {
    let Ok(layout) = std::alloc::Layout::from_size_align(size.saturating_add(HEADER), HEADER)
    else {
        return core::ptr::null_mut();
    };
    // SAFETY: the layout's size is at least HEADER, non-zero.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return p.cast();
    }
    // SAFETY: p is HEADER-aligned and HEADER + size bytes long.
    unsafe {
        p.cast::<usize>().write(size);
        p.add(HEADER).cast()
    }
}

/// libdeflate's `free` for blocks from [`alloc`].
unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: p came from `alloc`, which put the block's size HEADER
    // bytes before it, in a block of that layout.
    unsafe {
        let base = p.cast::<u8>().sub(HEADER);
        let size = base.cast::<usize>().read();
        let layout = std::alloc::Layout::from_size_align_unchecked(size + HEADER, HEADER);
        std::alloc::dealloc(base, layout);
    }
}

/// A libdeflate compressor kept for the members of one dump (made again
/// only when the level changes), with the buffer its output goes into.
pub struct Gzip {
    /// The compressor and its level; null before the first member.
    c: *mut libdeflate_sys::libdeflate_compressor,
    level: i32,
    out: Vec<u8>,
}

impl Default for Gzip {
    fn default() -> Self {
        Gzip {
            c: core::ptr::null_mut(),
            level: -1,
            out: Vec::new(),
        }
    }
}

impl Gzip {
    /// `input` as one gzip member at `level`, valid until the next call;
    /// None when libdeflate could not make its compressor (no memory) or
    /// the output did not fit its bound.
    pub fn member(&mut self, input: &[u8], level: i32) -> Option<&[u8]> {
        if level == 0 {
            stored(input, &mut self.out);
            return Some(&self.out);
        }
        if self.c.is_null() || self.level != level {
            self.free_compressor();
            let options = libdeflate_sys::libdeflate_options {
                sizeof_options: core::mem::size_of::<libdeflate_sys::libdeflate_options>(),
                malloc_func: Some(alloc),
                free_func: Some(free),
            };
            // SAFETY: `options` is a valid, complete libdeflate_options.
            self.c = unsafe { libdeflate_sys::libdeflate_alloc_compressor_ex(level, &options) };
            if self.c.is_null() {
                return None;
            }
            self.level = level;
        }
        // SAFETY: c is a live compressor.
        let bound = unsafe { libdeflate_sys::libdeflate_gzip_compress_bound(self.c, input.len()) };
        self.out.clear();
        self.out.reserve(bound);
        // SAFETY: c is live; `input` is readable for its length and `out`
        // has `bound` writable bytes; libdeflate writes at most that many.
        let n = unsafe {
            libdeflate_sys::libdeflate_gzip_compress(
                self.c,
                input.as_ptr().cast(),
                input.len(),
                self.out.as_mut_ptr().cast(),
                bound,
            )
        };
        if n == 0 {
            return None;
        }
        // SAFETY: libdeflate wrote n <= bound initialised bytes.
        unsafe { self.out.set_len(n) };
        Some(&self.out)
    }

    fn free_compressor(&mut self) {
        if !self.c.is_null() {
            // SAFETY: c came from libdeflate_alloc_compressor_ex and is
            // freed once (set to null just after).
            unsafe { libdeflate_sys::libdeflate_free_compressor(self.c) };
            self.c = core::ptr::null_mut();
        }
    }
}

/// `input` as one gzip member of stored (uncompressed) deflate blocks,
/// into `out` (RFC 1952 around RFC 1951's blocks of type 0), the CRC-32
/// from a table made at compile time. Not libdeflate's level 0: its first
/// CRC-32 of a process detects the CPU's features (CPUID, each a trap to
/// the hypervisor in a virtual machine: 47 us of every short profiled
/// process here, in a profiled shell's loop of `/bin/true`), for the few
/// hundred bytes of text such a process writes.
pub fn stored(input: &[u8], out: &mut Vec<u8>) {
    const BLOCK: usize = u16::MAX as usize;
    out.clear();
    out.reserve(input.len() + 18 + 5 * input.len().div_ceil(BLOCK).max(1));
    // ID1 ID2, CM deflate, no flags, no time, no extra flags, OS unknown.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let mut blocks = input.chunks(BLOCK).peekable();
    if blocks.peek().is_none() {
        // One final empty block.
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(b) = blocks.next() {
        let last = blocks.peek().is_none();
        let len = b.len() as u16;
        out.push(last as u8);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(b);
    }
    out.extend_from_slice(&crc32(input).to_le_bytes());
    out.extend_from_slice(&(input.len() as u32).to_le_bytes());
}

/// CRC-32 (IEEE 802.3, reflected, gzip's) of `bytes`.
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    !bytes.iter().fold(!0u32, |c, &b| {
        TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8)
    })
}

impl Drop for Gzip {
    fn drop(&mut self) {
        self.free_compressor();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gzip(input: &[u8], level: i32) -> Option<Vec<u8>> {
        Gzip::default().member(input, level).map(<[u8]>::to_vec)
    }

    /// One compressor for several members, at two levels: each member
    /// reads back as its own text.
    #[test]
    fn one_compressor_serves_every_member() {
        let mut g = Gzip::default();
        let texts: Vec<Vec<u8>> = (0..4u32)
            .map(|k| {
                (0..30_000u32)
                    .flat_map(|i| {
                        format!("C{} FN{}+{:x}\n", i % 40, (i + k) % 977, i * 7).into_bytes()
                    })
                    .collect()
            })
            .collect();
        for (k, text) in texts.iter().enumerate() {
            let input = if k == 2 { &text[..1000] } else { &text[..] };
            let z = g
                .member(input, level_for(input.len()))
                .expect("compressed")
                .to_vec();
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&z[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, input, "member {k}");
        }
    }

    #[test]
    fn gzip_round_trips_through_flate2() {
        let mut text = Vec::new();
        for i in 0..50_000u32 {
            text.extend_from_slice(format!("C{} FN{}+{:x}\n", i % 40, i % 977, i * 7).as_bytes());
        }
        for input in [&text[..], b"", b"x"] {
            let z = gzip(input, LEVEL).expect("compressed");
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&z[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, input);
        }
        let z = gzip(&text, LEVEL).unwrap();
        assert!(z.len() < text.len() / 2, "{} of {}", z.len(), text.len());
    }

    /// The stored member against flate2's reader and libdeflate's own
    /// level 0: empty, one byte, exactly one block, and blocks past it.
    #[test]
    fn stored_members_read_back_as_libdeflates_do() {
        let text: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for n in [0, 1, 1000, 65_535, 65_536, 200_000] {
            let input = &text[..n];
            let mut ours = Vec::new();
            stored(input, &mut ours);
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&ours[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, input, "{n} bytes");
            // SAFETY: level 0 is valid; the compressor is freed below.
            let c = unsafe { libdeflate_sys::libdeflate_alloc_compressor(0) };
            assert!(!c.is_null());
            let mut theirs = vec![0u8; n + 1000];
            // SAFETY: c is live; both buffers are valid for their lengths.
            let m = unsafe {
                let m = libdeflate_sys::libdeflate_gzip_compress(
                    c,
                    input.as_ptr().cast(),
                    n,
                    theirs.as_mut_ptr().cast(),
                    theirs.len(),
                );
                libdeflate_sys::libdeflate_free_compressor(c);
                m
            };
            // The same deflate stream and trailer (CRC-32, size); the
            // headers differ only in the OS byte.
            assert_eq!(&ours[10..], &theirs[10..m], "{n} bytes");
        }
    }

    #[test]
    fn short_texts_are_stored() {
        let text = b"P=(ID=1 N=(true) T=0)\n".repeat(100);
        assert_eq!(level_for(text.len()), 0);
        assert_eq!(level_for(STORE_BELOW), LEVEL);
        let z = gzip(&text, level_for(text.len())).expect("stored");
        // The text itself, with the gzip header, trailer and block header.
        assert!(
            z.len() > text.len() && z.len() < text.len() + 40,
            "{}",
            z.len()
        );
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&z[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, text);
    }
}
