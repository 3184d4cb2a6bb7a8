//! Per-thread profiler state, reached signal-safely, and the re-entrancy guard.
//!
//! Owns [`ThreadState`] (call tree, trace buffer, timer, sample statistics)
//! and the process-wide list of all states (push-only, lock-free) that the
//! dumper walks. The pointer to the current thread's state lives in the
//! library's static TLS area (`tls.rs`): reading it, in a signal handler
//! too, is two instructions and allocates nothing.
//!
//! **Thread exit.** A state is never freed: the dumper may be reading its
//! tree, and call-tree nodes are referenced from outside the tree (live
//! heap blocks and descriptors in `live.rs` point at the node that acquired
//! them, and a release by another thread, even long after the acquiring
//! thread exited, is charged there; memfd's per-thread caches and the
//! energy module hold node pointers too). So an exited thread's tree is
//! not folded into another tree and freed: instead the next new thread
//! *adopts* the exited thread's whole state, tree included, once the old
//! thread has really ended (`tgkill(tid, 0)` fails with ESRCH; until then it
//! may still run TLS destructors that allocate and record into its tree).
//! The newcomer's samples go into the same tree, so the exited thread's
//! counts are merged with them path by path as they arrive, every node
//! pointer held elsewhere stays valid, and the number of states (and of
//! trees) is bounded by the peak number of threads alive at once, not by
//! the number of threads ever created. The dump merges the states' trees.
//!
//! Must never: allocate through the global allocator from signal context
//! (states come from mmap), free a state (other threads and the dumper may
//! still read it), hand a state to a new thread while its previous owner
//! can still run, or let a hook run profiler code while the thread is
//! already inside the profiler ([`Guard`]).

use core::cell::{Cell, UnsafeCell};
use core::ops::Deref;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::base::tree::CallTree;
use crate::sys;

/// The profiler state of one thread.
pub struct ThreadState {
    /// Kernel thread id of the current owner (changes when adopted).
    tid: AtomicI32,
    /// Whether the thread is inside profiler code (hook, handler, dump).
    busy: Cell<bool>,
    /// Whether the thread is inside our signal handler (allocation check).
    in_signal: Cell<bool>,
    pub tree: core::cell::UnsafeCell<CallTree>,
    /// Buffer for one stack trace (max_depth + 1 entries), from mmap.
    pub trace: *mut usize,
    /// The lowest address of the stack stack walks run on ([`WALK_STACK`]
    /// bytes, from mmap; 0 if it could not be mapped): a walk that parses
    /// DWARF needs several KiB, which a small thread stack or alternate
    /// signal stack does not have.
    pub walk_stack: usize,
    pub trace_cap: usize,
    /// The sampler's part (`sampler/`).
    pub sampler: Sampler,
    /// Counts the dump reports (samples, drops, truncations, handler time).
    pub stats: SampleStats,
    /// Set when the thread has exited (its tree is still dumped, and the
    /// state may be adopted by a new thread once the old one has ended).
    pub exited: AtomicBool,
    /// Set in a forked child for states inherited from the parent: not dumped.
    pub stale: AtomicBool,
    /// Where the owning thread keeps its pointer to this state (its
    /// [`CURRENT`] slot), for [`forget_all_threads`]; 0 if it has none.
    current_slot: AtomicUsize,
    /// The thread was made with a raw `clone()` and shares its creator's
    /// thread pointer, hence its TLS: it is found by thread id, not through
    /// [`CURRENT`] (see [`current`]).
    shares_tls: bool,
    /// For a thread that shares TLS: a private copy of a module's
    /// thread-local record (the hooks' [`crate::modules::mem::site::HookTls`]), made
    /// by that module on first use; null otherwise.
    pub private_tls: AtomicPtr<u8>,
    /// The program's view of the sampling signal on this thread
    /// (process/signals).
    pub shadow: OwnerCell<SignalShadow>,
    /// Where the unwinder may read this thread's stack.
    pub bounds: OwnerCell<crate::unwind::StackBounds>,
    /// The thread's unwinder (descriptor cache), None if it could not be made.
    pub unwinder: Option<crate::unwind::ThreadUnwinder>,
    /// The thread's slot in the energy ledger (-np), as its index
    /// (`NO_SLOT`: none; written by the owner, read by the dumper too).
    energy_slot: AtomicUsize,
    /// The -finst module's shadow stack (modules/finst: mmap'd at its
    /// thread begin, owner thread only, kept by a state's next owner); null
    /// until then.
    pub finst: AtomicPtr<u8>,
    /// The -e module's per-thread events (modules/event: mmap'd at its
    /// thread begin, owner thread only, kept by a state's next owner); null
    /// until then.
    pub events: AtomicPtr<u8>,
    next: AtomicPtr<ThreadState>,
}

