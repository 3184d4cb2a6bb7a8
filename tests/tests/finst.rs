//! End-to-end checks of the function-instrumentation profiler (-finst) on
//! tests/programs/finst.c built with -finstrument-functions: exact
//! CALL_COUNT per path of instrumented calls, CALL_TIME within a tolerance
//! of the program's known sleeps and burns, threads, a longjmp out of
//! instrumented frames, fork, the program's output and exit status
//! unchanged, the program unprofiled, igprof-analyse on the profile, and
//! the other architecture under qemu-user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use igprof_tests::*;

const MS: u64 = 1_000_000;

fn build_finst(name: &str) -> (PathBuf, PathBuf) {
    let d = scratch(name);
    let exe = build(&d, "finst.c", "finst", &["-finstrument-functions"]);
    (d, exe)
}

/// Runs finst under `igprof -finst` with `args`; returns stdout, the exit
/// status and the parsed profile.
/// What the program measured of its calls to c(), per caller, in ns
/// (its stderr line "c_us in_a N in_threads N after_jump N").
struct Measured {
    in_a: u64,
    in_threads: u64,
    after_jump: u64,
}

fn measured(err: &str) -> Measured {
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("c_us "))
        .unwrap_or_else(|| panic!("no c_us line: {err}"));
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .step_by(2)
        .map(|n| n.parse::<u64>().unwrap() * 1000)
        .collect();
    Measured {
        in_a: v[0],
        in_threads: v[1],
        after_jump: v[2],
    }
}

fn run_finst(d: &Path, extra: &[&str], args: &[&str]) -> (String, i32, Profile, Measured) {
    let mut a = vec!["-finst"];
    a.extend_from_slice(extra);
    a.extend_from_slice(&["-o", "prof.gz", "./finst"]);
    a.extend_from_slice(args);
    let o = igprof(d, &a);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let text = read_text(&d.join("prof.gz"));
    let p = parse_strict(&text).unwrap_or_else(|e| panic!("{e}\n{err}"));
    (out, o.status.code().unwrap_or(-1), p, measured(&err))
}

/// (calls, self ns) per path of function names, outermost first.
fn by_path(p: &Profile) -> BTreeMap<String, (u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (path, calls, _) in path_values(p, "CALL_COUNT") {
        m.entry(path.join(">")).or_default().0 += calls;
    }
    for (path, _, ns) in path_values(p, "CALL_TIME") {
        m.entry(path.join(">")).or_default().1 += ns;
    }
    m
}

/// The calls alone of [`by_path`]'s map.
fn call_counts(m: &BTreeMap<String, (u64, u64)>) -> BTreeMap<&str, u64> {
    m.iter().map(|(k, v)| (k.as_str(), v.0)).collect()
}

/// A CALL_TIME `got` for `calls` calls that the program itself measured
/// as `measured` ns: at least that, less the microsecond rounding of each
/// call, and at most 2 ms a call more (the hooks' own time, and a
/// preemption between a hook's clock and the program's).
fn near(what: &str, got: u64, measured: u64, calls: u64) {
    let (low, high) = (
        measured.saturating_sub(calls * 1000),
        measured + calls * 2 * MS,
    );
    assert!(
        (low..=high).contains(&got),
        "{what}: {:.2} ms, the program measured {:.2} ms in {calls} calls",
        got as f64 / MS as f64,
        measured as f64 / MS as f64,
    );
}

#[test]
fn exact_calls_and_times_per_path() {
    let (d, _) = build_finst("finst-plain");
    let (out, status, p, c) = run_finst(&d, &[], &[]);
    assert_eq!(out, "finst done plain\n");
    assert_eq!(status, 3, "the program's exit status");
    let m = by_path(&p);
    assert_eq!(
        call_counts(&m),
        BTreeMap::from([("main", 1), ("main>a", 3), ("main>a>c", 6), ("main>b", 5)]),
        "{m:?}"
    );
    // Self time: c sleeps 20 ms a call; a only calls c; b burns 10 ms of
    // CPU a call (more wall-clock time on a busy machine).
    assert!(c.in_a >= 6 * 20 * MS, "c slept less than asked");
    near("c self", m["main>a>c"].1, c.in_a, 6);
    assert!(m["main>a"].1 < 3 * MS, "a's self time {:?}", m["main>a"]);
    assert!(m["main>b"].1 >= 5 * 10 * MS, "{:?}", m["main>b"]);
    // Inclusive time of a: its own and c's.
    let (_, a_incl) = under(&p, "CALL_TIME", "a");
    near("a inclusive", a_incl, c.in_a, 6);
    let (_, main_incl) = under(&p, "CALL_TIME", "main");
    assert!(main_incl >= 170 * MS, "main inclusive {main_incl}");
}

#[test]
fn threads_each_have_their_own_stack() {
    let (d, _) = build_finst("finst-threads");
    let (out, status, p, c) = run_finst(&d, &[], &["threads"]);
    assert_eq!((out.as_str(), status), ("finst done threads\n", 3));
    let m = by_path(&p);
    assert_eq!(m["t_work>c"].0, 2, "{m:?}");
    assert_eq!(m["t_work"].0, 2, "{m:?}");
    near("c in the threads", m["t_work>c"].1, c.in_threads, 2);
    assert_eq!(m["main>a>c"].0, 6, "{m:?}");
    assert_eq!(m["main"].0, 1);
}

