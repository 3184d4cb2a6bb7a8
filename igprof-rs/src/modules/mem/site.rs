//! Where a hooked call came from: the call-tree node of the caller's stack,
//! shared by the memory (`-mp`) and descriptor (`-fd`) modules.
//!
//! Owns the per-thread hook state of those modules ([`HookTls`]): whether
//! the thread is inside one of *our* hooks' real call (so an allocation that
//! libc makes inside `realloc`, or an `open` inside `fopen`, is not counted
//! twice), and the queue of events that arrived while the thread's profiler
//! guard was held (a signal handler that allocates while the interrupted
//! code was inside a hook): those are recorded when the guard is released,
//! with the stack they had, so no count is lost.
//!
//! Must never: allocate, lock, or leave `errno` changed.

use core::cell::Cell;
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::base::thread::{self, Guard, ThreadState};
use crate::base::tree::Node;
use crate::unwind::ThreadUnwinder;

/// Stack depth kept for an event deferred from a signal handler.
pub const DEFERRED_DEPTH: usize = 64;
/// Events a thread can defer before the next hook drains them.
pub const DEFERRED_MAX: usize = 16;

/// Replays a deferred event of its module: `f(the thread's guard, node of
/// the event's stack, kind, a, b)`.
pub type Replay = fn(&Guard, *mut Node, u8, usize, u64);

#[link_section = "igprof_hot"]
fn replay_nothing(_: &Guard, _: *mut Node, _: u8, _: usize, _: u64) {}

/// A hooked event seen while the thread was busy (nested in a signal
/// handler), replayed by the next hook call on that thread through the
/// replay function of the module that saw it.
#[derive(Clone, Copy)]
pub struct Deferred {
    pub replay: Replay,
    pub kind: u8,
    pub a: usize,
    pub b: u64,
    pub depth: u8,
    pub truncated: bool,
    pub trace: [usize; DEFERRED_DEPTH],
}

const NO_EVENT: Deferred = Deferred {
    replay: replay_nothing,
    kind: 0,
    a: 0,
    b: 0,
    depth: 0,
    truncated: false,
    trace: [0; DEFERRED_DEPTH],
};

/// Per-thread state of the memory and descriptor hooks.
pub struct HookTls {
    /// Set while a hook of ours runs the real function whose libc
    /// implementation calls another hooked function (realloc -> malloc,
    /// fopen -> open): such inner calls from libc are not separate events.
    pub outer: Cell<u8>,
    /// Deferred events: written by a signal handler on this thread, read by
    /// the thread itself; `head`/`tail` count pushes and pops. On the heap
    /// (made with the thread's first recorded event; null before): in TLS
    /// it took 8.7 KB from every thread's stack, where glibc puts TLS.
    queue: Cell<*mut [Deferred; DEFERRED_MAX]>,
    head: Cell<usize>,
    tail: Cell<usize>,
    /// Nodes of the previous event's stack (made on the thread's first
    /// recorded event).
    paths: Cell<*mut PathCache>,
    /// The previous allocation's stack, registers and node (made with
    /// `paths`).
    memo: Cell<*mut super::memo::StackMemo>,
    /// The block the last recorded allocation returned (see
    /// `hooks::via_begin`): an outer hook whose original allocated through
    /// another hooked entry point does not record the same block again.
    pub inner: Cell<usize>,
    /// The allocation sampler's countdown and generator (`--sample-bytes`).
    pub sampler: super::sample::ThreadSampler,
}

#[allow(clippy::declare_interior_mutable_const)] // a fresh record per use
const HOOK_TLS_INIT: HookTls = HookTls {
    outer: Cell::new(0),
    queue: Cell::new(core::ptr::null_mut()),
    head: Cell::new(0),
    tail: Cell::new(0),
    paths: Cell::new(core::ptr::null_mut()),
    memo: Cell::new(core::ptr::null_mut()),
    inner: Cell::new(0),
    sampler: super::sample::ThreadSampler::new(),
};

