//! Shared helpers of the memory and descriptor end-to-end tests
//! (tests/tests/mem_*.rs, fd_*.rs): run a program under one igprof option
//! set, parse the profile strictly, and sum a counter per function name.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use igprof_tests::*;

/// A counter summed over every node named `name` (self values, as the
/// hooks charge the function that called malloc/open...).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Site {
    pub calls: u64,
    pub bytes: u64,
    /// Largest per-node peak (per-stack peak for *_LIVE).
    pub peak: u64,
    /// Largest per-node value (MEM_MAX).
    pub max_value: u64,
    pub leaks: Vec<(u64, u64)>,
}

/// Per function name: the counter's self values.
pub fn sites(p: &Profile, counter: &str) -> BTreeMap<String, Site> {
    let mut namer = Namer::new();
    let mut m: BTreeMap<String, Site> = BTreeMap::new();
    for (i, n) in p.nodes.iter().enumerate() {
        for v in n.values.iter().filter(|v| v.counter == counter) {
            let s = m.entry(namer.name(p, i)).or_default();
            s.calls += v.ticks;
            s.bytes += v.value;
            s.peak = s.peak.max(v.peak);
            s.max_value = s.max_value.max(v.value);
            s.leaks.extend(v.leaks.iter().copied());
        }
    }
    m
}

/// The site of `name` (an empty one when the counter never touched it).
pub fn site(m: &BTreeMap<String, Site>, name: &str) -> Site {
    m.get(name).cloned().unwrap_or_default()
}

/// Builds `src` in a scratch dir named `name` and runs it under igprof with
/// `opts`, output into `prof.gz`; returns (dir, stdout, stderr, profile).
pub fn run(
    name: &str,
    src: &str,
    opts: &[&str],
    args: &[&str],
) -> (PathBuf, String, String, Profile) {
    run_on(false, name, src, opts, args)
}

/// As [`run`], for a build of [`foreign_arch`] under qemu-user.
pub fn run_foreign(
    name: &str,
    src: &str,
    opts: &[&str],
    args: &[&str],
) -> (PathBuf, String, String, Profile) {
    run_on(true, name, src, opts, args)
}

fn run_on(
    foreign: bool,
    name: &str,
    src: &str,
    opts: &[&str],
    args: &[&str],
) -> (PathBuf, String, String, Profile) {
    let d = scratch(name);
    let exe = src.rsplit_once('.').unwrap().0;
    if foreign {
        cross_build(&d, src, exe, &[]);
    } else {
        build(&d, src, exe, &[]);
    }
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", "prof.gz"]);
    let exe_arg = format!("./{exe}");
    a.push(&exe_arg);
    a.extend(args);
    let o = if foreign {
        foreign_igprof(&d, &a)
    } else {
        igprof(&d, &a)
    };
    let err = ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let p = load(&d.join("prof.gz"));
    (d, out, err, p)
}

