//! `igprof --mark PID [--mark-signal N]`: starts a new epoch of the memory
//! profiler in a running process profiled with `-mp --marks`, and returns
//! once the mark is in effect there (the process answers with the same
//! signal, carrying the new epoch's number, which is printed).
//!
//! What it must never do: signal a process that is not profiled with
//! marks (a realtime signal's default action ends the process: the
//! process's `IGPROF` must name `--marks`, `--mark-every` or
//! `--mark-signal`, and its memory map must hold the profiler's library:
//! an object its `LD_PRELOAD` names, whatever the file is called, or one
//! named libigprof.so), or wait for ever.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// How long the process has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Runs the command (`args`: what follows `--mark`); the exit status.
pub fn run(args: &[std::ffi::OsString]) -> libc::c_int {
    match mark(args) {
        Ok((pid, epoch)) => {
            println!("igprof: mark {epoch} in effect in process {pid}");
            0
        }
        Err(why) => {
            eprintln!("igprof: --mark: {why}");
            1
        }
    }
}

fn mark(args: &[std::ffi::OsString]) -> Result<(i32, i32), String> {
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let usage = "usage: igprof --mark PID [--mark-signal N]".to_string();
    let (pid, signal) = match words.as_slice() {
        [pid] => (pid, None),
        [pid, flag, n] if flag == "--mark-signal" => (pid, Some(n)),
        _ => return Err(usage),
    };
    let pid: i32 = pid
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("'{pid}' is not a process id ({usage})"))?;
    let env = std::fs::read(format!("/proc/{pid}/environ")).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("no process {pid}"),
        _ => format!(
            "cannot read process {pid}'s environment ({e}): run igprof --mark as its user or root"
        ),
    })?;
    let igprof = env
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"IGPROF="))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let marks = igprof.as_deref().is_some_and(|w| {
        w.split(' ')
            .any(|o| o == "--marks" || o == "--mark-every" || o == "--mark-signal")
    });
    if !marks || !profiler_mapped(&env, &maps) {
        return Err(format!(
            "process {pid} is not profiled with -mp --marks (its signal would end it): start it under igprof -mp --marks"
        ));
    }
    // The process's own --mark-signal, unless one is given here.
    let own = igprof.as_deref().and_then(|w| {
        let v: Vec<&str> = w.split(' ').collect();
        v.iter()
            .position(|o| *o == "--mark-signal")
            .and_then(|i| v.get(i + 1))
            .and_then(|n| n.trim_matches('\'').parse::<i32>().ok())
    });
    let sig = match signal {
        Some(n) => n
            .parse::<i32>()
            .ok()
            .filter(|s| (1..=64).contains(s))
            .ok_or_else(|| format!("'{n}' is not a signal number"))?,
        None => own.unwrap_or(igprof_options::DEFAULT_MARK_SIGNAL),
    };
    // SAFETY: plain signal-set and signal system calls on our own sets.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        // The answer waits, blocked, for sigtimedwait.
        libc::sigprocmask(libc::SIG_BLOCK, &set, core::ptr::null_mut());
        let v = libc::sigval {
            sival_ptr: igprof_options::MARK_MAGIC as usize as *mut libc::c_void,
        };
        if libc::sigqueue(pid, sig, v) != 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) => format!(
                    "not allowed to signal process {pid}: run igprof --mark as its user or root"
                ),
                Some(libc::ESRCH) => format!("no process {pid}"),
                _ => format!("cannot signal process {pid}: {e}"),
            });
        }
        let deadline = std::time::Instant::now() + ANSWER_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "process {pid} did not answer within {} s (is it stopped, or its mark signal not {sig}?)",
                    ANSWER_WITHIN.as_secs()
                ));
            }
            let ts = libc::timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            let mut info: libc::siginfo_t = core::mem::zeroed();
            if libc::sigtimedwait(&set, &mut info, &ts) == sig && info.si_pid() == pid {
                return Ok((pid, info.si_value().sival_ptr as usize as i32));
            }
        }
    }
}

