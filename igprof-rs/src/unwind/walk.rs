//! The per-thread unwinder and the walk loop: cache lookup, descriptor on a
//! miss, framehop for the rest, depth limit, leaving out the profiler's own
//! frames (wherever they are in the stack), re-entrancy guard.
//!
//! Owns: `ThreadUnwinder`. Everything reachable from `trace_*` is
//! async-signal-safe: no allocation, no lock, no syscall; the only memory
//! read is through `StackReader` (stack), the module table, the descriptor
//! store's loaded entries and the mapped unwind sections of loaded objects
//! (and the only shared memory written is the store's log).

use core::cell::{Cell, UnsafeCell};
use core::marker::PhantomData;
use core::sync::atomic::{compiler_fence, Ordering};

use super::arch;
pub use super::arch::FramehopCache;
use super::descriptor::{DescriptorCache, Kind};
use super::hazard::Hazard;
use super::mem::{MapError, MmapSlice};
use super::modules::{self, ModuleTable};
use super::readlog::ReadLog;
use super::stack::{StackBounds, StackReader};
use super::step::{self, Regs, Step};
use super::{BrokenFrame, Trace, TraceEnd};

/// One thread's unwinder: its descriptor cache (64 KiB, mmap'ed) and
/// framehop's scratch space. Create it at thread start, use it only on that
/// thread (it is neither `Send` nor `Sync`).
pub struct ThreadUnwinder {
    cache: UnsafeCell<MmapSlice<DescriptorCache>>,
    /// Keeps the module table a walk reads from being freed.
    hazard: &'static Hazard,
    framehop: UnsafeCell<FramehopCache>,
    busy: Cell<bool>,
    _one_thread: PhantomData<*mut ()>,
}

/// Descriptor cache statistics of one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Misses answered by the descriptor store (derived by an earlier
    /// process) instead of framehop.
    pub stored: u64,
    /// With `IGPROF_STORE_CHECK=1`: store answers that a fresh derivation
    /// described otherwise (must be 0).
    pub stored_differ: u64,
    /// Frames unwound by framehop (a rule no descriptor holds).
    pub framehop: u64,
}

/// Which frames of the profiler (the object holding this unwinder) a walk
/// leaves out.
#[derive(Clone, Copy, Debug)]
enum Skip {
    /// None.
    None,
    /// Those above the first frame of another object: the code taking the
    /// trace.
    Leading((usize, usize)),
    /// Every one, wherever it is: also a hook of ours between a profiled
    /// program's frames (one whose real function runs program code or
    /// another hook: an allocator's operator new calling its memalign, a
    /// dlopen running constructors).
    All((usize, usize)),
}

impl ThreadUnwinder {
    /// Outside signal context (maps memory; framehop preallocates its
    /// scratch space with the global allocator).
    pub fn new() -> Result<Self, MapError> {
        // 64 KiB of slots, faulted in as the walks fill them: a short
        // process or thread touches a few of its 16 pages (each first
        // touch a minor fault, in a signal handler too), not all at start.
        let cache = MmapSlice::zeroed_lazy(1)?;
        Ok(ThreadUnwinder {
            cache: UnsafeCell::new(cache),
            hazard: Hazard::claim()?,
            framehop: UnsafeCell::new(FramehopCache::new_in()),
            busy: Cell::new(false),
            _one_thread: PhantomData,
        })
    }

    /// Trace the code a signal interrupted. See `unwind/mod.rs`.
    ///
    /// # Safety
    /// `uc` must be the `ucontext_t` pointer an `SA_SIGINFO` handler received
    /// on this thread.
    pub unsafe fn trace_from_ucontext(
        &self,
        uc: *const libc::c_void,
        bounds: &StackBounds,
        out: &mut [usize],
    ) -> Trace {
        // SAFETY: guaranteed by the caller.
        let regs = unsafe { arch::regs_from_ucontext(uc) };
        self.guarded(|this, table| this.walk(table, regs, bounds, out, Skip::None, None))
    }

    /// [`Self::trace_from_ucontext`] for a profiled program: a signal that
    /// interrupted the profiler's own code (a hook the program called) is
    /// traced from the program's frame that called into it, and the
    /// profiler's frames between the program's are left out.
    ///
    /// # Safety
    /// As for [`Self::trace_from_ucontext`].
    #[link_section = "igprof_hot"]
    pub unsafe fn trace_program_from_ucontext(
        &self,
        uc: *const libc::c_void,
        bounds: &StackBounds,
        out: &mut [usize],
    ) -> Trace {
        // SAFETY: guaranteed by the caller.
        let regs = unsafe { arch::regs_from_ucontext(uc) };
        self.guarded(|this, table| {
            this.walk(table, regs, bounds, out, Skip::All(table.self_text), None)
        })
    }

