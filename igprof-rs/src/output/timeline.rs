//! The timeline: the process's totals at regular times, kept in memory of
//! a size fixed when the first point is taken, and written in every
//! profile as the header's timeline note (`igprof_format::notes`).
//!
//! Owns the points ([`add_point`]: time since the process started, its
//! CPU time, RSS and peak RSS as the caller read them, and for each
//! counter that adds up, the sums
//! of its two values over every thread's call tree — live heap bytes and
//! blocks, allocation calls, open descriptors, samples: what the modules
//! running count), their thinning when [`POINTS`] are taken (every other
//! point goes and the step doubles, so the series always covers the whole
//! run, at one point per step for its first [`POINTS`] steps), and the
//! copy the dump writer reads ([`note`]).
//!
//! One writer at a time: the keeper every `Options::timeline_ns` (so the
//! program pays nothing and stays single-threaded), or the watcher thread
//! where no keeper runs, and the final dump for the last point. Readers
//! (any dump: the watcher's, the program's final one, the keeper's) copy
//! the points under a sequence counter and leave the note out if the
//! writer never let them finish.
//!
//! Must never: allocate, touch TLS or call libc in [`add_point`] (the
//! keeper runs it), or grow with the run's length.

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use igprof_format::notes::Timeline;

use crate::base::counters::{self, Merge};
use crate::base::{options, thread};

/// How many points the series holds before it thins.
pub const POINTS: usize = 2048;
/// The columns before the counters' (see the format's note).
const FIXED: [&str; 4] = ["t_ms", "cpu_ms", "rss_kib", "peak_rss_kib"];
/// A value not known (the kernel did not say).
const UNKNOWN: u64 = u64::MAX;

struct Series {
    /// The counter slots summed, in column order.
    slots: Vec<usize>,
    /// The column names.
    columns: Vec<String>,
    /// POINTS rows of `columns.len()` values.
    values: Vec<AtomicU64>,
}

static SERIES: OnceLock<Series> = OnceLock::new();
/// Points taken (<= POINTS).
static LEN: AtomicUsize = AtomicUsize::new(0);
/// The step between points now (ns; 0 before the first point).
static STEP: AtomicU64 = AtomicU64::new(0);
/// Odd while the writer changes the points.
static SEQ: AtomicU32 = AtomicU32::new(0);

fn series() -> &'static Series {
    SERIES.get_or_init(|| {
        let mut slots = Vec::new();
        let mut columns: Vec<String> = FIXED.iter().map(|c| c.to_string()).collect();
        for slot in 0..counters::nslots() {
            let d = counters::def_of_slot(slot);
            // A maximum's sum means nothing; MEM_LIVE_AT_PEAK is a copy of
            // MEM_LIVE at its peak.
            if d.merge == Merge::Max || d.name == "MEM_LIVE_AT_PEAK" {
                continue;
            }
            slots.push(slot);
            columns.push(format!("{}.count", d.name));
            columns.push(format!("{}.total", d.name));
        }
        let values = (0..POINTS * columns.len())
            .map(|_| AtomicU64::new(0))
            .collect();
        Series {
            slots,
            columns,
            values,
        }
    })
}

/// Start-up (and nothing later allocates): the points' memory, when
/// the options ask for a timeline.
pub fn prepare() {
    if options::get().timeline_ns() != 0 {
        series();
    }
}

