//! The function-instrumentation profiler (-finst): CALL_COUNT and
//! CALL_TIME of programs built with `-finstrument-functions`.
//!
//! Such a program calls `__cyg_profile_func_enter(this_fn, call_site)` at
//! the entry of every instrumented function and `__cyg_profile_func_exit`
//! before it returns. glibc defines both as no-ops; libigprof.so exports
//! its own (`lib.rs`), which the preload puts first, and they call
//! [`enter`] and [`exit`] here. When -finst is not selected they return at
//! once.
//!
//! What a call records. Each thread keeps a shadow stack of the
//! instrumented functions it is in: (function, node, start time, time of
//! its instrumented callees). The node of a call is the path of the
//! instrumented functions on that stack, outermost first, keyed by the
//! functions' entry addresses (`this_fn`), found at entry as the child of
//! the caller's node (one hash lookup). At exit the node gets CALL_COUNT
//! (1, 1) and CALL_TIME (1, self time): the wall-clock time from entry to
//! exit minus that of its instrumented callees and of the profiler's own
//! work at their exits, read from the CPU's cycle counter (`now`) and
//! written as nanoseconds (the counter's rate against CLOCK_MONOTONIC
//! since start, measured before each dump). Values are self
//! values, as every counter of the format: the analyser's cumulative
//! column is the inclusive time (a function's self time plus its callees').
//!
//! IgProf's profiler differs: it unwinds the whole stack at every exit (so
//! uninstrumented frames appear too, and an instrumented function inlined
//! into its caller is named as the caller), counts in TSC cycles, and keeps
//! one stack for the whole process (threads corrupt each other's times).
//!
//! Exits that do not match the top of the stack (a longjmp that left
//! instrumented frames without their exits, a function entered while the
//! thread was inside the profiler; an exception calls the exits of the
//! frames it unwinds, GCC's cleanups do that): the stack is popped down to
//! the newest frame of the exiting function and the frames above it are
//! dropped unrecorded (their time stays in the exiting function's self
//! time), counted in [`DROPPED`]; an exit whose function is not on the
//! stack at all changes nothing ([`UNMATCHED`]). Calls deeper than the
//! stack's capacity (`--depth`) are counted in [`TOO_DEEP`], not recorded.
//!
//! A fork child goes on with a copy of the forking thread's stack, its
//! times restarted at the fork (the child's profile holds only the child's
//! time); an exec or the final dump leaves the frames still open
//! unrecorded (as IgProf).
//!
//! Owns the shadow stacks (one mmap'd block per thread state, pointed to by
//! [`ThreadState::finst`], made at thread begin and kept by the state's
//! next owner) and the counters CALL_COUNT and CALL_TIME.
//!
//! Must never: allocate (the stacks are made at thread begin; nodes come
//! from the tree's own region), lock, change errno, or touch a stack
//! without the thread's guard (a signal handler's instrumented calls while
//! the thread is inside the profiler are skipped, [`SKIPPED`]).

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::base::counters::{self, CounterId};
use crate::base::thread::{self, ThreadState};
use crate::base::tree::{CallTree, Node};
use crate::modules::StartError;

/// One instrumented call in progress.
#[derive(Clone, Copy)]
#[repr(C)]
struct Frame {
    func: usize,
    node: *mut Node,
    start: u64,
    /// Inclusive ns of its instrumented callees (and the profiler's work
    /// at their exits).
    callees: u64,
}

/// A thread's shadow stack: this header, then `cap` frames.
#[repr(C)]
struct Shadow {
    depth: usize,
    /// Calls beyond `cap` still open (not recorded).
    over: usize,
    cap: usize,
}

impl Shadow {
    /// # Safety
    /// `self` heads a block with `cap` frames after it.
    unsafe fn frames(&mut self) -> &mut [Frame] {
        let p = (self as *mut Shadow).add(1) as *mut Frame;
        core::slice::from_raw_parts_mut(p, self.cap)
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
const NONE: usize = usize::MAX;
static COUNT_SLOT: AtomicUsize = AtomicUsize::new(NONE);
static TIME_SLOT: AtomicUsize = AtomicUsize::new(NONE);
/// The forking thread's stack, for the child's thread (see [`fork_child`]).
static INHERITED: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());

/// Frames dropped by an exit that did not match the top of the stack.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Exits of functions not on the stack.
pub static UNMATCHED: AtomicU64 = AtomicU64::new(0);
/// Calls beyond the stack's capacity.
pub static TOO_DEEP: AtomicU64 = AtomicU64::new(0);
/// Entries and exits skipped: the thread was inside the profiler, had no
/// state or stack, or a node could not be made.
pub static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// The -finst profiler in the runtime's module registry.
pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe: |_| Some("instrumented functions (CALL_COUNT, CALL_TIME in ns)".into()),
    register_counters: |_| {
        counters::enable(CounterId::CallCount);
        counters::enable(CounterId::CallTime);
    },
    start: |_| start(),
    thread_begin: Some(thread_begin),
    fork_child: Some(fork_child),
    before_dump: Some(|| {
        calibrate();
        report()
    }),
    dump_value: Some(to_ns),
    ..crate::modules::Module::new("-finst", |o| o.finst)
};