    /// Trace the caller of the profiler: the frames of the object that
    /// contains this unwinder are skipped. See `unwind/mod.rs`.
    #[inline(never)]
    pub fn trace_here(&self, bounds: &StackBounds, out: &mut [usize]) -> Trace {
        let regs = arch::capture();
        let t = self.guarded(|this, table| {
            this.walk(
                table,
                regs,
                bounds,
                out,
                Skip::Leading(table.self_text),
                None,
            )
        });
        // Keep this frame (whose registers were captured) alive until the
        // walk is done: no tail call into `guarded`.
        core::hint::black_box(&regs);
        t
    }

    /// [`Self::trace_here`] for a profiled program: the profiler's frames
    /// are also left out between the program's (an event of a signal
    /// handler that interrupted one of our hooks).
    #[inline(never)]
    pub fn trace_program_here(&self, bounds: &StackBounds, out: &mut [usize]) -> Trace {
        let regs = arch::capture();
        let t = self.trace_from_regs_logged(regs, bounds, out, None);
        // As in `trace_here`: this frame stays alive until the walk is done.
        core::hint::black_box(&regs);
        t
    }

    /// The registers of the calling frame, for [`Self::trace_from_regs_logged`]
    /// (a walk run on another stack than the frames it walks).
    #[inline(always)]
    pub(crate) fn capture() -> Regs {
        arch::capture()
    }

    /// `trace_here` from registers captured earlier by [`Self::capture`]
    /// in a frame that is still live, for a profiled program: the
    /// profiler's frames are left out, above the program's and between
    /// them.
    /// With a `log` (begun by the caller), the stack words read and the
    /// module table generation used are recorded there.
    #[link_section = "igprof_hot"]
    pub(crate) fn trace_from_regs_logged(
        &self,
        regs: Regs,
        bounds: &StackBounds,
        out: &mut [usize],
        log: Option<&ReadLog>,
    ) -> Trace {
        self.guarded(|this, table| {
            if let Some(log) = log {
                log.set_generation(table.generation);
            }
            this.walk_logged(
                table,
                regs,
                bounds,
                out,
                Skip::All(table.self_text),
                None,
                log,
            )
        })
    }

    /// For benchmarks only: `trace_here` with framehop unwinding every frame
    /// using the caller's framehop cache `fh` (pass a fresh one for framehop
    /// with a cold rule cache); the descriptor cache is not used.
    #[doc(hidden)]
    #[inline(never)]
    pub fn trace_here_framehop_only(
        &self,
        bounds: &StackBounds,
        out: &mut [usize],
        fh: &mut FramehopCache,
    ) -> Trace {
        let regs = arch::capture();
        let t = self.guarded(|this, table| {
            this.walk(
                table,
                regs,
                bounds,
                out,
                Skip::Leading(table.self_text),
                Some(fh),
            )
        });
        core::hint::black_box(&regs);
        t
    }

    /// Descriptor cache hits and misses on this thread so far.
    pub fn stats(&self) -> CacheStats {
        if self.busy.get() {
            return CacheStats::default();
        }
        // SAFETY: not busy, so no walk holds a reference into the cache.
        let c = unsafe { &(*self.cache.get()).as_slice()[0] };
        CacheStats {
            hits: c.hits,
            misses: c.misses,
            stored: c.stored,
            stored_differ: c.stored_differ,
            framehop: c.framehop,
        }
    }

    /// The thread left a walk of this unwinder for good: a signal handler
    /// of the program interrupted the profiler code that was walking and
    /// jumped out of it (siglongjmp). The walk never finishes, so the
    /// unwinder is free again (otherwise every later walk would be refused
    /// as re-entered). Only for the owning thread, outside any walk of its
    /// own.
    pub fn abandon_walk(&self) {
        if self.busy.get() {
            self.hazard.clear();
            compiler_fence(Ordering::SeqCst);
            self.busy.set(false);
        }
    }

    #[cfg(test)]
    pub(crate) fn busy_for_test(&self, busy: bool) {
        self.busy.set(busy);
    }

    /// Run `f` unless this unwinder is already walking on this thread (a
    /// signal interrupted a walk).
    #[inline(always)]
    fn guarded(&self, f: impl FnOnce(&Self, &ModuleTable) -> Trace) -> Trace {
        if self.busy.get() {
            return Trace {
                depth: 0,
                end: TraceEnd::Reentered,
            };
        }
        // A signal arriving between the check and the set runs a complete
        // walk of its own and leaves `busy` false again before we resume.
        self.busy.set(true);
        compiler_fence(Ordering::SeqCst);
        let t = match modules::current(self.hazard) {
            Some(table) => f(self, table),
            None => Trace {
                depth: 0,
                end: TraceEnd::NoModuleTable,
            },
        };
        self.hazard.clear();
        compiler_fence(Ordering::SeqCst);
        self.busy.set(false);
        t
    }

