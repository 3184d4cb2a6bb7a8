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
//!
//! The OOM killer kills the keeper too (it shares the program's memory): a
//! process in a memory cgroup gets a snapshot from the keeper's watch when
//! it nears the limit, and from then on a journal of its allocations and
//! frees in a file it maps shared (`PROFILE.journal`), which igprof-analyse
//! applies to the snapshot: the report holds every allocation made before
//! the kill.

use std::path::{Path, PathBuf};
use std::process::Command;
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
    let (line, out) = kill_after_first_line(igprof_command(
        &d,
        &["-pp", "-mp", "-fd", "./kill_mid", "kill", &N.to_string()],
    ));
    assert_eq!(line, format!("ready {N} 1\n"));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    let p = wait_for_profiles(&d, 1);
    assert_eq!(p.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    check_profile(&p[0], "SIGKILL");
}

/// The keepers' pids, from the `-d` lines that name them.
fn keeper_pids(stderr: &str) -> Vec<i32> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("igprof: keeper: pid "))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// Asserts that every process of `pids` is gone (reaped) within `within`.
fn assert_keepers_gone(pids: &[i32], within: Duration) {
    let deadline = Instant::now() + within;
    for pid in pids {
        // SAFETY: kill(pid, 0) only checks that the process exists.
        while unsafe { libc::kill(*pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        assert_ne!(unsafe { libc::kill(*pid, 0) }, 0, "keeper {pid} still runs");
    }
}

/// A thread of the program killed while it held a lock the keeper's dump
/// takes: the loader's (inside `dl_iterate_phdr`: every kill) and one of
/// the live-block table's (inside a memory hook: about every other kill
/// of four threads that allocate without end). The keeper waited for them
/// for ever (until its ten-minute limit): no profile, and the program's
/// memory kept all that time. And the C library allocator's main arena
/// (`arena`: most kills come inside glibc's malloc or free): the keeper's
/// removal of the dump's temporaries read the directory through
/// `opendir`, which allocates, and waited in 5 of 6 runs.
#[test]
fn a_process_killed_while_holding_a_lock_leaves_its_profile() {
    let d = scratch("ends_holding");
    build(&d, "killed_holding.c", "killed_holding", &["-pthread"]);
    // The table of -fp's hooked functions, held while a dlopen's objects
    // are searched (the keeper's dump lists the functions never found:
    // no_such_fn): about one kill in two comes while it is held. And about
    // one in seven inside a dlclose, after the loader unmapped libz and
    // before the module table heard of it: the keeper's naming must not
    // read it.
    let fp: &[&str] = &["-mp", "-fp:compress2", "-fp:no_such_fn", "-d"];
    let runs: [(&[&str], &str); 13] = [
        (&["-mp", "-d"], "arena"),
        (&["-mp", "-d"], "arena"),
        (&["-pp", "-mp", "-fd", "-d"], "arena"),
        (&["-pp", "-d"], "loader"),
        (fp, "dlopen"),
        (fp, "dlopen"),
        (fp, "dlopen"),
        (fp, "dlopen"),
        (&["-mp", "-d"], "loader"),
        (&["-mp", "-d"], "threads"),
        (&["-mp", "-d"], "threads"),
        (&["-mp", "-d"], "threads"),
        (&["-pp", "-mp", "-fd", "-d"], "threads"),
    ];
    for (mode, how) in runs {
        for f in profiles(&d) {
            std::fs::remove_file(f).unwrap();
        }
        let mut args = mode.to_vec();
        args.extend(["./killed_holding", how]);
        let (line, out) = kill_after_first_line(igprof_command(&d, &args));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let what = format!("{mode:?} {how}");
        assert_eq!(line, "ready\n", "{what}: {err}");
        let p = wait_for_profiles(&d, 1);
        assert_eq!(p.len(), 1, "{what}: no profile; {err}");
        let keepers = keeper_pids(&err);
        assert_eq!(keepers.len(), 1, "{what}: {err}");
        assert_keepers_gone(&keepers, Duration::from_secs(30));
        let prof = parse_strict(&read_text(&p[0])).unwrap_or_else(|e| panic!("{what}: {e}"));
        match (how, mode[0]) {
            ("loader" | "dlopen", "-mp") => assert_eq!(
                under(&prof, "MEM_TOTAL", "kept_alloc"),
                (100, 6400),
                "{what}"
            ),
            // Named through the objects the keeper lists without the loader.
            ("loader", _) => assert!(under(&prof, "PERF_TICKS", "spin").0 > 0, "{what}"),
            ("arena", _) => assert!(
                under(&prof, "MEM_TOTAL", "arena_churn").0 >= 100_000,
                "{what}"
            ),
            _ => assert!(under(&prof, "MEM_TOTAL", "churn").0 >= 400_000, "{what}"),
        }
    }
}

/// The keeper's limit on its dump (a lock held by a killed thread would
/// stop it for ever: after ten minutes SIGALRM ends it) needs SIGALRM's
/// default action. The keeper's handlers are copies of the program's,
/// among them the profiler's own for fatal signals; it reset SIGALRM
/// through signal(), which is the profiler's hook and kept that handler:
/// at the limit it ran the fatal-signal dump, which waited for the dump
/// under way, and the keeper never ended (seen 55 minutes on). Seen here
/// from /proc while the keeper's dump waits to open a FIFO that nobody
/// reads yet; then the profile is read from it.
#[test]
fn the_keepers_dump_is_limited_by_sigalrms_default_action() {
    let d = scratch("ends_keeper_alarm");
    build(&d, "killed_holding.c", "killed_holding", &["-pthread"]);
    let fifo = d.join("p.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) of a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err_path = d.join("stderr.txt");
    let mut child = igprof_command(
        &d,
        &["-mp", "-d", "-o", "p.fifo", "./killed_holding", "threads"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::fs::File::create(&err_path).unwrap())
    .spawn()
    .unwrap();
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    child.kill().unwrap();
    child.wait().unwrap();
    let err = std::fs::read_to_string(&err_path).unwrap();
    let keepers = keeper_pids(&err);
    let [keeper] = keepers[..] else {
        panic!("one keeper: {err}")
    };
    // Its dump waits for a reader of the FIFO.
    let deadline = Instant::now() + Duration::from_secs(30);
    let wchan = format!("/proc/{keeper}/wchan");
    let waiting = || std::fs::read_to_string(&wchan).is_ok_and(|w| w.trim() == "wait_for_partner");
    while !waiting() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        waiting(),
        "the keeper's dump does not wait for the FIFO: {err}"
    );
    let status = std::fs::read_to_string(format!("/proc/{keeper}/status")).unwrap();
    let mask = |field: &str| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .unwrap_or_else(|| panic!("{field}: {status}"));
        u64::from_str_radix(hex.trim(), 16).unwrap()
    };
    let alrm = 1u64 << (libc::SIGALRM - 1);
    assert_eq!(
        mask("SigCgt:") & alrm,
        0,
        "SIGALRM caught in the keeper: {status}"
    );
    assert_eq!(
        mask("SigBlk:") & alrm,
        0,
        "SIGALRM blocked in the keeper: {status}"
    );
    assert_eq!(
        mask("SigIgn:") & alrm,
        0,
        "SIGALRM ignored in the keeper: {status}"
    );
    let prof = parse_strict(&read_text(&fifo)).unwrap();
    assert!(under(&prof, "MEM_TOTAL", "churn").0 >= 400_000);
    assert_keepers_gone(&keepers, Duration::from_secs(30));
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
        let got = kept(&d, &["-pp", "-mp", "./kill_mid", mode, &N.to_string()]);
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
        let got = kept(&d, &[mode, "./kill_mid", "children", "0"]);
        assert_eq!(
            (got.status.code(), ok_stdout(&got)),
            (Some(0), String::from_utf8_lossy(&plain.stdout).into_owned()),
            "{mode}"
        );
    }
    // A daemon that outlives its parent: the parent's and the daemon's
    // keepers hold no copy of the pipes, so output() returns when the
    // daemon closes them, not when the daemon (12 s) or a keeper ends.
    let started = Instant::now();
    let got = kept(&d, &["-pp", "-mp", "./kill_mid", "daemon", "12"]);
    assert_eq!(ok_stdout(&got), "parent 1\n");
    assert!(
        started.elapsed() < Duration::from_secs(8),
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

/// The keeper's creation narrows the creating thread's CPU set for an
/// instant, and the keeper keeps the one CPU it was made on for its first
/// 20 ms (keeper/affinity.rs): the program must end up with the set it
/// was started with, whole or narrowed by the user (`taskset`), and the
/// keeper with one CPU of it, then with the program's set.
#[test]
fn the_program_keeps_its_cpu_set_and_its_keeper_gets_it_back() {
    use std::io::BufRead;
    let d = scratch("ends_affinity");
    let ours = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    if ours.len() < 2 {
        eprintln!("one CPU: a narrowed set would look the same; not run");
        return;
    }
    let script = "import os, sys\n\
                  print(sorted(os.sched_getaffinity(0)), flush=True)\n\
                  sys.stdin.read()\n";
    let last = ours[ours.len() - 1];
    for narrowed in [false, true] {
        let mut c = if narrowed {
            let mut c = Command::new("taskset");
            c.args(["-c", &last.to_string()]).arg(launcher());
            c
        } else {
            Command::new(launcher())
        };
        let mut child = c
            .args(["-d", "-pp", "/usr/bin/python3", "-c", script])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", test_store())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("taskset (util-linux) and /usr/bin/python3");
        let mut printed = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut printed)
            .unwrap();
        // The keeper's line comes before the program runs, and the keeper
        // lives as long as the program (which waits for its stdin).
        let err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let keeper = loop {
            let Ok(l) = rx.recv_timeout(Duration::from_secs(60)) else {
                let _ = child.kill();
                panic!("no `keeper: pid` line on stderr");
            };
            if let Some(pid) = l.split("keeper: pid ").nth(1) {
                break pid.split_whitespace().next().unwrap().to_string();
            }
        };
        let want = if narrowed { vec![last] } else { ours.clone() };
        // One CPU of the program's, then (20 ms into the run) the
        // program's; while the program waits, the keeper lives.
        let keeper_cpus =
            || cpus_allowed(&std::fs::read_to_string(format!("/proc/{keeper}/status")).unwrap());
        let first = keeper_cpus();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut now = first.clone();
        while now != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            now = keeper_cpus();
        }
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
        assert_eq!(printed.trim(), format!("{want:?}"), "the program's CPU set");
        assert!(
            first == want || (first.len() == 1 && want.contains(&first[0])),
            "the keeper's CPU set at first {first:?}, the program's {want:?}"
        );
        assert_eq!(now, want, "the keeper's CPU set after 20 ms");
    }
}

/// The CPUs of a /proc/PID/status's `Cpus_allowed_list` ("0-2,5").
fn cpus_allowed(status: &str) -> Vec<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/PID/status")
        .trim();
    list.split(',')
        .flat_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            a.parse::<usize>().unwrap()..=b.parse().unwrap()
        })
        .collect()
}

