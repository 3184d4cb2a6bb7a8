//! The program's resource limits and the profiler's own writes.
//!
//! A program may lower its limits at any moment (a sandbox that forbids
//! itself file writes, new descriptors or new memory), and the profiler
//! still writes its profile at the end. Each limit must fail the
//! profiler's work, which then says why in one line, and never the
//! program:
//! - RLIMIT_FSIZE: a write past it raises SIGXFSZ, whose default action
//!   kills the process. Every file the profiler writes (the profile, the
//!   descriptor store, the hook plans) and every line it prints on stderr
//!   (which may be a file) is written under a [`FsizeGuard`].
//! - RLIMIT_NOFILE: [`with_descriptor_room`] makes room for the one
//!   descriptor the profile needs, where the limits allow it.
//! - RLIMIT_AS: [`AddressSpaceRoom`] raises the soft limit for a dump
//!   where the hard one allows, and tells beforehand whether the dump's
//!   memory can be mapped at all (an allocation failure in the middle
//!   would abort the program).
//!
//! Must never: change the program's signal mask or limits as the program
//! sees them once a guard is dropped, or discard a SIGXFSZ the program
//! raised itself (only one that became pending while the guard was held
//! is taken back).

/// Blocks SIGXFSZ on the calling thread while it lives, so that a file
/// size limit (RLIMIT_FSIZE, which the program may lower at any time) fails
/// the profiler's write (EFBIG) instead of killing the program; a SIGXFSZ
/// the write raised is taken back when it is dropped.
pub struct FsizeGuard {
    saved: libc::sigset_t,
    was_pending: bool,
}

fn xfsz_set() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is empty; sigaddset on a valid set.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigaddset(&mut set, libc::SIGXFSZ);
        set
    }
}

fn xfsz_pending() -> bool {
    // SAFETY: sigpending fills a valid set; sigismember reads it.
    unsafe {
        let mut p: libc::sigset_t = core::mem::zeroed();
        libc::sigpending(&mut p);
        libc::sigismember(&p, libc::SIGXFSZ) == 1
    }
}

impl FsizeGuard {
    pub fn block() -> Self {
        let set = xfsz_set();
        // SAFETY: valid sigset pointers.
        let mut saved: libc::sigset_t = unsafe { core::mem::zeroed() };
        // SAFETY: as above; raw syscall, the program's mask shadow is untouched.
        unsafe { crate::sys::rt_sigprocmask(libc::SIG_BLOCK, &set, &mut saved) };
        FsizeGuard {
            saved,
            was_pending: xfsz_pending(),
        }
    }
}

impl Drop for FsizeGuard {
    fn drop(&mut self) {
        if !self.was_pending && xfsz_pending() {
            let set = xfsz_set();
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: takes the pending SIGXFSZ of this thread, without waiting.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigtimedwait,
                    &set,
                    core::ptr::null_mut::<libc::siginfo_t>(),
                    &zero,
                    8,
                )
            };
        }
        // SAFETY: restores the mask saved in `block`.
        unsafe {
            crate::sys::rt_sigprocmask(libc::SIG_SETMASK, &self.saved, core::ptr::null_mut())
        };
    }
}

/// Runs `create`; when the program holds every descriptor its limit
/// allows (EMFILE), raises the soft limit by one for a second call (and
/// the hard limit too, where the process may), then puts the limits back.
pub fn with_descriptor_room<T>(create: impl Fn() -> std::io::Result<T>) -> std::io::Result<T> {
    match create() {
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
            let mut old = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: reading the limit into a valid struct.
            if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) } != 0 {
                return Err(e);
            }
            let more = libc::rlimit {
                rlim_cur: old.rlim_cur + 1,
                rlim_max: old.rlim_max.max(old.rlim_cur + 1),
            };
            // SAFETY: setting the limit from a valid struct.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &more) } != 0 {
                return Err(e);
            }
            let r = create();
            // SAFETY: as above; the program's limits are restored (the
            // descriptor just opened stays valid above the soft limit).
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
            r
        }
        r => r,
    }
}

/// The soft RLIMIT_AS raised to the hard limit while it lives (when the
/// program lowered only the soft one), put back when dropped.
pub struct AddressSpaceRoom {
    saved: Option<libc::rlimit>,
}

impl AddressSpaceRoom {
    /// Raises the soft limit where it is below the hard one, then checks
    /// that `bytes` more of address space can be mapped: an error gives
    /// the limit that leaves no room.
    pub fn make(bytes: usize) -> Result<AddressSpaceRoom, u64> {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reading the limit into a valid struct.
        if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut old) } != 0
            || old.rlim_cur == libc::RLIM_INFINITY
        {
            return Ok(AddressSpaceRoom { saved: None });
        }
        let mut room = AddressSpaceRoom { saved: None };
        if old.rlim_cur < old.rlim_max {
            let more = libc::rlimit {
                rlim_cur: old.rlim_max,
                rlim_max: old.rlim_max,
            };
            // SAFETY: setting the limit from a valid struct.
            if unsafe { libc::setrlimit(libc::RLIMIT_AS, &more) } == 0 {
                room.saved = Some(old);
            }
        }
        // A reservation counts against the limit as the dump's memory will;
        // nothing is touched, and it is given back at once.
        // SAFETY: a new private mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(old.rlim_max);
        }
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(p, bytes) };
        Ok(room)
    }
}

impl Drop for AddressSpaceRoom {
    fn drop(&mut self) {
        if let Some(old) = self.saved {
            // SAFETY: restores the program's limit read in `make`.
            unsafe { libc::setrlimit(libc::RLIMIT_AS, &old) };
        }
    }
}
