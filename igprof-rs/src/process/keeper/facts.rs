//! What the timeline records of the process itself, read from
//! `/proc/PID` with raw system calls into the caller's stack: its CPU time
//! (`stat`'s utime and stime), its RSS (`statm`) and its peak RSS
//! (`status`'s VmHWM). The keeper reads them for the program every
//! timeline step, so that the program pays nothing and stays
//! single-threaded; the program reads its own where no keeper runs (the
//! watcher) and for the final dump's last point. Also the RSS of a
//! `statm` text, for the keeper's `--snapshot-above` watch.
//!
//! Must never: allocate, touch TLS or errno, or call into libc (the keeper
//! runs it while the program lives).

use core::sync::atomic::{AtomicU64, Ordering};

use super::raw::{read_file, write_decimal};
use crate::base::cgroup::leading_number;

/// The page size and the kernel's clock ticks per second (USER_HZ), found
/// by the program at start-up ([`set_units`]).
static PAGE: AtomicU64 = AtomicU64::new(4096);
static HZ: AtomicU64 = AtomicU64::new(100);

/// Start-up, in the program (libc may be used there).
pub fn set_units() {
    PAGE.store(crate::sys::page_size() as u64, Ordering::Relaxed);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        HZ.store(hz as u64, Ordering::Relaxed);
    }
}

/// The resident set in bytes of a `/proc/PID/statm` text (its second
/// field, in pages).
#[link_section = "igprof_hot"]
pub fn statm_rss_bytes(statm: &[u8]) -> Option<u64> {
    let second = statm.iter().position(|b| *b == b' ')? + 1;
    Some(leading_number(&statm[second..])? * PAGE.load(Ordering::Relaxed))
}

/// A value not known.
pub const UNKNOWN: u64 = u64::MAX;

/// A timeline point's facts of process `pid`: `[t_ms, cpu_ms, rss_kib,
/// peak_rss_kib]`, t_ms since the process started being profiled.
pub fn point(pid: i32) -> [u64; 4] {
    let now = super::raw::clock_ns(libc::CLOCK_REALTIME);
    let t = now.saturating_sub(crate::base::run::started_ns()) / 1_000_000;
    let [cpu, rss, peak] = read(pid);
    [t, cpu, rss, peak]
}

/// `[cpu_ms, rss_kib, peak_rss_kib]` of process `pid` ([`UNKNOWN`] where
/// a file could not be read).
pub fn read(pid: i32) -> [u64; 3] {
    let mut dir = [0u8; 32];
    dir[..6].copy_from_slice(b"/proc/");
    let n = 6 + write_decimal(&mut dir[6..], pid as u64);
    let path = |name: &[u8], out: &mut [u8; 64]| {
        out[..n].copy_from_slice(&dir[..n]);
        out[n..n + name.len()].copy_from_slice(name);
        out[n + name.len()] = 0;
    };
    let mut p = [0u8; 64];
    let mut buf = [0u8; 2048];
    path(b"/stat", &mut p);
    let cpu = read_file(&p, &mut buf)
        .and_then(|len| cpu_ms(&buf[..len]))
        .unwrap_or(UNKNOWN);
    path(b"/statm", &mut p);
    let rss = read_file(&p, &mut buf)
        .and_then(|len| statm_rss_bytes(&buf[..len]))
        .map_or(UNKNOWN, |b| b / 1024);
    path(b"/status", &mut p);
    let peak = read_file(&p, &mut buf)
        .and_then(|len| field_kib(&buf[..len], b"VmHWM:"))
        .unwrap_or(UNKNOWN);
    [cpu, rss, peak]
}

/// utime + stime of a `/proc/PID/stat` text, in ms (fields 14 and 15; the
/// command name before them, in parentheses, may hold spaces).
fn cpu_ms(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let mut fields = stat[close + 1..]
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty());
    // After the name: state is field 3, utime field 14.
    let utime = leading_number(fields.nth(11)?)?;
    let stime = leading_number(fields.next()?)?;
    Some((utime + stime) * 1000 / HZ.load(Ordering::Relaxed))
}

/// The number after `label` in a `/proc/PID/status` text (kB).
fn field_kib(status: &[u8], label: &[u8]) -> Option<u64> {
    let at = status.windows(label.len()).position(|w| w == label)? + label.len();
    let rest = &status[at..];
    let digits = rest.iter().position(|b| b.is_ascii_digit())?;
    leading_number(&rest[digits..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_peak_from_proc_texts() {
        HZ.store(100, Ordering::Relaxed);
        let stat =
            b"4242 (a (b) c) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 1 0 99 1000 50\n";
        assert_eq!(cpu_ms(stat), Some(3250));
        assert_eq!(cpu_ms(b"4242 (x) S 1"), None);
        let status = b"Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    5228 kB\nVmRSS:\t 5100 kB\n";
        assert_eq!(field_kib(status, b"VmHWM:"), Some(5228));
        assert_eq!(field_kib(status, b"VmSwap:"), None);
        PAGE.store(4096, Ordering::Relaxed);
        assert_eq!(
            statm_rss_bytes(b"2000 300 100 1 0 50 0\n"),
            Some(300 * 4096)
        );
        assert_eq!(statm_rss_bytes(b"2000"), None);
        let own = read(std::process::id() as i32);
        assert!(own.iter().all(|v| *v != UNKNOWN), "{own:?}");
        assert!(own[1] > 0 && own[2] >= own[1] / 2, "{own:?}");
    }
}
