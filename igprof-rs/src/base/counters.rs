//! The counter registry: which counters exist, how each merges, and which
//! slot of a call-tree node holds it in this run.
//!
//! Every profiler module names its counters here (PERF_TICKS for the
//! sampling profiler; MEM_*, FD_*, MMAP_*, NRG_*, CALL_*, CALLS_TOTAL for the others). At start-up the
//! enabled modules [`enable`] their counters; each enabled counter gets a
//! slot index, and every node of every call tree is allocated with exactly
//! that many (ticks, value, peak) triples. The slot table is frozen before
//! the first tree exists ([`freeze`]).
//!
//! Must never: change slots after [`freeze`] (nodes already allocated would
//! be misread).

use core::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// How two threads' values of a counter combine at dump time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// ticks, value and peak add up (PERF_TICKS, MEM_TOTAL, FD_USED, NRG_*,
    /// CALL_*).
    Sum,
    /// ticks add; value and peak are maxima (MEM_MAX).
    Max,
    /// ticks and value add (what is live now); peak is the largest peak
    /// seen by any thread (MEM_LIVE, FD_LIVE).
    Live,
}

/// Every counter igprof-rs knows, in IgProf's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CounterId {
    PerfTicks = 0,
    MemTotal,
    MemMax,
    MemLive,
    FdUsed,
    FdLive,
    NrgPkg,
    NrgPp0,
    NrgPp1,
    NrgDram,
    /// igprof-rs: live per stack at the process's peak of live memory.
    MemLiveAtPeak,
    /// -ep/-ei/-eu: bytes of untouched pages at free.
    MemEmpty,
    /// -finst: calls of an instrumented function on this path.
    CallCount,
    /// -finst: nanoseconds spent in an instrumented function on this path,
    /// its instrumented callees' time excluded (self time, as IgProf).
    CallTime,
    /// -e and -c: the run's sampled and counted perf events, in the order
    /// given (their names are set at start-up: [`set_event_name`]).
    Event0,
    Event1,
    Event2,
    Event3,
    Event4,
    Event5,
    Event6,
    Event7,
    Event8,
    Event9,
    Event10,
    Event11,
    Event12,
    Event13,
    Event14,
    Event15,
    /// -pf: page faults per faulting stack, and the major ones.
    PageFaults,
    MajorFaults,
    /// -pf with -mp: page faults inside a live heap block, on the stack
    /// that allocated it.
    MemFaults,
    /// -oc: nanoseconds off the CPU per stack where the thread waited.
    OffCpuTime,
    /// -fp: calls of a hooked function from this stack.
    CallsTotal,
    /// -ibs and -ibs-fetch: AMD IBS samples per stack, and with -mp per
    /// allocating stack of the data they touched (modules/event/ibs.rs).
    IbsOps,
    IbsLoads,
    IbsStores,
    IbsDcMiss,
    IbsL2Miss,
    IbsDtlbMiss,
    IbsLoadLat,
    IbsTagToRet,
    IbsSrcCache,
    IbsSrcRemoteCache,
    IbsSrcDram,
    IbsRemoteNode,
    IbsFetches,
    IbsIcMiss,
    IbsItlbMiss,
    IbsFetchLat,
    IbsObjSamples,
    IbsObjLat,
    IbsObjMiss,
    IbsObjRemote,
    IbsObjHitm,
    /// -mm: anonymous mappings made per stack (calls, bytes), and the
    /// bytes of them still mapped.
    MmapTotal,
    MmapLive,
    /// -mp --marks: blocks allocated since the last mark and still live.
    MemLiveSinceMark,
}

pub const COUNT: usize = 59;

