//! Names of JIT code and of inlined calls, as perf and samply give them:
//! igprof-analyse reads the perf map (`perf-PID.map`) and jitdump
//! (`jit-PID.dump`) of each profiled process, and with `--inline` shows each
//! inlined function as a frame of its own.
//!
//! - A C program that copies code into an anonymous page and describes it
//!   in a jitdump, or in a perf map in /tmp: the code is named from it in
//!   the report and the views; a map left by another process with the
//!   same pid (older than the process) or none at all: one warning, the
//!   raw addresses kept.
//! - node `--perf-basic-prof` and the JVM's `-XX:+DumpPerfMapAtExit`, run
//!   under `perf record`: the hot JavaScript function or Java method is
//!   named, with the share perf gives it from the same map in the same run
//!   (node: its part of the samples of its script's two functions within
//!   5 points of perf's; the JVM: at least perf's share less 5 points).
//! - A C++ program built with -O2 -g whose hot function is inlined into two
//!   callers: each caller's share of it, in the text report and in
//!   `go tool pprof -traces` of the pprof view, is what `perf report
//!   --inline` (perf script --inline) gives in the same run, within 5
//!   points; built without debug info, `--inline` changes nothing.
//!
//! Needs perf, node, a JDK and go (scripts/setup installs them).

use igprof_tests::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// igprof-analyse `args` in `dir`: (stdout, stderr); it must succeed.
fn analyse(dir: &Path, args: &[&str]) -> (String, String) {
    let o = Command::new(analyser())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "igprof-analyse {args:?}: {err}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), err)
}

/// The self shares of a text report's second flat profile: name -> %.
fn self_shares(report: &str) -> BTreeMap<String, f64> {
    let section = report
        .split("Flat profile (self")
        .nth(1)
        .unwrap_or_else(|| panic!("no self flat profile:\n{report}"));
    let section = section.split("Call tree profile").next().unwrap();
    let mut out = BTreeMap::new();
    for line in section.lines() {
        let mut w = line.split_whitespace();
        let (Some(pct), Some(_self)) = (w.next(), w.next()) else {
            continue;
        };
        let Ok(pct) = pct.parse::<f64>() else {
            continue;
        };
        let rest: Vec<&str> = w.collect();
        let name = match rest.split_last() {
            Some((last, name)) if last.starts_with('[') => name.join(" "),
            _ => continue,
        };
        *out.entry(name).or_insert(0.0) += pct;
    }
    out
}

/// The pid in a profile's header.
fn profile_pid(p: &Path) -> u64 {
    parse_strict(&read_text(p)).unwrap().pid
}

/// `igprof args` in `dir` under `perf record -e cpu-clock PERF_ARGS -o
/// perf.data` (the same run is sampled by both; the callers sample every
/// millisecond, so that both have over a thousand samples).
fn under_perf(dir: &Path, perf_args: &[&str], args: &[&str]) -> Output {
    // One perf run at a time: perf's own symbolisation (addr2line for
    // inlined frames) gives up on a loaded machine.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let o = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o", "perf.data"])
        .args(perf_args)
        .arg("--")
        .arg(launcher())
        .args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib())
        .env("IGPROF_CACHE_DIR", test_store())
        .output()
        .expect("perf (scripts/setup installs linux-perf)");
    ok(&o);
    o
}

