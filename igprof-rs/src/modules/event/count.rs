//! Counting groups beside samples (`-c EVENT,EVENT...`): each thread counts
//! the events of a group together, and at each of its CPU samples (`-pp`,
//! `-pu`, `-pr`) the group is read and what each event counted since the
//! previous sample is charged to the sampled stack, so every function gets
//! its own cycles, instructions, misses, faults (and igprof-analyse can
//! show ratios such as instructions per cycle between two reports).
//!
//! Counters `CNT_<EVENT>` (`-c page-faults` is `CNT_PAGE_FAULTS`): ticks
//! are the samples that read it, the value the events counted.
//!
//! Multiplexing: when a PMU has fewer counters than the events enabled, the
//! kernel rotates the groups and says for how long each was enabled and for
//! how long it really counted (`TOTAL_TIME_ENABLED`/`RUNNING`). Each
//! interval's counts are scaled by its enabled/running ratio ([`scaled`]),
//! as perf stat scales a whole run; the share of the time each group
//! counted is reported with `-d` and in the profile header's program name
//! (IgProf's grammar has no other room). A group that never counts on the
//! main thread at start-up (too big for the PMU) is split in two, and so
//! on, and that is said. Software events are never multiplexed.
//!
//! Reading: where every event's user page says its counter may be read
//! from user space (`cap_user_rdpmc`: hardware counters), with `rdpmc`
//! ([`super::userpage`]); otherwise one `read(2)` of the group's leader
//! (software events, or a counter not scheduled at that instant). The
//! events' descriptors are kept, moved high, and their first pages mapped.
//! `-d` says how many reads each way took.
//!
//! Must never: allocate, lock or change errno in [`on_sample`].

use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::table::kind_of;
use crate::base::counters::{self, CounterId};
use crate::base::thread::{Guard, ThreadState};
use crate::base::tree::Node;
use crate::sys::{self, PerfEventKind};

/// Groups, and counted events in all, per run.
pub const MAX_GROUPS: usize = 4;
pub const MAX_COUNTED: usize = 8;

/// One counted event.
struct Counted {
    text: String,
    name: &'static str,
    kind: PerfEventKind,
    id: CounterId,
}

/// One group: its events are counted together (same time enabled/running).
struct Group {
    events: Vec<Counted>,
    /// Index of its first event among all counted events.
    first: usize,
}

static GROUPS: OnceLock<Vec<Group>> = OnceLock::new();
static SLOTS: [AtomicUsize; MAX_COUNTED] = [const { AtomicUsize::new(usize::MAX) }; MAX_COUNTED];
/// Per group, over all threads: time enabled and time counting (ns).
static ENABLED: [AtomicU64; MAX_GROUPS] = [const { AtomicU64::new(0) }; MAX_GROUPS];
static RUNNING: [AtomicU64; MAX_GROUPS] = [const { AtomicU64::new(0) }; MAX_GROUPS];
/// Group reads by rdpmc and by read(2), all threads.
static BY_RDPMC: AtomicU64 = AtomicU64::new(0);
static BY_READ: AtomicU64 = AtomicU64::new(0);

fn groups() -> &'static [Group] {
    GROUPS.get().map_or(&[], |v| v.as_slice())
}

/// A thread's counting groups (part of its event record).
#[repr(C)]
pub struct PerThread {
    /// Each group's leader descriptor + 1 (0: none).
    leader: [AtomicI32; MAX_GROUPS],
    /// The members' descriptors + 1, by counted-event index.
    fd: [AtomicI32; MAX_COUNTED],
    /// Their user pages (0: none).
    page: [AtomicUsize; MAX_COUNTED],
    /// What each event had counted at the previous read.
    last: [AtomicU64; MAX_COUNTED],
    last_enabled: [AtomicU64; MAX_GROUPS],
    last_running: [AtomicU64; MAX_GROUPS],
    /// Enabled time of intervals in which the group did not count at all,
    /// carried to the next interval in which it does.
    carried: [AtomicU64; MAX_GROUPS],
}

/// One interval's count scaled for multiplexing: the group counted during
/// `running` of the `enabled` nanoseconds it was enabled, plus the enabled
/// time `carried` from earlier intervals in which it did not count at
/// all, so it stands for `delta * (enabled + carried) / running` events.
/// Returns that and the time to carry on (the whole interval's when it did
/// not count).
pub fn scaled(delta: u64, enabled: u64, running: u64, carried: u64) -> (u64, u64) {
    if running == 0 {
        return (0, carried + enabled);
    }
    let enabled = enabled + carried;
    if running >= enabled {
        // Running can exceed enabled by the kernel's rounding.
        return (delta, 0);
    }
    (
        (delta as u128 * enabled as u128 / running as u128) as u64,
        0,
    )
}