/// The launcher's run of `args` (every image gets a keeper by default).
fn kept(d: &Path, args: &[&str]) -> std::process::Output {
    igprof_command(d, args).output().expect("run igprof")
}

fn ok_stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A memory cgroup of this test run, limited to `mib` MiB without swap,
/// removed when dropped; None (and a line saying why) where this machine
/// has no memory controller or the test may not make a cgroup.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn make(what: &str, mib: u64) -> Option<MemoryCgroup> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let name = format!("igprof-test-{what}-{}", std::process::id());
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else if std::fs::read_to_string(v2).is_ok_and(|c| c.contains("memory")) {
            (Path::new("/sys/fs/cgroup").join(&name), "memory.max")
        } else {
            eprintln!("no memory cgroup here: not run");
            return None;
        };
        if std::fs::create_dir(&dir).is_err() {
            eprintln!("cannot make a memory cgroup here (not root?): not run");
            return None;
        }
        let cg = MemoryCgroup(dir);
        std::fs::write(cg.0.join(limit_file), (mib << 20).to_string()).unwrap();
        // No swap to escape to (v1; v2 has memory.swap.max).
        let _ = std::fs::write(cg.0.join("memory.swappiness"), "0");
        let _ = std::fs::write(cg.0.join("memory.swap.max"), "0");
        Some(cg)
    }
}