/// perf's self shares by symbol of `dir/perf.data` (the process's perf map
/// must still be in /tmp): name -> %, entries of one name (several
/// addresses of it) added.
fn perf_shares(dir: &Path) -> BTreeMap<String, f64> {
    let o = Command::new("perf")
        .args([
            "report",
            "-i",
            "perf.data",
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-q",
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut out = BTreeMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let line = line.trim();
        let Some((pct, rest)) = line.split_once("%") else {
            continue;
        };
        let Ok(pct) = pct.trim().parse::<f64>() else {
            continue;
        };
        let name = rest.trim_start();
        let name = name.get(4..).unwrap_or("").trim();
        *out.entry(name.to_string()).or_insert(0.0) += pct;
    }
    out
}

/// Removes /tmp/perf-PID.map when dropped (the maps the runtimes write).
struct TmpMap(PathBuf);

impl TmpMap {
    fn of(pid: u64) -> TmpMap {
        TmpMap(PathBuf::from(format!("/tmp/perf-{pid}.map")))
    }
}

impl Drop for TmpMap {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs jit_named under -pp (400 ms, `mode`, its file in `map_dir`, `.`:
/// the run's directory) in a fresh directory, profile `jit.gz`: (the
/// directory, the code's page as the program prints it).
fn jit_named(name: &str, mode: &str, map_dir: &str) -> (PathBuf, String) {
    let d = scratch(name);
    build(&d, "jit_named.c", "jit_named", &[]);
    let map_dir = if map_dir == "." {
        d.to_str().unwrap().to_string()
    } else {
        map_dir.to_string()
    };
    let o = igprof(
        &d,
        &["-pp", "-o", "jit.gz", "./jit_named", "400", mode, &map_dir],
    );
    ok(&o);
    let page = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    (d, page)
}

/// The share of the functions whose name starts with `@?0x` (raw addresses).
fn raw_share(shares: &BTreeMap<String, f64>) -> f64 {
    shares
        .iter()
        .filter(|(n, _)| n.starts_with("@?0x"))
        .map(|(_, s)| s)
        .sum()
}

#[test]
fn a_jitdump_names_the_code_it_describes() {
    let (d, _) = jit_named("jit-dump", "dump", ".");
    let pid = profile_pid(&d.join("jit.gz"));
    assert!(d.join(format!("jit-{pid}.dump")).exists());
    let (report, err) = analyse(&d, &["jit.gz"]);
    assert!(!err.contains("warning"), "{err}");
    let s = self_shares(&report);
    let jit = s.get("jitted_count_down").copied().unwrap_or(0.0);
    assert!(jit >= 80.0, "{s:?}\n{report}");
    assert_eq!(raw_share(&s), 0.0, "{s:?}");
    // Its debug-info record gives the line.
    let (lines, _) = analyse(&d, &["--lines", "jit.gz"]);
    assert!(
        self_shares(&lines).contains_key("jitted_count_down (generated.js:7)"),
        "{lines}"
    );
    // The views name it too, and with -l its object is the dump.
    let (folded, _) = analyse(&d, &["--folded", "-", "jit.gz"]);
    assert!(
        folded.lines().any(|l| l.starts_with("jitted_count_down ")),
        "{folded}"
    );
    let (libs, _) = analyse(&d, &["-l", "jit.gz"]);
    assert!(libs.contains(&format!("jit-{pid}.dump")), "{libs}");
    // Moved elsewhere, it is found with --jit-map FILE.
    let other = d.join("elsewhere");
    std::fs::create_dir(&other).unwrap();
    let moved = other.join("saved.dump");
    std::fs::rename(d.join(format!("jit-{pid}.dump")), &moved).unwrap();
    let (report, _) = analyse(&d, &["jit.gz"]);
    assert!(!self_shares(&report).contains_key("jitted_count_down"));
    let (report, err) = analyse(&d, &["--jit-map", moved.to_str().unwrap(), "jit.gz"]);
    assert!(self_shares(&report)["jitted_count_down"] >= 80.0, "{err}");
}

/// Seconds since the Unix epoch of the header note `label`.
fn note_time(notes: &[String], label: &str) -> f64 {
    notes
        .iter()
        .find_map(|n| n.strip_prefix(label)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no '{label}' note in {notes:?}"))
}

#[test]
fn profiles_say_when_their_process_started_and_was_dumped() {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let before = now();
    let (d, _) = jit_named("jit-notes", "none", ".");
    let after = now();
    let p = parse_strict(&read_text(&d.join("jit.gz"))).unwrap();
    assert_eq!(p.program, "./jit_named", "{:?}", p.notes);
    let (started, dumped) = (
        note_time(&p.notes, "started"),
        note_time(&p.notes, "dumped"),
    );
    // The program burns 400 ms of CPU time between the two.
    assert!(
        before <= started && started + 0.39 <= dumped && dumped <= after,
        "{before} {started} {dumped} {after}"
    );
}

#[test]
fn a_perf_map_in_tmp_names_the_code() {
    let (d, page) = jit_named("jit-map", "map", "/tmp");
    let pid = profile_pid(&d.join("jit.gz"));
    let _map = TmpMap::of(pid);
    let (report, err) = analyse(&d, &["jit.gz"]);
    assert!(!err.contains("warning"), "{err}");
    let s = self_shares(&report);
    assert!(
        s.get("jitted_count_down").copied().unwrap_or(0.0) >= 80.0,
        "{s:?}"
    );
    // pprof names it.
    analyse(&d, &["--pprof", "jit.pb.gz", "jit.gz"]);
    let mut pb = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(d.join("jit.pb.gz")).unwrap()),
        &mut pb,
    )
    .unwrap();
    let pb = String::from_utf8_lossy(&pb);
    assert!(pb.contains("jitted_count_down"));
    assert!(!pb.contains(&format!("@?{page}")));
}

#[test]
fn a_stale_or_missing_map_gives_one_warning_and_keeps_the_addresses() {
    // The map's time is before the process started: another process's.
    let (d, _) = jit_named("jit-stale", "stale", "/tmp");
    let pid = profile_pid(&d.join("jit.gz"));
    let _map = TmpMap::of(pid);
    let (report, err) = analyse(&d, &["jit.gz"]);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(&format!("/tmp/perf-{pid}.map is not used"))
            && warnings[0].contains("before process"),
        "{err}"
    );
    let s = self_shares(&report);
    assert!(!s.contains_key("jitted_count_down"), "{s:?}");
    assert!(raw_share(&s) >= 80.0, "{s:?}");
    // Given by name, the user vouches for it.
    let (report, _) = analyse(
        &d,
        &["--jit-map", &format!("/tmp/perf-{pid}.map"), "jit.gz"],
    );
    assert!(self_shares(&report).contains_key("jitted_count_down"));

    // No map at all.
    let (d, _) = jit_named("jit-none", "none", ".");
    let pid = profile_pid(&d.join("jit.gz"));
    let (report, err) = analyse(&d, &["jit.gz"]);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains(&format!("no perf-{pid}.map")), "{err}");
    assert!(raw_share(&self_shares(&report)) >= 80.0, "{report}");
    // A map cut short is not used either.
    let map = d.join(format!("perf-{pid}.map"));
    std::fs::write(&map, b"7f0000000000 10 f\n7f00").unwrap();
    let (_, err) = analyse(&d, &["jit.gz"]);
    assert!(err.contains("is cut short"), "{err}");
}

