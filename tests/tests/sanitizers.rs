//! End-to-end checks of sanitizer-built programs (gcc -fsanitize=address,
//! undefined, thread) under the launcher: the program's output, stderr
//! reports and exit status are those of the run without the profiler,
//! and -mp counts the allocations of tests/programs/san_alloc.c exactly
//! (the sanitizer's malloc is the one hooked); -pp and -fd run and record.
//! scripts/setup installs the runtimes (libasan8, libubsan1, libtsan2).

mod mem_support;
use mem_support::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Mallocs of 100 bytes in san_small.
const N: u64 = 5000;

/// san_alloc.c built with `-fsanitize=<sanitizer>` in a scratch dir.
fn built(sanitizer: &str, name: &str) -> (PathBuf, PathBuf) {
    let d = scratch(name);
    let exe = build(
        &d,
        "san_alloc.c",
        "san",
        &[&format!("-fsanitize={sanitizer}")],
    );
    (d, exe)
}

/// The program run without the profiler.
fn unprofiled(d: &Path, exe: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .current_dir(d)
        .output()
        .expect("run the program")
}

/// The program run under `igprof <opts> -o prof.gz`.
fn profiled(d: &Path, opts: &[&str], args: &[&str]) -> Output {
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", "prof.gz", "./san"]);
    a.extend(args);
    igprof(d, &a)
}

/// The program's stderr without the profiler's own `igprof:` lines.
fn program_stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.starts_with("igprof: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The same stdout and exit status with and without the profiler, and
/// the same lines of the program on stderr: those that hold `marker`
/// (sanitizer reports name pids and addresses on their other lines).
fn same_run(plain: &Output, prof: &Output, marker: &str, what: &str) {
    let err = String::from_utf8_lossy(&prof.stderr);
    assert_eq!(
        prof.status.code(),
        plain.status.code(),
        "{what}: exit status\nstderr: {err}"
    );
    assert_eq!(
        String::from_utf8_lossy(&prof.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "{what}: stdout\nstderr: {err}"
    );
    let marked = |s: String| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains(marker))
            .map(String::from)
            .collect()
    };
    assert_eq!(
        marked(program_stderr(prof)),
        marked(program_stderr(plain)),
        "{what}: the program's report on stderr"
    );
}

/// -mp of `./san N`: san_small's N x 100 bytes all freed, san_kept's
/// 12345 bytes live at exit with its leak record, no profiler frame.
fn check_exact_memory(d: &Path, what: &str) {
    let p = load(&d.join("prof.gz"));
    let total = sites(&p, "MEM_TOTAL");
    let live = sites(&p, "MEM_LIVE");
    let s = site(&total, "san_small");
    assert_eq!(
        (s.calls, s.bytes),
        (N, 100 * N),
        "{what}: san_small MEM_TOTAL"
    );
    assert_eq!(site(&sites(&p, "MEM_MAX"), "san_small").max_value, 100);
    let l = site(&live, "san_small");
    assert_eq!((l.calls, l.bytes), (0, 0), "{what}: san_small MEM_LIVE");
    let k = site(&total, "san_kept");
    assert_eq!((k.calls, k.bytes), (1, 12345), "{what}: san_kept MEM_TOTAL");
    let k = site(&live, "san_kept");
    assert_eq!(
        (k.calls, k.bytes, k.leaks.len()),
        (1, 12345, 1),
        "{what}: san_kept live at exit"
    );
    assert_eq!(k.leaks[0].1, 12345);
    assert_no_profiler_frames(&p, what);
}

