//! The perf-event profiler (`-e EVENT[/PERIOD]`): any event the kernel
//! can count for a thread, sampled on every thread, each sample charged to
//! the stack it interrupted under a counter named after the event.
//!
//! At start-up each specification is parsed and resolved against the PMUs
//! in sysfs (crate `igprof-events`: generic hardware, software and cache
//! events, `pmu/terms/`, `rNNNN`) and opened once on the main thread as a
//! trial: an event this machine cannot open (no such PMU event, a PMU that
//! cannot sample, `perf_event_paranoid`) is named in one `igprof:` line
//! with the reason and what would allow it, and the run goes on without
//! it. Each event that opens gets a counter (`EV_PAGE_FAULTS` for
//! `page-faults`: see `Spec::counter_name`) whose ticks are samples and
//! whose value is the events they stand for (the sum of their periods).
//!
//! Every thread then opens its own events: per-thread perf events with
//! `sigtrap`, the kernel raising SIGTRAP in the thread (from task work on
//! its way back to user space, so no blocking call is interrupted) with
//! `si_perf_data` [`sampler::EVENT_COOKIE`] and the event's index. The sampling
//! handler of `modules/cpu` recognises them and calls [`sample`] here. An
//! event is held by a one-page mapping and its descriptor closed, as the
//! CPU sampler's (moved high and kept where mappings are refused).
//!
//! What the sampled PC means: for a software event, the user instruction
//! whose execution caused it (a page fault's access) or, for events the
//! kernel counts in its own code (context switches), the return to user
//! space after it; for a hardware event, the instruction the overflow
//! interrupt found, some instructions after the one that caused it (skid),
//! unless the PMU offers `precise_ip` (tried from 3 down when no `p`
//! modifier says). Events are counted in user mode only unless modifiers
//! say otherwise (`:uk`), except the ones the kernel counts only in kernel
//! mode (context switches, migrations), which need kernel counting
//! (`perf_event_paranoid` <= 1 or CAP_PERFMON).
//!
//! Periods: as given (`/PERIOD`), else every event for the rare software
//! events (faults, switches, migrations), 1 ms for the clocks, 1,000,000
//! for cycles and instructions, 10,000 for the others. A period of 100 or
//! more is drawn again (+-10%) for each thread and every 512 samples,
//! against aliasing with the program's own rhythm; each sample is charged
//! the period it was taken with, so the totals stay unbiased.
//!
//! Samples that come while the thread runs profiler code are the
//! profiler's own events (its page faults, its instructions): counted, not
//! charged (`-d` reports them).
//!
//! Must never: allocate, lock or leave errno changed in [`sample`]; keep a
//! descriptor in the program's low numbers.

mod count;
mod ibs;
mod ring;
mod userpage;

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::base::counters::{self, EVENT_IDS};
use crate::base::options::Options;
use crate::base::thread::{self, Guard, ThreadState};
use crate::modules::StartError;
use crate::sampler;
use crate::sys::{self, PerfEventKind};

/// One `-e` event of the run.
struct Event {
    /// The specification as given (the named profilers: their flag).
    text: String,
    /// Its counter's name.
    name: &'static str,
    kind: PerfEventKind,
    /// Events per sample before the per-thread jitter; with `kind.freq`,
    /// samples per second.
    period: u64,
    /// What a sample adds, and to which counter.
    charge: Charge,
}

/// What one sample of an event records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Charge {
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
    fn counter(self) -> counters::CounterId {
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

/// The run's events, in cookie order (set before the counters freeze).
static EVENTS: OnceLock<Vec<Event>> = OnceLock::new();
/// PAGE_FAULTS' slot (after the freeze; usize::MAX: not recorded).
static PF_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Faults whose signal merged with another event's, charged by
/// `settle_faults`; fault signals of faults already counted past.
static MERGED: AtomicU64 = AtomicU64::new(0);
static STALE: AtomicU64 = AtomicU64::new(0);
/// MAJOR_FAULTS' slot (after the freeze; usize::MAX: not recorded).
static MAJOR_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// MEM_FAULTS' slot (after the freeze; usize::MAX: not recorded).
static MEM_FAULTS_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Counter slot of each event (after the freeze).
static SLOTS: [AtomicUsize; MAX_EVENTS] = [const { AtomicUsize::new(usize::MAX) }; MAX_EVENTS];
/// Samples charged, and samples of the profiler's own code, per event.
static CHARGED: [AtomicU64; MAX_EVENTS] = [const { AtomicU64::new(0) }; MAX_EVENTS];
static INSIDE: [AtomicU64; MAX_EVENTS] = [const { AtomicU64::new(0) }; MAX_EVENTS];
/// Threads whose event could not be opened (the first error is said).
static NOT_OPENED: AtomicU64 = AtomicU64::new(0);

/// Sampled events per run (-e, -pf, -oc): one bit each in a cookie's and
/// a thread's masks.
const MAX_EVENTS: usize = 8;

/// Samples between two draws of a thread's period.
const RENEW_EVERY: u32 = 512;
/// Periods from which the per-thread jitter applies.
const JITTER_FROM: u64 = 100;

fn events() -> &'static [Event] {
    EVENTS.get().map_or(&[], |v| v.as_slice())
}

pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe,
    register_counters,
    start,
    thread_begin: Some(open_all),
    thread_end: Some(close_all),
    fork_child: Some(forget_inherited),
    thread_stop: Some(close_all),
    thread_restart: Some(open_all),
    before_dump: Some(|| {
        if crate::base::options::debug() {
            report()
        }
    }),
    header_note: Some(count::header_note),
    synthetic: Some(ibs::synthetic),
    ..crate::modules::Module::new("-e", |o| {
        o.samples_events() || o.count_groups().next().is_some()
    })
};