/// The name containing `part` with the greatest self share in `shares`
/// (a report's), and that share; it must be there.
fn named(shares: &BTreeMap<String, f64>, part: &str, report: &str, err: &str) -> (String, f64) {
    shares
        .iter()
        .filter(|(n, _)| n.contains(part))
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(n, s)| (n.clone(), *s))
        .unwrap_or_else(|| panic!("{part} is not named: {err}\n{report}"))
}

/// Checks that `name_part` is named in the profile `dir/prof` with at
/// least the self share perf gives it in the same run, less 5 points.
fn at_least_perfs_share(dir: &Path, prof: &str, name_part: &str) {
    let (report, err) = analyse(dir, &[prof]);
    let (name, share) = named(&self_shares(&report), name_part, &report, &err);
    let perf = perf_shares(dir);
    let theirs = perf.get(&name).copied().unwrap_or(0.0);
    assert!(share >= 30.0, "{name}: {share}%\n{report}");
    assert!(
        theirs - share <= 5.0,
        "{name}: {share}% here, {theirs}% in perf report\n{perf:?}\n{report}"
    );
}

/// Checks that the JIT functions whose names contain `hot` and `cold` are
/// named in the profile `dir/prof` and split the samples the two share as
/// perf splits its own of the same run: hot's part of the two within 5
/// points, and hot at least 30% of every sample. Their shares of *every*
/// sample differ between the two by what each counts besides them (perf
/// also samples the launcher and the profiler's own code, start-up,
/// sampler and dump; both the runtime's start and its compiler), in
/// proportions that move with the machine's load: hotLoop's share of every
/// sample was 69.5% and 70.9% here against 65.0% and 66.7% in perf (idle),
/// 67.9-69.7% against 63.5-64.4% (beside two CPU hogs), 4-5 points apart
/// where the check allowed 5, while its part of the two functions' samples
/// was 82.8-83.8% here and 83.0-83.2% in perf.
fn same_split_as_perf(dir: &Path, prof: &str, hot: &str, cold: &str) {
    let (report, err) = analyse(dir, &[prof]);
    let ours = self_shares(&report);
    let (hot, h) = named(&ours, hot, &report, &err);
    let (cold, c) = named(&ours, cold, &report, &err);
    assert!(h >= 30.0, "{hot}: {h}%\n{report}");
    let perf = perf_shares(dir);
    let theirs = |n: &str| perf.get(n).copied().unwrap_or(0.0);
    let (ph, pc) = (theirs(&hot), theirs(&cold));
    let (split, perf_split) = (
        100.0 * h / (h + c),
        100.0 * ph / (ph + pc).max(f64::MIN_POSITIVE),
    );
    eprintln!(
        "{hot}: {h}% here, {ph}% in perf; of the two: {split:.1}% here, {perf_split:.1}% in perf"
    );
    assert!(
        (split - perf_split).abs() <= 5.0,
        "{hot}: {split:.1}% of the two here ({h}%, {cold} {c}%), {perf_split:.1}% in perf report ({ph}%, {pc}%)\n{perf:?}\n{report}"
    );
}

