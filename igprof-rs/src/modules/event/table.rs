//! The run's table of events: what each `-e`, `-pf`, `-oc` and `-ibs`
//! event is (its kind, period, and what a sample of it charges), set once
//! at start-up, and the facts read off an event's kind that the other
//! files share (the kind a specification opens as, which counter it
//! charges, what it opens as under fasync, whether it samples every
//! fault).
//!
//! Must never: open, read or close an event, or change the table after
//! [`EVENTS`] is set (the signal handler reads it without a lock).

use core::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::OnceLock;

use super::ibs;
use crate::base::counters;
use crate::sys::PerfEventKind;

/// Sampled events per run (-e, -pf, -oc): one bit each in a cookie's and
/// a thread's masks.
pub(super) const MAX_EVENTS: usize = 8;

/// The run's events, in cookie order (set before the counters freeze).
pub(super) static EVENTS: OnceLock<Vec<Event>> = OnceLock::new();
/// Counter slot of each event (after the freeze).
pub(super) static SLOTS: [AtomicUsize; MAX_EVENTS] =
    [const { AtomicUsize::new(usize::MAX) }; MAX_EVENTS];
/// Events not opened in this run (see `start`).
pub(super) static OFF: [AtomicBool; MAX_EVENTS] = [const { AtomicBool::new(false) }; MAX_EVENTS];

/// One `-e` event of the run.
pub(super) struct Event {
    /// The specification as given (the named profilers: their flag).
    pub(super) text: String,
    /// Its counter's name.
    pub(super) name: &'static str,
    pub(super) kind: PerfEventKind,
    /// Events per sample before the per-thread jitter; with `kind.freq`,
    /// samples per second.
    pub(super) period: u64,
    /// What a sample adds, and to which counter.
    pub(super) charge: Charge,
}

/// What one sample of an event records.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Charge {
    /// `-e`: (1, period) on the sampled stack, in the counter of this id.
    Sample(counters::CounterId),
    /// `-pf`: (1, 1) in PAGE_FAULTS on the faulting stack, and in
    /// MAJOR_FAULTS if the fault was major, and with -mp (1, 1) in
    /// MEM_FAULTS on the stack that allocated the large live block holding
    /// the faulting address.
    PageFault,
    /// `-oc`: (1, nanoseconds off the CPU since the thread's previous
    /// switch) in OFFCPU_TIME on the stack where it waited.
    OffCpu,
    /// `-ibs`, `-ibs-fetch`: each sample's IBS registers decoded and
    /// charged by `ibs::sample` (IBS_* counters).
    Ibs(ibs::Ibs),
}

impl Charge {
    pub(super) fn counter(self) -> counters::CounterId {
        match self {
            Charge::Sample(id) => id,
            Charge::PageFault => counters::CounterId::PageFaults,
            Charge::OffCpu => counters::CounterId::OffCpuTime,
            Charge::Ibs(i) if i.unit == igprof_events::ibs::Unit::Fetch => {
                counters::CounterId::IbsFetches
            }
            Charge::Ibs(_) => counters::CounterId::IbsOps,
        }
    }
}

pub(super) fn events() -> &'static [Event] {
    EVENTS.get().map_or(&[], |v| v.as_slice())
}

/// What event `ev` opens as when it signals through fasync. A fault event
/// sampled at every fault counts the faults that complete (`minor-faults`)
/// instead of every entry into the fault handler (`page-faults`): fasync
/// sends the signal at once, so it is pending while the kernel handles the
/// fault, and a fault that needs a retry (the vDSO's data page under
/// Linux 6.4+'s per-VMA locks) is then abandoned for the signal and taken
/// again, raising another signal: the program would loop there forever.
/// Major faults are then not sampled (-pf's MAJOR_FAULTS still counts
/// them).
pub(super) fn fasync_kind(ev: &Event) -> PerfEventKind {
    const SOFTWARE: u32 = 1;
    const PAGE_FAULTS: u64 = 2;
    const MINOR_FAULTS: u64 = 5;
    let mut k = ev.kind;
    if (k.type_, k.config) == (SOFTWARE, PAGE_FAULTS) && ev.period == 1 && !k.freq {
        k.config = MINOR_FAULTS;
    }
    k
}

/// Whether `e` samples every fault (-pf, or `-e page-faults`, `minor-faults`
/// or `major-faults` at period 1), whose late signals for the faults the
/// profiler's own handler took must be told apart (see `sample`).
pub(super) fn counts_each_fault(e: &Event) -> bool {
    e.charge == Charge::PageFault
        || (matches!(e.charge, Charge::Sample(_))
            && e.kind.type_ == 1
            && matches!(e.kind.config, 2 | 5 | 6)
            && e.period == 1
            && !e.kind.freq)
}

/// The kind a resolved event specification opens as (`-e`, `-c`): user
/// mode only unless its modifiers say, the events the kernel counts only
/// in kernel mode there; no `precise_ip` (a sampled event sets its own).
pub(super) fn kind_of(attr: &igprof_events::Attr) -> PerfEventKind {
    let kernel = if attr.levels_given {
        !attr.exclude_kernel
    } else {
        attr.counts_in_kernel_only()
    };
    PerfEventKind {
        type_: attr.type_,
        config: attr.config,
        config1: attr.config1,
        config2: attr.config2,
        precise_ip: 0,
        exclude_user: attr.levels_given && attr.exclude_user,
        exclude_kernel: !kernel,
        exclude_hv: !attr.levels_given || attr.exclude_hv,
        sample_addr: false,
        sample_raw: false,
        freq: false,
    }
}