/// The default period of an event (see the module docs).
fn default_period(kind: &PerfEventKind) -> u64 {
    const SOFTWARE: u32 = 1;
    const HARDWARE: u32 = 0;
    match (kind.type_, kind.config) {
        // cpu-clock, task-clock: nanoseconds.
        (SOFTWARE, 0 | 1) => 1_000_000,
        (SOFTWARE, _) => 1,
        // cycles, instructions, bus-cycles, stalled cycles, ref-cycles.
        (HARDWARE, 0 | 1 | 6 | 7 | 8 | 9) => 1_000_000,
        _ => 10_000,
    }
}

/// `/proc/sys/kernel/perf_event_paranoid`, for messages.
fn paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Why an event does not open, and what would let it (one line's end).
pub(crate) fn open_refusal(e: i32, kind: &PerfEventKind) -> String {
    match e {
        libc::EACCES | libc::EPERM => format!(
            "not allowed (perf_event_paranoid is {}{}): needs perf_event_paranoid <= {} (sysctl kernel.perf_event_paranoid) or CAP_PERFMON",
            paranoid(),
            if kind.exclude_kernel { "" } else { ", and this event counts in kernel mode" },
            if kind.exclude_kernel { 2 } else { 1 }
        ),
        libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP => format!(
            "not supported here (errno {e}: this machine's PMU does not count it, or the PMU cannot sample; virtual machines often have no hardware PMU)"
        ),
        libc::EINVAL => "the kernel refused its attributes (EINVAL: a term out of range, or a kernel without sigtrap perf events, Linux 5.13+)".into(),
        libc::EMFILE | libc::ENFILE => format!("no descriptor left (errno {e})"),
        _ => format!("perf_event_open failed (errno {e})"),
    }
}

/// Parses, resolves and trial-opens every `-e` event; those that open get
/// a counter. Runs on the main thread before the counters freeze.
fn register_counters(o: &Options) {
    let mut v: Vec<Event> = Vec::new();
    named_profilers(o, &mut v);
    let mut sampled = 0;
    for text in o.event_specs() {
        let say = |why: &str| crate::igprof_log!("-e {text}: {why}; running without it");
        let spec = match igprof_events::parse(text) {
            Ok(s) => s,
            Err(e) => {
                say(&e.why);
                continue;
            }
        };
        let attr = match igprof_events::resolve(&spec, std::path::Path::new(igprof_events::DEVICES))
        {
            Ok(a) => a,
            Err(e) => {
                say(&e.to_string());
                continue;
            }
        };
        let name = spec.counter_name();
        if v.iter().any(|e| e.name == name) {
            say(&format!("given twice (counter {name})"));
            continue;
        }
        if v.len() == MAX_EVENTS {
            say(&format!("at most {MAX_EVENTS} events per run"));
            continue;
        }
        // User mode only unless the modifiers say, or the event only
        // counts in the kernel.
        let kernel = if attr.levels_given {
            !attr.exclude_kernel
        } else {
            attr.counts_in_kernel_only()
        };
        let mut kind = PerfEventKind {
            type_: attr.type_,
            config: attr.config,
            config1: attr.config1,
            config2: attr.config2,
            precise_ip: attr.precise_ip,
            exclude_user: attr.levels_given && attr.exclude_user,
            exclude_kernel: !kernel,
            exclude_hv: !attr.levels_given || attr.exclude_hv,
            sample_addr: false,
            sample_raw: false,
            freq: false,
        };
        let period = match spec.period {
            Some(igprof_events::Period::Count(p)) => p,
            Some(igprof_events::Period::Frequency(f)) => {
                kind.freq = true;
                f
            }
            None => default_period(&kind),
        };
        if let Some(other) = v.iter().find(|e| coincide(&e.kind, &kind)) {
            say(&format!(
                "it fires on the same kernel entries as {} (sampled already), and the kernel raises one SIGTRAP for both: one of them would lose its samples; sample one of them",
                other.text
            ));
            continue;
        }
        if let Err(why) = check_opens(&mut kind, spec.precise == 0, period) {
            say(&why);
            continue;
        }
        if !kernel && attr.counts_in_kernel_only() {
            crate::igprof_log!(
                "-e {text}: the kernel counts it only in kernel mode, which :u excludes: it will count nothing"
            );
        }
        let id = EVENT_IDS[sampled];
        counters::set_event_name(sampled, Box::leak(name.clone().into_boxed_str()));
        counters::enable(id);
        sampled += 1;
        v.push(Event {
            text: text.to_string(),
            name: Box::leak(name.into_boxed_str()),
            kind,
            period,
            charge: Charge::Sample(id),
        });
    }
    ibs_events(o, &mut v);
    let _ = EVENTS.set(v);
    count::register(o, sampled);
}

/// The `-ibs` and `-ibs-fetch` events that open on this thread, with
/// their counters enabled.
fn ibs_events(o: &Options, v: &mut Vec<Event>) {
    let mut opened = Vec::new();
    for mut p in ibs::plans(o) {
        if v.len() == MAX_EVENTS {
            crate::igprof_log!(
                "{}: at most {MAX_EVENTS} events per run; running without it",
                p.text
            );
            continue;
        }
        if let Err(e) = trial_open(&mut p.kind, false, p.period) {
            crate::igprof_log!(
                "{}: {}; running without it",
                p.text,
                ibs::refusal(e, &p.kind, &paranoid())
            );
            continue;
        }
        let charge = Charge::Ibs(p.ibs);
        v.push(Event {
            text: p.text.clone(),
            name: counters::ALL[charge.counter() as usize].name,
            kind: p.kind,
            period: p.period,
            charge,
        });
        opened.push(p);
    }
    ibs::register(&opened, o);
}

/// The software events of `-pf` and `-oc` (period 1 each), counted in
/// kernel mode too where allowed: a fault the kernel takes on a user page
/// (a `read` into a fresh buffer) is the program's, and the scheduler
/// counts switches only there.
fn named_profilers(o: &Options, v: &mut Vec<Event>) {
    const SOFTWARE: u32 = 1;
    let mut wanted = Vec::new();
    if o.page_faults {
        wanted.push(("-pf", "PAGE_FAULTS", 2, Charge::PageFault));
    }
    if o.off_cpu && o.perf == Some(crate::base::options::PerfClock::Real) {
        crate::igprof_log!(
            "-oc: -pr charges the time off the CPU already (in PERF_TICKS, on the same context-switch events, which would raise one SIGTRAP for both); use one of them; running without -oc"
        );
    } else if o.off_cpu {
        wanted.push(("-oc", "OFFCPU_TIME", 3, Charge::OffCpu));
    }
    for (flag, name, config, charge) in wanted {
        let mut kind = PerfEventKind {
            type_: SOFTWARE,
            config,
            exclude_hv: true,
            sample_addr: charge == Charge::PageFault,
            ..PerfEventKind::default()
        };
        if trial_open(&mut kind, false, 1).is_err() && charge != Charge::OffCpu {
            // Not allowed in kernel mode (perf_event_paranoid): the faults
            // the program's own instructions take.
            kind.exclude_kernel = true;
            crate::igprof_debug!(
                "{flag}: {name} counted in user mode only (perf_event_paranoid {})",
                paranoid()
            );
        }
        if let Err(why) = check_opens(&mut kind, false, 1) {
            crate::igprof_log!("{flag}: {name}: {why}; running without it");
            continue;
        }
        counters::enable(charge.counter());
        if charge == Charge::PageFault {
            // Whether a sampled fault was major: a counting major-faults
            // event read at each fault (a second sampled event would
            // fire at the same faults, and the kernel raises one SIGTRAP
            // for both).
            counters::enable(counters::CounterId::MajorFaults);
        }
        v.push(Event {
            text: flag.to_string(),
            name,
            kind,
            period: 1,
            charge,
        });
    }
    if v.iter().any(|e| e.charge == Charge::PageFault) && o.mem && o.sample_bytes == 0 {
        counters::enable(counters::CounterId::MemFaults);
    }
}

/// Whether `kind` opens for sampling every `period` events on this
/// thread; why not, in words, otherwise.
fn check_opens(kind: &mut PerfEventKind, best_precise: bool, period: u64) -> Result<(), String> {
    let e = match trial_open(kind, best_precise, period) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    // A PMU that counts but cannot sample refuses the period (and maybe
    // the privilege filters: the msr PMU).
    let counts = e == libc::EINVAL && {
        let mut plain = PerfEventKind {
            exclude_user: false,
            exclude_kernel: false,
            exclude_hv: false,
            ..*kind
        };
        trial_open(&mut plain, false, 0).is_ok()
    };
    Err(if counts {
        "its PMU can count it but not sample it (EINVAL for a sampling period)".into()
    } else {
        open_refusal(e, kind)
    })
}

/// Opens `kind` once on this thread and closes it. When `best_precise`,
/// a hardware event gets the highest `precise_ip` its PMU takes.
fn trial_open(kind: &mut PerfEventKind, best_precise: bool, period: u64) -> Result<(), i32> {
    const SOFTWARE: u32 = 1;
    let tries: &[u8] = if best_precise && kind.type_ != SOFTWARE {
        &[3, 2, 1, 0]
    } else {
        &[kind.precise_ip]
    };
    let mut last = 0;
    for &p in tries {
        kind.precise_ip = p;
        match sys::perf_sigtrap_open(kind, sys::gettid(), period, sampler::EVENT_COOKIE) {
            Ok(fd) => {
                sys::close(fd);
                return Ok(());
            }
            // A precision the PMU does not offer: EOPNOTSUPP or EINVAL.
            Err(e) => last = e.0,
        }
    }
    Err(last)
}

fn start(o: &Options) -> Result<(), StartError> {
    if count::any() {
        count::init_slots();
        if !sampler::add_consumer(|g, node| {
            // SAFETY: a sample consumer is given the sample's node of the
            // thread's tree, or null.
            if let (Some(r), Some(node)) = (existing(g.state()), unsafe { sampled_node(node) }) {
                count::on_sample(g, &r.count, node);
            }
        }) {
            return Err(StartError::refused(
                "-c: no room for another sample consumer",
            ));
        }
    }
    if events().is_empty() {
        // Each event already said why it is not sampled (or -c alone).
        return if count::any() {
            Ok(())
        } else {
            Err(StartError::AlreadyReported)
        };
    }
    let Some(how) = sampler::event_delivery() else {
        return Err(StartError::refused(
            "no sampling signal could be set up for the events",
        ));
    };
    if matches!(how, sys::PerfDelivery::Fasync { .. }) {
        crate::igprof_debug!(
            "-e: events signal through fasync (no sigtrap perf events, or --sampler sigprof/timer)"
        );
        for e in events() {
            if fasync_kind(e).config != e.kind.config {
                crate::igprof_debug!(
                    "{}: samples the faults that complete (minor-faults): with fasync a fault's signal would be pending during the fault, which a fault that needs a retry gives up for, again and again",
                    e.text
                );
            }
        }
        for (i, e) in events().iter().enumerate() {
            if is_switch(&e.kind) {
                // A switch out of a blocking call would signal the thread,
                // interrupting the call, which blocks again: a loop.
                OFF[i].store(true, Ordering::Relaxed);
                crate::igprof_log!(
                    "{}: needs sigtrap perf events (Linux 5.13+; --sampler auto or sigtrap): with a signal of its own, each switch out of a blocking call would interrupt it; running without it",
                    if matches!(e.charge, Charge::Sample(_)) { format!("-e {}", e.text) } else { e.text.clone() }
                );
            }
        }
        if o.mem && events().iter().any(|e| e.charge == Charge::PageFault) {
            crate::igprof_log!(
                "-pf: without sigtrap perf events (Linux 5.13+) a fault's signal has no address: MEM_FAULTS not recorded"
            );
        }
    }
    for (i, e) in events().iter().enumerate() {
        if let Some(s) = counters::slot(e.charge.counter()) {
            SLOTS[i].store(s, Ordering::Relaxed);
        }
    }
    if let Some(s) = counters::slot(counters::CounterId::MemFaults) {
        MEM_FAULTS_SLOT.store(s, Ordering::Relaxed);
    }
    if let Some(s) = counters::slot(counters::CounterId::MajorFaults) {
        MAJOR_SLOT.store(s, Ordering::Relaxed);
    }
    if let Some(s) = counters::slot(counters::CounterId::PageFaults) {
        PF_SLOT.store(s, Ordering::Relaxed);
    }
    ibs::init_slots();
    sampler::set_event_samples(sampler::EventSamples {
        held,
        fds,
        sample,
        inside: |t, i| {
            INSIDE[i as usize].fetch_add(1, Ordering::Relaxed);
            // An IBS sample of the profiler's own code: its records are
            // read past, not left for the program's next sample.
            if let (Some(r), Some(Charge::Ibs(_))) =
                (existing(t), events().get(i as usize).map(|e| e.charge))
            {
                if let Some((ring, bytes)) = ibs_ring(r, i as usize) {
                    // SAFETY: the thread's own ring, read only by its handler.
                    unsafe { ring::drain(ring, bytes, |_, _| {}) };
                }
            }
            // The profiler's own faults are not the program's: counted
            // past, so that no later sample takes them for merged ones.
            if let Some(r) = existing(t) {
                consume_faults(r);
            }
        },
    });
    Ok(())
}

/// The node a CPU sample landed on, if it could be stored (`node` not
/// null).
///
/// # Safety
/// `node` is null or a node of a thread's call tree (nodes are never freed,
/// so the reference stays valid for the life of the process).
unsafe fn sampled_node(
    node: *mut crate::base::tree::Node,
) -> Option<&'static crate::base::tree::Node> {
    // SAFETY: guaranteed by the caller.
    unsafe { node.as_ref() }
}

