//! igprof-analyse end to end: IgProf's own reports on IgProf's own dumps,
//! snapshots of every report type and output format, and the error messages.
//!
//! The dumps record the program as `./cpu_split`, relative to where it ran,
//! so every run here happens in a temporary copy of the fixture directory.
//! Library names come from Debian 12's libc 2.36 and its detached debug
//! symbols (libc6-dbg, installed by scripts/setup), as for IgProf's reports.
//!
//! Snapshots live in tests/snapshots/; `UPDATE_SNAPSHOTS=1 cargo test` rewrites
//! them (then review the diff: they are checked by eye once, by tests after).

use std::path::Path;

mod common;
use common::{Dir, CPU, FD, MEM};

impl Dir {
    fn ok(&self, args: &[&str]) -> String {
        let (out, err, ok) = self.run(args);
        assert!(ok, "igprof-analyse {args:?} failed: {err}");
        // Object paths contain the temporary directory.
        let real = std::fs::canonicalize(self.path()).unwrap();
        out.replace(real.to_str().unwrap(), "<fixtures>")
    }
    fn fails(&self, args: &[&str]) -> String {
        let (out, err, ok) = self.run(args);
        assert!(!ok, "igprof-analyse {args:?} should fail, printed {out}");
        assert_eq!(err.lines().count(), 1, "one-line error expected: {err}");
        err
    }
}

fn snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_SNAPSHOTS=1 to create)",
            path.display()
        )
    });
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b);
        panic!(
            "snapshot {name} differs (first differing line {:?}):\n--- expected\n{expected}\n--- actual\n{actual}",
            first.map(|l| l + 1)
        );
    }
}

/// The section of a text report between two headings.
fn section<'a>(report: &'a str, heading: &str) -> &'a str {
    let start = report
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading} in\n{report}"));
    let rest = &report[start..];
    let end = rest[1..].find("\n---").map(|e| e + 1).unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn every_fixture_report_equals_igprofs_own() {
    // Same command as the fixture README (`igprof-analyse -d -g -r COUNTER`):
    // flat cumulative, flat self and call graph, byte for byte.
    let d = Dir::new();
    let cases = [
        (CPU, "PERF_TICKS", "igprof-pp-cpu_split.PERF_TICKS.txt"),
        (MEM, "MEM_TOTAL", "igprof-mp-alloc_churn.MEM_TOTAL.txt"),
        (MEM, "MEM_LIVE", "igprof-mp-alloc_churn.MEM_LIVE.txt"),
        (MEM, "MEM_MAX", "igprof-mp-alloc_churn.MEM_MAX.txt"),
        (FD, "FD_USED", "igprof-fd-fd_churn.FD_USED.txt"),
        (FD, "FD_LIVE", "igprof-fd-fd_churn.FD_LIVE.txt"),
    ];
    for (dump, counter, igprof) in cases {
        let ours = d.ok(&["-d", "-g", "-r", counter, dump]);
        let theirs = std::fs::read_to_string(d.file(igprof)).unwrap();
        for heading in [
            "Flat profile (cumulative",
            "Flat profile (self",
            "Call tree profile",
        ] {
            assert_eq!(
                section(&ours, heading),
                section(&theirs, heading),
                "{igprof}: {heading}"
            );
        }
        assert_eq!(ours, theirs, "{igprof}");
    }
}

#[test]
fn exact_allocation_counts_match_the_program() {
    // alloc_churn.c with n=200000: site_small N mallocs of 32 bytes; site_leak
    // 1000 x 1000 bytes never freed; site_calloc N/10 x 240 bytes.
    let d = Dir::new();
    let total = d.ok(&["-r", "MEM_TOTAL", MEM]);
    let flat = section(&total, "Flat profile (self");
    assert!(
        flat.contains("6'400'000      200'000  site_small"),
        "{flat}"
    );
    assert!(
        flat.contains("4'800'000       20'000  site_calloc"),
        "{flat}"
    );
    assert!(flat.contains("1'000'000        1'000  site_leak"), "{flat}");
    let live = d.ok(&["-r", "MEM_LIVE", MEM]);
    assert!(section(&live, "Flat profile (self").contains("1'000'000      1'000  site_leak"));
}

