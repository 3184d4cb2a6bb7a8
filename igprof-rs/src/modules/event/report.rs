//! What the run's events record, in words: the line of the profile's
//! header (`describe`) and, with `-d`, what each event did (`report`).
//!
//! Must never: change what is sampled or charged (it only reads).

use core::sync::atomic::Ordering;

use super::faults::{MERGED, STALE};
use super::samples::{CHARGED, INSIDE};
use super::table::{counts_each_fault, events, Charge, OFF};
use super::{count, ibs};
use crate::base::counters;
use crate::base::options::Options;

pub(super) fn describe(_: &Options) -> Option<String> {
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

/// `-d`: what each event did (at each dump).
pub(super) fn report() {
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
