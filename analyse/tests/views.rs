//! The views (--folded, --flame, --icicle, --pprof, --callgrind) on IgProf's
//! own dumps: snapshots of the text formats, and each file read back by its
//! real consumer (go tool pprof, callgrind_annotate, an XML parser), whose
//! totals must equal the text report's. A missing consumer fails the test.
//!
//! Runs happen in a temporary copy of fixtures/igprof-dumps,
//! as in tests/cli.rs (the dumps name the programs relative to it).
//! Snapshots: tests/snapshots/views_*.txt; `UPDATE_SNAPSHOTS=1` rewrites them.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

mod common;
use common::{Dir, CPU, FD, MEM};

impl Dir {
    /// A successful run's stdout. Every report here is made with
    /// [`Dir::isolated`]: the fixtures name IgProf's library at the path
    /// of the machine that recorded them, and a file there would name the
    /// profiler frames `-nf` keeps (`@{libigprof.so+...}` otherwise).
    fn ok(&self, args: &[&str]) -> String {
        let (out, err, ok) = self.run(&self.isolated(args));
        assert!(ok, "igprof-analyse {args:?} failed: {err}");
        out
    }
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap()
    }
    /// The CPU dump with hot_a's first sample count halved (0x54 -> 0x2a
    /// ticks), written as `base.txt`: the dump has 42 ticks more, in hot_a.
    fn cpu_baseline(&self) -> &'static str {
        let mut plain = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(self.file(CPU)).unwrap()),
            &mut plain,
        )
        .unwrap();
        let base = plain.replacen("(PERF_TICKS):(54,54,54)", "(PERF_TICKS):(2a,2a,2a)", 1);
        assert_ne!(base, plain);
        std::fs::write(self.file("base.txt"), base).unwrap();
        "base.txt"
    }
}

fn snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_SNAPSHOTS=1 to create)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "snapshot {name} differs:\n--- expected\n{expected}\n--- actual\n{actual}"
    );
}

/// `1'234` or `1.96` as a number.
fn number(s: &str) -> f64 {
    s.replace('\'', "").parse().unwrap()
}

/// A flat table of a text report (`Flat profile (self` or `(cumulative`):
/// function name (recursion suffix `'N` kept) -> value as printed.
fn flat_table(report: &str, heading: &str) -> BTreeMap<String, f64> {
    let start = report
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading} in\n{report}"));
    let mut out = BTreeMap::new();
    for line in report[start..].lines().skip(3) {
        if line.trim().is_empty() {
            break;
        }
        // pct value [calls] name [rank]
        // The name starts after the numeric columns.
        let fields: Vec<&str> = line.split_whitespace().collect();
        let numeric = fields
            .iter()
            .take_while(|f| f.chars().all(|c| c.is_ascii_digit() || "'.-".contains(c)))
            .count();
        let name = fields[numeric..].join(" ");
        let name = name[..name.rfind(" [").unwrap()].to_string();
        out.insert(name, number(fields[1]));
    }
    out
}

/// Full text report's self table with every function listed: `-mc`-free,
/// so the table stops only at the first zero (as IgProf prints it).
fn report_self(d: &Dir, args: &[&str]) -> BTreeMap<String, f64> {
    flat_table(&d.ok(args), "Flat profile (self")
}

/// Per-leaf sums of a folded file: function -> sum of its lines' values.
fn folded_self(folded: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in folded.lines() {
        let (stack, v) = line.rsplit_once(' ').unwrap();
        let leaf = stack.rsplit(';').next().unwrap();
        *out.entry(leaf.to_string()).or_default() += v.parse::<i64>().unwrap();
    }
    out
}

/// `f'2` -> `f`.
fn base_name(name: &str) -> &str {
    match name.rfind('\'') {
        Some(i) if name[i + 1..].bytes().all(|b| b.is_ascii_digit()) && i + 1 < name.len() => {
            &name[..i]
        }
        _ => name,
    }
}

/// The text report's self table summed by function (recursion levels
/// `f'N` together, as stacks name them), times `scale`, as integers.
fn report_self_by_function(table: &BTreeMap<String, f64>, scale: f64) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (n, v) in table {
        if *v != 0.0 {
            *out.entry(base_name(n).to_string()).or_default() += (v * scale).round() as i64;
        }
    }
    out
}

