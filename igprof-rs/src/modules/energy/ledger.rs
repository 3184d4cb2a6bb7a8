//! The running account between the energy source and the profiled threads:
//! what the runtime's `-np` sampling path calls.
//!
//! Owns: a fixed table of registered threads, closing an interval (read the
//! meter, read every registered thread's CPU clock, [`attribute`] the
//! energy, credit each thread), and handing a thread what it is owed as
//! integer counter values. Everything is allocated in [`Ledger::new`]; the
//! calls made from signal context ([`Ledger::close_interval`],
//! [`Ledger::take`]) use only atomics, `clock_gettime` and `read`/`pread`.
//! Closing is guarded by a try-lock: a thread that finds it taken skips the
//! close instead of waiting, so an interrupted closer cannot deadlock.
//!
//! How the runtime uses it:
//! * start-up: `Ledger::new(Some(meter), default_policy(&root), max_threads, T,
//!   min_interval_ns)`;
//! * thread start: `slot = ledger.register(gettid())` (on the new thread);
//! * every sample of any thread: `ledger.close_interval()` (closes at most
//!   once per `min_interval_ns`), then `ledger.take(slot)` and add the
//!   returned values to that thread's `NRG_*` counters of the sampled stack;
//! * thread exit: `ledger.take(slot)` once more, then `ledger.unregister(slot)`;
//! * before a dump: `ledger.close_now()`, then each thread's `take`;
//! * in a fork child: `ledger.reset_after_fork()`, then `register` again;
//! * dump: write [`Ledger::residual`] (`unattributed + after_exit`) as one
//!   more tree of a single node, a synthetic function `<unattributed>`, e.g.
//!   `C1 FN9=(F4=(<unattributed>)+0 N=(<unattributed>))+0 V2=(NRG_PKG):(c,v,v)`
//!   with `c` = [`Ledger::closes`] and `v` the value (peak = value, as for
//!   IgProf's tick counters), one `V` per measured domain. The report's
//!   total is then all the energy measured (see the README's Energy section).
//!
//! A thread is charged for energy at its first sample after the interval in
//! which it ran closed: the stack charged is the one sampled then.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};

use super::attribution::{attribute, SharePolicy};
use super::error::ReadError;
use super::{Energy, EnergyMeter, DOMAINS};
use crate::sys;
use crate::sys::fast_monotonic_ns as monotonic_ns;

/// Energy is credited in nanojoules (a u64 holds 18 GJ).
const NJ: f64 = 1e9;

const FREE: u8 = 0;
const CLAIMING: u8 = 1;
const LIVE: u8 = 2;
const EXITED: u8 = 3;

/// A thread's place in the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotId(usize);

impl SlotId {
    /// The slot's index, for keeping it where a ledger type cannot go.
    pub fn index(self) -> usize {
        self.0
    }

    /// The slot of an index from [`SlotId::index`].
    pub fn from_index(i: usize) -> SlotId {
        SlotId(i)
    }
}

struct Slot {
    state: AtomicU8,
    tid: AtomicI32,
    /// CPU time at the last close (written by the closer only).
    last_cpu_ns: AtomicU64,
    /// CPU time when the thread unregistered.
    final_cpu_ns: AtomicU64,
    /// Owed to the thread, in nJ.
    owed_nj: [AtomicU64; DOMAINS],
    /// Fraction of a value not yet handed out, in nJ (under `taking`).
    carry_nj: [AtomicU64; DOMAINS],
    /// Try-lock of `take`.
    taking: AtomicBool,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: AtomicU8::new(FREE),
            tid: AtomicI32::new(0),
            last_cpu_ns: AtomicU64::new(0),
            final_cpu_ns: AtomicU64::new(0),
            owed_nj: Default::default(),
            carry_nj: Default::default(),
            taking: AtomicBool::new(false),
        }
    }
}

/// CPU time of a thread of this process, in ns; `None` if it is gone.
pub trait CpuClock {
    fn thread_cpu_ns(&self, tid: i32) -> Option<u64>;
}

/// `clock_gettime` on the thread's CPU clock (`MAKE_THREAD_CPUCLOCK(tid,
/// CPUCLOCK_SCHED)`), which Linux allows for any thread of the process.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelCpuClock;