/// Adds a point with `facts` (`[t_ms, cpu_ms, rss_kib, peak_rss_kib]`,
/// `u64::MAX` where not known) and now's counter sums; returns the step
/// to the next point (ns; 0: no timeline). Called by the keeper (no TLS,
/// no libc, no allocation here), else the watcher, and by the final dump
/// for the last point; skipped while another point is being added.
pub fn add_point(facts: &[u64; 4]) -> u64 {
    let Some(s) = SERIES.get() else { return 0 };
    let seq = SEQ.load(Ordering::Relaxed);
    if seq & 1 != 0
        || SEQ
            .compare_exchange(seq, seq + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return step_ns();
    }
    let width = s.columns.len();
    let mut len = LEN.load(Ordering::Relaxed);
    if STEP.load(Ordering::Relaxed) == 0 {
        STEP.store(options::get().timeline_ns(), Ordering::Relaxed);
    }
    if len == POINTS {
        // Keep the odd points (1, 3, ...): the step between them doubles,
        // and the newest stays.
        for i in 0..POINTS / 2 {
            for c in 0..width {
                let v = s.values[(2 * i + 1) * width + c].load(Ordering::Relaxed);
                s.values[i * width + c].store(v, Ordering::Relaxed);
            }
        }
        len = POINTS / 2;
        STEP.store(STEP.load(Ordering::Relaxed) * 2, Ordering::Relaxed);
    }
    let row = &s.values[len * width..(len + 1) * width];
    for (v, f) in row.iter().zip(facts) {
        v.store(*f, Ordering::Relaxed);
    }
    // The kernel's VmHWM is the larger of a recorded high-water mark and
    // the RSS now, and the mark is not updated at every change: a peak
    // seen at one point may be reported lower at the next. A peak does
    // not go down.
    if len > 0 && facts[3] != UNKNOWN {
        let before = s.values[(len - 1) * width + 3].load(Ordering::Relaxed);
        if before != UNKNOWN && before > facts[3] {
            row[3].store(before, Ordering::Relaxed);
        }
    }
    sum_counters(&s.slots, &row[FIXED.len()..]);
    LEN.store(len + 1, Ordering::Relaxed);
    SEQ.store(seq + 2, Ordering::Release);
    step_ns()
}

/// The step between points now (ns): the configured interval until the
/// series first thins.
pub fn step_ns() -> u64 {
    match STEP.load(Ordering::Relaxed) {
        0 => options::get().timeline_ns(),
        s => s,
    }
}

/// `out[2k]`, `out[2k+1]`: the sums of the ticks and values of counter
/// slot `slots[k]` over every live thread's call tree.
fn sum_counters(slots: &[usize], out: &[AtomicU64]) {
    let mut sums = [0u64; 2 * counters::COUNT];
    for t in thread::dumped() {
        t.tree().for_each_node(|n| {
            for (k, &slot) in slots.iter().enumerate() {
                let (ticks, value, _) = n.get(slot);
                sums[2 * k] = sums[2 * k].wrapping_add(ticks);
                sums[2 * k + 1] = sums[2 * k + 1].wrapping_add(value);
            }
        });
    }
    for (o, v) in out.iter().zip(sums) {
        o.store(v, Ordering::Relaxed);
    }
}

/// The timeline note, or None when no point was taken (or the writer
/// kept changing them).
pub fn note() -> Option<String> {
    let s = SERIES.get()?;
    let width = s.columns.len();
    for _ in 0..100 {
        let before = SEQ.load(Ordering::Acquire);
        if before & 1 != 0 {
            std::thread::yield_now();
            continue;
        }
        let len = LEN.load(Ordering::Relaxed);
        let step = STEP.load(Ordering::Relaxed);
        let points: Vec<Vec<Option<i64>>> = (0..len)
            .map(|p| {
                (0..width)
                    .map(|c| match s.values[p * width + c].load(Ordering::Relaxed) {
                        UNKNOWN => None,
                        v => Some(v as i64),
                    })
                    .collect()
            })
            .collect();
        core::sync::atomic::fence(Ordering::Acquire);
        if SEQ.load(Ordering::Relaxed) != before {
            continue;
        }
        if points.is_empty() {
            return None;
        }
        let t = Timeline {
            every_ms: step / 1_000_000,
            columns: s.columns.clone(),
            points,
        };
        return Some(igprof_format::notes::timeline_note(&t));
    }
    None
}

/// A fork child's series starts empty (its profile is its own).
pub fn reset_after_fork() {
    SEQ.store(0, Ordering::Relaxed);
    LEN.store(0, Ordering::Relaxed);
    STEP.store(0, Ordering::Relaxed);
}
