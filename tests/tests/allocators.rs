//! Memory profiles of allocators other than glibc's malloc: Rust programs
//! built with the system allocator, mimalloc and jemalloc as their global
//! allocator (crates from the registry, built at test time), a C program
//! linked statically with Debian's libjemalloc.a and one linked with
//! libmimalloc. Each site's calls, bytes and live bytes are exact, and the
//! same whatever the allocator; the truth is what the programs print
//! about themselves.

mod mem_support;
use mem_support::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The Rust program tests/programs/rust_alloc built with `feature` (""
/// for the system allocator), in a target directory kept between runs.
fn rust_alloc(feature: &str) -> PathBuf {
    rust_alloc_for(feature, None)
}

/// As [`rust_alloc`], for target `triple` (None: the host).
///
/// Built once per test process for each allocator and target, under one
/// lock: the builds share `target/release/rust_alloc`, which another
/// test's build would otherwise overwrite between this build and its
/// copy, and a copy written over a binary another test is running fails
/// with ETXTBSY. The copy is renamed into place, never written there.
fn rust_alloc_for(feature: &str, triple: Option<&str>) -> PathBuf {
    static BUILT: Mutex<Vec<(String, Option<String>, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((.., exe)) = built
        .iter()
        .find(|(f, t, _)| f == feature && t.as_deref() == triple)
    {
        return exe.clone();
    }
    let src = root().join("tests/programs/rust_alloc");
    let target = target_dir().join("test-programs/rust_alloc");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(&src)
        .args(["build", "--release", "--quiet", "--locked", "--target-dir"])
        .arg(&target);
    if let Some(t) = triple {
        c.args(["--target", t]);
    }
    if !feature.is_empty() {
        c.args(["--features", feature]);
    }
    let st = c.status().expect("run cargo");
    assert!(st.success(), "{c:?}: {st}");
    // One binary per allocator: the next build overwrites the name.
    let name = if feature.is_empty() {
        "system"
    } else {
        feature
    };
    let dir = match triple {
        Some(t) => target.join(t).join("release"),
        None => target.join("release"),
    };
    let exe = dir.join(format!("rust_alloc-{name}"));
    let part = dir.join(format!("rust_alloc-{name}.part"));
    std::fs::copy(dir.join("rust_alloc"), &part).unwrap();
    std::fs::rename(&part, &exe).unwrap();
    built.push((feature.to_string(), triple.map(str::to_string), exe.clone()));
    exe
}

/// One `site NAME CALLS BYTES LIVE_BLOCKS LIVE_BYTES` line of a program.
#[derive(Debug, PartialEq, Eq)]
struct Truth {
    name: String,
    calls: u64,
    bytes: u64,
    live_blocks: u64,
    live_bytes: u64,
}

fn truths(out: &str) -> Vec<Truth> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 6 && f[0] == "site").then(|| Truth {
                name: f[1].to_string(),
                calls: f[2].parse().unwrap(),
                bytes: f[3].parse().unwrap(),
                live_blocks: f[4].parse().unwrap(),
                live_bytes: f[5].parse().unwrap(),
            })
        })
        .collect()
}

/// Runs `exe` unprofiled, then under `igprof opts`, in `d`: the same
/// output and status, and the profile.
fn profile(d: &Path, exe: &Path, opts: &[&str]) -> (String, String, Profile) {
    profile_on(false, d, exe, opts)
}

/// As [`profile`], for a program of [`foreign_arch`] (under qemu-user) if
/// `foreign`.
fn profile_on(foreign: bool, d: &Path, exe: &Path, opts: &[&str]) -> (String, String, Profile) {
    let arch = foreign_arch().0;
    let plain = if foreign {
        Command::new(format!("qemu-{arch}"))
            .arg("-L")
            .arg(format!("/usr/{arch}-linux-gnu"))
            .arg(exe)
            .current_dir(d)
            .output()
            .unwrap()
    } else {
        // Just copied (see above): a child another test forks meanwhile
        // may hold the copy's descriptor until its exec (ETXTBSY).
        let mut tries = 0;
        loop {
            match Command::new(exe).current_dir(d).output() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r.unwrap(),
            }
        }
    };
    assert!(plain.status.success(), "{exe:?} unprofiled: {plain:?}");
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", "prof.gz"]);
    let e = exe.to_str().unwrap();
    a.push(e);
    let o = if foreign {
        foreign_igprof(d, &a)
    } else {
        igprof(d, &a)
    };
    let err = ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        out,
        String::from_utf8_lossy(&plain.stdout),
        "{e}: the same output"
    );
    (out, err, load(&d.join("prof.gz")))
}

/// Every site the program reports is exact in `p`: MEM_TOTAL calls and
/// bytes, MEM_LIVE blocks and bytes, counted at or below the site.
fn check_sites(what: &str, truth: &[Truth], p: &Profile) {
    assert!(!truth.is_empty(), "{what}: no site reported");
    for t in truth {
        assert_eq!(
            under(p, "MEM_TOTAL", &t.name),
            (t.calls, t.bytes),
            "{what}: {} MEM_TOTAL (calls, bytes)",
            t.name
        );
        assert_eq!(
            under(p, "MEM_LIVE", &t.name),
            (t.live_blocks, t.live_bytes),
            "{what}: {} MEM_LIVE (blocks, bytes)",
            t.name
        );
    }
}

