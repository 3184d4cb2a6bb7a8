//! A profile for every way a process ends, written by the keeper when the
//! process could not write it (process/keeper.rs): SIGKILL in the middle of
//! a run, a crash inside the program's own signal handler, a raw
//! exit_group, a forked child that is killed. And what the program sees of
//! the keeper: nothing (no child to wait for, a pipe's reader sees
//! end-of-file when the program and its daemon close it).
//!
//! The program is tests/programs/kill_mid.c: it makes N allocations at
//! `kept_alloc`, burns 0.3 s of CPU in `burn`, prints "ready", and ends as
//! told. Every allocation it reported before its death is in the profile.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use igprof_tests::*;

const N: u64 = 5000;

/// The profiles in `d` once `count` of them exist (the keeper writes its
/// own after the program's death: give it time on a loaded machine).
fn wait_for_profiles(d: &Path, count: usize) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = profiles(d);
        if p.len() >= count || Instant::now() > deadline {
            return p;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn setup(name: &str) -> PathBuf {
    let d = scratch(name);
    build(&d, "kill_mid.c", "kill_mid", &[]);
    d
}

/// The allocations, and the CPU samples in `burn`, that a profile holds.
fn check_profile(p: &Path, what: &str) {
    let prof = parse_strict(&read_text(p)).unwrap_or_else(|e| panic!("{what}: {e}"));
    let (calls, bytes) = under(&prof, "MEM_TOTAL", "kept_alloc");
    assert_eq!((calls, bytes), (N, 64 * N), "{what}: every allocation");
    assert!(
        under(&prof, "PERF_TICKS", "burn").0 > 0,
        "{what}: burn's CPU samples"
    );
}

#[test]
fn a_process_killed_by_sigkill_leaves_its_profile() {
    let d = setup("ends_sigkill");
    let mut child = igprof_command(
        &d,
        &["-pp", "-mp", "-fd", "./kill_mid", "kill", &N.to_string()],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, format!("ready {N} 1\n"));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    let p = wait_for_profiles(&d, 1);
    assert_eq!(p.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    check_profile(&p[0], "SIGKILL");
}

#[test]
fn crashes_and_raw_exits_leave_their_profile_and_status() {
    let d = setup("ends_crash");
    for mode in ["crash", "exitgroup", "child"] {
        for f in profiles(&d) {
            std::fs::remove_file(f).unwrap();
        }
        let plain = Command::new(d.join("kill_mid"))
            .args([mode, &N.to_string()])
            .current_dir(&d)
            .output()
            .unwrap();
        let got = igprof(&d, &["-pp", "-mp", "./kill_mid", mode, &N.to_string()]);
        let err = String::from_utf8_lossy(&got.stderr);
        assert_eq!(
            (got.status.to_string(), &got.stdout),
            (plain.status.to_string(), &plain.stdout),
            "{mode}: {err}"
        );
        // "child": the parent's profile (it made no allocation of its
        // own) and the killed child's.
        let want = if mode == "child" { 2 } else { 1 };
        let p = wait_for_profiles(&d, want);
        assert_eq!(p.len(), want, "{mode}: {err}");
        let with_allocs: Vec<&PathBuf> = p
            .iter()
            .filter(|f| {
                let prof = parse_strict(&read_text(f)).unwrap();
                under(&prof, "MEM_TOTAL", "kept_alloc").0 > 0
            })
            .collect();
        assert_eq!(with_allocs.len(), 1, "{mode}");
        check_profile(with_allocs[0], mode);
    }
}

#[test]
fn the_program_sees_no_keeper() {
    let d = setup("ends_unseen");
    let plain = Command::new(d.join("kill_mid"))
        .args(["children", "0"])
        .output()
        .unwrap();
    assert!(plain.status.success());
    for mode in ["-pp", "-mp", "-fd"] {
        let got = igprof(&d, &[mode, "./kill_mid", "children", "0"]);
        assert_eq!(
            (got.status.code(), ok_stdout(&got)),
            (Some(0), String::from_utf8_lossy(&plain.stdout).into_owned()),
            "{mode}"
        );
    }
    // A daemon that outlives its parent: the parent's and the daemon's
    // keepers hold no copy of the pipes, so output() returns when the
    // daemon closes them, not when the daemon (3 s) or a keeper ends.
    let started = Instant::now();
    let got = igprof(&d, &["-pp", "-mp", "./kill_mid", "daemon", "0"]);
    assert_eq!(ok_stdout(&got), "parent 1\n");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the pipes stayed open for {:?}",
        started.elapsed()
    );
    // A shell's wait for a profiled job sees its status unchanged.
    let sh = igprof(
        &d,
        &[
            "-pp",
            "sh",
            "-c",
            "./kill_mid exitgroup 10 & wait $!; echo $?",
        ],
    );
    assert!(
        String::from_utf8_lossy(&sh.stdout).ends_with("\n7\n"),
        "{sh:?}"
    );
}

fn ok_stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