/// Resolves the `-c` groups and names their counters, from counter index
/// `next` on (start-up, main thread, before the counters freeze). Each
/// group is trial-opened; a group that does not count is split.
pub fn register(o: &crate::base::options::Options, mut next: usize) {
    let mut out: Vec<Group> = Vec::new();
    let mut total = 0;
    if o.perf.is_none() && o.count_groups().next().is_some() {
        crate::igprof_log!("-c: counting groups are read at the CPU samples: add -pp (or -pu, -pr); running without them");
        let _ = GROUPS.set(out);
        return;
    }
    for list in o.count_groups() {
        let mut group = Vec::new();
        for text in igprof_events::split_list(list) {
            let say = |why: &str| crate::igprof_log!("-c {text}: {why}; counting without it");
            let spec = match igprof_events::parse(text) {
                Ok(s) if s.period.is_none() => s,
                Ok(_) => {
                    say("a counted event takes no period");
                    continue;
                }
                Err(e) => {
                    say(&e.why);
                    continue;
                }
            };
            let attr =
                match igprof_events::resolve(&spec, std::path::Path::new(igprof_events::DEVICES)) {
                    Ok(a) => a,
                    Err(e) => {
                        say(&e.to_string());
                        continue;
                    }
                };
            let name = format!("CNT_{}", &spec.counter_name()["EV_".len()..]);
            if total == MAX_COUNTED || next == counters::EVENTS {
                say(&format!("at most {MAX_COUNTED} counted events per run"));
                continue;
            }
            let kind = kind_of(&attr);
            match sys::perf_counter_open(&kind, sys::gettid(), -1) {
                Ok(fd) => sys::close(fd),
                Err(e) => {
                    say(&kind.refusal(e.0));
                    continue;
                }
            }
            let id = counters::EVENT_IDS[next];
            next += 1;
            total += 1;
            counters::set_event_name(next - 1, Box::leak(name.clone().into_boxed_str()));
            counters::enable(id);
            group.push(Counted {
                text: text.to_string(),
                name: Box::leak(name.into_boxed_str()),
                kind,
                id,
            });
        }
        for g in split_until_counting(group) {
            if out.len() == MAX_GROUPS {
                crate::igprof_log!(
                    "-c {list}: at most {MAX_GROUPS} groups per run; counting without it"
                );
                break;
            }
            let first = out.iter().map(|g| g.events.len()).sum();
            out.push(Group { events: g, first });
        }
    }
    let _ = GROUPS.set(out);
}

/// `events` as one group if it counts when opened together on this thread,
/// else as halves (recursively): a group bigger than the PMU's counters
/// never counts (time running 0).
fn split_until_counting(events: Vec<Counted>) -> Vec<Vec<Counted>> {
    if events.len() < 2 || counts_together(&events) {
        return if events.is_empty() {
            vec![]
        } else {
            vec![events]
        };
    }
    let names: Vec<&str> = events.iter().map(|e| e.text.as_str()).collect();
    crate::igprof_log!(
        "-c {}: the group never counted together (more events than the PMU has counters): split in two",
        names.join(",")
    );
    let mut events = events;
    let second = events.split_off(events.len() / 2);
    let mut v = split_until_counting(events);
    v.extend(split_until_counting(second));
    v
}

/// Whether `events`, opened as one group on this thread, count.
fn counts_together(events: &[Counted]) -> bool {
    let tid = sys::gettid();
    let Ok(leader) = sys::perf_counter_open(&events[0].kind, tid, -1) else {
        return false;
    };
    let members: Vec<i32> = events[1..]
        .iter()
        .filter_map(|e| sys::perf_counter_open(&e.kind, tid, leader).ok())
        .collect();
    let mut out = [0u64; MAX_COUNTED];
    let ok = members.len() + 1 == events.len() && sys::perf_enable_group(leader) && {
        // Some work for the group to be scheduled in.
        let _ = sys::thread_cpu_ns();
        let _ = sys::monotonic_ns();
        sys::perf_read_group(leader, &mut out[..events.len()])
            .is_some_and(|(enabled, running)| running > 0 || enabled == 0)
    };
    for fd in members.into_iter().chain([leader]) {
        sys::close(fd);
    }
    ok
}

/// Looks the counter slots up (after the freeze).
pub fn init_slots() {
    for g in groups() {
        for (k, e) in g.events.iter().enumerate() {
            if let Some(s) = counters::slot(e.id) {
                SLOTS[g.first + k].store(s, Ordering::Relaxed);
            }
        }
    }
}