#[test]
fn folded_snapshots() {
    let d = Dir::new();
    let cases: &[(&str, &[&str])] = &[
        ("views_folded_perf", &["-d", CPU]),
        ("views_folded_mem_total", &["-d", "-r", "MEM_TOTAL", MEM]),
        (
            "views_folded_mem_live_peak",
            &["-d", "-r", "MEM_LIVE", "--value", "peak", MEM],
        ),
        ("views_folded_fd_used_ml", &["-ml", "-r", "FD_USED", FD]),
    ];
    for (name, args) in cases {
        let mut a = args.to_vec();
        a.extend(["--folded", "-"]);
        let out = d.ok(&a);
        // Object paths contain the temporary directory.
        let real = std::fs::canonicalize(d.path()).unwrap();
        snapshot(name, &out.replace(real.to_str().unwrap(), "<fixtures>"));
    }
}

#[test]
fn folded_values_are_the_reports_self_values() {
    let d = Dir::new();
    for (dump, counter, scale) in [
        (MEM, "MEM_TOTAL", 1.0),
        (MEM, "MEM_LIVE", 1.0),
        (FD, "FD_USED", 1.0),
        (FD, "FD_LIVE", 1.0),
        // PERF_TICKS: ticks of 5 ms; the report prints seconds.
        (CPU, "PERF_TICKS", 200.0),
    ] {
        d.ok(&["-d", "-r", counter, "--folded", "out.folded", dump]);
        let folded = folded_self(&d.read("out.folded"));
        let report = report_self(&d, &["-d", "-r", counter, dump]);
        assert_eq!(
            folded,
            report_self_by_function(&report, scale),
            "{counter}: folded leaves vs the report's self column"
        );
        let total: i64 = folded.values().sum();
        assert!(total > 0, "{counter}");
    }
}

#[test]
fn folded_follows_the_reports_options() {
    let d = Dir::new();
    let folded = |args: &[&str]| {
        let mut a = vec!["-d"];
        a.extend(args);
        a.extend(["--folded", "-"]);
        d.ok(&a)
    };
    // -mr renames and merges.
    let mr = folded(&["-mr", "s/^hot_(.)$/HOT/", CPU]);
    assert!(mr.contains(";work;HOT;spin 392\n"), "{mr}");
    // -ml: one frame per library.
    let ml = folded(&["-ml", "-r", "MEM_TOTAL", MEM]);
    assert!(
        ml.lines().all(|l| l.starts_with('/') || l.starts_with("<")),
        "{ml}"
    );
    // Hit filters: only call paths with at least 100'000'000 bytes.
    let mc = folded(&["-r", "MEM_TOTAL", "-mc", "100000000", MEM]);
    assert!(
        mc.contains(";site_mixed 412621984\n") && mc.lines().count() == 1,
        "{mc}"
    );
    // --value peak differs from normal for MEM_LIVE.
    let normal = folded(&["-r", "MEM_LIVE", MEM]);
    let peak = folded(&["-r", "MEM_LIVE", "--value", "peak", MEM]);
    assert_ne!(normal, peak);
    // -nf keeps the profiler's own frames.
    let nf = folded(&["-nf", "-r", "MEM_TOTAL", MEM]);
    assert!(nf.contains(";@{libigprof.so+"), "{nf}");
    assert!(!folded(&["-r", "MEM_TOTAL", MEM]).contains("libigprof"));
    // -b: two columns, baseline then profiles; only hot_a changed.
    let base = d.cpu_baseline();
    let diff = folded(&["-b", base, CPU]);
    assert!(diff.contains(";work;hot_a;spin 157 199\n"), "{diff}");
    assert!(diff.contains(";work;hot_b;spin 115 115\n"), "{diff}");
    assert!(diff.lines().all(|l| l.split(' ').count() == 3), "{diff}");
}

