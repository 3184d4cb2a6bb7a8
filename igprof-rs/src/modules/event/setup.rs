//! Set-up of the run's events, on the main thread before the counters
//! freeze: each `-e` specification parsed and resolved against the PMUs,
//! the named profilers' events (`-pf`, `-oc`, `-ibs`), each trial-opened
//! once; those that open get a counter and a place in [`EVENTS`], those
//! that do not are named in one line with the reason. Then, at start, the
//! events that cannot be sampled with the delivery the sampler chose.
//!
//! Must never: keep an event open (trials are closed at once), or run
//! after the counters freeze or on any thread but the main one.

use core::sync::atomic::Ordering;

use super::table::{events, fasync_kind, kind_of, Charge, Event, EVENTS, MAX_EVENTS, OFF};
use super::{count, ibs};
use crate::base::counters::{self, EVENT_IDS};
use crate::base::options::Options;
use crate::sampler;
use crate::sys::{self, PerfEventKind};

/// The default period of an event (see the module docs).
pub(super) fn default_period(kind: &PerfEventKind) -> u64 {
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

/// Parses, resolves and trial-opens every `-e` event; those that open get
/// a counter. Runs on the main thread before the counters freeze.
pub(super) fn register_counters(o: &Options) {
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
        let mut kind = PerfEventKind {
            precise_ip: attr.precise_ip,
            ..kind_of(&attr)
        };
        let kernel = !kind.exclude_kernel;
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
pub(super) fn ibs_events(o: &Options, v: &mut Vec<Event>) {
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
                ibs::refusal(e, &p.kind, &sys::PerfRights::of_this_process())
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
pub(super) fn named_profilers(o: &Options, v: &mut Vec<Event>) {
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
                sys::perf_event_paranoid()
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
pub(super) fn check_opens(
    kind: &mut PerfEventKind,
    best_precise: bool,
    period: u64,
) -> Result<(), String> {
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
        kind.refusal(e)
    })
}

/// Opens `kind` once on this thread and closes it. When `best_precise`,
/// a hardware event gets the highest `precise_ip` its PMU takes.
pub(super) fn trial_open(
    kind: &mut PerfEventKind,
    best_precise: bool,
    period: u64,
) -> Result<(), i32> {
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

/// Whether `k` counts context switches (or migrations, cgroup switches):
/// the scheduler's events, raised as the thread leaves the CPU.
pub(super) fn is_switch(k: &PerfEventKind) -> bool {
    k.type_ == 1 && matches!(k.config, 3 | 4 | 11)
}

/// Whether two sampled events can overflow on the same kernel entry (one
/// fault, one context switch): the kernel would raise one SIGTRAP for both
/// (a standard signal does not queue), and one would lose its sample.
pub(super) fn coincide(a: &PerfEventKind, b: &PerfEventKind) -> bool {
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

/// At start, when the events signal through fasync (no sigtrap perf
/// events, or `--sampler sigprof/timer`): the events that cannot be
/// sampled so are turned off ([`OFF`]) and named, and what differs is
/// said.
pub(super) fn without_sigtrap(o: &Options) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const SOFTWARE: u32 = 1;
    const HARDWARE: u32 = 0;
    const RAW: u32 = 4;

    fn kind(type_: u32, config: u64) -> PerfEventKind {
        PerfEventKind {
            type_,
            config,
            ..PerfEventKind::default()
        }
    }

    #[test]
    fn default_periods_follow_the_module_docs() {
        // cpu-clock, task-clock: 1 ms in nanoseconds.
        assert_eq!(default_period(&kind(SOFTWARE, 0)), 1_000_000);
        assert_eq!(default_period(&kind(SOFTWARE, 1)), 1_000_000);
        // The rare software events: every one.
        for config in [2, 3, 4, 5, 6, 11] {
            assert_eq!(default_period(&kind(SOFTWARE, config)), 1, "{config}");
        }
        // cycles, instructions, bus-cycles, stalled cycles, ref-cycles.
        for config in [0, 1, 6, 7, 8, 9] {
            assert_eq!(
                default_period(&kind(HARDWARE, config)),
                1_000_000,
                "{config}"
            );
        }
        // Cache references and misses, branches: 10,000; so raw events.
        for config in [2, 3, 4, 5] {
            assert_eq!(default_period(&kind(HARDWARE, config)), 10_000, "{config}");
        }
        assert_eq!(default_period(&kind(RAW, 0x76)), 10_000);
    }

    #[test]
    fn switch_events_are_the_schedulers() {
        for config in [3, 4, 11] {
            assert!(is_switch(&kind(SOFTWARE, config)), "{config}");
        }
        for config in [0, 1, 2, 5, 6] {
            assert!(!is_switch(&kind(SOFTWARE, config)), "{config}");
        }
        assert!(!is_switch(&kind(HARDWARE, 3)));
    }

    #[test]
    fn events_of_one_kernel_entry_coincide() {
        // Faults of any kind: one fault raises them all.
        for (a, b) in [(2, 5), (2, 6), (5, 6), (2, 2)] {
            assert!(coincide(&kind(SOFTWARE, a), &kind(SOFTWARE, b)), "{a} {b}");
        }
        // Switches, migrations, cgroup switches: one switch.
        for (a, b) in [(3, 4), (3, 11), (4, 11)] {
            assert!(coincide(&kind(SOFTWARE, a), &kind(SOFTWARE, b)), "{a} {b}");
        }
        // A fault and a switch, a clock and a fault: apart.
        assert!(!coincide(&kind(SOFTWARE, 2), &kind(SOFTWARE, 3)));
        assert!(!coincide(&kind(SOFTWARE, 1), &kind(SOFTWARE, 2)));
        // Others: only the same event (all of its configuration).
        assert!(coincide(&kind(HARDWARE, 0), &kind(HARDWARE, 0)));
        assert!(!coincide(&kind(HARDWARE, 0), &kind(HARDWARE, 1)));
        assert!(!coincide(&kind(HARDWARE, 2), &kind(SOFTWARE, 2)));
        let mut k = kind(RAW, 0x76);
        k.config1 = 1;
        assert!(!coincide(&k, &kind(RAW, 0x76)));
        k.config1 = 0;
        k.config2 = 1;
        assert!(!coincide(&k, &kind(RAW, 0x76)));
        // What is not part of the event (its modifiers) does not tell them
        // apart.
        k.config2 = 0;
        k.exclude_kernel = true;
        k.precise_ip = 2;
        assert!(coincide(&k, &kind(RAW, 0x76)));
    }
}
