//! One sample of an event, in the sampler's signal handler: what it
//! charges to the stack it interrupted (the period, a frequency event's
//! count since the previous sample, -pf's faults, -oc's time off the CPU,
//! IBS records), and the samples that land in the profiler's own code,
//! counted and not charged.
//!
//! Must never: allocate, lock or leave errno changed (signal context), or
//! charge a sample of the profiler's own code to the program.

use core::sync::atomic::{AtomicU64, Ordering};

use super::record::{counted_since, existing, sampled_node, PerThread};
use super::table::{counts_each_fault, events, Charge, MAX_EVENTS, SLOTS};
use super::{faults, ibs, life, ring};
use crate::base::thread::{Guard, ThreadState};
use crate::sampler;
use crate::sys;

/// Samples charged, and samples of the profiler's own code, per event.
pub(super) static CHARGED: [AtomicU64; MAX_EVENTS] = [const { AtomicU64::new(0) }; MAX_EVENTS];
pub(super) static INSIDE: [AtomicU64; MAX_EVENTS] = [const { AtomicU64::new(0) }; MAX_EVENTS];

/// One sample of event `i` (signal context, with the thread's guard).
pub(super) fn sample(g: &Guard, i: u8, uc: *mut libc::c_void, addr: usize) {
    let t = g.state();
    let i = i as usize;
    let (Some(r), Some(ev)) = (existing(t), events().get(i)) else {
        return;
    };
    if let Charge::Ibs(b) = ev.charge {
        let period = r.period[i].load(Ordering::Relaxed);
        let n = ibs::sample(g, uc, b, ibs_ring(r, i), period);
        CHARGED[i].fetch_add(n, Ordering::Relaxed);
        life::renew_period(t, r, i, ev);
        return;
    }
    if counts_each_fault(ev) {
        // The late signal of faults the profiler's own handler took (its
        // SIGTRAP is blocked meanwhile: they come back as one signal once
        // it returns, before the thread ran an instruction): the same
        // registers as the previous fault's sample. Not the program's.
        // SAFETY: uc is the kernel's context for this signal.
        let regs = unsafe { faults::registers_fingerprint(uc) };
        if r.fault_regs.swap(regs, Ordering::Relaxed) == regs {
            faults::STALE.fetch_add(1, Ordering::Relaxed);
            faults::consume_faults(r);
            return;
        }
    }
    // -pf: the faults counted since the previous read are this kernel
    // entry's (the sampled one, and any whose signal merged with this
    // one), read before this handler's own work can fault.
    let faults = faults::faults_since(r);
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
        faults::charge_faults(f, unsafe { sampled_node(node) });
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
        faults::charge_owner(addr);
    }
    life::renew_period(t, r, i, ev);
}

/// The ring of thread record `r`'s event `i` and its size, if its samples
/// are read from one (an IBS event: its holding mapping; with fasync: the
/// fasync ring).
pub(super) fn ibs_ring(r: &PerThread, i: usize) -> Option<(usize, usize)> {
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

/// -oc: the thread's time off the CPU since its previous switch back
/// (wall-clock minus its own CPU time), and the marks moved to now.
pub(super) fn off_cpu_ns(r: &PerThread) -> u64 {
    let (wall, cpu) = (sys::monotonic_ns(), sys::thread_cpu_ns());
    wall.saturating_sub(r.wall_mark.swap(wall, Ordering::Relaxed))
        .saturating_sub(cpu.saturating_sub(r.cpu_mark.swap(cpu, Ordering::Relaxed)))
}

/// A sample of event `i` that landed in the profiler's own code on thread
/// `t`: counted, not charged.
pub(super) fn inside(t: &'static ThreadState, i: u8) {
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
        faults::consume_faults(r);
    }
}