/// Parses one profile strictly.
pub fn load(path: &Path) -> Profile {
    parse_strict(&read_text(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Other allocators installed by scripts/setup (Debian's google-perftools
/// and libjemalloc2), by the name the profiler reports them under: the
/// ones present on this machine.
pub fn other_allocators() -> Vec<(&'static str, &'static str)> {
    [
        (
            "tcmalloc",
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        ),
        ("jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ]
    .into_iter()
    .filter(|(name, path)| {
        let there = cfg!(target_arch = "x86_64") && std::path::Path::new(path).exists();
        if !there {
            eprintln!("{name} ({path}) not installed: not checked");
        }
        there
    })
    .collect()
}

/// No function of profile `p` is in libigprof.so: the profiler's frames
/// are left out of every stack (`what` names the run in the message).
pub fn assert_no_profiler_frames(p: &Profile, what: &str) {
    for f in p.funcs.values() {
        assert!(
            !f.file.ends_with("libigprof.so"),
            "{what}: a profiler frame in the profile: {} in {}",
            f.name,
            f.file
        );
    }
}

// ---- Checks shared by the host tests and their foreign-architecture
// ---- twins (tests/tests/foreign_arch.rs).

/// mem_handoff with `m` rounds under -mp: 8 producers' blocks, all freed
/// by consumers on other threads, charged to `produce` exactly.
pub fn check_handoff(out: &str, p: &Profile, m: u64) {
    assert!(out.contains(&format!("handoff done {m}")), "{out}");
    let total = sites(p, "MEM_TOTAL");
    let s = site(&total, "produce");
    let bytes: u64 = (0..8).map(|k| m * 16 * (k + 1)).sum();
    assert_eq!(
        (s.calls, s.bytes),
        (8 * m, bytes),
        "produce MEM_TOTAL over 8 threads"
    );
    let l = site(&sites(p, "MEM_LIVE"), "produce");
    assert_eq!(
        (l.calls, l.bytes, l.leaks.len()),
        (0, 0, 0),
        "every handed-off block was freed"
    );
    assert!(l.peak >= 16, "per-stack peak recorded: {l:?}");
}

/// fd_churn with `n` rounds under -fd: exact FD_USED per creating function
/// and the three descriptors left open at exit.
pub fn check_fd_churn(out: &str, p: &Profile, n: u64) {
    assert!(out.contains(&format!("fd done {n}")), "{out}");
    let used = sites(p, "FD_USED");
    let live = sites(p, "FD_LIVE");
    assert_eq!(site(&used, "fd_open_close").calls, n);
    assert_eq!(
        site(&used, "fd_dup").calls,
        n + 1,
        "n dups and the open they dup"
    );
    assert_eq!(
        site(&used, "fd_pipe").calls,
        2 * n,
        "pipe makes two descriptors"
    );
    assert_eq!(site(&used, "fd_socket").calls, n);
    assert_eq!(
        site(&used, "fd_fopen").calls,
        n,
        "fopen counted at its caller"
    );
    // fd_leak leaves an open, a dup and a socket (the socket call is a tail
    // call, so it is charged to main).
    let live_total: u64 = live.values().map(|s| s.bytes).sum();
    assert_eq!(live_total, 3, "FD_LIVE at exit: {live:?}");
    let leaked: usize = live.values().map(|s| s.leaks.len()).sum();
    assert_eq!(leaked, 3);
    assert_eq!(site(&live, "fd_leak").bytes + site(&live, "main").bytes, 3);
    for f in [
        "fd_open_close",
        "fd_dup",
        "fd_pipe",
        "fd_socket",
        "fd_fopen",
    ] {
        assert_eq!(site(&live, f).bytes, 0, "{f} closed everything");
    }
    assert!(live
        .values()
        .flat_map(|s| &s.leaks)
        .all(|&(fd, one)| fd >= 3 && one == 1));
}

/// fd_churn with `n` rounds under -pp -mp -fd: the three profilers' counts
/// in one profile.
pub fn check_fd_mem_cpu(out: &str, err: &str, p: &Profile, n: u64) {
    assert!(out.contains(&format!("fd done {n}")), "{out}");
    assert!(
        err.contains("memory") && err.contains("file descriptors"),
        "start-up line: {err}"
    );
    assert_eq!(site(&sites(p, "FD_USED"), "fd_pipe").calls, 2 * n);
    // fopen allocates its FILE inside libc: count everything under fd_fopen.
    let under = |counter: &str| -> u64 {
        paths(p, counter)
            .iter()
            .filter(|(path, _)| path.iter().any(|f| f == "fd_fopen"))
            .map(|x| x.1)
            .sum()
    };
    assert_eq!(under("MEM_TOTAL"), n, "one FILE per fopen");
    assert_eq!(under("MEM_LIVE"), 0, "every FILE freed by fclose");
    assert!(
        total(p, "PERF_TICKS") > 0,
        "CPU samples in the same profile"
    );
}

/// How many times mem_signal's timer handler allocated (its "hits N" line).
pub fn signal_hits(out: &str) -> u64 {
    out.trim()
        .strip_prefix("hits ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no hit count in {out}"))
}