impl CpuClock for KernelCpuClock {
    fn thread_cpu_ns(&self, tid: i32) -> Option<u64> {
        sys::clock_ns(sys::thread_cpu_clock(tid))
    }
}

/// State only the closer touches (guarded by `closing`).
struct CloseState {
    meter: Option<EnergyMeter>,
    last_wall_ns: u64,
    cpu_ns: Box<[u64]>,
    shares: Box<[Energy]>,
}

/// Energy not charged to any thread, as counter values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Residual {
    /// Idle power, other processes, untracked threads (see `attribution`).
    pub unattributed: [u64; DOMAINS],
    /// Energy earned by threads after their last `take` before exiting.
    pub after_exit: [u64; DOMAINS],
    /// Threads that could not be registered because the table was full
    /// (their CPU time falls into `unattributed`).
    pub untracked_threads: u64,
}

pub struct Ledger {
    slots: Box<[Slot]>,
    policy: SharePolicy,
    nj_per_value: u64,
    min_interval_ns: u64,
    closing: AtomicBool,
    state: UnsafeCell<CloseState>,
    unattributed_nj: [AtomicU64; DOMAINS],
    after_exit_nj: [AtomicU64; DOMAINS],
    untracked: AtomicU64,
    read_errors: AtomicU64,
    carried_over: AtomicU64,
    stalled_reads: AtomicU64,
    closes: AtomicU64,
}

// SAFETY: `state` is only accessed by the thread that won the `closing`
// try-lock (acquire on win, release on unlock); everything else is atomic.
unsafe impl Sync for Ledger {}
// SAFETY: the meter's descriptors and boxed slices may move between threads.
unsafe impl Send for Ledger {}

impl Ledger {
    /// `meter`: the detected source (`None` only for tests driving
    /// [`Ledger::close_with`]); `capacity`: most threads registered at once;
    /// `joules_per_value`: the header's `T` for `NRG_*` counters
    /// ([`super::JOULES_PER_VALUE`] when `-np` sets it); intervals close at
    /// most every `min_interval_ns`.
    pub fn new(
        meter: Option<EnergyMeter>,
        policy: SharePolicy,
        capacity: usize,
        joules_per_value: f64,
        min_interval_ns: u64,
    ) -> Ledger {
        let nj = (joules_per_value * NJ).round();
        Ledger {
            slots: (0..capacity).map(|_| Slot::new()).collect(),
            policy,
            nj_per_value: if nj >= 1.0 { nj as u64 } else { 1 },
            min_interval_ns,
            closing: AtomicBool::new(false),
            state: UnsafeCell::new(CloseState {
                meter: meter.map(|mut m| {
                    // Start the meter's interval now, with the wall clock's.
                    let mut discard = [0.0; DOMAINS];
                    let _ = m.read_deltas(&mut discard);
                    m
                }),
                last_wall_ns: monotonic_ns(),
                cpu_ns: vec![0; capacity].into_boxed_slice(),
                shares: vec![[0.0; DOMAINS]; capacity].into_boxed_slice(),
            }),
            unattributed_nj: Default::default(),
            after_exit_nj: Default::default(),
            untracked: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            carried_over: AtomicU64::new(0),
            stalled_reads: AtomicU64::new(0),
            closes: AtomicU64::new(0),
        }
    }

