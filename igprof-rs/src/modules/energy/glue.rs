//! The `-np` module: glue between the runtime and the energy sources and
//! ledger of this folder, following the contract at the top of `ledger.rs`.
//!
//! Owns: detecting the source at start-up (before the counter registry
//! freezes, so only measured domains get an `NRG_*` counter), the process's
//! [`Ledger`], each thread's ledger slot, charging a thread's energy to the
//! stack of its sample (a consumer of the sampling timers), and the
//! `<unattributed>` node written at every dump.
//!
//! Must never: allocate or lock in the sample consumer (it runs in the
//! sampling-signal handler; the ledger's calls there are async-signal-safe).

use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

use crate::base::counters::{self, CounterId};
use crate::base::options::Options;
use crate::base::thread::ThreadState;
use crate::base::tree::Node;
use crate::modules::energy::{self, ledger::SlotId, Domain, EnergyMeter, Ledger, Root, DOMAINS};
use crate::modules::Module;
use crate::modules::StartError;

static LEDGER: OnceLock<Ledger> = OnceLock::new();
static METER: Mutex<Option<EnergyMeter>> = Mutex::new(None);
/// Counter slot of each domain's NRG_* counter (usize::MAX: not measured).
static SLOT: [std::sync::atomic::AtomicUsize; DOMAINS] =
    [const { std::sync::atomic::AtomicUsize::new(usize::MAX) }; DOMAINS];

const COUNTER: [CounterId; DOMAINS] = [
    CounterId::NrgPkg,
    CounterId::NrgPp0,
    CounterId::NrgPp1,
    CounterId::NrgDram,
];

/// Most threads registered in the ledger at once.
const CAPACITY: usize = 1024;
/// Intervals close at most this often (a source read per close).
const MIN_INTERVAL_NS: u64 = 2_000_000;

pub const MODULE: Module = Module {
    describe: |_| Some("energy (NRG_*)".into()),
    register_counters,
    start,
    thread_begin: Some(thread_begin),
    thread_end: Some(thread_end),
    fork_child: Some(fork_child),
    before_dump: Some(before_dump),
    synthetic: Some(synthetic),
    header_tick: Some(|_| energy::JOULES_PER_VALUE),
    ..Module::new("-np", |o| o.energy)
};

fn root() -> Root {
    Root::from_env_value(std::env::var_os(energy::ROOT_ENV).as_deref())
}

fn register_counters(_: &Options) {
    match energy::detect(&root()) {
        Ok(mut m) => {
            let _ = m.relocate_fds(crate::sampler::high_fd_base());
            for d in Domain::ALL {
                if m.has(d) {
                    counters::enable(COUNTER[d.index()]);
                }
            }
            crate::igprof_debug!("energy source {}", m.describe());
            *METER.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
        }
        Err(e) => {
            let msg = e.to_string();
            crate::igprof_log!("{}", msg.strip_prefix("igprof: ").unwrap_or(&msg));
        }
    }
}

fn start(o: &Options) -> Result<(), StartError> {
    let meter = METER.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(meter) = meter else {
        // register_counters already said why, on one line.
        return Err(StartError::AlreadyReported);
    };
    for d in Domain::ALL {
        if let Some(s) = counters::slot(COUNTER[d.index()]) {
            SLOT[d.index()].store(s, Ordering::Relaxed);
        }
    }
    // With a sampling profiler the header's T is its tick, and NRG values
    // count units of T Joules; alone, microjoules.
    let t = if o.perf.is_some() {
        crate::sampler::tick_seconds()
    } else {
        energy::JOULES_PER_VALUE
    };
    let policy = energy::default_policy(&root());
    if LEDGER
        .set(Ledger::new(
            Some(meter),
            policy,
            CAPACITY,
            t,
            MIN_INTERVAL_NS,
        ))
        .is_err()
    {
        return Err(StartError::refused("started twice"));
    }
    if !crate::sampler::add_consumer(on_sample) {
        return Err(StartError::refused("no free sample-consumer slot"));
    }
    Ok(())
}

fn thread_begin(t: &'static ThreadState) {
    if let Some(l) = LEDGER.get() {
        t.set_energy_slot(l.register(t.tid()).map(SlotId::index));
    }
}

fn thread_end(t: &'static ThreadState) {
    if let (Some(l), Some(slot)) = (LEDGER.get(), t.take_energy_slot().map(SlotId::from_index)) {
        // Close the interval now so that the thread's last CPU time is
        // shared out to it rather than left to the residual.
        let _ = l.close_now();
        charge(t.sampler.last_sample.load(Ordering::Acquire), l.take(slot));
        l.unregister(slot);
    }
}

fn fork_child() {
    if let Some(l) = LEDGER.get() {
        l.reset_after_fork();
    }
    // The forking thread registers again through thread_begin when the
    // runtime gives it a fresh state.
}

/// Adds energy values to a node's NRG_* counters (any thread).
fn charge(node: *const Node, v: [u64; DOMAINS]) {
    if node.is_null() {
        return;
    }
    // SAFETY: nodes are never freed.
    let n = unsafe { &*node };
    for d in 0..DOMAINS {
        let s = SLOT[d].load(Ordering::Relaxed);
        if v[d] > 0 && s != usize::MAX {
            n.counter(s).tick_shared(v[d]);
        }
    }
}

/// Sample consumer (signal context): close the interval if due, then charge
/// what this thread is owed to the stack just sampled.
fn on_sample(g: &crate::base::thread::Guard, node: *mut Node) {
    let t = g.state();
    let Some(l) = LEDGER.get() else { return };
    let _ = l.close_interval();
    if node.is_null() {
        return; // what is owed stays owed until a sample lands
    }
    if let Some(slot) = t.energy_slot().map(SlotId::from_index) {
        charge(node, l.take(slot));
    }
}

/// Before a dump: close the interval and charge every thread's due energy
/// to its last sampled stack, so the profile holds all energy up to now.
fn before_dump() {
    let Some(l) = LEDGER.get() else { return };
    let _ = l.close_now();
    for t in crate::base::thread::all() {
        if let Some(slot) = t.energy_slot().map(SlotId::from_index) {
            charge(t.sampler.last_sample.load(Ordering::Acquire), l.take(slot));
        }
    }
}

/// The energy no thread is charged with, as the synthetic `<unattributed>`.
fn synthetic(f: &mut dyn FnMut(&'static str, usize, u64, u64)) {
    let Some(l) = LEDGER.get() else { return };
    let r = l.residual();
    let closes = l.closes();
    for (d, slot) in SLOT.iter().enumerate() {
        let s = slot.load(Ordering::Relaxed);
        let v = r.unattributed[d] + r.after_exit[d];
        if s != usize::MAX && v > 0 {
            f("<unattributed>", s, closes.max(1), v);
        }
    }
}