#[test]
fn a_longjmp_out_of_instrumented_frames_does_not_corrupt_the_stack() {
    let (d, _) = build_finst("finst-jump");
    let (out, status, p, c) = run_finst(&d, &["-d"], &["jump"]);
    assert_eq!((out.as_str(), status), ("finst done jump\n", 3));
    let m = by_path(&p);
    // j_mid and j_inner were left by longjmp: entered, never exited.
    assert_eq!(m["main>j_outer"].0, 1, "{m:?}");
    assert_eq!(m.get("main>j_outer>j_mid").map_or(0, |v| v.0), 0, "{m:?}");
    // c after the jump is main's child again, not j_inner's.
    assert_eq!(m["main>c"].0, 1, "{m:?}");
    near("c after the jump", m["main>c"].1, c.after_jump, 1);
    assert_eq!(m["main"].0, 1);
}

#[test]
fn the_program_runs_unchanged_without_the_profiler() {
    let (d, exe) = build_finst("finst-bare");
    // glibc defines the two functions as no-ops: the program runs alone.
    let o = Command::new(&exe).current_dir(&d).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "finst done plain\n");
    assert_eq!(o.status.code(), Some(3));
    // Preloaded but with another profiler: no CALL_* counters.
    let o = igprof(&d, &["-fd", "-o", "fd.gz", "./finst"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "finst done plain\n");
    assert_eq!(o.status.code(), Some(3));
    let text = read_text(&d.join("fd.gz"));
    assert!(!text.contains("CALL_"), "{text}");
}

#[test]
fn igprof_analyse_reads_the_profile() {
    let (d, _) = build_finst("finst-analyse");
    let _ = run_finst(&d, &[], &[]);
    let report = |counter: &str| {
        let o = Command::new(analyser())
            .args(["-r", counter, "prof.gz"])
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let calls = report("CALL_COUNT");
    assert!(calls.starts_with("Counter: CALL_COUNT"), "{calls}");
    // The flat profile's self column: c 6, b 5, a 3, main 1.
    let self_of = |text: &str, f: &str| -> Option<String> {
        let flat_self = text.split("Flat profile (self").nth(1)?;
        flat_self
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(f))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
    };
    assert_eq!(self_of(&calls, "c").as_deref(), Some("6"), "{calls}");
    assert_eq!(self_of(&calls, "b").as_deref(), Some("5"), "{calls}");
    let time = report("CALL_TIME");
    assert!(time.starts_with("Counter: CALL_TIME"), "{time}");
    let c_ns: u64 = self_of(&time, "c")
        .unwrap()
        .replace('\'', "")
        .parse()
        .unwrap();
    near("c self in the report", c_ns, 120 * MS, 60 * MS);
}

#[test]
fn a_fork_child_profiles_its_own_calls() {
    let d = scratch("finst-fork");
    build(&d, "finst_fork.c", "forker", &["-finstrument-functions"]);
    let o = igprof(&d, &["-finst", "./forker"]);
    let _ = ok(&o);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "forked\n");
    let ps = profiles(&d);
    assert_eq!(ps.len(), 2, "{ps:?}");
    let mut calls: Vec<(u64, u64, u64)> = ps
        .iter()
        .map(|f| {
            let m = by_path(&parse_strict(&read_text(f)).unwrap());
            let n = |k: &str| m.get(k).map_or(0, |v| v.0);
            (n("main>work>leaf"), n("main>work"), n("main"))
        })
        .collect();
    calls.sort();
    // Parent: work(1) and work(2); child: work(4), inside main, whose
    // entry it inherited from the parent (main returns in both).
    assert_eq!(calls, vec![(3, 2, 1), (4, 1, 1)]);
}

#[test]
fn exceptions_through_instrumented_frames_call_their_exits() {
    let d = scratch("finst-throw");
    build(&d, "finst_throw.cpp", "throw", &["-finstrument-functions"]);
    let o = igprof(&d, &["-finst", "-d", "-o", "prof.gz", "./throw"]);
    let err = ok(&o);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "caught 5\n");
    // GCC's unwinding cleanups call the exits: nothing is dropped.
    assert!(err.contains("-finst: 0 frames dropped"), "{err}");
    let m = by_path(&parse_strict(&read_text(&d.join("prof.gz"))).unwrap());
    assert_eq!(
        call_counts(&m),
        BTreeMap::from([
            ("main", 1),
            ("main>_Z3midi", 10),
            ("main>_Z3midi>_Z5inneri", 10),
            ("main>_Z4leafv", 10)
        ])
    );
}

#[test]
fn the_other_architecture_under_qemu_user() {
    // AArch64 on an x86-64 host (x86-64 on an AArch64 one): the cycle
    // counter and the exported functions of that architecture's library.
    let d = scratch("finst-foreign");
    cross_build(&d, "finst.c", "finst", &["-finstrument-functions"]);
    let o = foreign_igprof(&d, &["-finst", "-o", "prof.gz", "./finst", "threads"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "finst done threads\n");
    assert_eq!(o.status.code(), Some(3));
    let m = by_path(&parse_strict(&read_text(&d.join("prof.gz"))).unwrap());
    assert_eq!(
        call_counts(&m),
        BTreeMap::from([
            ("main", 1),
            ("main>a", 3),
            ("main>a>c", 6),
            ("main>b", 5),
            ("t_work", 2),
            ("t_work>c", 2)
        ])
    );
    near("c self", m["main>a>c"].1, 6 * 20 * MS, 120 * MS);
}