#[test]
fn fd_report_shows_what_the_dump_records_and_a_correct_dump_shows_pipes() {
    // IgProf's profiler does not hook pipe(), so fd_pipe (2 x 2000 fds) is
    // missing from its dump, and fd_leak's last call (socket) is a tail call,
    // so its descriptor is charged to main. The analyser must report what the
    // dump says; the profiler tests check that igprof-rs records both right.
    let d = Dir::new();
    let used = d.ok(&["-r", "FD_USED", FD]);
    assert!(!used.contains("fd_pipe"));
    let live = d.ok(&["-r", "FD_LIVE", FD]);
    assert!(section(&live, "Flat profile (self").contains("33.33         1  main [5]"));
    // The same program as a correct profiler records it (fd_pipe included,
    // socket charged to fd_leak): pipe adds 4000 descriptors under main.
    let text = "P=(ID=1 N=(./fd_churn) T=0.000000)\n\
        C1 FN0=(F0=(./fd_churn)+4330 N=(@?0x1))+0\n\
        C2 FN1=(F0+4660 N=(@?0x2))+0 V0=(FD_USED):(2000,2000,2000) V1=(FD_LIVE):(0,0,1)\n\
        C2 FN2=(F0+4830 N=(@?0x3))+0 V0:(4000,4000,4000) V1:(0,0,2)\n\
        C2 FN3=(F0+5077 N=(@?0x4))+0 V0:(3,3,3) V1:(3,3,3);LK=(0x3,1);LK=(0x4,1);LK=(0x5,1)\n";
    std::fs::write(d.file("correct.txt"), text).unwrap();
    let out = d.ok(&["-r", "FD_USED", "correct.txt"]);
    let flat = section(&out, "Flat profile (cumulative");
    assert!(flat.contains("  100.0     6'003  main [2]"), "{flat}");
    assert!(flat.contains("   66.6     4'000  fd_pipe [3]"), "{flat}");
    let live = d.ok(&["-r", "FD_LIVE", "correct.txt"]);
    assert!(
        section(&live, "Flat profile (self").contains("100.00         3  fd_leak [3]"),
        "{live}"
    );
    assert!(
        !section(&live, "Flat profile (self").contains("main"),
        "{live}"
    );
}

#[test]
fn snapshots_of_every_report_type_and_format() {
    let d = Dir::new();
    let cases: &[(&str, &[&str])] = &[
        ("top_mem_live", &["-r", "MEM_LIVE", "--top", "3", MEM]),
        ("top_perf", &["-tn", "2", CPU]),
        ("tree_perf", &["--tree", CPU]),
        ("tree_mem_total", &["-r", "MEM_TOTAL", "--tree", MEM]),
        ("json_perf", &["-js", CPU]),
        ("json_mem_live", &["-r", "MEM_LIVE", "--json", MEM]),
        ("sql_fd_used", &["-s", "-r", "FD_USED", FD]),
        (
            "merge_libraries_fd_used",
            &["-ml", "-l", "-r", "FD_USED", FD],
        ),
        (
            "merge_regexp_perf",
            &["-mr", "s/^hot_(.)$/HOT_\\1_x/;s/^spin$/SPIN/", CPU],
        ),
        ("merge_regexp_all_hot", &["-mr", "s/^hot_.*/HOT/", CPU]),
        ("merge_ancestors_perf", &["-ma", "main>work/WORK", CPU]),
        ("paths_calls_perf", &["-p", "-c", CPU]),
        ("peak_mem_live", &["-r", "MEM_LIVE", "--value", "peak", MEM]),
        ("no_filter_mem_total", &["-nf", "-r", "MEM_TOTAL", MEM]),
        ("no_symbols_perf", &["--no-symbols", CPU]),
        ("lines_perf", &["--lines", CPU]),
        ("inline_perf", &["--inline", "-r", "PERF_TICKS", CPU]),
        (
            "descending_fd_live",
            &["-o", "descending", "-r", "FD_LIVE", FD],
        ),
        (
            "hit_filter_mem_total",
            &["-r", "MEM_TOTAL", "-mc", "1000000", MEM],
        ),
    ];
    for (name, args) in cases {
        snapshot(name, &d.ok_isolated(args));
    }
}

