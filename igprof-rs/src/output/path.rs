//! The file a process writes its profile to.
//!
//! Must never: depend on anything but the options, the run's facts
//! (`base/run.rs`) and what -o's path is (a device or FIFO is written in
//! place by every process), so that every writer of this process agrees.

use crate::base::{options, run};
use crate::sys;

/// The file this process's profile goes to: the name from -o (or the
/// default), with `.<pid>` for other processes of the run (unless -o names
/// a device or a FIFO, which every process writes), and with
/// `.exec<N>` when this image (the N-th of its pid, from 0) is being
/// replaced by exec, so that the image that follows does not overwrite it.
/// A relative name is taken from the directory the image started in, not
/// the one it ends in (a program that changes directory still leaves its
/// profile where it was run, and where the start-up line said).
pub fn output_path() -> String {
    let info = run::info();
    let given = in_dir(&info.start_dir, options::get().output.as_bytes());
    if is_device_or_pipe(&given) {
        // `-o /dev/null`, a FIFO: every process of the run writes there (a
        // per-process name beside it would create files in /dev).
        return String::from_utf8_lossy(&given).into_owned();
    }
    let path = profile_path(
        &given,
        &info.exe,
        sys::getpid(),
        run::root_pid(),
        run::execing().then(run::exec_generation),
    );
    String::from_utf8_lossy(&in_dir(&info.start_dir, path.as_bytes())).into_owned()
}

/// Where a final profile that cannot be created at `path` goes instead:
/// the same file name in `$TMPDIR` (else /tmp), if that is another place.
pub fn fallback_path(path: &str) -> Option<String> {
    let dir = std::env::var("TMPDIR")
        .ok()
        .filter(|d| d.starts_with('/'))
        .unwrap_or_else(|| "/tmp".to_string());
    let name = path.rsplit('/').next().filter(|n| !n.is_empty())?;
    let alt = String::from_utf8_lossy(&in_dir(dir.as_bytes(), name.as_bytes())).into_owned();
    (alt != path).then_some(alt)
}

/// `path` taken from directory `dir`: as it is when absolute, empty, or
/// when `dir` is unknown (empty).
fn in_dir(dir: &[u8], path: &[u8]) -> Vec<u8> {
    if path.is_empty() || path.starts_with(b"/") || dir.is_empty() {
        return path.to_vec();
    }
    let sep: &[u8] = if dir.ends_with(b"/") { b"" } else { b"/" };
    [dir, sep, path].concat()
}

/// [`output_path`] from its inputs: `given` is -o's value (empty: the
/// default name from `exe`), `root` the launcher's pid (0: unknown),
/// `exec` the generation of an image being replaced by exec.
pub fn profile_path(given: &[u8], exe: &[u8], pid: i32, root: i32, exec: Option<u32>) -> String {
    let name = base_path(given, exe, pid, root);
    let Some(gen) = exec else {
        return name;
    };
    match name.strip_suffix(".gz") {
        Some(stem) => format!("{stem}.exec{gen}.gz"),
        None => format!("{name}.exec{gen}"),
    }
}

/// The name a periodic snapshot taken `ms` after the process started is
/// kept under, beside `path` (the profile's): `STEM.snap<ms>.gz`.
pub fn snapshot_path(path: &str, ms: u64) -> String {
    match path.strip_suffix(".gz") {
        Some(stem) => format!("{stem}.snap{ms}.gz"),
        None => format!("{path}.snap{ms}"),
    }
}

/// Whether `given` names something that exists and is neither a regular
/// file nor a directory (a device, a FIFO, a socket).
pub(crate) fn is_device_or_pipe(given: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    !given.is_empty()
        && std::fs::metadata(std::ffi::OsStr::from_bytes(given))
            .is_ok_and(|m| !m.is_file() && !m.is_dir())
}

fn basename(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => &p[i + 1..],
        None => p,
    }
}

fn base_path(given: &[u8], exe: &[u8], pid: i32, root: i32) -> String {
    if given.is_empty() {
        let prog = String::from_utf8_lossy(basename(exe)).into_owned();
        return format!("igprof.{prog}.{pid}.gz");
    }
    let given = String::from_utf8_lossy(given).into_owned();
    if given.contains("%p") {
        return given.replace("%p", &pid.to_string());
    }
    if root == 0 || root == pid {
        return given;
    }
    // Another process of the same run (fork child, exec'd child): its own file.
    match given.strip_suffix(".gz") {
        Some(stem) => format!("{stem}.{pid}.gz"),
        None => format!("{given}.{pid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{in_dir, profile_path};

    #[test]
    fn a_profile_that_cannot_be_created_goes_to_the_temporary_directory() {
        let alt = super::fallback_path("/nonexistent/dir/p.gz").unwrap();
        assert!(alt.ends_with("/p.gz") && alt.starts_with('/'), "{alt}");
        assert_ne!(alt, "/nonexistent/dir/p.gz");
        let same = super::fallback_path(&alt);
        assert_eq!(same, None, "already there: no other place");
        assert_eq!(super::fallback_path("/t/"), None);
    }

    #[test]
    fn relative_names_are_taken_from_the_start_directory() {
        assert_eq!(
            in_dir(b"/home/u", b"igprof.x.1.gz"),
            b"/home/u/igprof.x.1.gz"
        );
        assert_eq!(in_dir(b"/", b"p.gz"), b"/p.gz");
        assert_eq!(in_dir(b"/home/u", b"out/p.gz"), b"/home/u/out/p.gz");
        assert_eq!(in_dir(b"/home/u", b"/t/p.gz"), b"/t/p.gz");
        assert_eq!(in_dir(b"", b"p.gz"), b"p.gz");
        assert_eq!(in_dir(b"/home/u", b""), b"");
    }

    #[test]
    fn names_follow_igprof_and_keep_every_process_apart() {
        // Default: the executable's name and the pid.
        assert_eq!(
            profile_path(b"", b"/usr/bin/perl", 42, 42, None),
            "igprof.perl.42.gz"
        );
        // -o as given in the launcher's own process, %p replaced anywhere.
        assert_eq!(profile_path(b"/t/p.gz", b"x", 42, 42, None), "/t/p.gz");
        assert_eq!(profile_path(b"/t/p.%p.gz", b"x", 7, 42, None), "/t/p.7.gz");
        // Other processes of the run: the pid before .gz, or at the end.
        assert_eq!(profile_path(b"/t/p.gz", b"x", 43, 42, None), "/t/p.43.gz");
        assert_eq!(profile_path(b"/t/p", b"x", 43, 42, None), "/t/p.43");
        // Launcher unknown: as given.
        assert_eq!(profile_path(b"/t/p.gz", b"x", 43, 0, None), "/t/p.gz");
        // An image replaced by exec keeps its generation.
        assert_eq!(
            profile_path(b"/t/p.gz", b"x", 42, 42, Some(0)),
            "/t/p.exec0.gz"
        );
        assert_eq!(
            profile_path(b"/t/p", b"x", 43, 42, Some(2)),
            "/t/p.43.exec2"
        );
        assert_eq!(
            profile_path(b"", b"/bin/sh", 9, 9, Some(1)),
            "igprof.sh.9.exec1.gz"
        );
    }
}