// SAFETY: Cell fields are only touched by the owning thread; cross-thread
// readers use the atomics and the tree's concurrent-read interface.
unsafe impl Sync for ThreadState {}

/// A value of a [`ThreadState`] that only the state's owner thread reads
/// or writes (set again by a thread that adopts the state).
pub struct OwnerCell<T>(UnsafeCell<T>);

impl<T> Deref for OwnerCell<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: only the owner accesses the value, and it writes it only
        // while adopting the state, before the state is reachable from its
        // CURRENT slot (so no reference obtained here is alive then).
        unsafe { &*self.0.get() }
    }
}

impl<T> OwnerCell<T> {
    pub fn new(v: T) -> Self {
        OwnerCell(UnsafeCell::new(v))
    }

    /// Puts `v` in place for a new owner.
    ///
    /// # Safety
    /// Only while adopting the state: it is claimed by the caller and not
    /// yet reachable as any thread's current state, so no reference to the
    /// value is alive.
    unsafe fn renew(&self, v: T) {
        // SAFETY: guaranteed by the caller.
        unsafe { *self.0.get() = v };
    }
}

/// The sampler's part of a thread's state: its per-thread sampling
/// events or timer (written by `sampler/` on the owner thread, read by
/// other threads to stop or recognise them) and the owner-only
/// [`SamplerClock`].
pub struct Sampler {
    /// Kernel timer id of this thread's sampling timer, or -1.
    pub timer: AtomicI32,
    /// perf_event descriptor of this thread's task-clock sampler, or -1.
    pub perf_fd: AtomicI32,
    /// The perf event's ring-buffer mapping (0 if none).
    pub perf_ring: AtomicUsize,
    /// -pr: the context-switch perf event's holding mapping (0 if none).
    pub switch_hold: AtomicUsize,
    /// The node of this thread's latest sample (energy charged at exit/dump).
    pub last_sample: AtomicPtr<crate::base::tree::Node>,
    pub clock: OwnerCell<SamplerClock>,
}

impl Sampler {
    fn new(tid: i32) -> Self {
        Sampler {
            timer: AtomicI32::new(-1),
            perf_fd: AtomicI32::new(-1),
            perf_ring: AtomicUsize::new(0),
            switch_hold: AtomicUsize::new(0),
            last_sample: AtomicPtr::new(null_mut()),
            clock: OwnerCell::new(SamplerClock::new(tid)),
        }
    }

    /// For a new owner of the state (its events were stopped when the
    /// previous owner ended).
    ///
    /// # Safety
    /// As [`OwnerCell::renew`].
    unsafe fn renew(&self, tid: i32) {
        self.last_sample.store(null_mut(), Ordering::Release);
        // SAFETY: guaranteed by the caller.
        unsafe { self.clock.renew(SamplerClock::new(tid)) };
    }
}

/// What only the owner thread's sampler reads and writes.
pub struct SamplerClock {
    /// -pr: wall-clock and thread CPU time when off-CPU time was last
    /// charged (see `sampler::ticks::off_cpu_ticks`).
    pub wall_mark: Cell<u64>,
    pub cpu_mark: Cell<u64>,
    /// -pr: wall-clock time of the thread's last CPU sample or off-CPU
    /// charge (see `sampler::ticks::late_off_cpu_ticks_at_sample`).
    pub sample_wall: Cell<u64>,
    /// A perf event's sampler: the thread's CPU time when it started, and
    /// the ticks its samples were worth since (see
    /// `sampler::ticks::event_tail`).
    pub event_cpu_start: Cell<u64>,
    pub event_ticks: Cell<u64>,
    /// A perf event's sampler: ticks its samples were worth beyond the
    /// thread's CPU clock, withheld from the next samples (see
    /// `sampler::ticks::ticks_for`).
    pub tick_debt: Cell<u64>,
    /// Samples since the sampling period was last re-randomised.
    pub since_jitter: Cell<u32>,
    /// Ticks of samples that landed while the thread was inside profiler
    /// code, not yet charged (see `sampler::settle_pending`).
    pub pending_ticks: Cell<u64>,
    /// xorshift state for interval jitter.
    rng: Cell<u64>,
    /// POSIX-timer samplers: the sampled clock's reading already turned into
    /// ticks, and the carried remainder (see `sampler::ticks::ticks_for`).
    pub clock_seen: Cell<u64>,
    pub clock_credit: Cell<u64>,
}

