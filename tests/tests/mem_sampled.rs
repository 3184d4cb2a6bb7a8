//! End-to-end checks of sampled memory profiling (`-mp --sample-bytes N`):
//! per-site estimates of calls and bytes against an exact `-mp` run of the
//! same program over ten seeds, live bytes at exit, the consistency of
//! every counter after frees (a free of an unsampled block must change
//! nothing, one of a sampled block must take back exactly what it added),
//! `--sample-bytes 1` giving the exact profile, reproducibility of a seed,
//! frees on other threads, the header, and the refusal of bad values.
//!
//! Statistics. A site that allocates B bytes in blocks much smaller than N
//! has a standard error of about sqrt(N / B) in both its bytes and its
//! calls (its samples are a Poisson count of mean B / N). The test computes
//! each site's exact standard errors from the sizes the program allocates
//! (tests/programs/sample_sites.c) and holds every site of at least 64 MiB
//! to the issue's 5% when 5% is at least 4.5 standard errors there, and to
//! 4.5 standard errors otherwise (site_small: 64 MiB of 32-byte blocks has
//! a standard error of 8.8% at N = 512 KiB, so 5% would fail for about
//! half of all seeds). The seeds are fixed (1..10), so a run is
//! reproducible; 4.5 standard errors keeps the chance that some other seed
//! list fails below 1 in 10,000.

mod mem_support;
use mem_support::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const N: u64 = 512 * 1024;
const SEEDS: std::ops::RangeInclusive<u64> = 1..=10;
const Z: f64 = 4.5;
const MIB: u64 = 1024 * 1024;

/// Every allocation call of sample_sites.c (scale 1), per site: the
/// requested sizes, in the program's order.
fn program_sizes() -> BTreeMap<&'static str, Vec<u64>> {
    let mut m: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    m.insert(
        "site_mixed",
        (0..1_500_000u64)
            .map(|i| 1024 + (i * 7919) % 7168)
            .collect(),
    );
    m.insert(
        "site_calloc",
        (0..20_000u64).map(|i| (32 + i % 64) * 4096).collect(),
    );
    m.insert(
        "site_realloc",
        (0..600_000u64)
            .flat_map(|i| [6144 + i % 2048, 2048 + (i * 13) % 2048])
            .collect(),
    );
    m.insert(
        "site_align",
        (0..800_000u64).map(|i| 4096 + (i * 7) % 4096).collect(),
    );
    m.insert(
        "site_big",
        (0..500u64).map(|i| MIB + (i * 37 % 16) * MIB).collect(),
    );
    m.insert("site_small", vec![32; 2_097_152]);
    m.insert("site_leak_big", vec![MIB; 1600]);
    m.insert("site_leak_small", vec![100; 100_000]);
    m
}

/// Probability that an allocation of `s` bytes is recorded.
fn q(s: u64) -> f64 {
    1.0 - (1.0 - 1.0 / N as f64).powf(s.max(1) as f64)
}

/// Standard errors of the (calls, bytes) estimates of allocations `sizes`:
/// each is recorded with probability q and then counts 1/q times.
fn std_errors(sizes: &[u64]) -> (f64, f64) {
    let (mut vc, mut vb) = (0.0, 0.0);
    for &s in sizes {
        let q = q(s);
        let r = (1.0 - q) / q;
        vc += r;
        vb += (s as f64) * (s as f64) * r;
    }
    (vc.sqrt(), vb.sqrt())
}

/// One program built once, run many times under igprof.
struct Bench {
    dir: PathBuf,
    exe: String,
    /// A library preloaded before the profiler (another allocator).
    preload: Option<&'static str>,
}

impl Bench {
    fn new(name: &str, src: &str) -> Self {
        let dir = scratch(name);
        let exe = src.rsplit_once('.').unwrap().0.to_string();
        let flags: &[&str] = if src.ends_with(".cpp") {
            &["-std=c++17"]
        } else {
            &[]
        };
        build(&dir, src, &exe, flags);
        Bench {
            dir,
            exe,
            preload: None,
        }
    }