/// Every `<title>` of an SVG, parsed as XML.
fn svg_titles(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse_with_options(
        svg,
        roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("the SVG is not well-formed XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "title")
        .filter_map(|n| n.text().map(str::to_string))
        .collect()
}

#[test]
fn flame_graph_is_xml_with_functions_and_units() {
    let d = Dir::new();
    d.ok(&["-d", "-r", "MEM_TOTAL", "--flame", "mem.svg", MEM]);
    let titles = svg_titles(&d.read("mem.svg"));
    for f in ["main", "site_small", "site_calloc", "site_leak", "recurse"] {
        assert!(
            titles.iter().any(|t| t.starts_with(&format!("{f} ("))),
            "{f} not in {titles:?}"
        );
    }
    assert!(
        titles.contains(&"all (431,226,080 bytes, 100%)".to_string()),
        "{titles:?}"
    );
    assert!(
        titles.contains(&"site_leak (1,000,000 bytes, 0.23%)".to_string()),
        "{titles:?}"
    );

    // Time in seconds: 392 ticks of 5 ms.
    d.ok(&["-d", "--flame", "cpu.svg", CPU]);
    let titles = svg_titles(&d.read("cpu.svg"));
    assert!(
        titles.contains(&"all (1.960 seconds, 100%)".to_string()),
        "{titles:?}"
    );
    assert!(
        titles.contains(&"hot_a (0.995 seconds, 50.77%)".to_string()),
        "{titles:?}"
    );

    // Descriptors; and the icicle graph is the same graph upside down.
    d.ok(&["-r", "FD_USED", "--flame", "fd.svg", FD]);
    d.ok(&["-r", "FD_USED", "--flame", "fd-icicle.svg", "--icicle", FD]);
    let (flame, icicle) = (d.read("fd.svg"), d.read("fd-icicle.svg"));
    let mut a = svg_titles(&flame);
    let mut b = svg_titles(&icicle);
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert!(a.iter().any(|t| t.contains(" descriptors, ")), "{a:?}");
    assert!(icicle.contains("Icicle graph: FD_USED") && flame.contains("Flame graph: FD_USED"));
    assert_ne!(flame, icicle);
}

#[test]
fn flame_errors_are_one_clear_line() {
    let d = Dir::new();
    let (_, err, ok) = d.run(&["--icicle", CPU]);
    assert!(!ok && err == "igprof-analyse: --icicle draws the --flame graph top-down: it needs --flame FILE.svg\n", "{err}");
    let (_, err, ok) = d.run(&[
        "-r",
        "MEM_LIVE",
        "-mc",
        "999999999",
        "--flame",
        "x.svg",
        MEM,
    ]);
    assert!(
        !ok && err.contains("no call path has a MEM_LIVE value left to draw"),
        "{err}"
    );
    let (_, err, ok) = d.run(&["--folded", "no/such/dir/x", CPU]);
    assert!(
        !ok && err.contains("no/such/dir/x: cannot create (--folded)"),
        "{err}"
    );
}

#[test]
fn differential_flame_graph_against_a_baseline() {
    let d = Dir::new();
    let base = d.cpu_baseline();
    d.ok(&["-d", "-b", base, "--flame", "diff.svg", CPU]);
    let svg = d.read("diff.svg");
    let titles = svg_titles(&svg);
    assert!(svg.contains("Differential flame graph: PERF_TICKS"));
    // spin under hot_a: 157 -> 199 ticks, +42 of 392 (10.71%); frames show
    // the change of their own amount (flamegraph.pl's differential).
    let grew = "spin (0.995 seconds, 50.77%; +10.71%)";
    let same = "spin (0.575 seconds, 29.34%; 0.00%)";
    assert!(titles.contains(&grew.to_string()), "{titles:?}");
    assert!(titles.contains(&same.to_string()), "{titles:?}");
    assert!(titles.contains(&"hot_a (0.995 seconds, 50.77%; 0.00%)".to_string()));
    // Red grew, white unchanged.
    let fill = |title: &str| -> String {
        let doc = roxmltree::Document::parse_with_options(
            &svg,
            roxmltree::ParsingOptions {
                allow_dtd: true,
                ..Default::default()
            },
        )
        .unwrap();
        let g = doc
            .descendants()
            .find(|n| {
                n.tag_name().name() == "g"
                    && n.children()
                        .any(|t| t.tag_name().name() == "title" && t.text() == Some(title))
            })
            .unwrap_or_else(|| panic!("no frame {title}"));
        let rect = g
            .children()
            .find(|n| n.tag_name().name() == "rect")
            .unwrap();
        rect.attribute("fill").unwrap().to_string()
    };
    let red = fill(grew);
    assert!(
        red.starts_with("rgb(255,") && red != "rgb(255,255,255)",
        "grew: red, not {red}"
    );
    assert_eq!(fill(same), "rgb(250,250,250)", "unchanged: near white");
    // A shrink is blue: the baseline against the dump.
    d.ok(&["-d", "-b", CPU, "--flame", "shrank.svg", base]);
    let titles = svg_titles(&d.read("shrank.svg"));
    assert!(
        titles.contains(&"spin (0.785 seconds, 44.86%; -12.00%)".to_string()),
        "{titles:?}"
    );
    let svg = d.read("shrank.svg");
    let at = svg.find("spin (0.785 seconds, 44.86%; -12.00%)").unwrap();
    let fill = &svg[at..][svg[at..].find("fill=\"").unwrap() + 6..];
    let fill = &fill[..fill.find('"').unwrap()];
    assert!(
        fill.ends_with(",255)") && fill != "rgb(255,255,255)",
        "shrank: blue, not {fill}"
    );
}

/// Runs a consumer of the views; a missing one fails with what to install.
fn consumer(program: &str, args: &[&str], dir: &Path, install: &str) -> String {
    // Headless chromium hung once for minutes in a full CI run (its
    // processes idle, no output): a run that takes more than this is
    // killed and run once more.
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);
    for attempt in 1..=2 {
        let mut child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {program} ({e}): it reads the views in these tests; install {install} (scripts/setup does)")
            });
        // Read both pipes while waiting, so a large output cannot block it.
        let mut pipes = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let readers = (
            std::thread::spawn(move || {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut pipes.0, &mut v).map(|_| v)
            }),
            std::thread::spawn(move || {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut pipes.1, &mut v).map(|_| v)
            }),
        );
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if started.elapsed() > LIMIT {
                // The whole group: chromium's helpers keep the pipes open.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let out = readers.0.join().unwrap().unwrap_or_default();
        let err = readers.1.join().unwrap().unwrap_or_default();
        let Some(status) = status else {
            eprintln!("{program} {args:?}: no answer in {LIMIT:?} (attempt {attempt}); killed");
            continue;
        };
        assert!(
            status.success(),
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&err)
        );
        return String::from_utf8(out).unwrap();
    }
    panic!("{program} {args:?}: no answer in two attempts of {LIMIT:?}");
}