    #[link_section = "igprof_hot"]
    fn walk(
        &self,
        table: &ModuleTable,
        regs: Regs,
        bounds: &StackBounds,
        out: &mut [usize],
        skip: Skip,
        framehop_only: Option<&mut FramehopCache>,
    ) -> Trace {
        self.walk_logged(table, regs, bounds, out, skip, framehop_only, None)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn walk_logged(
        &self,
        table: &ModuleTable,
        mut regs: Regs,
        bounds: &StackBounds,
        out: &mut [usize],
        skip: Skip,
        mut framehop_only: Option<&mut FramehopCache>,
        log: Option<&ReadLog>,
    ) -> Trace {
        // SAFETY: `busy` is set, so this is the only live reference to the
        // cache and the framehop scratch space on this thread, and they are
        // never shared with other threads.
        let (cache, fh) = unsafe {
            (
                &mut (*self.cache.get()).as_mut_slice()[0],
                &mut *self.framehop.get(),
            )
        };
        cache.sync_generation(table.generation);
        let mut reader = StackReader::new(bounds, regs.sp).with_log(log);
        let ((lo, hi), everywhere) = match skip {
            Skip::None => ((0, 0), false),
            Skip::Leading(r) => (r, false),
            Skip::All(r) => (r, true),
        };
        let mut first = true;
        let mut depth = 0;
        loop {
            if regs.pc == 0 {
                return Trace {
                    depth,
                    end: TraceEnd::Outermost,
                };
            }
            if regs.pc >= arch::USER_END {
                // A corrupt return address (a JIT's frame marker, a stack
                // slot of data): kept, it would be a frame no object holds,
                // and an address no profile reader takes as an offset.
                return Trace {
                    depth,
                    end: TraceEnd::Broken(BrokenFrame::NotUserCode { pc: regs.pc }),
                };
            }
            let ours = lo <= regs.pc && regs.pc < hi;
            if !(ours && (everywhere || depth == 0)) {
                if depth == 0 {
                    reader.start(regs.pc, regs.sp);
                }
                if depth == out.len() {
                    return Trace {
                        depth,
                        end: TraceEnd::Truncated,
                    };
                }
                out[depth] = regs.pc;
                depth += 1;
            }
            // A PC in no loaded object (JIT code or a corrupt return
            // address) is kept and ends the walk. Cached PCs were checked
            // when their descriptor was made.
            let not_in_any_object = TraceEnd::Broken(BrokenFrame::NotInAnyObject { pc: regs.pc });
            let step = match framehop_only.as_deref_mut() {
                // Benchmarks of framehop alone.
                Some(fh) => {
                    if table.find(regs.pc).is_none() {
                        return Trace {
                            depth,
                            end: not_in_any_object,
                        };
                    }
                    step::framehop_step(table, fh, &mut regs, first, &reader)
                }
                None => {
                    let key = if first { regs.pc } else { regs.pc - 1 };
                    let d = match cache.get(key, first) {
                        Some(d) => d,
                        None => {
                            let Some(m) = table.find(regs.pc) else {
                                return Trace {
                                    depth,
                                    end: not_in_any_object,
                                };
                            };
                            let d = match m.stored_descriptor(regs.pc, first) {
                                Some(d) => {
                                    cache.stored += 1;
                                    if super::store::checking()
                                        && step::describe(table, fh, regs.pc, first) != d
                                    {
                                        cache.stored_differ += 1;
                                    }
                                    d
                                }
                                None => {
                                    let d = step::describe(table, fh, regs.pc, first);
                                    m.derived(regs.pc, first, d);
                                    d
                                }
                            };
                            cache.put(key, d);
                            d
                        }
                    };
                    if d.kind == Kind::Framehop {
                        cache.framehop += 1;
                        step::framehop_step(table, fh, &mut regs, first, &reader)
                    } else {
                        step::apply(d, &mut regs, first, &reader)
                    }
                }
            };
            match step {
                Ok(Step::Caller { first: f }) => {
                    if f {
                        // Through a signal frame: continue on the
                        // interrupted context's stack.
                        reader.enter(regs.sp);
                    }
                    first = f
                }
                Ok(Step::Outermost) => {
                    return Trace {
                        depth,
                        end: TraceEnd::Outermost,
                    }
                }
                Err(b) => {
                    return Trace {
                        depth,
                        end: TraceEnd::Broken(b),
                    }
                }
            }
        }
    }
}

impl Drop for ThreadUnwinder {
    fn drop(&mut self) {
        self.hazard.release();
    }
}