/// How many counters named at start-up a run may have (`-e` and `-c`).
pub const EVENTS: usize = 16;
/// The `i`-th counter named at start-up.
pub const EVENT_IDS: [CounterId; EVENTS] = [
    CounterId::Event0,
    CounterId::Event1,
    CounterId::Event2,
    CounterId::Event3,
    CounterId::Event4,
    CounterId::Event5,
    CounterId::Event6,
    CounterId::Event7,
    CounterId::Event8,
    CounterId::Event9,
    CounterId::Event10,
    CounterId::Event11,
    CounterId::Event12,
    CounterId::Event13,
    CounterId::Event14,
    CounterId::Event15,
];

#[derive(Clone, Copy)]
pub struct CounterDef {
    pub id: CounterId,
    pub name: &'static str,
    pub merge: Merge,
}

pub const ALL: [CounterDef; COUNT] = [
    CounterDef {
        id: CounterId::PerfTicks,
        name: "PERF_TICKS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MemTotal,
        name: "MEM_TOTAL",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MemMax,
        name: "MEM_MAX",
        merge: Merge::Max,
    },
    CounterDef {
        id: CounterId::MemLive,
        name: "MEM_LIVE",
        merge: Merge::Live,
    },
    CounterDef {
        id: CounterId::FdUsed,
        name: "FD_USED",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::FdLive,
        name: "FD_LIVE",
        merge: Merge::Live,
    },
    CounterDef {
        id: CounterId::NrgPkg,
        name: "NRG_PKG",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::NrgPp0,
        name: "NRG_PP0",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::NrgPp1,
        name: "NRG_PP1",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::NrgDram,
        name: "NRG_DRAM",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MemLiveAtPeak,
        name: "MEM_LIVE_AT_PEAK",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MemEmpty,
        name: "MEM_EMPTY",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::CallCount,
        name: "CALL_COUNT",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::CallTime,
        name: "CALL_TIME",
        merge: Merge::Sum,
    },
    event_def(CounterId::Event0),
    event_def(CounterId::Event1),
    event_def(CounterId::Event2),
    event_def(CounterId::Event3),
    event_def(CounterId::Event4),
    event_def(CounterId::Event5),
    event_def(CounterId::Event6),
    event_def(CounterId::Event7),
    event_def(CounterId::Event8),
    event_def(CounterId::Event9),
    event_def(CounterId::Event10),
    event_def(CounterId::Event11),
    event_def(CounterId::Event12),
    event_def(CounterId::Event13),
    event_def(CounterId::Event14),
    event_def(CounterId::Event15),
    CounterDef {
        id: CounterId::PageFaults,
        name: "PAGE_FAULTS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MajorFaults,
        name: "MAJOR_FAULTS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MemFaults,
        name: "MEM_FAULTS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::OffCpuTime,
        name: "OFFCPU_TIME",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::CallsTotal,
        name: "CALLS_TOTAL",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsOps,
        name: "IBS_OPS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsLoads,
        name: "IBS_LOADS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsStores,
        name: "IBS_STORES",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsDcMiss,
        name: "IBS_DC_MISS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsL2Miss,
        name: "IBS_L2_MISS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsDtlbMiss,
        name: "IBS_DTLB_MISS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsLoadLat,
        name: "IBS_LOAD_LAT",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsTagToRet,
        name: "IBS_TAG_TO_RET",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsSrcCache,
        name: "IBS_SRC_CACHE",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsSrcRemoteCache,
        name: "IBS_SRC_REMOTE_CACHE",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsSrcDram,
        name: "IBS_SRC_DRAM",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsRemoteNode,
        name: "IBS_REMOTE_NODE",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsFetches,
        name: "IBS_FETCHES",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsIcMiss,
        name: "IBS_IC_MISS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsItlbMiss,
        name: "IBS_ITLB_MISS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsFetchLat,
        name: "IBS_FETCH_LAT",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsObjSamples,
        name: "IBS_OBJ_SAMPLES",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsObjLat,
        name: "IBS_OBJ_LAT",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsObjMiss,
        name: "IBS_OBJ_MISS",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsObjRemote,
        name: "IBS_OBJ_REMOTE",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::IbsObjHitm,
        name: "IBS_OBJ_HITM",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MmapTotal,
        name: "MMAP_TOTAL",
        merge: Merge::Sum,
    },
    CounterDef {
        id: CounterId::MmapLive,
        name: "MMAP_LIVE",
        merge: Merge::Live,
    },
    CounterDef {
        id: CounterId::MemLiveSinceMark,
        name: "MEM_LIVE_SINCE_MARK",
        merge: Merge::Live,
    },
];

