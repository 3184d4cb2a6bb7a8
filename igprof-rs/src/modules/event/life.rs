//! A thread's events over its life: opened at thread begin (and in a
//! forked child's thread), each with its own drawn period, reopened with a
//! new period every so often, ended at thread end, final dump and exec
//! (what a frequency event counted after its last sample charged there),
//! and let go in a forked child that inherited its parent's.
//!
//! Must never: leave a thread unsampled while an event is replaced (the
//! new one is enabled before the old one ends), keep a descriptor in the
//! program's low numbers, or unmap a page another thread's handler may be
//! reading.

use core::sync::atomic::{AtomicU64, Ordering};

use super::record::{counted_since, existing, record, sampled_node, PerThread};
use super::table::{events, fasync_kind, Charge, Event, MAX_EVENTS, OFF, SLOTS};
use super::{count, faults, ibs};
use crate::base::thread::{self, ThreadState};
use crate::sampler;
use crate::sys;

/// Threads whose event could not be opened (the first error is said).
static NOT_OPENED: AtomicU64 = AtomicU64::new(0);
/// Samples between two draws of a thread's period.
const RENEW_EVERY: u32 = 512;
/// Periods from which the per-thread jitter applies.
const JITTER_FROM: u64 = 100;

/// The period of event `ev` for one thread's next run of samples.
pub(super) fn draw(t: &ThreadState, ev: &Event) -> u64 {
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
pub(super) fn open_one(t: &ThreadState, r: &PerThread, i: usize, ev: &Event) -> Result<(), i32> {
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
        // The thread's own clock: an attach opens events for threads
        // that ran before it from another thread.
        let cpu = sys::thread_cpu_ns_of(t.tid());
        r.cpu_mark.store(cpu, Ordering::Relaxed);
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

/// Opens event `i` with sigtrap delivery and enables it: (the mapping that
/// holds it or 0, its descriptor or -1). The descriptor is closed when the
/// mapping holds the event and no sample reads its count.
pub(super) fn hold_sigtrap(
    t: &ThreadState,
    i: usize,
    ev: &Event,
    period: u64,
) -> Result<(usize, i32), i32> {
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
pub(super) fn end(ev: Option<&Event>, (hold, fd, ring): (usize, i32, usize)) {
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
pub(super) fn open_all(t: &'static ThreadState) {
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
        faults::open_group(t, r, pf);
    }
    for (i, ev) in evs.iter().enumerate() {
        if OFF[i].load(Ordering::Relaxed) {
            continue;
        }
        if ev.charge == Charge::PageFault {
            // Counted from the moment the faults are sampled.
            faults::consume_faults(r);
        }
        if let Err(e) = open_one(t, r, i, ev) {
            if NOT_OPENED.fetch_add(1, Ordering::Relaxed) == 0 {
                crate::igprof_log!(
                    "-e {}: cannot open it on thread {}: {}; that thread is not sampled for it",
                    ev.text,
                    t.tid(),
                    ev.kind.refusal(e)
                );
            }
        }
    }
}

/// Ends the thread's events (thread end, final dump, exec): its counting
/// groups' last counts go to its latest sample's stack.
pub(super) fn close_all(t: &'static ThreadState) {
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
pub(super) fn end_all(t: &'static ThreadState, final_read: bool, unmap: bool) {
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
    faults::close_group(r);
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
pub(super) fn forget_inherited() {
    // The child's only thread runs this: nothing else reads the pages.
    for t in thread::all() {
        end_all(t, false, true);
    }
    ibs::reset();
}

/// Counts a sample of event `i` and draws the thread's period again every
/// [`RENEW_EVERY`] samples.
pub(super) fn renew_period(t: &'static ThreadState, r: &PerThread, i: usize, ev: &Event) {
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