    /// Runs the program under `opts` with `args`; returns its stdout and
    /// profile (written to `out`).
    fn run(&self, opts: &[&str], args: &[&str], out: &str) -> (String, Profile) {
        let exe = format!("./{}", self.exe);
        let mut a: Vec<&str> = opts.to_vec();
        a.extend(["-o", out, &exe]);
        a.extend(args);
        let o = match self.preload {
            None => igprof(&self.dir, &a),
            Some(lib_path) => std::process::Command::new(launcher())
                .args(&a)
                .current_dir(&self.dir)
                .env("IGPROF_LIB", lib())
                .env("LD_PRELOAD", lib_path)
                .output()
                .unwrap(),
        };
        ok(&o);
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            load(&self.dir.join(out)),
        )
    }
}

/// Per counter, per function: the self values (one naming pass).
fn all_sites(p: &Profile) -> BTreeMap<String, BTreeMap<String, Site>> {
    let mut namer = Namer::new();
    let mut m: BTreeMap<String, BTreeMap<String, Site>> = BTreeMap::new();
    for (i, n) in p.nodes.iter().enumerate() {
        if n.values.is_empty() {
            continue;
        }
        let name = namer.name(p, i);
        for v in &n.values {
            let s = m
                .entry(v.counter.clone())
                .or_default()
                .entry(name.clone())
                .or_default();
            s.calls += v.ticks;
            s.bytes += v.value;
            s.peak = s.peak.max(v.peak);
            s.max_value = s.max_value.max(v.value);
            s.leaks.extend(v.leaks.iter().copied());
        }
    }
    m
}

fn counter<'a>(
    m: &'a BTreeMap<String, BTreeMap<String, Site>>,
    c: &str,
) -> &'a BTreeMap<String, Site> {
    m.get(c).unwrap_or_else(|| panic!("no {c} in the profile"))
}

fn live_total(m: &BTreeMap<String, BTreeMap<String, Site>>) -> u64 {
    counter(m, "MEM_LIVE").values().map(|s| s.bytes).sum()
}