/// The calling thread's record, in the library's TLS area (`base/tls.rs`).
// SAFETY: HOOK_TLS_INIT is all-zero (null pointers, zero counts, a sampler
// that has not decided yet), HookTls has no destructor, and HOOKS_AT is
// this module's slot alone.
static TLS: crate::base::tls::Slot<HookTls> =
    unsafe { crate::base::tls::Slot::new(crate::base::tls::HOOKS_AT) };

/// Runs `f` with the calling thread's hook state. The record is found
/// first (the rare case of shared TLS out of line) and `f` runs once on
/// it, inlined: an out-of-line path that took `f` itself made every hook
/// store `f`'s captures in memory (16 stores an allocation).
#[inline(always)]
#[link_section = "igprof_hot"]
pub fn tls<R>(f: impl FnOnce(&HookTls) -> R) -> R {
    let blank;
    let h: &HookTls = if !thread::tls_is_shared() {
        // SAFETY: used for this call only, on this thread.
        unsafe { TLS.get() }
    } else {
        match shared_record() {
            Some(h) => h,
            None => {
                // A blank record for this call only.
                blank = HOOK_TLS_INIT;
                &blank
            }
        }
    };
    f(h)
}

/// Runs `f` with the calling thread's own hook state, or returns None
/// without running it when the process has threads that share their
/// creator's TLS (the caller then takes its general path, through [`tls`]).
/// For a hook's first test, which must not grow the hook's frame.
#[inline(always)]
#[link_section = "igprof_hot"]
pub fn tls_private<R>(f: impl FnOnce(&HookTls) -> R) -> Option<R> {
    if thread::tls_is_shared() {
        return None;
    }
    // SAFETY: used for this call only, on this thread.
    Some(f(unsafe { TLS.get() }))
}

/// [`tls`]'s record in a process with threads that share their creator's
/// TLS (raw `clone()`): such a thread's hook state is kept with its thread
/// state, made on first use (mmap, so also from signal context); a thread
/// that has no state and runs on another thread's TLS gets None (a blank
/// record for the call: its events pass through) and never touches the
/// owner's.
#[cold]
#[inline(never)]
#[link_section = "igprof_hot"]
fn shared_record() -> Option<&'static HookTls> {
    match which_record() {
        Record::Private(h) => Some(h),
        Record::Blank => None,
        // SAFETY: handed to `tls`, which uses it for one call on this thread.
        Record::Tls => Some(unsafe { TLS.get() }),
    }
}