fn describe(_: &Options) -> Option<String> {
    let sampled: Vec<String> = events()
        .iter()
        .enumerate()
        .filter(|(i, _)| !OFF[*i].load(Ordering::Relaxed))
        .map(|(_, e)| e)
        .filter(|e| matches!(e.charge, Charge::Sample(_)))
        .map(|e| {
            let rate = if e.kind.freq {
                format!("{} per second", e.period)
            } else {
                format!("every {}", e.period)
            };
            format!("{} ({}, {rate})", e.name, e.text)
        })
        .collect();
    let mut list = Vec::new();
    if !sampled.is_empty() {
        list.push(format!("perf events: {}", sampled.join(", ")));
    }
    let named = |c: Charge| {
        events()
            .iter()
            .enumerate()
            .any(|(i, e)| e.charge == c && !OFF[i].load(Ordering::Relaxed))
    };
    if named(Charge::PageFault) {
        let mem = counters::slot(counters::CounterId::MemFaults).is_some();
        list.push(format!(
            "page faults (PAGE_FAULTS, MAJOR_FAULTS{})",
            if mem { ", MEM_FAULTS" } else { "" }
        ));
    }
    if named(Charge::OffCpu) {
        list.push("off-CPU time (OFFCPU_TIME, ns)".into());
    }
    for (i, e) in events().iter().enumerate() {
        if let (Charge::Ibs(b), false) = (e.charge, OFF[i].load(Ordering::Relaxed)) {
            let objects = counters::slot(counters::CounterId::IbsObjSamples).is_some();
            list.push(match b.unit {
                igprof_events::ibs::Unit::Op => format!(
                    "AMD IBS ops ({}, every {}): IBS_OPS and the op counters{}",
                    e.text,
                    e.period,
                    if objects {
                        ", IBS_OBJ_* on the data's owners"
                    } else {
                        ""
                    }
                ),
                igprof_events::ibs::Unit::Fetch => {
                    format!(
                        "AMD IBS fetches ({}, every {}): IBS_FETCHES and the fetch counters",
                        e.text, e.period
                    )
                }
            });
        }
    }
    list.extend(count::describe());
    (!list.is_empty()).then(|| list.join(", "))
}

