//! The library's only output channel to the user: `igprof: ...` lines on
//! stderr, written with one raw write(2) per line from a stack buffer.
//!
//! Must never: allocate, use stdio, or take a lock (so it may be used from
//! hooks and, sparingly, from signal handlers), or write into a file the
//! program put at descriptor 2 after closing its stderr. Lines longer than
//! the buffer are cut, never split.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A fixed-size line being formatted on the stack.
pub struct Line {
    buf: [u8; 1024],
    len: usize,
}

impl Line {
    pub fn new() -> Self {
        let mut l = Line {
            buf: [0; 1024],
            len: 0,
        };
        l.push(b"igprof: ");
        l
    }

    fn push(&mut self, b: &[u8]) {
        // Keep one byte for the newline.
        let room = self.buf.len() - 1 - self.len;
        let n = b.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
    }

    /// Writes the line (with a newline) to stderr, if descriptor 2 is
    /// still the stderr the program started with ([`remember_stderr`]): a
    /// program that closed stderr and reused the number for its own file
    /// must not find our lines in it.
    pub fn emit(mut self) {
        self.buf[self.len] = b'\n';
        self.len += 1;
        let _errno = crate::sys::ErrnoGuard::save();
        if CAPTURE.load(Ordering::Acquire) {
            capture(&self.buf[..self.len]);
            return;
        }
        if !QUIET.load(Ordering::Relaxed) && stderr_is_ours() {
            // stderr may be a file, and the program may have lowered its
            // file size limit: the line is lost then, never the program.
            let _fsize = crate::base::limits::FsizeGuard::block();
            crate::sys::write_all(2, &self.buf[..self.len]);
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Default for Line {
    fn default() -> Self {
        Self::new()
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// Set in a process `igprof --attach` loaded the library into: its
/// stderr is the program's, so lines go to [`igprof_attach_log`] instead,
/// which `igprof` reads after each call it makes there.
static CAPTURE: AtomicBool = AtomicBool::new(false);

/// Lines captured (see [`CAPTURE`]): `igprof_attach_log_len` bytes, each
/// line ending in a newline; lines that do not fit are dropped whole.
#[no_mangle]
#[used]
pub static mut igprof_attach_log: [u8; LOG_BYTES] = [0; LOG_BYTES];
#[no_mangle]
#[used]
pub static igprof_attach_log_len: AtomicU64 = AtomicU64::new(0);
const LOG_BYTES: usize = 16 << 10;

fn capture(line: &[u8]) {
    let n = line.len() as u64;
    let at = igprof_attach_log_len.fetch_add(n, Ordering::AcqRel);
    if at + n > LOG_BYTES as u64 {
        igprof_attach_log_len.fetch_sub(n, Ordering::AcqRel);
        return;
    }
    // SAFETY: [at, at+n) was reserved for this line by the fetch_add
    // above, within the buffer; no other writer touches it.
    unsafe {
        let dst = (&raw mut igprof_attach_log as *mut u8).add(at as usize);
        core::ptr::copy_nonoverlapping(line.as_ptr(), dst, line.len());
    }
}

/// From now on lines go to the attach log, emptied here (see [`CAPTURE`]).
pub fn capture_lines() {
    igprof_attach_log_len.store(0, Ordering::Release);
    CAPTURE.store(true, Ordering::Release);
}

/// Set while a process other than the one the user started is starting up
/// without -d: its start-up lines are the run's, said once by that one.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Silences `igprof:` lines until dropped (the constructor's start-up).
pub struct StartupQuiet(bool);

impl StartupQuiet {
    /// Quiet unless `speak`.
    pub fn unless(speak: bool) -> Self {
        QUIET.store(!speak, Ordering::Relaxed);
        StartupQuiet(!speak)
    }
}

impl Drop for StartupQuiet {
    fn drop(&mut self) {
        if self.0 {
            QUIET.store(false, Ordering::Relaxed);
        }
    }
}

/// (device, inode) of descriptor 2 at start-up; 0 if not known yet.
static STDERR_ID: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

fn fd2_id() -> Option<(u64, u64)> {
    // SAFETY: fstat into a valid, zeroed struct; a raw syscall (no lock).
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above: st is valid for the kernel to fill.
    let r = unsafe { libc::syscall(libc::SYS_fstat, 2, &mut st) };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// Set when descriptor 2 was closed at start-up (a daemon's, `2>&-`): no
/// line is written then, since the number may become a file of the
/// program's.
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Remembers what descriptor 2 is (constructor, before the program runs).
pub fn remember_stderr() {
    match fd2_id() {
        Some((dev, ino)) => {
            STDERR_ID[0].store(dev, Ordering::Relaxed);
            STDERR_ID[1].store(ino, Ordering::Release);
        }
        None => STDERR_CLOSED.store(true, Ordering::Release),
    }
}

fn stderr_is_ours() -> bool {
    if STDERR_CLOSED.load(Ordering::Acquire) {
        return false;
    }
    let ino = STDERR_ID[1].load(Ordering::Acquire);
    if ino == 0 {
        // Not remembered (messages before start-up): stderr as it is.
        return true;
    }
    fd2_id() == Some((STDERR_ID[0].load(Ordering::Relaxed), ino))
}

/// Bytes that may not be UTF-8 (paths), shown lossily without allocating
/// (the option table's, whose messages show values so).
pub use igprof_options::Bytes;

/// `igprof_log!("fmt", args..)`: one `igprof: ...` line on stderr.
#[macro_export]
macro_rules! igprof_log {
    ($($arg:tt)*) => {{
        let mut line = $crate::base::log::Line::new();
        let _ = core::fmt::Write::write_fmt(&mut line, format_args!($($arg)*));
        line.emit();
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_prefix_and_cuts_long_lines() {
        let mut l = Line::new();
        write!(l, "x={} p={}", 5, Bytes(b"/a\xffb")).unwrap();
        assert_eq!(l.as_bytes(), "igprof: x=5 p=/a\u{fffd}b".as_bytes());
        let mut l = Line::new();
        for _ in 0..200 {
            l.write_str("0123456789").unwrap();
        }
        assert_eq!(l.as_bytes().len(), 1023);
    }
}