fn go_pprof(d: &Dir, args: &[&str]) -> String {
    let mut a = vec!["tool", "pprof"];
    a.extend(args);
    consumer("go", &a, d.path(), "golang-go")
}

/// A number as pprof prints it with an explicit unit (`412621984B`,
/// `1960000000ns`, `392`).
fn pprof_number(s: &str) -> i64 {
    s.trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .unwrap_or_else(|_| panic!("not a pprof number: {s}"))
}

/// `go tool pprof -top` of one sample type, every node: name -> (flat, cum).
fn pprof_top(d: &Dir, file: &str, sample: &str, unit: &str) -> BTreeMap<String, (i64, i64)> {
    let top = go_pprof(
        d,
        &[
            "-top",
            "-nodecount=100000",
            "-nodefraction=0",
            "-edgefraction=0",
            &format!("-sample_index={sample}"),
            &format!("-unit={unit}"),
            file,
        ],
    );
    assert!(top.contains(&format!("Type: {sample}\n")), "{top}");
    let mut out = BTreeMap::new();
    for line in top
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        out.insert(f[5..].join(" "), (pprof_number(f[0]), pprof_number(f[3])));
    }
    out
}

/// The call-graph section of a text report: every function with a
/// non-zero cumulative value: name -> (self, cumulative), as printed.
fn report_rows(report: &str) -> BTreeMap<String, (f64, f64)> {
    let start = report.find("Call tree profile").unwrap();
    let mut out = BTreeMap::new();
    for line in report[start..].lines().filter(|l| l.starts_with('[')) {
        // [rank] pct cum self / children [calls] name
        let f: Vec<&str> = line.split_whitespace().collect();
        let numeric = f[1..]
            .iter()
            .take_while(|x| x.chars().all(|c| c.is_ascii_digit() || "'./-".contains(c)))
            .count();
        out.insert(f[1 + numeric..].join(" "), (number(f[3]), number(f[2])));
    }
    out
}

/// pprof's flat per function must be the report's self values summed over
/// recursion levels (`f`, `f'2`...: one function in pprof), and its cum
/// the report's cumulative value of `f` (the outermost level holds all).
fn assert_pprof_equals_report(
    top: &BTreeMap<String, (i64, i64)>,
    report: &BTreeMap<String, (f64, f64)>,
    scale: f64,
    what: &str,
) {
    // The report prints seconds with 2 decimals: equal to that precision.
    let same = |pprof: i64, printed: f64| (pprof as f64 / scale - printed).abs() < 0.005 + 1e-9;
    let mut flat: BTreeMap<String, f64> = BTreeMap::new();
    for (name, (s, _)) in report {
        *flat.entry(base_name(name).to_string()).or_default() += s;
    }
    for (name, &(f, c)) in top {
        assert!(
            same(f, flat[name]),
            "{what}: flat of {name}: {f} vs {}",
            flat[name]
        );
        assert!(
            same(c, report[name].1),
            "{what}: cum of {name}: {c} vs {}",
            report[name].1
        );
    }
    let named: Vec<&String> = report
        .keys()
        .filter(|n| base_name(n) == n.as_str())
        .collect();
    let mut seen: Vec<&String> = top.keys().collect();
    seen.sort();
    let mut named = named;
    named.retain(|n| n.as_str() != "<spontaneous>");
    assert_eq!(seen, named, "{what}: functions");
}

