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
    let d = scratch(name);
    let exe = src.rsplit_once('.').unwrap().0;
    build(&d, src, exe, &[]);
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", "prof.gz"]);
    let exe_arg = format!("./{exe}");
    a.push(&exe_arg);
    a.extend(args);
    let o = igprof(&d, &a);
    let err = ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let p = load(&d.join("prof.gz"));
    (d, out, err, p)
}

/// Parses one profile strictly.
pub fn load(path: &Path) -> Profile {
    parse_strict(&read_text(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