#[test]
fn sqlite_database_file_holds_the_same_rows_as_the_sql_text() {
    let d = Dir::new();
    let db = d.file("out.db");
    d.ok(&["--db", db.to_str().unwrap(), "-r", "MEM_LIVE", MEM]);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let (counter, total, freq): (String, i64, i64) = conn
        .query_row(
            "SELECT counter, total_count, total_freq FROM summary",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (counter.as_str(), total, freq),
        ("MEM_LIVE", 1_004_096, 1_001)
    );
    let (name, cum, calls): (String, i64, i64) = conn
        .query_row(
            "SELECT s.name, m.cumulative_count, m.total_calls FROM mainrows m JOIN symbols s ON s.id = m.symbol_id WHERE m.self_count > 999999",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((name.as_str(), cum, calls), ("site_leak", 1_000_000, 1_000));
    let sql = d.ok(&["-s", "-r", "MEM_LIVE", MEM]);
    let rows = sql.matches("INSERT INTO mainrows").count() as i64;
    let n: i64 = conn
        .query_row("SELECT count(*) FROM mainrows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, rows);
    let edges = (sql.matches("INSERT INTO parents").count()
        + sql.matches("INSERT INTO children").count()) as i64;
    let m: i64 = conn
        .query_row(
            "SELECT (SELECT count(*) FROM parents) + (SELECT count(*) FROM children)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(m, edges);
}

#[test]
fn plain_bzip2_and_gzip_inputs_give_the_same_report_and_files_merge() {
    let d = Dir::new();
    let gz = d.ok(&[CPU]);
    let mut plain = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(d.file(CPU)).unwrap()),
        &mut plain,
    )
    .unwrap();
    std::fs::write(d.file("cpu.txt"), &plain).unwrap();
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    std::io::Write::write_all(&mut bz, &plain).unwrap();
    std::fs::write(d.file("cpu.bz2"), bz.finish().unwrap()).unwrap();
    assert_eq!(d.ok(&["cpu.txt"]), gz);
    assert_eq!(d.ok(&["cpu.bz2"]), gz);
    // Two profiles merged by symbol: every value doubles, percentages stay.
    let twice = d.ok(&[CPU, "cpu.txt"]);
    let flat = section(&twice, "Flat profile (cumulative");
    assert!(flat.contains("  100.0       3.92  spin [7]"), "{flat}");
    assert!(flat.contains("   50.8       1.99  hot_a [8]"), "{flat}");
}

#[test]
fn several_trees_in_one_file_merge_by_symbol() {
    // One tree per thread; the second thread repeats a path and adds one.
    let text = "P=(ID=1 N=(prog) T=0.010000)\n\
        C1 FN0=(F0=(/nonexistent/prog)+16 N=(main))+0\n\
        C2 FN1=(F0+32 N=(work))+0 V0=(PERF_TICKS):(3,3,3)\n\
        C1 FN2=(F0+48 N=(thread_start))+0\n\
        C2 FN1+0 V0:(2,2,2)\n\
        C1 FN0+0\n\
        C2 FN1+0 V0:(5,5,5)\n";
    let d = Dir::new();
    std::fs::write(d.file("threads.txt"), text).unwrap();
    let out = d.ok(&["threads.txt"]);
    let flat = section(&out, "Flat profile (cumulative");
    assert!(flat.contains("  100.0       0.10  work [2]"), "{flat}");
    assert!(flat.contains("   80.0       0.08  main [3]"), "{flat}");
    assert!(
        flat.contains("   20.0       0.02  thread_start [4]"),
        "{flat}"
    );
}

#[test]
fn baseline_and_diff_mode() {
    // The baseline is the same run with hot_a's first sample count halved
    // (0x54 -> 0x2a ticks): the new profile has 42 more ticks, all in hot_a.
    let d = Dir::new();
    let mut plain = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(d.file(CPU)).unwrap()),
        &mut plain,
    )
    .unwrap();
    let base = plain.replacen("(PERF_TICKS):(54,54,54)", "(PERF_TICKS):(2a,2a,2a)", 1);
    assert_ne!(base, plain);
    std::fs::write(d.file("base.txt"), base).unwrap();
    let diff = d.ok_isolated(&["-b", "base.txt", CPU]);
    snapshot("baseline_perf", &diff);
    let flat = section(&diff, "Flat profile (cumulative");
    assert!(flat.contains("0.21  hot_a"), "{flat}");
    let delta = d.ok_isolated(&["-b", "base.txt", "-D", CPU]);
    snapshot("diff_mode_perf", &delta);
    // hot_a: 199 ticks now, 157 before: +26.8%.
    assert!(
        section(&delta, "Flat profile (cumulatively").contains("   26.8       0.21  hot_a"),
        "{delta}"
    );
}

