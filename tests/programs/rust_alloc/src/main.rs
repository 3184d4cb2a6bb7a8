//! Allocates known counts at known sites through Rust's global allocator
//! (whichever the build plugs in) and leaks a known part; prints what each
//! site did as `site NAME CALLS BYTES LIVE_BLOCKS LIVE_BYTES`, in the terms
//! of the memory profile (a reallocation is a call of its new size, and
//! the block it replaces is freed). `rust_alloc [REPS]`.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::hint::black_box;

pub struct Site {
    pub name: &'static str,
    calls: usize,
    bytes: usize,
    live_blocks: usize,
    live_bytes: usize,
}

/// 1,000 boxes of 48 bytes; one in ten leaked (if `leak`, as below).
#[no_mangle]
#[inline(never)]
pub fn site_boxes(leak: bool) -> Site {
    for i in 0..1000usize {
        let b = black_box(Box::new([i as u8; 48]));
        if leak && i % 10 == 0 {
            Box::leak(b);
        }
    }
    let live = if leak { 100 } else { 0 };
    Site { name: "site_boxes", calls: 1000, bytes: 48_000, live_blocks: live, live_bytes: live * 48 }
}

/// One vector grown by push from empty to 5,000 u64 (each growth one
/// reallocation), then leaked.
#[no_mangle]
#[inline(never)]
pub fn site_vec_growth(leak: bool) -> Site {
    let mut v: Vec<u64> = Vec::new();
    let (mut calls, mut bytes, mut cap) = (0, 0, 0);
    for i in 0..5000u64 {
        v.push(black_box(i));
        if v.capacity() != cap {
            cap = v.capacity();
            calls += 1;
            bytes += cap * 8;
        }
    }
    let live = if leak {
        std::mem::forget(v);
        1
    } else {
        0
    };
    Site { name: "site_vec_growth", calls, bytes, live_blocks: live, live_bytes: live * cap * 8 }
}

/// 2,000 strings of 27 bytes; 50 leaked.
#[no_mangle]
#[inline(never)]
pub fn site_strings(leak: bool) -> Site {
    for i in 0..2000 {
        let s = String::from(black_box("twenty-seven bytes of text."));
        if leak && i % 40 == 0 {
            s.leak();
        }
    }
    let live = if leak { 50 } else { 0 };
    Site { name: "site_strings", calls: 2000, bytes: 54_000, live_blocks: live, live_bytes: live * 27 }
}

/// 300 zeroed buffers of 4,096 bytes (alloc_zeroed); 30 leaked.
#[no_mangle]
#[inline(never)]
pub fn site_zeroed(leak: bool) -> Site {
    for i in 0..300 {
        let v = black_box(vec![0u8; 4096]);
        if leak && i % 10 == 0 {
            std::mem::forget(v);
        }
    }
    let live = if leak { 30 } else { 0 };
    Site { name: "site_zeroed", calls: 300, bytes: 1_228_800, live_blocks: live, live_bytes: live * 4096 }
}

#[repr(align(64))]
struct Line([u8; 64]);

impl Line {
    fn first(&self) -> u8 {
        self.0[0]
    }
}

/// 200 cache-line-aligned boxes (an aligned allocation); 20 leaked.
#[no_mangle]
#[inline(never)]
pub fn site_aligned(leak: bool) -> Site {
    for i in 0..200 {
        let b = black_box(Box::new(Line([i as u8; 64])));
        assert_eq!(&*b as *const Line as usize % 64, 0);
        assert_eq!(b.first(), i as u8);
        if leak && i % 10 == 0 {
            Box::leak(b);
        }
    }
    let live = if leak { 20 } else { 0 };
    Site { name: "site_aligned", calls: 200, bytes: 12_800, live_blocks: live, live_bytes: live * 64 }
}

/// One 4 MiB buffer filled with ones (its pages faulted in by the fill:
/// `-pf -mp` charges those faults to this site), then freed; in the first
/// repetition only (the benchmarks' rounds measure the allocator, not a
/// fill).
#[no_mangle]
#[inline(never)]
pub fn site_big(first: bool) -> Site {
    if !first {
        return Site { name: "site_big", calls: 0, bytes: 0, live_blocks: 0, live_bytes: 0 };
    }
    let v = black_box(vec![1u8; 4 << 20]);
    assert_eq!(v[(4 << 20) - 1], 1);
    drop(v);
    Site { name: "site_big", calls: 1, bytes: 4 << 20, live_blocks: 0, live_bytes: 0 }
}

/// Runs every site `reps` times (the first argument, default 1; the
/// benchmarks run more), leaking in the first only, and prints each
/// site's sums.
fn main() {
    let reps: usize = std::env::args().nth(1).map_or(1, |a| a.parse().expect("a repetition count"));
    let mut sums: Vec<Site> = Vec::new();
    for rep in 0..reps {
        let leak = rep == 0;
        let sites = [
            site_boxes(leak),
            site_vec_growth(leak),
            site_strings(leak),
            site_zeroed(leak),
            site_aligned(leak),
            site_big(leak),
        ];
        for s in sites {
            match sums.iter_mut().find(|t| t.name == s.name) {
                Some(t) => {
                    t.calls += s.calls;
                    t.bytes += s.bytes;
                    t.live_blocks += s.live_blocks;
                    t.live_bytes += s.live_bytes;
                }
                None => sums.push(s),
            }
        }
    }
    for s in sums {
        println!("site {} {} {} {} {}", s.name, s.calls, s.bytes, s.live_blocks, s.live_bytes);
    }
}
