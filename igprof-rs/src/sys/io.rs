//! Descriptors and paths by direct system calls: write, open, close,
//! exists, rename, moving a descriptor out of the program's low numbers,
//! the descriptor limit.
//!
//! Must never: go through libc's wrappers (they may be hooked, lock or
//! allocate), or close a descriptor that is not the library's own.

use super::errno::{errno, Errno};

/// write(2) until done or failed; returns false on failure.
pub fn write_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: bytes is a valid readable slice for its length.
        let n = unsafe { libc::syscall(libc::SYS_write, fd, bytes.as_ptr(), bytes.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Opens `path` (NUL-terminated) with `flags` and `mode`: the descriptor
/// or the errno.
pub fn open(path: &[u8], flags: i32, mode: u32) -> Result<i32, Errno> {
    debug_assert!(path.last() == Some(&0));
    // SAFETY: path is NUL-terminated.
    let r = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), flags, mode) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as i32)
    }
}

pub fn close(fd: i32) {
    // SAFETY: closing our own descriptor.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Whether `path` (NUL-terminated) exists (faccessat F_OK).
pub fn exists(path: &[u8]) -> bool {
    // SAFETY: path is NUL-terminated.
    unsafe {
        libc::syscall(
            libc::SYS_faccessat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::F_OK,
            0,
        ) == 0
    }
}

/// rename(2) of NUL-terminated paths.
pub fn rename(from: &[u8], to: &[u8]) -> bool {
    // SAFETY: both paths are NUL-terminated.
    unsafe {
        libc::syscall(
            libc::SYS_renameat,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
        ) == 0
    }
}

/// Our descriptor `fd` moved to the lowest free number at or above
/// `min_fd` (close-on-exec), out of the way of programs that expect the
/// lowest numbers; `fd` itself if that is refused.
pub fn move_fd_up(fd: i32, min_fd: i32) -> i32 {
    // SAFETY: fcntl and close on our own descriptor.
    unsafe {
        let high = libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, min_fd);
        if high < 0 {
            return fd;
        }
        libc::syscall(libc::SYS_close, fd);
        high as i32
    }
}

/// The soft limit on open descriptors.
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid out-pointer.
    unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            core::ptr::null::<libc::rlimit>(),
            &mut r,
        )
    };
    r.rlim_cur
}