#[test]
fn pprof_flat_and_cum_totals_equal_the_report() {
    let d = Dir::new();
    // (dump, counter, pprof sample type, unit, pprof units per report unit)
    let cases = [
        (CPU, "PERF_TICKS", "cpu", "ns", 1e9),
        // Ticks of 5 ms.
        (CPU, "PERF_TICKS", "samples", "count", 200.0),
        (MEM, "MEM_TOTAL", "alloc_space", "byte", 1.0),
        (MEM, "MEM_LIVE", "inuse_space", "byte", 1.0),
        (FD, "FD_USED", "fd_used", "count", 1.0),
        (FD, "FD_LIVE", "fd_live", "count", 1.0),
    ];
    for dump in [CPU, MEM, FD] {
        // Without -r: every counter of the profile in one file.
        let file = format!("{dump}.pb.gz");
        d.ok(&["-d", "--pprof", &file, dump]);
        for &(_, counter, sample, unit, scale) in cases.iter().filter(|c| c.0 == dump) {
            let report = report_rows(&d.ok(&["-d", "-r", counter, dump]));
            let top = pprof_top(&d, &file, sample, unit);
            assert_pprof_equals_report(&top, &report, scale, &format!("{dump} {sample}"));
        }
        // -traces reads it too: every sample has a stack ending at a root.
        let traces = go_pprof(&d, &["-traces", &file]);
        assert!(traces.contains("-----------+"), "{traces}");
        assert!(traces.contains("_start"), "{traces}");
    }
    // The object count of memory: the report's calls (-c column).
    let top = pprof_top(&d, &format!("{MEM}.pb.gz"), "alloc_objects", "count");
    assert_eq!(top["site_small"].0, 200_000);
    assert_eq!(top["site_calloc"].0, 20_000);
    assert_eq!(top["site_leak"].0, 1_000);
    let live = pprof_top(&d, &format!("{MEM}.pb.gz"), "inuse_objects", "count");
    assert_eq!(live["site_leak"].0, 1_000);
}

#[test]
fn pprof_traces_are_the_folded_stacks() {
    let d = Dir::new();
    for (dump, counter, sample, unit) in [
        (MEM, "MEM_TOTAL", "alloc_space", "byte"),
        (CPU, "PERF_TICKS", "samples", "count"),
    ] {
        d.ok(&[
            "-d", "-r", counter, "--pprof", "t.pb.gz", "--folded", "t.folded", dump,
        ]);
        let traces = go_pprof(
            &d,
            &[
                "-traces",
                &format!("-sample_index={sample}"),
                &format!("-unit={unit}"),
                "t.pb.gz",
            ],
        );
        // Blocks: "VALUE leaf" then one caller per line, up to the root.
        let mut got: Vec<String> = Vec::new();
        for block in traces.split("-----------+").skip(1) {
            let mut lines = block.lines().skip(1).filter(|l| !l.trim().is_empty());
            let Some(first) = lines.next() else { continue };
            let (value, leaf) = first.trim().split_once(char::is_whitespace).unwrap();
            let mut stack: Vec<String> = vec![leaf.trim().to_string()];
            stack.extend(lines.map(|l| l.trim().to_string()));
            stack.reverse();
            got.push(format!("{} {}", stack.join(";"), pprof_number(value)));
        }
        let mut want: Vec<String> = d.read("t.folded").lines().map(str::to_string).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{counter}: pprof -traces vs --folded");
    }
}