#[test]
fn demangles_cpp_and_rust_names_and_names_recursion() {
    let text = "P=(ID=1 N=(prog) T=0.000000)\n\
        C1 FN0=(F0=(/nonexistent/libx.so)+16 N=(_ZN2ns3fooEi))+0\n\
        C2 FN1=(F0+32 N=(_ZN4core3fmt5write17h0123456789abcdefE))+0\n\
        C3 FN0+0 V0=(MEM_TOTAL):(2,64,64)\n";
    let d = Dir::new();
    std::fs::write(d.file("cxx.txt"), text).unwrap();
    let out = d.ok(&["-d", "cxx.txt"]);
    let flat = section(&out, "Flat profile (cumulative");
    assert!(flat.contains("ns::foo(int) [2]"), "{flat}");
    assert!(flat.contains("core::fmt::write [3]"), "{flat}");
    assert!(flat.contains("ns::foo(int)'2 [4]"), "{flat}");
    let raw = d.ok(&["cxx.txt"]);
    assert!(raw.contains("_ZN2ns3fooEi'2 [4]"), "{raw}");
}

#[test]
fn errors_are_one_clear_line() {
    let d = Dir::new();
    let e = d.fails(&["--frobnicate", CPU]);
    assert!(
        e.contains("unknown option '--frobnicate'")
            && e.contains("-mr/--merge-regexp")
            && e.contains("-r/--report"),
        "{e}"
    );
    let e = d.fails(&["missing.gz"]);
    assert!(e.contains("missing.gz: cannot open"), "{e}");
    // Among several inputs too: a name the user typed must exist.
    let e = d.fails(&[CPU, "missing.gz"]);
    assert!(e.contains("missing.gz: cannot open"), "{e}");
    std::fs::create_dir(d.file("empty-run")).unwrap();
    let e = d.fails(&["empty-run"]);
    assert!(e.contains("empty-run: no files in this directory"), "{e}");
    std::fs::create_dir(d.file("leftovers")).unwrap();
    std::fs::write(d.file("leftovers/p.gz"), b"").unwrap();
    std::fs::write(d.file("leftovers/p.gz.tmp"), b"P=(ID=1 N=(a) T=0.0)\n").unwrap();
    let (_, err, ok) = d.run(&["leftovers"]);
    assert!(!ok);
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "igprof-analyse: warning: skipping leftovers/p.gz: empty file (0 bytes)",
            "igprof-analyse: warning: skipping leftovers/p.gz.tmp: unfinished profile \
             (.tmp: its process was still writing it, or died while writing)",
            "igprof-analyse: none of the 2 input files is a readable profile (see the warnings above)",
        ]
    );
    // Named alone, a .tmp is read as the profile it may be.
    let (out, err, ok) = d.run(&["-r", "MEM_TOTAL", "leftovers/p.gz.tmp"]);
    assert!(ok && out.starts_with("Counter: MEM_TOTAL\n"), "{err}");
    let e = d.fails(&["-D", CPU]);
    assert!(e.contains("--baseline"), "{e}");
    let e = d.fails(&["-mr", "s/a/b", CPU]);
    assert!(e.contains("expected s/REGEXP/REPLACEMENT/"), "{e}");
    let e = d.fails(&["--value", "max", CPU]);
    assert!(e.contains("possible values: normal, peak"), "{e}");
    // A truncated gzip member, and a dump cut in the middle of a line.
    let gz = std::fs::read(d.file(MEM)).unwrap();
    std::fs::write(d.file("cut.gz"), &gz[..gz.len() / 2]).unwrap();
    let e = d.fails(&["cut.gz"]);
    assert!(
        e.starts_with("igprof-analyse: cut.gz:") && e.contains("read error"),
        "{e}"
    );
    std::fs::write(
        d.file("cut.txt"),
        "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0\nC2 FN1=(F0+1",
    )
    .unwrap();
    let e = d.fails(&["cut.txt"]);
    assert!(
        e.contains("cut.txt:3: file ends in the middle of a line"),
        "{e}"
    );
    std::fs::write(
        d.file("bad.txt"),
        "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0 V0=(X):(1,2;3)\n",
    )
    .unwrap();
    let e = d.fails(&["bad.txt"]);
    assert!(
        e.contains("bad.txt:2:38: syntax error: expected ','"),
        "{e}"
    );
}

