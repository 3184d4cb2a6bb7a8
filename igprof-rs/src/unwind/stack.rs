//! Where a thread's stack may be read: its stack range and its alternate
//! signal stack, and the bounded reader every stack load goes through.
//!
//! Owns: computing the bounds (outside signal context, at thread start) and
//! checking every read against them. A read outside the bounds is refused
//! (the trace ends); this module never dereferences an unchecked address.

use super::readlog::ReadLog;
use super::BrokenFrame;
use crate::sys::ErrnoGuard;

/// Bytes below the stack pointer that the x86-64 and AArch64 ABIs let a
/// function use without moving the stack pointer (the red zone); CFI of an
/// epilogue may point there.
const RED_ZONE: usize = 128;

/// The stack ranges of one thread in which the unwinder may read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackBounds {
    /// The thread's stack, `lo..hi` (`hi` is the highest address + 1).
    pub stack: (usize, usize),
    /// The alternate signal stack, or `(0, 0)` when none is installed.
    pub altstack: (usize, usize),
}

/// Why the current thread's stack bounds could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackBoundsError {
    /// `pthread_getattr_np` failed with this error number.
    GetAttr { err: i32 },
    /// `pthread_attr_getstack` failed with this error number.
    GetStack { err: i32 },
}

impl core::fmt::Display for StackBoundsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StackBoundsError::GetAttr { err } => {
                write!(
                    f,
                    "unwinder: pthread_getattr_np failed (error {err}); this thread cannot be traced"
                )
            }
            StackBoundsError::GetStack { err } => {
                write!(
                    f,
                    "unwinder: pthread_attr_getstack failed (error {err}); this thread cannot be traced"
                )
            }
        }
    }
}

impl StackBounds {
    /// Bounds for the calling thread. Not async-signal-safe (glibc may
    /// allocate and read /proc/self/maps for the main thread): call at
    /// thread start.
    pub fn for_current_thread() -> Result<Self, StackBoundsError> {
        let main = crate::sys::gettid() == crate::sys::getpid();
        let mut bounds = match main.then(Self::for_main_thread).flatten() {
            Some(b) => b,
            // SAFETY: pthread_self has no preconditions.
            None => Self::for_thread(unsafe { libc::pthread_self() })?,
        };
        bounds.update_altstack();
        Ok(bounds)
    }

    /// The main thread's bounds as glibc's `pthread_getattr_np` gives
    /// them, from the memory map the trampoline reads anyway at start-up
    /// (its parser, a batch's snapshot) rather than glibc's own pass over
    /// `/proc/self/maps` with `sscanf` (a tenth of a profiled no-op's
    /// instructions): the top is the page above `__libc_stack_end`, the
    /// size the stack's resource limit less what lies above that page, cut
    /// at the mapping below. None where the map does not say.
    fn for_main_thread() -> Option<Self> {
        extern "C" {
            /// The loader's record of where the main thread's stack began
            /// (glibc, every version).
            static __libc_stack_end: *mut libc::c_void;
        }
        // SAFETY: a pointer-sized variable of the loader, written once
        // before any constructor runs.
        let at = unsafe { __libc_stack_end } as usize;
        let page = crate::sys::page_size();
        let top = (at & !(page - 1)) + page;
        let maps = trampoline::maps::read_self().ok()?;
        let i = maps
            .iter()
            .position(|m| (m.start as usize) <= at && at < m.end as usize)?;
        let (to, below) = (
            maps[i].end as usize,
            i.checked_sub(1).map_or(0, |j| maps[j].end as usize),
        );
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit.
        if to < top || unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut rl) } != 0 {
            return None;
        }
        let size = (usize::try_from(rl.rlim_cur)
            .unwrap_or(usize::MAX)
            .saturating_sub(to - top)
            & !(page - 1))
            .min(top - below);
        Some(StackBounds {
            stack: (top - size, top),
            altstack: (0, 0),
        })
    }

    /// Bounds of the stack of thread `th` of this process (its alternate
    /// signal stack is not known: only a thread can ask for its own).
    pub fn for_thread(th: libc::pthread_t) -> Result<Self, StackBoundsError> {
        let _errno = ErrnoGuard::save();
        let mut attr = core::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
        // SAFETY: attr is written by pthread_getattr_np before any use and
        // destroyed exactly once below; th is a thread of this process.
        let err = unsafe { libc::pthread_getattr_np(th, attr.as_mut_ptr()) };
        if err != 0 {
            return Err(StackBoundsError::GetAttr { err });
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: attr was initialised by the successful call above.
        let err = unsafe { libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size) };
        // SAFETY: as above; destroyed once.
        unsafe { libc::pthread_attr_destroy(attr.as_mut_ptr()) };
        if err != 0 {
            return Err(StackBoundsError::GetStack { err });
        }
        Ok(StackBounds {
            stack: (addr as usize, addr as usize + size),
            altstack: (0, 0),
        })
    }

    /// Bounds for a thread that runs on a stack whose highest address + 1
    /// is `top`, given to it by the program (a raw `clone()`): from the
    /// start of the mapping that holds the stack to `top`. Not
    /// async-signal-safe (reads `/proc/self/maps`).
    pub fn for_stack_top(top: usize) -> Self {
        let _errno = ErrnoGuard::save();
        let lo = trampoline::maps::read_self_fresh()
            .ok()
            .and_then(|maps| {
                trampoline::maps::find(&maps, top.saturating_sub(1) as u64)
                    .map(|m| m.start as usize)
            })
            .unwrap_or(top);
        let mut bounds = StackBounds {
            stack: (lo, top),
            altstack: (0, 0),
        };
        bounds.update_altstack();
        bounds
    }

    /// Re-read the calling thread's alternate signal stack (`sigaltstack`).
    pub fn update_altstack(&mut self) {
        let mut ss = core::mem::MaybeUninit::<libc::stack_t>::zeroed();
        // SAFETY: a null new stack only queries; ss is a valid out pointer.
        let rc = unsafe { libc::sigaltstack(core::ptr::null(), ss.as_mut_ptr()) };
        // SAFETY: zero-initialised and possibly filled by the kernel.
        let ss = unsafe { ss.assume_init() };
        self.altstack = if rc == 0 && ss.ss_flags & libc::SS_DISABLE == 0 && ss.ss_size > 0 {
            (ss.ss_sp as usize, ss.ss_sp as usize + ss.ss_size)
        } else {
            (0, 0)
        };
    }
}

