//! Epochs of the memory profiler (`-mp --marks`, `--mark-every`,
//! `igprof_mark()` from include/igprof.h): MEM_LIVE_SINCE_MARK holds,
//! per stack, the blocks allocated since the last mark that are still
//! live at the dump, exactly (tests/programs/mark_phases.c: leaks in
//! three phases, a mark at the start of the second); a periodic mark
//! separates a leak before it from one after; the options that cannot
//! hold epochs are refused before the program runs.

mod mem_support;
use mem_support::*;

/// mark_phases built in a fresh directory with the header's directory
/// (and -fno-builtin: GCC removes allocations it sees unused).
fn built(name: &str) -> std::path::PathBuf {
    let d = scratch(name);
    let inc = format!("-I{}", root().join("include").display());
    build(&d, "mark_phases.c", "mark_phases", &["-fno-builtin", &inc]);
    d
}

#[test]
fn live_since_the_mark_is_the_second_phase_exactly() {
    let d = built("marks");
    let o = igprof(&d, &["-mp", "--marks", "-o", "prof.gz", "./mark_phases"]);
    ok(&o);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "start\nmark 1\ndone\n");
    let p = load(&d.join("prof.gz"));
    let since = sites(&p, "MEM_LIVE_SINCE_MARK");
    let s = site(&since, "phase_two");
    assert_eq!(
        (s.calls, s.bytes),
        (50, 100_000),
        "phase_two since the mark"
    );
    let all: (u64, u64) = since
        .values()
        .fold((0, 0), |a, s| (a.0 + s.calls, a.1 + s.bytes));
    assert_eq!(all, (50, 100_000), "nothing else since the mark: {since:?}");
    // MEM_LIVE still holds both phases' leaks.
    let live = sites(&p, "MEM_LIVE");
    assert_eq!(
        (
            site(&live, "phase_one").calls,
            site(&live, "phase_one").bytes
        ),
        (100, 100_000)
    );
    assert_eq!(site(&live, "phase_two").bytes, 100_000);
    // Unprofiled, or profiled without --marks, the mark says it is not taken.
    let o = igprof(&d, &["-mp", "-o", "plain.gz", "./mark_phases"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "start\nmark -1\ndone\n");
    assert!(total(&load(&d.join("plain.gz")), "MEM_LIVE_SINCE_MARK") == 0);
}

#[test]
fn a_periodic_mark_separates_the_leaks_around_it() {
    let d = built("mark-every");
    // Marks at 2 s, 4 s, ...: early_leak is before the first, late_leak
    // after it (3 s), and the program ends before the second: a second of
    // margin either way for a watcher that a loaded machine delays.
    let o = igprof(
        &d,
        &[
            "-mp",
            "--mark-every",
            "2s",
            "-o",
            "prof.gz",
            "./mark_phases",
            "every",
        ],
    );
    ok(&o);
    let p = load(&d.join("prof.gz"));
    let since = sites(&p, "MEM_LIVE_SINCE_MARK");
    let late = site(&since, "late_leak");
    assert_eq!((late.calls, late.bytes), (20, 80_000), "{since:?}");
    assert_eq!(site(&since, "early_leak").calls, 0, "{since:?}");
}

#[test]
fn marks_without_an_exact_memory_profile_are_refused() {
    let d = scratch("marks-refused");
    for (args, says) in [
        (&["--marks", "true"][..], "add -mp"),
        (&["-pp", "--mark-every", "2s", "true"][..], "add -mp"),
        (
            &["-mp", "--marks", "--sample-bytes", "4096", "true"][..],
            "drop --sample-bytes",
        ),
        (&["-mp", "--mark-every", "10ms", "true"][..], "--mark-every"),
    ] {
        let o = igprof(&d, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(127), "{args:?}: {err}");
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

/// mark_phases under `igprof -mp --marks` (with `IGPROF_LIB=lib` when
/// given), marked by `igprof --mark PID` once its first phase is done:
/// the mark is in effect (the launcher prints the epoch the process
/// answered with) and the program ends well. Its MEM_LIVE_SINCE_MARK sites.
fn marked_between_the_phases(
    d: &std::path::Path,
    lib: Option<&std::path::Path>,
) -> std::collections::BTreeMap<String, Site> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let mut cmd = igprof_command(
        d,
        &["-mp", "--marks", "-o", "prof.gz", "./mark_phases", "wait"],
    );
    if let Some(lib) = lib {
        cmd.env("IGPROF_LIB", lib);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    for want in ["start\n", "phase one done\n"] {
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, want);
    }
    let o = igprof(d, &["--mark", &pid]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("igprof: mark 1 in effect in process {pid}\n")
    );
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
    sites(&load(&d.join("prof.gz")), "MEM_LIVE_SINCE_MARK")
}

/// `igprof --mark PID` marks a running process and returns once the mark
/// is in effect (it prints the epoch the process answered with); a
/// process not profiled with marks is not signalled (its signal would end
/// it), and is still running after the refusal.
#[test]
fn igprof_mark_pid_marks_a_running_process() {
    use std::process::Command;
    let d = built("mark-pid");
    let since = marked_between_the_phases(&d, None);
    let s = site(&since, "phase_two");
    assert_eq!((s.calls, s.bytes), (50, 100_000), "{since:?}");
    assert_eq!(site(&since, "phase_one").calls, 0);

    // A process without marks: refused, not signalled.
    let mut plain = Command::new("sleep").arg("30").spawn().unwrap();
    let o = igprof(&d, &["--mark", &plain.id().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("is not profiled with -mp --marks"), "{err}");
    assert!(
        plain.try_wait().unwrap().is_none(),
        "the unprofiled process still runs"
    );
    plain.kill().unwrap();
    plain.wait().unwrap();
    let o = igprof(&d, &["--mark", "999999999"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no process 999999999"),
        "{o:?}"
    );
}

/// `igprof --mark PID` knows the profiler's library by what the process
/// preloaded, not by its file's name: a process profiled with a copy of
/// the library under another name (`IGPROF_LIB`) is marked like any other.
/// (By name alone it was refused as "not profiled with -mp --marks".)
#[test]
fn igprof_mark_pid_finds_a_renamed_library() {
    let d = built("mark-renamed");
    let copy = d.join("profiler-copy.so");
    std::fs::copy(lib(), &copy).unwrap();
    let since = marked_between_the_phases(&d, Some(&copy));
    assert_eq!(site(&since, "phase_two").calls, 50, "{since:?}");
}
