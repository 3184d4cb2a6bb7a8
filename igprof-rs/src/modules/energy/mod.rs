//! Energy readings (RAPL via the perf power PMU, powercap or MSRs) and their
//! attribution to the threads that spent them; the source and attribution
//! layer of the `-np` module.
//!
//! Owns: detecting an energy source at start-up ([`detect`]), reading its
//! counters cheaply from the sampling path ([`EnergyMeter::read_deltas`]),
//! and sharing each interval's energy among the profiled threads in
//! proportion to their CPU time ([`attribution`]). Does not own timers,
//! stacks, call trees or the dump: the runtime calls in here and charges
//! the numbers to the stacks it samples.
//!
//! Signal context: only [`EnergyMeter::read_deltas`], the functions of
//! [`attribution`] and the ledger's `close_*`, `take` and
//! `reset_after_fork` run there. They never allocate, lock,
//! print or panic on bad data; descriptors are opened and all state is
//! allocated by [`detect`] / [`ledger::Ledger::new`] at start-up.
//!
//! Units: counters are written in microjoules with `T=0.000001` in the
//! header when `-np` runs alone (see [`JOULES_PER_VALUE`]); IgProf's
//! analyser multiplies `NRG_*` values by `T`, so it shows Joules. When
//! `-pp` sets `T` to its tick period, `NRG_*` values count `T` Joules
//! ([`Ledger`] is built with that `T` and carries the fractions).
//!
//! Root: every file is looked up under a root directory, `/` unless the
//! environment variable [`root::ROOT_ENV`] (`IGPROF_ENERGY_ROOT`) names
//! another; tests build fake trees there.

pub mod attribution;
pub mod counter;
pub mod error;
pub mod glue;
pub mod ledger;
pub mod msr;
pub mod pmu;
pub mod powercap;
pub mod root;

pub use attribution::{attribute, Quantizer, SharePolicy};
pub use error::{NoSource, ReadError, SourceError, SourceKind};
pub use ledger::Ledger;
pub use root::{Fs, RealFs, Root, ROOT_ENV};

use counter::RawCounter;
use pmu::{FilePerf, PerfOpener, SyscallPerf};

/// Number of energy domains (and `NRG_*` counters).
pub const DOMAINS: usize = 4;

/// Joules per unit of an `NRG_*` counter value when `-np` alone sets the
/// header: values are microjoules and the header says `T=0.000001`. (IgProf
/// wrote raw RAPL counts with `T=0.000015` for 15.3 uJ steps; its `%f`
/// rounding made that 2% off. Microjoules print exactly with `%f`.)
pub const JOULES_PER_VALUE: f64 = 1e-6;

/// An energy domain and the counter it is written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Domain {
    /// Whole package (cores, caches, uncore, on-die graphics).
    Pkg = 0,
    /// Power plane 0: the cores.
    Pp0 = 1,
    /// Power plane 1: on-die graphics (client) / uncore.
    Pp1 = 2,
    /// Memory controller and DIMMs.
    Dram = 3,
}

impl Domain {
    pub const ALL: [Domain; DOMAINS] = [Domain::Pkg, Domain::Pp0, Domain::Pp1, Domain::Dram];

    /// Counter name in the dump.
    pub fn counter_name(self) -> &'static str {
        match self {
            Domain::Pkg => "NRG_PKG",
            Domain::Pp0 => "NRG_PP0",
            Domain::Pp1 => "NRG_PP1",
            Domain::Dram => "NRG_DRAM",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Joules per domain, indexed by [`Domain::index`].
pub type Energy = [f64; DOMAINS];

/// The detected source: open counters and their last readings. All state is
/// allocated here at start-up; reading allocates nothing.
#[derive(Debug)]
pub struct EnergyMeter {
    source: SourceKind,
    counters: Vec<RawCounter>,
    present: [bool; DOMAINS],
}

impl EnergyMeter {
    fn new(source: SourceKind, counters: Vec<RawCounter>) -> EnergyMeter {
        let mut present = [false; DOMAINS];
        for c in &counters {
            present[c.domain().index()] = true;
        }
        EnergyMeter {
            source,
            counters,
            present,
        }
    }

    pub fn source(&self) -> SourceKind {
        self.source
    }

    /// Which domains this source measures; the runtime defines `NRG_*`
    /// counters only for these.
    pub fn domains(&self) -> impl Iterator<Item = Domain> + '_ {
        Domain::ALL.into_iter().filter(|d| self.present[d.index()])
    }

    pub fn has(&self, d: Domain) -> bool {
        self.present[d.index()]
    }

    /// Number of raw counters read per call (packages x domains, plus one
    /// per core for AMD PP0 through MSRs): the cost of a read.
    pub fn counter_count(&self) -> usize {
        self.counters.len()
    }

    /// Move every counter's descriptor to numbers >= `min_fd` (as the
    /// runtime does with its own perf descriptors). Start-up only.
    pub fn relocate_fds(&mut self, min_fd: i32) -> std::io::Result<()> {
        self.counters
            .iter_mut()
            .try_for_each(|c| c.relocate(min_fd))
    }

    /// One line for the debug log: `powercap: NRG_PKG NRG_DRAM (2 counters)`.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.domains().map(Domain::counter_name).collect();
        format!(
            "{}: {} ({} counters)",
            self.source,
            names.join(" "),
            self.counters.len()
        )
    }

