//! Per-thread profiler state, reached signal-safely, and the re-entrancy guard.
//!
//! Owns [`ThreadState`] (call tree, trace buffer, timer, sample statistics)
//! and the process-wide list of all states (push-only, lock-free) that the
//! dumper walks. The pointer to the current thread's state lives in a
//! `thread_local!` with const initialisation and no destructor, which Rust
//! compiles to a plain TLS slot: reading it in a signal handler allocates
//! nothing (the library is preloaded, so its TLS is in the static block).
//!
//! Must never: allocate through the global allocator from signal context
//! (states come from mmap), free a state (other threads and the dumper may
//! still read it), or let a hook run profiler code while the thread is
//! already inside the profiler ([`Guard`]).

use core::cell::Cell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

use crate::sys;
use crate::tree::CallTree;

/// The profiler state of one thread.
pub struct ThreadState {
    pub tid: i32,
    /// Whether the thread is inside profiler code (hook, handler, dump).
    busy: Cell<bool>,
    /// Whether the thread is inside our signal handler (allocation check).
    in_signal: Cell<bool>,
    pub tree: core::cell::UnsafeCell<CallTree>,
    /// Buffer for one stack trace (max_depth + 1 entries), from mmap.
    pub trace: *mut usize,
    pub trace_cap: usize,
    /// Kernel timer id of this thread's sampling timer, or -1.
    pub timer: AtomicI32,
    /// perf_event descriptor of this thread's task-clock sampler, or -1.
    pub perf_fd: AtomicI32,
    /// The perf event's ring-buffer mapping (0 if none).
    pub perf_ring: core::sync::atomic::AtomicUsize,
    /// Samples since the sampling period was last re-randomised.
    pub since_jitter: Cell<u32>,
    pub samples: AtomicU64,
    pub dropped: AtomicU64,
    pub truncated: AtomicU64,
    /// Nanoseconds spent in the sampling handler (our own cost per sample).
    pub handler_ns: AtomicU64,
    /// Set when the thread has exited (its tree is still dumped).
    pub exited: AtomicBool,
    /// Set in a forked child for states inherited from the parent: not dumped.
    pub stale: AtomicBool,
    /// xorshift state for interval jitter.
    pub rng: Cell<u64>,
    /// POSIX-timer samplers: the sampled clock's reading already turned into
    /// ticks, and the carried remainder (see perf::ticks_for).
    pub clock_seen: Cell<u64>,
    pub clock_credit: Cell<u64>,
    /// Program's view of SIGPROF blocking on this thread (signals module).
    pub prog_blocks_prof: Cell<bool>,
    /// A program-originated SIGPROF arrived while the program blocked it.
    pub prog_prof_pending: Cell<bool>,
    /// Where the unwinder may read this thread's stack.
    pub bounds: crate::unwind::StackBounds,
    /// The thread's unwinder (descriptor cache), None if it could not be made.
    pub unwinder: Option<crate::unwind::ThreadUnwinder>,
    /// The node of this thread's latest sample (energy charged at exit/dump).
    pub last_sample: AtomicPtr<crate::tree::Node>,
    /// The thread's slot in the energy ledger (-np), published by
    /// `energy_slot_live` (written by the owner; read by the dumper too).
    energy_slot: core::cell::UnsafeCell<Option<crate::energy::ledger::SlotId>>,
    energy_slot_live: AtomicBool,
    next: AtomicPtr<ThreadState>,
}

// SAFETY: Cell fields are only touched by the owning thread; cross-thread
// readers use the atomics and the tree's concurrent-read interface.
unsafe impl Sync for ThreadState {}

thread_local! {
    static CURRENT: Cell<*mut ThreadState> = const { Cell::new(null_mut()) };
}

static ALL: AtomicPtr<ThreadState> = AtomicPtr::new(null_mut());

/// The calling thread's state, if it has one.
#[inline]
pub fn current() -> Option<&'static ThreadState> {
    let p = CURRENT.with(|c| c.get());
    if p.is_null() {
        None
    } else {
        // SAFETY: states are never freed.
        Some(unsafe { &*p })
    }
}

