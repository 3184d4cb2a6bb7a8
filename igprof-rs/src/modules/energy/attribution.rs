//! The attribution model, as pure arithmetic: who is charged how much of an
//! interval's energy.
//!
//! Owns: the share of each profiled thread, the unattributed remainder, and
//! turning Joules into integer counter values without losing the fractions.
//! Pure functions over caller-provided slices: no allocation, no I/O, no
//! locks, no panics; callable from signal context.
//!
//! The model. In an interval of wall time `W` the packages consumed `E`
//! Joules (per domain). Thread `t` used `c_t` CPU time in it; `C = sum c_t`.
//! * [`SharePolicy::CpuCapacity`] (default): the machine could have run
//!   `W x cpus` of CPU time; each CPU-second of it costs the same, so
//!   thread `t` gets `E x c_t / max(W x cpus, C)`. The rest,
//!   `E x (1 - C / max(W x cpus, C))`, is *unattributed*: idle power, other
//!   processes, the kernel on other CPUs. A program that keeps every CPU
//!   busy is charged all of `E`; a single thread on an idle 8-CPU machine
//!   about an eighth of it.
//! * [`SharePolicy::ProfiledThreads`]: all of `E` is shared by the profiled
//!   threads, `E x c_t / C`; unattributed only in intervals where no
//!   profiled thread ran. Right on a machine dedicated to the program.
//!
//! In both, threads' shares are in the ratio of their CPU times, and
//! shares plus remainder equal `E` (to floating-point rounding).

use super::{Energy, DOMAINS};

/// How an interval's energy is shared; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SharePolicy {
    /// Charge each thread its CPU time's part of the machine's CPU capacity
    /// (`cpus` = online CPUs covered by the measured packages).
    CpuCapacity { cpus: u32 },
    /// Share all energy among the profiled threads.
    ProfiledThreads,
}

/// Share `energy`, consumed in `wall_ns`, among threads that used
/// `cpu_ns[i]` CPU time each; `shares[i]` receives thread `i`'s Joules
/// (`shares` must be at least as long as `cpu_ns`; extra entries are left
/// alone). Returns the unattributed remainder.
pub fn attribute(
    energy: &Energy,
    wall_ns: u64,
    policy: SharePolicy,
    cpu_ns: &[u64],
    shares: &mut [Energy],
) -> Energy {
    let used: u64 = cpu_ns.iter().fold(0u64, |a, &c| a.saturating_add(c));
    let denom = match policy {
        SharePolicy::CpuCapacity { cpus } => {
            (wall_ns as f64 * f64::from(cpus.max(1))).max(used as f64)
        }
        SharePolicy::ProfiledThreads => used as f64,
    };
    if denom <= 0.0 {
        for s in shares.iter_mut().take(cpu_ns.len()) {
            *s = [0.0; DOMAINS];
        }
        return *energy;
    }
    for (s, &c) in shares.iter_mut().zip(cpu_ns) {
        let f = c as f64 / denom;
        for d in 0..DOMAINS {
            s[d] = energy[d] * f;
        }
    }
    let rest = (1.0 - used as f64 / denom).max(0.0);
    let mut unattributed = [0.0; DOMAINS];
    for d in 0..DOMAINS {
        unattributed[d] = energy[d] * rest;
    }
    unattributed
}

/// Turns Joules into integer counter values (`joules_per_value` each, the
/// header's `T` for `NRG_*`), carrying the fraction to the next call so
/// that the sum of the values written equals the energy to within one value.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quantizer {
    carry: Energy,
}

impl Quantizer {
    pub const fn new() -> Quantizer {
        Quantizer {
            carry: [0.0; DOMAINS],
        }
    }