impl SamplerClock {
    fn new(tid: i32) -> Self {
        SamplerClock {
            wall_mark: Cell::new(0),
            cpu_mark: Cell::new(0),
            sample_wall: Cell::new(0),
            event_cpu_start: Cell::new(0),
            event_ticks: Cell::new(0),
            tick_debt: Cell::new(0),
            since_jitter: Cell::new(0),
            pending_ticks: Cell::new(0),
            rng: Cell::new(seed(tid)),
            clock_seen: Cell::new(0),
            clock_credit: Cell::new(0),
        }
    }

    /// Next pseudo-random number.
    #[inline]
    pub fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }
}

/// Counts of a state's samples and stack walks, for the dump (written by
/// the owner thread, read by the dumper; they add up across owners).
#[derive(Default)]
pub struct SampleStats {
    pub samples: AtomicU64,
    pub dropped: AtomicU64,
    pub truncated: AtomicU64,
    /// Nanoseconds spent in the sampling handler (our own cost per sample).
    pub handler_ns: AtomicU64,
}

/// The program's view of the sampling signal on this thread (owner only).
#[derive(Default)]
pub struct SignalShadow {
    /// The program "blocks" the sampling signal.
    pub blocks: Cell<bool>,
    /// A program-originated sampling signal arrived while it blocked it.
    pub pending: Cell<bool>,
    /// Program-originated sampling signals that reached this thread's
    /// handler (held or delivered), wrapping: a resent held signal shows
    /// here when it arrived.
    pub arrivals: Cell<u32>,
}

/// Bytes of a state's walk stack (pages are committed only when touched).
pub const WALK_STACK: usize = 64 * 1024;

/// How many exited states a new thread examines for adoption (one
/// `tgkill` probe each) before it makes a fresh one.
const ADOPT_TRIES: usize = 8;

/// The calling thread's state pointer, in the library's TLS area.
// SAFETY: a null pointer is all-zero and needs no drop; THREAD_AT is this
// module's slot alone.
static CURRENT: crate::base::tls::Slot<Cell<*mut ThreadState>> =
    unsafe { crate::base::tls::Slot::new(crate::base::tls::THREAD_AT) };

static ALL: AtomicPtr<ThreadState> = AtomicPtr::new(null_mut());

/// `energy_slot` of a thread without one.
const NO_SLOT: usize = usize::MAX;

/// What waits for a thread to leave profiler code, set at start-up by the
/// layers above (this layer cannot name them): `settle` charges the
/// samples taken inside to the program's stack (guard still held); `after`
/// runs the process-wide requests that had to wait ([`request_after_leave`]:
/// a fatal signal's death, a dump asked for by signal).
pub struct LeaveHooks {
    pub settle: fn(&Guard),
    pub after: fn(),
}

static LEAVE_HOOKS: std::sync::OnceLock<LeaveHooks> = std::sync::OnceLock::new();
/// Set while some request waits for a thread to leave profiler code.
static LEAVE_WORK: AtomicBool = AtomicBool::new(false);

/// Sets the [`LeaveHooks`] (start-up, once).
pub fn set_leave_hooks(h: LeaveHooks) {
    let _ = LEAVE_HOOKS.set(h);
}

/// A request waits for the next thread that leaves profiler code (signal
/// context allowed).
pub fn request_after_leave() {
    LEAVE_WORK.store(true, Ordering::Release);
}

/// Called by the `after` hook before it serves the requests: one that
/// comes meanwhile asks again.
pub fn requests_taken() {
    LEAVE_WORK.store(false, Ordering::Release);
}

/// Set once a thread that shares its creator's TLS exists (a raw `clone()`
/// without `CLONE_SETTLS`): from then on [`CURRENT`] may belong to another
/// thread, and the calling thread is identified by its thread id.
static SHARED_TLS: AtomicBool = AtomicBool::new(false);

/// The calling thread's state, if it has one.
#[inline]
pub fn current() -> Option<&'static ThreadState> {
    let p = CURRENT.with(|c| c.get());
    if SHARED_TLS.load(Ordering::Relaxed) {
        return current_by_tid(p);
    }
    if p.is_null() {
        None
    } else {
        // SAFETY: states are never freed.
        Some(unsafe { &*p })
    }
}