/// Reads 8-byte words from the stack, refusing anything outside the bounds.
///
/// The stack region in which the trace starts is further limited from below
/// to the starting stack pointer minus the red zone: the main thread's stack
/// range reaches down to the rlimit, which need not be mapped yet.
///
/// With a [`ReadLog`], what a walk reads (and every refusal) is also
/// recorded there, for the stack memo.
pub(crate) struct StackReader<'a> {
    regions: [(usize, usize); 2],
    log: Option<&'a ReadLog>,
}

impl<'a> StackReader<'a> {
    /// A reader for a walk whose first frame has stack pointer `sp`.
    pub(crate) fn new(bounds: &StackBounds, sp: usize) -> Self {
        let mut reader = StackReader {
            regions: [bounds.stack, bounds.altstack],
            log: None,
        };
        reader.enter(sp);
        reader
    }

    /// The same reader, recording what it reads into `log`.
    pub(crate) fn with_log(self, log: Option<&'a ReadLog>) -> Self {
        StackReader { log, ..self }
    }

    /// The walk continues with stack pointer `sp` (its start, or the
    /// interrupted context of a signal frame): nothing in sp's region below
    /// its red zone is read from now on.
    pub(crate) fn enter(&mut self, sp: usize) {
        for r in self.regions.iter_mut() {
            if r.0 <= sp && sp < r.1 {
                r.0 = r.0.max(sp.saturating_sub(RED_ZONE));
            }
        }
    }

    /// True if the `len` bytes at `addr` lie inside one region.
    pub(crate) fn contains(&self, addr: usize, len: usize) -> bool {
        match addr.checked_add(len) {
            Some(end) => self.regions.iter().any(|&(lo, hi)| lo <= addr && end <= hi),
            None => false,
        }
    }

    /// The walk reached its first frame outside the profiler (for the
    /// read log).
    #[inline(always)]
    pub(crate) fn start(&self, pc: usize, sp: usize) {
        if let Some(log) = self.log {
            log.start(pc, sp);
        }
    }

    /// The walk is about to use the current frame pointer (for the read log).
    #[inline(always)]
    pub(crate) fn fp_used(&self) {
        if let Some(log) = self.log {
            log.fp_used();
        }
    }

    /// [`Self::read`] of a saved frame pointer: the read log records it
    /// only if a later frame uses it.
    #[inline]
    pub(crate) fn read_fp(&self, addr: usize) -> Result<usize, BrokenFrame> {
        let value = self.load(addr)?;
        if let Some(log) = self.log {
            log.note_fp(addr, value);
        }
        Ok(value)
    }

