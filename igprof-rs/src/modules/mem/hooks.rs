//! The allocation-function replacements installed with trampolines, and
//! which allocator's entry points they go on.
//!
//! Owns the chain pointers of the hooked allocation functions. Each
//! replacement calls the original through its chain pointer, leaves the
//! return value untouched and `errno` as the original left it, and records
//! the event only when the original succeeded. A block is taken out of the
//! live table *before* the real free/realloc (after it, another thread may
//! already have been given the same address).
//!
//! Which functions: every name in [`funcs`] is looked up as the process
//! resolves it (first definition in load order), so when jemalloc or
//! tcmalloc is linked or preloaded, their `malloc`, `free`, ... are the
//! ones hooked; their extra entry points (jemalloc's `mallocx`-family is
//! not hooked; tcmalloc's `tc_*` names) and C++ operators are hooked only
//! when the object defining them is the allocator that also defines
//! `malloc` (libstdc++'s operator new calls malloc and must not count
//! twice). Two names at one address (glibc: `aligned_alloc` = `memalign`,
//! `cfree` = `free`) are hooked once.
//!
//! Sampled mode (`--sample-bytes`): every allocation entry point goes
//! through `allocated_fill`, which asks [`super::sample::decide`] once per
//! allocation the program asked for (an allocation made inside the real
//! realloc/reallocarray is left to the outer hook's decision, and an inner
//! hook that decided marks the block so that an outer one does not decide
//! again); only a recorded allocation walks the stack. malloc and calloc
//! first ask whether the sampler passes over the allocation, before the
//! call, and if so jump to the real function (the common case; not inside
//! another hook, whose protocol needs the general path). Every free goes
//! through `freeing`, which skips the live table for a block the
//! sampler's filter says was never recorded.
//!
//! Must never: call a hooked function except through its chain pointer
//! while recording, allocate, or change the program's view of the call.

use core::ffi::{c_int, c_void};

use super::account;
use super::memo::EntryRegs;
use super::site::{self, MEM_OUTER, MEM_VIA};
use crate::hook::hook_table;
use crate::sys::ErrnoGuard;

/// Deferred-event kinds of this module.
pub const KIND_ALLOC: u8 = 1;
pub const KIND_FREE: u8 = 2;
/// Not replayed: a failed realloc inside a signal handler nested in a hook
/// (its block was not taken out either, see [`freeing`]).
const KIND_ALLOC_RESTORE: u8 = 3;

hook_table! {
    /// The hooked allocation functions, with the signatures their
    /// originals are called with.
    pub enum Func {
        Malloc => fn malloc(size: usize) -> *mut c_void;
        Calloc => fn calloc(n: usize, m: usize) -> *mut c_void;
        Realloc => fn realloc(p: *mut c_void, size: usize) -> *mut c_void;
        ReallocArray => fn reallocarray(p: *mut c_void, n: usize, m: usize) -> *mut c_void;
        Free => fn free(p: *mut c_void);
        Memalign => fn memalign(align: usize, size: usize) -> *mut c_void;
        PosixMemalign => fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int;
        AlignedAlloc => fn aligned_alloc(align: usize, size: usize) -> *mut c_void;
        Valloc => fn valloc(size: usize) -> *mut c_void;
        Pvalloc => fn pvalloc(size: usize) -> *mut c_void;
        Cfree => fn cfree(p: *mut c_void);
        /// tcmalloc's C++ operators (defined by the allocator itself).
        New => fn new(size: usize) -> *mut c_void;
        NewArray => fn new_array(size: usize) -> *mut c_void;
        Delete => fn delete(p: *mut c_void);
        DeleteArray => fn delete_array(p: *mut c_void);
        DeleteSized => fn delete_sized(p: *mut c_void, n: usize);
        DeleteArraySized => fn delete_array_sized(p: *mut c_void, n: usize);
        NewAligned => fn new_aligned(size: usize, align: usize) -> *mut c_void;
        NewArrayAligned => fn new_array_aligned(size: usize, align: usize) -> *mut c_void;
        DeleteAligned => fn delete_aligned(p: *mut c_void, align: usize);
        DeleteArrayAligned => fn delete_array_aligned(p: *mut c_void, align: usize);
        /// operator new(size, align, nothrow) and the nothrow/aligned
        /// deletes: the trailing arguments are passed through untouched.
        NewNothrow => fn new_nothrow(size: usize, b: usize, c: usize) -> *mut c_void;
        NewArrayNothrow => fn new_array_nothrow(size: usize, b: usize, c: usize) -> *mut c_void;
        NewAlignedNothrow => fn new_aligned_nothrow(size: usize, b: usize, c: usize) -> *mut c_void;
        NewArrayAlignedNothrow => fn new_array_aligned_nothrow(size: usize, b: usize, c: usize) -> *mut c_void;
        DeleteNothrow => fn delete_nothrow(p: *mut c_void, b: usize, c: usize);
        DeleteArrayNothrow => fn delete_array_nothrow(p: *mut c_void, b: usize, c: usize);
        DeleteSizedAligned => fn delete_sized_aligned(p: *mut c_void, b: usize, c: usize);
        DeleteArraySizedAligned => fn delete_array_sized_aligned(p: *mut c_void, b: usize, c: usize);
        DeleteAlignedNothrow => fn delete_aligned_nothrow(p: *mut c_void, b: usize, c: usize);
        DeleteArrayAlignedNothrow => fn delete_array_aligned_nothrow(p: *mut c_void, b: usize, c: usize);
    }
}