/// Finds each event's counter slot (at start, after the counters freeze).
pub(super) fn init_slots() {
    for (i, e) in events().iter().enumerate() {
        if let Some(s) = counters::slot(e.charge.counter()) {
            SLOTS[i].store(s, core::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::counters::{CounterId, EVENT_IDS};

    const SOFTWARE: u32 = 1;
    const HARDWARE: u32 = 0;

    fn event(type_: u32, config: u64, period: u64, freq: bool, charge: Charge) -> Event {
        Event {
            text: String::new(),
            name: "",
            kind: PerfEventKind {
                type_,
                config,
                freq,
                ..PerfEventKind::default()
            },
            period,
            charge,
        }
    }

    fn ibs(unit: igprof_events::ibs::Unit) -> Charge {
        Charge::Ibs(ibs::Ibs {
            unit,
            encoding: igprof_events::ibs::Encoding::Legacy,
            source: ibs::Source::Ring,
        })
    }

    #[test]
    fn each_charge_names_its_counter() {
        assert_eq!(Charge::Sample(EVENT_IDS[3]).counter(), EVENT_IDS[3]);
        assert_eq!(Charge::PageFault.counter(), CounterId::PageFaults);
        assert_eq!(Charge::OffCpu.counter(), CounterId::OffCpuTime);
        assert_eq!(
            ibs(igprof_events::ibs::Unit::Fetch).counter(),
            CounterId::IbsFetches
        );
        assert_eq!(
            ibs(igprof_events::ibs::Unit::Op).counter(),
            CounterId::IbsOps
        );
    }

    #[test]
    fn fasync_samples_completed_faults_only_for_every_fault() {
        let s = Charge::Sample(EVENT_IDS[0]);
        // page-faults at every fault: minor-faults under fasync.
        assert_eq!(fasync_kind(&event(SOFTWARE, 2, 1, false, s)).config, 5);
        assert_eq!(
            fasync_kind(&event(SOFTWARE, 2, 1, false, Charge::PageFault)).config,
            5
        );
        // Any other period, a frequency, another event: as it is.
        assert_eq!(fasync_kind(&event(SOFTWARE, 2, 2, false, s)).config, 2);
        assert_eq!(fasync_kind(&event(SOFTWARE, 2, 1, true, s)).config, 2);
        assert_eq!(fasync_kind(&event(SOFTWARE, 6, 1, false, s)).config, 6);
        assert_eq!(fasync_kind(&event(HARDWARE, 2, 1, false, s)).config, 2);
        let e = event(SOFTWARE, 3, 1, false, s);
        assert_eq!(fasync_kind(&e), e.kind);
    }

    #[test]
    fn every_fault_events_are_told_apart() {
        let s = Charge::Sample(EVENT_IDS[0]);
        // -pf, whatever its kind says.
        assert!(counts_each_fault(&event(
            SOFTWARE,
            2,
            1,
            false,
            Charge::PageFault
        )));
        // page-faults, minor-faults, major-faults at period 1.
        for config in [2, 5, 6] {
            assert!(counts_each_fault(&event(SOFTWARE, config, 1, false, s)));
            assert!(!counts_each_fault(&event(SOFTWARE, config, 2, false, s)));
            assert!(!counts_each_fault(&event(SOFTWARE, config, 1, true, s)));
            assert!(!counts_each_fault(&event(HARDWARE, config, 1, false, s)));
        }
        // Context switches, -oc: not faults.
        assert!(!counts_each_fault(&event(SOFTWARE, 3, 1, false, s)));
        assert!(!counts_each_fault(&event(
            SOFTWARE,
            3,
            1,
            false,
            Charge::OffCpu
        )));
    }

    #[test]
    fn kinds_count_in_user_mode_unless_told() {
        let attr =
            |config, levels_given, exclude_user, exclude_kernel, exclude_hv| igprof_events::Attr {
                type_: SOFTWARE,
                config,
                config1: 7,
                config2: 9,
                precise_ip: 3,
                levels_given,
                exclude_user,
                exclude_kernel,
                exclude_hv,
            };
        // No modifiers: user mode only, no hypervisor.
        let k = kind_of(&attr(2, false, true, false, false));
        assert_eq!(
            k,
            PerfEventKind {
                type_: SOFTWARE,
                config: 2,
                config1: 7,
                config2: 9,
                exclude_kernel: true,
                exclude_hv: true,
                ..PerfEventKind::default()
            }
        );
        // No modifiers on an event the kernel counts only in kernel mode
        // (context switches): kernel mode.
        assert!(!kind_of(&attr(3, false, false, true, false)).exclude_kernel);
        // Modifiers (`:k`, `:u`, `:uk`) are taken as given.
        let k = kind_of(&attr(2, true, true, false, false));
        assert!(k.exclude_user && !k.exclude_kernel && !k.exclude_hv);
        let k = kind_of(&attr(3, true, false, true, true));
        assert!(!k.exclude_user && k.exclude_kernel && k.exclude_hv);
    }
}