    /// Register thread `tid`, whose CPU time is now `cpu_now_ns`; `None`
    /// when the table is full (counted in [`Residual::untracked_threads`]).
    /// Lock-free.
    pub fn register_at(&self, tid: i32, cpu_now_ns: u64) -> Option<SlotId> {
        for (i, s) in self.slots.iter().enumerate() {
            if s.state
                .compare_exchange(FREE, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                s.tid.store(tid, Ordering::Relaxed);
                s.last_cpu_ns.store(cpu_now_ns, Ordering::Relaxed);
                for d in 0..DOMAINS {
                    s.owed_nj[d].store(0, Ordering::Relaxed);
                    s.carry_nj[d].store(0, Ordering::Relaxed);
                }
                s.state.store(LIVE, Ordering::Release);
                return Some(SlotId(i));
            }
        }
        self.untracked.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// [`Ledger::register_at`] for the calling thread, reading its CPU clock.
    pub fn register(&self, tid: i32) -> Option<SlotId> {
        let now = KernelCpuClock.thread_cpu_ns(tid).unwrap_or(0);
        self.register_at(tid, now)
    }

    /// The thread is exiting with `final_cpu_ns` of CPU time; its share of
    /// the open interval goes to [`Residual::after_exit`].
    pub fn unregister_at(&self, slot: SlotId, final_cpu_ns: u64) {
        let s = &self.slots[slot.0];
        s.final_cpu_ns.store(final_cpu_ns, Ordering::Relaxed);
        s.state.store(EXITED, Ordering::Release);
    }

    /// [`Ledger::unregister_at`] reading the slot's thread CPU clock (call
    /// on the exiting thread).
    pub fn unregister(&self, slot: SlotId) {
        let tid = self.slots[slot.0].tid.load(Ordering::Relaxed);
        let now = KernelCpuClock
            .thread_cpu_ns(tid)
            .unwrap_or_else(|| self.slots[slot.0].last_cpu_ns.load(Ordering::Relaxed));
        self.unregister_at(slot, now);
    }

    /// Close the interval if `min_interval_ns` has passed and nobody else is
    /// closing: read the meter and every thread's CPU clock, share the
    /// energy. Returns whether it closed. Async-signal-safe.
    pub fn close_interval(&self) -> Result<bool, ReadError> {
        self.close_inner(None, monotonic_ns(), &monotonic_ns, &KernelCpuClock, false)
    }

    /// Close now whatever the time since the last close (before a dump, so
    /// the profile holds all energy up to it; or from a slow timer while
    /// no thread samples, so that a counter cannot wrap twice unseen).
    /// Returns false only if another close is running. Async-signal-safe.
    pub fn close_now(&self) -> Result<bool, ReadError> {
        self.close_inner(None, monotonic_ns(), &monotonic_ns, &KernelCpuClock, true)
    }

    /// Close with energy given instead of read from the meter (tests, and
    /// replays of recorded readings). Closes unconditionally unless another
    /// close is running.
    pub fn close_with(&self, energy: &Energy, now_wall_ns: u64, clock: &dyn CpuClock) -> bool {
        self.close_inner(Some(energy), now_wall_ns, &monotonic_ns, clock, true)
            .unwrap_or(false)
    }

    /// Close now reading the meter, with the wall clock `mono` and the
    /// thread clocks `clock` given (tests that stall a close).
    #[cfg(test)]
    pub(crate) fn close_now_timed(
        &self,
        mono: &dyn Fn() -> u64,
        clock: &dyn CpuClock,
    ) -> Result<bool, ReadError> {
        self.close_inner(None, mono(), mono, clock, true)
    }

    fn close_inner(
        &self,
        given: Option<&Energy>,
        now: u64,
        mono: &dyn Fn() -> u64,
        clock: &dyn CpuClock,
        force: bool,
    ) -> Result<bool, ReadError> {
        if self
            .closing
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(false);
        }
        // SAFETY: we hold the `closing` try-lock, so no other thread touches `state`.
        let st = unsafe { &mut *self.state.get() };
        let wall = now.saturating_sub(st.last_wall_ns);
        if !force && wall < self.min_interval_ns {
            self.closing.store(false, Ordering::Release);
            return Ok(false);
        }
        let mut energy = [0.0; DOMAINS];
        let mut result = Ok(true);
        // The interval ends when the meter was read: a closer preempted
        // between the caller's clock reading and the meter's would charge
        // the energy of the time it waited to a shorter interval (and to
        // the threads that ran in it).
        let now = match (given, st.meter.as_mut()) {
            (Some(e), _) => {
                energy = *e;
                now
            }
            (None, Some(m)) => {
                let read = read_meter(m, mono, &mut energy);
                if read.rereads > 0 {
                    self.stalled_reads.fetch_add(1, Ordering::Relaxed);
                }
                if let Err(e) = read.result {
                    self.read_errors.fetch_add(1, Ordering::Relaxed);
                    result = Err(e);
                }
                read.end_ns.max(now)
            }
            (None, None) => mono().max(now),
        };
        let wall = now.saturating_sub(st.last_wall_ns);
        st.last_wall_ns = now;

        // CPU time of every registered thread in this interval.
        let mut used: u64 = 0;
        for (i, s) in self.slots.iter().enumerate() {
            st.cpu_ns[i] = 0;
            let state = s.state.load(Ordering::Acquire);
            if state != LIVE && state != EXITED {
                continue;
            }
            let cur = if state == EXITED {
                Some(s.final_cpu_ns.load(Ordering::Relaxed))
            } else {
                clock.thread_cpu_ns(s.tid.load(Ordering::Relaxed))
            };
            if let Some(cur) = cur {
                st.cpu_ns[i] = cur.saturating_sub(s.last_cpu_ns.load(Ordering::Relaxed));
                used = used.saturating_add(st.cpu_ns[i]);
            }
        }
        // The clocks are read one after the other, after the energy: if the
        // closer is preempted in between, threads show more CPU time than
        // the interval could hold. That excess belongs to the next interval:
        // count only what fits and leave the rest on the threads' clocks.
        if let SharePolicy::CpuCapacity { cpus } = self.policy {
            let capacity = wall.saturating_mul(u64::from(cpus.max(1)));
            if used > capacity {
                let fit = capacity as f64 / used as f64;
                for c in st.cpu_ns.iter_mut() {
                    *c = (*c as f64 * fit) as u64;
                }
                self.carried_over.fetch_add(1, Ordering::Relaxed);
            }
        }
        for (s, &c) in self.slots.iter().zip(st.cpu_ns.iter()) {
            s.last_cpu_ns.fetch_add(c, Ordering::Relaxed);
        }
        let un = attribute(&energy, wall, self.policy, &st.cpu_ns, &mut st.shares);
        add_nj(&self.unattributed_nj, &un);

        for (i, s) in self.slots.iter().enumerate() {
            let state = s.state.load(Ordering::Acquire);
            if state == LIVE {
                add_nj(&s.owed_nj, &st.shares[i]);
            } else if state == EXITED {
                add_nj(&self.after_exit_nj, &st.shares[i]);
                for d in 0..DOMAINS {
                    let left = s.owed_nj[d].swap(0, Ordering::Relaxed);
                    self.after_exit_nj[d].fetch_add(left, Ordering::Relaxed);
                }
                s.state.store(FREE, Ordering::Release);
            }
        }
        self.closes.fetch_add(1, Ordering::Relaxed);
        self.closing.store(false, Ordering::Release);
        result
    }