/// Which hook record a thread uses where TLS may be shared.
enum Record {
    /// The TLS slot's: the thread's own TLS.
    Tls,
    /// The record kept with its state (a thread on its creator's TLS).
    Private(&'static HookTls),
    /// None to keep: a thread without state on another's TLS, or no memory.
    Blank,
}

#[link_section = "igprof_hot"]
fn which_record() -> Record {
    let Some(t) = thread::current() else {
        return if thread::tls_is_callers() {
            Record::Tls
        } else {
            Record::Blank
        };
    };
    if !t.shares_tls() {
        return Record::Tls;
    }
    let p = t.private_tls.load(Ordering::Acquire) as *const HookTls;
    if !p.is_null() {
        // SAFETY: made below for this state, never freed, owner thread only.
        return Record::Private(unsafe { &*p });
    }
    let m = crate::sys::mmap_anon(core::mem::size_of::<HookTls>()) as *mut HookTls;
    if m.is_null() {
        return Record::Blank;
    }
    // SAFETY: a fresh private mapping large enough for the record.
    unsafe { m.write(HOOK_TLS_INIT) };
    t.private_tls.store(m as *mut u8, Ordering::Release);
    // SAFETY: as above; the state keeps it for its owners from now on.
    Record::Private(unsafe { &*m })
}

/// Events that could not be recorded at all (no thread state, queue full,
/// no memory for a node). Reported at exit with -d and when non-zero.
pub static LOST: AtomicU64 = AtomicU64::new(0);
/// Events recorded late, from the deferred queue.
pub static DEFERRED: AtomicU64 = AtomicU64::new(0);

/// The executable range of libc (set at start-up), to tell libc's internal
/// calls from the program's.
static LIBC_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Remembers libc's text range (start-up, outside signal context).
#[link_section = "igprof_hot"]
pub fn init_libc_range() {
    if let Ok(s) = trampoline::find_function("malloc", Some("libc.so.6")) {
        if let Some(m) = crate::unwind::module_of(s.addr as usize) {
            LIBC_TEXT[0].store(m.text.0, Ordering::Relaxed);
            LIBC_TEXT[1].store(m.text.1, Ordering::Relaxed);
        }
    }
}

#[inline]
#[link_section = "igprof_hot"]
pub fn in_libc(pc: usize) -> bool {
    pc >= LIBC_TEXT[0].load(Ordering::Relaxed) && pc < LIBC_TEXT[1].load(Ordering::Relaxed)
}

/// The node of the current call's stack (the hooked function's caller
/// first). Returns None (and the reason is counted) when the event must not
/// be recorded: an inner libc call of one of our hooks, or no memory.
#[inline]
#[link_section = "igprof_hot"]
pub fn caller_node(g: &Guard, h: &HookTls, outer_bit: u8) -> Option<*mut Node> {
    walk_node(g, h, outer_bit, None).map(|(n, _)| n)
}

/// As [`caller_node`], for an allocation hook entered through a stub that
/// passed the program's registers: the stack memo answers when the stack
/// is the same as the previous event's.
#[inline(always)]
#[link_section = "igprof_hot"]
pub fn caller_node_at(g: &Guard, h: &HookTls, r: &super::memo::EntryRegs) -> Option<*mut Node> {
    let t = g.state();
    if h.outer.get() & MEM_OUTER != 0 || h.memo.get().is_null() {
        return caller_node(g, h, MEM_OUTER);
    }
    // SAFETY: this thread's memo, used only with its guard held.
    let m = unsafe { &mut *h.memo.get() };
    if !m.usable(t, r) {
        return caller_node(g, h, MEM_OUTER);
    }
    match m.lookup(t, r) {
        Some(n) if !super::memo::checking() => Some(n),
        Some(n) => {
            let (walked, _) = walk_node(g, h, MEM_OUTER, None)?;
            super::memo::checked(n, walked);
            Some(walked)
        }
        None => walk_and_remember(g, h, m, r),
    }
}

/// [`caller_node_at`] when the memo has no walk for the event: walks, and
/// remembers the walk. Out of line, so that a hit runs inlined in the hook.
#[inline(never)]
#[link_section = "igprof_hot"]
fn walk_and_remember(
    g: &Guard,
    h: &HookTls,
    m: &mut super::memo::StackMemo,
    r: &super::memo::EntryRegs,
) -> Option<*mut Node> {
    let t = g.state();
    let log = m.begin(t, r);
    let (n, depth) = walk_node(g, h, MEM_OUTER, Some(log))?;
    // A walk cut by the depth limit would read on in a longer one: not
    // memoised.
    if depth < t.trace_cap {
        m.store(t, r, n);
    }
    Some(n)
}

/// Walks the caller's stack into the thread's trace buffer (recording
/// what it reads into `log`) and finds its node; returns the node and the
/// trace depth.
#[inline]
#[link_section = "igprof_hot"]
fn walk_node(
    g: &Guard,
    h: &HookTls,
    outer_bit: u8,
    log: Option<&crate::unwind::ReadLog>,
) -> Option<(*mut Node, usize)> {
    let t = g.state();
    if h.memo.get().is_null() {
        make_thread_extras(g, h);
    }
    // SAFETY: the owner thread (the guard is of its current state); the
    // buffer is not borrowed elsewhere while a hook records.
    let buf = unsafe { t.trace_buf(g) };
    let w = crate::base::trace::here_logged(t, buf, log);
    if h.outer.get() & outer_bit != 0 && w.depth > 0 && in_libc(buf[0]) {
        return None;
    }
    if w.truncated {
        t.stats.truncated.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: the owner thread; the tree is not borrowed elsewhere.
    let tree = unsafe { t.tree_mut(g) };
    let trace = &buf[..w.depth];
    let pc = h.paths.get();
    let n = if pc.is_null() {
        tree.node_for(trace, w.truncated)
    } else {
        // SAFETY: this thread's path cache, used only with its guard held.
        unsafe { &mut *pc }.node_for(t, tree, trace, w.truncated)
    };
    if n.is_null() {
        LOST.fetch_add(1, Ordering::Relaxed);
        None
    } else {
        Some((n, w.depth))
    }
}

/// The nodes of the thread's previous event's stack, so that the next
/// event only looks up the frames that differ (the outer frames of two
/// consecutive allocations are usually the same).
pub struct PathCache {
    owner: *const ThreadState,
    truncated: bool,
    /// Previous trace, outermost frame first, and `nodes[i]` = node of
    /// `trace[..=i]`: the part two traces share is a common prefix, kept
    /// in place while the rest is replaced.
    trace: Vec<usize>,
    nodes: Vec<*mut Node>,
}

impl PathCache {
    #[link_section = "igprof_hot"]
    fn new(cap: usize) -> Self {
        PathCache {
            owner: core::ptr::null(),
            truncated: false,
            trace: Vec::with_capacity(cap),
            nodes: Vec::with_capacity(cap),
        }
    }

    /// The node for `trace` (leaf first) in `tree` (as
    /// `CallTree::node_for`), reusing the nodes of the longest outer part
    /// shared with the previous trace.
    #[link_section = "igprof_hot"]
    fn node_for(
        &mut self,
        t: &'static ThreadState,
        tree: &mut crate::base::tree::CallTree,
        trace: &[usize],
        truncated: bool,
    ) -> *mut Node {
        let d = trace.len();
        if d > self.trace.capacity() {
            self.owner = core::ptr::null();
            return tree.node_for(trace, truncated);
        }
        let mut common = 0;
        if core::ptr::eq(self.owner, t) && self.truncated == truncated {
            let known = self.trace.len().min(d);
            while common < known && trace[d - 1 - common] == self.trace[common] {
                common += 1;
            }
        }
        if common == 0 {
            let n = tree.node_for(trace, truncated);
            self.owner = core::ptr::null();
            if !n.is_null() && d > 0 {
                // The node list, from the leaf's parents.
                self.trace.clear();
                self.trace.extend(trace.iter().rev());
                self.nodes.clear();
                self.nodes.resize(d, core::ptr::null_mut());
                let mut p = n;
                for slot in self.nodes.iter_mut().rev() {
                    *slot = p;
                    // SAFETY: nodes are never freed; parents of a path node exist.
                    p = unsafe { &*p }.parent as *mut Node;
                }
                self.owner = t;
                self.truncated = truncated;
            }
            return n;
        }
        // Keep the shared outer part, look up the rest.
        self.trace.truncate(common);
        self.nodes.truncate(common);
        let mut node = self.nodes[common - 1];
        for &addr in trace[..d - common].iter().rev() {
            node = tree.child(node, addr);
            if node.is_null() {
                self.owner = core::ptr::null();
                return node;
            }
            self.trace.push(addr);
            self.nodes.push(node);
        }
        // The path's end may have been an inner node of the last one.
        let node = tree.charged(node);
        if node.is_null() {
            self.owner = core::ptr::null();
        }
        node
    }
}

/// At thread exit: frees the thread's path cache and stack memo (a
/// program that makes many short threads must not keep them). An
/// allocation after this (a later thread-local destructor) makes them
/// again.
#[link_section = "igprof_hot"]
pub fn release_thread_extras() {
    thread::paused(|| {
        tls(|h| {
            let p = h.paths.replace(core::ptr::null_mut());
            let m = h.memo.replace(core::ptr::null_mut());
            // The queue goes too when nothing waits in it (an event deferred
            // from now on is counted as lost).
            let q = if h.head.get() == h.tail.get() {
                h.queue.replace(core::ptr::null_mut())
            } else {
                core::ptr::null_mut()
            };
            // SAFETY: each was made by Box::into_raw in make_thread_extras on
            // this thread and is no longer referenced (pointers cleared).
            unsafe {
                if !p.is_null() {
                    drop(Box::from_raw(p));
                }
                if !m.is_null() {
                    drop(Box::from_raw(m));
                }
                if !q.is_null() {
                    drop(Box::from_raw(q));
                }
            }
        })
    });
}

#[cold]
#[inline(never)]
#[link_section = "igprof_hot"]
fn make_thread_extras(_held: &Guard, h: &HookTls) {
    // Inside profiler code, not in our signal handler (hooks only): the
    // global allocator is usable.
    // A signal handler that allocates meanwhile would find no queue to
    // defer its event to (the thread's first recorded event is under way):
    // its signal waits until they exist (once per thread, a few hundred
    // microseconds).
    let _blocked = crate::sys::AllSignalsBlocked::new();
    // On a stack of its own: these are large values, built before they are
    // boxed, and the thread's stack may be 16 KiB.
    crate::sys::with_big_stack(|| {
        make_spare();
        let cap = thread::current().map_or(0, |t| t.trace_cap);
        h.paths.set(Box::into_raw(Box::new(PathCache::new(cap))));
        h.memo
            .set(Box::into_raw(Box::new(super::memo::StackMemo::new())));
        if h.queue.get().is_null() {
            h.queue
                .set(Box::into_raw(Box::new([NO_EVENT; DEFERRED_MAX])));
        }
    });
}

/// The unwinders that walk the stack of a deferred event (a hooked call
/// in a signal handler that interrupted its thread's own walk), shared by
/// the process: a thread deferring takes a free one ([`SPARE_HELD_BY`])
/// for the walk. The n-th thread to record makes the n-th, up to
/// [`SPARES`] (outside signal context), so that as many threads as have
/// recorded can defer at once. One for each thread cost every thread
/// 21 KiB (framehop's cache) for events few threads ever have. With more
/// than [`SPARES`] threads deferring at the same moment, one that finds
/// none free keeps no stack for its event (counted under the truncation
/// marker).
const SPARES: usize = 8;
static SPARE: [AtomicPtr<ThreadUnwinder>; SPARES] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; SPARES];
/// The thread id holding each of [`SPARE`]; 0 when it is free.
static SPARE_HELD_BY: [AtomicI32; SPARES] = [const { AtomicI32::new(0) }; SPARES];
/// Spares claimed for making (the threads that recorded, up to SPARES).
static SPARES_CLAIMED: AtomicUsize = AtomicUsize::new(0);

/// One more spare, while there are fewer than [`SPARES`] (a thread's
/// first recorded event).
#[cold]
#[inline(never)]
fn make_spare() {
    let i = SPARES_CLAIMED.fetch_add(1, Ordering::Relaxed);
    if i >= SPARES {
        SPARES_CLAIMED.store(SPARES, Ordering::Relaxed);
        return;
    }
    if let Ok(u) = ThreadUnwinder::new() {
        SPARE[i].store(Box::into_raw(Box::new(u)), Ordering::Release);
    }
}

/// A free spare for thread `tid` (its index and itself), if one is made
/// and free. Signal context.
#[link_section = "igprof_hot"]
fn take_spare(tid: i32) -> Option<(usize, &'static ThreadUnwinder)> {
    for (i, s) in SPARE.iter().enumerate() {
        let p = s.load(Ordering::Acquire);
        if !p.is_null()
            && SPARE_HELD_BY[i]
                .compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            // SAFETY: never freed once made, and held by this thread alone
            // until `give_back_spare(i)`.
            return Some((i, unsafe { &*p }));
        }
    }
    None
}

