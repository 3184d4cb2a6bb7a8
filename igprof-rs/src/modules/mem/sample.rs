//! Sampled memory profiling (`-mp --sample-bytes N`): which allocations
//! are recorded, and how much each recorded one stands for.
//!
//! Owns: the run's mean gap N and seed, each thread's byte countdown and
//! random generator, the weight a sampled block carries (packed into its
//! live-table entry), and the filter that lets a free skip the live table
//! for a block that was never sampled.
//!
//! # The model
//!
//! As in tcmalloc, every allocated byte triggers a sample with probability
//! p = 1/N, independently; an allocation is recorded when at least one of
//! its bytes does. A thread counts down the bytes to its next triggering
//! byte, drawn from the geometric distribution on {1, 2, ...} with
//! parameter p; an allocation of s bytes is recorded when the countdown is
//! at most s, and the countdown is then drawn afresh. The geometric
//! distribution is memoryless, so whatever the thread allocated before, an
//! allocation of s bytes is recorded with probability
//!
//! ```text
//! q(s) = 1 - (1 - 1/N)^s      (~ 1 - exp(-s/N), tcmalloc's continuous form)
//! ```
//!
//! and a recorded one stands for w(s) = 1/q(s) allocations: its call count
//! w and its bytes b*w (b: the bytes -mo accounts, normally s). Then
//! E[recorded * w] = 1, so every sum of calls or bytes over a stack is
//! unbiased, including live bytes (a block stays in the table with its
//! weight until freed). The discrete form is used because it is exact at
//! N = 1: q = 1 and w = 1, every allocation is recorded at its own size and
//! the profile equals the exact one. For N of a kilobyte or more the two
//! forms differ by less than s/N^2 in q. A zero-byte allocation is decided
//! as one byte (it still counts as a call). The standard error of a stack's
//! bytes is about sqrt(N / B) of its B bytes allocated in blocks smaller
//! than N (each sample is a Poisson event); blocks larger than N are
//! nearly always recorded and add little.
//!
//! Integer counters: the weight is real, the counters are integers. Calls
//! and bytes are each rounded stochastically (down, or up with probability
//! equal to the fraction, from an independent draw), which keeps them
//! unbiased. MEM_MAX's value is the largest *recorded* allocation.
//!
//! # Storage
//!
//! A sampled block's live-table entry keeps `calls << 40 | bytes` in its
//! size field ([`pack`], [`unpack`]), so a free subtracts exactly what the
//! allocation added. Calls get 24 bits: w <= N <= 16 MiB, and the one
//! value that does not fit (w = 2^24, a 1-byte allocation at N = 16 MiB)
//! is capped, one call in 16 million. Bytes get 40 bits (1 TiB; a larger
//! estimate is capped).
//!
//! A free first looks at `FILTER`: per hash bucket of addresses, how many
//! sampled blocks are live there. A zero means the block was not sampled
//! and the free costs one load; otherwise the live table is searched as in
//! exact mode. The count only errs high, which costs a search: it sticks
//! at 255, and a sampled allocation that is not recorded after all (on a
//! thread the profiler does not know) keeps its count.
//!
//! # Threads, signals, fork
//!
//! Thread k (in the order threads first allocate) draws from seed
//! mix(S, k). A signal handler that allocates while its thread is inside
//! [`decide`] may reuse the countdown or a random number the thread was
//! about to update: each decision is still made with the right
//! probability. A forked child reseeds its thread from the inherited
//! generator (and its pid unless `--sample-seed` was given), so it does
//! not repeat the parent's choices.
//!
//! Must never: allocate, lock, panic, or touch `errno` on the path of an
//! allocation that is not sampled (the sampled path calls libm and runs
//! under the hook's `ErrnoGuard`).