/// Aborts (with a message) if the global allocator is used in our signal handler.
#[inline]
pub fn assert_not_in_signal() {
    if let Some(t) = current() {
        if t.in_signal.get() {
            crate::igprof_log!("BUG: allocation inside the signal handler; aborting");
            // SAFETY: abort never returns.
            unsafe { libc::abort() };
        }
    }
}

/// Creates and registers the calling thread's state (not from signal context).
pub fn register_current(max_depth: usize) -> Option<&'static ThreadState> {
    if let Some(t) = current() {
        return Some(t);
    }
    let size = core::mem::size_of::<ThreadState>();
    let mem = sys::mmap_anon(size + (max_depth + 2) * core::mem::size_of::<usize>()) as *mut ThreadState;
    if mem.is_null() {
        return None;
    }
    let tid = sys::gettid();
    let bounds = crate::unwind::StackBounds::for_current_thread().unwrap_or_default();
    let unwinder = crate::unwind::ThreadUnwinder::new().ok();
    // SAFETY: fresh mapping big enough for the state plus the trace buffer.
    unsafe {
        mem.write(ThreadState {
            tid,
            busy: Cell::new(false),
            in_signal: Cell::new(false),
            tree: core::cell::UnsafeCell::new(CallTree::new()),
            trace: (mem as *mut u8).add(size) as *mut usize,
            trace_cap: max_depth + 1,
            timer: AtomicI32::new(-1),
            perf_fd: AtomicI32::new(-1),
            perf_ring: core::sync::atomic::AtomicUsize::new(0),
            since_jitter: Cell::new(0),
            samples: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            handler_ns: AtomicU64::new(0),
            exited: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            rng: Cell::new(
                0x9e37_79b9_7f4a_7c15 ^ (tid as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ sys::monotonic_ns(),
            ),
            clock_seen: Cell::new(0),
            clock_credit: Cell::new(0),
            prog_blocks_prof: Cell::new(false),
            prog_prof_pending: Cell::new(false),
            bounds,
            unwinder,
            last_sample: AtomicPtr::new(null_mut()),
            energy_slot: core::cell::UnsafeCell::new(None),
            energy_slot_live: AtomicBool::new(false),
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
    CURRENT.with(|c| c.set(mem));
    // SAFETY: never freed.
    Some(unsafe { &*mem })
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

impl ThreadState {
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

    /// Marks the handler's extent for the allocation check.
    #[inline]
    pub fn set_in_signal(&self, v: bool) {
        self.in_signal.set(v);
    }

    /// The call tree, for the owning thread while holding a [`Guard`].
    ///
    /// # Safety
    /// Only the owning thread may call this, with its guard held.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn tree_mut(&self) -> &mut CallTree {
        &mut *self.tree.get()
    }

    /// Read-only view of the tree for the dumper (concurrent-read safe).
    pub fn tree(&self) -> &CallTree {
        // SAFETY: shared reads of the tree go through its concurrent-read interface.
        unsafe { &*self.tree.get() }
    }

    /// Sets the energy ledger slot (owner thread, at thread start).
    pub fn set_energy_slot(&self, slot: Option<crate::energy::ledger::SlotId>) {
        // SAFETY: written by the owner before it is published below.
        unsafe { *self.energy_slot.get() = slot };
        self.energy_slot_live.store(slot.is_some(), Ordering::Release);
    }

    /// The energy ledger slot, if registered (any thread).
    pub fn energy_slot(&self) -> Option<crate::energy::ledger::SlotId> {
        if self.energy_slot_live.load(Ordering::Acquire) {
            // SAFETY: published with release after the write; not rewritten while live.
            unsafe { *self.energy_slot.get() }
        } else {
            None
        }
    }

    /// Unpublishes and returns the slot (owner thread, at thread exit).
    pub fn take_energy_slot(&self) -> Option<crate::energy::ledger::SlotId> {
        let s = self.energy_slot();
        self.energy_slot_live.store(false, Ordering::Release);
        s
    }

    /// Next pseudo-random number (owner thread only).
    #[inline]
    pub fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }

    /// The trace buffer (owner thread only, guard held).
    ///
    /// # Safety
    /// Only the owning thread, with its guard held.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn trace_buf(&self) -> &mut [usize] {
        core::slice::from_raw_parts_mut(self.trace, self.trace_cap)
    }
}

/// Proof that the current thread is inside profiler code; dropping it leaves.
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
        self.t.busy.set(false);
    }
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