impl MemoryCgroup {
    /// Runs `igprof ARGS` in `dir` inside the cgroup (a shell joins it,
    /// then becomes the launcher).
    fn igprof(&self, dir: &Path, args: &str) -> std::process::Output {
        let script = format!(
            "echo $$ > {} && exec \"$0\" {args}",
            self.0.join("cgroup.procs").display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .arg(launcher())
            .current_dir(dir)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", test_store())
            .output()
            .unwrap()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A program that runs for 0.3 s, then grows in a memory cgroup of 96 MiB
/// until the OOM killer ends it: the snapshot written near the limit is its
/// profile, the growing site on top, and one line said so. (The keeper
/// finds the limit a moment after the process starts: a process that
/// fills its cgroup in its first milliseconds may end before the watch
/// begins.) Needs root and a writable memory
/// cgroup (v1's memory controller, as on this project's CI, or v2).
#[test]
fn a_process_the_oom_killer_ends_leaves_the_snapshot_taken_near_its_limit() {
    let Some(cg) = MemoryCgroup::make("oom", 96) else {
        return;
    };
    let d = setup("ends_oom");
    oom_snapshot_holds_the_growth(&cg, &d, "-mp ./kill_mid grow 0");
}

/// The same after the program read a file larger than its cgroup: the
/// page cache it left fills the cgroup to its limit long before the heap
/// grows, and reclaim empties it before the OOM killer is called. The
/// usage watched leaves it out (`memory.stat`'s file lists), so the
/// snapshots still come as the heap nears the limit (before, all three
/// came while the file was read, and the profile held 1 of 93 blocks).
#[test]
fn a_process_whose_page_cache_fills_its_cgroup_is_caught_near_the_oom_all_the_same() {
    let Some(cg) = MemoryCgroup::make("oom-cache", 96) else {
        return;
    };
    let d = setup("ends_oom_cache");
    write_uncached_file(&d.join("big"), 160);
    oom_snapshot_holds_the_growth(&cg, &d, "-mp ./kill_mid cachegrow big");
}

/// In a cgroup of 4 GiB, 97% of the limit is 123 MiB below it: the keeper
/// also asks for snapshots 64 and 16 MiB below the limit, so the one left
/// by the OOM killer misses at most about 16 of the blocks of 1 MiB the
/// program made (and reported) before it (13 here; with 97% the last, it
/// missed about 120, with 64 MiB below the last, 53).
#[test]
fn a_large_cgroup_is_snapshotted_close_below_its_limit() {
    let Some(cg) = MemoryCgroup::make("oom-large", 4096) else {
        return;
    };
    let d = setup("ends_oom_large");
    let ended = run_until_oom(&cg, &d, "-mp ./kill_mid grow 0");
    let (blocks, _) = under(&ended.prof, "MEM_LIVE", "grow_alloc");
    let grown = ended.grown;
    eprintln!("snapshot: {blocks} of {grown} blocks");
    let merged = merged_blocks(&ended.path, 1 << 20);
    assert!(
        merged >= grown && merged <= grown + 1,
        "{merged} of {grown} blocks with the journal"
    );
    assert!(
        blocks + 20 >= grown && blocks <= grown + 1,
        "{blocks} of {grown} blocks: {}",
        ended.err
    );
}

/// What a run of kill_mid growing until the OOM killer ended it left.
struct OomEnd {
    /// Its stderr.
    err: String,
    /// The blocks it reported before the kill.
    grown: u64,
    /// Its profile, and the file's path.
    prof: Profile,
    path: PathBuf,
}

/// Runs `args` (kill_mid growing) in `cg` until the OOM killer ends it
/// (SIGKILL, checked), with one profile left.
fn run_until_oom(cg: &MemoryCgroup, d: &Path, args: &str) -> OomEnd {
    let out = cg.igprof(d, args);
    use std::os::unix::process::ExitStatusExt;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{err}");
    let grown: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let p = profiles(d);
    assert_eq!(p.len(), 1, "{err}");
    let prof = parse_strict(&read_text(&p[0])).unwrap();
    OomEnd {
        err,
        grown,
        prof,
        path: p[0].clone(),
    }
}

/// Runs `args` (kill_mid growing until the OOM killer ends it) in `cg`
/// and checks the snapshot it leaves.
fn oom_snapshot_holds_the_growth(cg: &MemoryCgroup, d: &Path, args: &str) {
    let OomEnd {
        err,
        grown,
        prof,
        path,
    } = run_until_oom(cg, d, args);
    assert!(
        err.lines().any(|l| l.contains(
            " (page cache not counted) of its cgroup's 96.0 MiB limit: wrote a snapshot"
        )),
        "{err}"
    );
    let (blocks, bytes) = under(&prof, "MEM_LIVE", "grow_alloc");
    // The last snapshot, taken at 85%, 92% or 97% of the limit, before the
    // last blocks the program made.
    // It holds at least 85% of the blocks the program reported, and at
    // most the one it made but was killed before reporting.
    eprintln!("snapshot: {blocks} of {grown} blocks");
    assert!(
        blocks * 100 >= grown * 85 && blocks <= grown + 1,
        "{blocks} of {grown} blocks"
    );
    assert_eq!(bytes, blocks << 20);
    assert!(
        bytes * 10 >= total_value(&prof, "MEM_LIVE") * 9,
        "grow_alloc on top"
    );
    // The profile says it is a snapshot, and why (the last one may be the
    // one asked for on memory pressure, after the limit's); so does the
    // analyser, whose report is the snapshot's with its journal.
    assert!(
        prof.notes.iter().any(|n| n.starts_with("snapshot at ")
            && n.contains("of its cgroup's 96.0 MiB memory limit")
            // A note cannot close a parenthesis: it opens none.
            && !n.contains('(')
            || n.starts_with("snapshot on memory pressure at ")),
        "{:?}",
        prof.notes
    );
    let a = Command::new(analyser())
        .args(["-r", "MEM_LIVE"])
        .arg(&path)
        .output()
        .unwrap();
    let aerr = String::from_utf8_lossy(&a.stderr);
    assert!(a.status.success(), "{aerr}");
    assert!(
        aerr.lines()
            .any(|l| l.starts_with("igprof-analyse: warning: ")
                && l.contains("is a snapshot written while the process ran (")
                && l.contains("not its final profile")),
        "{aerr}"
    );
    assert!(String::from_utf8_lossy(&a.stdout).contains("grow_alloc"));
    let merged = merged_blocks(&path, 1 << 20);
    assert!(
        merged >= grown && merged <= grown + 1,
        "{merged} of {grown} blocks with the journal"
    );
}

/// Blocks of `block` bytes live under grow_alloc in igprof-analyse's
/// report of `path` (the snapshot with its journal applied).
fn merged_blocks(path: &Path, block: u64) -> u64 {
    folded_blocks(path, "MEM_LIVE", block)
}

/// Blocks of `block` bytes under grow_alloc in igprof-analyse's report of
/// `counter` for `path`; the bytes must be whole blocks.
fn folded_blocks(path: &Path, counter: &str, block: u64) -> u64 {
    let bytes = folded_value(path, counter, "grow_alloc");
    assert_eq!(bytes % block, 0, "{bytes} bytes");
    bytes / block
}

/// Blocks of 16 KiB: the last snapshot, at 97% of 96 MiB, is 2.9 MiB (about
/// 180 blocks) before the OOM kill. The journal holds what came after it:
/// igprof-analyse's report has every block the program reported, and the
/// one it was making when killed at most, where the snapshot alone lacks
/// those made after it.
#[test]
fn the_journal_after_the_last_snapshot_holds_every_allocation_to_the_oom_kill() {
    let Some(cg) = MemoryCgroup::make("oom-journal", 96) else {
        return;
    };
    let d = setup("ends_oom_journal");
    let OomEnd {
        err,
        grown,
        prof,
        path,
    } = run_until_oom(&cg, &d, "-mp ./kill_mid grow 16");
    let (in_snapshot, _) = under(&prof, "MEM_LIVE", "grow_alloc");
    let journal = PathBuf::from(format!("{}.journal", path.display()));
    assert!(journal.exists(), "{err}");
    let merged = merged_blocks(&path, 16 << 10);
    eprintln!("{in_snapshot} blocks in the snapshot, {merged} with the journal, {grown} reported");
    assert!(
        merged >= grown && merged <= grown + 1,
        "{merged} of {grown} blocks with the journal ({in_snapshot} in the snapshot)"
    );
    // Its calls, too: MEM_TOTAL counts each block once.
    let a = Command::new(analyser())
        .args(["-r", "MEM_TOTAL"])
        .arg(&path)
        .output()
        .unwrap();
    let aerr = String::from_utf8_lossy(&a.stderr);
    let said = aerr
        .lines()
        .find(|l| l.contains("then its journal to the process's end: "))
        .unwrap_or_else(|| panic!("{aerr}"));
    let added: u64 = said
        .split("end: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(in_snapshot + added, merged, "{said}");
}

/// Two threads grow the heap by blocks of 16 KiB, each pausing 0.5 ms
/// between blocks, until the OOM killer ends the process: the watcher
/// thread writes each snapshot while both threads allocate. The journal of
/// each snapshot begins as the snapshot reads the live blocks, and the
/// analyser counts a change the snapshot already has once, so the report
/// holds every block the program reported, and in MEM_LIVE at most one
/// more per thread (made, not yet reported).
/// Where a snapshot cannot be written before the kill (the machine is
/// loaded, and the growth of the last 15% of the limit outruns the dump),
/// the run is made again, three times at most.
#[test]
fn the_journal_holds_every_allocation_of_two_threads_to_the_oom_kill() {
    let Some(cg) = MemoryCgroup::make("oom-threads", 96) else {
        return;
    };
    let d = scratch("ends_oom_threads");
    build(&d, "grow_threads.c", "grow_threads", &["-pthread"]);
    let mut tries = 0;
    let (out, grown, path) = loop {
        tries += 1;
        for p in profiles(&d) {
            std::fs::remove_file(p).unwrap();
        }
        let out = cg.igprof(&d, "-mp ./grow_threads 16 500");
        let grown: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let p = profiles(&d);
        if p.len() == 1 || tries == 3 {
            assert_eq!(p.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
            break (out, grown, p[0].clone());
        }
    };
    use std::os::unix::process::ExitStatusExt;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{err}");
    let in_snapshot = under(
        &parse_strict(&read_text(&path)).unwrap(),
        "MEM_LIVE",
        "grow_alloc",
    )
    .0;
    let total = folded_blocks(&path, "MEM_TOTAL", 16 << 10);
    let live = merged_blocks(&path, 16 << 10);
    eprintln!("{in_snapshot} blocks in the snapshot; with the journal {total} allocated, {live} live; {grown} reported");
    // MEM_LIVE: the live blocks, so at most one more per thread (made,
    // not yet reported). MEM_TOTAL may also count twice a block another
    // thread made between the snapshot's read of the live blocks and its
    // read of that stack's counters (a CI run: 3 more than reported).
    for (what, n, more) in [("MEM_TOTAL", total, 8), ("MEM_LIVE", live, 2)] {
        assert!(
            n >= grown && n <= grown + more,
            "{what}: {n} of {grown} blocks ({in_snapshot} in the snapshot): {err}"
        );
    }
}

/// Writes `mib` MiB of non-zero bytes to `path` and drops them from the
/// page cache, so that a program's reads bring them in within its own
/// cgroup (pages cached by this process are charged to this one's, and
/// reading them costs the program nothing). Not zeros: pages of a file's
/// holes are not read from the disk.
fn write_uncached_file(path: &Path, mib: usize) {
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let mut f = std::fs::File::create(path).unwrap();
    for _ in 0..mib {
        std::io::Write::write_all(&mut f, &chunk).unwrap();
    }
    f.sync_all().unwrap();
    // SAFETY: advice on our own open file.
    unsafe {
        libc::posix_fadvise(
            std::os::unix::io::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
}

/// Memory pressure: a program that reads a file of 256 MiB over and over
/// in a cgroup of 64 MiB stalls on memory (the kernel evicts and reads
/// back its pages); the keeper's trigger on the pressure file (the
/// cgroup's on v2, the system's on v1) asks for one snapshot for the
/// episode, with one line, and the final profile is still written.
#[test]
fn memory_pressure_asks_for_one_snapshot() {
    if std::fs::read_to_string("/proc/pressure/memory").is_err() {
        eprintln!("no pressure stall information in this kernel: not run");
        return;
    }
    let Some(cg) = MemoryCgroup::make("pressure", 64) else {
        return;
    };
    let d = scratch("ends_pressure");
    build(&d, "file_thrash.c", "file_thrash", &[]);
    write_uncached_file(&d.join("big"), 256);
    let out = cg.igprof(&d, "-mp -o prof.gz ./file_thrash big 6");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("memory pressure ("))
        .collect();
    assert_eq!(lines.len(), 1, "one snapshot for the episode: {err}");
    assert!(
        lines[0].contains("tasks stalled on memory") && lines[0].contains("wrote a snapshot to"),
        "{}",
        lines[0]
    );
    let prof = parse_strict(&read_text(&d.join("prof.gz"))).unwrap();
    assert_eq!(under(&prof, "MEM_LIVE", "keep_block"), (1, 1 << 20));
    // The final profile replaced the snapshot, and is no snapshot.
    assert!(
        !prof.notes.iter().any(|n| n.starts_with("snapshot")),
        "{:?}",
        prof.notes
    );
}

/// The sum of a counter's values over every node.
fn total_value(p: &Profile, counter: &str) -> u64 {
    p.nodes
        .iter()
        .flat_map(|n| n.values.iter())
        .filter(|v| v.counter == counter)
        .map(|v| v.value)
        .sum()
}

/// Each failed exec's new keeper takes the stack of the one before, which
/// exited when told the image ended: a hundred failed execs mapped a
/// hundred 8 MiB stacks (843 MB of address space, which a program under
/// `ulimit -v` runs out of: pyenv's shims under 100 MB could no longer
/// write their profiles).
#[test]
fn a_hundred_failed_execs_keep_no_stack_behind() {
    let d = scratch("ends_exec_stacks");
    build(&d, "exec_fails.c", "exec_fails", &[]);
    let vm = |o: &std::process::Output| -> u64 {
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
    };
    let plain = Command::new(d.join("exec_fails"))
        .arg("100")
        .output()
        .unwrap();
    let got = igprof_command(&d, &["-pp", "-o", "p.gz", "./exec_fails", "100"])
        .output()
        .unwrap();
    let err = ok(&got);
    let (bare, profiled) = (vm(&plain), vm(&got));
    assert!(
        profiled < bare + (64 << 10),
        "VmSize {profiled} kB profiled, {bare} kB bare: {err}"
    );
    parse_strict(&read_text(&d.join("p.gz"))).unwrap();
}

/// An exec that fails (execvp trying each PATH directory) starts one new
/// keeper for the image that goes on, and every keeper is gone once the
/// process has exec'd and ended: no keeper writes a profile for an image
/// that wrote its own. Two keepers of one image shared one stack, and the
/// one left asleep later woke on a stack the other had overwritten.
#[test]
fn failed_execs_leave_one_keeper_each_and_none_behind() {
    let d = scratch("ends_failed_exec");
    let path = format!(
        "{}/no-such-dir-a:{}/no-such-dir-b:/usr/bin:/bin",
        d.display(),
        d.display()
    );
    let out = igprof_command(&d, &["-d", "-pp", "env", "true"])
        .env("PATH", &path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let keepers = keeper_pids(&err);
    // env's keeper, one after each of its two failed execs, true's.
    assert_eq!(keepers.len(), 4, "{err}");
    assert_keepers_gone(&keepers, Duration::from_secs(20));
    let ps = profiles(&d);
    assert_eq!(ps.len(), 2, "env's and true's: {ps:?}");
    for p in &ps {
        parse_strict(&read_text(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

/// `--snapshot-above SIZE` where no cgroup limit is set: a process whose
/// RSS rises above SIZE gets one snapshot (one line says so), with the
/// growing site on top, while it still runs.
#[test]
fn a_snapshot_is_written_when_the_rss_rises_above_the_threshold() {
    let d = setup("ends_snapshot_above");
    let err_path = d.join("stderr.txt");
    let mut child = igprof_command(
        &d,
        &[
            "-mp",
            "--snapshot-above",
            "64M",
            "-o",
            "prof.gz",
            "./kill_mid",
            "growto",
            "100",
        ],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::fs::File::create(&err_path).unwrap())
    .spawn()
    .unwrap();
    let line = "above --snapshot-above 64.0 MiB: wrote a snapshot";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let err = loop {
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        if err.contains(line) || std::time::Instant::now() > deadline {
            break err;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The snapshot, read while the process waits after its growth; its
    // journal beside it.
    let snapshot = read_text(&d.join("prof.gz"));
    let journal = d.join("prof.gz.journal");
    let journal_there = journal.exists();
    let _ = child.kill();
    let _ = child.wait();
    // The keeper's final profile replaces the snapshot and removes the
    // journal.
    let deadline = Instant::now() + Duration::from_secs(60);
    while journal.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(journal_there, "no journal after the snapshot: {err}");
    assert!(!journal.exists(), "the final profile left the journal");
    let last = parse_strict(&read_text(&d.join("prof.gz"))).unwrap();
    assert!(
        last.notes.iter().all(|n| !n.starts_with("snapshot")),
        "{:?}",
        last.notes
    );
    // Killed while it may still grow: at least the snapshot's blocks.
    let (at_snapshot, _) = under(&parse_strict(&snapshot).unwrap(), "MEM_LIVE", "grow_alloc");
    let at_end = under(&last, "MEM_LIVE", "grow_alloc").0;
    assert!(
        (at_snapshot..=100).contains(&at_end),
        "{at_end} blocks at the end, {at_snapshot} in the snapshot"
    );
    assert_eq!(err.matches(line).count(), 1, "{err}");
    let prof = parse_strict(&snapshot).unwrap();
    let (blocks, bytes) = under(&prof, "MEM_LIVE", "grow_alloc");
    // Taken as the RSS passed 64 MiB (the watch looks every 50 ms): at
    // least 48 of the 100 blocks, and the growing site on top.
    assert!(
        (48..=100).contains(&blocks),
        "{blocks} blocks of 1 MiB in the snapshot"
    );
    assert_eq!(bytes, blocks << 20);
    assert!(
        bytes * 10 >= total_value(&prof, "MEM_LIVE") * 9,
        "grow_alloc on top"
    );
}

/// What the OOM killer does, by hand: the program and its keeper both
/// killed with SIGKILL (the keeper first, so that no final profile is
/// written), after a snapshot asked for by `--snapshot-above` and then
/// 0.5 s of CPU in `burn`, 5 descriptors opened at `open_after`, 100
/// blocks of 1 MiB more, and a fork child's 7 blocks and 0.1 s of CPU (in
/// the child's own profile only). The journal holds all of the parent's:
/// the report has the burn's PERF ticks (its 0.5 s of CPU within a
/// sampling tolerance), the 5 descriptors and all 164 blocks, where the
/// snapshot alone has at most 64 blocks and none of the rest.
#[test]
fn the_journal_holds_ticks_descriptors_and_blocks_when_the_keeper_dies_too() {
    let d = setup("ends_journal_all");
    let (path, err) = kill_with_keeper_after_growspin(&d, &["-pp", "-mp", "-fd"]);
    let snapshot = parse_strict(&read_text(&path)).unwrap();
    // Taken as the RSS passed 32 MiB (the keeper looks every 50 ms), by
    // the growing thread itself: at most the first 64 blocks; or later,
    // on memory pressure (other tests' cgroups stall the whole machine,
    // whose pressure file a keeper watches on cgroup v1).
    let (in_snapshot, _) = under(&snapshot, "MEM_LIVE", "grow_alloc");
    let pressure = snapshot
        .notes
        .iter()
        .any(|n| n.starts_with("snapshot on memory pressure"));
    assert!(
        (16..=64).contains(&in_snapshot) || pressure,
        "{in_snapshot} blocks: {:?}",
        snapshot.notes
    );
    assert_eq!(folded_blocks(&path, "MEM_LIVE", 1 << 20), 164, "{err}");
    assert_eq!(folded_value(&path, "FD_LIVE", "open_after"), 5);
    // A copy of the two files elsewhere (a batch job's results fetched
    // from its node) reads the same.
    let copy = scratch("ends_journal_copy");
    std::fs::copy(&path, copy.join("p.gz")).unwrap();
    std::fs::copy(d.join("prof.gz.journal"), copy.join("p.gz.journal")).unwrap();
    assert_eq!(folded_blocks(&copy.join("p.gz"), "MEM_LIVE", 1 << 20), 164);
    // As a kill between the snapshot's rename and its journal's leaves
    // them: the journal still under its temporary name, beside the one of
    // the snapshot before (another size in its header's fifth word).
    let journal = std::fs::read(d.join("prof.gz.journal")).unwrap();
    let mut before = journal.clone();
    let size = u64::from_le_bytes(before[32..40].try_into().unwrap());
    before[32..40].copy_from_slice(&(size + 1).to_le_bytes());
    std::fs::write(copy.join("p.gz.journal"), before).unwrap();
    std::fs::write(copy.join("p.gz.journal.tmp"), journal).unwrap();
    assert_eq!(folded_blocks(&copy.join("p.gz"), "MEM_LIVE", 1 << 20), 164);
    // The fork child's blocks are in its own profile, not in the
    // parent's journal.
    assert_eq!(folded_value(&path, "MEM_LIVE", "child_alloc"), 0);
    let child = child_profile(&d, &err);
    assert_eq!(folded_value(&child, "MEM_LIVE", "child_alloc"), 7 << 20);
}

/// The same with `-pp` alone (the memory profiler, which used to drop
/// the parent's journal in a fork child, not loaded): the child's samples
/// are in its own profile, not in the parent's journal.
#[test]
fn a_fork_child_writes_nothing_to_its_parents_journal() {
    let d = setup("ends_journal_pp");
    let (path, err) = kill_with_keeper_after_growspin(&d, &["-pp"]);
    assert_eq!(folded_value(&path, "PERF_TICKS", "child_burn"), 0, "{err}");
    let child = child_profile(&d, &err);
    assert!(folded_value(&child, "PERF_TICKS", "child_burn") > 0);
}

/// Runs kill_mid growspin under `igprof FLAGS --snapshot-above 32M -o
/// prof.gz` in `d`, kills it and its keeper with SIGKILL once it is
/// ready, and checks that the report of the snapshot with its journal has
/// the burn's 0.5 s of CPU in PERF ticks: (the profile's path, igprof's
/// stderr).
fn kill_with_keeper_after_growspin(d: &Path, flags: &[&str]) -> (PathBuf, String) {
    let mut args = flags.to_vec();
    args.extend([
        "--snapshot-above",
        "32M",
        "-o",
        "prof.gz",
        "./kill_mid",
        "growspin",
        "64",
        "prof.gz.journal",
    ]);
    let mut child = igprof_command(d, &args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut burned = None;
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(s) = line.strip_prefix("ready ") {
            burned = s.parse::<f64>().ok();
            break;
        }
    }
    let burned = burned.expect("the program said ready");
    // Its keeper: named igprof-keeper, with the program's command line
    // and directory (it shares the program's memory).
    let pid = child.id() as i32;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let here = d.canonicalize().unwrap();
    let keeper = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&k| {
            k != pid
                && std::fs::read_to_string(format!("/proc/{k}/comm"))
                    .is_ok_and(|c| c.trim() == "igprof-keeper")
                && std::fs::read(format!("/proc/{k}/cmdline")).is_ok_and(|c| c == cmdline)
                && std::fs::read_link(format!("/proc/{k}/cwd")).is_ok_and(|c| c == here)
                && std::fs::read_to_string(format!("/proc/{k}/status")).is_ok_and(|s| {
                    // Sharing the program's memory: its peak size.
                    s.lines().any(|l| l.starts_with("VmPeak:"))
                })
        })
        .expect("the program's keeper");
    // SAFETY: kill(2) on the test's own processes.
    unsafe {
        libc::kill(keeper, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let path = d.join("prof.gz");
    let snapshot = parse_strict(&read_text(&path)).unwrap();
    assert!(
        snapshot.notes.iter().any(|n| n.starts_with("snapshot")),
        "a final profile was written: {err}"
    );
    // PERF_TICKS are 5 ms each: the burn's 0.5 s of CPU, within the
    // sampling's tolerance.
    let ticks = folded_value(&path, "PERF_TICKS", "burn");
    let seconds = ticks as f64 * 0.005;
    assert!(
        seconds > burned * 0.7 && seconds < burned * 1.3,
        "{ticks} ticks in burn for {burned} s of CPU"
    );
    (path, err)
}

/// The fork child's profile in `d`, the one profile beside prof.gz and
/// its journal: the child's final profile left no journal of its own.
/// Files named `prof.gz.*` are the parent's: a snapshot on memory
/// pressure (a loaded machine) may be under way when the test kills the
/// parent and its keeper, leaving its temporary (`prof.gz.<16 hex>.tmp`,
/// `prof.gz.journal.tmp`), which nothing can remove after SIGKILL.
fn child_profile(d: &Path, err: &str) -> PathBuf {
    let all: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let names: Vec<&String> = all
        .iter()
        .filter(|n| n.starts_with("prof") && *n != "prof.gz" && !n.starts_with("prof.gz."))
        .collect();
    let [child] = names.as_slice() else {
        panic!("not one child profile among {all:?}: {err}")
    };
    assert!(!child.contains("journal"), "{names:?}");
    d.join(child)
}

/// The sum of `counter` over the folded stacks through `function` in
/// igprof-analyse's report of `path`.
fn folded_value(path: &Path, counter: &str, function: &str) -> u64 {
    let a = Command::new(analyser())
        .args(["-r", counter, "--folded", "-"])
        .arg(path)
        .output()
        .unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    String::from_utf8_lossy(&a.stdout)
        .lines()
        .filter(|l| l.split(';').any(|f| f.split(' ').next() == Some(function)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}
