//! The client API for custom pools (`igprof_alloc_event`,
//! `igprof_free_event`) from C through include/igprof.h and from Rust
//! through the igprof-client crate, and the heap-against-RSS note.
//!
//! A C arena (tests/programs/pool_arena.c) and a Rust one
//! (tests/programs/pool_arena.rs, built with rustc against client/ at test
//! time) report blocks at two sites: under -mp igprof-analyse shows exactly
//! the calls and bytes each site reported and what is live at exit, the
//! program's output and exit status are those of the unprofiled run, and
//! the program runs without the library at all (PIE and non-PIE). The
//! sampled mode with `--sample-bytes 1` (every block recorded, through the
//! sampler's path) gives the exact profile, and a coarser sample estimates
//! the blocks within its error. tests/programs/rss_mmap.c maps far more
//! than it mallocs: the header's note says so, consistently with the RSS
//! the program measured itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use igprof_tests::*;

/// Runs `./exe args` in `dir` without the profiler.
fn plain(dir: &Path, exe: &str, args: &[&str]) -> Output {
    Command::new(dir.join(exe))
        .args(args)
        .current_dir(dir)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

/// Runs `./exe args` under `igprof opts -o out`.
fn profiled(dir: &Path, opts: &[&str], exe: &str, args: &[&str], out: &str) -> Output {
    let prog = format!("./{exe}");
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", out, &prog]);
    a.extend(args);
    igprof(dir, &a)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The header's `-I` for include/igprof.h.
fn include_flag() -> String {
    format!("-I{}", root().join("include").display())
}

/// What a site of an arena reported: (calls, bytes) allocated and
/// (blocks, bytes) live at exit.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reported {
    total: (u64, u64),
    live: (u64, u64),
}

/// The C arena's sites for `nodes` and `names` (pool_arena.c's usage).
fn c_expected(nodes: u64, names: u64) -> [(&'static str, Reported); 2] {
    let freed_nodes = nodes.div_ceil(4);
    let name = |i: u64| 16 + (i * 37) % 200;
    let name_bytes: u64 = (0..names).map(name).sum();
    let freed_names: u64 = (0..names / 3).map(name).sum();
    [
        (
            "site_nodes",
            Reported {
                total: (nodes, 48 * nodes),
                live: (nodes - freed_nodes, 48 * (nodes - freed_nodes)),
            },
        ),
        (
            "site_names",
            Reported {
                total: (names, name_bytes),
                live: (names - names / 3, name_bytes - freed_names),
            },
        ),
    ]
}

/// The Rust arena's sites (pool_arena.rs's usage).
fn rust_expected(nodes: u64, names: u64) -> [(&'static str, Reported); 2] {
    let kept = nodes - nodes.div_ceil(3);
    let names_bytes: u64 = (0..names).map(|i| 8 + (i * 13) % 100).sum();
    [
        (
            "pool_arena::make_nodes",
            Reported {
                total: (nodes, 40 * nodes),
                live: (kept, 40 * kept),
            },
        ),
        (
            "pool_arena::make_names",
            Reported {
                total: (names, names_bytes),
                live: (names, names_bytes),
            },
        ),
    ]
}

/// The program's own account of a site: "`what` C calls B bytes, L live
/// LB bytes".
fn said(out: &str, what: &str) -> Reported {
    let l = out
        .lines()
        .find(|l| l.starts_with(&format!("{what} ")))
        .unwrap_or_else(|| panic!("no {what} line in {out}"));
    let n: Vec<u64> = l
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    Reported {
        total: (n[0], n[1]),
        live: (n[2], n[3]),
    }
}

/// Under `igprof-analyse`, each site's cumulative MEM_TOTAL and MEM_LIVE
/// (the arena's blocks, nothing else allocates below the sites) are
/// exactly what the program reported.
fn check_sites(d: &Path, profile: &str, want: &[(&str, Reported)], what: &str) {
    let total = flat_cumulative(d, "MEM_TOTAL", profile);
    let live = flat_cumulative(d, "MEM_LIVE", profile);
    for (site, r) in want {
        let t = flat_row(&total, site, what);
        assert_eq!(
            (t.calls, t.value),
            (Some(r.total.0), r.total.1),
            "{what}: {site} MEM_TOTAL"
        );
        let l = flat_row(&live, site, what);
        assert_eq!(
            (l.calls, l.value),
            (Some(r.live.0), r.live.1),
            "{what}: {site} MEM_LIVE at exit"
        );
    }
}

/// Unprofiled and profiled runs agree on stdout and exit status; the
/// unprofiled one says the profiler is absent (`enable -1` on stderr), the
/// profiled one that it is there.
fn same_as_unprofiled(plain: &Output, prof: &Output, what: &str) -> String {
    let out = text(&plain.stdout);
    assert!(
        plain.status.success(),
        "{what} unprofiled: {}",
        text(&plain.stderr)
    );
    assert!(
        text(&plain.stderr).contains("enable -1"),
        "{what}: {}",
        text(&plain.stderr)
    );
    let err = ok(prof);
    assert_eq!(
        text(&prof.stdout),
        out,
        "{what}: output changed under the profiler"
    );
    assert_eq!(prof.status.code(), plain.status.code(), "{what}");
    assert!(
        err.contains("enable 1"),
        "{what}: the profiler was not reached: {err}"
    );
    out
}

/// The undefined references the header leaves in `exe`: its igprof_*
/// dynamic symbols (all weak and undefined), and whether it imports dlsym.
fn header_imports(exe: &Path) -> (BTreeMap<String, (bool, bool)>, bool) {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let mut igprof = BTreeMap::new();
    let mut dlsym = false;
    for s in f.dynamic_symbols() {
        let name = s.name().unwrap_or("");
        if name.starts_with("igprof_") {
            igprof.insert(name.to_string(), (s.is_weak(), s.is_undefined()));
        }
        dlsym |= name == "dlsym";
    }
    (igprof, dlsym)
}

/// Builds pool_arena.c in `d` as `pool_pie` and `pool_nopie` (for the
/// other architecture when `foreign`), and checks what the header left in
/// each: weak undefined igprof_* symbols and no dlsym.
fn build_arenas(d: &Path, foreign: bool) -> [&'static str; 2] {
    let inc = include_flag();
    let exes = [
        ("pool_pie", ["-fPIE", "-pie"]),
        ("pool_nopie", ["-fno-pic", "-no-pie"]),
    ];
    for (exe, pic) in exes {
        let flags = [inc.as_str(), pic[0], pic[1]];
        if foreign {
            cross_build(d, "pool_arena.c", exe, &flags);
        } else {
            build(d, "pool_arena.c", exe, &flags);
        }
        let (syms, dlsym) = header_imports(&d.join(exe));
        assert!(!dlsym, "{exe}: the header made the program import dlsym");
        for name in ["igprof_alloc_event", "igprof_free_event", "igprof_enable"] {
            assert_eq!(
                syms.get(name),
                Some(&(true, true)),
                "{exe}: {name} (weak, undefined) in {syms:?}"
            );
        }
    }
    exes.map(|(exe, _)| exe)
}

#[test]
fn a_c_arena_reports_exact_blocks_pie_and_non_pie() {
    let d = scratch("pool-c");
    let (nodes, names) = (1000u64, 300u64);
    let args = ["1000", "300"];
    for exe in build_arenas(&d, false) {
        let p = plain(&d, exe, &args);
        let prof_name = format!("{exe}.gz");
        let pr = profiled(&d, &["-mp"], exe, &args, &prof_name);
        let out = same_as_unprofiled(&p, &pr, exe);
        let want = c_expected(nodes, names);
        for (site, r) in &want {
            let what = site.strip_prefix("site_").unwrap();
            assert_eq!(
                said(&out, what),
                *r,
                "{exe}: the program's own count of {site}"
            );
        }
        check_sites(&d, &prof_name, &want, exe);
        // Every block is in arena_alloc, which calls igprof_alloc_event.
        let total = flat_cumulative(&d, "MEM_TOTAL", &prof_name);
        let all = flat_row(&total, "arena_alloc", exe);
        let sum = want
            .iter()
            .fold((0, 0), |a, (_, r)| (a.0 + r.total.0, a.1 + r.total.1));
        assert_eq!(
            (all.calls, all.value),
            (Some(sum.0), sum.1),
            "{exe}: arena_alloc"
        );
    }
    // -mo include: a pool block counts the size given (the allocator
    // knows nothing of it), not a usable size read from inside the slab.
    let pr = profiled(
        &d,
        &["-mp", "-mo", "include"],
        "pool_pie",
        &args,
        "include.gz",
    );
    ok(&pr);
    check_sites(&d, "include.gz", &c_expected(nodes, names), "-mo include");
    // Without -mp the calls do nothing (and the program runs unchanged).
    let p = plain(&d, "pool_pie", &args);
    let pr = profiled(&d, &["-fd"], "pool_pie", &args, "fd.gz");
    same_as_unprofiled(&p, &pr, "-fd");
    let prof = parse_strict(&read_text(&d.join("fd.gz"))).unwrap();
    assert!(
        prof.nodes
            .iter()
            .all(|n| n.values.iter().all(|v| !v.counter.starts_with("MEM_"))),
        "-fd recorded memory"
    );
}

#[test]
fn a_rust_arena_reports_exact_blocks_through_the_crate() {
    let d = scratch("pool-rust");
    let rlib = d.join("libigprof_client.rlib");
    let rustc = |args: &[&str]| {
        let st = Command::new("rustc")
            .args(["--edition", "2021", "-O"])
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("rustc: {e}"));
        assert!(st.success(), "rustc {args:?} failed");
    };
    let client = root().join("client/src/lib.rs");
    rustc(&[
        "--crate-type",
        "rlib",
        "--crate-name",
        "igprof_client",
        "-o",
        rlib.to_str().unwrap(),
        client.to_str().unwrap(),
    ]);
    let exe = d.join("pool_arena_rs");
    let extern_arg = format!("igprof_client={}", rlib.display());
    let src = root().join("tests/programs/pool_arena.rs");
    rustc(&[
        "-g",
        "--extern",
        &extern_arg,
        "-o",
        exe.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let (nodes, names) = (600u64, 200u64);
    let args = ["600", "200"];
    let p = plain(&d, "pool_arena_rs", &args);
    let pr = profiled(&d, &["-mp"], "pool_arena_rs", &args, "rs.gz");
    let out = same_as_unprofiled(&p, &pr, "rust");
    let want = rust_expected(nodes, names);
    for (site, r) in &want {
        let what = site.strip_prefix("pool_arena::make_").unwrap();
        assert_eq!(said(&out, what), *r, "the program's own count of {site}");
    }
    check_sites(&d, "rs.gz", &want, "rust");
}

#[test]
fn sampled_pool_blocks() {
    let d = scratch("pool-sampled");
    build(&d, "pool_arena.c", "pool", &[&include_flag()]);
    // --sample-bytes 1 records every block through the sampler's path:
    // the exact profile.
    let args = ["1000", "300"];
    let pr = profiled(&d, &["-mp", "--sample-bytes", "1"], "pool", &args, "one.gz");
    ok(&pr);
    check_sites(&d, "one.gz", &c_expected(1000, 300), "--sample-bytes 1");
    // A real sample: 40,000 blocks of 48 bytes at one in 256 bytes records
    // about 17% of them (q = 1 - (255/256)^48), each standing for 1/q:
    // the estimates of the calls and bytes are within 5 standard errors (2.2% here).
    let args = ["40000", "0"];
    let pr = profiled(&d, &["-mp", "--sample-bytes", "256"], "pool", &args, "s.gz");
    ok(&pr);
    let total = flat_cumulative(&d, "MEM_TOTAL", "s.gz");
    let r = flat_row(&total, "site_nodes", "--sample-bytes 256");
    let q = 1.0 - (255.0f64 / 256.0).powi(48);
    let se = ((1.0 - q) / (40_000.0 * q)).sqrt();
    let calls = r.calls.unwrap() as f64;
    assert!(
        (calls / 40_000.0 - 1.0).abs() <= 5.0 * se,
        "site_nodes estimated {calls} calls of 40000 (se {se:.4})"
    );
    let bytes = r.value as f64;
    assert!(
        (bytes / (48.0 * 40_000.0) - 1.0).abs() <= 5.0 * se,
        "site_nodes estimated {bytes} bytes of 1920000 (se {se:.4})"
    );
}

/// The note `peak RSS A, peak live heap explained B = C% of it` of
/// `prof`'s header: (A, B, C) with A and B in bytes (to the precision the
/// note gives).
fn rss_note(prof: &Profile) -> Option<(f64, f64, f64)> {
    let n = prof.notes.iter().find(|n| n.starts_with("peak RSS "))?;
    let bytes = |s: &str| -> f64 {
        let (v, unit) = s.trim().split_once(' ').unwrap();
        let v: f64 = v.parse().unwrap();
        match unit {
            "KiB" => v * 1024.0,
            "MiB" => v * 1048576.0,
            _ => panic!("unit {unit} in {n}"),
        }
    };
    let rest = n.strip_prefix("peak RSS ").unwrap();
    let (rss, rest) = rest.split_once(", peak live heap explained ").unwrap();
    let (heap, pct) = rest.split_once(" = ").unwrap();
    let pct: f64 = pct.strip_suffix("% of it").unwrap().parse().unwrap();
    Some((bytes(rss), bytes(heap), pct))
}

#[test]
fn the_header_says_how_much_of_the_rss_the_heap_explains() {
    let d = scratch("pool-rss");
    build(&d, "rss_mmap.c", "rss_mmap", &[]);
    // 4 MiB malloc'd, 96 MiB mmap'd, all touched.
    let o = profiled(&d, &["-mp", "-d"], "rss_mmap", &["4", "96"], "rss.gz");
    let err = ok(&o);
    let out = text(&o.stdout);
    let measured: f64 = out
        .trim()
        .strip_prefix("maxrss ")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let measured = measured * 1024.0;
    let prof = parse_strict(&read_text(&d.join("rss.gz"))).unwrap();
    let (rss, heap, pct) =
        rss_note(&prof).unwrap_or_else(|| panic!("no RSS note in {:?}", prof.notes));
    let mib = 1048576.0;
    // The note is read at the dump, after the program's own reading.
    assert!(
        rss + 0.05 * mib >= measured,
        "note's RSS {rss} below the program's {measured}"
    );
    assert!(
        rss >= 100.0 * mib,
        "RSS {rss}: the 100 MiB touched are resident"
    );
    // The heap's peak: the 4 MiB block and stdio's buffer.
    assert!(
        (4.0 * mib..=4.1 * mib).contains(&heap),
        "heap explained {heap}"
    );
    let ratio = 100.0 * heap / rss;
    assert!(
        (pct - ratio).abs() <= 0.1,
        "{pct}% against {heap} / {rss} = {ratio}"
    );
    assert!(pct < 5.0, "most of the memory is outside the heap: {pct}%");
    assert!(
        err.lines()
            .any(|l| l.starts_with("igprof: memory: peak RSS ")),
        "-d says it too: {err}"
    );
    // Without -mp there is no such note.
    let o = profiled(&d, &["-fd"], "rss_mmap", &["1", "1"], "fd.gz");
    ok(&o);
    let prof = parse_strict(&read_text(&d.join("fd.gz"))).unwrap();
    assert!(rss_note(&prof).is_none(), "{:?}", prof.notes);
}

/// The header on the other architecture (its own way of reading the
/// address from the GOT): the C arena built by the cross compiler, PIE and
/// non-PIE, under qemu-user with that architecture's library.
#[test]
fn a_c_arena_of_the_other_architecture_reports_exact_blocks() {
    let d = scratch("pool-foreign");
    let args = ["500", "120"];
    for exe in build_arenas(&d, true) {
        let prof_name = format!("{exe}.gz");
        let prog = format!("./{exe}");
        let mut a = vec!["-mp", "-o", &prof_name, &prog];
        a.extend(args);
        let o = foreign_igprof(&d, &a);
        let err = ok(&o);
        assert!(
            err.contains("enable 1"),
            "{exe}: the profiler was not reached: {err}"
        );
        check_sites(&d, &prof_name, &c_expected(500, 120), exe);
    }
}