use core::cell::Cell;
use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Mean bytes between samples (0: exact mode, every allocation recorded).
static MEAN: AtomicU64 = AtomicU64::new(0);
/// ln(1 - 1/N), as f64 bits (unused when N = 1).
static LN_KEEP: AtomicU64 = AtomicU64::new(0);
/// The run's seed, the one the header names.
static SEED: AtomicU64 = AtomicU64::new(0);
/// Seed of this process's threads (the run's seed, or a forked child's).
static PROCESS_SEED: AtomicU64 = AtomicU64::new(0);
/// Threads that have made their first decision.
static THREADS: AtomicU64 = AtomicU64::new(0);
/// Whether the seed came from `--sample-seed`.
static GIVEN_SEED: AtomicU64 = AtomicU64::new(0);

const BYTES_BITS: u32 = 40;
const BYTES_MAX: u64 = (1 << BYTES_BITS) - 1;
const CALLS_MAX: u64 = (1 << (64 - BYTES_BITS)) - 1;
// A weight is at most N calls (w(1) = N), which must fit its field.
const _: () = assert!(crate::base::options::MAX_SAMPLE_BYTES <= CALLS_MAX + 1);

/// Per-thread sampler state (kept in the memory hooks' thread-local
/// state, `site::HookTls`, so a hook reaches it with the same lookup).
pub struct ThreadSampler {
    /// Bytes to the next triggering byte (>= 1); 0 before the thread's
    /// first decision.
    left: Cell<u64>,
    /// splitmix64 state.
    rng: Cell<u64>,
}

impl ThreadSampler {
    pub const fn new() -> Self {
        ThreadSampler {
            left: Cell::new(0),
            rng: Cell::new(0),
        }
    }
}

impl Default for ThreadSampler {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether this run samples allocations.
#[inline]
pub fn active() -> bool {
    MEAN.load(Ordering::Relaxed) != 0
}

/// The run's N (0 in exact mode).
pub fn mean() -> u64 {
    MEAN.load(Ordering::Relaxed)
}

/// The run's seed.
pub fn seed() -> u64 {
    SEED.load(Ordering::Relaxed)
}

/// Sets the sampler up (start-up, before any hook is installed).
pub fn init(mean: u64, seed: Option<u64>) {
    if mean == 0 {
        return;
    }
    let s = seed.unwrap_or_else(random_seed);
    SEED.store(s, Ordering::Relaxed);
    PROCESS_SEED.store(s, Ordering::Relaxed);
    GIVEN_SEED.store(seed.is_some() as u64, Ordering::Relaxed);
    let p = Params::new(mean);
    LN_KEEP.store(p.ln_keep.to_bits(), Ordering::Relaxed);
    // Binds libm's log and expm1 now, not in the first hook that needs them.
    core::hint::black_box((ThreadSampler::new().gap(p), p.weight(2)));
    MEAN.store(mean, Ordering::Release);
}

fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is a writable 8-byte buffer; GRND_NONBLOCK never waits.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    // No entropy source (old kernel, seccomp): time and pid.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    mix(ts.tv_sec as u64 ^ (ts.tv_nsec as u64) << 20 ^ (crate::sys::getpid() as u64) << 44)
}

/// splitmix64's output function.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The run's sampling parameters.
#[derive(Clone, Copy, Debug)]
struct Params {
    mean: u64,
    /// ln(1 - 1/N) (unused when N = 1).
    ln_keep: f64,
}

impl Params {
    fn new(mean: u64) -> Self {
        let ln_keep = if mean <= 1 {
            f64::NEG_INFINITY
        } else {
            libm::log1p(-1.0 / mean as f64)
        };
        Params { mean, ln_keep }
    }

    #[inline]
    fn get() -> Self {
        Params {
            mean: MEAN.load(Ordering::Relaxed),
            ln_keep: f64::from_bits(LN_KEEP.load(Ordering::Relaxed)),
        }
    }

    /// w(s) = 1 / (1 - (1 - 1/N)^s).
    fn weight(self, s: u64) -> f64 {
        if self.mean <= 1 {
            return 1.0;
        }
        let q = -libm::expm1(s as f64 * self.ln_keep);
        if q > 0.0 {
            1.0 / q
        } else {
            1.0
        }
    }
}