/// Whether a process with this initial environment (`/proc/PID/environ`)
/// and memory map (`/proc/PID/maps`) has the profiler's library loaded:
/// an object its `LD_PRELOAD` names (the launcher preloads the library
/// under whatever name `IGPROF_LIB` gives it; the map shows the file's
/// path with symbolic links resolved, so each entry counts as given and
/// resolved), or one named libigprof.so.
fn profiler_mapped(environ: &[u8], maps: &str) -> bool {
    let mut preloaded: Vec<std::path::PathBuf> = Vec::new();
    for entry in environ
        .split(|b| *b == 0)
        .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
        .flat_map(|v| v.split(|b| *b == b':' || *b == b' '))
        .filter(|p| !p.is_empty())
    {
        let p = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(entry));
        if let Ok(real) = std::fs::canonicalize(&p) {
            preloaded.push(real);
        }
        preloaded.push(p);
    }
    maps.lines().filter_map(mapped_path).any(|path| {
        path.ends_with("/libigprof.so") || preloaded.iter().any(|p| p.as_os_str() == path)
    })
}

/// The file a line of `/proc/PID/maps` maps ([`crate::sys::maps_line_path`]),
/// without a " (deleted)" mark: a library replaced on disk is still the
/// one loaded.
fn mapped_path(line: &str) -> Option<&str> {
    let path = crate::sys::maps_line_path(line)?;
    Some(path.strip_suffix(" (deleted)").unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::profiler_mapped;

    const MAPS: &str = "\
7f0000000000-7f0000001000 r--p 00000000 fe:00 12 /opt/p/profiler-copy.so
7f0000002000-7f0000003000 r-xp 00000000 fe:00 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn the_preloaded_library_counts_whatever_its_name() {
        let env = b"HOME=/root\0LD_PRELOAD=/opt/p/profiler-copy.so\0IGPROF=-mp --marks\0";
        assert!(profiler_mapped(env, MAPS));
        let two = b"LD_PRELOAD=/x/other.so:/opt/p/profiler-copy.so\0";
        assert!(profiler_mapped(two, MAPS));
    }

    #[test]
    fn an_object_preloaded_but_not_mapped_or_another_name_does_not() {
        assert!(!profiler_mapped(b"LD_PRELOAD=/opt/p/gone.so\0", MAPS));
        assert!(!profiler_mapped(b"HOME=/root\0", MAPS));
        // A path that merely contains the preloaded one is another file.
        assert!(!profiler_mapped(b"LD_PRELOAD=/opt/p/profiler\0", MAPS));
    }

    #[test]
    fn a_path_with_spaces_or_deleted_is_read_whole() {
        let maps =
            "7f0000000000-7f0000001000 r-xp 00000000 fe:00 12      /opt/my dir/p.so (deleted)\n";
        // The loader splits LD_PRELOAD at spaces too: no preloaded path has one.
        assert!(!profiler_mapped(b"LD_PRELOAD=/opt/my dir/p.so\0", maps));
        assert_eq!(
            super::mapped_path(maps.trim_end()),
            Some("/opt/my dir/p.so")
        );
        assert_eq!(
            super::mapped_path("7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]"),
            None
        );
        assert_eq!(
            super::mapped_path("7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0"),
            None
        );
    }

    #[test]
    fn the_usual_library_name_counts_without_a_preload() {
        let maps =
            "7f0000000000-7f0000001000 r-xp 00000000 fe:00 12 /opt/igprof/lib/libigprof.so\n";
        assert!(profiler_mapped(b"", maps));
        // A name that only ends like it does not.
        let other = "7f0000000000-7f0000001000 r-xp 00000000 fe:00 12 /opt/x/notlibigprof.so\n";
        assert!(!profiler_mapped(b"", other));
    }
}
