//! Kernel POSIX timers that signal one thread (SIGEV_THREAD_ID): create,
//! arm once, delete.
//!
//! Must never: make a timer that signals the whole process (its signal
//! could land in any thread of the program), or re-arm by itself.

use core::ffi::c_void;

use super::errno::Errno;

/// The kernel's `struct sigevent` (64 bytes) for SIGEV_THREAD_ID timers.
#[repr(C)]
struct KernelSigevent {
    value: u64,
    signo: i32,
    notify: i32,
    tid: i32,
    pad: [i32; 11],
}

const SIGEV_THREAD_ID: i32 = 4;

/// A kernel POSIX timer that sends `signo` to thread `tid` when `clock`
/// expires. Returns the kernel timer id or the errno.
pub fn timer_create_for_thread(
    clock: libc::clockid_t,
    signo: i32,
    tid: i32,
    value: u64,
) -> Result<i32, Errno> {
    let mut ev = KernelSigevent {
        value: 0,
        signo,
        notify: SIGEV_THREAD_ID,
        tid,
        pad: [0; 11],
    };
    let mut id: i32 = -1;
    ev.value = value;
    // SAFETY: ev and id are valid for the call; the kernel copies ev.
    let r = unsafe { libc::syscall(libc::SYS_timer_create, clock, &mut ev, &mut id) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(id)
    }
}

/// Arms `timer` once, `ns` from now (no interval: the handler re-arms).
#[link_section = "igprof_hot"]
pub fn timer_arm_once(timer: i32, ns: u64) -> bool {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: (ns / 1_000_000_000) as i64,
            tv_nsec: (ns % 1_000_000_000) as i64,
        },
    };
    // SAFETY: spec is valid; a null old-value pointer is allowed.
    unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            timer,
            0,
            &spec,
            core::ptr::null_mut::<c_void>(),
        ) == 0
    }
}

pub fn timer_delete(timer: i32) {
    // SAFETY: deleting an unknown id only returns EINVAL.
    unsafe { libc::syscall(libc::SYS_timer_delete, timer) };
}