/// IgProf's report of a counter with no values, byte for byte (its
/// `igprof-analyse -r PERF_TICKS` on a memory profile, `-r MEM_LIVE` and
/// `-r FD_USED` on a CPU profile): headings, no rows. Time counters have a
/// wider value column, MEM_* counters a Calls column.
fn empty_report(counter: &str) -> String {
    let rule = "-".repeat(70);
    let (total, own) = if counter == "PERF_TICKS" {
        ("      Total", "       Self")
    } else if counter.starts_with("MEM_") {
        ("     Total     Calls", "      Self     Calls")
    } else {
        ("     Total", "      Self")
    };
    format!(
        "Counter: {counter}\n\n{rule}\nFlat profile (cumulative >= 1%)\n\n\
         % total{total}  Function\n\n\n{rule}\nFlat profile (self >= 0.01%)\n\n\
         % total{own}  Function\n\n\n{rule}\nCall tree profile (cumulative)\n"
    )
}

#[test]
fn a_counter_without_values_gives_igprofs_empty_report() {
    // IgProf's analyser prints the empty report and exits 0 when the
    // requested counter is not in the profile; a warning on stderr says
    // which counters are there.
    let d = Dir::new();
    let (out, err, ok) = d.run(&["-r", "PERF_TICKS", MEM]);
    assert!(ok, "{err}");
    assert_eq!(out, empty_report("PERF_TICKS"));
    assert_eq!(
        err,
        "igprof-analyse: warning: counter 'PERF_TICKS' is not in the profile; \
         it has: MEM_TOTAL, MEM_MAX, MEM_LIVE (choose one with -r)\n"
    );
    for counter in ["MEM_LIVE", "FD_USED"] {
        let (out, err, ok) = d.run(&["-r", counter, CPU]);
        assert!(ok, "{err}");
        assert_eq!(out, empty_report(counter));
        assert!(err.contains("it has: PERF_TICKS"), "{err}");
    }
    // JSON and SQL hold their headers and no rows.
    let (json, _, ok) = d.run(&["-js", "-r", "PERF_TICKS", MEM]);
    assert!(ok && json.contains("\"mainrows\": [\n],"), "{json}");

    // A process that recorded nothing writes a header and no node, or nodes
    // without values: an empty report too (IgProf's analyser stops with "No
    // counter values in profile data." and status 1). Without -r there is no
    // counter to name.
    std::fs::write(d.file("header.txt"), "P=(HEX ID=1 N=(a) T=0.005000)\n").unwrap();
    std::fs::write(
        d.file("nocounter.txt"),
        "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0\n",
    )
    .unwrap();
    for file in ["header.txt", "nocounter.txt"] {
        let (out, err, ok) = d.run(&["-r", "MEM_LIVE", file]);
        assert!(ok, "{file}: {err}");
        assert_eq!(out, empty_report("MEM_LIVE"), "{file}");
        assert_eq!(
            err,
            "igprof-analyse: warning: no counter values in the profile data: nothing was recorded\n",
            "{file}"
        );
        let (out, _, ok) = d.run(&[file]);
        assert!(ok, "{file}");
        assert_eq!(out, empty_report("<none>"), "{file}");
    }
}