#[test]
fn rust_global_allocators_are_exact_and_agree() {
    let d = scratch("rust-alloc");
    let mut first: Option<Vec<Truth>> = None;
    for feature in ["", "mimalloc", "jemalloc"] {
        let exe = rust_alloc(feature);
        let what = if feature.is_empty() {
            "system"
        } else {
            feature
        };
        let (out, _err, p) = profile(&d, &exe, &["-mp"]);
        let truth = truths(&out);
        check_sites(what, &truth, &p);
        // Sampled mode with every allocation sampled gives the same.
        let (_, _, s) = profile(&d, &exe, &["-mp", "--sample-bytes", "1"]);
        check_sites(&format!("{what} --sample-bytes 1"), &truth, &s);
        assert_no_profiler_frames(&p, what);
        // -pf -mp: the faults that fill the 4 MiB buffer in are charged
        // to the stack that allocated it, whichever allocator mapped it.
        let (_, _, f) = profile(&d, &exe, &["-pf", "-mp"]);
        assert!(
            under(&f, "MEM_FAULTS", "site_big").0 > 0,
            "{what}: no MEM_FAULTS under site_big"
        );
        match &first {
            None => first = Some(truth),
            Some(f) => assert_eq!(f, &truth, "{what}: the same sites as the system allocator"),
        }
    }
}

/// The same on the other architecture, under qemu-user: the system
/// allocator and mimalloc (its C sources cross-compiled by the crate).
#[test]
fn rust_global_allocators_on_the_other_architecture() {
    let d = scratch("rust-alloc-foreign");
    let triple = format!("{}-unknown-linux-gnu", foreign_arch().0);
    let mut first: Option<Vec<Truth>> = None;
    for feature in ["", "mimalloc"] {
        let exe = rust_alloc_for(feature, Some(&triple));
        let what = format!(
            "{triple} {}",
            if feature.is_empty() {
                "system"
            } else {
                feature
            }
        );
        let (out, _err, p) = profile_on(true, &d, &exe, &["-mp"]);
        let truth = truths(&out);
        check_sites(&what, &truth, &p);
        match &first {
            None => first = Some(truth),
            Some(f) => assert_eq!(f, &truth, "{what}: the same sites as the system allocator"),
        }
    }
}

/// A C program of tests/programs built in `d` with `flags` (before the
/// source), run unprofiled and under `opts`: every site it reports exact.
/// Built with -fno-builtin: GCC removes an allocation it sees freed
/// unused, which the program's report would not know.
fn c_program_is_exact(name: &str, src: &str, flags: &[&str], opts: &[&str]) -> String {
    let d = scratch(name);
    let mut f = vec!["-fno-builtin"];
    f.extend(flags);
    let exe = build(&d, src, name, &f);
    let (out, err, p) = profile(&d, &exe, opts);
    check_sites(name, &truths(&out), &p);
    assert_no_profiler_frames(&p, name);
    err
}

#[test]
fn jemalloc_linked_statically_is_exact() {
    let lib = "/usr/lib/x86_64-linux-gnu/libjemalloc.a";
    if !cfg!(target_arch = "x86_64") || !Path::new(lib).exists() {
        panic!("{lib} is missing: scripts/setup installs libjemalloc-dev");
    }
    let flags = [
        "-Wl,--whole-archive",
        lib,
        "-Wl,--no-whole-archive",
        "-lm",
        "-lstdc++",
    ];
    let err = c_program_is_exact("jemalloc_static", "jemalloc_static.c", &flags, &["-mp"]);
    assert!(
        err.contains("the program's allocator is") && err.contains("jemalloc_static"),
        "{err}"
    );
    c_program_is_exact(
        "jemalloc_static_sampled",
        "jemalloc_static.c",
        &flags,
        &["-mp", "--sample-bytes", "1"],
    );
}

#[test]
fn mimalloc_calls_count_once() {
    c_program_is_exact(
        "mimalloc_calls",
        "mimalloc_calls.c",
        &["-Wl,--no-as-needed", "-lmimalloc"],
        &["-mp"],
    );
    c_program_is_exact(
        "mimalloc_calls_sampled",
        "mimalloc_calls.c",
        &["-Wl,--no-as-needed", "-lmimalloc"],
        &["-mp", "--sample-bytes", "1"],
    );
}

/// Runs `perf probe ARGS` (root only), panicking with its output on failure.
fn perf_probe(args: &[&str]) {
    let o = Command::new("perf")
        .arg("probe")
        .args(args)
        .output()
        .expect("run perf");
    assert!(o.status.success(), "perf probe {args:?}: {o:?}");
}