#[test]
fn sampled_sites_and_live_bytes_match_the_exact_profile_over_ten_seeds() {
    let b = Bench::new("sampled-sites", "sample_sites.c");
    let sizes = program_sizes();
    let (out, exact) = b.run(&["-mp"], &[], "exact.gz");
    assert!(out.contains("sites done 1"), "{out}");
    assert!(
        !exact.notes.iter().any(|n| n.contains("sampled")),
        "{:?}",
        exact.notes
    );
    let exact = all_sites(&exact);
    let et = counter(&exact, "MEM_TOTAL");
    // The exact profile is the reference: check it against the program.
    for (f, s) in &sizes {
        let e = site(et, f);
        assert_eq!(
            (e.calls, e.bytes),
            (s.len() as u64, s.iter().sum::<u64>()),
            "{f}: exact -mp against the program's own sizes"
        );
    }
    let exact_live = live_total(&exact);
    let leaked: u64 = sizes["site_leak_big"]
        .iter()
        .chain(&sizes["site_leak_small"])
        .sum();
    assert!(
        exact_live >= leaked && exact_live < leaked + MIB,
        "{exact_live}"
    );

    // Which bound each site is held to.
    let mut bounds: BTreeMap<&str, (f64, f64, bool)> = BTreeMap::new();
    for (f, s) in &sizes {
        let bytes: u64 = s.iter().sum();
        if bytes < 64 * MIB {
            continue;
        }
        let (se_c, se_b) = std_errors(s);
        let (rc, rb) = (se_c / s.len() as f64, se_b / bytes as f64);
        let five = Z * rc.max(rb) <= 0.05;
        bounds.insert(f, (rc, rb, five));
    }
    let five_percent: Vec<&str> = bounds.iter().filter(|b| b.1 .2).map(|b| *b.0).collect();
    assert!(
        five_percent.len() == bounds.len() - 1,
        "the program is big enough for the 5% bound on every site but site_small: {bounds:?}"
    );
    let leak_sizes: Vec<u64> = sizes["site_leak_big"]
        .iter()
        .chain(&sizes["site_leak_small"])
        .copied()
        .collect();
    let live_rel = std_errors(&leak_sizes).1 / leaked as f64;
    assert!(Z * live_rel <= 0.10, "live bytes at exit: se {live_rel}");

    let mut z2 = Vec::new();
    let mut report = Vec::new();
    let mut zsum: BTreeMap<&str, f64> = BTreeMap::new();
    for seed in SEEDS {
        let seed_s = seed.to_string();
        let (out, p) = b.run(
            &["-mp", "--sample-bytes", "512K", "--sample-seed", &seed_s],
            &[],
            &format!("s{seed}.gz"),
        );
        assert!(out.contains("sites done 1"), "{out}");
        assert!(
            p.notes[0] == format!("sampled: --sample-bytes {N} --sample-seed {seed}"),
            "header names N and the seed: {:?}",
            p.notes
        );
        let m = all_sites(&p);
        let (tot, max, live) = (
            counter(&m, "MEM_TOTAL"),
            counter(&m, "MEM_MAX"),
            counter(&m, "MEM_LIVE"),
        );
        for (f, &(rc, rb, five)) in &bounds {
            let e = site(et, f);
            let s = site(tot, f);
            let ec = (s.calls as f64 - e.calls as f64) / e.calls as f64;
            let eb = (s.bytes as f64 - e.bytes as f64) / e.bytes as f64;
            report.push(format!("seed {seed} {f}: calls {ec:+.4} bytes {eb:+.4}"));
            let (tc, tb) = if five { (0.05, 0.05) } else { (Z * rc, Z * rb) };
            assert!(
                ec.abs() <= tc && eb.abs() <= tb,
                "seed {seed}, {f}: calls {} vs {} ({ec:+.4}), bytes {} vs {} ({eb:+.4}); allowed {tc:.4} / {tb:.4}",
                s.calls,
                e.calls,
                s.bytes,
                e.bytes
            );
            z2.push((ec / rc).powi(2));
            z2.push((eb / rb).powi(2));
            *zsum.entry(f).or_default() += eb / rb;
            // MEM_MAX counts the same calls; its value is the largest
            // recorded allocation.
            let mx = site(max, f);
            assert_eq!(mx.calls, s.calls, "{f}: MEM_MAX and MEM_TOTAL calls");
            assert!(mx.max_value <= site(counter(&exact, "MEM_MAX"), f).max_value);
        }
        // Freed sites hold nothing live: every sampled block's free took
        // back exactly what its allocation added, and no unsampled free
        // took anything.
        for f in [
            "site_mixed",
            "site_calloc",
            "site_realloc",
            "site_align",
            "site_big",
            "site_small",
        ] {
            let l = site(live, f);
            assert_eq!(
                (l.calls, l.bytes, l.leaks.len()),
                (0, 0, 0),
                "seed {seed}, {f}: MEM_LIVE at exit"
            );
        }
        // Leak records: as many as recorded live blocks, sizes adding up
        // to the site's MEM_LIVE.
        for f in ["site_leak_big", "site_leak_small"] {
            let l = site(live, f);
            let lk: u64 = l.leaks.iter().map(|x| x.1).sum();
            assert_eq!(lk, l.bytes, "seed {seed}, {f}: LK sizes = MEM_LIVE bytes");
            assert!(!l.leaks.is_empty() && l.leaks.len() as u64 <= l.calls);
        }
        let lt = live_total(&m);
        let rel = (lt as f64 - exact_live as f64) / exact_live as f64;
        report.push(format!("seed {seed} live at exit: {rel:+.4}"));
        assert!(
            rel.abs() <= 0.10,
            "seed {seed}: live bytes at exit {lt} vs exact {exact_live} ({rel:+.4})"
        );
    }
    eprintln!("{}", report.join("\n"));
    // The error model: normalised errors have mean square ~1 (chi-square
    // with many degrees of freedom) and no site is biased one way.
    let ms = z2.iter().sum::<f64>() / z2.len() as f64;
    assert!((0.3..2.5).contains(&ms), "mean squared z {ms}");
    for (f, s) in zsum {
        let mean = s / SEEDS.count() as f64;
        assert!(
            mean.abs() <= Z / (SEEDS.count() as f64).sqrt(),
            "{f}: mean z over the seeds {mean}"
        );
    }
}