/// Runs `./san N` under each of -mp, -pp and -fd: the run is the one
/// without the profiler, -mp is exact, -pp samples san_burn, -fd counts
/// san_fds' ten opens.
fn check_sanitizer(sanitizer: &str) {
    let (d, exe) = built(sanitizer, &format!("san-{sanitizer}"));
    let n = N.to_string();
    let plain = unprofiled(&d, &exe, &[&n]);
    assert_eq!(plain.status.code(), Some(3), "{sanitizer}: {plain:?}");

    let o = profiled(&d, &["-mp"], &[&n]);
    same_run(&plain, &o, "", &format!("{sanitizer} -mp"));
    check_exact_memory(&d, &format!("{sanitizer} -mp"));

    let o = profiled(&d, &["-pp"], &[&n]);
    same_run(&plain, &o, "", &format!("{sanitizer} -pp"));
    let p = load(&d.join("prof.gz"));
    let (burn, _) = under(&p, "PERF_TICKS", "san_burn");
    assert!(
        burn > 0 && 2 * burn > total(&p, "PERF_TICKS"),
        "{sanitizer} -pp: san_burn {burn} of {} ticks",
        total(&p, "PERF_TICKS")
    );

    let o = profiled(&d, &["-fd"], &[&n]);
    same_run(&plain, &o, "", &format!("{sanitizer} -fd"));
    let p = load(&d.join("prof.gz"));
    // Under san_fds, not at it: TSan's `open` interceptor calls libc's
    // open, so the frame that opened is the interceptor's.
    assert_eq!(
        under(&p, "FD_USED", "san_fds").0,
        10,
        "{sanitizer} -fd: san_fds' opens"
    );
    assert_eq!(under(&p, "FD_LIVE", "san_fds").1, 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn asan_program_runs_and_is_profiled_exactly() {
    check_sanitizer("address");
}

#[test]
fn ubsan_program_runs_and_is_profiled_exactly() {
    check_sanitizer("undefined");
}

#[test]
fn tsan_program_runs_and_is_profiled_exactly() {
    check_sanitizer("thread");
}

/// LeakSanitizer's report and exit status at exit are the program's: the
/// profiler's record of a live block must not make it look reachable.
#[test]
fn asan_leak_report_and_status_are_kept() {
    let (d, exe) = built("address", "san-leak");
    let n = N.to_string();
    let plain = unprofiled(&d, &exe, &[&n, "leak"]);
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(
        plain.status.code() == Some(1) && err.contains("777 byte(s) leaked in 1 allocation"),
        "without the profiler: {plain:?}"
    );
    for opt in ["-pp", "-fd", "-mp"] {
        let o = profiled(&d, &[opt], &[&n, "leak"]);
        same_run(&plain, &o, "SUMMARY", &format!("leak {opt}"));
    }
    // The last run's profile (-mp) counts the lost block as live at exit.
    let live = sites(&load(&d.join("prof.gz")), "MEM_LIVE");
    assert_eq!(site(&live, "san_lost").bytes, 777, "{live:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// UBSan's runtime report goes to stderr as without the profiler, and the
/// program goes on to the same output and status.
#[test]
fn ubsan_report_is_kept() {
    let (d, exe) = built("undefined", "san-ub");
    let plain = unprofiled(&d, &exe, &["10", "ub"]);
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("runtime error: signed integer overflow"),
        "without the profiler: {plain:?}"
    );
    for opt in ["-mp", "-pp", "-fd"] {
        let o = profiled(&d, &[opt], &["10", "ub"]);
        same_run(&plain, &o, "runtime error", &format!("ub {opt}"));
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The runtime preloaded is the one the program would load: a copy of
/// libasan in a directory of the program's RUNPATH, ahead of the system's.
#[test]
fn asan_runtime_is_found_as_the_loader_finds_it() {
    let (d, exe) = built("address", "san-system");
    // "libasan.so.N => /path/libasan.so.N (0x...)": the name the program
    // needs and the system's file.
    let ldd = Command::new("ldd").arg(&exe).output().expect("ldd");
    let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned();
    let (name, path) = ldd
        .lines()
        .find_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split_whitespace().next()?;
            name.starts_with("libasan.so")
                .then(|| (name.to_string(), path.to_string()))
        })
        .unwrap_or_else(|| panic!("no libasan in ldd's output: {ldd}"));
    let rt = d.join("rt");
    std::fs::create_dir_all(&rt).unwrap();
    std::fs::copy(&path, rt.join(&name)).unwrap();
    let rpath = format!("-Wl,-rpath,{}", rt.display());
    let exe = build(&d, "san_alloc.c", "san", &["-fsanitize=address", &rpath]);
    let plain = unprofiled(&d, &exe, &["100"]);
    assert_eq!(plain.status.code(), Some(3), "{plain:?}");
    let o = profiled(&d, &["-mp"], &["100"]);
    same_run(&plain, &o, "", "RUNPATH -mp");
    let err = String::from_utf8_lossy(&o.stderr);
    let copy = rt.join(&name);
    assert!(
        err.contains(&format!("the program's allocator is {}", copy.display())),
        "the copy in RUNPATH is the runtime: {err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A sanitizer-built program killed by SIGKILL leaves its profile, written
/// by the keeper, with every allocation it made before the kill: the
/// keeper runs beside ASan, UBSan and TSan as beside any program (its
/// `memcpy` and `memset` are glibc's, never TSan's interceptors, which
/// keep their state in the main thread's TLS that the keeper runs on:
/// base/mem_calls.rs). tests/programs/kill_mid.c makes `n` allocations at
/// `kept_alloc`, burns 0.3 s of CPU, prints "ready", and waits to be
/// killed.
#[test]
fn sanitizer_programs_killed_by_sigkill_leave_their_profile() {
    use std::os::unix::process::ExitStatusExt;
    for sanitizer in ["address", "undefined", "thread"] {
        let d = scratch(&format!("san-kill-{sanitizer}"));
        build(
            &d,
            "kill_mid.c",
            "kill_mid",
            &[&format!("-fsanitize={sanitizer}")],
        );
        let n = N.to_string();
        let args = [
            "-pp",
            "-mp",
            "-fd",
            "-o",
            "prof.gz",
            "./kill_mid",
            "kill",
            &n,
        ];
        let (line, out) = kill_after_first_line(igprof_command(&d, &args));
        assert_eq!(line, format!("ready {n} 1\n"), "{sanitizer}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "{sanitizer}: {err}"
        );
        // The keeper writes it a moment after the death.
        let path = d.join("prof.gz");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let p = load(&path);
        assert_eq!(
            under(&p, "MEM_TOTAL", "kept_alloc"),
            (N, 64 * N),
            "{sanitizer}: every allocation before the kill"
        );
        assert!(
            under(&p, "PERF_TICKS", "burn").0 > 0,
            "{sanitizer}: burn's samples"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// The TSan program beside its keeper, 10 times under `-fd` and `-pp`:
/// the same output and status each time. When the keeper's copies went
/// through TSan's interceptors, TSan crashed in its stack depot in 4 to 12
/// of 30 runs of each mode on a quiet machine.
#[test]
fn a_tsan_program_runs_beside_its_keeper() {
    let (d, exe) = built("thread", "san-tsan-keeper");
    let plain = unprofiled(&d, &exe, &[&N.to_string()]);
    for round in 0..10 {
        for mode in ["-fd", "-pp"] {
            let o = profiled(&d, &["-d", mode], &[&N.to_string()]);
            same_run(&plain, &o, "", &format!("thread {mode} round {round}"));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("igprof: keeper: pid"), "{err}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}