fn start() -> Result<(), StartError> {
    let (Some(c), Some(t)) = (
        counters::slot(CounterId::CallCount),
        counters::slot(CounterId::CallTime),
    ) else {
        return Err(StartError::refused("its counters could not be enabled"));
    };
    COUNT_SLOT.store(c, Ordering::Relaxed);
    TIME_SLOT.store(t, Ordering::Relaxed);
    BASE_NS.store(crate::sys::fast_monotonic_ns(), Ordering::Relaxed);
    BASE_CYCLES.store(now(), Ordering::Relaxed);
    calibrate();
    ENABLED.store(true, Ordering::Release);
    Ok(())
}

/// Makes (or empties, for a state's new owner) the thread's stack.
fn thread_begin(t: &'static ThreadState) {
    let mut p = t.finst.load(Ordering::Acquire) as *mut Shadow;
    if p.is_null() {
        let cap = crate::base::options::get().max_depth;
        let size = core::mem::size_of::<Shadow>() + cap * core::mem::size_of::<Frame>();
        p = crate::sys::mmap_anon(size) as *mut Shadow;
        if p.is_null() {
            crate::igprof_debug!("-finst: no memory for a thread's call stack");
            return;
        }
        // SAFETY: a fresh mapping big enough for the header and cap frames.
        unsafe {
            p.write(Shadow {
                depth: 0,
                over: 0,
                cap,
            })
        };
        t.finst.store(p as *mut u8, Ordering::Release);
    } else {
        // SAFETY: the state's own stack; its previous owner has ended.
        unsafe {
            (*p).depth = 0;
            (*p).over = 0;
        }
    }
}

/// In a fork child: the forking thread's stack (the child's copy) goes on
/// in the child's thread, its times restarted now.
fn fork_child() {
    let Some(t) = thread::current() else { return };
    let p = t.finst.load(Ordering::Acquire) as *mut Shadow;
    if p.is_null() {
        return;
    }
    let now = now();
    // SAFETY: the forking thread's stack, copied into this process, which
    // has no other thread; the state is left behind (stale) right after.
    let s = unsafe { &mut *p };
    let depth = s.depth;
    // SAFETY: as above.
    for f in unsafe { s.frames() }[..depth].iter_mut() {
        f.start = now;
        f.callees = 0;
    }
    INHERITED.store(p as *mut u8, Ordering::Release);
}

/// The CPU's cycle counter: what the entries and exits read (a few ns,
/// where `clock_gettime` through the vDSO costs about 20), turned into
/// nanoseconds at the dump ([`to_ns`]). The TSC on x86-64 (constant rate
/// on every CPU of this century that Linux trusts as a clock source), the
/// virtual counter on AArch64.
#[inline(always)]
fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc reads a register; it has no preconditions.
    let c = unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(target_arch = "aarch64")]
    let c = {
        let v: u64;
        // SAFETY: CNTVCT_EL0 is readable at EL0 on Linux; the read has no
        // side effect.
        unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) v, options(nomem, nostack)) };
        v
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let c = crate::sys::fast_monotonic_ns();
    c
}

/// Counter and CLOCK_MONOTONIC readings at start, and nanoseconds per
/// counter unit (f64 bits) measured from them before each dump.
static BASE_CYCLES: AtomicU64 = AtomicU64::new(0);
static BASE_NS: AtomicU64 = AtomicU64::new(0);
static NS_PER_CYCLE: AtomicU64 = AtomicU64::new(0);

/// Before a dump: the counter's rate over the run so far.
fn calibrate() {
    let (c, ns) = (now(), crate::sys::fast_monotonic_ns());
    let dc = c.saturating_sub(BASE_CYCLES.load(Ordering::Relaxed));
    let dns = ns.saturating_sub(BASE_NS.load(Ordering::Relaxed));
    let r = if dc == 0 || dns == 0 {
        1.0
    } else {
        dns as f64 / dc as f64
    };
    NS_PER_CYCLE.store(r.to_bits(), Ordering::Relaxed);
}

/// CALL_TIME as written: nanoseconds (the nodes hold counter units).
fn to_ns(n: &Node, slot: usize) -> Option<(u64, u64, u64)> {
    if slot != TIME_SLOT.load(Ordering::Relaxed) {
        return None;
    }
    let r = f64::from_bits(NS_PER_CYCLE.load(Ordering::Relaxed));
    let (t, v, p) = n.get(slot);
    Some((t, (v as f64 * r) as u64, (p as f64 * r) as u64))
}

