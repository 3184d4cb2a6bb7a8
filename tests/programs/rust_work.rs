//! A Rust program with known work: hot_a does twice hot_b's arithmetic
//! (CPU shares 2:1); churn makes and drops a Vec of 100 u64 N times
//! (N allocations of 800 bytes through Rust's system allocator); keep
//! leaks one 1000-byte boxed slice; panics are thrown through 20 frames
//! and caught PANICS times. Args: N (default 200000), rounds of hot work
//! (default 300), PANICS (default 1000).
use std::hint::black_box;

#[inline(never)]
fn hot_a(rounds: u64) -> f64 {
    let mut s = 0.0;
    for j in 0..rounds {
        for i in 0..200_000u64 {
            s += black_box(((i + j) as f64).sqrt());
        }
    }
    s
}

#[inline(never)]
fn hot_b(rounds: u64) -> f64 {
    let mut s = 0.0;
    for j in 0..rounds {
        for i in 0..100_000u64 {
            s += black_box(((i + j) as f64).sqrt());
        }
    }
    s
}

#[inline(never)]
fn churn(n: u64) -> usize {
    let mut t = 0;
    for i in 0..n {
        let mut v: Vec<u64> = Vec::with_capacity(100);
        v.push(i);
        t += black_box(&v).len();
    }
    t
}

#[inline(never)]
fn keep() -> &'static [u8] {
    Box::leak(black_box(vec![1u8; 1000]).into_boxed_slice())
}

#[inline(never)]
fn deep(d: u32) -> u32 {
    if d == 0 {
        panic!("deep enough");
    }
    black_box(deep(d - 1)) + 1
}

fn main() {
    let arg = |i: usize, d: u64| std::env::args().nth(i).map_or(d, |a| a.parse().unwrap());
    let (n, rounds, panics) = (arg(1, 200_000), arg(2, 300), arg(3, 1000));
    std::panic::set_hook(Box::new(|_| {}));
    let t = churn(n);
    let k = keep();
    let s = hot_a(rounds) + hot_b(rounds);
    let caught = (0..panics)
        .filter(|_| std::panic::catch_unwind(|| deep(20)).is_err())
        .count();
    println!("rust done {t} {} {} caught {caught}", k.len(), s > 0.0);
}
