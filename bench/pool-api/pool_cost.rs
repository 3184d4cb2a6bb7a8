//! Cost of the igprof-client crate's pool calls: as pool_cost.c, a bump
//! arena handing out and taking back N blocks with and without
//! `alloc_event` and `free_event`. Built by bench/pool-api-cost.
//!
//! Usage: pool_cost_rs N REPS

use std::hint::black_box;
use std::time::Instant;

const SLAB: usize = 1 << 16;

#[inline(always)]
fn carve(slab: &mut [u8], used: &mut usize, i: usize) -> *const u8 {
    let n = 16 + (i & 63);
    if *used + n > SLAB {
        *used = 64;
    }
    let p = black_box(slab[*used..].as_ptr());
    *used += (n + 15) & !15;
    p
}

#[inline(never)]
fn plain_loop(slab: &mut [u8], n: usize) -> f64 {
    let mut used = 64;
    let t = Instant::now();
    for i in 0..n {
        carve(slab, &mut used, i);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

#[inline(never)]
fn reported_loop(slab: &mut [u8], n: usize) -> f64 {
    let mut used = 64;
    let t = Instant::now();
    for i in 0..n {
        let p = carve(slab, &mut used, i);
        igprof_client::alloc_event(p, 16 + (i & 63));
        igprof_client::free_event(p);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let mut a = std::env::args().skip(1);
    let n: usize = a.next().map_or(100_000_000, |s| s.parse().unwrap());
    let reps: usize = a.next().map_or(5, |s| s.parse().unwrap());
    let mut slab = vec![0u8; SLAB];
    let (mut plain, mut reported) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        plain = plain.min(plain_loop(&mut slab, n));
        reported = reported.min(reported_loop(&mut slab, n));
    }
    println!(
        "Rust without calls {plain:.3} ns/block, with alloc+free events {reported:.3} ns/block: {:+.3} ns per pair of calls",
        reported - plain
    );
}