#[link_section = "igprof_hot"]
fn give_back_spare(i: usize) {
    SPARE_HELD_BY[i].store(0, Ordering::Release);
}

/// Frees the spares held by threads for which `held(tid)` says so,
/// abandoning their walks: a thread that left one by longjmp, or in a fork
/// child the parent's threads (none of them is in it).
fn abandon_spares(held: impl Fn(i32) -> bool) {
    for (i, s) in SPARE.iter().enumerate() {
        let p = s.load(Ordering::Acquire);
        let by = SPARE_HELD_BY[i].load(Ordering::Acquire);
        if !p.is_null() && by != 0 && held(by) {
            // SAFETY: never freed once made; its holder is outside any
            // walk of it (gone, or left it by longjmp).
            unsafe { &*p }.abandon_walk();
            give_back_spare(i);
        }
    }
}

/// In a fork child: a thread of the parent that held a spare is not in
/// it.
pub fn spare_after_fork() {
    abandon_spares(|_| true);
}

/// Records an event of kind `kind` with arguments (a, b) now, or later
/// through `replay`: `f(thread, hook state)` runs with the thread's guard
/// held, then events deferred meanwhile are recorded. The thread's hook
/// state is looked up once for the whole event.
///
/// A thread that is already inside one of our hooks (a signal handler
/// nested in it) queues the event with its stack; a thread inside other
/// profiler code (the profiler's own use of libc), or one the profiler does
/// not know (a thread not started through pthread_create, such as our own
/// watcher while it registers), passes it through.
///
/// The thread is marked as recording *before* it takes its guard, so a
/// signal handler that runs at any point of the recording defers its events.
#[inline]
#[link_section = "igprof_hot"]
pub fn event(kind: u8, a: usize, b: u64, replay: Replay, f: impl FnOnce(&Guard, &HookTls)) {
    let Some(t) = thread::current().or_else(late_thread) else {
        unknown_thread();
        return;
    };
    tls(|h| {
        let prev = h.outer.get();
        if prev & IN_RECORD != 0 {
            // A signal handler interrupted one of our hooks on this thread
            // (which may hold a live-table lock): record it later.
            defer(t, h, replay, kind, a, b);
            return;
        }
        h.outer.set(prev | IN_RECORD);
        let Some(g) = t.enter() else {
            // Other profiler code on this thread: its own call.
            h.outer.set(prev);
            return;
        };
        f(&g, h);
        drain(&g, h);
        drop(g);
        h.outer.set(h.outer.get() & !IN_RECORD);
    })
}