/// A thread's events (one page of its own, zero-filled: nothing held).
#[repr(C)]
struct PerThread {
    /// The mapping that holds each event (0: none).
    hold: [AtomicUsize; MAX_EVENTS],
    /// Its descriptor + 1 where it could not be held by a mapping (0: none).
    fd: [AtomicI32; MAX_EVENTS],
    /// Its ring where it signals through fasync (0: none; its descriptor
    /// is kept then: the signal names it).
    ring: [AtomicUsize; MAX_EVENTS],
    /// The period each event samples with now.
    period: [AtomicU64; MAX_EVENTS],
    /// Samples since the period was drawn.
    since: [AtomicU32; MAX_EVENTS],
    /// With a frequency: the event's count at its previous sample, and the
    /// node of that sample (where the count after it goes at the end).
    counted: [AtomicU64; MAX_EVENTS],
    last_node: [core::sync::atomic::AtomicPtr<crate::base::tree::Node>; MAX_EVENTS],
    /// The events held, one bit per index.
    held: AtomicU8,
    /// -oc: wall-clock and thread CPU time at the thread's previous switch
    /// back onto the CPU (ns).
    wall_mark: AtomicU64,
    cpu_mark: AtomicU64,
    /// -c: the thread's counting groups.
    count: count::PerThread,
    /// The registers' fingerprint at the previous sample of a fault event.
    fault_regs: AtomicU64,
    /// -pf: a counting group of page faults and major faults (leader's
    /// descriptor + 1, 0: none; its member's), and their counts at the
    /// previous read.
    fault_fd: AtomicI32,
    major_fd: AtomicI32,
    faults: AtomicU64,
    majors: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<PerThread>() <= 4096);

/// The thread's record, made on first use (not in signal context).
fn record(t: &ThreadState) -> Option<&PerThread> {
    let mut p = t.events.load(Ordering::Acquire);
    if p.is_null() {
        p = sys::mmap_anon(4096);
        if p.is_null() {
            return None;
        }
        t.events.store(p, Ordering::Release);
    }
    // SAFETY: a zero-filled page of ours (a valid PerThread: all atomics
    // zero), never unmapped while the state exists.
    Some(unsafe { &*(p as *const PerThread) })
}

