//! Replacing the launcher with the program: the exec, and the line and
//! exit status when it fails.
//!
//! What it owns: the exec as the shell's was (`file` made absolute as
//! bash's full_pathname, a file without `#!` that the kernel refuses run by
//! /bin/sh, as glibc's execvp does), the message of a failed exec and its
//! status (127 missing, 126 otherwise).
//!
//! What it must never do: fork, or touch the environment, signal
//! dispositions or signal mask (what the program inherits is set before).

use std::ffi::CString;

use crate::path::full_pathname;
use crate::refusal::cat;
use crate::sys::{c_string, stat, write_fd};

/// Replaces this process with `file` run with `argv`, as the shell's exec
/// did: a relative `file` made absolute first (bash's full_pathname: its
/// PWD, one leading "./" dropped), and a file without `#!` the kernel
/// refuses run by /bin/sh as `/bin/sh file args...` (glibc's execvp with a
/// path; musl's, which the static launcher has, does not fall back, so it
/// is done here). Returns only when the exec fails, with the exit status
/// to leave with: 127 when the file (or its interpreter) is missing, else 126.
pub fn exec(file: &[u8], argv: &[&[u8]], pwd: &mut dyn FnMut() -> Vec<u8>) -> libc::c_int {
    let file = full_pathname(file, pwd);
    let mut code = execv(&file, argv);
    if code == libc::ENOEXEC {
        let mut shell_argv: Vec<&[u8]> = vec![SHELL, &file];
        shell_argv.extend(argv.iter().skip(1));
        code = execv(SHELL, &shell_argv);
    }
    let is_dir = stat(&file).is_some_and(|m| m.is_dir());
    let why =
        std::io::Error::from_raw_os_error(if is_dir { libc::EISDIR } else { code }).to_string();
    // "Is a directory (os error 21)" without the code.
    let why = why.split(" (os error").next().unwrap_or_default();
    write_fd(
        2,
        &cat(&[
            b"igprof: exec: ",
            &file,
            b": cannot execute: ",
            why.as_bytes(),
            b"\n",
        ]),
    );
    if code == libc::ENOENT {
        127
    } else {
        126
    }
}

/// The shell a file without `#!` is run by (glibc's `_PATH_BSHELL`).
const SHELL: &[u8] = b"/bin/sh";

/// execv(2) of `file` with `argv` and this process's environment; returns
/// only when it fails, with errno.
fn execv(file: &[u8], argv: &[&[u8]]) -> libc::c_int {
    let file_c = c_string(file);
    let args: Vec<CString> = argv.iter().map(|a| c_string(a)).collect();
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: `file_c` and the strings `ptrs` points to are alive and
    // NUL-terminated, and `ptrs` ends with a null pointer; execv only
    // returns on failure.
    unsafe { libc::execv(file_c.as_ptr(), ptrs.as_ptr()) };
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
