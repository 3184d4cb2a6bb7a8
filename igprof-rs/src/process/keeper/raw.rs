//! The keeper's system calls, made without libc: while the program lives
//! the keeper runs on its creator's TLS, so nothing may write errno or
//! touch libc's state. Also the few raw file reads the keeper makes, and the
//! decimal numbers of its paths and control lines.
//!
//! Must never: allocate, or call into libc.

/// The keeper's system calls ([`crate::sys::raw_syscall`]).
pub use crate::sys::raw_syscall as call;

pub fn exit(code: i32) -> ! {
    loop {
        // SAFETY: ends the calling thread; never returns.
        unsafe { call(libc::SYS_exit, [code as usize, 0, 0, 0, 0, 0]) };
    }
}

/// Reads the start of the file at NUL-terminated `path` into `buf` (raw
/// system calls); its length, or None when it cannot be read.
#[link_section = "igprof_hot"]
pub(super) fn read_file(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    let fd = raw_open(path.as_ptr(), libc::O_RDONLY);
    if fd < 0 {
        return None;
    }
    let n = raw_read(fd, buf);
    raw_close(fd);
    n
}

/// openat(2) of NUL-terminated `path` with `flags` | O_CLOEXEC, a raw
/// system call: the descriptor, or a negative errno.
#[link_section = "igprof_hot"]
pub(super) fn raw_open(path: *const u8, flags: i32) -> i32 {
    // SAFETY: the callers pass NUL-terminated paths.
    unsafe {
        call(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path as usize,
                (flags | libc::O_CLOEXEC) as usize,
                0,
                0,
                0,
            ],
        ) as i32
    }
}

/// close(2) of our own descriptor `fd`, a raw system call.
#[link_section = "igprof_hot"]
pub(super) fn raw_close(fd: i32) {
    // SAFETY: closes a descriptor the keeper opened.
    unsafe { call(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]) };
}

/// read(2) of `fd` into `buf` with a raw system call: the bytes read, or
/// None on an error.
#[link_section = "igprof_hot"]
pub(super) fn raw_read(fd: i32, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: reads at most buf.len() bytes into the caller's buffer.
    let n = unsafe {
        call(
            libc::SYS_read,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    };
    usize::try_from(n).ok()
}

/// `clock`'s time in ns, by a raw clock_gettime (0 if it fails).
#[link_section = "igprof_hot"]
pub(super) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into ts, on this stack.
    let r = unsafe {
        call(
            libc::SYS_clock_gettime,
            [
                clock as usize,
                &mut ts as *mut libc::timespec as usize,
                0,
                0,
                0,
                0,
            ],
        )
    };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes `v` in decimal at the start of `out`; returns its length.
pub(super) fn write_decimal(out: &mut [u8], mut v: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = digits[n - 1 - i];
    }
    n
}