/// An event on a thread with no state: counted, unless it is the
/// profiler's own call while the thread registers.
#[cold]
#[inline(never)]
#[link_section = "igprof_hot"]
fn unknown_thread() {
    if !thread::registering() {
        UNKNOWN_THREAD.fetch_add(1, Ordering::Relaxed);
    }
}

/// A thread that ran before the library was loaded into its process
/// (`igprof --attach`), met here for the first time: registered now, its
/// hooks passing through meanwhile (registration calls libc).
#[cold]
#[inline(never)]
#[link_section = "igprof_hot"]
fn late_thread() -> Option<&'static thread::ThreadState> {
    if !crate::base::run::attached() {
        return None;
    }
    tls(|h| {
        let prev = h.outer.get();
        if prev & IN_RECORD != 0 {
            return None;
        }
        h.outer.set(prev | IN_RECORD);
        let t = thread::register_late();
        h.outer.set(prev);
        t
    })
}

/// Whether the calling thread is inside a hook (recording an event, or in
/// a real function a hook called).
#[link_section = "igprof_hot"]
pub fn in_hook() -> bool {
    tls(|h| h.outer.get() != 0)
}

/// Whether the calling thread is inside a hook where it may hold a lock:
/// recording (a live-table shard, its own registration), or inside a real
/// function a hook called (the allocator's own lock, stdio's). Not for
/// [`MEM_VIA`] alone, which an exception thrown through an operator new's
/// hook leaves set until the thread's next allocation.
#[link_section = "igprof_hot"]
pub fn may_hold_lock() -> bool {
    tls(|h| h.outer.get() & !MEM_VIA != 0)
}