#[test]
fn help_lists_every_option() {
    let d = Dir::new();
    let help = d.ok(&["--help"]);
    for opt in [
        "--report",
        "--value",
        "--order",
        "--paths",
        "--calls",
        "--merge-regexp",
        "--merge-libraries",
        "--merge-ancestors",
        "--no-filter",
        "--text",
        "--sqlite",
        "--db",
        "--json",
        "--top",
        "--tree",
        "--libs",
        "--demangle",
        "--gdb",
        "--no-symbols",
        "--inline",
        "--lines",
        "--debug-dir",
        "--verbose",
        "--baseline",
        "--diff-mode",
        "--max-count-value",
        "--min-count-value",
        "--max-calls-value",
        "--min-calls-value",
        "--max-average-value",
        "--min-average-value",
        "(-mr",
        "(-ml",
        "(-nf",
        "(-js",
        "(-tn",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}");
    }
}

#[test]
fn recorded_names_are_the_fallback_for_missing_or_changed_objects() {
    // libc's dynamic symbol `printf` does not cover offset 0x10: the object
    // on disk is not the one profiled, so the recorded name stays. A missing
    // object keeps recorded names, and unnamed addresses become IgProf's
    // `@{object+offset}`.
    let text = "P=(HEX ID=1 N=(prog) T=0.000000)\n\
        C1 FN0=(F0=(/lib/x86_64-linux-gnu/libc.so.6)+10 N=(printf))+0\n\
        C2 FN1=(F1=(/nonexistent/libgone.so)+20 N=(gone_function))+0\n\
        C3 FN2=(F1+30 N=(@?0x7f0000000030))+0 V0=(MEM_TOTAL):(1,40,40)\n";
    let d = Dir::new();
    std::fs::write(d.file("changed.txt"), text).unwrap();
    let out = d.ok(&["changed.txt"]);
    let flat = section(&out, "Flat profile (cumulative");
    assert!(flat.contains(" printf [2]"), "{flat}");
    assert!(flat.contains(" gone_function [3]"), "{flat}");
    assert!(flat.contains(" @{libgone.so+48} [4]"), "{flat}");
}

#[test]
fn an_address_above_2_63_in_no_object_is_reported_by_its_recorded_name() {
    // Earlier profilers kept a corrupt return address (above 2^63) as a
    // frame in no object, written with the address as its offset; the
    // profiles they wrote still read, with `--inline` and without.
    let text = "P=(HEX ID=1 N=(node) T=0.001000)\n\
        C1 FN0=(F0=(<unknown>)+ffffffffffffffff N=(@?0xffffffffffffffff))+0\n\
        C2 FN1=(F0+7f0000000030 N=(@?0x7f0000000030))+0 V0=(PERF_TICKS):(3,3,3)\n";
    let d = Dir::new();
    std::fs::write(d.file("high.txt"), text).unwrap();
    for extra in [&[][..], &["--inline"][..]] {
        let out = d.ok(&[extra, &["high.txt"]].concat());
        let flat = section(&out, "Flat profile (cumulative");
        assert!(flat.contains(" @?0xffffffffffffffff [2]"), "{flat}");
        assert!(flat.contains(" @?0x7f0000000030 [3]"), "{flat}");
    }
}