/// (symbol, replacement, whether only an allocator other than libc's may
/// provide it).
pub fn funcs() -> [(Func, &'static str, *const (), bool); N] {
    use Func::*;
    let (malloc_entry, calloc_entry) = if super::sample::active() {
        (
            entry::malloc_sampled_entry as *const (),
            entry::calloc_sampled_entry as *const (),
        )
    } else {
        (
            entry::malloc_entry as *const (),
            entry::calloc_entry as *const (),
        )
    };
    [
        (Malloc, "malloc", malloc_entry, false),
        (Calloc, "calloc", calloc_entry, false),
        (Realloc, "realloc", entry::realloc_entry as *const (), false),
        (
            ReallocArray,
            "reallocarray",
            reallocarray_hook as *const (),
            false,
        ),
        (Free, "free", free_hook as *const (), false),
        (Memalign, "memalign", memalign_hook as *const (), false),
        (
            PosixMemalign,
            "posix_memalign",
            posix_memalign_hook as *const (),
            false,
        ),
        (
            AlignedAlloc,
            "aligned_alloc",
            aligned_alloc_hook as *const (),
            false,
        ),
        (Valloc, "valloc", valloc_hook as *const (), false),
        (Pvalloc, "pvalloc", pvalloc_hook as *const (), false),
        (Cfree, "cfree", cfree_hook as *const (), false),
        (New, "_Znwm", new_hook as *const (), true),
        (NewArray, "_Znam", new_array_hook as *const (), true),
        (Delete, "_ZdlPv", delete_hook as *const (), true),
        (DeleteArray, "_ZdaPv", delete_array_hook as *const (), true),
        (DeleteSized, "_ZdlPvm", delete_sized_hook as *const (), true),
        (
            DeleteArraySized,
            "_ZdaPvm",
            delete_array_sized_hook as *const (),
            true,
        ),
        (
            NewAligned,
            "_ZnwmSt11align_val_t",
            new_aligned_hook as *const (),
            true,
        ),
        (
            NewArrayAligned,
            "_ZnamSt11align_val_t",
            new_array_aligned_hook as *const (),
            true,
        ),
        (
            DeleteAligned,
            "_ZdlPvSt11align_val_t",
            delete_aligned_hook as *const (),
            true,
        ),
        (
            DeleteArrayAligned,
            "_ZdaPvSt11align_val_t",
            delete_array_aligned_hook as *const (),
            true,
        ),
        (
            NewNothrow,
            "_ZnwmRKSt9nothrow_t",
            new_nothrow_hook as *const (),
            true,
        ),
        (
            NewArrayNothrow,
            "_ZnamRKSt9nothrow_t",
            new_array_nothrow_hook as *const (),
            true,
        ),
        (
            NewAlignedNothrow,
            "_ZnwmSt11align_val_tRKSt9nothrow_t",
            new_aligned_nothrow_hook as *const (),
            true,
        ),
        (
            NewArrayAlignedNothrow,
            "_ZnamSt11align_val_tRKSt9nothrow_t",
            new_array_aligned_nothrow_hook as *const (),
            true,
        ),
        (
            DeleteNothrow,
            "_ZdlPvRKSt9nothrow_t",
            delete_nothrow_hook as *const (),
            true,
        ),
        (
            DeleteArrayNothrow,
            "_ZdaPvRKSt9nothrow_t",
            delete_array_nothrow_hook as *const (),
            true,
        ),
        (
            DeleteSizedAligned,
            "_ZdlPvmSt11align_val_t",
            delete_sized_aligned_hook as *const (),
            true,
        ),
        (
            DeleteArraySizedAligned,
            "_ZdaPvmSt11align_val_t",
            delete_array_sized_aligned_hook as *const (),
            true,
        ),
        (
            DeleteAlignedNothrow,
            "_ZdlPvSt11align_val_tRKSt9nothrow_t",
            delete_aligned_nothrow_hook as *const (),
            true,
        ),
        (
            DeleteArrayAlignedNothrow,
            "_ZdaPvSt11align_val_tRKSt9nothrow_t",
            delete_array_aligned_nothrow_hook as *const (),
            true,
        ),
    ]
}

/// Stores the chain pointer of `f`.
pub fn set_chain(f: Func, chain: *const ()) {
    CHAIN.set(f as usize, chain);
}

/// Whether `f` is hooked.
pub fn hooked(f: Func) -> bool {
    CHAIN.is_set(f as usize)
}

// ---- recording ----

/// What the profile records for a block of `requested` bytes at `addr`
/// under -mo (none: requested; include: usable size; delta: usable -
/// requested).
#[inline]
#[link_section = "igprof_hot"]
fn accounted(addr: usize, requested: usize) -> u64 {
    match super::overhead() {
        crate::base::options::MemOverhead::None => requested as u64,
        mode => {
            // SAFETY: addr is a live block just returned by the allocator
            // whose malloc_usable_size the process resolves.
            let usable = unsafe { libc::malloc_usable_size(addr as *mut c_void) };
            match mode {
                crate::base::options::MemOverhead::Include => usable as u64,
                _ => usable.saturating_sub(requested) as u64,
            }
        }
    }
}

/// Replays one deferred memory event.
pub fn replay(
    g: &crate::base::thread::Guard,
    node: *mut crate::base::tree::Node,
    kind: u8,
    a: usize,
    b: u64,
) {
    match kind {
        KIND_ALLOC if super::sample::active() => {
            // The deferred event kept the packed weight, not the size:
            // MEM_MAX gets the size it implies.
            let (calls, bytes) = super::sample::unpack(b);
            account::on_alloc_sampled(g, node, a, b, bytes / calls.max(1))
        }
        KIND_ALLOC => account::on_alloc(g, node, a, b),
        KIND_FREE => {
            account::on_free(a);
        }
        _ => {}
    }
}

/// A successful allocation of `size` bytes at `p` by the caller.
#[inline]
#[link_section = "igprof_hot"]
fn allocated(p: *mut c_void, size: usize) {
    allocated_fill(p, size, true, None)
}

/// As [`allocated`]; `fill` says whether -ei/-eu may overwrite the block
/// (not for calloc and realloc, whose contents the program relies on).
#[inline(always)]
#[link_section = "igprof_hot"]
fn allocated_fill(p: *mut c_void, size: usize, fill: bool, regs: Option<EntryRegs>) {
    allocated_counted(p, size, fill, regs, accounted)
}

/// [`allocated_fill`] with `count(addr, size)` the bytes recorded for the
/// block: [`accounted`] for the hooks; the size as given for a pool block
/// of the client API (`super::client`), whatever -mo says.
#[inline(always)]
#[link_section = "igprof_hot"]
pub(super) fn allocated_counted(
    p: *mut c_void,
    size: usize,
    fill: bool,
    regs: Option<EntryRegs>,
    count: fn(usize, usize) -> u64,
) {
    if p.is_null() || !crate::base::run::recording() || site::inside_front() {
        // Not recorded (-pd, igprof_disable): its free finds nothing.
        // Inside an allocator entry point of `fronts`: that one records.
        return;
    }
    if super::sample::active() {
        // -ei/-eu (fill) are refused with sampling.
        return allocated_sampled(p as usize, size, regs, count);
    }
    allocated_exact(p, size, fill, regs, count)
}

/// Records every allocation (exact mode).
#[inline]
#[link_section = "igprof_hot"]
fn allocated_exact(
    p: *mut c_void,
    size: usize,
    fill: bool,
    regs: Option<EntryRegs>,
    count: fn(usize, usize) -> u64,
) {
    let addr = p as usize;
    account::expect_alloc(addr);
    let _e = ErrnoGuard::save();
    let bytes = count(addr, size);
    site::event(KIND_ALLOC, addr, bytes, replay, |g, h| {
        let n = match &regs {
            Some(r) => site::caller_node_at(g, h, r),
            None => site::caller_node(g, h, MEM_OUTER),
        };
        if let Some(n) = n {
            // Recorded here: an outer hook waiting for an inner one
            // (via_begin) must not record it again.
            h.inner.set(addr);
            if fill && super::empty::active() {
                super::empty::fill(addr, size);
            }
            account::on_alloc(g, n, addr, bytes);
        }
    });
}

/// Sampled mode: decides whether the allocation of `size` bytes at `addr`
/// is recorded, and records it if so.
#[inline(always)]
#[link_section = "igprof_hot"]
fn allocated_sampled(
    addr: usize,
    size: usize,
    regs: Option<EntryRegs>,
    count: fn(usize, usize) -> u64,
) {
    let pick = site::tls(|h| {
        if h.outer.get() & MEM_OUTER != 0 {
            // Inside the real realloc/reallocarray: the outer hook decides
            // for the block it returns.
            return None;
        }
        // Decided here, whatever the outcome: an outer hook waiting for an
        // inner one (via_begin) must not decide again.
        h.inner.set(addr);
        super::sample::decide(&h.sampler, size)
    });
    if let Some(pick) = pick {
        record_sampled(addr, size, pick, regs, count);
    }
}

#[cold]
#[inline(never)]
#[link_section = "igprof_hot"]
fn record_sampled(
    addr: usize,
    size: usize,
    pick: super::sample::Pick,
    regs: Option<EntryRegs>,
    count: fn(usize, usize) -> u64,
) {
    let _e = ErrnoGuard::save();
    let bytes = count(addr, size);
    let stored = site::tls(|h| super::sample::weigh(&h.sampler, pick, bytes));
    // Counted in the free filter before the program sees the block, so a
    // free of it (even one deferred from a signal handler) is not skipped.
    super::sample::remember(addr);
    site::event(KIND_ALLOC, addr, stored, replay, |g, h| {
        let n = match &regs {
            Some(r) => site::caller_node_at(g, h, r),
            None => site::caller_node(g, h, MEM_OUTER),
        };
        match n {
            Some(n) => account::on_alloc_sampled(g, n, addr, stored, bytes),
            None => super::sample::forget(addr),
        }
    });
}

/// `p` is about to be freed: take it out of the live table. Returns the
/// block's record (for a realloc that may fail and must put it back).
#[inline(always)]
#[link_section = "igprof_hot"]
fn freeing(p: *mut c_void) -> Option<crate::base::live::Block> {
    freeing_then(p, |b| b)
}

/// [`freeing`] for a free, which needs no record back: nothing is copied
/// out (a block returned through memory, 8-byte fields read back as one
/// 16-byte load, stalls store forwarding on every free).
#[inline(always)]
#[link_section = "igprof_hot"]
pub(super) fn freed(p: *mut c_void) {
    if must_take_out(p) {
        forget_recorded(p)
    }
}

/// Takes block `p`, which [`must_take_out`] says, out of the live table: the
/// body of every free that needs no record back, out of line so that the
/// hooks that free (free, cfree, the operator deletes, an allocator's
/// free found by `fronts`) share one copy in the hot section.
#[inline(never)]
#[link_section = "igprof_hot"]
fn forget_recorded(p: *mut c_void) {
    account::expect_free(p as usize);
    freeing_recorded_then(p, |_| ())
}

#[inline(always)]
#[link_section = "igprof_hot"]
fn freeing_then<R>(
    p: *mut c_void,
    keep: impl Fn(Option<crate::base::live::Block>) -> R + Copy,
) -> R {
    if !must_take_out(p) {
        return keep(None);
    }
    freeing_recorded_then(p, keep)
}

/// Whether a free of the block at `p` must take it out of the live table:
/// it may hold a record (not null, and in a sampled profile one the filter
/// does not rule out), and the thread is not inside an allocator entry
/// point of `fronts` (that one takes it out).
#[inline(always)]
#[link_section = "igprof_hot"]
fn must_take_out(p: *mut c_void) -> bool {
    !p.is_null()
        && (!super::sample::active() || super::sample::may_be_sampled(p as usize))
        && !site::inside_front()
}

/// [`freeing_then`] for a block that [`must_take_out`] says.
#[inline(always)]
#[link_section = "igprof_hot"]
fn freeing_recorded_then<R>(
    p: *mut c_void,
    keep: impl Fn(Option<crate::base::live::Block>) -> R + Copy,
) -> R {
    let _e = ErrnoGuard::save();
    match site::unrecorded(
        KIND_FREE,
        p as usize,
        0,
        replay,
        #[inline(always)]
        || keep(account::on_free(p as usize)),
    ) {
        Some(r) => r,
        None => keep(None),
    }
}

/// Starts a call whose original may allocate through another hooked entry
/// point (realloc(NULL) -> malloc, glibc tail-calls it; reallocarray ->
/// realloc; an allocator's operator new -> its malloc or memalign). Marks
/// the thread as waiting for an inner hook (`MEM_VIA`), so that sampled
/// mode's malloc does not count off an inner allocation unseen (see
/// `malloc_sampled_with_regs`). The mark is not nested: reallocarray ->
/// realloc clears it at the inner end, while the outer keeps `MEM_OUTER`
/// set until its own. An exception thrown through an operator new's hook
/// leaves the mark until the thread's next [`via_end`]: its allocations
/// meanwhile take the general path.
#[inline]
#[link_section = "igprof_hot"]
fn via_begin() {
    site::tls(|h| {
        h.inner.set(0);
        h.outer.set(h.outer.get() | MEM_VIA);
    })
}

/// Ends [`via_begin`]: whether the outer hook must record block `r` itself
/// (false when an inner hook already recorded exactly that block).
#[inline]
#[link_section = "igprof_hot"]
fn via_end(r: *mut c_void) -> bool {
    site::tls(|h| {
        h.outer.set(h.outer.get() & !MEM_VIA);
        h.inner.replace(0) != r as usize || r.is_null()
    })
}

/// An allocation hook recorded block `addr`.
#[inline]
#[link_section = "igprof_hot"]
fn via_seen(addr: usize) {
    site::tls(|h| h.inner.set(addr));
}

// ---- the replacements ----

// Entered through the naked stubs of [`entry`] (the installed
// replacements of malloc, calloc and realloc): the program's registers at
// the call follow the real arguments.

#[link_section = "igprof_hot"]
pub(super) extern "C" fn malloc_with_regs(
    size: usize,
    sp: usize,
    fp: usize,
    lr: usize,
) -> *mut c_void {
    let p = chain::malloc(size);
    allocated_fill(p, size, true, Some(EntryRegs { sp, fp, lr }));
    p
}

/// Sampled mode's malloc: the sampler's decision is taken before the call,
/// so an allocation it passes over (most) goes straight on to the real
/// malloc, a jump with no frame of ours. Only a thread inside none of our
/// hooks may pass over before the call: inside a real realloc or an
/// operator new (`MEM_OUTER`, `MEM_VIA`) the outer hook must see that an
/// inner one decided, which only the general path tells it.
#[link_section = "igprof_hot"]
pub(super) extern "C" fn malloc_sampled_with_regs(
    size: usize,
    sp: usize,
    fp: usize,
    lr: usize,
) -> *mut c_void {
    if passes_over(size) {
        return chain::malloc(size);
    }
    malloc_with_regs(size, sp, fp, lr)
}

/// Sampled mode's calloc, as [`malloc_sampled_with_regs`].
#[link_section = "igprof_hot"]
pub(super) extern "C" fn calloc_sampled_with_regs(
    n: usize,
    m: usize,
    sp: usize,
    fp: usize,
    lr: usize,
) -> *mut c_void {
    if passes_over(n.wrapping_mul(m)) {
        return chain::calloc(n, m);
    }
    calloc_with_regs(n, m, sp, fp, lr)
}

/// Whether sampled mode may let an allocation of `size` bytes pass before
/// it is made (see [`malloc_sampled_with_regs`]): the thread is in none of
/// our hooks and the sampler counts the bytes off.
#[inline(always)]
#[link_section = "igprof_hot"]
fn passes_over(size: usize) -> bool {
    site::tls_private(|h| h.outer.get() == 0 && super::sample::passes_over(&h.sampler, size))
        .unwrap_or(false)
}

#[link_section = "igprof_hot"]
pub(super) extern "C" fn calloc_with_regs(
    n: usize,
    m: usize,
    sp: usize,
    fp: usize,
    lr: usize,
) -> *mut c_void {
    let p = chain::calloc(n, m);
    allocated_fill(p, n.wrapping_mul(m), false, Some(EntryRegs { sp, fp, lr }));
    p
}

#[link_section = "igprof_hot"]
pub(super) extern "C" fn realloc_with_regs(
    p: *mut c_void,
    size: usize,
    sp: usize,
    fp: usize,
    lr: usize,
) -> *mut c_void {
    reallocate(p, size, Some(EntryRegs { sp, fp, lr }), || {
        chain::realloc(p, size)
    })
}

/// realloc and reallocarray: the old block leaves the table before the
/// call; success records the new block as an allocation of `size` bytes
/// (as IgProf); failure puts the old block back exactly as it was.
#[inline]
#[link_section = "igprof_hot"]
fn reallocate(
    p: *mut c_void,
    size: usize,
    regs: Option<EntryRegs>,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    let old = freeing(p);
    via_begin();
    let r = site::with_outer(MEM_OUTER, call);
    let record = via_end(r);
    if r.is_null() {
        // glibc: realloc(p, 0) frees p and returns NULL; otherwise NULL
        // means failure and p is untouched.
        if size != 0 {
            if let Some(b) = old {
                let _e = ErrnoGuard::save();
                site::unrecorded(KIND_ALLOC_RESTORE, 0, 0, replay, || account::restore(&b));
            }
        }
        return r;
    }
    if record {
        allocated_fill(r, size, false, regs);
    } else {
        // realloc(NULL, n) went through malloc's hook, which recorded it;
        // keep the outer's view for an enclosing hook.
        via_seen(r as usize);
    }
    r
}

/// reallocarray: glibc checks the product and calls realloc, whose hook
/// records the call. Only a reallocarray that does not go through realloc
/// is recorded here (the old block is then forgotten after the call).
extern "C" fn reallocarray_hook(p: *mut c_void, n: usize, m: usize) -> *mut c_void {
    via_begin();
    // Allocations libc makes inside it (realloc(NULL, n) -> malloc) are
    // not separate calls.
    let r = site::with_outer(MEM_OUTER, || chain::reallocarray(p, n, m));
    let direct = via_end(r);
    if direct && !r.is_null() {
        freed(p);
        allocated_fill(r, n.wrapping_mul(m), false, None);
    }
    r
}

#[link_section = "igprof_hot"]
extern "C" fn free_hook(p: *mut c_void) {
    free_then_chain(p, chain::free)
}

extern "C" fn cfree_hook(p: *mut c_void) {
    free_then_chain(p, chain::cfree)
}

/// A free through `original` (free's or cfree's chain): a block that cannot hold a record goes
/// straight on (a jump, with no frame of ours: most frees of a sampled
/// profile), the others are taken out of the live table first, out of
/// line.
#[inline(always)]
#[link_section = "igprof_hot"]
fn free_then_chain(p: *mut c_void, original: impl Fn(*mut c_void)) {
    if !must_take_out(p) {
        return original(p);
    }
    free_recorded(p, original)
}

/// [`free_then_chain`] for a block that may hold a record: out of the
/// live table, then `original`.
#[inline(never)]
#[link_section = "igprof_hot"]
fn free_recorded(p: *mut c_void, original: impl Fn(*mut c_void)) {
    forget_recorded(p);
    original(p)
}

// The rarer entry points may be an allocator's wrappers around its own
// API (mimalloc's memalign jumps to mi_memalign, hooked by `fronts`): the
// via protocol records a block once, whichever hook sees it first.

/// An allocation of `size` bytes made by `call`, recorded unless a hook
/// inside it already recorded that block.
#[inline]
#[link_section = "igprof_hot"]
fn allocated_via(size: usize, call: impl FnOnce() -> *mut c_void) -> *mut c_void {
    via_begin();
    let p = call();
    if via_end(p) {
        allocated(p, size);
    }
    p
}

extern "C" fn memalign_hook(align: usize, size: usize) -> *mut c_void {
    allocated_via(size, || chain::memalign(align, size))
}

extern "C" fn aligned_alloc_hook(align: usize, size: usize) -> *mut c_void {
    allocated_via(size, || chain::aligned_alloc(align, size))
}

extern "C" fn posix_memalign_hook(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    via_begin();
    let r = chain::posix_memalign(out, align, size);
    if r == 0 && !out.is_null() {
        // SAFETY: on success posix_memalign stored the block in *out.
        let p = unsafe { *out };
        if via_end(p) {
            allocated(p, size);
        }
    } else {
        via_end(core::ptr::null_mut());
    }
    r
}

extern "C" fn valloc_hook(size: usize) -> *mut c_void {
    allocated_via(size, || chain::valloc(size))
}

extern "C" fn pvalloc_hook(size: usize) -> *mut c_void {
    allocated_via(size, || chain::pvalloc(size))
}

// ---- for the allocator entry points of `fronts` ----

/// A block returned by an entry point of `fronts` (`fill`: -ei/-eu may
/// overwrite it; `regs`: the program's at the call, for the stack memo).
#[inline]
#[link_section = "igprof_hot"]
pub(super) fn allocated_by_front(p: *mut c_void, size: usize, fill: bool, regs: EntryRegs) {
    allocated_fill(p, size, fill, Some(regs))
}

/// A block about to be released by an entry point of `fronts`.
#[inline]
#[link_section = "igprof_hot"]
pub(super) fn freed_by_front(p: *mut c_void) {
    freed(p)
}

/// A block moved or resized by an entry point of `fronts` (`call` runs
/// the original), as realloc.
#[inline]
#[link_section = "igprof_hot"]
pub(super) fn reallocated_by_front(
    p: *mut c_void,
    size: usize,
    regs: EntryRegs,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    reallocate(p, size, Some(regs), call)
}

// C++ operators of an allocator that defines them itself (tcmalloc).

#[link_section = "igprof_hot"]
extern "C" fn new_hook(size: usize) -> *mut c_void {
    // The original may throw: the exception passes through this frame,
    // which has nothing to clean up.
    allocated_via(size, || chain::new(size))
}

#[link_section = "igprof_hot"]
extern "C" fn new_array_hook(size: usize) -> *mut c_void {
    allocated_via(size, || chain::new_array(size))
}

extern "C" fn new_aligned_hook(size: usize, align: usize) -> *mut c_void {
    allocated_via(size, || chain::new_aligned(size, align))
}

extern "C" fn new_array_aligned_hook(size: usize, align: usize) -> *mut c_void {
    allocated_via(size, || chain::new_array_aligned(size, align))
}

#[link_section = "igprof_hot"]
extern "C" fn delete_hook(p: *mut c_void) {
    freed(p);
    chain::delete(p)
}

#[link_section = "igprof_hot"]
extern "C" fn delete_array_hook(p: *mut c_void) {
    freed(p);
    chain::delete_array(p)
}

#[link_section = "igprof_hot"]
extern "C" fn delete_sized_hook(p: *mut c_void, n: usize) {
    freed(p);
    chain::delete_sized(p, n)
}

#[link_section = "igprof_hot"]
extern "C" fn delete_array_sized_hook(p: *mut c_void, n: usize) {
    freed(p);
    chain::delete_array_sized(p, n)
}

extern "C" fn delete_aligned_hook(p: *mut c_void, a: usize) {
    freed(p);
    chain::delete_aligned(p, a)
}

extern "C" fn delete_array_aligned_hook(p: *mut c_void, a: usize) {
    freed(p);
    chain::delete_array_aligned(p, a)
}

// Nothrow and sized+aligned forms (tcmalloc defines them separately; the
// extra arguments are forwarded as they came).

macro_rules! new_forms {
    ($($name:ident: $f:path;)*) => {$(
        extern "C" fn $name(size: usize, b: usize, c: usize) -> *mut c_void {
            // Registers the original does not read are passed through
            // harmlessly.
            allocated_via(size, || $f(size, b, c))
        }
    )*};
}
new_forms! {
    new_nothrow_hook: chain::new_nothrow;
    new_array_nothrow_hook: chain::new_array_nothrow;
    new_aligned_nothrow_hook: chain::new_aligned_nothrow;
    new_array_aligned_nothrow_hook: chain::new_array_aligned_nothrow;
}

macro_rules! delete_forms {
    ($($name:ident: $f:path;)*) => {$(
        extern "C" fn $name(p: *mut c_void, b: usize, c: usize) {
            freed(p);
            $f(p, b, c)
        }
    )*};
}
delete_forms! {
    delete_nothrow_hook: chain::delete_nothrow;
    delete_array_nothrow_hook: chain::delete_array_nothrow;
    delete_sized_aligned_hook: chain::delete_sized_aligned;
    delete_array_sized_aligned_hook: chain::delete_array_sized_aligned;
    delete_aligned_nothrow_hook: chain::delete_aligned_nothrow;
    delete_array_aligned_nothrow_hook: chain::delete_array_aligned_nothrow;
}

/// Naked entry stubs: put the program's registers at the call after the
/// real arguments and jump to the Rust hook (the stack is untouched, so the
/// hook returns straight to the program).
pub(super) mod entry {
    #[cfg(target_arch = "x86_64")]
    macro_rules! stub {
        ($name:ident, $imp:path, one) => {
            #[unsafe(naked)]
            #[link_section = "igprof_hot"]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov rsi, rsp", "mov rdx, rbp", "xor ecx, ecx", "jmp {imp}", imp = sym $imp)
            }
        };
        ($name:ident, $imp:path, two) => {
            #[unsafe(naked)]
            #[link_section = "igprof_hot"]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov rdx, rsp", "mov rcx, rbp", "xor r8d, r8d", "jmp {imp}", imp = sym $imp)
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    macro_rules! stub {
        ($name:ident, $imp:path, one) => {
            #[unsafe(naked)]
            #[link_section = "igprof_hot"]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov x1, sp", "mov x2, x29", "mov x3, x30", "b {imp}", imp = sym $imp)
            }
        };
        ($name:ident, $imp:path, two) => {
            #[unsafe(naked)]
            #[link_section = "igprof_hot"]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov x2, sp", "mov x3, x29", "mov x4, x30", "b {imp}", imp = sym $imp)
            }
        };
    }
    stub!(malloc_entry, super::malloc_with_regs, one);
    stub!(calloc_entry, super::calloc_with_regs, two);
    stub!(realloc_entry, super::realloc_with_regs, two);
    stub!(malloc_sampled_entry, super::malloc_sampled_with_regs, one);
    stub!(calloc_sampled_entry, super::calloc_sampled_with_regs, two);
}
