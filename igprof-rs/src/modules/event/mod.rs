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
//! handler of `modules/cpu` recognises them and calls [`samples::sample`]. An
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
//! Must never: allocate, lock or leave errno changed in [`samples::sample`]; keep a
//! descriptor in the program's low numbers.

mod count;
mod faults;
mod ibs;
mod life;
mod record;
mod report;
mod ring;
mod samples;
mod setup;
mod table;
mod userpage;

use crate::base::options::Options;
use crate::modules::StartError;
use crate::sampler;
use crate::sys;
use record::{existing, sampled_node};
use table::events;

pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe: report::describe,
    register_counters: setup::register_counters,
    start,
    thread_begin: Some(life::open_all),
    thread_end: Some(life::close_all),
    fork_child: Some(life::forget_inherited),
    thread_stop: Some(life::close_all),
    thread_restart: Some(life::open_all),
    before_dump: Some(|| {
        if crate::base::options::debug() {
            report::report()
        }
    }),
    header_note: Some(count::header_note),
    synthetic: Some(ibs::synthetic),
    ..crate::modules::Module::new("-e", |o| {
        o.samples_events() || o.count_groups().next().is_some()
    })
};

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
        setup::without_sigtrap(o);
    }
    table::init_slots();
    faults::init_slots();
    ibs::init_slots();
    sampler::set_event_samples(sampler::EventSamples {
        held: record::held,
        fds: record::fds,
        sample: samples::sample,
        inside: samples::inside,
    });
    Ok(())
}