/// [`current`] in a process with threads that share TLS: the TLS slot's
/// state if the calling thread owns it, else the TLS-sharing state whose
/// owner is the calling thread. Costs a `gettid` system call per lookup,
/// paid only by processes that made such threads. Async-signal-safe.
#[cold]
#[inline(never)]
fn current_by_tid(p: *mut ThreadState) -> Option<&'static ThreadState> {
    let tid = sys::gettid();
    // SAFETY: states are never freed.
    if let Some(t) = unsafe { p.as_ref() } {
        if t.tid() == tid {
            return Some(t);
        }
    }
    all().find(|t| t.shares_tls && t.tid() == tid && !t.exited.load(Ordering::Acquire))
}

/// Whether threads that share their creator's TLS may exist.
#[inline]
pub fn tls_is_shared() -> bool {
    SHARED_TLS.load(Ordering::Relaxed)
}

/// Whether the TLS the calling thread runs on is its own: false for a
/// thread that shares another's TLS and has no state yet. Async-signal-safe.
pub fn tls_is_callers() -> bool {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: states are never freed.
    unsafe { p.as_ref() }.is_none_or(|t| t.tid() == sys::gettid())
}

/// Announces that threads sharing their creator's TLS may exist from now
/// on (called before such a thread is made).
pub fn expect_shared_tls() {
    SHARED_TLS.store(true, Ordering::Release);
}

/// Whether the calling thread is inside our sampling handler (the global
/// allocator's check, `alloc::set_signal_probe`).
pub fn in_sampling_handler() -> bool {
    current().is_some_and(|t| t.in_signal.get())
}

/// Registers a thread met for the first time in a hook, in a process the
/// library was loaded into while running (`igprof --attach`): set by the
/// process layer, which also starts the thread's modules. 0: none.
static LATE: AtomicUsize = AtomicUsize::new(0);

/// See [`LATE`].
pub fn set_late_register(f: fn() -> Option<&'static ThreadState>) {
    LATE.store(f as usize, Ordering::Release);
}

/// The calling thread's state, registered now if the thread was running
/// before the library was loaded ([`set_late_register`]). Not from
/// signal context; the caller keeps the thread's hooks from recording
/// while it runs (registration calls libc).
pub fn register_late() -> Option<&'static ThreadState> {
    let f = LATE.load(Ordering::Acquire);
    if f == 0 {
        return None;
    }
    // SAFETY: LATE holds only a `fn() -> Option<&'static ThreadState>`
    // stored by set_late_register.
    let f: fn() -> Option<&'static ThreadState> = unsafe { core::mem::transmute(f) };
    f()
}

/// Registers the calling thread's state (not from signal context): adopts
/// the state of a thread that has ended (see the module docs), or makes one.
pub fn register_current(max_depth: usize) -> Option<&'static ThreadState> {
    if let Some(t) = current() {
        return Some(t);
    }
    // A hook reached from the registration below (pthread_getattr_np
    // allocates) asks for no second one (see `register_late`).
    if REGISTERING.with(|r| r.replace(true)) {
        return None;
    }
    let bounds = crate::unwind::StackBounds::for_current_thread().unwrap_or_default();
    let t = register(max_depth, false, bounds);
    REGISTERING.with(|r| r.set(false));
    t
}

/// Whether the calling thread is registering its state: its stack's
/// bounds come from `pthread_getattr_np`, which allocates, and the hooks
/// it reaches pass those calls through as the profiler's own, not as a
/// thread the profiler does not know.
#[inline]
pub fn registering() -> bool {
    REGISTERING.with(|r| r.get())
}

/// Set while the calling thread registers its state.
// SAFETY: a Cell<bool> is valid all-zero and needs no drop; byte 8 of the
// area is this slot's only (CURRENT holds bytes 0-7).
static REGISTERING: crate::base::tls::Slot<Cell<bool>> =
    unsafe { crate::base::tls::Slot::new(crate::base::tls::THREAD_AT + 8) };

/// Registers the calling thread, made by a raw `clone()` that shares its
/// creator's TLS, with the stack it runs on (not from signal context). Its
/// state is found by thread id ([`current`]); [`expect_shared_tls`] must
/// have been called before the thread was made.
pub fn register_shared_tls(
    max_depth: usize,
    bounds: crate::unwind::StackBounds,
) -> Option<&'static ThreadState> {
    register(max_depth, true, bounds)
}