#[test]
fn pprof_types_units_mappings_and_options() {
    let d = Dir::new();
    d.ok(&["--pprof", "mem.pb.gz", MEM]);
    let raw = go_pprof(&d, &["-raw", "mem.pb.gz"]);
    // MEM_MAX's values are maxima: only with -r MEM_MAX.
    assert!(
        raw.contains(
            "alloc_objects/count alloc_space/bytes[dflt] inuse_objects/count inuse_space/bytes\n"
        ),
        "{raw}"
    );
    // -r: that counter alone, its main type the default.
    d.ok(&["-r", "MEM_LIVE", "--pprof", "live.pb.gz", MEM]);
    let raw_live = go_pprof(&d, &["-raw", "live.pb.gz"]);
    assert!(
        raw_live.contains("inuse_objects/count inuse_space/bytes[dflt]\n"),
        "{raw_live}"
    );
    d.ok(&["-r", "MEM_MAX", "--pprof", "max.pb.gz", MEM]);
    assert!(go_pprof(&d, &["-raw", "max.pb.gz"]).contains("mem_max/bytes[dflt]\n"));
    d.ok(&["--pprof", "cpu.pb.gz", CPU]);
    let raw = go_pprof(&d, &["-raw", "cpu.pb.gz"]);
    assert!(
        raw.contains("PeriodType: cpu nanoseconds\nPeriod: 5000000\n"),
        "{raw}"
    );
    assert!(
        raw.contains("samples/count cpu/nanoseconds[dflt]\n"),
        "{raw}"
    );
    // Mappings: object paths with their build ids.
    let mappings = &raw[raw.find("Mappings").unwrap()..];
    assert!(
        mappings.contains("/libc.so.6 93ac61ec5a8eb1396f9fbd350e3169a558528a40 [FN]"),
        "{mappings}"
    );
    assert!(
        mappings.contains("/cpu_split 6ba464c40ffc7742a4318d2581f91f1d19c2b5f6 [FN]"),
        "{mappings}"
    );
    // --lines: file and line in the functions and locations.
    d.ok(&["--lines", "--pprof", "lines.pb.gz", CPU]);
    let top = go_pprof(&d, &["-top", "-lines", "lines.pb.gz"]);
    assert!(top.contains(" spin cpu_split.c:8\n"), "{top}");
    assert!(top.contains(" hot_a cpu_split.c:11\n"), "{top}");
    // -b: the differences; -mr renames.
    let base = d.cpu_baseline();
    d.ok(&[
        "-b",
        base,
        "-mr",
        "s/^spin$/SPIN/",
        "--pprof",
        "diff.pb.gz",
        CPU,
    ]);
    let top = pprof_top(&d, "diff.pb.gz", "samples", "count");
    assert_eq!(top["SPIN"], (42, 42));
    assert_eq!(top["hot_a"], (0, 42));
    assert!(!top.contains_key("hot_b"), "{top:?}");
}

/// `callgrind_annotate` of a file, every function: name -> costs per event.
fn callgrind_annotate(d: &Dir, file: &str, inclusive: bool) -> BTreeMap<String, Vec<i64>> {
    let out = consumer(
        "callgrind_annotate",
        &[
            &format!("--inclusive={}", if inclusive { "yes" } else { "no" }),
            "--threshold=100",
            file,
        ],
        d.path(),
        "valgrind",
    );
    let mut rows = BTreeMap::new();
    let table = &out[out.find("file:function").unwrap_or_else(|| panic!("{out}"))..];
    for line in table.lines().skip(2) {
        let Some(at) = line.find("???:") else {
            continue;
        };
        let name = &line[at + 4..line.rfind(" [").unwrap()];
        // "1,234 (12.3%)" per event; "0" alone for a zero.
        let costs: Vec<i64> = line[..at]
            .split_whitespace()
            .filter(|f| !f.starts_with('('))
            .filter(|f| !f.ends_with("%)"))
            .map(|f| {
                if f == "." {
                    0
                } else {
                    f.replace(',', "").parse().unwrap()
                }
            })
            .collect();
        rows.insert(name.to_string(), costs);
    }
    rows
}

#[test]
fn callgrind_snapshots() {
    let d = Dir::new();
    for (name, args) in [
        ("views_callgrind_perf", &["-d", CPU][..]),
        ("views_callgrind_fd", &["-d", FD][..]),
    ] {
        let mut a = args.to_vec();
        a.extend(["--callgrind", "-"]);
        let real = std::fs::canonicalize(d.path()).unwrap();
        snapshot(
            name,
            &d.ok(&a).replace(real.to_str().unwrap(), "<fixtures>"),
        );
    }
}

