//! errno: the calling thread's error number, read and restored without a
//! call through the PLT ([`ErrnoGuard`] for hooks and signal handlers), and
//! [`Errno`], the typed error every wrapper of `sys` returns.
//!
//! Must never: allocate or lock (read from hooks and signal handlers), or
//! leave errno changed behind a guard.

/// Restores `errno` when dropped, so hooks and handlers leave it untouched.
/// Keeps the thread's errno slot, so a hook finds it once.
pub struct ErrnoGuard {
    slot: *mut i32,
    value: i32,
}

impl ErrnoGuard {
    #[inline]
    pub fn save() -> Self {
        let slot = errno_slot();
        // SAFETY: the calling thread's errno slot (`errno_slot`), valid for
        // the lifetime of the thread; the guard is dropped on the thread
        // that made it (it is not Send: it holds a raw pointer).
        let value = unsafe { *slot };
        ErrnoGuard { slot, value }
    }
}

impl Drop for ErrnoGuard {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `save`: this thread's slot, the thread still runs.
        unsafe { *self.slot = self.value };
    }
}

/// The error number of a failed system call: what `errno` held after it,
/// or what a wrapper of this file returned for it. Shown as the bare
/// number ("errno 13" reads as before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's last error number ([`errno`]).
    pub fn last() -> Errno {
        Errno(errno())
    }
}

impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The last OS error number of this thread.
pub fn errno() -> i32 {
    // SAFETY: see ErrnoGuard::save.
    unsafe { *errno_slot() }
}

/// errno's offset from the thread pointer, once [`learn_errno_offset`]
/// found it (`NO_OFFSET` before).
static ERRNO_OFFSET: core::sync::atomic::AtomicIsize =
    core::sync::atomic::AtomicIsize::new(NO_OFFSET);

const NO_OFFSET: isize = isize::MIN;

/// The calling thread's errno. glibc's errno is an initial-exec TLS
/// variable of libc.so: `__errno_location` adds one constant, the same for
/// every thread, to the thread pointer. That constant is learnt once
/// ([`learn_errno_offset`]) and added here, without the call through the
/// PLT (two per allocation and free: 1.3% of a profiled perl's time).
#[inline(always)]
fn errno_slot() -> *mut i32 {
    let off = ERRNO_OFFSET.load(core::sync::atomic::Ordering::Relaxed);
    if off == NO_OFFSET {
        // SAFETY: returns the calling thread's errno slot.
        return unsafe { libc::__errno_location() };
    }
    thread_pointer().wrapping_add_signed(off) as *mut i32
}

/// Learns errno's offset from the thread pointer (library start-up).
pub fn learn_errno_offset() {
    // SAFETY: returns the calling thread's errno slot.
    let slot = unsafe { libc::__errno_location() } as usize;
    let off = slot.wrapping_sub(thread_pointer()) as isize;
    if off != NO_OFFSET {
        ERRNO_OFFSET.store(off, core::sync::atomic::Ordering::Relaxed);
    }
}

/// The thread pointer: what glibc's TLS accesses add their offsets to.
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the thread pointer (the TCB's self-pointer at fs:0,
    // which glibc's `__errno_location` reads too); no other memory, stack
    // or flags touched.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    // SAFETY: reads tpidr_el0 into a register; nothing else touched.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
    }
    tp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Errno reads as the bare number in the messages that show one.
    #[test]
    fn an_errno_shows_as_its_number() {
        assert_eq!(format!("(errno {})", Errno(libc::EACCES)), "(errno 13)");
    }

    /// errno found from the thread pointer is libc's, on the thread that
    /// learnt the offset and on others, and a guard restores it.
    #[test]
    fn errno_from_the_thread_pointer_is_libcs() {
        learn_errno_offset();
        let check = || {
            // SAFETY: the calling thread's errno slot.
            assert_eq!(errno_slot(), unsafe { libc::__errno_location() });
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = 42 };
            {
                let _g = ErrnoGuard::save();
                // SAFETY: as above.
                unsafe { *libc::__errno_location() = 7 };
                assert_eq!(errno(), 7);
            }
            assert_eq!(errno(), 42);
        };
        check();
        let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(check)).collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
