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
/// every member it compresses: for the few KiB of a short process's
/// profile that is most of the dump's page faults (about 40 of a no-op's
/// 330) and time, for a file a few KiB smaller.
pub const STORE_BELOW: usize = 16 << 10;

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

/// `input` as one gzip member at `level`; None when libdeflate could not
/// make its compressor (no memory) or the output did not fit its bound.
pub fn gzip(input: &[u8], level: i32) -> Option<Vec<u8>> {
    let options = libdeflate_sys::libdeflate_options {
        sizeof_options: core::mem::size_of::<libdeflate_sys::libdeflate_options>(),
        malloc_func: Some(alloc),
        free_func: Some(free),
    };
    // SAFETY: `options` is a valid, complete libdeflate_options.
    let c = unsafe { libdeflate_sys::libdeflate_alloc_compressor_ex(level, &options) };
    if c.is_null() {
        return None;
    }
    // SAFETY: c is a live compressor.
    let bound = unsafe { libdeflate_sys::libdeflate_gzip_compress_bound(c, input.len()) };
    let mut out: Vec<u8> = Vec::with_capacity(bound);
    // SAFETY: c is live; `input` is readable for its length and `out` has
    // `bound` writable bytes; libdeflate writes at most that many.
    let n = unsafe {
        libdeflate_sys::libdeflate_gzip_compress(
            c,
            input.as_ptr().cast(),
            input.len(),
            out.as_mut_ptr().cast(),
            bound,
        )
    };
    // SAFETY: c came from libdeflate_alloc_compressor_ex and is freed once.
    unsafe { libdeflate_sys::libdeflate_free_compressor(c) };
    if n == 0 {
        return None;
    }
    // SAFETY: libdeflate wrote n <= bound initialised bytes.
    unsafe { out.set_len(n) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

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