    /// What `slot`'s thread is owed since its last `take`, as counter values
    /// (the fraction of a value stays for next time). Any thread may call it
    /// (the owner at its samples, the dumping thread for everyone); a call
    /// that finds another `take` of the same slot running, or interrupts
    /// one, gets zeros and the energy stays owed. Async-signal-safe.
    pub fn take(&self, slot: SlotId) -> [u64; DOMAINS] {
        let s = &self.slots[slot.0];
        let mut out = [0u64; DOMAINS];
        if s.taking.swap(true, Ordering::Acquire) {
            return out;
        }
        for ((o, owed), carry) in out.iter_mut().zip(&s.owed_nj).zip(&s.carry_nj) {
            let nj = owed
                .swap(0, Ordering::Relaxed)
                .saturating_add(carry.load(Ordering::Relaxed));
            *o = nj / self.nj_per_value;
            carry.store(nj % self.nj_per_value, Ordering::Relaxed);
        }
        s.taking.store(false, Ordering::Release);
        out
    }

    /// Energy charged to no thread so far, as counter values.
    pub fn residual(&self) -> Residual {
        let mut r = Residual {
            untracked_threads: self.untracked.load(Ordering::Relaxed),
            ..Residual::default()
        };
        for d in 0..DOMAINS {
            r.unattributed[d] = self.unattributed_nj[d].load(Ordering::Relaxed) / self.nj_per_value;
            r.after_exit[d] = self.after_exit_nj[d].load(Ordering::Relaxed) / self.nj_per_value;
        }
        r
    }