/// The thread left a hook by longjmp (a program's signal handler that
/// interrupted it): it is no longer recording nor inside a real call.
#[link_section = "igprof_hot"]
pub fn left_by_jump() {
    tls(|h| h.outer.set(0));
    // A handler that jumped out of a deferred event's walk.
    if let Some(t) = thread::current() {
        let me = t.tid();
        abandon_spares(|by| by == me);
    }
}

/// Before a longjmp (the registry's `left_by_jump` of every module that
/// records through this file): a thread inside the profiler (`busy`) or
/// inside a hook leaves it for good.
#[link_section = "igprof_hot"]
pub fn jumped_out(busy: bool) {
    if busy || in_hook() {
        left_by_jump();
    }
}

/// Events on threads the profiler has no state for (passed through).
pub static UNKNOWN_THREAD: AtomicU64 = AtomicU64::new(0);

/// Bit of [`HookTls::outer`] set while a hook records an event (guard held).
pub const IN_RECORD: u8 = 0x80;
/// Bit set while a memory hook runs a real function that may call another
/// allocation function inside libc (realloc, reallocarray).
pub const MEM_OUTER: u8 = 0x01;
/// Bit set while an allocation hook runs a real function whose allocation
/// another hooked entry point may make and decide for (see
/// `hooks::via_begin`).
pub const MEM_VIA: u8 = 0x08;
/// Bit set while an allocator entry point hooked by `mem::fronts` runs its
/// original: the allocation hooks it reaches record nothing.
pub const MEM_FRONT: u8 = 0x10;