/// An event counter before its name is set.
const fn event_def(id: CounterId) -> CounterDef {
    CounterDef {
        id,
        name: "EV_UNNAMED",
        merge: Merge::Sum,
    }
}

/// Names of the `-e` counters, set at start-up.
static EVENT_NAMES: [std::sync::OnceLock<&'static str>; EVENTS] =
    [const { std::sync::OnceLock::new() }; EVENTS];

/// Names the `i`-th event's counter (start-up, before [`freeze`]; once).
pub fn set_event_name(i: usize, name: &'static str) {
    let _ = EVENT_NAMES[i].set(name);
}

const NONE: u8 = u8::MAX;

#[allow(clippy::declare_interior_mutable_const)]
const UNSET: AtomicU8 = AtomicU8::new(NONE);
static SLOT: [AtomicU8; COUNT] = [UNSET; COUNT];
/// Counter id of each slot, in slot order.
#[allow(clippy::declare_interior_mutable_const)]
const NOID: AtomicU8 = AtomicU8::new(NONE);
static ID_OF_SLOT: [AtomicU8; COUNT] = [NOID; COUNT];
static NSLOTS: AtomicUsize = AtomicUsize::new(0);
static FROZEN: AtomicBool = AtomicBool::new(false);

/// Gives `id` a slot (start-up only; idempotent). Returns false after freeze.
pub fn enable(id: CounterId) -> bool {
    if FROZEN.load(Ordering::Acquire) {
        return SLOT[id as usize].load(Ordering::Relaxed) != NONE;
    }
    if SLOT[id as usize].load(Ordering::Relaxed) == NONE {
        let n = NSLOTS.load(Ordering::Relaxed);
        SLOT[id as usize].store(n as u8, Ordering::Relaxed);
        ID_OF_SLOT[n].store(id as u8, Ordering::Relaxed);
        NSLOTS.store(n + 1, Ordering::Relaxed);
    }
    true
}

/// Fixes the slot table; nodes are allocated with [`nslots`] counters.
pub fn freeze() {
    FROZEN.store(true, Ordering::Release);
}

/// The slot of `id` in this run, if enabled.
#[inline]
pub fn slot(id: CounterId) -> Option<usize> {
    let s = SLOT[id as usize].load(Ordering::Relaxed);
    if s == NONE {
        None
    } else {
        Some(s as usize)
    }
}

/// How many counters each node carries.
#[inline]
pub fn nslots() -> usize {
    NSLOTS.load(Ordering::Relaxed)
}

/// The definition of the counter in `slot`.
pub fn def_of_slot(slot: usize) -> CounterDef {
    let id = ID_OF_SLOT[slot].load(Ordering::Relaxed) as usize;
    let mut d = ALL[id];
    if let Some(i) = EVENT_IDS.iter().position(|&e| e as usize == id) {
        d.name = EVENT_NAMES[i].get().copied().unwrap_or(d.name);
    }
    d
}

/// Serialises tests that reconfigure the global registry.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
pub(crate) fn reset_for_test() {
    for s in SLOT.iter() {
        s.store(NONE, Ordering::Relaxed);
    }
    NSLOTS.store(0, Ordering::Relaxed);
    FROZEN.store(false, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_consistent() {
        for (i, d) in ALL.iter().enumerate() {
            assert_eq!(d.id as usize, i, "{} is at its id", d.name);
        }
    }
}