fn register(
    max_depth: usize,
    shares_tls: bool,
    bounds: crate::unwind::StackBounds,
) -> Option<&'static ThreadState> {
    let tid = sys::gettid();
    if let Some(t) = adopt_ended(tid, max_depth + 1, shares_tls) {
        t.busy.set(false);
        t.in_signal.set(false);
        // A thread cancelled asynchronously may have ended mid-walk.
        if let Some(u) = &t.unwinder {
            u.abandon_walk();
        }
        t.set_energy_slot(None);
        // SAFETY: the state is ours (claimed in adopt_ended) and not yet
        // reachable as any thread's current state: no one reads its
        // owner-only parts, which get the values a new state starts with.
        unsafe {
            t.sampler.renew(tid);
            t.shadow.renew(SignalShadow::default());
            t.bounds.renew(bounds);
        }
        // Published last: a thread that shares TLS is found by this id.
        t.tid.store(tid, Ordering::Release);
        if !shares_tls {
            CURRENT.with(|c| c.set(t as *const ThreadState as *mut ThreadState));
            t.current_slot.store(current_slot(), Ordering::Release);
        }
        return Some(t);
    }
    new_state(max_depth, false, shares_tls, bounds)
}

/// Registers a fresh state for a profiler thread that is never sampled
/// nor dumped (stale from the start, so never adopted either).
pub fn register_unsampled(max_depth: usize) -> Option<&'static ThreadState> {
    if let Some(t) = current() {
        return Some(t);
    }
    // Its hooks pass through while it asks libc for its stack (see
    // `registering`).
    REGISTERING.with(|r| r.set(true));
    let bounds = crate::unwind::StackBounds::for_current_thread().unwrap_or_default();
    REGISTERING.with(|r| r.set(false));
    new_state(max_depth, true, false, bounds)
}

fn seed(tid: i32) -> u64 {
    0x9e37_79b9_7f4a_7c15 ^ (tid as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ sys::monotonic_ns()
}

/// Claims an exited, non-stale state with a trace buffer of `trace_cap`
/// whose thread has ended (no task `tid` left in the process; a thread
/// id is never held by two live threads, so our own `tid` proves it too).
/// A state is adopted only by a thread of the same kind (TLS of its own
/// or shared), whose lookup it was made for.
fn adopt_ended(tid: i32, trace_cap: usize, shares_tls: bool) -> Option<&'static ThreadState> {
    all()
        .filter(|t| {
            t.trace_cap == trace_cap
                && t.shares_tls == shares_tls
                && t.exited.load(Ordering::Acquire)
                && !t.stale.load(Ordering::Acquire)
        })
        .take(ADOPT_TRIES)
        .find(|t| {
            let old = t.tid();
            (old == tid || !sys::thread_alive(old))
                && t.exited
                    .compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
        })
}

/// Makes and registers a fresh state for the calling thread. Built on a
/// stack of its own: the state and its unwinder are large values (framehop's
/// rule cache), which a thread made with a 16 KiB stack cannot hold.
fn new_state(
    max_depth: usize,
    stale: bool,
    shares_tls: bool,
    bounds: crate::unwind::StackBounds,
) -> Option<&'static ThreadState> {
    new_state_of(max_depth, stale, shares_tls, bounds, None)
}

/// Registers a fresh state for thread `tid` of this process, running or
/// stopped, whose thread pointer is `tp` (its `fs` base): the state is
/// written into that thread's own slot, where it finds it at its next
/// event or sample. x86-64 only (`igprof --attach`).
///
/// # Safety
/// The thread is stopped (`igprof --attach` holds it with ptrace) and `tp`
/// is its thread pointer, so that its TLS area is where this thread's is
/// from its own.
pub unsafe fn register_other(
    tid: i32,
    tp: usize,
    max_depth: usize,
    bounds: crate::unwind::StackBounds,
) -> Option<&'static ThreadState> {
    // SAFETY: pthread_self is the calling thread's thread pointer (x86-64
    // glibc: the TCB's address, what fs holds).
    let own_tp = unsafe { libc::pthread_self() } as usize;
    let slot = tp.wrapping_add(current_slot().wrapping_sub(own_tp));
    new_state_of(max_depth, false, false, bounds, Some((tid, slot)))
}