/// The record if the thread has one (any context).
fn existing(t: &ThreadState) -> Option<&PerThread> {
    let p = t.events.load(Ordering::Acquire);
    // SAFETY: as in `record`.
    (!p.is_null()).then(|| unsafe { &*(p as *const PerThread) })
}

fn held(t: &ThreadState) -> u8 {
    existing(t).map_or(0, |r| r.held.load(Ordering::Relaxed))
}

/// The descriptors of the thread's events that signal through fasync.
fn fds(t: &ThreadState) -> [i32; MAX_EVENTS] {
    let mut v = [-1; MAX_EVENTS];
    if let Some(r) = existing(t) {
        for (i, f) in v.iter_mut().enumerate() {
            if r.ring[i].load(Ordering::Relaxed) != 0 {
                *f = r.fd[i].load(Ordering::Relaxed) - 1;
            }
        }
    }
    v
}

/// The period of event `ev` for one thread's next run of samples.
fn draw(t: &ThreadState, ev: &Event) -> u64 {
    if ev.period < JITTER_FROM || ev.kind.freq {
        return ev.period;
    }
    let spread = ev.period / 5;
    let p = ev.period - ev.period / 10 + t.sampler.clock.next_random() % spread;
    if matches!(ev.charge, Charge::Ibs(_)) {
        // The IBS counter's low 4 bits are not programmable.
        p & !15
    } else {
        p
    }
}

