//! The sampling handler's CPU time per sample (`-d`): a histogram with
//! four buckets per power of two (so percentiles are within 19%), filled
//! with relaxed atomic adds from the handler.
//!
//! Must never: allocate or lock in [`record`] (signal context).
use core::sync::atomic::{AtomicU64, Ordering};

const SUB: u32 = 2;
const BUCKETS: usize = 64 << SUB;
static HIST: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];

fn bucket(ns: u64) -> usize {
    if ns < (1 << SUB) {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros();
    let frac = (ns >> (log - SUB)) & ((1 << SUB) - 1);
    (((log - SUB + 1) << SUB) as u64 + frac) as usize
}

/// The smallest value of bucket `b`.
fn floor(b: usize) -> u64 {
    if b < (1 << SUB) {
        return b as u64;
    }
    let log = (b >> SUB) as u32 + SUB - 1;
    let frac = (b & ((1 << SUB) - 1)) as u64;
    (1u64 << log) | (frac << (log - SUB))
}

/// Signal-safe: one relaxed atomic add.
pub fn record(ns: u64) {
    HIST[bucket(ns).min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
}

/// The median and 99th percentile of the samples recorded so far (the
/// lower bounds of their buckets), or None without samples.
pub fn percentiles() -> Option<(u64, u64)> {
    let counts: Vec<u64> = HIST.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let at = |q: f64| {
        let want = ((total as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return floor(b);
            }
        }
        floor(BUCKETS - 1)
    };
    Some((at(0.5), at(0.99)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            9,
            15,
            16,
            1000,
            1023,
            1024,
            1_500_000,
            u64::MAX / 2,
        ] {
            let b = bucket(ns);
            assert!(b >= last, "{ns}");
            last = b;
            assert!(floor(b) <= ns, "{ns}: floor {}", floor(b));
            assert!(
                ns < 4 || (ns - floor(b)) * 4 < ns,
                "{ns}: floor {}",
                floor(b)
            );
        }
        assert_eq!(floor(bucket(1024)), 1024);
        assert_eq!(floor(bucket(1280)), 1280);
    }
}