/// A site's (calls, bytes, peak, largest value, leak sizes sorted).
type SiteValues = (u64, u64, u64, u64, Vec<u64>);

/// The per-site values of every memory counter, leak sizes sorted
/// (addresses differ between runs).
fn comparable(p: &Profile) -> BTreeMap<String, BTreeMap<String, SiteValues>> {
    all_sites(p)
        .into_iter()
        .map(|(c, m)| {
            let m = m
                .into_iter()
                .map(|(f, s)| {
                    let mut lk: Vec<u64> = s.leaks.iter().map(|x| x.1).collect();
                    lk.sort();
                    (f, (s.calls, s.bytes, s.peak, s.max_value, lk))
                })
                .collect();
            (c, m)
        })
        .collect()
}

#[test]
fn one_byte_mean_is_the_exact_profile() {
    // q(s) = 1 and w = 1 for every size: every allocation is recorded at
    // its own size, through every entry point (glibc's, and tcmalloc's and
    // jemalloc's own C++ operators when they are installed).
    let mut cases = vec![
        ("mem_family.c", &[][..], "family done", None),
        ("alloc_churn.c", &["20000", "5"][..], "done 20000", None),
        ("mem_newdel.cpp", &[][..], "", None),
    ];
    for (_, path) in other_allocators() {
        cases.extend([
            (
                "alloc_churn.c",
                &["20000", "5"][..],
                "done 20000",
                Some(path),
            ),
            ("mem_newdel.cpp", &[][..], "", Some(path)),
        ]);
    }
    for (src, args, marker, preload) in cases {
        let tag = preload.map_or("glibc", |p| p.rsplit('/').next().unwrap());
        let mut b = Bench::new(&format!("one-byte-{src}-{tag}"), src);
        b.preload = preload;
        let (out, exact) = b.run(&["-mp"], args, "exact.gz");
        assert!(out.contains(marker), "{out}");
        let (out, one) = b.run(&["-mp", "--sample-bytes", "1"], args, "one.gz");
        assert!(out.contains(marker), "{out}");
        assert!(one.notes[0].starts_with("sampled: --sample-bytes 1 --sample-seed "));
        let (e, o) = (comparable(&exact), comparable(&one));
        assert!(e["MEM_TOTAL"].len() >= 3, "{src}: {:?}", e["MEM_TOTAL"]);
        assert_eq!(e, o, "{src} {preload:?}");
    }
}