fn new_state_of(
    max_depth: usize,
    stale: bool,
    shares_tls: bool,
    bounds: crate::unwind::StackBounds,
    other: Option<(i32, usize)>,
) -> Option<&'static ThreadState> {
    let p = sys::with_big_stack(|| {
        build_state(max_depth, stale, shares_tls, bounds, other).map(|t| t as *const ThreadState)
    });
    // SAFETY: states are never freed.
    p.map(|p| unsafe { &*p })
}

/// A new state pushed on the list, owned by the calling thread, or with
/// `other` = (tid, slot) by that thread, through its slot's address.
fn build_state(
    max_depth: usize,
    stale: bool,
    shares_tls: bool,
    bounds: crate::unwind::StackBounds,
    other: Option<(i32, usize)>,
) -> Option<&'static ThreadState> {
    let size = core::mem::size_of::<ThreadState>();
    let mem =
        sys::mmap_anon(size + (max_depth + 2) * core::mem::size_of::<usize>()) as *mut ThreadState;
    if mem.is_null() {
        return None;
    }
    let tid = other.map_or_else(sys::gettid, |(tid, _)| tid);
    let bounds = OwnerCell::new(bounds);
    let unwinder = crate::unwind::ThreadUnwinder::new().ok();
    // SAFETY: fresh mapping big enough for the state plus the trace buffer.
    unsafe {
        mem.write(ThreadState {
            tid: AtomicI32::new(tid),
            busy: Cell::new(false),
            in_signal: Cell::new(false),
            tree: core::cell::UnsafeCell::new(CallTree::new()),
            trace: (mem as *mut u8).add(size) as *mut usize,
            walk_stack: sys::mmap_anon(WALK_STACK) as usize,
            trace_cap: max_depth + 1,
            sampler: Sampler::new(tid),
            stats: SampleStats::default(),
            exited: AtomicBool::new(false),
            stale: AtomicBool::new(stale),
            current_slot: AtomicUsize::new(0),
            shares_tls,
            private_tls: AtomicPtr::new(null_mut()),
            shadow: OwnerCell::new(SignalShadow::default()),
            bounds,
            unwinder,
            energy_slot: AtomicUsize::new(NO_SLOT),
            finst: AtomicPtr::new(null_mut()),
            events: AtomicPtr::new(null_mut()),
            next: AtomicPtr::new(null_mut()),
        });
    }
    // Push on the global list.
    let mut head = ALL.load(Ordering::Acquire);
    loop {
        // SAFETY: mem is ours until published.
        unsafe { (*mem).next.store(head, Ordering::Relaxed) };
        match ALL.compare_exchange_weak(head, mem, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(h) => head = h,
        }
    }
    if let Some((_, slot)) = other {
        // SAFETY: the slot of a stopped thread of this process (see
        // register_other); mem was written above.
        unsafe {
            (*(slot as *const Cell<*mut ThreadState>)).set(mem);
            (*mem).current_slot.store(slot, Ordering::Release);
        }
    } else if !shares_tls {
        CURRENT.with(|c| c.set(mem));
        // SAFETY: mem was written above.
        unsafe { (*mem).current_slot.store(current_slot(), Ordering::Release) };
    }
    // SAFETY: never freed.
    Some(unsafe { &*mem })
}

/// The address of the calling thread's [`CURRENT`] slot.
fn current_slot() -> usize {
    CURRENT.with(|c| c as *const Cell<*mut ThreadState> as usize)
}

/// Every running thread forgets its state, the caller's included: each
/// registers a fresh one at its next event (a second `igprof --attach`,
/// whose profile starts afresh, marks the old states stale first).
///
/// # Safety
/// Every other thread of the process is stopped (`igprof --attach` holds
/// them with ptrace), so none is reading its slot; only the slots of
/// threads that still run are written (an ended thread's may be unmapped).
pub unsafe fn forget_all_threads() {
    let me = sys::gettid();
    for t in all() {
        let slot = t.current_slot.load(Ordering::Acquire);
        if slot == 0 || t.shares_tls || t.exited.load(Ordering::Acquire) {
            continue;
        }
        if t.tid() != me && !sys::thread_alive(t.tid()) {
            continue;
        }
        // SAFETY: the slot of a running thread, which is stopped (the
        // caller's contract) or is the caller.
        unsafe { (*(slot as *const Cell<*mut ThreadState>)).set(null_mut()) };
    }
}

/// Forgets the calling thread's state (after fork: the child starts afresh).
pub fn detach_current() {
    CURRENT.with(|c| c.set(null_mut()));
}

