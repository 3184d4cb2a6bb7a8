//! The library's per-thread words, in the static TLS block, reached with
//! the initial-exec model: two instructions (the thread pointer plus an
//! offset the dynamic loader wrote once) instead of a call of glibc's
//! `__tls_get_addr`, which Rust's `thread_local!` makes in a shared library
//! (it has no stable way to ask for initial-exec). Every allocation hook
//! reads these words one to three times: the calls were 4% of
//! `alloc_churn`'s time under `-mp` and 8% under `--sample-bytes`.
//!
//! Owns [`AREA_BYTES`] zero-initialised bytes per thread, 64-byte aligned,
//! and hands out typed views of fixed slices of them ([`Slot`]); the users
//! (the current thread's state pointer in `thread.rs`, the memory and
//! descriptor hooks' record in `modules/mem/site.rs`) each own their
//! slice, checked at compile time to fit. A type stored here must be valid
//! when all-zero and need no destructor (the area is `.tbss`, zero-filled
//! for every new thread, never dropped).
//!
//! The library is preloaded, so its TLS is in the static block, as
//! initial-exec requires; a `dlopen` of it would take room from glibc's
//! static TLS surplus (the area is 256 bytes), and fail if there were none.
//!
//! Must never: hand out a view outside the area, or of a type that is not
//! valid all-zero.

/// Bytes of the per-thread area.
pub const AREA_BYTES: usize = 256;

/// Where [`slot`]s begin: the thread state pointer at 0, the hooks' record
/// from 64.
pub const THREAD_AT: usize = 0;
pub const HOOKS_AT: usize = 64;

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 64",
    ".globl igprof_tls_area",
    ".hidden igprof_tls_area",
    ".type igprof_tls_area, @object",
    ".size igprof_tls_area, 256",
    "igprof_tls_area:",
    ".zero 256",
    ".popsection",
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",%nobits",
    ".balign 64",
    ".globl igprof_tls_area",
    ".hidden igprof_tls_area",
    ".type igprof_tls_area, %object",
    ".size igprof_tls_area, 256",
    "igprof_tls_area:",
    ".zero 256",
    ".popsection",
);

/// The calling thread's area.
#[inline(always)]
pub fn area() -> *mut u8 {
    let p: *mut u8;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the GOT entry the loader filled with the area's offset
    // from the thread pointer, and the thread pointer (fs:0 holds the
    // thread control block's own address); no memory is written.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr [rip + igprof_tls_area@GOTTPOFF]",
            "add {p}, qword ptr fs:0",
            p = out(reg) p,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above, with the AArch64 thread pointer register.
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:igprof_tls_area",
            "ldr {t}, [{t}, #:gottprel_lo12:igprof_tls_area]",
            "add {p}, {p}, {t}",
            p = out(reg) p,
            t = out(reg) _,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    p
}

/// The calling thread's `T` at byte `at` of its area.
///
/// # Safety
/// `T` must be valid all-zero and need no drop, `at` must be the offset
/// its one owner uses for it (the same `T` at every call), and
/// `at + size_of::<T>() <= AREA_BYTES` with `at` aligned for `T` ([`fits`]).
#[inline(always)]
unsafe fn slot<T>(at: usize) -> &'static T {
    // SAFETY: guaranteed by the caller; the area lives as long as the
    // thread, and a reference obtained here is only used by it.
    unsafe { &*(area().add(at) as *const T) }
}

/// Whether a `T` at byte `at` fits the area, aligned.
const fn fits<T>(at: usize) -> bool {
    at + core::mem::size_of::<T>() <= AREA_BYTES
        && at.is_multiple_of(core::mem::align_of::<T>())
        && core::mem::align_of::<T>() <= 64
}

/// One owner's `T` at a fixed byte of every thread's area, read as a
/// `thread_local!` is: `SLOT.with(|t| ...)`.
pub struct Slot<T> {
    at: usize,
    _t: core::marker::PhantomData<fn() -> T>,
}

impl<T: 'static> Slot<T> {
    /// The slot of `T` at byte `at` (in a `static` initialiser: a `T` that
    /// does not fit the area there fails the build).
    ///
    /// # Safety
    /// `T` must be valid all-zero and need no drop, and this must be the
    /// only slot at `at` (its owner's, always with this `T`).
    pub const unsafe fn new(at: usize) -> Self {
        assert!(fits::<T>(at), "the slot does not fit the TLS area");
        Slot {
            at,
            _t: core::marker::PhantomData,
        }
    }

    /// Runs `f` with the calling thread's `T`.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        // SAFETY: the reference lives only for the call, on this thread.
        f(unsafe { self.get() })
    }

    /// The calling thread's `T`.
    ///
    /// # Safety
    /// The reference must not be used after the thread ends (its area goes
    /// with it) nor by another thread.
    #[inline(always)]
    pub unsafe fn get(&self) -> &'static T {
        // SAFETY: `new`'s contract, and its check that `T` fits at `at`.
        unsafe { slot::<T>(self.at) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn each_thread_has_its_own_zeroed_area() {
        // SAFETY: an AtomicU64 is valid all-zero; this test owns the
        // last 8 bytes of the area in its threads.
        let mine = unsafe { slot::<AtomicU64>(AREA_BYTES - 8) };
        assert_eq!(mine.load(Ordering::Relaxed), 0);
        mine.store(7, Ordering::Relaxed);
        let other = std::thread::spawn(|| {
            // SAFETY: as above.
            let s = unsafe { slot::<AtomicU64>(AREA_BYTES - 8) };
            let fresh = s.load(Ordering::Relaxed);
            s.store(9, Ordering::Relaxed);
            (fresh, area() as usize)
        })
        .join()
        .unwrap();
        assert_eq!(other.0, 0, "a new thread's area starts zeroed");
        assert_ne!(other.1, area() as usize);
        assert_eq!(mine.load(Ordering::Relaxed), 7);
        assert_eq!(area() as usize % 64, 0);
    }
}
