//! AMD Instruction-Based Sampling (`-ibs`, `-ibs-fetch`): each sample
//! charged to a call stack whose leaf is the sampled instruction, and,
//! with exact `-mp`, the data an op touched charged to whoever owns it.
//!
//! An IBS event is one of the per-thread events of this module's parent
//! (same opening, jitter, fork and exec handling), with two differences:
//! its samples carry the IBS registers as raw data (`PERF_SAMPLE_RAW`),
//! which only the event's ring buffer holds, so each thread's IBS event
//! has a ring ([`RING_BYTES`]) that its SIGTRAP handler drains
//! (`super::ring`); and its period is a multiple of 16 (the IBS counter's
//! low bits are not programmable).
//!
//! A sample's stack: IbsOpRip (or the fetch address) is the leaf, the
//! callers are those of the stack the interrupt found, unwound in the
//! thread (`sampler::interrupted_node_at`). The interrupt comes some
//! instructions after the sampled op retired (the NMI's latency); when it
//! lands in the same function the stack is exact, when the op's function
//! has returned or called another meanwhile, the leaf is the op's
//! instruction under the callers of the interrupted one.
//!
//! Counters (ticks: samples; value as said):
//! - op samples, on the sampled stack: IBS_OPS (value: the period, cycles
//!   or with `cnt_ctl` dispatched ops), IBS_LOADS, IBS_STORES, IBS_DC_MISS,
//!   IBS_L2_MISS, IBS_DTLB_MISS (L1 DTLB), IBS_LOAD_LAT (value: the cycles
//!   missed loads waited, IbsDcMissLat), IBS_TAG_TO_RET (value: cycles from
//!   tag to retire), IBS_SRC_CACHE / IBS_SRC_REMOTE_CACHE / IBS_SRC_DRAM
//!   (where a missed load's data came from), IBS_REMOTE_NODE (from another
//!   NUMA node);
//! - fetch samples: IBS_FETCHES (value: the period), IBS_IC_MISS,
//!   IBS_ITLB_MISS, IBS_FETCH_LAT (value: cycles, completed fetches);
//! - data objects, for ops that load or store at a valid address, with
//!   exact -mp: IBS_OBJ_SAMPLES, IBS_OBJ_LAT (value: miss latency),
//!   IBS_OBJ_MISS, IBS_OBJ_REMOTE, IBS_OBJ_HITM (a load served by a line
//!   modified in another core's cache: the false-sharing hint), on the
//!   stack that allocated the live heap block holding the address; on a
//!   synthetic top-level `<stack>` for the sampled thread's own stack,
//!   `<data> SYMBOL` for a data symbol of a loaded object, `<unknown>`
//!   otherwise (another thread's stack, anonymous mappings, stripped data).
//!
//! A test seam stands in for the hardware, which this project's CI does not
//! have: with `IGPROF_IBS_TEST_RECORDS=SYMBOL` in the environment, `-ibs`
//! samples on a per-thread task-clock event (its period in nanoseconds)
//! and takes each sample's raw data from the program's exported SYMBOL (a
//! u32 size, then the data as the kernel's `PERF_SAMPLE_RAW` field holds
//! it), through the same decoding and charging as the ring's samples.
//!
//! Must never: allocate or lock in the signal path ([`sample`]), except
//! the live table's and span index's spin locks, which the interrupted
//! thread does not hold (samples in profiler code are not charged).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use igprof_events::ibs::{self, Encoding, Unit};

use crate::base::counters::{self, CounterId};
use crate::base::options::Options;
use crate::base::thread::{Guard, ThreadState};
use crate::base::tree::Node;
use crate::sampler;
use crate::sys::{self, PerfEventKind, PerfRights};

/// The ring of a thread's IBS event: control page and 8 data pages (32
/// KiB, some 300 samples between two reads).
pub(super) const RING_BYTES: usize = 9 * 4096;
/// The environment variable of the test seam (module docs).
pub const TEST_RECORDS_ENV: &str = "IGPROF_IBS_TEST_RECORDS";

/// Where a run's IBS samples come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// The event's ring buffer: the hardware's samples.
    Ring,
    /// The test seam: a raw record the program keeps at this address.
    Program(usize),
}

/// What an IBS event of the run samples, and how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ibs {
    pub unit: Unit,
    pub encoding: Encoding,
    pub source: Source,
}