/// rustc, whose allocator is jemalloc linked into its executable and which
/// allocates from librustc_driver through Rust's allocator shims: the
/// profile holds at least 90% of the allocation calls that uprobes on the
/// executable's allocator entry points count in a run of the same
/// compilation (all of them, give or take those made before the profiler
/// starts and on threads it does not know).
#[test]
fn rustc_compiling_a_crate_is_seen() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: uprobes cannot be placed, rustc's count is not checked");
        return;
    }
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .unwrap();
    let rustc = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim()).join("bin/rustc");
    let d = scratch("rustc");
    let src = d.join("hello.rs");
    std::fs::write(
        &src,
        "fn main() { let v: Vec<String> = (0..10).map(|i| i.to_string()).collect(); println!(\"{v:?}\"); }\n",
    )
    .unwrap();
    // No link step: the linker would be a second profiled process.
    let args = ["-O", "--emit=obj", "hello.rs"];
    let tag = format!("igprof{}", std::process::id());
    let entries = [
        "malloc",
        "calloc",
        "realloc",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
    ];
    let r = rustc.to_str().unwrap();
    for f in entries {
        perf_probe(&["-q", "-x", r, "-a", &format!("{tag}_{f}={f}")]);
    }
    let events = format!("probe_rustc:{tag}_*");
    let stat = Command::new("perf")
        .args(["stat", "-x,", "-e", &events, r])
        .args(args)
        .current_dir(&d)
        .output()
        .unwrap();
    perf_probe(&["-q", "-d", &events]);
    assert!(stat.status.success(), "{stat:?}");
    let counted: u64 = String::from_utf8_lossy(&stat.stderr)
        .lines()
        .filter(|l| l.contains(&tag))
        .map(|l| l.split(',').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let o = igprof(&d, &["-mp", "-o", "prof.gz", r, args[0], args[1], args[2]]);
    ok(&o);
    let p = load(&d.join("prof.gz"));
    let calls = total(&p, "MEM_TOTAL");
    let share = calls as f64 / counted.max(1) as f64;
    eprintln!(
        "rustc: {calls} allocation calls in the profile, {counted} counted by uprobes ({:.1}%)",
        100.0 * share
    );
    assert!(counted > 10_000, "uprobes counted {counted}");
    assert!(
        (0.9..=1.01).contains(&share),
        "profile {calls} against uprobes {counted}"
    );
}

/// A stripped program whose allocator cannot be found gets one line
/// naming it and what is not seen; what reaches malloc is still exact.
/// (Frames of a stripped program have no names: the counts are compared
/// with a run of the same program unstripped.)
#[test]
fn stripped_allocators_are_named_in_one_line() {
    let d = scratch("stripped-alloc");
    let strip = |exe: &Path, name: &str| {
        let out = d.join(name);
        let st = Command::new("strip")
            .arg("-o")
            .arg(&out)
            .arg(exe)
            .status()
            .unwrap();
        assert!(st.success());
        out
    };
    let line = |err: &str, exe: &Path| {
        let l: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("no symbol table") && l.contains(exe.to_str().unwrap()))
            .collect();
        assert_eq!(l.len(), 1, "{err}");
        assert!(l[0].contains("are not seen"), "{}", l[0]);
    };
    // (calls in the unstripped run's profile, in the stripped run's,
    // what the program says it did).
    let both = |exe: &Path, name: &str| {
        let (_, err, full) = profile(&d, exe, &["-mp"]);
        assert!(!err.contains("no symbol table"), "{err}");
        let bare = strip(exe, name);
        let (out, err, p) = profile(&d, &bare, &["-mp"]);
        line(&err, &bare);
        (
            total(&full, "MEM_TOTAL"),
            total(&p, "MEM_TOTAL"),
            truths(&out),
        )
    };
    // Rust with mimalloc: no allocation through the global allocator
    // reaches malloc: the sites' and the few of Rust's runtime (its
    // stdout buffer, ...) are not seen.
    let (full, bare, truth) = both(&rust_alloc("mimalloc"), "rust_alloc_mimalloc_stripped");
    let sites: u64 = truth.iter().map(|t| t.calls).sum();
    assert!(
        (sites..sites + 10).contains(&(full - bare)),
        "unseen when stripped: every site's {sites} calls ({full} against {bare})"
    );
    // jemalloc linked statically: its exported names (malloc, calloc,
    // realloc, posix_memalign, aligned_alloc) are still seen; the calls of
    // the mallocx family are not.
    let je = build_jemalloc_static(&d);
    let (full, bare, truth) = both(&je, "jemalloc_static_stripped");
    let family: u64 = truth
        .iter()
        .filter(|t| t.name.contains("allocx") || t.name == "site_rallocx")
        .map(|t| t.calls)
        .sum();
    assert_eq!(
        family,
        500 + 100
            + 200
            + truth
                .iter()
                .find(|t| t.name == "site_xallocx")
                .unwrap()
                .calls
    );
    assert_eq!(
        full - bare,
        family,
        "unseen when stripped: the mallocx family ({full} against {bare})"
    );
}

/// An allocator loaded with dlopen after start-up is found then: its own
/// entry points (mimalloc's) are exact.
#[test]
fn an_allocator_loaded_later_is_found() {
    c_program_is_exact("dlopen_allocator", "dlopen_allocator.c", &[], &["-mp"]);
}