#[test]
fn callgrind_annotate_totals_equal_the_report() {
    let d = Dir::new();
    for (dump, counters) in [
        (MEM, &["MEM_TOTAL", "MEM_LIVE"][..]),
        (FD, &["FD_USED", "FD_LIVE"][..]),
        (CPU, &["PERF_TICKS"][..]),
    ] {
        // Without -r: one event per counter, MEM_MAX left out.
        d.ok(&["-d", "--callgrind", "out.cg", dump]);
        let events = d.read("out.cg");
        let events = events.lines().find(|l| l.starts_with("events: ")).unwrap();
        assert_eq!(events, format!("events: {}", counters.join(" ")));
        let inclusive = callgrind_annotate(&d, "out.cg", true);
        let exclusive = callgrind_annotate(&d, "out.cg", false);
        for (k, counter) in counters.iter().enumerate() {
            let report = report_rows(&d.ok(&["-d", "-r", counter, dump]));
            let scale = if *counter == "PERF_TICKS" { 200.0 } else { 1.0 };
            let same = |cg: i64, printed: f64| (cg as f64 / scale - printed).abs() < 0.005 + 1e-9;
            for (name, (self_, cum)) in &report {
                let incl = inclusive
                    .get(name)
                    .unwrap_or_else(|| panic!("{counter}: no {name}"));
                assert!(
                    same(incl[k], *cum),
                    "{counter}: inclusive of {name}: {incl:?} vs {cum}"
                );
                let excl = exclusive[name][k];
                assert!(
                    same(excl, *self_),
                    "{counter}: self of {name}: {excl} vs {self_}"
                );
            }
            // And nothing the report does not have (functions with a zero
            // cumulative value are left out of both).
            for (name, costs) in &inclusive {
                assert!(
                    report.contains_key(name) || costs[k] == 0,
                    "{counter}: {name}"
                );
            }
        }
    }
    // Recursion: IgProf's nested levels are callgrind functions of their own.
    d.ok(&["-d", "-r", "MEM_TOTAL", "--callgrind", "mem.cg", MEM]);
    let incl = callgrind_annotate(&d, "mem.cg", true);
    assert_eq!(incl["recurse"], [430_221_984]);
    assert_eq!(incl["recurse'21"], [423_821_984]);
}

#[test]
fn callgrind_refuses_what_it_cannot_show() {
    let d = Dir::new();
    let base = d.cpu_baseline();
    let (_, err, ok) = d.run(&["-b", base, "--callgrind", "x.cg", CPU]);
    assert!(!ok);
    assert!(
        err.contains("cannot be negative") && err.lines().count() == 1,
        "{err}"
    );
    let (_, err, ok) = d.run(&["-r", "MEM_MAX", "--callgrind", "x.cg", MEM]);
    assert!(!ok);
    assert!(err.contains("MEM_MAX holds maxima"), "{err}");
}

/// Runs the page's own self-test in headless Chromium (it clicks through
/// the page as a user would) and returns what it saw, and the page's DOM.
fn html_selftest(d: &Dir, page: &str) -> (String, String) {
    let dom = html_dom(d, page, "#selftest");
    assert!(
        dom.contains("data-selftest=\"done\""),
        "the page's self-test did not finish:\n{dom}"
    );
    let start = dom.find("<pre id=\"selftest\"").unwrap();
    let text = &dom[start..];
    let text = &text[text.find('>').unwrap() + 1..text.find("</pre>").unwrap()];
    (
        text.replace("&gt;", ">")
            .replace("&lt;", "<")
            .replace("&amp;", "&"),
        dom,
    )
}

/// The page's DOM in headless Chromium after its scripts ran.
fn html_dom(d: &Dir, page: &str, fragment: &str) -> String {
    let url = format!("file://{}{fragment}", d.file(page).display());
    let dom = consumer(
        "chromium",
        &[
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            &url,
        ],
        d.path(),
        "chromium",
    );
    assert!(
        dom.contains("data-ready=\"yes\""),
        "the page did not start:\n{dom}"
    );
    dom
}