#[test]
fn an_operator_new_that_allocates_through_malloc_is_decided_once() {
    // A preloaded allocator whose operator new allocates through its own
    // malloc (as jemalloc's does): both are hooked, and sampled mode's
    // malloc, which decides before it calls the real one, must leave the
    // decision to the general path inside operator new's hook, or each
    // block would have two chances to be sampled (estimates about 2x).
    // 200,000 blocks of 64 bytes at N = 4096: about 3,100 samples, a
    // standard error of 1.8% on the calls and bytes.
    let mut b = Bench::new("sampled-via", "via_new.cpp");
    let lib = build(
        &b.dir,
        "via_alloc.c",
        "libvia_alloc.so",
        &["-shared", "-fPIC"],
    );
    b.preload = Some(Box::leak(lib.display().to_string().into_boxed_str()));
    // Calls and bytes over the whole profile (a block decided twice could
    // be recorded by either hook, under either caller).
    let totals = |p: &Profile| {
        let m = all_sites(p);
        let t = counter(&m, "MEM_TOTAL");
        (
            t.values().map(|s| s.calls).sum::<u64>(),
            t.values().map(|s| s.bytes).sum::<u64>(),
        )
    };
    let (out, exact) = b.run(&["-mp"], &[], "exact.gz");
    assert!(out.contains("new done 200000"), "{out}");
    let (ec, eb) = totals(&exact);
    // The program's blocks and stdio's buffer.
    assert!(
        ec - 200_000 < 10 && eb - 200_000 * 64 < 10_000,
        "exact: {ec} calls, {eb} bytes"
    );
    for seed in ["1", "2", "3"] {
        let (out, p) = b.run(
            &["-mp", "--sample-bytes", "4096", "--sample-seed", seed],
            &[],
            &format!("s{seed}.gz"),
        );
        assert!(out.contains("new done 200000"), "{out}");
        let (calls, bytes) = totals(&p);
        let (c, by) = (
            calls as f64 / ec as f64 - 1.0,
            bytes as f64 / eb as f64 - 1.0,
        );
        assert!(
            c.abs() < 0.10 && by.abs() < 0.10,
            "seed {seed}: estimated {calls} calls, {bytes} bytes ({c:+.3}, {by:+.3})"
        );
    }
}

#[test]
fn usable_sizes_and_signal_handlers_under_sampling() {
    // -mo include: the weight applies to the usable size; at N = 1 it is
    // the exact -mo include profile.
    let b = Bench::new("sampled-mo", "mem_family.c");
    let (_, exact) = b.run(&["-mp", "-mo", "include"], &[], "e.gz");
    let (_, one) = b.run(
        &["-mp", "-mo", "include", "--sample-bytes", "1"],
        &[],
        "o.gz",
    );
    assert_eq!(comparable(&exact), comparable(&one));

    // Allocations and frees from a 100 us timer's handler, some of them
    // while the interrupted code is inside a hook (deferred, replayed
    // later): at N = 1 every one is counted; at N = 64 the frees still
    // take back exactly what was added.
    let b = Bench::new("sampled-signal", "mem_signal.c");
    for (nb, exact) in [("1", true), ("64", false)] {
        let (out, p) = b.run(
            &["-mp", "--sample-bytes", nb],
            &["2000000"],
            &format!("sig{nb}.gz"),
        );
        let hits = signal_hits(&out);
        assert!(hits > 100, "the timer fired: {hits}");
        let m = all_sites(&p);
        let (tot, live) = (counter(&m, "MEM_TOTAL"), counter(&m, "MEM_LIVE"));
        if exact {
            assert_eq!(site(tot, "churn").calls, 2_000_000);
            let h = site(tot, "in_handler");
            assert_eq!((h.calls, h.bytes), (hits, 200 * hits));
        } else {
            // 2,000,000 small blocks at N = 64: standard error well under 1%.
            let c = site(tot, "churn").calls as f64 / 2_000_000.0 - 1.0;
            assert!(c.abs() < 0.05, "churn calls off by {c}");
        }
        for f in ["in_handler", "churn"] {
            assert_eq!(site(live, f).bytes, 0, "N = {nb}: {f} MEM_LIVE at exit");
        }
    }
}

