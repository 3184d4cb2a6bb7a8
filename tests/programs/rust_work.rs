//! A Rust program with known work: hot_a does twice hot_b's arithmetic
//! (CPU shares about 2:1), called in turn CHUNK rounds at a time, the
//! thread CPU time each took printed to stderr ("rust cpu_ns A B"); churn
//! makes and drops a Vec of 100 u64 N times (N allocations of 800 bytes
//! through Rust's system allocator); keep leaks one 1000-byte boxed
//! slice; panics are thrown through 20 frames and caught PANICS times.
//! Args: N (default 200000), rounds of hot work (default 300), PANICS
//! (default 1000).
use std::hint::black_box;

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut [i64; 2]) -> i32;
}

/// Rounds of hot work per call: a machine's load falls on hot_a and
/// hot_b alike, and each call (tens of milliseconds) is long against the
/// sampling interval, so that no sampling period can stay in step with
/// the alternation (calls of one round, 0.6 ms, did: whole runs of
/// samples a period of about two rounds took fell in one function).
const CHUNK: u64 = 50;

/// The thread's CPU time in nanoseconds (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_ns() -> i64 {
    let mut ts = [0i64; 2];
    // SAFETY: ts is a struct timespec (two 64-bit fields on x86-64 and
    // AArch64 Linux), written by the call.
    let r = unsafe { clock_gettime(3, &mut ts) };
    assert_eq!(r, 0, "clock_gettime");
    ts[0] * 1_000_000_000 + ts[1]
}

#[inline(never)]
fn hot_a(first: u64, rounds: u64) -> f64 {
    let mut s = 0.0;
    for j in first..first + rounds {
        for i in 0..200_000u64 {
            s += black_box(((i + j) as f64).sqrt());
        }
    }
    s
}

#[inline(never)]
fn hot_b(first: u64, rounds: u64) -> f64 {
    let mut s = 0.0;
    for j in first..first + rounds {
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
    let (mut s, mut ta, mut tb) = (0.0, 0, 0);
    for j in (0..rounds).step_by(CHUNK as usize) {
        let n = CHUNK.min(rounds - j);
        let t0 = thread_cpu_ns();
        s += hot_a(j, n);
        let t1 = thread_cpu_ns();
        s += hot_b(j, n);
        tb += thread_cpu_ns() - t1;
        ta += t1 - t0;
    }
    let caught = (0..panics)
        .filter(|_| std::panic::catch_unwind(|| deep(20)).is_err())
        .count();
    println!("rust done {t} {} {} caught {caught}", k.len(), s > 0.0);
    eprintln!("rust cpu_ns {ta} {tb}");
}