/// One IBS event the run will open (see `super::setup::register_counters`).
pub(super) struct Plan {
    pub text: String,
    pub kind: PerfEventKind,
    pub period: u64,
    pub ibs: Ibs,
}

/// The counters of op samples, fetch samples and data objects, in the
/// order of [`SLOTS`].
const OP: [CounterId; 12] = [
    CounterId::IbsOps,
    CounterId::IbsLoads,
    CounterId::IbsStores,
    CounterId::IbsDcMiss,
    CounterId::IbsL2Miss,
    CounterId::IbsDtlbMiss,
    CounterId::IbsLoadLat,
    CounterId::IbsTagToRet,
    CounterId::IbsSrcCache,
    CounterId::IbsSrcRemoteCache,
    CounterId::IbsSrcDram,
    CounterId::IbsRemoteNode,
];
const FETCH: [CounterId; 4] = [
    CounterId::IbsFetches,
    CounterId::IbsIcMiss,
    CounterId::IbsItlbMiss,
    CounterId::IbsFetchLat,
];
const OBJ: [CounterId; 5] = [
    CounterId::IbsObjSamples,
    CounterId::IbsObjLat,
    CounterId::IbsObjMiss,
    CounterId::IbsObjRemote,
    CounterId::IbsObjHitm,
];
const ALL: usize = OP.len() + FETCH.len() + OBJ.len();

/// Each counter's slot (usize::MAX: not recorded), by [`CounterId`] order
/// from `IbsOps`.
static SLOTS: [AtomicUsize; ALL] = [const { AtomicUsize::new(usize::MAX) }; ALL];
/// Samples whose raw data was short, marked invalid, or lost by the kernel
/// (ring full), and records too large to read.
static BAD: AtomicU64 = AtomicU64::new(0);
static INVALID: AtomicU64 = AtomicU64::new(0);
static LOST: AtomicU64 = AtomicU64::new(0);

fn index(id: CounterId) -> usize {
    id as usize - CounterId::IbsOps as usize
}

/// The plans of the run's `-ibs` options; each one that cannot run says
/// why in one line. Start-up, main thread.
pub(super) fn plans(o: &Options) -> Vec<Plan> {
    let mut v = Vec::new();
    let seam = std::env::var(TEST_RECORDS_ENV)
        .ok()
        .filter(|s| !s.is_empty());
    for word in o.ibs_requests() {
        let req = match ibs::parse_request(word) {
            Ok(r) => r,
            Err(why) => {
                crate::igprof_log!("{why}; running without it");
                continue;
            }
        };
        if v.iter().any(|p: &Plan| p.ibs.unit == req.unit) {
            crate::igprof_log!(
                "{word}: {} given twice; running without the second",
                req.unit.flag()
            );
            continue;
        }
        let plan = match &seam {
            Some(symbol) => seam_plan(word, &req, symbol),
            None => hardware_plan(word, &req, Path::new(igprof_events::DEVICES), &cpu_vendor()),
        };
        match plan {
            Ok(p) => v.push(p),
            Err(why) => crate::igprof_log!("{word}: {why}; running without it"),
        }
    }
    v
}

/// The test seam's plan: a task-clock event, records from `symbol`.
fn seam_plan(word: &str, req: &ibs::Request, symbol: &str) -> Result<Plan, String> {
    let name =
        std::ffi::CString::new(symbol).map_err(|_| format!("{TEST_RECORDS_ENV}: bad name"))?;
    // SAFETY: dlsym with a NUL-terminated name in the global scope.
    let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    if addr == 0 {
        return Err(format!(
            "{TEST_RECORDS_ENV} names '{symbol}', which the program does not export (link it with -rdynamic)"
        ));
    }
    const SOFTWARE: u32 = 1;
    const TASK_CLOCK: u64 = 1;
    Ok(Plan {
        text: format!(
            "{word} (test records from {symbol}, every {} ns of task-clock)",
            req.period
        ),
        kind: PerfEventKind {
            type_: SOFTWARE,
            config: TASK_CLOCK,
            exclude_kernel: true,
            exclude_hv: true,
            ..PerfEventKind::default()
        },
        period: req.period,
        ibs: Ibs {
            unit: req.unit,
            encoding: Encoding::Legacy,
            source: Source::Program(addr),
        },
    })
}