/// Whether the run counts anything.
pub fn any() -> bool {
    !groups().is_empty()
}

/// Opens the thread's groups (calling thread); the first read is the base
/// of the next sample's deltas.
pub fn open(t: &ThreadState, r: &PerThread) {
    for (gi, g) in groups().iter().enumerate() {
        let Ok(leader) = sys::perf_counter_open(&g.events[0].kind, t.tid(), -1) else {
            continue;
        };
        let leader = sys::move_fd_up(leader, crate::sampler::high_fd_base());
        keep(r, g.first, leader);
        for (k, e) in g.events.iter().enumerate().skip(1) {
            if let Ok(fd) = sys::perf_counter_open(&e.kind, t.tid(), leader) {
                keep(
                    r,
                    g.first + k,
                    sys::move_fd_up(fd, crate::sampler::high_fd_base()),
                );
            }
        }
        if !sys::perf_enable_group(leader) {
            close_group(r, g, true);
            continue;
        }
        r.leader[gi].store(leader + 1, Ordering::Release);
        read_group(r, gi, g, None, true);
    }
}

/// Keeps counted event `i`'s descriptor and maps its user page (for
/// rdpmc; none if the mapping is refused).
fn keep(r: &PerThread, i: usize, fd: i32) {
    r.fd[i].store(fd + 1, Ordering::Release);
    r.page[i].store(sys::perf_hold(fd).unwrap_or(0), Ordering::Release);
}

fn close_group(r: &PerThread, g: &Group, unmap: bool) {
    for k in 0..g.events.len() {
        let page = r.page[g.first + k].swap(0, Ordering::AcqRel);
        if page != 0 && unmap {
            sys::perf_release(page);
        }
        let fd = r.fd[g.first + k].swap(0, Ordering::AcqRel) - 1;
        if fd >= 0 {
            sys::close(fd);
        }
    }
}

/// Group `g` read from user space: every event's page allows rdpmc (the
/// times are the leader's). None otherwise.
fn read_user(r: &PerThread, g: &Group, now: &mut [u64]) -> Option<(u64, u64)> {
    let mut times = None;
    for (k, v) in now.iter_mut().enumerate() {
        let page = r.page[g.first + k].load(Ordering::Relaxed);
        if page == 0 {
            return None;
        }
        // SAFETY: the event's first page, mapped by `keep` on this thread
        // (which reads its own counters only).
        let got = unsafe { super::userpage::read_now(page as *const u8) }?;
        *v = got.count;
        times.get_or_insert((got.enabled, got.running));
    }
    times
}

/// Closes the thread's groups (thread end, final dump, exec, a forked
/// child's copy of its parent's), after a last read charged to `last`
/// (the thread's latest sample's node, if any), so that the counts since
/// that sample are not lost.
/// `unmap`: the events' pages are unmapped too (not while the thread's
/// handler may be reading them: see the caller).
pub fn close(r: &PerThread, last: Option<&Node>, unmap: bool) {
    for (gi, g) in groups().iter().enumerate() {
        if last.is_some() {
            read_group(r, gi, g, last, false);
        }
        r.leader[gi].store(0, Ordering::Release);
        close_group(r, g, unmap);
    }
}

/// Reads group `gi` and charges what each event counted since the
/// previous read to `node` (None: only sets the base). `own`: the calling
/// thread is the one counted (rdpmc reads the calling CPU's counters, so
/// only then).
fn read_group(r: &PerThread, gi: usize, g: &Group, node: Option<&Node>, own: bool) {
    let leader = r.leader[gi].load(Ordering::Acquire) - 1;
    if leader < 0 {
        return;
    }
    let n = g.events.len();
    let mut now = [0u64; MAX_COUNTED];
    let read = match own.then(|| read_user(r, g, &mut now[..n])).flatten() {
        Some(t) => {
            BY_RDPMC.fetch_add(1, Ordering::Relaxed);
            Some(t)
        }
        None => {
            BY_READ.fetch_add(1, Ordering::Relaxed);
            sys::perf_read_group(leader, &mut now[..n])
        }
    };
    let Some((enabled, running)) = read else {
        return;
    };
    let d_enabled = enabled.saturating_sub(r.last_enabled[gi].swap(enabled, Ordering::Relaxed));
    let d_running = running.saturating_sub(r.last_running[gi].swap(running, Ordering::Relaxed));
    if node.is_some() {
        ENABLED[gi].fetch_add(d_enabled, Ordering::Relaxed);
        RUNNING[gi].fetch_add(d_running, Ordering::Relaxed);
    }
    let carried = r.carried[gi].load(Ordering::Relaxed);
    let mut carry_on = 0;
    for (k, &v) in now[..n].iter().enumerate() {
        let delta = v.saturating_sub(r.last[g.first + k].swap(v, Ordering::Relaxed));
        let (value, carry) = scaled(delta, d_enabled, d_running, carried);
        carry_on = carry;
        let slot = SLOTS[g.first + k].load(Ordering::Relaxed);
        if let (Some(node), true) = (node, slot != usize::MAX) {
            // Shared: the final read may come from the thread that writes
            // the profile.
            node.counter(slot).add_shared(1, value);
        }
    }
    r.carried[gi].store(if node.is_some() { carry_on } else { 0 }, Ordering::Relaxed);
}