#[test]
fn files_with_different_ids_merge_by_symbol_name() {
    // Two dumps (hex and decimal) number the same functions differently.
    let a = "P=(HEX ID=1 N=(prog) T=0.010000)\n\
        C1 FN0=(F0=(/nonexistent/prog)+10 N=(main))+0\n\
        C2 FN1=(F0+20 N=(work))+0 V0=(PERF_TICKS):(a,a,a)\n";
    let b = "P=(ID=2 N=(prog) T=0.010000)\n\
        C1 FN7=(F3=(/nonexistent/prog)+48 N=(other))+0 V5=(PERF_TICKS):(5,5,5)\n\
        C1 FN4=(F3+16 N=(main))+0\n\
        C2 FN9=(F3+32 N=(work))+0 V5:(5,5,5)\n";
    let d = Dir::new();
    std::fs::write(d.file("a.txt"), a).unwrap();
    std::fs::write(d.file("b.txt"), b).unwrap();
    let out = d.ok(&["a.txt", "b.txt"]);
    let flat = section(&out, "Flat profile (cumulative");
    assert!(
        flat.contains("  100.0       0.20  <spontaneous> [1]"),
        "{flat}"
    );
    assert!(flat.contains("   75.0       0.15  main [2]"), "{flat}");
    assert!(flat.contains("   75.0       0.15  work [3]"), "{flat}");
    assert!(flat.contains("   25.0       0.05  other [4]"), "{flat}");
}

#[test]
fn every_operator_new_variant_and_hooked_allocator_folds_into_its_caller() {
    // What igprof-rs records for `new (std::nothrow) int[5]` (operator new[]
    // nothrow reaching operator new), an aligned `new`, and aligned_alloc.
    let text = "P=(ID=1 N=(prog) T=0.000000)\n\
        C1 FN0=(F0=(/nonexistent/prog)+16 N=(main))+0\n\
        C2 FN1=(F0+32 N=(work))+0\n\
        C3 FN2=(F1=(/nonexistent/libstdc++.so.6)+16 N=(_ZnamRKSt9nothrow_t))+0\n\
        C4 FN3=(F1+32 N=(_Znwm))+0 V0=(MEM_TOTAL):(10,200,200)\n\
        C3 FN4=(F1+48 N=(_ZnwmSt11align_val_t))+0 V0:(10,640,640)\n\
        C3 FN5=(F2=(/nonexistent/libc.so.6)+16 N=(aligned_alloc))+0 V0:(10,1280,1280)\n";
    let d = Dir::new();
    std::fs::write(d.file("new.txt"), text).unwrap();
    let out = d.ok(&["-r", "MEM_TOTAL", "new.txt"]);
    let flat = section(&out, "Flat profile (self");
    assert!(flat.contains("2'120        30  work"), "{flat}");
    for wrapper in ["_Znam", "_Znwm", "aligned_alloc"] {
        assert!(!out.contains(wrapper), "{wrapper} not folded:\n{out}");
    }
}

/// The decompressed text of a fixture.
fn plain_text(d: &Dir, name: &str) -> String {
    let mut s = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(d.file(name)).unwrap()),
        &mut s,
    )
    .unwrap();
    s
}