    /// Closes whose meter read failed (the energy is not lost: it is counted
    /// at the next successful read).
    pub fn read_errors(&self) -> u64 {
        self.read_errors.load(Ordering::Relaxed)
    }

    /// In a child after `fork`, where only the forking thread exists: forget
    /// every thread and all energy so far, and start a new interval now.
    /// The caller registers its thread again. Returns false (and does
    /// nothing) if a close was in progress, which after `fork` means the
    /// parent forked from inside a close: call again after it.
    pub fn reset_after_fork(&self) -> bool {
        if self
            .closing
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // SAFETY: we hold the `closing` try-lock.
        let st = unsafe { &mut *self.state.get() };
        if let Some(m) = st.meter.as_mut() {
            let mut discard = [0.0; DOMAINS];
            let _ = m.read_deltas(&mut discard);
        }
        st.last_wall_ns = monotonic_ns();
        for s in self.slots.iter() {
            s.state.store(FREE, Ordering::Release);
            s.taking.store(false, Ordering::Relaxed);
            for a in s.owed_nj.iter().chain(s.carry_nj.iter()) {
                a.store(0, Ordering::Relaxed);
            }
        }
        for acc in [&self.unattributed_nj, &self.after_exit_nj] {
            for a in acc.iter() {
                a.store(0, Ordering::Relaxed);
            }
        }
        for c in [
            &self.untracked,
            &self.read_errors,
            &self.carried_over,
            &self.stalled_reads,
            &self.closes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.closing.store(false, Ordering::Release);
        true
    }

    /// Intervals closed so far (the tick count of `<unattributed>`).
    pub fn closes(&self) -> u64 {
        self.closes.load(Ordering::Relaxed)
    }

    /// Closes where the threads' CPU time exceeded the interval's capacity
    /// (clock reads delayed by preemption) and the excess was carried into
    /// the next interval. A diagnostic: frequent carries mean the closer
    /// is often preempted mid-close.
    pub fn carried_over(&self) -> u64 {
        self.carried_over.load(Ordering::Relaxed)
    }

    /// Closes whose meter read was stretched by a stall (preemption, a
    /// stolen virtual CPU) and read again (see [`read_meter`]).
    pub fn stalled_reads(&self) -> u64 {
        self.stalled_reads.load(Ordering::Relaxed)
    }
}

/// A meter read taking longer than this was stalled: the instant the
/// counters were sampled is unknown within it. Reads take 1-30 us (a perf
/// counter, an MSR, a powercap file whose driver asks another CPU).
const STALLED_READ_NS: u64 = 200_000;

/// Reads of one close at most (the first and its retries).
const METER_READS: u32 = 4;

struct MeterRead {
    /// The wall clock just after the last read: the interval's end.
    end_ns: u64,
    /// Reads after the first (each one after a stalled read).
    rereads: u32,
    result: Result<(), ReadError>,
}

/// Read the energy since the meter's previous reading into `energy`,
/// bracketed by the wall clock `mono`. The interval's energy and its wall
/// time must end at the same instant: energy sampled before a stall and a
/// wall clock read after it would charge the stall's energy to the next
/// interval, to whichever threads run then (a closer stalled for 16 ms
/// gave its own thread 15 ms worth of the other thread's energy). So a
/// read that took longer than [`STALLED_READ_NS`] is followed by another,
/// adding the energy of the stall, until one is quick or
/// [`METER_READS`] were made. A failed read stops there (its energy is
/// counted by the next successful one).
fn read_meter(meter: &mut EnergyMeter, mono: &dyn Fn() -> u64, energy: &mut Energy) -> MeterRead {
    *energy = [0.0; DOMAINS];
    let mut read = MeterRead {
        end_ns: 0,
        rereads: 0,
        result: Ok(()),
    };
    for n in 0..METER_READS {
        let before = mono();
        let mut part = [0.0; DOMAINS];
        read.result = meter.read_deltas(&mut part);
        read.end_ns = mono();
        read.rereads = n;
        for (e, p) in energy.iter_mut().zip(part) {
            *e += p;
        }
        if read.result.is_err() || read.end_ns.saturating_sub(before) <= STALLED_READ_NS {
            break;
        }
    }
    read
}

fn add_nj(acc: &[AtomicU64; DOMAINS], joules: &Energy) {
    for d in 0..DOMAINS {
        let nj = (joules[d] * NJ).round();
        if nj >= 1.0 {
            acc[d].fetch_add(
                if nj >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    nj as u64
                },
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// Scripted CPU clocks.
    struct Script(RefCell<HashMap<i32, u64>>);
    impl Script {
        fn set(&self, tid: i32, ns: u64) {
            self.0.borrow_mut().insert(tid, ns);
        }
    }
    impl CpuClock for Script {
        fn thread_cpu_ns(&self, tid: i32) -> Option<u64> {
            self.0.borrow().get(&tid).copied()
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn three_to_one_through_the_ledger() {
        // 2 CPUs; thread A burns 3/4 of a CPU, B 1/4, for 100 intervals of
        // 10 ms, while the package uses 0.2 J per interval (20 W).
        let l = Ledger::new(None, SharePolicy::CpuCapacity { cpus: 2 }, 4, 1e-6, 0);
        let clock = Script(RefCell::new(HashMap::new()));
        let a = l.register_at(100, 0).unwrap();
        let b = l.register_at(101, 0).unwrap();
        let (mut ca, mut cb, mut t) = (0, 0, 0);
        let mut got = [[0u64; DOMAINS]; 2];
        // Align the ledger's wall clock with the script.
        l.close_with(&[0.0; DOMAINS], 0, &clock);
        for _ in 0..100 {
            ca += 7_500_000;
            cb += 2_500_000;
            t += 10 * MS;
            clock.set(100, ca);
            clock.set(101, cb);
            assert!(l.close_with(&[0.2, 0.1, 0.0, 0.02], t, &clock));
            for (g, s) in got.iter_mut().zip([a, b]) {
                let v = l.take(s);
                for d in 0..DOMAINS {
                    g[d] += v[d];
                }
            }
        }
        // 20 J over 2 CPU-s of capacity; A used 0.75 CPU-s -> 7.5 J, B 2.5 J.
        assert!((got[0][0] as i64 - 7_500_000).abs() <= 2, "{:?}", got);
        assert!((got[1][0] as i64 - 2_500_000).abs() <= 2, "{:?}", got);
        assert!((got[0][3] as i64 - 750_000).abs() <= 2);
        let r = l.residual();
        // Half the capacity was idle: 10 J unattributed.
        assert!((r.unattributed[0] as i64 - 10_000_000).abs() <= 2, "{r:?}");
        assert_eq!(r.after_exit, [0; DOMAINS]);
    }

    #[test]
    fn exit_full_table_and_dead_threads() {
        let l = Ledger::new(None, SharePolicy::ProfiledThreads, 2, 1e-6, 0);
        let clock = Script(RefCell::new(HashMap::new()));
        l.close_with(&[0.0; DOMAINS], 0, &clock);
        let a = l.register_at(1, 0).unwrap();
        let b = l.register_at(2, 0).unwrap();
        assert_eq!(l.register_at(3, 0), None);
        clock.set(1, 10 * MS);
        clock.set(2, 10 * MS);
        // b exits having used 10 ms; its share of 2 J is 1 J, never taken.
        l.unregister_at(b, 10 * MS);
        l.close_with(&[2.0, 0.0, 0.0, 0.0], 10 * MS, &clock);
        assert_eq!(l.take(a)[0], 1_000_000);
        let r = l.residual();
        assert_eq!(r.after_exit[0], 1_000_000);
        assert_eq!(r.untracked_threads, 1);
        // The slot is free again.
        let c = l.register_at(3, 0).unwrap();
        assert_eq!(c, b);
        // A thread whose clock vanished (died unregistered) gets nothing;
        // with ProfiledThreads and nobody else running, energy is unattributed.
        clock.0.borrow_mut().remove(&3);
        l.close_with(&[1.0, 0.0, 0.0, 0.0], 20 * MS, &clock);
        assert_eq!(l.take(c), [0; DOMAINS]);
        assert_eq!(l.residual().unattributed[0], 1_000_000);
    }

    #[test]
    fn take_carries_fractions_of_a_value() {
        // T = 5 ms-like coarse unit: 1 value = 5 mJ.
        let l = Ledger::new(None, SharePolicy::ProfiledThreads, 1, 0.005, 0);
        let clock = Script(RefCell::new(HashMap::new()));
        let a = l.register_at(7, 0).unwrap();
        let mut total = 0;
        for i in 1..=10 {
            clock.set(7, i * MS);
            l.close_with(&[0.003, 0.0, 0.0, 0.0], i * MS, &clock);
            total += l.take(a)[0];
        }
        // 30 mJ = 6 values, whatever the 3 mJ steps.
        assert_eq!(total, 6);
    }

    #[test]
    fn kernel_cpu_clock_reads_own_thread() {
        let tid = sys::gettid();
        let a = KernelCpuClock.thread_cpu_ns(tid).unwrap();
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 3 {}
        assert!(KernelCpuClock.thread_cpu_ns(tid).unwrap() > a);
        assert_eq!(KernelCpuClock.thread_cpu_ns(0x3fff_fff0), None);
    }

    #[test]
    fn cpu_time_beyond_capacity_is_carried_to_the_next_interval() {
        // 1 CPU, 10 ms intervals at 1 J each. The closer saw thread A's
        // clock 5 ms late: 15 ms in the first interval, 5 ms in the second.
        let l = Ledger::new(None, SharePolicy::CpuCapacity { cpus: 1 }, 1, 1e-6, 0);
        let clock = Script(RefCell::new(HashMap::new()));
        l.close_with(&[0.0; DOMAINS], 0, &clock);
        let a = l.register_at(9, 0).unwrap();
        clock.set(9, 15 * MS);
        l.close_with(&[1.0, 0.0, 0.0, 0.0], 10 * MS, &clock);
        assert_eq!(l.take(a)[0], 1_000_000);
        assert_eq!(l.carried_over(), 1);
        clock.set(9, 20 * MS);
        l.close_with(&[1.0, 0.0, 0.0, 0.0], 20 * MS, &clock);
        // Without the carry, A would get only 0.5 J here (5 of 10 ms).
        assert_eq!(l.take(a)[0], 1_000_000);
        assert_eq!(l.residual().unattributed[0], 0);
    }

    #[test]
    fn reset_after_fork_forgets_threads_and_energy() {
        let l = Ledger::new(None, SharePolicy::ProfiledThreads, 2, 1e-6, 0);
        let clock = Script(RefCell::new(HashMap::new()));
        let a = l.register_at(1, 0).unwrap();
        l.register_at(2, 0).unwrap();
        clock.set(1, MS);
        l.close_with(&[1.0; DOMAINS], MS, &clock);
        assert!(l.reset_after_fork());
        assert_eq!(l.residual(), Residual::default());
        assert_eq!(l.closes(), 0);
        assert_eq!(l.take(a), [0; DOMAINS]);
        // Both slots are free again.
        assert!(l.register_at(3, 0).is_some() && l.register_at(4, 0).is_some());
        l.closing.store(true, Ordering::Relaxed);
        assert!(!l.reset_after_fork());
    }

    #[test]
    fn min_interval_and_try_lock() {
        let l = Ledger::new(None, SharePolicy::ProfiledThreads, 1, 1e-6, u64::MAX);
        assert_eq!(l.close_interval(), Ok(false));
        l.closing.store(true, Ordering::Relaxed);
        assert!(!l.close_with(&[1.0; DOMAINS], 1, &KernelCpuClock));
        l.closing.store(false, Ordering::Relaxed);
        // close_now ignores the minimum interval.
        assert_eq!(l.close_now(), Ok(true));
        assert_eq!(l.closes(), 1);
        // A take that finds another running gets zeros; the energy stays.
        let a = l.register_at(5, 0).unwrap();
        l.slots[a.0].owed_nj[0].store(3_000, Ordering::Relaxed);
        l.slots[a.0].taking.store(true, Ordering::Relaxed);
        assert_eq!(l.take(a), [0; DOMAINS]);
        l.slots[a.0].taking.store(false, Ordering::Relaxed);
        assert_eq!(l.take(a), [3, 0, 0, 0]);
    }
}