#[test]
fn a_seed_gives_the_same_profile_again() {
    let b = Bench::new("sampled-seed", "alloc_churn.c");
    let opts = ["-mp", "--sample-bytes", "4K", "--sample-seed", "77"];
    let (_, p1) = b.run(&opts, &["100000", "5"], "a.gz");
    let (_, p2) = b.run(&opts, &["100000", "5"], "b.gz");
    let (a, c) = (comparable(&p1), comparable(&p2));
    assert_eq!(a, c);
    // Another seed, another sample (same totals only by a fluke).
    let (_, p3) = b.run(
        &["-mp", "--sample-bytes", "4K", "--sample-seed", "78"],
        &["100000", "5"],
        "c.gz",
    );
    assert_ne!(a["MEM_TOTAL"], comparable(&p3)["MEM_TOTAL"]);
    // Without a seed, the header names the random one it used.
    let (_, p4) = b.run(&["-mp", "--sample-bytes", "4K"], &["1000", "5"], "d.gz");
    let seed = p4.notes[0].rsplit("--sample-seed ").next().unwrap();
    assert!(seed.parse::<u64>().is_ok(), "{:?}", p4.notes);
}

/// The profiler's library is told apart from the program's objects by
/// where it is loaded, not by its file's name: a copy under another name
/// (`IGPROF_LIB` may name any file) hooks no Rust allocator entry point of
/// its own, so its own allocations never reach the sampler, and a seed
/// gives the same profile as with the library's usual name. (By name
/// alone, the copy hooked its `__rust_alloc` and friends, and the sampled
/// profile changed.)
#[test]
fn a_renamed_library_gives_the_same_sampled_profile() {
    let b = Bench::new("sampled-renamed", "alloc_churn.c");
    let copy = b.dir.join("profiler-copy.so");
    std::fs::copy(lib(), &copy).unwrap();
    let opts = ["-mp", "--sample-bytes", "4K", "--sample-seed", "7"];
    let (_, usual) = b.run(&opts, &["20000", "12"], "usual.gz");
    let mut args = vec!["-d"];
    args.extend(opts);
    args.extend(["-o", "renamed.gz", "./alloc_churn", "20000", "12"]);
    let o = igprof_command(&b.dir, &args)
        .env("IGPROF_LIB", &copy)
        .output()
        .unwrap();
    ok(&o);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        log.contains("allocator entry points") && !log.contains("rust_alloc"),
        "{log}"
    );
    let renamed = load(&b.dir.join("renamed.gz"));
    assert_eq!(comparable(&usual), comparable(&renamed));
}

#[test]
fn frees_on_other_threads_and_forked_children_stay_consistent() {
    let m: u64 = 50_000;
    let b = Bench::new("sampled-handoff", "mem_handoff.c");
    let (out, p) = b.run(
        &["-mp", "--sample-bytes", "2K", "--sample-seed", "5"],
        &["50000"],
        "h.gz",
    );
    assert!(out.contains("handoff done 50000"), "{out}");
    let s = all_sites(&p);
    let t = site(counter(&s, "MEM_TOTAL"), "produce");
    let bytes: u64 = (0..8).map(|k| m * 16 * (k + 1)).sum();
    // 57.6 MB in blocks of 16..128 bytes at N = 2K: standard error ~0.6%.
    let eb = (t.bytes as f64 - bytes as f64) / bytes as f64;
    assert!(eb.abs() < 0.03, "produce bytes {} vs {bytes}", t.bytes);
    let l = site(counter(&s, "MEM_LIVE"), "produce");
    assert_eq!(
        (l.calls, l.bytes, l.leaks.len()),
        (0, 0, 0),
        "all freed, on other threads"
    );

    // fork, thread-local destructors and dlopen: at N = 1 the sampled
    // profiles of parent and child are the exact ones.
    let b = Bench::new("sampled-fork", "mem_lifecycle.c");
    let plugin = b.dir.join("libmemplugin.so");
    let st = std::process::Command::new("cc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(root().join("tests/programs/mem_plugin.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let exe = format!("./{}", b.exe);
    let o = igprof(
        &b.dir,
        &[
            "-mp",
            "--sample-bytes",
            "1",
            "-o",
            "f.gz",
            &exe,
            plugin.to_str().unwrap(),
        ],
    );
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("lifecycle done 0"));
    let all: Vec<PathBuf> = std::fs::read_dir(&b.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("f.") && n.ends_with(".gz")
        })
        .collect();
    assert_eq!(all.len(), 2, "parent and child: {all:?}");
    let child_path = all.iter().find(|p| !p.ends_with("f.gz")).unwrap();
    let parent = all_sites(&load(&b.dir.join("f.gz")));
    let child = all_sites(&load(child_path));
    let pt = counter(&parent, "MEM_TOTAL");
    assert_eq!(site(pt, "tls_dtor").calls, 4);
    assert_eq!(site(pt, "plugin_init_site").bytes, 3 * 555);
    assert_eq!(site(pt, "before_fork").calls, 1);
    assert_eq!(site(pt, "child_site").calls, 0);
    let s = site(counter(&child, "MEM_TOTAL"), "child_site");
    assert_eq!((s.calls, s.bytes), (11, 10 * 222 + 333));
    assert_eq!(site(counter(&child, "MEM_TOTAL"), "before_fork").calls, 0);
    let l = site(counter(&child, "MEM_LIVE"), "child_site");
    assert_eq!((l.calls, l.bytes), (1, 333));
}