/// Set when `mem::fronts` hooks its first entry point: until then no
/// thread can be inside one, and the allocation hooks skip the test.
pub static FRONTS_HOOKED: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

/// Whether the calling thread is inside an allocator entry point hooked by
/// `mem::fronts` (its original running): the allocation hooks it reaches
/// record nothing.
#[inline(always)]
#[link_section = "igprof_hot"]
pub fn inside_front() -> bool {
    FRONTS_HOOKED.load(Ordering::Relaxed) && tls(|h| h.outer.get() & MEM_FRONT != 0)
}
/// Bit set while a descriptor hook runs a real function that may open or
/// close inside libc (fopen, tmpfile, fclose, creat).
pub const FD_OUTER: u8 = 0x02;
/// Bit set while the function-call profiler (`-fp`) counts a call: a call
/// of a counted function made by the counting itself passes uncounted.
pub const CALLS_COUNTING: u8 = 0x04;

/// Runs `f` with `bit` set in the thread's [`HookTls::outer`].
#[inline]
#[link_section = "igprof_hot"]
pub fn with_outer<R>(bit: u8, f: impl FnOnce() -> R) -> R {
    // Nested uses (reallocarray -> realloc) leave the bit as they found it.
    let had = tls(|h| {
        let o = h.outer.get();
        h.outer.set(o | bit);
        o & bit
    });
    let r = f();
    tls(|h| h.outer.set((h.outer.get() & !bit) | had));
    r
}

/// Whether a shard lock of the live tables might be held by this thread
/// right now (a signal handler interrupted the holder): such events are
/// deferred instead.
#[inline]
#[link_section = "igprof_hot"]
pub fn recording() -> bool {
    tls(|h| h.outer.get() & IN_RECORD != 0)
}