/// node runs its compiler and garbage collector on its main thread
/// (`--single-threaded`): the profiler's per-thread CPU-time timers sample
/// threads that run in short bursts less often than perf does, which is
/// not what this test is about.
#[test]
fn node_perf_basic_prof_names_the_hot_function_as_perf_does() {
    let d = scratch("jit-node");
    let script = d.join("hot.js");
    std::fs::write(
        &script,
        "function hotLoop(n) { let x = 0; for (let i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; } return x; }\n\
         function coldLoop(n) { let x = 0; for (let i = 0; i < n; i++) { x = (x + i) % 7; } return x; }\n\
         const until = Date.now() + 1500;\n\
         let s = 0;\n\
         while (Date.now() < until) { s += hotLoop(2000000); s += coldLoop(500000); }\n\
         console.log(s > 0 ? 'done' : 'done.');\n",
    )
    .unwrap();
    let o = under_perf(
        &d,
        &[],
        &[
            "-pp",
            "-i",
            "1ms",
            "-o",
            "node.gz",
            "node",
            "--single-threaded",
            "--perf-basic-prof",
            "hot.js",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n");
    let _map = TmpMap::of(profile_pid(&d.join("node.gz")));
    same_split_as_perf(&d, "node.gz", "hotLoop", "coldLoop");
}

#[test]
fn the_jvm_perf_map_names_the_hot_method_as_perf_does() {
    let d = scratch("jit-java");
    java_class(
        &d,
        "public class Hot {\n\
         static long hotMethod(long n) { long x = 0; for (long i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; } return x; }\n\
         static long coldMethod(long n) { long x = 0; for (long i = 0; i < n; i++) { x = (x + i) % 7; } return x; }\n\
         public static void main(String[] a) {\n\
         long until = System.currentTimeMillis() + 1500; long s = 0;\n\
         while (System.currentTimeMillis() < until) { s += hotMethod(2000000); s += coldMethod(500000); }\n\
         System.out.println(s > 0 ? \"done\" : \"done.\");\n\
         }\n}\n",
    );
    let o = under_perf(
        &d,
        &[],
        &[
            "-pp",
            "-i",
            "1ms",
            "-o",
            "java.gz",
            "java",
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DumpPerfMapAtExit",
            "-cp",
            ".",
            "Hot",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n");
    let _map = TmpMap::of(profile_pid(&d.join("java.gz")));
    // The JIT compiler's threads run in bursts, which the profiler's
    // per-thread CPU-time timers sample less often than perf does: the
    // method's share is at least perf's (less 5 points), as the issue asks.
    at_least_perfs_share(&d, "java.gz", "Hot.hotMethod");
}

/// Compiles `source`, a Java class `Hot`, into `dir` (javac).
fn java_class(dir: &Path, source: &str) {
    std::fs::write(dir.join("Hot.java"), source).unwrap();
    let st = Command::new("javac")
        .arg("Hot.java")
        .current_dir(dir)
        .status()
        .expect("javac (scripts/setup installs a JDK)");
    assert!(st.success());
}

/// The inlined function of inline_hot.cpp, demangled.
const MIX: &str = "mix(unsigned long, long)";

/// Each caller's share of the samples in `mix` inlined into it, from
/// `perf script --inline` of `dir/perf.data` (first two frames of each
/// sample of the program). The program is all but entirely in `mix`: when
/// perf's addr2line gave up on some addresses (they then show no inlined
/// frame), perf script is run again, up to three times.
fn perf_inline_shares(dir: &Path) -> BTreeMap<String, f64> {
    let mut last = BTreeMap::new();
    for _ in 0..3 {
        last = perf_script_inline_shares(dir);
        if last.values().sum::<f64>() >= 90.0 {
            break;
        }
    }
    last
}

/// One run of `perf script --inline` for [`perf_inline_shares`].
fn perf_script_inline_shares(dir: &Path) -> BTreeMap<String, f64> {
    let o = Command::new("perf")
        .args(["script", "-i", "perf.data", "-F", "comm,ip,sym", "--inline"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let (mut total, mut by) = (0usize, BTreeMap::<String, usize>::new());
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        if lines.next().map(str::trim) != Some("inline_hot") {
            continue;
        }
        total += 1;
        let frames: Vec<String> = lines
            .take(2)
            .map(|l| {
                let l = l.trim();
                l.split_once(' ').map_or(l, |(_, s)| s).to_string()
            })
            .collect();
        if frames.len() == 2 && frames[0].starts_with("mix") && frames[0].ends_with(" (inlined)") {
            *by.entry(frames[1].clone()).or_insert(0) += 1;
        }
    }
    assert!(total > 100, "{total} samples of inline_hot in perf.data");
    by.into_iter()
        .map(|(k, n)| (k, 100.0 * n as f64 / total as f64))
        .collect()
}

/// The callers of `mix` in the call-graph entry of the text report, with
/// their shares of the total.
fn report_callers_of_mix(report: &str) -> BTreeMap<String, f64> {
    let entry = report
        .split("- - - -")
        .find(|b| {
            b.lines()
                .any(|l| l.starts_with('[') && l.trim_end().ends_with(MIX))
        })
        .unwrap_or_else(|| panic!("no entry for mix:\n{report}"));
    let mut out = BTreeMap::new();
    for l in entry.lines().take_while(|l| !l.starts_with('[')) {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() < 6 {
            continue;
        }
        let name = w[5..w.len() - 1].join(" ");
        out.insert(name, w[0].parse::<f64>().unwrap());
    }
    out
}

/// Each caller's share of `mix (inline)` in `go tool pprof -traces`.
fn pprof_callers_of_mix(dir: &Path, file: &str) -> BTreeMap<String, f64> {
    let o = Command::new("go")
        .args(["tool", "pprof", "-traces", file])
        .current_dir(dir)
        .output()
        .expect("go (scripts/setup installs golang-go)");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (mut total, mut by) = (0.0, BTreeMap::new());
    for trace in text.split("-----------+-") {
        let lines: Vec<&str> = trace
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.contains("-------"))
            .collect();
        let Some(first) = lines.first() else { continue };
        let Some((value, leaf)) = first.trim().split_once(char::is_whitespace) else {
            continue;
        };
        // pprof's unit is the largest that keeps the number above 1.
        let ms = [("ns", 1e-6), ("us", 1e-3), ("ms", 1.0), ("s", 1e3)]
            .iter()
            .find_map(|(unit, k)| Some(value.strip_suffix(unit)?.parse::<f64>().ok()? * k));
        let Some(ms) = ms else { continue };
        total += ms;
        if leaf.trim() == format!("{MIX} (inline)") {
            if let Some(caller) = lines.get(1) {
                *by.entry(caller.trim().to_string()).or_insert(0.0) += ms;
            }
        }
    }
    by.into_iter()
        .map(|(k, v): (String, f64)| (k, 100.0 * v / total))
        .collect()
}

#[test]
fn inlined_calls_are_frames_with_the_shares_perf_report_inline_gives() {
    let d = scratch("jit-inline");
    build(&d, "inline_hot.cpp", "inline_hot", &[]);
    under_perf(
        &d,
        &["-F", "1000", "--call-graph", "dwarf,1024"],
        &["-pp", "-i", "1ms", "-o", "i.gz", "./inline_hot", "1500"],
    );
    let perf = perf_inline_shares(&d);
    let (report, _) = analyse(&d, &["--inline", "-d", "i.gz"]);
    let ours = report_callers_of_mix(&report);
    analyse(&d, &["--inline", "-d", "--pprof", "i.pb.gz", "i.gz"]);
    let traces = pprof_callers_of_mix(&d, "i.pb.gz");
    for (caller, perf_name) in [
        ("caller_a(unsigned long)", "caller_a"),
        ("caller_b(unsigned long)", "caller_b"),
    ] {
        let theirs = perf.get(perf_name).copied().unwrap_or(0.0);
        for (what, shares) in [("text report", &ours), ("pprof -traces", &traces)] {
            let share = shares.get(caller).copied().unwrap_or(0.0);
            assert!(
                (share - theirs).abs() <= 5.0,
                "{caller}: {share}% in the {what}, {theirs}% in perf\n{shares:?}\n{perf:?}\n{report}"
            );
        }
    }
    assert!(ours["caller_a(unsigned long)"] > ours["caller_b(unsigned long)"]);
    // Without --inline, mix is no frame of its own.
    let (plain, _) = analyse(&d, &["-d", "i.gz"]);
    assert!(!self_shares(&plain).contains_key(MIX), "{plain}");

    // Without debug info, --inline changes nothing.
    let nodebug = scratch("jit-inline-nodebug");
    build(&nodebug, "inline_hot.cpp", "inline_hot", &["-g0"]);
    ok(&igprof(
        &nodebug,
        &["-pp", "-o", "i.gz", "./inline_hot", "300"],
    ));
    let (with, _) = analyse(&nodebug, &["--inline", "-d", "i.gz"]);
    let (without, _) = analyse(&nodebug, &["-d", "i.gz"]);
    let program = |r: &str| -> BTreeMap<String, f64> {
        self_shares(r)
            .into_iter()
            .filter(|(n, _)| n.starts_with("caller_") || n == MIX)
            .collect()
    };
    assert_eq!(program(&with), program(&without), "{with}");
    assert!(!program(&with).contains_key(MIX), "{with}");
    assert!(program(&with).len() == 2, "{with}");
}

/// The lines of a run's stderr that are the program's (the profiler's
/// `igprof:` lines left out).
fn program_stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.starts_with("igprof:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `--jit` with node and the JVM given no option of their own: the output,
/// error output and status are the unprofiled run's (no "Picked up ..."
/// line: the JVM is asked through its own start-up, not
/// JAVA_TOOL_OPTIONS; no isolate log: node is given
/// --perf-basic-prof-only-functions), the map is copied beside the profile,
/// and names the hot function there once /tmp's is gone, also after both
/// moved to another directory.
#[test]
fn jit_turns_the_maps_on_and_keeps_them_with_the_profile() {
    let d = scratch("jit-option");
    std::fs::write(
        d.join("hot.js"),
        "function hotLoop(n) { let x = 0; for (let i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; } return x; }\n\
         const until = Date.now() + 600; let s = 0;\n\
         while (Date.now() < until) { s += hotLoop(2000000); }\n\
         console.log(s > 0 ? 'done' : 'done.'); console.error('to stderr');\n",
    )
    .unwrap();
    java_class(
        &d,
        "public class Hot {\n\
         static long hotMethod(long n) { long x = 0; for (long i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; } return x; }\n\
         public static void main(String[] a) {\n\
         long until = System.currentTimeMillis() + 800; long s = 0;\n\
         while (System.currentTimeMillis() < until) { s += hotMethod(2000000); }\n\
         System.out.println(s > 0 ? \"done\" : \"done.\"); System.err.println(\"to stderr\"); System.exit(3);\n\
         }\n}\n",
    );
    for (name, cmd, hot) in [
        ("node", &["node", "hot.js"][..], "hotLoop"),
        ("java", &["java", "-cp", ".", "Hot"][..], "Hot.hotMethod"),
    ] {
        let plain = Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(&d)
            .output()
            .unwrap();
        let prof = format!("{name}.gz");
        let mut args = vec!["--jit", "-pp", "-i", "1ms", "-o", &prof];
        args.extend(cmd);
        let o = igprof(&d, &args);
        assert_eq!(o.status.code(), plain.status.code(), "{name}: status");
        assert_eq!(o.stdout, plain.stdout, "{name}: stdout");
        assert_eq!(program_stderr(&o), program_stderr(&plain), "{name}: stderr");
        let pid = profile_pid(&d.join(&prof));
        let copy = d.join(format!("perf-{pid}.map"));
        assert!(copy.exists(), "{name}: no map beside the profile");
        assert!(
            std::fs::read_dir(&d).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("isolate-")),
            "{name}: a file the unprofiled run does not write"
        );
        drop(TmpMap::of(pid));
        let (report, err) = analyse(&d, &[&prof]);
        assert!(
            report.contains(hot),
            "{name}: {hot} not named\n{err}\n{report}"
        );
        let moved = scratch(&format!("jit-option-moved-{name}"));
        std::fs::rename(d.join(&prof), moved.join(&prof)).unwrap();
        std::fs::rename(&copy, moved.join(copy.file_name().unwrap())).unwrap();
        let (report, err) = analyse(&moved, &[&prof]);
        assert!(
            report.contains(hot),
            "{name} moved: {hot} not named\n{err}\n{report}"
        );
    }
}