#[test]
fn a_run_directory_is_read_as_one_profile_without_its_leftovers() {
    // What `igprof -o run/prof.gz` leaves after a run of several processes,
    // plus what a crash, a full disk or a live process can leave next to it.
    let d = Dir::new();
    std::fs::create_dir(d.file("run")).unwrap();
    let cpu = plain_text(&d, CPU);
    let mem = plain_text(&d, MEM);
    // Read first: a memory profile cut in the middle of line 30. Taken back
    // entirely, it neither picks the counter nor adds nodes (paths).
    let cut = &mem[..mem.match_indices('\n').nth(28).unwrap().0 + 12];
    assert_eq!(cut.lines().count(), 30);
    std::fs::write(d.file("run/a-cut.txt"), cut).unwrap();
    // A large profile (the reader hands over lines in batches, so most of it
    // is merged before the damage at its end shows) with new functions and
    // a counter of its own, ending in the middle of a line.
    let mut big = String::from("P=(ID=9 N=(big) T=0.005000)\n");
    big += "C1 FN0=(F0=(/nonexistent/big)+0 N=(big_0))+0 V0=(MEM_TOTAL):(1,8,8)\n";
    for i in 1..20_000 {
        big += &format!("C{} FN{i}=(F0+{i} N=(big_{i}))+0 V0:(1,8,8)\n", 1 + i % 2);
    }
    big += "C1 FN7+0 V0:(1,";
    std::fs::write(d.file("run/a-big.txt"), big).unwrap();
    std::fs::copy(d.file(CPU), d.file("run/b.gz")).unwrap();
    // A process still writing (the first half of a gzip stream).
    let gz = std::fs::read(d.file(CPU)).unwrap();
    std::fs::write(d.file("run/c.gz.tmp"), &gz[..gz.len() / 2]).unwrap();
    std::fs::write(d.file("run/d.gz"), b"").unwrap();
    // A process that recorded nothing: valid, adds nothing.
    std::fs::write(d.file("run/e.gz"), "P=(HEX ID=7f69 N=(sh) T=0.005000)\n").unwrap();
    // The CPU profile again, damaged on line 19 after 18 lines of values.
    let lines: Vec<&str> = cpu.lines().collect();
    assert!(lines[18].contains("V0:("), "{}", lines[18]);
    let bad = cpu.replacen(lines[18], &lines[18].replace("V0:(", "V0:["), 1);
    std::fs::write(d.file("run/f-bad.txt"), bad).unwrap();

    let alone = d.ok(&["-p", CPU]);
    let warnings = "igprof-analyse: warning: skipping run/a-big.txt: file ends in the middle of a line (truncated profile?) (line 20002)\n\
        igprof-analyse: warning: skipping run/a-cut.txt: file ends in the middle of a line (truncated profile?) (line 30)\n\
        igprof-analyse: warning: skipping run/c.gz.tmp: unfinished profile (.tmp: its process was still writing it, or died while writing)\n\
        igprof-analyse: warning: skipping run/d.gz: empty file (0 bytes)\n";
    let (out, err, ok) = d.run(&["-p", "run"]);
    assert!(ok, "{err}");
    assert_eq!(out, alone);
    let (last, first) = err.split_at(
        err.find("igprof-analyse: warning: skipping run/f-bad.txt")
            .unwrap(),
    );
    assert_eq!(last, warnings, "{err}");
    assert_eq!(
        first,
        "igprof-analyse: warning: skipping run/f-bad.txt: syntax error at column 12: \
         expected ':(<ticks>,<value>,<peak>)' after the counter, found ':[1b,1b,1b)' (line 19)\n"
    );
    // The same files named one by one (a shell's run/*), in another order.
    let (out2, err2, ok) = d.run(&[
        "-p",
        "run/f-bad.txt",
        "run/e.gz",
        "run/d.gz",
        "run/c.gz.tmp",
        "run/b.gz",
        "run/a-cut.txt",
        "run/a-big.txt",
    ]);
    assert!(ok, "{err2}");
    assert_eq!(out2, out);
    assert_eq!(err2.lines().count(), 5, "{err2}");
}