/// A CPU sample of the thread landed on `node`: every group is read and
/// charged there (signal context, inside profiler code: `_held`).
pub fn on_sample(_held: &Guard, r: &PerThread, node: &Node) {
    for (gi, g) in groups().iter().enumerate() {
        read_group(r, gi, g, Some(node), true);
    }
}

/// Each group's events and the share of its enabled time it counted.
fn shares() -> Vec<(String, f64)> {
    groups()
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let (e, r) = (
                ENABLED[gi].load(Ordering::Relaxed),
                RUNNING[gi].load(Ordering::Relaxed),
            );
            let names: Vec<&str> = g.events.iter().map(|c| c.text.as_str()).collect();
            (
                names.join(","),
                if e == 0 {
                    100.0
                } else {
                    100.0 * r as f64 / e as f64
                },
            )
        })
        .collect()
}

/// `-d`: how long each group really counted.
pub fn report() {
    for (names, share) in shares() {
        crate::igprof_log!("-c {names}: counted {share:.1}% of the time it was enabled (counts scaled by enabled/running)");
    }
    crate::igprof_log!(
        "-c: {} group reads with rdpmc, {} with read(2)",
        BY_RDPMC.load(Ordering::Relaxed),
        BY_READ.load(Ordering::Relaxed)
    );
}

/// The profile header's note: each group's share of counting time.
pub fn header_note() -> Option<String> {
    let s = shares();
    (!s.is_empty()).then(|| {
        let parts: Vec<String> = s
            .iter()
            .map(|(n, p)| format!("{n} counted {p:.0}%"))
            .collect();
        format!("counting groups: {}", parts.join("; "))
    })
}

/// For the start-up line.
pub fn describe() -> Option<String> {
    let names: Vec<&str> = groups()
        .iter()
        .flat_map(|g| g.events.iter().map(|e| e.name))
        .collect();
    (!names.is_empty()).then(|| format!("counting {} at each sample", names.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cumulative (enabled, running, count) readings of one group at each
    /// sample, as a PMU that multiplexes groups gives them (the group
    /// counts in turns, sometimes not at all between two samples, 5 ms
    /// apart) for an event that occurs 1000 times per ms.
    const SERIES: [(u64, u64, u64); 5] = [
        (5_000_000, 4_000_000, 4_000),
        (10_000_000, 4_000_000, 4_000),
        (15_000_000, 7_000_000, 7_000),
        (20_000_000, 8_000_000, 8_000),
        (25_000_000, 12_000_000, 12_000),
    ];

    #[test]
    fn multiplexed_counts_are_scaled_per_interval() {
        let (mut last, mut carried) = ((0, 0, 0), 0);
        let mut per_sample = Vec::new();
        for &(e, r, c) in &SERIES {
            let (v, carry) = scaled(c - last.2, e - last.0, r - last.1, carried);
            per_sample.push(v);
            carried = carry;
            last = (e, r, c);
        }
        // Each interval in which the group counted stands for its 5000
        // events; the one in which it did not count is carried to the
        // next, which stands for both.
        assert_eq!(per_sample, [5_000, 0, 10_000, 5_000, 5_000]);
        // In all, what perf stat estimates for the whole run.
        let (e, r, c) = SERIES[4];
        assert_eq!(per_sample.iter().sum::<u64>(), c * e / r);
    }

    #[test]
    fn unmultiplexed_counts_are_exact() {
        assert_eq!(scaled(1234, 5_000_000, 5_000_000, 0), (1234, 0));
        assert_eq!(scaled(0, 5_000_000, 0, 0), (0, 5_000_000));
        // Running can exceed enabled by the kernel's rounding: not scaled down.
        assert_eq!(scaled(10, 100, 101, 0), (10, 0));
        assert_eq!(scaled(u64::MAX / 2, 4, 2, 0), (u64::MAX - 1, 0));
    }
}