    /// Load the word at `addr`, or end the trace.
    #[inline]
    pub(crate) fn read(&self, addr: usize) -> Result<usize, BrokenFrame> {
        let value = self.load(addr)?;
        if let Some(log) = self.log {
            log.note(addr, value);
        }
        Ok(value)
    }

    #[inline(always)]
    fn load(&self, addr: usize) -> Result<usize, BrokenFrame> {
        if !self.contains(addr, 8) {
            if let Some(log) = self.log {
                log.refused(addr);
            }
            return Err(BrokenFrame::ReadOutsideStack { addr });
        }
        // SAFETY: addr..addr+8 lies inside the thread's stack or alternate
        // signal stack, which are mapped and readable while the thread runs;
        // the read may be unaligned.
        Ok(unsafe { core::ptr::read_unaligned(addr as *const usize) })
    }
}

/// Runs `f(lowest address, reader)` over a fake stack of `words` words in
/// which each (byte offset, value) of `set` is written (tests of the
/// architectures' signal-frame layouts).
#[cfg(test)]
pub(crate) fn with_fake_stack<R>(
    words: usize,
    set: &[(usize, usize)],
    f: impl FnOnce(usize, &StackReader) -> R,
) -> R {
    let mut stack = vec![0usize; words];
    for &(off, v) in set {
        stack[off / 8] = v;
    }
    let lo = stack.as_ptr() as usize;
    let bounds = StackBounds {
        stack: (lo, lo + words * 8),
        altstack: (0, 0),
    };
    f(lo, &StackReader::new(&bounds, lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The main thread's pthread_t, taken by a constructor (which runs on
    /// the main thread; the tests run on threads of their own).
    static MAIN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    #[used]
    #[link_section = ".init_array"]
    static TAKE_MAIN: extern "C" fn() = {
        extern "C" fn take() {
            // SAFETY: pthread_self has no preconditions.
            MAIN.store(unsafe { libc::pthread_self() } as usize, Ordering::Relaxed);
        }
        take
    };
    use core::sync::atomic::Ordering;

    #[test]
    fn main_thread_bounds_are_glibcs() {
        let main = MAIN.load(Ordering::Relaxed);
        assert_ne!(main, 0, "the constructor ran");
        let glibc = StackBounds::for_thread(main as libc::pthread_t).unwrap();
        let ours = StackBounds::for_main_thread().expect("the main stack in the map");
        assert_eq!(ours.stack, glibc.stack);
    }

    #[test]
    fn current_thread_bounds_contain_a_local() {
        let b = StackBounds::for_current_thread().unwrap();
        let local = 0u64;
        let a = &local as *const u64 as usize;
        assert!(
            b.stack.0 < a && a < b.stack.1,
            "{b:?} does not contain {a:#x}"
        );
        // Rust's test threads run with an alternate signal stack of their own.
        assert!(b.altstack == (0, 0) || b.altstack.0 < b.altstack.1, "{b:?}");
    }

    #[test]
    fn reader_refuses_outside_and_below_start() {
        let words = [11usize, 22, 33, 44];
        let lo = words.as_ptr() as usize;
        let bounds = StackBounds {
            stack: (lo, lo + 32),
            altstack: (0, 0),
        };
        let r = StackReader::new(&bounds, lo + 8);
        assert_eq!(r.read(lo + 8), Ok(22));
        assert_eq!(r.read(lo + 24), Ok(44));
        assert_eq!(
            r.read(lo),
            Ok(11),
            "red zone below the start sp is readable"
        );
        assert_eq!(
            r.read(lo + 25),
            Err(BrokenFrame::ReadOutsideStack { addr: lo + 25 })
        );
        assert_eq!(
            r.read(usize::MAX - 3),
            Err(BrokenFrame::ReadOutsideStack {
                addr: usize::MAX - 3
            })
        );
        let high = StackBounds {
            stack: (lo - 4096, lo + 32),
            altstack: (0, 0),
        };
        // An altstack start, then the interrupted context on the stack.
        let both = StackBounds {
            stack: (0x10000, 0x20000),
            altstack: (0x40000, 0x48000),
        };
        let mut r = StackReader::new(&both, 0x47000);
        assert!(r.contains(0x10000, 8) && !r.contains(0x46f00, 8));
        r.enter(0x18000);
        assert!(r.contains(0x18000 - 128, 8) && !r.contains(0x17000, 8));
        assert!(r.contains(0x47000, 8), "the altstack part stays readable");
        let r = StackReader::new(&high, lo + 24);
        assert!(r.contains(lo + 24 - 128, 8));
        assert!(
            !r.contains(lo + 24 - 136, 8),
            "below the red zone of the start sp"
        );
    }
}
