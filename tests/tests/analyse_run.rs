//! igprof-analyse on what real runs leave: the run directory of a program
//! that forks, execs and runs a shell (one profile per process, some of them
//! empty, plus the leftovers a crash or a live process can leave), and the
//! names of code without symbols (a stripped program, JIT code).
//!
//! Needs the release library and analyser: `cargo build --release --workspace`.

use igprof_tests::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs igprof-analyse in `dir`.
fn analyse(dir: &Path, args: &[&str]) -> Output {
    Command::new(analyser())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// stdout of a successful igprof-analyse run, and its stderr.
fn analyse_ok(dir: &Path, args: &[&str]) -> (String, String) {
    let o = analyse(dir, args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "igprof-analyse {args:?}: {err}");
    (String::from_utf8(o.stdout).unwrap(), err)
}

/// `"total_counts": N` of a JSON report.
fn json_total(json: &str) -> i64 {
    let at = json.find("\"total_counts\": ").expect("total_counts") + 16;
    json[at..]
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The cumulative percentage of `func` in a text report's first table.
fn share(report: &str, func: &str) -> f64 {
    let flat = report.split("Flat profile (self").next().unwrap();
    flat.lines()
        .find(|l| l.split_whitespace().nth(2) == Some(func))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{func} not in the report:\n{report}"))
}

fn gzip(text: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(text).unwrap();
    e.finish().unwrap()
}

#[test]
fn a_run_directory_of_several_processes_is_one_report() {
    let d = scratch("analyse-run");
    build(&d, "procs.c", "procs", &[]);
    std::fs::create_dir(d.join("run")).unwrap();
    ok(&igprof(&d, &["-pp", "-o", "run/prof.gz", "./procs"]));
    let written = profiles_in(&d.join("run"));
    // The parent, its forked child, its exec'd child (and that child's
    // image before exec), and system()'s shell.
    assert!(written.len() >= 4, "{written:?}");
    let parsed: Vec<Profile> = written
        .iter()
        .map(|p| parse_strict(&read_text(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    let ticks: u64 = parsed.iter().map(|p| total(p, "PERF_TICKS")).sum();
    let empty = parsed.iter().filter(|p| p.nodes.is_empty()).count();
    assert!(empty >= 1, "the shell records nothing: {written:?}");

    // A profile that recorded nothing, alone: the empty report, status 0.
    let nothing = &written[parsed.iter().position(|p| p.nodes.is_empty()).unwrap()];
    let (out, err) = analyse_ok(&d, &[nothing.to_str().unwrap()]);
    assert!(
        out.starts_with("Counter: <none>\n") && !out.contains(" ["),
        "{out}"
    );
    assert_eq!(
        err,
        "igprof-analyse: warning: no counter values in the profile data: nothing was recorded\n"
    );

    // What else a run directory can hold: a profile still being written, a
    // file created by a process killed before it wrote anything, and a
    // profile cut short (a full disk).
    let parent = std::fs::read(d.join("run/prof.gz")).unwrap();
    std::fs::write(d.join("run/prof.1.gz.tmp"), &parent[..parent.len() / 2]).unwrap();
    std::fs::write(d.join("run/prof.2.gz"), b"").unwrap();
    let text = read_text(&d.join("run/prof.gz"));
    let cut_at = text.trim_end().rfind(':').unwrap();
    let cut_line = text[..cut_at].lines().count();
    std::fs::write(d.join("run/prof.3.gz"), gzip(&text.as_bytes()[..cut_at])).unwrap();

    let (json, err) = analyse_ok(&d, &["-js", "run"]);
    assert_eq!(
        err,
        format!(
            "igprof-analyse: warning: skipping run/prof.1.gz.tmp: unfinished profile (.tmp: its process was still writing it, or died while writing)\n\
             igprof-analyse: warning: skipping run/prof.2.gz: empty file (0 bytes)\n\
             igprof-analyse: warning: skipping run/prof.3.gz: file ends in the middle of a line (truncated profile?) (line {cut_line})\n"
        )
    );
    // Every tick of every process, once.
    assert_eq!(json_total(&json), ticks as i64, "{json}");
    let (report, _) = analyse_ok(&d, &["run"]);
    assert!(report.starts_with("Counter: PERF_TICKS\n"), "{report}");
    for f in ["parent_work", "forked_child_work", "exec_child_work"] {
        let s = share(&report, f);
        assert!((20.0..=46.0).contains(&s), "{f}: {s}%\n{report}");
    }
    // The same as naming the profiles one by one.
    let names: Vec<&str> = written.iter().map(|p| p.to_str().unwrap()).collect();
    let (named, err) = analyse_ok(&d, &names);
    assert_eq!(named, report);
    assert_eq!(err, "");

    // The damaged profile alone is an error with its line, not a report.
    let o = analyse(&d, &["run/prof.3.gz"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "igprof-analyse: run/prof.3.gz:{cut_line}: file ends in the middle of a line (truncated profile?)\n"
        )
    );
}

/// The profiles in a run directory.
fn profiles_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Start offsets of the PLT sections of a PIE program (`.plt`,
/// `.plt.got`, `.plt.sec`): the unwind tables describe each section's
/// stubs with one entry, so an address in a stub is named from its
/// section's start.
fn plt_starts_of(program: &Path) -> Vec<u64> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(program).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
        .map(|s| s.address())
        .collect()
}

/// Functions of an unstripped PIE program, from `nm -S`: (name, start
/// offset, size).
fn functions_of(program: &Path) -> Vec<(String, u64, u64)> {
    let o = Command::new("nm")
        .arg("-S")
        .arg(program)
        .output()
        .expect("run nm");
    assert!(o.status.success());
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let [addr, size, kind, name] = w[..] else {
                return None;
            };
            if !matches!(kind, "t" | "T") {
                return None;
            }
            let hex = |s| u64::from_str_radix(s, 16).ok();
            Some((name.to_string(), hex(addr)?, hex(size)?))
        })
        .collect()
}

#[test]
fn a_stripped_program_has_one_entry_per_function() {
    let d = scratch("analyse-stripped");
    let full = build(&d, "stripped_hot.c", "full", &["-fPIE", "-pie"]);
    let st = Command::new("strip")
        .arg("-o")
        .arg(d.join("stripped_hot"))
        .arg(&full)
        .status()
        .unwrap();
    assert!(st.success());
    // -d: should the sampling fail, the profiler's account of it is in
    // the failure message.
    let log = ok(&igprof(
        &d,
        &["-d", "-pp", "-o", "hot.gz", "./stripped_hot", "150"],
    ));
    let (report, _) = analyse_ok(&d, &["hot.gz"]);
    let functions = functions_of(&full);
    let function = |f: &str| {
        functions
            .iter()
            .find(|(n, _, _)| n == f || n.starts_with(&format!("{f}.")))
            .unwrap_or_else(|| panic!("{f} not in {functions:?}"))
            .clone()
    };
    let start_of = |f: &str| function(f).1;
    // A tick can land in a PLT stub (printf's first call goes through the
    // lazy-binding stub, a page fault there included).
    let plt = plt_starts_of(&full);
    // Every name of the program is a function start (or a PLT section's),
    // and each hot function is one entry with all the ticks of the
    // addresses inside it.
    let flat = report.split("Flat profile (self").next().unwrap();
    let named: Vec<&str> = flat
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|n| n.starts_with("@{stripped_hot+"))
        .collect();
    for n in &named {
        let offset: u64 = n["@{stripped_hot+".len()..n.len() - 1].parse().unwrap();
        assert!(
            functions.iter().any(|(_, s, _)| *s == offset) || plt.contains(&offset),
            "{n} is not a function start: {functions:?}, PLT sections at {plt:?}\n{report}"
        );
    }
    let profile = parse_strict(&read_text(&d.join("hot.gz"))).unwrap();
    let all = total(&profile, "PERF_TICKS") as f64;
    for f in ["hot_a", "hot_b", "hot_c"] {
        let (_, start, size) = function(f);
        let (mut ticks, mut addresses) = (0, std::collections::BTreeSet::new());
        for n in &profile.nodes {
            let func = &profile.funcs[&n.func];
            let inside = (start..start + size).contains(&func.object_offset);
            if func.file.ends_with("/stripped_hot") && inside {
                addresses.insert(func.object_offset);
                ticks += n.values.iter().map(|v| v.ticks).sum::<u64>();
            }
        }
        // hot_a (60% of the samples) is always sampled at several
        // addresses, which the entry must merge; hot_b's and hot_c's
        // loops are multiply chains whose samples mostly land after the
        // multiply: hot_c (about 16 samples) once had all at one address.
        let least = if f == "hot_a" { 2 } else { 1 };
        assert!(
            addresses.len() >= least,
            "{f}: sampled at {addresses:?}, {all} ticks in all\n{report}\n{log}"
        );
        let want = 100.0 * ticks as f64 / all;
        let s = share(&report, &format!("@{{stripped_hot+{start}}}"));
        assert!(
            (s - want).abs() <= 0.051,
            "{f}: {s}%, {want}% in the profile\n{report}"
        );
    }
    let (work, main) = (start_of("work"), start_of("main"));
    for f in [work, main] {
        assert!(
            named.contains(&format!("@{{stripped_hot+{f}}}").as_str()),
            "{report}"
        );
    }
}

#[test]
fn jit_code_is_named_by_its_address() {
    let d = scratch("analyse-jit");
    build(&d, "jit_named.c", "jit_named", &[]);
    // It writes no perf map: the code keeps its address.
    let o = igprof(
        &d,
        &["-pp", "-o", "jit.gz", "./jit_named", "300", "none", "."],
    );
    ok(&o);
    let page = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let page = u64::from_str_radix(page.trim_start_matches("0x"), 16).unwrap();
    let (report, _) = analyse_ok(&d, &["jit.gz"]);
    assert!(!report.contains("@{<unknown>"), "{report}");
    // Almost all the time is in the copied loop, named @?0x<address in the page>.
    let flat = report.split("Flat profile (self").next().unwrap();
    let jit: f64 = flat
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let pct: f64 = w.next()?.parse().ok()?;
            let name = w.nth(1)?;
            let addr = u64::from_str_radix(name.strip_prefix("@?0x")?, 16).ok()?;
            (page..page + 4096).contains(&addr).then_some(pct)
        })
        .fold(0.0, f64::max);
    assert!(jit >= 80.0, "{report}");
}