#[test]
fn bad_values_are_refused_on_one_line() {
    let d = scratch("sampled-refused");
    let exe = build(&d, "alloc_churn.c", "alloc_churn", &[]);
    let exe = exe.to_str().unwrap();
    for (opts, says) in [
        (&["-mp", "--sample-bytes", "0"][..], "igprof: option --sample-bytes: bad value '0', expected a mean number of bytes between samples from 1 to 16M"),
        (&["-mp", "--sample-bytes", "32M"][..], "igprof: option --sample-bytes: bad value '32M'"),
        (&["-mp", "--sample-bytes", "lots"][..], "igprof: option --sample-bytes: bad value 'lots'"),
        (&["-pp", "--sample-bytes", "512K"][..], "igprof: --sample-bytes samples the memory profiler's allocations: add -mp"),
        (&["-mp", "-ep", "--sample-bytes", "512K"][..], "igprof: --sample-bytes cannot be combined with -ep/-ei/-eu"),
        (&["-mp", "--sample-seed", "3"][..], "igprof: --sample-seed seeds the allocation sampler: add --sample-bytes N"),
        (&["-mp", "--sample-bytes", "1K", "--sample-seed", "-1"][..], "igprof: option --sample-seed: bad value '-1'"),
    ] {
        let mut a = opts.to_vec();
        a.extend([exe, "10", "2"]);
        let o = igprof(&d, &a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(127), "{opts:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{opts:?}: {err}");
        assert!(err.starts_with(says), "{opts:?}: {err}");
    }
    // IGPROF set by hand reaches the library, which says the same and
    // runs the program unprofiled.
    let o = std::process::Command::new(exe)
        .args(["10", "2"])
        .current_dir(&d)
        .env("IGPROF", "-mp --sample-bytes 0 -o x.gz")
        .env("LD_PRELOAD", lib())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success());
    assert_eq!(
        err.trim_end(),
        "igprof: option --sample-bytes: bad value '0', expected a mean number of bytes between samples from 1 to 16M, e.g. 512K (K = 1024); the program runs unprofiled"
    );
    assert!(!Path::new(&d.join("x.gz")).exists());
}

#[test]
fn igprof_analyse_reads_a_sampled_profile() {
    let b = Bench::new("sampled-analyse", "alloc_churn.c");
    let (_, _) = b.run(
        &["-mp", "--sample-bytes", "64K", "--sample-seed", "1"],
        &["200000", "20"],
        "prof.gz",
    );
    let analyse = analyser();
    for c in ["MEM_TOTAL", "MEM_LIVE", "MEM_MAX"] {
        let o = std::process::Command::new(&analyse)
            .args(["-r", c, "prof.gz"])
            .current_dir(&b.dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{c}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let site = if c == "MEM_LIVE" {
            "site_leak"
        } else {
            "site_mixed"
        };
        assert!(String::from_utf8_lossy(&o.stdout).contains(site), "{c}");
    }
}
