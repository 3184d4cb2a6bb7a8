//! Whether the exec would put the program in the loader's secure-execution
//! mode (AT_SECURE), which ignores LD_PRELOAD.
//!
//! What it owns: the file's set-user-ID and set-group-ID bits against the
//! real ids, its file capabilities, and what turns them off (a nosuid
//! mount, no_new_privs on this process), and the advice for each case.
//!
//! What it must never do: refuse a program the exec would not raise (its
//! owner's set-user-ID file, root and file capabilities), or change any
//! id or attribute.

use std::ffi::{CStr, CString};

/// Whether exec'ing `p` would put the process in the loader's
/// secure-execution mode (AT_SECURE), and why: a set-user-ID file owned by
/// another user than the real one, a set-group-ID file of another group
/// than the real one, or file capabilities for a user other than root.
/// None when the exec cannot raise privileges: a file system mounted
/// nosuid, or no_new_privs set on this process (both inherited by the
/// exec).
pub fn secure_exec(p: &[u8]) -> Option<[&'static [u8]; 2]> {
    secure_exec_c(&CString::new(p).ok()?)
}

/// [`secure_exec`] of a NUL-terminated path, allocating nothing (a child
/// that `vfork` made, which shares its parent's memory, may ask).
pub fn secure_exec_c(c: &CStr) -> Option<[&'static [u8]; 2]> {
    // SAFETY: a zeroed stat is a valid out-buffer; `c` is NUL-terminated.
    let mut m: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::stat(c.as_ptr(), &mut m) } != 0 {
        return None;
    }
    // SAFETY: no arguments are read; returns 0 or 1.
    if unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1 {
        return None;
    }
    // SAFETY: a zeroed statvfs is a valid out-buffer; `c` is NUL-terminated.
    let mut vfs: libc::statvfs = unsafe { core::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut vfs) } == 0 && vfs.f_flag & libc::ST_NOSUID != 0 {
        return None;
    }
    // SAFETY: plain queries of this process's ids.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mode = m.st_mode;
    if mode & libc::S_ISUID != 0 && m.st_uid != uid {
        return Some([
            b"set-user-ID",
            b"run igprof as the file's owner, or profile a copy: cp drops the bit",
        ]);
    }
    // Without group execute permission the bit means mandatory locking.
    if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 && m.st_gid != gid {
        return Some([
            b"set-group-ID",
            b"run igprof with the file's group as real group, or profile a copy: cp drops the bit",
        ]);
    }
    // SAFETY: `c` and the name are NUL-terminated; a null buffer of size 0
    // asks only whether the attribute exists (and its size).
    let caps = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            core::ptr::null_mut(),
            0,
        )
    };
    if uid != 0 && caps > 0 {
        return Some([
            b"given file capabilities",
            b"run igprof as root, or profile a copy: cp drops them",
        ]);
    }
    None
}