/// Iterates over every registered state (all threads ever profiled).
pub fn all() -> impl Iterator<Item = &'static ThreadState> {
    let mut p = ALL.load(Ordering::Acquire);
    core::iter::from_fn(move || {
        if p.is_null() {
            return None;
        }
        // SAFETY: states are never freed.
        let t = unsafe { &*p };
        p = t.next.load(Ordering::Acquire);
        Some(t)
    })
}

/// Before the final dump: the calling thread's call tree gives its lookup
/// table's pages back ([`CallTree::release_table`]), and so does every
/// other tree when `program_gone` (the keeper's dump: no thread of the
/// program is left to add a node). A live thread's table is its owner's
/// alone and is left as it is.
pub fn release_lookup_tables(program_gone: bool) {
    if program_gone {
        for t in all() {
            // SAFETY: the program's threads, the trees' owners, are gone;
            // the keeper's dump is the only user of the trees.
            unsafe { &mut *t.tree.get() }.release_table();
        }
        return;
    }
    if let Some(t) = current() {
        if let Some(g) = t.enter() {
            // SAFETY: the owning thread, holding its guard.
            unsafe { t.tree_mut(&g) }.release_table();
        }
    }
}

/// The states a dump merges: all but those a fork child inherited from
/// its parent (or an attach found from an earlier session), which are
/// not its own.
pub fn dumped() -> impl Iterator<Item = &'static ThreadState> {
    all().filter(|t| !t.stale.load(Ordering::Acquire))
}

/// Call-tree nodes of the states a dump merges ([`dumped`]): a fork child
/// holds its parent's trees too, which it never writes.
pub fn total_nodes() -> usize {
    dumped().map(|t| t.tree().len()).sum()
}

impl ThreadState {
    /// Whether the state's thread shares its creator's TLS (raw `clone()`).
    pub fn shares_tls(&self) -> bool {
        self.shares_tls
    }

    /// Kernel thread id of the thread that owns the state now.
    #[inline]
    pub fn tid(&self) -> i32 {
        self.tid.load(Ordering::Acquire)
    }

    /// Enters profiler code on this thread; None if already inside (the
    /// caller must then pass straight through / drop the sample).
    #[inline]
    pub fn enter(&'static self) -> Option<Guard> {
        if self.busy.get() {
            return None;
        }
        self.busy.set(true);
        Some(Guard { t: self })
    }

    /// The thread left profiler code without returning from it: a program
    /// signal handler that interrupted it called longjmp. Nothing of that
    /// code runs any more, so the thread is no longer inside the profiler.
    pub fn left_by_jump(&self) {
        self.busy.set(false);
        self.in_signal.set(false);
        if let Some(u) = &self.unwinder {
            u.abandon_walk();
        }
    }

    /// Marks the handler's extent for the allocation check.
    #[inline]
    pub fn set_in_signal(&self, v: bool) {
        self.in_signal.set(v);
    }

    /// The call tree, for the owning thread while it holds its guard
    /// (`held`: while the thread is inside profiler code, no hook or
    /// handler of ours on it touches the tree).
    ///
    /// # Safety
    /// Only the owning thread may call this, and no other reference to
    /// the tree obtained through it may be alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn tree_mut(&self, held: &Guard) -> &mut CallTree {
        debug_assert!(core::ptr::eq(held.t, self));
        &mut *self.tree.get()
    }

    /// Read-only view of the tree for the dumper (concurrent-read safe).
    pub fn tree(&self) -> &CallTree {
        // SAFETY: shared reads of the tree go through its concurrent-read interface.
        unsafe { &*self.tree.get() }
    }

    /// Sets the index of the thread's energy ledger slot (owner thread,
    /// at thread start).
    pub fn set_energy_slot(&self, slot: Option<usize>) {
        self.energy_slot
            .store(slot.unwrap_or(NO_SLOT), Ordering::Release);
    }

    /// The index of the energy ledger slot, if registered (any thread).
    pub fn energy_slot(&self) -> Option<usize> {
        Some(self.energy_slot.load(Ordering::Acquire)).filter(|&s| s != NO_SLOT)
    }

    /// Unpublishes and returns the slot (owner thread, at thread exit).
    pub fn take_energy_slot(&self) -> Option<usize> {
        Some(self.energy_slot.swap(NO_SLOT, Ordering::AcqRel)).filter(|&s| s != NO_SLOT)
    }

    /// The trace buffer (owner thread only, while it holds its guard).
    ///
    /// # Safety
    /// Only the owning thread, and no other reference to the buffer
    /// obtained through it may be alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn trace_buf(&self, held: &Guard) -> &mut [usize] {
        debug_assert!(core::ptr::eq(held.t, self));
        core::slice::from_raw_parts_mut(self.trace, self.trace_cap)
    }
}