/// The calling thread's stack, taking the one a fork child inherited if
/// it has none.
#[inline]
#[allow(clippy::mut_from_ref)] // the stack is the owner thread's, as its tree
fn shadow(g: &thread::Guard) -> Option<&'static mut Shadow> {
    let t = g.state();
    let mut p = t.finst.load(Ordering::Relaxed) as *mut Shadow;
    if p.is_null() {
        p = INHERITED.swap(core::ptr::null_mut(), Ordering::AcqRel) as *mut Shadow;
        if p.is_null() {
            return None;
        }
        // SAFETY: the stack the fork child inherited, now this thread's
        // alone (taken from INHERITED).
        rebase(g, unsafe { &mut *p });
        t.finst.store(p as *mut u8, Ordering::Release);
    }
    // SAFETY: the owner thread's own stack, used only inside profiler
    // code (the guard).
    Some(unsafe { &mut *p })
}

/// The inherited stack's nodes are in the forking thread's tree, which the
/// child does not dump: the same paths are made in the thread's own tree.
#[cold]
fn rebase(g: &thread::Guard, s: &mut Shadow) {
    let depth = s.depth;
    // SAFETY: the owner thread; the tree is not borrowed elsewhere.
    let tree = unsafe { g.state().tree_mut(g) };
    let mut parent = None;
    // SAFETY: the stack's own frames.
    for f in unsafe { s.frames() }[..depth].iter_mut() {
        f.node = node_under(tree, parent, f.func);
        parent = Some(f.node);
    }
}

/// The node of a call of `func` under the node of the calling
/// instrumented function (`None`: it is the outermost one); null when the
/// caller has none (no memory) or none can be made.
#[inline]
fn node_under(tree: &mut CallTree, caller: Option<*mut Node>, func: usize) -> *mut Node {
    match caller {
        None => tree.node_for(&[func], false),
        Some(p) if p.is_null() => p,
        Some(p) => {
            let n = tree.child(p, func);
            tree.charged(n)
        }
    }
}

/// The calling thread, inside the profiler, and its stack; None (counted
/// as skipped) when the thread is unknown, already inside the profiler, or
/// has no stack.
#[inline]
fn entered() -> Option<(&'static ThreadState, thread::Guard, &'static mut Shadow)> {
    let found = thread::current().and_then(|t| {
        let g = t.enter()?;
        let s = shadow(&g)?;
        Some((t, g, s))
    });
    if found.is_none() {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
    }
    found
}

/// `__cyg_profile_func_enter(func, _)`.
#[inline]
pub fn enter(func: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        enter_profiled(func)
    }
}

/// `__cyg_profile_func_exit(func, _)`.
#[inline]
pub fn exit(func: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        exit_profiled(func)
    }
}

#[inline(never)]
fn enter_profiled(func: usize) {
    let Some((t, g, s)) = entered() else { return };
    if s.depth == s.cap || s.over > 0 {
        s.over += 1;
        TOO_DEEP.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let depth = s.depth;
    // SAFETY: the thread's own stack (guard held).
    let frames = unsafe { s.frames() };
    // SAFETY: the owner thread; the tree is not borrowed elsewhere.
    let tree = unsafe { t.tree_mut(&g) };
    let caller = depth.checked_sub(1).map(|d| frames[d].node);
    let node = node_under(tree, caller, func);
    if node.is_null() {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
    }
    // Read last, so that the entry's own work is not the function's time.
    frames[depth] = Frame {
        func,
        node,
        start: now(),
        callees: 0,
    };
    s.depth = depth + 1;
    drop(g);
}

#[inline(never)]
fn exit_profiled(func: usize) {
    let end = now();
    let Some((_, g, s)) = entered() else { return };
    if s.over > 0 {
        s.over -= 1;
        return;
    }
    let depth = s.depth;
    // SAFETY: the thread's own stack (guard held).
    let frames = unsafe { s.frames() };
    let Some(i) = frames[..depth].iter().rposition(|f| f.func == func) else {
        UNMATCHED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if i + 1 < depth {
        DROPPED.fetch_add((depth - 1 - i) as u64, Ordering::Relaxed);
    }
    let f = frames[i];
    let inclusive = end.saturating_sub(f.start);
    // Recording off (-pd, igprof_disable): the stack is kept, nothing counted.
    if !f.node.is_null() && crate::base::run::recording() {
        // SAFETY: nodes are never freed.
        let n = unsafe { &*f.node };
        n.counter(COUNT_SLOT.load(Ordering::Relaxed)).add(1, 1);
        n.counter(TIME_SLOT.load(Ordering::Relaxed))
            .add(1, inclusive.saturating_sub(f.callees));
    }
    if i > 0 {
        // The caller's callees: this call, and this exit's own work.
        frames[i - 1].callees += inclusive + now().saturating_sub(end);
    }
    s.depth = i;
    drop(g);
}

/// With -d, before a dump: what could not be recorded.
fn report() {
    let (d, u, o, s) = (
        DROPPED.load(Ordering::Relaxed),
        UNMATCHED.load(Ordering::Relaxed),
        TOO_DEEP.load(Ordering::Relaxed),
        SKIPPED.load(Ordering::Relaxed),
    );
    crate::igprof_debug!(
        "-finst: {d} frames dropped by unmatched exits, {u} exits without their entry, {o} calls too deep, {s} entries/exits skipped"
    );
}
