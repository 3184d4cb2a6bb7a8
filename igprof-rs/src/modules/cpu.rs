//! The CPU profiler (-pp, -pu, -pr) in the module registry: its counter
//! (PERF_TICKS), the start-up line's words, the profile header's tick.
//!
//! The sampling itself is the sampler layer's ([`crate::sampler`]): the
//! per-thread perf events and timers, the signal handler, what a sample is
//! worth. They serve every sample consumer (energy, `-e` events too), so
//! the runtime starts and stops them whenever
//! [`Options::needs_timers`](crate::base::options::Options::needs_timers),
//! not through this module.
//!
//! Must never: sample, handle a signal, or start a thread's sampler itself.

use crate::base::counters::{self, CounterId};
use crate::base::options::{self, PerfClock};

/// Enables PERF_TICKS if a perf clock is selected (before counters freeze).
fn register_counters() {
    if options::get().perf.is_some() {
        counters::enable(CounterId::PerfTicks);
    }
}

/// After counters are frozen: the sampler charges its ticks to PERF_TICKS.
fn init_slots() {
    if let Some(s) = counters::slot(CounterId::PerfTicks) {
        crate::sampler::set_tick_slot(s);
    }
}

/// The CPU profiler in the module registry: PERF_TICKS, the header's
/// tick, the start-up line's first words.
pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe: describe_cpu,
    register_counters: |_| register_counters(),
    start: |_| {
        init_slots();
        Ok(())
    },
    header_tick: Some(|o| o.interval_ns as f64 / 1e9),
    ..crate::modules::Module::new("-pp", |o| o.perf.is_some())
};

fn describe_cpu(o: &options::Options) -> Option<String> {
    let (flag, what) = match o.perf? {
        PerfClock::Cpu => ("-pp", "CPU time"),
        PerfClock::User => ("-pu", "user CPU time"),
        PerfClock::Real => ("-pr", "wall-clock time"),
    };
    let iv = o.interval_ns;
    let ivs = if iv.is_multiple_of(1_000_000) {
        format!("{}ms", iv / 1_000_000)
    } else {
        format!("{}us", iv / 1000)
    };
    Some(format!("{flag} {what} every {ivs} per thread"))
}