/// Proof that the current thread is inside profiler code; dropping it
/// leaves. Functions that may run only inside profiler code take it (or
/// `&Guard`) as a parameter, so that calling them without it does not
/// compile.
pub struct Guard {
    t: &'static ThreadState,
}

impl Guard {
    pub fn state(&self) -> &'static ThreadState {
        self.t
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        if self.t.sampler.clock.pending_ticks.get() != 0 {
            if let Some(h) = LEAVE_HOOKS.get() {
                (h.settle)(self);
            }
        }
        self.t.busy.set(false);
        if LEAVE_WORK.load(Ordering::Relaxed) {
            if let Some(h) = LEAVE_HOOKS.get() {
                (h.after)();
            }
        }
    }
}

/// An address in the caller's stack frame (its stack pointer, near enough).
#[inline(always)]
pub fn stack_pointer() -> usize {
    let here = 0u8;
    core::hint::black_box(&here) as *const u8 as usize
}

/// Runs `f` with the calling thread marked busy, so hooks it triggers pass
/// through. Threads without state (before init) just run `f`.
pub fn paused<R>(f: impl FnOnce() -> R) -> R {
    match current() {
        Some(t) => {
            let g = t.enter();
            let r = f();
            drop(g);
            r
        }
        None => f(),
    }
}

/// Whether the calling thread is inside profiler code (hooks pass through).
#[inline]
pub fn is_busy() -> bool {
    current().is_some_and(|t| t.busy.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::counters::{self, CounterId};
    use std::sync::mpsc;

    /// The state's address, its owner's tid and the node of a fixed path.
    fn register_and_sample(depth: usize) -> (usize, i32, usize) {
        let t = register_current(depth).unwrap();
        let g = t.enter().unwrap();
        // SAFETY: our own state.
        let n = unsafe { t.tree_mut(&g) }.node_for(&[0x20, 0x10], false);
        let slot = counters::slot(CounterId::PerfTicks).unwrap();
        // SAFETY: a live node of our tree.
        unsafe { &*n }.counter(slot).tick(1);
        drop(g);
        (t as *const ThreadState as usize, t.tid(), n as usize)
    }

    #[test]
    fn an_ended_threads_state_and_tree_are_adopted_a_running_ones_not() {
        let _g = counters::TEST_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counters::reset_for_test();
        counters::enable(CounterId::PerfTicks);
        // A trace size no other test uses, so only these states qualify.
        const DEPTH: usize = 77;
        let state_of = |p: usize| -> &'static ThreadState {
            // SAFETY: states are never freed.
            unsafe { &*(p as *const ThreadState) }
        };
        // A exits (as far as the profiler knows) but its thread still runs.
        let (go, wait) = mpsc::channel::<()>();
        let (tx, rx) = mpsc::channel();
        let a = std::thread::spawn(move || {
            let r = register_and_sample(DEPTH);
            state_of(r.0).exited.store(true, Ordering::Release);
            tx.send(r).unwrap();
            wait.recv().unwrap();
        });
        let (sa, tid_a, node_a) = rx.recv().unwrap();
        let b = std::thread::spawn(|| register_and_sample(DEPTH))
            .join()
            .unwrap();
        assert_ne!(b.0, sa, "adopted the state of a thread that still runs");
        go.send(()).unwrap();
        a.join().unwrap();
        // Once A has ended, the next thread takes its state and tree.
        while sys::thread_alive(tid_a) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let c = std::thread::spawn(|| register_and_sample(DEPTH))
            .join()
            .unwrap();
        assert_eq!(c.0, sa, "the ended thread's state is reused");
        assert_eq!(
            c.2, node_a,
            "same path, same node: A's node pointers stay valid"
        );
        let slot = counters::slot(CounterId::PerfTicks).unwrap();
        // SAFETY: nodes are never freed.
        assert_eq!(
            unsafe { &*(c.2 as *const crate::base::tree::Node) }
                .counter(slot)
                .get()
                .0,
            2
        );
        assert_eq!(state_of(sa).tid(), c.1);
        assert!(!state_of(sa).exited.load(Ordering::Acquire));
    }
}