impl ThreadSampler {
    #[inline]
    fn next(&self) -> u64 {
        let s = self.rng.get().wrapping_add(GOLDEN);
        self.rng.set(s);
        mix(s)
    }

    /// Uniform in (0, 1].
    #[inline]
    fn open0(&self) -> f64 {
        ((self.next() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1).
    #[inline]
    fn unit(&self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Bytes to the next triggering byte: geometric on {1, 2, ...}.
    fn gap(&self, p: Params) -> u64 {
        if p.mean <= 1 {
            return 1;
        }
        // P(G > k) = P(ln U <= k ln(1-p)) = (1-p)^k. The logarithms are
        // the libm crate's (musl's, in Rust): they never touch errno (this
        // runs on the hooks' fast path, outside their ErrnoGuard), and
        // libigprof.so needs no libm.so.6 loaded into every program.
        let g = (libm::log(self.open0()) / p.ln_keep).floor() + 1.0;
        if g >= (1u64 << 62) as f64 {
            1 << 62
        } else {
            g as u64
        }
    }

    /// `x` rounded down, or up with probability frac(x).
    #[inline]
    fn round(&self, x: f64) -> u64 {
        let f = x.floor();
        f as u64 + (self.unit() < x - f) as u64
    }

    /// The decision for `s` bytes (s >= 1).
    #[inline]
    fn decide(&self, s: u64, p: impl FnOnce() -> (Params, u64)) -> Option<Pick> {
        if self.passes_over(s) {
            return None;
        }
        self.decide_slow(s, p)
    }

    /// The common decision for `s` bytes (s >= 1): true when no sampling
    /// point falls in them (they are counted off); false when one may (or
    /// the thread has not decided yet), leaving the decision to
    /// [`Self::decide`].
    #[inline(always)]
    fn passes_over(&self, s: u64) -> bool {
        let left = self.left.get();
        if s < left {
            self.left.set(left - s);
            return true;
        }
        false
    }

    #[cold]
    #[inline(never)]
    fn decide_slow(&self, s: u64, p: impl FnOnce() -> (Params, u64)) -> Option<Pick> {
        let (p, stream) = p();
        if self.left.get() == 0 {
            // The thread's first decision: its own stream, then its first gap.
            self.rng.set(stream);
            let g = self.gap(p);
            if s < g {
                self.left.set(g - s);
                return None;
            }
        }
        self.left.set(self.gap(p));
        Some(Pick { size: s })
    }

    /// Packed (calls, bytes) for a pick whose accounted bytes are `bytes`.
    fn weigh(&self, p: Params, pick: Pick, bytes: u64) -> u64 {
        let w = p.weight(pick.size);
        let calls = self.round(w).clamp(1, CALLS_MAX);
        let b = if w == 1.0 {
            bytes
        } else {
            self.round(bytes as f64 * w)
        };
        pack(calls, b)
    }
}

/// A sampled allocation, before its weight is fixed.
#[derive(Clone, Copy, Debug)]
pub struct Pick {
    /// The size the decision was made on (at least 1).
    size: u64,
}

/// Whether an allocation of `size` bytes is recorded (once per
/// allocation: the caller makes sure an outer hook does not decide again
/// for the same block).
#[inline(always)]
pub fn decide(t: &ThreadSampler, size: usize) -> Option<Pick> {
    let s = (size as u64).max(1);
    t.decide(s, || {
        let k = THREADS.fetch_add(1, Ordering::Relaxed);
        (
            Params::get(),
            mix(PROCESS_SEED.load(Ordering::Relaxed) ^ mix(k.wrapping_add(1))),
        )
    })
}

/// Whether an allocation of `size` bytes is certainly not recorded, taken
/// before the allocation is made: true counts its bytes off as
/// [`decide`] would have; false leaves the whole decision to [`decide`]
/// (nothing is counted off, so the allocation is decided once).
#[inline(always)]
pub fn passes_over(t: &ThreadSampler, size: usize) -> bool {
    t.passes_over((size as u64).max(1))
}

/// The packed weight of a sampled allocation whose accounted bytes (-mo)
/// are `bytes`: the calls and bytes it stands for, each rounded
/// stochastically. Runs libm: call it under an `ErrnoGuard`.
pub fn weigh(t: &ThreadSampler, pick: Pick, bytes: u64) -> u64 {
    t.weigh(Params::get(), pick, bytes)
}

/// `calls << 40 | bytes`, each capped to its field.
#[inline]
pub fn pack(calls: u64, bytes: u64) -> u64 {
    calls.min(CALLS_MAX) << BYTES_BITS | bytes.min(BYTES_MAX)
}

/// (calls, bytes) of a packed weight.
#[inline]
pub fn unpack(stored: u64) -> (u64, u64) {
    (stored >> BYTES_BITS, stored & BYTES_MAX)
}

/// (calls, bytes) a live-table entry stands for: its packed weight when
/// sampling, else one call of its size.
#[inline]
pub fn weight_of(stored: u64) -> (u64, u64) {
    if active() {
        unpack(stored)
    } else {
        (1, super::epoch::bytes(stored))
    }
}

// ---- the free-path filter ----

const FILTER_BITS: u32 = 16;
/// Live sampled blocks per address bucket (see the module docs).
static FILTER: [AtomicU8; 1 << FILTER_BITS] = [const { AtomicU8::new(0) }; 1 << FILTER_BITS];
const STUCK: u8 = u8::MAX;

#[inline]
fn bucket(addr: usize) -> &'static AtomicU8 {
    let h = ((addr as u64) >> 4).wrapping_mul(GOLDEN) >> (64 - FILTER_BITS);
    &FILTER[h as usize]
}

/// Whether block `addr` may be a live sampled block (false: it is not).
#[inline]
pub fn may_be_sampled(addr: usize) -> bool {
    bucket(addr).load(Ordering::Relaxed) != 0
}

/// A sampled block `addr` is about to enter the live table (before the
/// program sees the block, so any free of it finds the count).
pub fn remember(addr: usize) {
    let b = bucket(addr);
    let mut v = b.load(Ordering::Relaxed);
    while v != STUCK {
        match b.compare_exchange_weak(v, v + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => v = now,
        }
    }
}

/// A sampled block `addr` left the live table (or never entered it).
pub fn forget(addr: usize) {
    let b = bucket(addr);
    let mut v = b.load(Ordering::Relaxed);
    while v != 0 && v != STUCK {
        match b.compare_exchange_weak(v, v - 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => v = now,
        }
    }
}

/// In a forked child: no live block, and a stream of its own for the
/// forking thread (the only one), whose sampler is `t`.
pub fn after_fork_child(t: &ThreadSampler) {
    if !active() {
        return;
    }
    for b in FILTER.iter() {
        b.store(0, Ordering::Relaxed);
    }
    let pid = if GIVEN_SEED.load(Ordering::Relaxed) != 0 {
        0
    } else {
        crate::sys::getpid() as u64
    };
    let s = mix(PROCESS_SEED.load(Ordering::Relaxed) ^ t.rng.get() ^ pid ^ 0x5eed_f04c);
    PROCESS_SEED.store(s, Ordering::Relaxed);
    t.left.set(0);
    THREADS.store(0, Ordering::Relaxed);
}

/// What the profile's header and `-d` say about the sampling: empty in
/// exact mode. No `)` (IgProf's reader ends the program name at the first).
pub fn describe() -> String {
    if !active() {
        return String::new();
    }
    format!(
        "sampled: --sample-bytes {} --sample-seed {}",
        mean(),
        seed()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_and_caps() {
        assert_eq!(unpack(pack(1, 0)), (1, 0));
        assert_eq!(unpack(pack(524_288, 524_300)), (524_288, 524_300));
        assert_eq!(
            unpack(pack(CALLS_MAX + 5, u64::MAX)),
            (CALLS_MAX, BYTES_MAX)
        );
    }

    #[test]
    fn filter_counts_and_sticks() {
        let a = 0x7000_1230usize;
        assert!(!may_be_sampled(a));
        remember(a);
        remember(a);
        assert!(may_be_sampled(a));
        forget(a);
        assert!(may_be_sampled(a));
        forget(a);
        assert!(!may_be_sampled(a));
        forget(a);
        assert!(!may_be_sampled(a), "no underflow");
        for _ in 0..300 {
            remember(a);
        }
        for _ in 0..400 {
            forget(a);
        }
        assert!(may_be_sampled(a), "a saturated bucket stays set");
    }

    fn sampler(seed: u64) -> ThreadSampler {
        ThreadSampler {
            left: Cell::new(0),
            rng: Cell::new(seed),
        }
    }

    #[test]
    fn geometric_gap_weight_and_rounding() {
        let p = Params::new(1000);
        // q(1) = 1/N exactly: one byte, one chance in N.
        assert!((p.weight(1) - 1000.0).abs() < 1e-6, "{}", p.weight(1));
        assert!((p.weight(1000) - 1.0 / (1.0 - 0.999f64.powi(1000))).abs() < 1e-9);
        assert!((p.weight(1 << 30) - 1.0).abs() < 1e-12);
        let t = sampler(42);
        let n = 200_000;
        let (mut sum, mut min) = (0u64, u64::MAX);
        for _ in 0..n {
            let g = t.gap(p);
            sum += g;
            min = min.min(g);
        }
        // Geometric: mean N, sd ~N, so the sample mean's sd is N/sqrt(n).
        let mean = sum as f64 / n as f64;
        assert!(
            (mean - 1000.0).abs() < 5.0 * 1000.0 / (n as f64).sqrt(),
            "{mean}"
        );
        assert_eq!(min, 1);
        let r: u64 = (0..n).map(|_| t.round(2.25)).sum();
        assert!((r as f64 / n as f64 - 2.25).abs() < 0.01);
    }

    #[test]
    fn estimates_are_unbiased_for_every_size() {
        let p = Params::new(1000);
        let t = sampler(9);
        // Sizes far below, near and above N, interleaved: each size's
        // recorded fraction is q(s) and its weighted calls and bytes
        // estimate its true calls and bytes.
        let sizes = [1u64, 0, 37, 400, 1000, 2500, 9000];
        let rounds = 100_000u64;
        let mut got = [(0u64, 0u64, 0u64); 7];
        for _ in 0..rounds {
            for (i, &s) in sizes.iter().enumerate() {
                if let Some(pick) = t.decide(s.max(1), || (p, 5)) {
                    let (c, b) = unpack(t.weigh(p, pick, s));
                    got[i].0 += 1;
                    got[i].1 += c;
                    got[i].2 += b;
                }
            }
        }
        for (i, &s) in sizes.iter().enumerate() {
            let q = 1.0 - 0.999f64.powi(s.max(1) as i32);
            let n = rounds as f64;
            let se = (n * q * (1.0 - q)).sqrt().max(1.0);
            assert!(
                (got[i].0 as f64 - n * q).abs() < 5.0 * se,
                "size {s}: {:?}",
                got[i]
            );
            // sd of the calls estimate: sqrt(n (1-q)/q).
            let sd = (n * (1.0 - q) / q).sqrt().max(1.0);
            assert!(
                (got[i].1 as f64 - n).abs() < 5.0 * sd + 1.0,
                "size {s}: {:?}",
                got[i]
            );
            assert!(
                (got[i].2 as f64 - n * s as f64).abs() < 5.0 * sd * s as f64 + 1.0,
                "size {s}: {:?}",
                got[i]
            );
        }
    }

    #[test]
    fn one_byte_mean_records_everything_exactly() {
        let p = Params::new(1);
        let t = sampler(3);
        for s in [1u64, 2, 1000, 1 << 33] {
            let pick = t
                .decide(s, || (p, 1))
                .expect("every allocation is recorded");
            assert_eq!(unpack(t.weigh(p, pick, s)), (1, s));
        }
    }
}