/// The hardware plan of `req` on a machine whose PMUs `devices`
/// describes; `vendor` is /proc/cpuinfo's vendor_id, for the message when
/// there is no IBS. The event is not opened yet.
fn hardware_plan(
    word: &str,
    req: &ibs::Request,
    devices: &Path,
    vendor: &str,
) -> Result<Plan, String> {
    let pmu = match ibs::discover(devices, req) {
        Ok(p) => p,
        Err(ibs::Missing::NoPmu) => {
            return Err(format!(
                "no AMD IBS on this machine ({} does not exist{}): IBS needs an AMD CPU of family 10h or later, and in a virtual machine a hypervisor that passes it through",
                devices.join(req.unit.pmu()).display(),
                if vendor.is_empty() { String::new() } else { format!("; the CPU is {vendor}") }
            ))
        }
        Err(ibs::Missing::NoTerm(t)) => {
            return Err(format!(
                "this kernel's {} PMU has no '{t}' (see {}/format; ldlat needs Zen 5 and Linux 6.14+)",
                req.unit.pmu(),
                devices.join(req.unit.pmu()).display()
            ))
        }
    };
    let spec = igprof_events::parse(&req.spec(pmu.swfilt)).map_err(|e| e.to_string())?;
    let attr = igprof_events::resolve(&spec, devices).map_err(|e| e.to_string())?;
    Ok(Plan {
        text: word.to_string(),
        kind: PerfEventKind {
            type_: attr.type_,
            config: attr.config,
            config1: attr.config1,
            config2: attr.config2,
            // With swfilt the kernel drops kernel-mode samples itself, which
            // perf_event_paranoid 2 allows; without it IBS cannot exclude
            // a privilege level at all.
            exclude_kernel: pmu.swfilt,
            sample_raw: true,
            ..PerfEventKind::default()
        },
        period: req.period,
        ibs: Ibs {
            unit: req.unit,
            encoding: pmu.encoding,
            source: Source::Ring,
        },
    })
}

/// Why an IBS event did not open (errno `e`), and what would allow it,
/// for a process with `rights`.
pub(super) fn refusal(e: i32, kind: &PerfEventKind, rights: &PerfRights) -> String {
    match e {
        libc::EACCES | libc::EPERM if !kind.exclude_kernel && rights.refused_kernel_mode(e) => {
            "refused: this kernel has no IBS software filter (swfilt, Linux 6.14+) to sample user mode only, and perf_event_paranoid 2 allows kernel mode only with CAP_PERFMON (or sysctl kernel.perf_event_paranoid=1)".into()
        }
        libc::ENOENT | libc::EINVAL | libc::EOPNOTSUPP => format!(
            "the kernel refused a per-thread IBS event (errno {e}): per-thread IBS needs Linux 6.2+ (before, only system-wide IBS, which needs CAP_PERFMON)"
        ),
        _ => sys::perf_open_refusal(e, !kind.exclude_kernel, rights),
    }
}

/// /proc/cpuinfo's vendor_id ("" if unreadable).
fn cpu_vendor() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("vendor_id")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default()
}

/// Enables the counters of the run's IBS units (before the freeze).
pub(super) fn register(plans: &[Plan], o: &Options) {
    for p in plans {
        let ids: &[CounterId] = match p.ibs.unit {
            Unit::Op => &OP,
            Unit::Fetch => &FETCH,
        };
        for &id in ids {
            counters::enable(id);
        }
        if p.ibs.unit == Unit::Op && o.ibs_objects() {
            for id in OBJ {
                counters::enable(id);
            }
        }
    }
}

/// Learns the slots (after the freeze); maps the data-object table when
/// objects are recorded.
pub(super) fn init_slots() {
    for id in OP.iter().chain(&FETCH).chain(&OBJ) {
        if let Some(s) = counters::slot(*id) {
            SLOTS[index(*id)].store(s, Ordering::Relaxed);
        }
    }
    if slot(CounterId::IbsObjSamples).is_some() {
        data::enable();
    }
}

fn slot(id: CounterId) -> Option<usize> {
    let s = SLOTS[index(id)].load(Ordering::Relaxed);
    (s != usize::MAX).then_some(s)
}