/// Runs `f` (which takes live-table locks but needs no call tree: the free
/// path) marked as recording, so that a signal handler interrupting it
/// defers its events instead of waiting for a lock this thread holds.
/// Returns None, and queues the event (kind, a, b) for `replay` instead, if
/// the thread was already recording (this is such a handler).
#[inline(always)]
#[link_section = "igprof_hot"]
pub fn unrecorded<R>(
    kind: u8,
    a: usize,
    b: u64,
    replay: Replay,
    f: impl FnOnce() -> R,
) -> Option<R> {
    // Inlined: compiled out of line, the closure made every free store its
    // eight captures in memory.
    tls(
        #[inline(always)]
        |h| {
            let prev = h.outer.get();
            h.outer.set(prev | IN_RECORD);
            if prev & IN_RECORD != 0 {
                defer_in(h, kind, a, b, replay);
                return None;
            }
            let r = f();
            h.outer.set(h.outer.get() & !IN_RECORD);
            Some(r)
        },
    )
}

/// Queues an event without a guard (the free path, which needs no call
/// tree): only valid while [`recording`] is true.
#[link_section = "igprof_hot"]
pub fn defer_now(kind: u8, a: usize, b: u64, replay: Replay) {
    tls(|h| defer_in(h, kind, a, b, replay));
}

#[link_section = "igprof_hot"]
fn defer_in(h: &HookTls, kind: u8, a: usize, b: u64, replay: Replay) {
    if let Some(t) = thread::current() {
        defer(t, h, replay, kind, a, b);
    } else {
        LOST.fetch_add(1, Ordering::Relaxed);
    }
}

#[inline(never)]
#[link_section = "igprof_hot"]
fn defer(t: &'static ThreadState, h: &HookTls, replay: Replay, kind: u8, a: usize, b: u64) {
    let (head, tail) = (h.head.get(), h.tail.get());
    if tail - head >= DEFERRED_MAX {
        LOST.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: only this thread touches its queue; the slot at `tail` is
    // not visible to the reader until `tail` is advanced below.
    let q = h.queue.get();
    if q.is_null() {
        LOST.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: q is this thread's queue (see above), non-null.
    let e = unsafe { &mut (*q)[tail % DEFERRED_MAX] };
    e.replay = replay;
    e.kind = kind;
    e.a = a;
    e.b = b;
    if let Some((i, spare)) = take_spare(t.tid()) {
        // A handler that interrupted a walk runs on the walk stack, where
        // its own frames are: the walk reads there too, then through the
        // interrupted walk's frames (the profiler's, left out) back to the
        // program's stack.
        let mut bounds = *t.bounds;
        let sp = crate::base::thread::stack_pointer();
        let walk = (t.walk_stack, t.walk_stack + crate::base::thread::WALK_STACK);
        if t.walk_stack != 0 && walk.0 <= sp && sp < walk.1 && bounds.altstack == (0, 0) {
            bounds.altstack = walk;
        }
        let w = spare.trace_program_here(&bounds, &mut e.trace);
        give_back_spare(i);
        e.depth = w.depth as u8;
        e.truncated = w.truncated() || w.depth == 0;
    } else {
        e.depth = 0;
        e.truncated = true;
    }
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
    h.tail.set(tail + 1);
}

/// Replays every deferred event through its own replay function.
#[inline]
#[link_section = "igprof_hot"]
pub fn drain(g: &Guard, h: &HookTls) {
    if h.head.get() == h.tail.get() {
        return;
    }
    drain_slow(g, h);
}

#[inline(never)]
#[link_section = "igprof_hot"]
fn drain_slow(g: &Guard, h: &HookTls) {
    loop {
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
        let head = h.head.get();
        if head == h.tail.get() {
            return;
        }
        // SAFETY: slot `head` was completed before `tail` moved past it.
        let e = unsafe { (*h.queue.get())[head % DEFERRED_MAX] };
        h.head.set(head + 1);
        // SAFETY: the owner thread; the tree is not borrowed elsewhere.
        let tree = unsafe { g.state().tree_mut(g) };
        let n = tree.node_for(&e.trace[..e.depth as usize], e.truncated);
        DEFERRED.fetch_add(1, Ordering::Relaxed);
        if n.is_null() {
            LOST.fetch_add(1, Ordering::Relaxed);
        } else {
            (e.replay)(g, n, e.kind, e.a, e.b);
        }
    }
}