/// Opens event `i` for thread `t` (the calling thread) with a new period
/// and puts it in place of the one it had, which ends after the new one
/// is enabled (so the thread is never left unsampled). Also from signal
/// context: system calls only.
fn open_one(t: &ThreadState, r: &PerThread, i: usize, ev: &Event) -> Result<(), i32> {
    let period = draw(t, ev);
    let fasync = match sampler::event_delivery() {
        Some(sys::PerfDelivery::Fasync { signo }) => Some(signo),
        _ => None,
    };
    // The new event: with fasync, known as ours and in place before it
    // is enabled (a signal that names it must never go to the program).
    let (hold, fd, ring) = match fasync {
        Some(signo) => {
            let (fd, ring) = sys::perf_fasync_open(
                &fasync_kind(ev),
                t.tid(),
                period,
                signo,
                sampler::high_fd_base(),
            )
            .map_err(|e| e.0)?;
            sampler::mark_fd_ours(fd);
            (0, fd, ring)
        }
        None => {
            let (hold, fd) = hold_sigtrap(t, i, ev, period)?;
            (hold, fd, 0)
        }
    };
    r.period[i].store(period, Ordering::Relaxed);
    r.since[i].store(0, Ordering::Relaxed);
    r.counted[i].store(0, Ordering::Relaxed);
    r.last_node[i].store(core::ptr::null_mut(), Ordering::Relaxed);
    if ev.charge == Charge::OffCpu {
        r.wall_mark.store(sys::monotonic_ns(), Ordering::Relaxed);
        r.cpu_mark.store(sys::thread_cpu_ns(), Ordering::Relaxed);
    }
    let old = (
        r.hold[i].swap(hold, Ordering::AcqRel),
        r.fd[i].swap(fd + 1, Ordering::AcqRel) - 1,
        r.ring[i].swap(ring, Ordering::AcqRel),
    );
    r.held.fetch_or(1 << i, Ordering::Release);
    if fasync.is_some() && !sys::perf_enable(fd) {
        let e = sys::errno();
        end(
            Some(ev),
            (
                r.hold[i].swap(old.0, Ordering::AcqRel),
                r.fd[i].swap(old.1 + 1, Ordering::AcqRel) - 1,
                r.ring[i].swap(old.2, Ordering::AcqRel),
            ),
        );
        return Err(e);
    }
    // The one it replaces ends once the new one runs (IBS: its samples
    // not yet read are lost with it, a few per renewal).
    end(Some(ev), old);
    Ok(())
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
fn fasync_kind(ev: &Event) -> PerfEventKind {
    const SOFTWARE: u32 = 1;
    const PAGE_FAULTS: u64 = 2;
    const MINOR_FAULTS: u64 = 5;
    let mut k = ev.kind;
    if (k.type_, k.config) == (SOFTWARE, PAGE_FAULTS) && ev.period == 1 && !k.freq {
        k.config = MINOR_FAULTS;
    }
    k
}

/// Opens event `i` with sigtrap delivery and enables it: (the mapping that
/// holds it or 0, its descriptor or -1). The descriptor is closed when the
/// mapping holds the event and no sample reads its count.
fn hold_sigtrap(t: &ThreadState, i: usize, ev: &Event, period: u64) -> Result<(usize, i32), i32> {
    let fd = sys::perf_sigtrap_open(&ev.kind, t.tid(), period, sampler::EVENT_COOKIE | i as u64)
        .map_err(|e| e.0)?;
    if ev.kind.sample_raw {
        // Raw samples are read from the event's ring, which holds it.
        let ring = sys::perf_map_ring(fd, ibs::RING_BYTES);
        let ok = ring.is_ok() && sys::perf_enable(fd);
        let e = sys::errno();
        sys::close(fd);
        return match ring {
            Ok(m) if ok => Ok((m, -1)),
            Ok(m) => {
                sys::perf_unmap_ring(m, ibs::RING_BYTES);
                Err(e)
            }
            Err(e) => Err(e.0),
        };
    }
    Ok(match sys::perf_hold(fd) {
        // With a frequency, each sample reads the count: the descriptor
        // stays (for read(2)) beside the page (for rdpmc).
        Ok(h) if ev.kind.freq => {
            let fd = sys::move_fd_up(fd, sampler::high_fd_base());
            if !sys::perf_enable(fd) {
                let e = sys::errno();
                sys::perf_release(h);
                sys::close(fd);
                return Err(e);
            }
            (h, fd)
        }
        Ok(h) => {
            let ok = sys::perf_enable(fd);
            sys::close(fd);
            if !ok {
                sys::perf_release(h);
                return Err(sys::errno());
            }
            (h, -1)
        }
        Err(_) => {
            let fd = sys::move_fd_up(fd, sampler::high_fd_base());
            if !sys::perf_enable(fd) {
                let e = sys::errno();
                sys::close(fd);
                return Err(e);
            }
            (0, fd)
        }
    })
}

/// Ends event `ev`'s instance held by mapping `hold`, descriptor `fd` or
/// fasync `ring` with its descriptor (0 / -1: none).
fn end(ev: Option<&Event>, (hold, fd, ring): (usize, i32, usize)) {
    if hold != 0 && ev.is_some_and(|e| e.kind.sample_raw) {
        sys::perf_unmap_ring(hold, ibs::RING_BYTES);
    } else if hold != 0 {
        sys::perf_release(hold);
    }
    if ring != 0 && fd >= 0 {
        sys::perf_close(fd, ring);
    } else if fd >= 0 {
        sys::close(fd);
    }
}

/// Opens the thread's events (thread begin, and a forked child's thread).
fn open_all(t: &'static ThreadState) {
    let evs = events();
    if evs.is_empty() && !count::any() {
        return;
    }
    let Some(r) = record(t) else { return };
    count::open(t, &r.count);
    if sampler::event_delivery().is_none() {
        return;
    }
    if let Some(pf) = evs.iter().find(|e| e.charge == Charge::PageFault) {
        // -pf's faults and major faults, counted beside the sampled faults.
        let count = |config, leader| {
            let kind = PerfEventKind {
                config,
                sample_addr: false,
                ..pf.kind
            };
            sys::perf_counter_open(&kind, t.tid(), leader)
                .map(|fd| sys::move_fd_up(fd, sampler::high_fd_base()))
        };
        if let Ok(leader) = count(2, -1) {
            let member = count(6, leader).unwrap_or(-1);
            if member >= 0 && sys::perf_enable_group(leader) {
                r.faults.store(0, Ordering::Relaxed);
                r.majors.store(0, Ordering::Relaxed);
                r.major_fd.store(member + 1, Ordering::Release);
                r.fault_fd.store(leader + 1, Ordering::Release);
            } else {
                for fd in [member, leader] {
                    if fd >= 0 {
                        sys::close(fd);
                    }
                }
            }
        }
    }
    for (i, ev) in evs.iter().enumerate() {
        if OFF[i].load(Ordering::Relaxed) {
            continue;
        }
        if ev.charge == Charge::PageFault {
            // Counted from the moment the faults are sampled.
            consume_faults(r);
        }
        if let Err(e) = open_one(t, r, i, ev) {
            if NOT_OPENED.fetch_add(1, Ordering::Relaxed) == 0 {
                crate::igprof_log!(
                    "-e {}: cannot open it on thread {}: {}; that thread is not sampled for it",
                    ev.text,
                    t.tid(),
                    open_refusal(e, &ev.kind)
                );
            }
        }
    }
}

/// Ends the thread's events (thread end, final dump, exec): its counting
/// groups' last counts go to its latest sample's stack.
fn close_all(t: &'static ThreadState) {
    // Another thread's pages that its own handler may be reading (a
    // frequency event's, a counting group's) are left mapped: unmapping
    // them under a running handler would crash the program. The process
    // is ending or exec'ing.
    let own = thread::current().is_some_and(|c| core::ptr::eq(c, t));
    end_all(t, true, own);
}

/// Ends the thread's events; `final_read`: what they counted after their
/// last sample is charged to that sample's stack (not for the copies a
/// forked child inherited); `unmap`: the pages its handler may read are
/// unmapped too (not while the thread may still run).
fn end_all(t: &'static ThreadState, final_read: bool, unmap: bool) {
    let Some(r) = existing(t) else { return };
    // SAFETY: the sampler stores only nodes of the thread's tree (or null)
    // as its last sample.
    let last = unsafe { sampled_node(t.sampler.last_sample.load(Ordering::Acquire)) };
    count::close(&r.count, last.filter(|_| final_read), unmap);
    // With a frequency, what was counted after the last sample goes to it.
    if final_read {
        for (i, ev) in events().iter().enumerate() {
            let node = r.last_node[i].swap(core::ptr::null_mut(), Ordering::AcqRel);
            let slot = SLOTS[i].load(Ordering::Relaxed);
            if ev.kind.freq
                && !node.is_null()
                && slot != usize::MAX
                && r.fd[i].load(Ordering::Acquire) > 0
            {
                let rest = counted_since(r, i, false);
                // SAFETY: a node of the thread's tree (never freed).
                unsafe { &*node }.counter(slot).add_shared(0, rest);
            }
        }
    }
    r.held.store(0, Ordering::Release);
    for fd in [
        r.fault_fd.swap(0, Ordering::AcqRel) - 1,
        r.major_fd.swap(0, Ordering::AcqRel) - 1,
    ] {
        if fd >= 0 {
            sys::close(fd);
        }
    }
    for i in 0..MAX_EVENTS {
        // A frequency event's page, an IBS event's ring are read by its
        // thread's handler.
        let read_by_handler = events()
            .get(i)
            .is_some_and(|e| e.kind.freq || e.kind.sample_raw);
        let (hold, fd, ring) = (
            r.hold[i].swap(0, Ordering::AcqRel),
            r.fd[i].swap(0, Ordering::AcqRel) - 1,
            r.ring[i].swap(0, Ordering::AcqRel),
        );
        if read_by_handler && !unmap {
            if fd >= 0 {
                sys::close(fd);
            }
        } else {
            end(events().get(i), (hold, fd, ring));
        }
    }
}

/// In a forked child: the events the parent's threads held are theirs
/// (a copy of their mappings and descriptors came along): let them go.
fn forget_inherited() {
    // The child's only thread runs this: nothing else reads the pages.
    for t in thread::all() {
        end_all(t, false, true);
    }
    ibs::reset();
}

/// One sample of event `i` (signal context, with the thread's guard).
fn sample(g: &Guard, i: u8, uc: *mut libc::c_void, addr: usize) {
    let t = g.state();
    let i = i as usize;
    let (Some(r), Some(ev)) = (existing(t), events().get(i)) else {
        return;
    };
    if let Charge::Ibs(b) = ev.charge {
        let period = r.period[i].load(Ordering::Relaxed);
        let n = ibs::sample(g, uc, b, ibs_ring(r, i), period);
        CHARGED[i].fetch_add(n, Ordering::Relaxed);
        renew_period(t, r, i, ev);
        return;
    }
    if counts_each_fault(ev) {
        // The late signal of faults the profiler's own handler took (its
        // SIGTRAP is blocked meanwhile: they come back as one signal once
        // it returns, before the thread ran an instruction): the same
        // registers as the previous fault's sample. Not the program's.
        // SAFETY: uc is the kernel's context for this signal.
        let regs = unsafe { registers_fingerprint(uc) };
        if r.fault_regs.swap(regs, Ordering::Relaxed) == regs {
            STALE.fetch_add(1, Ordering::Relaxed);
            consume_faults(r);
            return;
        }
    }
    // -pf: the faults counted since the previous read are this kernel
    // entry's (the sampled one, and any whose signal merged with this
    // one), read before this handler's own work can fault.
    let faults = faults_since(r);
    // SAFETY: the sampler's handler passes the kernel's context, on
    // this thread.
    let node = unsafe { sampler::interrupted_node(g, uc) };
    if ev.kind.freq {
        r.last_node[i].store(node, Ordering::Relaxed);
    }
    // A fault sample with no fault counted is the late signal of faults
    // the profiler's own handler took, already counted past.
    if let Some(f) = faults {
        // SAFETY: interrupted_node gives a node of t's tree or null.
        charge_faults(f, unsafe { sampled_node(node) });
    }
    let faults = faults.map(|(f, _)| f);
    let value = match ev.charge {
        Charge::Sample(_) if ev.kind.freq => counted_since(r, i, true),
        Charge::Sample(_) => r.period[i].load(Ordering::Relaxed),
        // Charged by charge_faults where the faults are counted.
        Charge::PageFault => faults.map_or(1, |_| 0),
        Charge::OffCpu => off_cpu_ns(r),
        // Charged by ibs::sample (above).
        Charge::Ibs(_) => 0,
    };
    if !node.is_null() && value > 0 {
        let slot = SLOTS[i].load(Ordering::Relaxed);
        if slot != usize::MAX {
            // SAFETY: a live node of this thread's tree, guard held.
            unsafe { &*node }.counter(slot).add(1, value);
            CHARGED[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    if ev.charge == Charge::PageFault && addr != 0 {
        charge_owner(addr);
    }
    renew_period(t, r, i, ev);
}

/// The ring of thread record `r`'s event `i` and its size, if its samples
/// are read from one (an IBS event: its holding mapping; with fasync: the
/// fasync ring).
fn ibs_ring(r: &PerThread, i: usize) -> Option<(usize, usize)> {
    if !events().get(i).is_some_and(|e| e.kind.sample_raw) {
        return None;
    }
    match (
        r.hold[i].load(Ordering::Relaxed),
        r.ring[i].load(Ordering::Relaxed),
    ) {
        (0, 0) => None,
        (0, ring) => Some((ring, sys::PERF_RING_BYTES)),
        (hold, _) => Some((hold, ibs::RING_BYTES)),
    }
}

/// Counts a sample of event `i` and draws the thread's period again every
/// [`RENEW_EVERY`] samples.
fn renew_period(t: &'static ThreadState, r: &PerThread, i: usize, ev: &Event) {
    if ev.period >= JITTER_FROM && !ev.kind.freq {
        let n = r.since[i].load(Ordering::Relaxed) + 1;
        r.since[i].store(n, Ordering::Relaxed);
        if n >= RENEW_EVERY {
            // A new period; on failure the event goes on with the old one.
            r.since[i].store(0, Ordering::Relaxed);
            let _ = open_one(t, r, i, ev);
        }
    }
}

/// A fingerprint of the interrupted thread's registers (general-purpose
/// ones, program counter, stack pointer, flags): equal for two signals
/// between which it ran no instruction, different between two faults of
/// a loop (its index register moved).
///
/// # Safety
/// `uc` must be the `ucontext_t` the kernel passed for the signal handled.
unsafe fn registers_fingerprint(uc: *const libc::c_void) -> u64 {
    let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(23);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: guaranteed by the caller.
        let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        // R8..R15, RDI, RSI, RBP, RBX, RDX, RAX, RCX, RSP, RIP, EFL (not
        // the trap number, error code or CR2: a fault in the handler
        // changes those).
        g[..=libc::REG_EFL as usize]
            .iter()
            .fold(0, |h, &v| mix(h, v as u64))
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: guaranteed by the caller.
        let m = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext };
        m.regs
            .iter()
            .chain([&m.sp, &m.pc, &m.pstate])
            .fold(0, |h, &v| mix(h, v))
    }
}

/// Whether `e` samples every fault (-pf, or `-e page-faults`, `minor-faults`
/// or `major-faults` at period 1), whose late signals for the faults the
/// profiler's own handler took must be told apart (see `sample`).
fn counts_each_fault(e: &Event) -> bool {
    e.charge == Charge::PageFault
        || (matches!(e.charge, Charge::Sample(_))
            && e.kind.type_ == 1
            && matches!(e.kind.config, 2 | 5 | 6)
            && e.period == 1
            && !e.kind.freq)
}

/// -pf: the faults and major faults the thread took since the previous
/// read of its counting group (None without one). Signal context.
fn faults_since(r: &PerThread) -> Option<(u64, u64)> {
    let fd = r.fault_fd.load(Ordering::Relaxed) - 1;
    let mut now = [0u64; 2];
    if fd < 0 {
        return None;
    }
    sys::perf_read_group(fd, &mut now)?;
    Some((
        now[0].saturating_sub(r.faults.swap(now[0], Ordering::Relaxed)),
        now[1].saturating_sub(r.majors.swap(now[1], Ordering::Relaxed)),
    ))
}

/// -pf: charges the faults a sample's kernel entry took (`faults_since`
/// read at its start) to `node`: PAGE_FAULTS, and MAJOR_FAULTS for the
/// major ones. Each fault raises its own SIGTRAP, but one that shares a
/// kernel entry with another event's (a fault that waited for memory is
/// also a context switch) is merged into it, so the faults counted since
/// the previous read happened in this sample's kernel entry. The faults of
/// the profiler's own code are counted past (`consume_faults`).
fn charge_faults((faults, majors): (u64, u64), node: Option<&crate::base::tree::Node>) {
    let (pf, mj) = (
        PF_SLOT.load(Ordering::Relaxed),
        MAJOR_SLOT.load(Ordering::Relaxed),
    );
    let Some(node) = node else { return };
    if faults > 0 && pf != usize::MAX {
        node.counter(pf).add(faults, faults);
        MERGED.fetch_add(faults.saturating_sub(1), Ordering::Relaxed);
    }
    if majors > 0 && mj != usize::MAX {
        node.counter(mj).add(majors, majors);
    }
}

/// -pf: counts past the faults the profiler's own code took (its handler,
/// a hook): they are not the program's.
fn consume_faults(r: &PerThread) {
    let _ = faults_since(r);
}

/// Events not opened in this run (see `start`).
static OFF: [core::sync::atomic::AtomicBool; MAX_EVENTS] =
    [const { core::sync::atomic::AtomicBool::new(false) }; MAX_EVENTS];

/// Whether `k` counts context switches (or migrations, cgroup switches):
/// the scheduler's events, raised as the thread leaves the CPU.
fn is_switch(k: &PerfEventKind) -> bool {
    k.type_ == 1 && matches!(k.config, 3 | 4 | 11)
}

/// Whether two sampled events can overflow on the same kernel entry (one
/// fault, one context switch): the kernel would raise one SIGTRAP for both
/// (a standard signal does not queue), and one would lose its sample.
fn coincide(a: &PerfEventKind, b: &PerfEventKind) -> bool {
    const SOFTWARE: u32 = 1;
    let family = |k: &PerfEventKind| match (k.type_, k.config) {
        // page-faults, minor-faults, major-faults
        (SOFTWARE, 2 | 5 | 6) => Some(0),
        // context-switches, cpu-migrations, cgroup-switches
        (SOFTWARE, 3 | 4 | 11) => Some(1),
        _ => None,
    };
    match (family(a), family(b)) {
        (Some(x), Some(y)) => x == y,
        _ => (a.type_, a.config, a.config1, a.config2) == (b.type_, b.config, b.config1, b.config2),
    }
}

/// With a frequency: what event `i` counted since its previous sample
/// (rdpmc where its page allows, else read(2)), the kernel having chosen
/// the period.
/// `own`: called on the thread the event counts (rdpmc reads the calling
/// CPU's counters, so only then).
fn counted_since(r: &PerThread, i: usize, own: bool) -> u64 {
    // The event's first page: its holding mapping's, or its ring's.
    let page = r.hold[i].load(Ordering::Relaxed) | r.ring[i].load(Ordering::Relaxed);
    let hold = if own { page } else { 0 };
    // SAFETY: the event's page, mapped by open_one on this thread, which
    // is the one it counts (we are in its own signal handler).
    let now = (hold != 0)
        .then(|| unsafe { userpage::read_now(hold as *const u8) })
        .flatten()
        .map(|got| got.count)
        .or_else(|| sys::perf_read_count(r.fd[i].load(Ordering::Relaxed) - 1));
    match now {
        Some(c) => c.saturating_sub(r.counted[i].swap(c, Ordering::Relaxed)),
        None => 0,
    }
}

/// -oc: the thread's time off the CPU since its previous switch back
/// (wall-clock minus its own CPU time), and the marks moved to now.
fn off_cpu_ns(r: &PerThread) -> u64 {
    let (wall, cpu) = (sys::monotonic_ns(), sys::thread_cpu_ns());
    wall.saturating_sub(r.wall_mark.swap(wall, Ordering::Relaxed))
        .saturating_sub(cpu.saturating_sub(r.cpu_mark.swap(cpu, Ordering::Relaxed)))
}

/// -pf -mp: a fault at `addr` inside a large live block is charged to the
/// stack that allocated it (any thread's tree: a shared add).
fn charge_owner(addr: usize) {
    let slot = MEM_FAULTS_SLOT.load(Ordering::Relaxed);
    if slot == usize::MAX {
        return;
    }
    if let Some(node) = crate::modules::mem::spans::owner_of(addr) {
        // SAFETY: nodes are never freed; slot < nslots.
        unsafe { &*node }.counter(slot).add_shared(1, 1);
    }
}

/// `-d`: what each event did (at each dump).
fn report() {
    count::report();
    if events().iter().any(counts_each_fault) {
        crate::igprof_log!(
            "fault events: {} faults whose signal merged with another's, charged to its stack; {} late signals of the profiler's own faults, not charged",
            MERGED.load(Ordering::Relaxed),
            STALE.load(Ordering::Relaxed)
        );
    }
    if events().iter().any(|e| matches!(e.charge, Charge::Ibs(_))) {
        ibs::report();
    }
    if crate::modules::mem::spans::active() {
        crate::igprof_log!(
            "data addresses not looked up because the sample interrupted a memory hook: {}",
            crate::modules::mem::spans::BUSY.load(Ordering::Relaxed)
        );
    }
    for (i, e) in events().iter().enumerate() {
        let flag = if matches!(e.charge, Charge::Sample(_)) {
            "-e "
        } else {
            ""
        };
        crate::igprof_log!(
            "{flag}{}: {} samples charged to {}, {} taken in the profiler's own code (not charged)",
            e.text,
            CHARGED[i].load(Ordering::Relaxed),
            e.name,
            INSIDE[i].load(Ordering::Relaxed)
        );
    }
}