/// Adds (ticks, value) to counter `id` of `node` (the thread's own tree).
fn add(node: &Node, id: CounterId, ticks: u64, value: u64) {
    if let Some(s) = slot(id) {
        node.counter(s).add(ticks, value);
    }
}

/// One signal of an IBS event (signal context, with the thread's guard): every sample
/// since the previous one. `ring`: the event's ring and its size.
/// Returns how many samples were charged.
pub(super) fn sample(
    g: &Guard,
    uc: *mut libc::c_void,
    ibs: Ibs,
    ring: Option<(usize, usize)>,
    period: u64,
) -> u64 {
    let mut charged = 0;
    match ibs.source {
        Source::Ring => {
            let Some((base, bytes)) = ring else { return 0 };
            // SAFETY: the thread's own ring (open_one), read only here.
            let skipped = unsafe {
                super::ring::drain(base, bytes, |kind, body| match kind {
                    super::ring::RECORD_SAMPLE => match super::ring::raw_of_sample(body) {
                        Some(raw) => charged += charge(g, uc, raw, ibs, period) as u64,
                        None => {
                            BAD.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    super::ring::RECORD_LOST => {
                        LOST.fetch_add(super::ring::lost_of(body), Ordering::Relaxed);
                    }
                    _ => {}
                })
            };
            BAD.fetch_add(skipped, Ordering::Relaxed);
        }
        Source::Program(addr) => {
            let mut buf = [0u8; 128];
            // SAFETY: the program's exported record (seam_plan found it):
            // a u32 size, then up to 124 bytes, read as plain bytes.
            let n = unsafe {
                let size = (addr as *const u32).read_volatile() as usize;
                let n = size.min(buf.len() - 4);
                for (k, b) in buf[..n].iter_mut().enumerate() {
                    *b = ((addr + 4 + k) as *const u8).read_volatile();
                }
                n
            };
            charged += charge(g, uc, &buf[..n], ibs, period) as u64;
        }
    }
    charged
}

/// Decodes one sample's raw data and charges it; false if it says nothing.
fn charge(g: &Guard, uc: *mut libc::c_void, raw: &[u8], ibs: Ibs, period: u64) -> bool {
    let t = g.state();
    match ibs.unit {
        Unit::Op => {
            let Some(regs) = ibs::op_from_raw(raw) else {
                BAD.fetch_add(1, Ordering::Relaxed);
                return false;
            };
            let Some(op) = ibs::decode_op(&regs, ibs.encoding) else {
                INVALID.fetch_add(1, Ordering::Relaxed);
                return false;
            };
            // SAFETY: the kernel's context for this signal (our caller's).
            let node = unsafe { sampler::interrupted_node_at(g, uc, op.rip.map(|r| r as usize)) };
            // SAFETY: a node of this thread's tree, or null.
            if let Some(n) = unsafe { node.as_ref() } {
                charge_op(n, &op, period);
            }
            if let (Some(a), true) = (op.data_address, op.load || op.store) {
                charge_object(t, a as usize, &op);
            }
            true
        }
        Unit::Fetch => {
            let Some(regs) = ibs::fetch_from_raw(raw) else {
                BAD.fetch_add(1, Ordering::Relaxed);
                return false;
            };
            let Some(f) = ibs::decode_fetch(&regs) else {
                INVALID.fetch_add(1, Ordering::Relaxed);
                return false;
            };
            // SAFETY: as above.
            let node = unsafe { sampler::interrupted_node_at(g, uc, Some(f.address as usize)) };
            // SAFETY: as above.
            if let Some(n) = unsafe { node.as_ref() } {
                add(n, CounterId::IbsFetches, 1, period);
                if f.completed {
                    add(n, CounterId::IbsFetchLat, 1, f.latency as u64);
                }
                if f.ic_miss {
                    add(n, CounterId::IbsIcMiss, 1, 1);
                }
                if f.itlb_l1_miss {
                    add(n, CounterId::IbsItlbMiss, 1, 1);
                }
            }
            true
        }
    }
}

/// An op sample's counters on its stack.
fn charge_op(n: &Node, op: &ibs::Op, period: u64) {
    use ibs::DataSource as D;
    add(n, CounterId::IbsOps, 1, period);
    add(n, CounterId::IbsTagToRet, 1, op.tag_to_retire as u64);
    for (yes, id) in [
        (op.load, CounterId::IbsLoads),
        (op.store, CounterId::IbsStores),
        (op.dc_miss, CounterId::IbsDcMiss),
        (op.l2_miss, CounterId::IbsL2Miss),
        (op.dtlb_l1_miss, CounterId::IbsDtlbMiss),
        (op.remote_node, CounterId::IbsRemoteNode),
    ] {
        if yes {
            add(n, id, 1, 1);
        }
    }
    if let Some(l) = op.miss_latency {
        add(n, CounterId::IbsLoadLat, 1, l as u64);
    }
    let source = match op.source {
        Some(D::LocalCache | D::NearCache) => Some(CounterId::IbsSrcCache),
        Some(D::RemoteCache) => Some(CounterId::IbsSrcRemoteCache),
        Some(D::Dram) => Some(CounterId::IbsSrcDram),
        _ => None,
    };
    if let Some(id) = source {
        add(n, id, 1, 1);
    }
}

/// (ticks, value) of each data-object counter for one op.
fn object_values(op: &ibs::Op) -> [(u64, u64); OBJ.len()] {
    let remote = op.remote_node || op.source.is_some_and(|s| s.is_remote());
    [
        (1, 1),
        op.miss_latency.map_or((0, 0), |l| (1, l as u64)),
        if op.dc_miss { (1, 1) } else { (0, 0) },
        if remote { (1, 1) } else { (0, 0) },
        if op.hitm { (1, 1) } else { (0, 0) },
    ]
}

/// Charges the data an op touched at `addr` to its owner (module docs).
fn charge_object(t: &ThreadState, addr: usize, op: &ibs::Op) {
    if slot(CounterId::IbsObjSamples).is_none() {
        return;
    }
    let values = object_values(op);
    if let Some(node) = crate::modules::mem::account::block_holding(addr) {
        // SAFETY: nodes are never freed.
        let node = unsafe { &*node };
        for (id, (ticks, value)) in OBJ.iter().zip(values) {
            if let (Some(s), true) = (slot(*id), ticks > 0) {
                node.counter(s).add_shared(ticks, value);
            }
        }
        return;
    }
    let b = *t.bounds;
    let on = |(lo, hi): (usize, usize)| lo <= addr && addr < hi;
    if on(b.stack) || on(b.altstack) {
        data::STACK.add(values);
    } else {
        data::record(addr, values);
    }
}

/// In a forked child: the parent's samples are the parent's.
pub(super) fn reset() {
    data::reset();
}

/// The synthetic top-level functions of data objects outside the heap
/// (dump time): `<stack>`, `<data> SYMBOL`, `<unknown>`.
pub(super) fn synthetic(f: &mut dyn FnMut(&'static str, usize, u64, u64)) {
    let mut named: HashMap<String, [(u64, u64); OBJ.len()]> = HashMap::new();
    let mut put = |name: String, v: [(u64, u64); OBJ.len()]| {
        let e = named.entry(name).or_insert([(0, 0); OBJ.len()]);
        for (a, b) in e.iter_mut().zip(v) {
            a.0 += b.0;
            a.1 += b.1;
        }
    };
    put("<stack>".into(), data::STACK.get());
    put("<unknown>".into(), data::UNKNOWN.get());
    // Read (every loaded object's symbol table) only when a data address
    // was sampled: an -e run without IBS has none.
    let mut symbols = None;
    data::for_each(|addr, v| {
        let symbols = symbols.get_or_insert_with(trampoline::data_symbols);
        let name = match symbols.at(addr as u64) {
            Some(s) => format!("<data> {s}"),
            None => "<unknown>".into(),
        };
        put(name, v);
    });
    for (name, v) in named {
        let name = leak(name);
        for (id, (ticks, value)) in OBJ.iter().zip(v) {
            if let (Some(s), true) = (slot(*id), ticks > 0) {
                f(name, s, ticks, value);
            }
        }
    }
}

/// A name that lives as long as the process (each distinct one once).
fn leak(name: String) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut v = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = v.iter().find(|n| **n == name) {
        return n;
    }
    let n: &'static str = Box::leak(name.into_boxed_str());
    v.push(n);
    n
}

/// `-d`: what the IBS events did.
pub(super) fn report() {
    crate::igprof_log!(
        "ibs: {} samples marked invalid, {} with short raw data, {} lost by the kernel (ring full); {} data addresses charged to <unknown> for want of room",
        INVALID.load(Ordering::Relaxed),
        BAD.load(Ordering::Relaxed),
        LOST.load(Ordering::Relaxed),
        data::OVERFLOW.load(Ordering::Relaxed)
    );
}

/// Data-object accumulators outside the heap: the sampled thread's stack,
/// addresses that found no room, and a table of the other addresses
/// (named at dump time, when symbols can be read).
mod data {
    use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::OBJ;

    /// (ticks, value) per data-object counter.
    pub struct Acc([AtomicU64; 2 * OBJ.len()]);

    impl Acc {
        pub const fn new() -> Acc {
            Acc([const { AtomicU64::new(0) }; 2 * OBJ.len()])
        }
        pub fn add(&self, v: [(u64, u64); OBJ.len()]) {
            for (k, (t, x)) in v.into_iter().enumerate() {
                self.0[2 * k].fetch_add(t, Ordering::Relaxed);
                self.0[2 * k + 1].fetch_add(x, Ordering::Relaxed);
            }
        }
        pub fn get(&self) -> [(u64, u64); OBJ.len()] {
            core::array::from_fn(|k| {
                (
                    self.0[2 * k].load(Ordering::Relaxed),
                    self.0[2 * k + 1].load(Ordering::Relaxed),
                )
            })
        }
        fn clear(&self) {
            self.0.iter().for_each(|a| a.store(0, Ordering::Relaxed));
        }
    }

    pub static STACK: Acc = Acc::new();
    pub static UNKNOWN: Acc = Acc::new();
    /// Addresses that found no room in the table (charged to UNKNOWN).
    pub static OVERFLOW: AtomicU64 = AtomicU64::new(0);

    #[repr(C)]
    struct Entry {
        /// The address (8-byte aligned; 0: free).
        addr: AtomicUsize,
        acc: Acc,
    }

    const ENTRIES: usize = 1 << 14;
    /// Entries looked at before an address counts as having no room.
    const PROBES: usize = 64;
    static TABLE: AtomicUsize = AtomicUsize::new(0);

    /// Maps the table (start-up).
    pub fn enable() {
        let p = crate::sys::mmap_anon(ENTRIES * core::mem::size_of::<Entry>());
        TABLE.store(p as usize, Ordering::Release);
    }

    fn entries() -> &'static [Entry] {
        let p = TABLE.load(Ordering::Acquire);
        if p == 0 {
            return &[];
        }
        // SAFETY: a zero-filled mapping of ENTRIES entries (all atomics 0),
        // never unmapped.
        unsafe { core::slice::from_raw_parts(p as *const Entry, ENTRIES) }
    }

    /// Adds `v` to the entry of `addr` (signal context: atomics only).
    pub fn record(addr: usize, v: [(u64, u64); OBJ.len()]) {
        let key = (addr & !7).max(8);
        let all = entries();
        if all.is_empty() {
            UNKNOWN.add(v);
            return;
        }
        let h = (key >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
        for k in 0..PROBES {
            let e = &all[(h + k) & (ENTRIES - 1)];
            let a = e.addr.load(Ordering::Acquire);
            let mine = a == key
                || (a == 0
                    && match e
                        .addr
                        .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(_) => true,
                        Err(other) => other == key,
                    });
            if mine {
                e.acc.add(v);
                return;
            }
        }
        OVERFLOW.fetch_add(1, Ordering::Relaxed);
        UNKNOWN.add(v);
    }

    /// Calls `f` with each address recorded and its values.
    pub fn for_each(mut f: impl FnMut(usize, [(u64, u64); OBJ.len()])) {
        for e in entries() {
            let a = e.addr.load(Ordering::Acquire);
            if a != 0 {
                f(a, e.acc.get());
            }
        }
    }

    /// Forgets everything (a forked child, its only thread running).
    pub fn reset() {
        STACK.clear();
        UNKNOWN.clear();
        for e in entries() {
            e.addr.store(0, Ordering::Relaxed);
            e.acc.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorded sysfs tree of `machine`, in the events crate. These
    /// sources are also built by bench/unwind-bench, whose manifest
    /// directory is deeper: the workspace root is the nearest ancestor
    /// that holds the trees.
    fn tree(machine: &str) -> std::path::PathBuf {
        let trees = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|a| a.join("events/tests/sysfs"))
            .find(|t| t.is_dir())
            .expect("events/tests/sysfs above the crate's manifest directory");
        trees.join(machine)
    }

    /// A process without CAP_PERFMON at perf_event_paranoid `paranoid`.
    fn rights(paranoid: &str) -> PerfRights {
        PerfRights {
            paranoid: paranoid.into(),
            perfmon: false,
        }
    }

    fn plan(word: &str, machine: &str, vendor: &str) -> Result<Plan, String> {
        hardware_plan(
            word,
            &ibs::parse_request(word).unwrap(),
            &tree(machine),
            vendor,
        )
    }

    #[test]
    fn no_ibs_pmu_is_said_with_the_cpu_it_is() {
        let e = plan("-ibs", "intel", "GenuineIntel").err().unwrap();
        assert!(e.starts_with("no AMD IBS on this machine ("), "{e}");
        assert!(
            e.contains("intel/ibs_op does not exist; the CPU is GenuineIntel"),
            "{e}"
        );
        assert!(e.contains("a hypervisor that passes it through"), "{e}");
    }

    #[test]
    fn a_kernel_with_swfilt_samples_user_mode_only() {
        let p = plan("-ibs:ldlat=256/200000", "amd-zen5", "AuthenticAMD").unwrap();
        assert_eq!((p.kind.type_, p.kind.config1, p.kind.config2), (11, 256, 1));
        assert!(p.kind.exclude_kernel && p.kind.sample_raw && !p.kind.exclude_user);
        assert_eq!(p.period, 200_000);
        assert_eq!(p.ibs.encoding, Encoding::Extended);
        assert_eq!(p.ibs.source, Source::Ring);
        // Refused even so: the paranoid level is said.
        let e = refusal(libc::EACCES, &p.kind, &rights("3"));
        assert!(e.contains("perf_event_paranoid 3 allows none"), "{e}");
    }

    #[test]
    fn a_kernel_without_swfilt_needs_kernel_sampling() {
        let p = plan("-ibs:cnt_ctl", "amd", "AuthenticAMD").unwrap();
        assert_eq!(p.kind.config, 1 << 19);
        assert_eq!(p.kind.config2, 0);
        assert!(!p.kind.exclude_kernel);
        assert_eq!(p.ibs.encoding, Encoding::Legacy);
        let e = refusal(libc::EACCES, &p.kind, &rights("2"));
        assert!(
            e.contains("no IBS software filter (swfilt, Linux 6.14+)"),
            "{e}"
        );
        assert!(
            e.contains("perf_event_paranoid 2 allows kernel mode only with CAP_PERFMON"),
            "{e}"
        );
        // A kernel before per-thread IBS.
        let e = refusal(libc::ENOENT, &p.kind, &rights("-1"));
        assert!(e.contains("per-thread IBS needs Linux 6.2+"), "{e}");
        // A term this PMU does not have.
        let e = plan("-ibs:ldlat=128", "amd", "AuthenticAMD").err().unwrap();
        assert!(e.contains("has no 'ldlat'"), "{e}");
        let p = plan("-ibs-fetch:rand_en", "amd", "AuthenticAMD").unwrap();
        assert_eq!(
            (p.kind.type_, p.kind.config, p.ibs.unit),
            (10, 1 << 57, Unit::Fetch)
        );
    }

    #[test]
    fn object_values_follow_the_op() {
        let regs = ibs::OpRegs {
            ctl: 1 << 18,
            // ld_op, dc_miss, dc_lin_addr_valid, dc_miss_lat 300.
            data3: 1 | 1 << 7 | 1 << 17 | 300 << 32,
            // Remote cache (legacy 4), cache_hit_st 0: modified (HitM).
            data2: 4,
            dc_lin_ad: 0x1000,
            ..Default::default()
        };
        let op = ibs::decode_op(&regs, Encoding::Legacy).unwrap();
        assert_eq!(
            object_values(&op),
            [(1, 1), (1, 300), (1, 1), (1, 1), (1, 1)]
        );
        let regs = ibs::OpRegs {
            data3: 1 << 1 | 1 << 17,
            data2: 0,
            ..regs
        };
        let op = ibs::decode_op(&regs, Encoding::Legacy).unwrap();
        assert_eq!(object_values(&op), [(1, 1), (0, 0), (0, 0), (0, 0), (0, 0)]);
    }
}
