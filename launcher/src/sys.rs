//! The system as the launcher asks it, with paths and values as bytes.
//!
//! What it owns: stat and eaccess of a byte path, C strings of argv and
//! environ bytes, an environment variable as bytes, writing to a
//! descriptor, and the path of a `/proc/PID/maps` line.
//!
//! What it must never do: change anything but what it writes to the
//! descriptor it is given, or decide what a result means (its callers do).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// `b` as an OS string (paths and values are bytes on Linux).
pub fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// The C string of `b` (which holds no NUL: it comes from argv or environ).
pub fn c_string(b: &[u8]) -> CString {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    CString::new(&b[..end]).unwrap_or_default()
}

/// What stat says of a path: exists, directory, regular file.
pub fn stat(p: &[u8]) -> Option<std::fs::Metadata> {
    std::fs::metadata(os(p)).ok()
}

/// Whether `p` is a regular file (or a link to one).
pub fn is_file(p: &[u8]) -> bool {
    stat(p).is_some_and(|m| m.is_file())
}

/// Whether this process may execute `p` (bash's test -x: eaccess X_OK).
pub fn executable(p: &[u8]) -> bool {
    accessible(p, libc::X_OK)
}

/// Whether this process's effective ids give `mode` (`X_OK`, `W_OK`...)
/// on `p` (eaccess).
pub fn accessible(p: &[u8], mode: libc::c_int) -> bool {
    let c = c_string(p);
    // SAFETY: `c` is a NUL-terminated string alive for the call;
    // faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, libc::AT_EACCESS) == 0 }
}

/// A variable of the environment, None when unset or empty.
pub fn env_set(name: &str) -> Option<Vec<u8>> {
    std::env::var_os(name)
        .map(OsString::into_vec)
        .filter(|v| !v.is_empty())
}

/// Writes all of `b` to `fd` (errors ignored: nowhere to report them).
pub fn write_fd(fd: libc::c_int, mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: the pointer and length are those of the live slice `b`.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n > 0 {
            b = &b[n as usize..];
        } else if n == 0
            || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
        {
            return;
        }
    }
}

/// The file a line of `/proc/PID/maps` maps: the text after its five
/// fixed fields, whole (spaces included, a " (deleted)" mark kept), when
/// it is a path.
pub fn maps_line_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = &rest[rest.find(' ')?..];
    }
    let path = rest.trim();
    path.starts_with('/').then_some(path)
}