#[test]
fn html_page_is_self_contained_and_works_in_a_browser() {
    let d = Dir::new();
    d.ok(&["-d", "--html", "mem.html", MEM]);
    let page = d.read("mem.html");
    for banned in [
        "http:", "https:", "<link", "@import", "url(", " src=", " href=",
    ] {
        assert!(
            !page.contains(banned),
            "the page refers to something outside it: {banned}"
        );
    }
    let (seen, dom) = html_selftest(&d, "mem.html");
    assert_eq!(
        seen,
        "counters MEM_TOTAL MEM_LIVE\n\
         rows 37 of 37\n\
         first by cumulative <spontaneous>\n\
         first by self site_mixed 412,621,984 B\n\
         filtered site_mixed,site_realloc,site_small,site_calloc,site_leak\n\
         function main callers __libc_start_call_main\n\
         callees recurse,site_leak,__printf\n\
         clicked recurse\n\
         back main\n\
         forward recurse\n\
         zoom site_leak width 788 of 788, frames 31 -> 6\n\
         Matched: 100.00% (431,221,984 B)\n\
         counter MEM_LIVE rows 12\n\
         ok"
        .replace("788", &seen_width(&seen)),
        "{dom}"
    );
    // The printf path (4'096 of 431'226'080 bytes) is below 0.01%: out of
    // the flame graph, and the page says so; still in the table.
    let dom = html_dom(&d, "mem.html", "#c=0");
    assert!(
        dom.contains("Left out: 1 frame(s) below 0.01% of the total."),
        "{dom}"
    );
    assert!(dom.contains(">__printf</a>"), "{dom}");

    // Time in seconds.
    d.ok(&["-d", "--html", "cpu.html", CPU]);
    let (seen, _) = html_selftest(&d, "cpu.html");
    assert!(seen.contains("first by self spin 1.960 s\n"), "{seen}");
}

/// The flame graph's width depends on the browser window.
fn seen_width(seen: &str) -> String {
    let l = seen.lines().find(|l| l.starts_with("zoom ")).unwrap_or("");
    l.split(" of ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or("")
        .to_string()
}

#[test]
fn html_data_equals_the_report() {
    let d = Dir::new();
    for (dump, counters) in [
        (MEM, &["MEM_TOTAL", "MEM_LIVE"][..]),
        (FD, &["FD_USED", "FD_LIVE"][..]),
        (CPU, &["PERF_TICKS"][..]),
    ] {
        d.ok(&["-d", "--html", "p.html", dump]);
        let page = d.read("p.html");
        let start = page
            .find("<script type=\"application/json\" id=\"data\">")
            .unwrap();
        let json = &page[start..];
        let json = &json[json.find('>').unwrap() + 1..json.find("</script>").unwrap()];
        let data: serde_json::Value = serde_json::from_str(json).unwrap();
        let names: Vec<&str> = data["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let cs = data["counters"].as_array().unwrap();
        assert_eq!(cs.len(), counters.len());
        for (c, counter) in cs.iter().zip(counters) {
            assert_eq!(c["name"], *counter);
            let report = report_rows(&d.ok(&["-d", "-r", counter, dump]));
            let scale = c["scale"].as_f64().unwrap();
            let mut page_rows = BTreeMap::new();
            for r in c["flat"].as_array().unwrap() {
                let v: Vec<i64> = r
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect();
                page_rows.insert(names[v[0] as usize].to_string(), (v[1], v[2]));
            }
            assert_eq!(page_rows.len(), report.len(), "{counter}: functions");
            for (name, (s, cum)) in &report {
                let (ps, pc) = page_rows[name];
                assert!(
                    (ps as f64 * scale - s).abs() < 0.005 + 1e-9,
                    "{counter} {name}: self {ps} vs {s}"
                );
                assert!(
                    (pc as f64 * scale - cum).abs() < 0.005 + 1e-9,
                    "{counter} {name}: cum {pc} vs {cum}"
                );
            }
        }
    }
    let base = d.cpu_baseline();
    let (_, err, ok) = d.run(&["-b", base, "--html", "x.html", CPU]);
    assert!(
        !ok && err.contains("not a difference against a baseline"),
        "{err}"
    );
}

#[test]
fn views_read_run_directories_and_warn_once() {
    // A run directory of two processes and a leftover: every counter of the
    // views is read from both, and the leftover is said once, not once per
    // counter read.
    let d = Dir::new();
    std::fs::create_dir(d.file("run")).unwrap();
    std::fs::copy(d.file(MEM), d.file("run/a.gz")).unwrap();
    std::fs::copy(d.file(MEM), d.file("run/b.gz")).unwrap();
    std::fs::write(d.file("run/c.gz.tmp"), "").unwrap();
    let (_, err, ok) = d.run(&[
        "-d",
        "--pprof",
        "run.pb.gz",
        "--folded",
        "run.folded",
        "run",
    ]);
    assert!(ok, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("skipping run/c.gz.tmp"), "{err}");
    let top = pprof_top(&d, "run.pb.gz", "inuse_space", "byte");
    assert_eq!(top["site_leak"], (2_000_000, 2_000_000));
    let folded = folded_self(&d.read("run.folded"));
    assert_eq!(folded["site_mixed"], 2 * 412_621_984);
}