    /// Joules consumed per domain since the previous call (or since
    /// [`detect`]), summed over packages. Async-signal-safe: one `read` or
    /// `pread` per counter on descriptors opened at start, no allocation,
    /// errno preserved. On error `out` still holds what the other counters
    /// read; the failed counter keeps its previous reading, so its energy
    /// shows up in the next successful call instead of being lost.
    pub fn read_deltas(&mut self, out: &mut Energy) -> Result<(), ReadError> {
        // SAFETY: __errno_location returns this thread's errno slot.
        let errno_slot = unsafe { libc::__errno_location() };
        // SAFETY: the slot is valid for the life of the thread.
        let saved = unsafe { *errno_slot };
        *out = [0.0; DOMAINS];
        let mut first_err = None;
        for c in &mut self.counters {
            match c.delta_joules() {
                Ok(j) => out[c.domain().index()] += j,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        // SAFETY: as above.
        unsafe { *errno_slot = saved };
        first_err.map_or(Ok(()), Err)
    }
}

/// Try the sources in order (power PMU, powercap, msr) under `root`, opening
/// files through `fs` and perf counters through `perf`; the first that
/// yields at least one domain wins.
pub fn detect_with(
    root: &Root,
    fs: &dyn Fs,
    perf: &dyn PerfOpener,
) -> Result<EnergyMeter, NoSource> {
    let mut tried = Vec::with_capacity(3);
    match pmu::open(root, fs, perf) {
        Ok(c) => return Ok(EnergyMeter::new(SourceKind::PowerPmu, c)),
        Err(e) => tried.push((SourceKind::PowerPmu, e)),
    }
    match powercap::open(root, fs) {
        Ok(c) => return Ok(EnergyMeter::new(SourceKind::Powercap, c)),
        Err(e) => tried.push((SourceKind::Powercap, e)),
    }
    match msr::open(root, fs) {
        Ok(c) => return Ok(EnergyMeter::new(SourceKind::Msr, c)),
        Err(e) => tried.push((SourceKind::Msr, e)),
    }
    Err(NoSource { tried })
}

/// [`detect_with`] with real files: under `/`, perf counters come from
/// `perf_event_open`; under any other root (a test tree), from the files
/// [`pmu::FilePerf`] describes. Call once at start-up, outside signal
/// context; on `Err`, print the error's single line and run without `-np`.
pub fn detect(root: &Root) -> Result<EnergyMeter, NoSource> {
    if root.is_system() {
        detect_with(root, &RealFs, &SyscallPerf)
    } else {
        detect_with(root, &RealFs, &FilePerf { root, fs: &RealFs })
    }
}

/// Online CPUs under `root` (`/sys/devices/system/cpu/online`), else the
/// count `sysconf` reports: the capacity for [`SharePolicy::CpuCapacity`].
pub fn online_cpus(root: &Root) -> u32 {
    let listed = root::read_text(&RealFs, &root.join("/sys/devices/system/cpu/online"))
        .ok()
        .and_then(|t| root::parse_cpu_list(&t))
        .map_or(0, |c| c.len() as u32);
    if listed > 0 {
        return listed;
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as u32
    } else {
        1
    }
}

/// The default sharing: CPU capacity of the online CPUs under `root`.
pub fn default_policy(root: &Root) -> SharePolicy {
    SharePolicy::CpuCapacity {
        cpus: online_cpus(root),
    }
}

#[cfg(test)]
mod tests;