    pub fn values(&mut self, joules: &Energy, joules_per_value: f64) -> [u64; DOMAINS] {
        let mut out = [0u64; DOMAINS];
        if joules_per_value.is_nan() || joules_per_value <= 0.0 {
            return out;
        }
        for d in 0..DOMAINS {
            let x = (joules[d].max(0.0) / joules_per_value + self.carry[d]).max(0.0);
            let n = x.floor();
            self.carry[d] = x - n;
            out[d] = if n >= u64::MAX as f64 {
                u64::MAX
            } else {
                n as u64
            };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: Energy = [40.0, 30.0, 0.0, 8.0];

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn three_to_one_split_on_a_full_machine() {
        // 2 CPUs, 1 s: threads used 1.5 s and 0.5 s = all capacity.
        let mut shares = [[0.0; DOMAINS]; 2];
        let un = attribute(
            &E,
            1_000_000_000,
            SharePolicy::CpuCapacity { cpus: 2 },
            &[1_500_000_000, 500_000_000],
            &mut shares,
        );
        for d in 0..DOMAINS {
            assert!(close(shares[0][d], 0.75 * E[d]));
            assert!(close(shares[1][d], 0.25 * E[d]));
            assert!(close(un[d], 0.0));
        }
    }

    #[test]
    fn idle_capacity_is_unattributed() {
        // 4 CPUs, 1 s, threads used 0.75 s + 0.25 s: a quarter of capacity.
        let mut shares = [[0.0; DOMAINS]; 2];
        let un = attribute(
            &E,
            1_000_000_000,
            SharePolicy::CpuCapacity { cpus: 4 },
            &[750_000_000, 250_000_000],
            &mut shares,
        );
        assert!(close(shares[0][0], 40.0 * 0.75 / 4.0));
        assert!(close(shares[1][0], 40.0 * 0.25 / 4.0));
        assert!(close(un[0], 30.0));
        assert!(close(un[3], 6.0));
        // Conservation in every domain.
        for d in 0..DOMAINS {
            assert!(close(shares[0][d] + shares[1][d] + un[d], E[d]));
        }
        // Ratio 3:1 kept.
        assert!(close(shares[0][3] / shares[1][3], 3.0));
    }

    #[test]
    fn cpu_time_beyond_capacity_is_not_over_charged() {
        // Clock skew: 2.1 s CPU reported in 1 s on 2 CPUs: everything is
        // shared, nothing negative.
        let mut shares = [[0.0; DOMAINS]; 2];
        let un = attribute(
            &E,
            1_000_000_000,
            SharePolicy::CpuCapacity { cpus: 2 },
            &[1_400_000_000, 700_000_000],
            &mut shares,
        );
        assert!(close(shares[0][0] + shares[1][0], 40.0));
        assert!(close(shares[0][0] / shares[1][0], 2.0));
        assert_eq!(un, [0.0; DOMAINS]);
    }

    #[test]
    fn profiled_threads_policy_shares_everything() {
        let mut shares = [[0.0; DOMAINS]; 3];
        let un = attribute(
            &E,
            1_000_000_000,
            SharePolicy::ProfiledThreads,
            &[30, 10, 0],
            &mut shares,
        );
        assert!(close(shares[0][0], 30.0));
        assert!(close(shares[1][0], 10.0));
        assert_eq!(shares[2], [0.0; DOMAINS]);
        assert_eq!(un, [0.0; DOMAINS]);
    }

    #[test]
    fn nobody_ran() {
        let mut shares = [[1.0; DOMAINS]; 2];
        for policy in [
            SharePolicy::ProfiledThreads,
            SharePolicy::CpuCapacity { cpus: 2 },
        ] {
            let wall = if policy == SharePolicy::ProfiledThreads {
                1_000
            } else {
                0
            };
            let un = attribute(&E, wall, policy, &[0, 0], &mut shares);
            assert_eq!(un, E);
            assert_eq!(shares, [[0.0; DOMAINS]; 2]);
        }
        // Wall time but no CPU under capacity policy: all unattributed too.
        let un = attribute(
            &E,
            10,
            SharePolicy::CpuCapacity { cpus: 2 },
            &[0, 0],
            &mut shares,
        );
        assert_eq!(un, E);
    }

    #[test]
    fn quantizer_carries_fractions() {
        let mut q = Quantizer::new();
        let mut total = 0u64;
        // 1000 steps of 0.4 uJ: 400 uJ in whole values, none lost.
        for _ in 0..1000 {
            total += q.values(&[0.4e-6, 0.0, 0.0, 0.0], 1e-6)[0];
        }
        assert!((399..=400).contains(&total), "{total}");
        assert_eq!(q.values(&[1.5, 0.0, 0.0, 0.0], 0.5), [3, 0, 0, 0]);
        assert_eq!(q.values(&[1.0; DOMAINS], 0.0), [0; DOMAINS]);
    }
}
