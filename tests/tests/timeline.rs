//! The timeline (`--sample-every`, `--dump-every`), read through
//! igprof-analyse: tests/programs/timeline_phases.c leaks 100 blocks at
//! its start, then a block of 10,000 bytes every 50 ms in its second phase
//! only, and prints when each phase started and ended (Unix time). The
//! CSV's live heap must be flat in phases one and three and grow by what
//! phase two leaked; the window over phase two (`--between`) must have
//! the leaking function on top; each process of a run keeps its own
//! timeline and snapshots.

use igprof_tests::*;
use std::path::Path;

/// timeline_phases built in a fresh directory (-fno-builtin: GCC
/// removes allocations it sees unused).
fn built(name: &str) -> std::path::PathBuf {
    let d = scratch(name);
    build(
        &d,
        "timeline_phases.c",
        "timeline_phases",
        &["-fno-builtin"],
    );
    d
}

/// The phases' (start, end) in Unix seconds and the bytes phase two
/// leaked, from the program's output.
fn phases(out: &str) -> (Vec<(f64, f64)>, u64) {
    let mut p = Vec::new();
    let mut leaked = 0;
    for l in out.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        match w.as_slice() {
            ["phase", "two", "leaked", n] => leaked = n.parse().unwrap(),
            ["phase", _, a, b] => p.push((a.parse().unwrap(), b.parse().unwrap())),
            _ => {}
        }
    }
    assert_eq!(p.len(), 3, "{out}");
    (p, leaked)
}

/// When the profile's process started (its `started` note), Unix seconds.
fn started(profile: &Path) -> f64 {
    let text = read_text(profile);
    let header = text.lines().next().unwrap();
    let at = header.find("started ").expect("started note") + 8;
    header[at..]
        .split([';', ']'])
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `igprof-analyse ARGS` run in `dir`.
fn analyse(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(analyser())
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// igprof-analyse's CSV: its header and rows (empty cells: None).
fn csv(dir: &Path, args: &[&str]) -> (Vec<String>, Vec<Vec<Option<f64>>>) {
    let o = analyse(dir, &[&["--timeline", "-"], args].concat());
    let out = ok(&o);
    let text = String::from_utf8(o.stdout).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or_else(|| panic!("no CSV: {out}"))
        .split(',')
        .map(str::to_string)
        .collect();
    let rows = lines
        .map(|l| {
            l.split(',')
                .take(header.len())
                .map(|c| c.parse::<f64>().ok())
                .collect()
        })
        .collect();
    (header, rows)
}

fn col(header: &[String], name: &str) -> usize {
    header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
}

/// Profiles of `dir` whose names start with `stem`.
fn dumps(dir: &Path, stem: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(stem) && n.ends_with(".gz"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_live_heap_grows_in_the_second_phase_only() {
    let d = built("timeline-csv");
    let o = igprof(
        &d,
        &[
            "-mp",
            "--sample-every",
            "100ms",
            "-o",
            "prof.gz",
            "./timeline_phases",
            "1.5",
        ],
    );
    ok(&o);
    let (ph, leaked) = phases(&String::from_utf8_lossy(&o.stdout));
    // Phase two's 50 ms steps over 1.5 s: 30 on an idle machine, fewer
    // when a step's nap or churn runs late. The program's own count is
    // the truth the timeline is checked against below.
    assert!(
        leaked % 10_000 == 0 && (10..=30).contains(&(leaked / 10_000)),
        "phase two leaked {leaked}"
    );
    let t0 = started(&d.join("prof.gz"));
    let (h, rows) = csv(&d, &["prof.gz"]);
    let (t, live, blocks, calls) = (
        col(&h, "t_s"),
        col(&h, "MEM_LIVE.total"),
        col(&h, "MEM_LIVE.count"),
        col(&h, "MEM_TOTAL.count"),
    );
    for c in ["cpu_s", "rss_bytes", "peak_rss_bytes"] {
        col(&h, c);
    }
    // A point every 100 ms over 4.5 s, whatever the load (the last one is
    // the final dump's).
    assert!(
        rows.len() >= 20 && rows.len() <= 50,
        "{} points",
        rows.len()
    );
    // Phase boundaries in the timeline's time, with 50 ms of margin for
    // the time between a point's clock reading and its sums.
    let at = |x: f64| x - t0;
    let margin = 0.05;
    let (mut in_one, mut in_two, mut in_three) = (0, Vec::new(), 0);
    let churn = 300.0; // one churn block may be live at a point
    let mut last_calls = 0.0;
    for r in &rows {
        let (ts, bytes) = (r[t].unwrap(), r[live].unwrap());
        assert!(
            r[calls].unwrap() >= last_calls,
            "allocation calls only grow"
        );
        last_calls = r[calls].unwrap();
        if ts > at(ph[0].0) + margin && ts < at(ph[1].0) - margin {
            in_one += 1;
            assert!(
                (100_000.0..=100_000.0 + churn).contains(&bytes),
                "phase one at {ts}: {bytes}"
            );
            assert!(r[blocks].unwrap() <= 101.0);
        } else if ts > at(ph[1].0) + margin && ts < at(ph[1].1) - margin {
            in_two.push(bytes);
        } else if ts > at(ph[2].0) + margin && ts < at(ph[2].1) - margin {
            in_three += 1;
            let end = 100_000.0 + leaked as f64;
            assert!(
                (end..=end + churn).contains(&bytes),
                "phase three at {ts}: {bytes}, expected {end}"
            );
        }
    }
    assert!(
        in_one >= 5 && in_two.len() >= 5 && in_three >= 5,
        "{in_one} {} {in_three} points in the phases",
        in_two.len()
    );
    // Phase two grows: each point at least the one before (minus a churn
    // block), and by most of the leak from its first to its last point.
    for w in in_two.windows(2) {
        assert!(w[1] + churn >= w[0], "phase two shrank: {in_two:?}");
    }
    let grown = in_two.last().unwrap() - in_two[0];
    assert!(
        grown >= leaked as f64 * 0.5,
        "phase two grew by {grown} of {leaked}: {in_two:?}"
    );
}

#[test]
fn the_window_over_the_second_phase_has_the_leak_on_top() {
    let d = built("timeline-between");
    let o = igprof(
        &d,
        &[
            "-mp",
            "--dump-every",
            "0.4",
            "-o",
            "prof.gz",
            "./timeline_phases",
            "1.5",
        ],
    );
    ok(&o);
    let (ph, _) = phases(&String::from_utf8_lossy(&o.stdout));
    let t0 = started(&d.join("prof.gz"));
    let files = dumps(&d, "prof");
    // Snapshots every 0.4 s over 4.5 s, and the final profile.
    assert!(files.len() >= 8, "{files:?}");
    let t1 = format!("{:.3}", ph[1].0 - t0 + 0.1);
    let t2 = format!("{:.3}", ph[1].1 - t0);
    let mut args = vec!["--between", &t1, &t2, "-r", "MEM_LIVE", "--folded", "-"];
    args.extend(files.iter().map(String::as_str));
    let o = analyse(&d, &args);
    let err = ok(&o);
    // Folded differential stacks: `a;b;c BASE NEW`.
    let text = String::from_utf8(o.stdout).unwrap();
    let mut growth: Vec<(i64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.rsplitn(3, ' ');
            let new: i64 = w.next()?.parse().ok()?;
            let base: i64 = w.next()?.parse().ok()?;
            let leaf = w.next()?.rsplit(';').next()?.to_string();
            Some((new - base, leaf))
        })
        .collect();
    growth.sort();
    let (top, leaf) = growth.last().unwrap_or_else(|| panic!("{text}\n{err}"));
    assert_eq!(leaf, "grow_leak", "{text}\n{err}");
    assert!(*top >= 10_000 && top % 10_000 == 0, "{top}");
    // The blocks leaked before the window are in both dumps: no change.
    assert!(
        growth.iter().all(|(g, l)| l != "early_leak" || *g == 0),
        "{growth:?}"
    );
    assert!(err.contains("--between: prof"), "which dumps: {err}");
    // Dumps of one process are not summed: the report is the newest's.
    let report = |files: &[&str]| {
        let o = analyse(&d, &[&["-r", "MEM_LIVE"], files].concat());
        ok(&o);
        String::from_utf8(o.stdout).unwrap()
    };
    let all: Vec<&str> = files.iter().map(String::as_str).collect();
    assert_eq!(report(&all), report(&["prof.gz"]));
    // What cannot be done is said in one line.
    let refused = |args: &[&str], says: &str| {
        let o = analyse(&d, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    };
    refused(
        &["--between", "3", "1", "prof.gz"],
        "the first time must be before the second",
    );
    refused(
        &["--between", "1", "3", "-b", "prof.gz", "prof.gz"],
        "drop -b",
    );
    refused(
        &["--between", "0.01", "0.02", "prof.gz"],
        "no dump was written by 0.02 s",
    );
    let o = igprof(&d, &["-mp", "-o", "plain.gz", "./timeline_phases", "0.1"]);
    ok(&o);
    refused(
        &["--timeline", "-", "plain.gz"],
        "run it with --sample-every TIME or --dump-every TIME",
    );
}

#[test]
fn periodic_snapshots_are_kept_for_each_process_of_a_run() {
    let d = built("timeline-snapshots");
    // `sh -c` forks and execs the program: two images, two profiles with
    // a timeline each; the snapshots are each image's own.
    let o = igprof(
        &d,
        &[
            "-mp",
            "--dump-every",
            "0.5",
            "-o",
            "prof.gz",
            "sh",
            "-c",
            "./timeline_phases 0.5; ./timeline_phases 0.5",
        ],
    );
    ok(&o);
    let mut with_timeline = 0;
    for f in dumps(&d, "prof") {
        let text = read_text(&d.join(&f));
        let header = text.lines().next().unwrap();
        if header.contains("timeline_phases") && !f.contains(".snap") {
            assert!(header.contains("; timeline 1000 t_ms,"), "{f}: {header}");
            with_timeline += 1;
        }
    }
    assert_eq!(with_timeline, 2, "{:?}", dumps(&d, "prof"));
    let snaps = dumps(&d, "prof")
        .into_iter()
        .filter(|f| f.contains(".snap"))
        .count();
    assert!(snaps >= 4, "{:?}", dumps(&d, "prof"));
}

/// One GET of `/` from 127.0.0.1:`port`: the body, or why not.
fn get(port: u16) -> Result<Vec<u8>, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /page.txt HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut r = Vec::new();
    s.read_to_end(&mut r).map_err(|e| e.to_string())?;
    let at = r
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header")?;
    if !r.starts_with(b"HTTP/1.0 200") {
        return Err(String::from_utf8_lossy(&r[..at]).into_owned());
    }
    Ok(r[at + 4..].to_vec())
}

#[test]
fn a_served_minute_has_its_timeline_snapshots_and_page() {
    let d = scratch("timeline-service");
    let body: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(d.join("page.txt"), &body).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let port_s = port.to_string();
    // The system's python3 (a version manager's `python3` on PATH may be
    // a script that starts other processes first).
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let mut server = igprof_command(
        &d,
        &[
            "-mp",
            "--dump-every",
            "5s",
            "-o",
            "srv.gz",
            python,
            "-m",
            "http.server",
            &port_s,
            "--bind",
            "127.0.0.1",
        ],
    )
    .stdout(std::process::Stdio::null())
    // A line per request: into a file (a pipe nobody reads would fill up
    // and stop the server).
    .stderr(std::fs::File::create(d.join("server.log")).unwrap())
    .spawn()
    .unwrap();
    let t = std::time::Instant::now();
    while get(port).is_err() {
        assert!(t.elapsed().as_secs() < 30, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A minute of requests, one after the other, from its first answer.
    let t = std::time::Instant::now();
    let (mut served, mut failed) = (0, Vec::new());
    while t.elapsed().as_secs_f64() < 60.0 {
        match get(port) {
            Ok(b) if b == body => served += 1,
            Ok(b) => failed.push(format!("{} bytes", b.len())),
            Err(e) => failed.push(e),
        }
    }
    // SIGINT: python ends its serve_forever and exits; the final profile.
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(server.id() as i32, libc::SIGINT) };
    let status = server.wait().unwrap();
    let log = std::fs::read_to_string(d.join("server.log")).unwrap_or_default();
    let log_tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
    assert!(
        failed.is_empty(),
        "{} failed requests: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(served > 500, "{served} requests");
    let files = dumps(&d, "srv");
    let snaps: Vec<&String> = files.iter().filter(|f| f.contains(".snap")).collect();
    // One every 5 s over the minute (and the startup's second or so).
    assert!(
        (11..=13).contains(&snaps.len()),
        "{} snapshots: {files:?}\n{status:?}\n{log_tail}",
        snaps.len()
    );
    let (h, rows) = csv(&d, &files.iter().map(String::as_str).collect::<Vec<_>>());
    // A point a second (--dump-every's timeline) over the minute.
    assert!(rows.len() >= 58, "{} points", rows.len());
    let live = col(&h, "MEM_LIVE.total");
    assert!(rows.iter().all(|r| r[live].unwrap_or(0.0) > 0.0));
    assert!(
        h.iter().filter(|c| c.starts_with("live:")).count() >= 1,
        "site columns from the snapshots: {h:?}"
    );
    // The page with its chart, driven by its self-test in Chromium.
    let mut args = vec!["--html", "srv.html"];
    args.extend(files.iter().map(String::as_str));
    ok(&analyse(&d, &args));
    let url = format!("file://{}#selftest-timeline", d.join("srv.html").display());
    // timeout(1): headless Chromium has hung once for minutes in CI.
    let dom = std::process::Command::new("timeout")
        .args([
            "120",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("chromium (scripts/setup installs it)");
    let dom = String::from_utf8_lossy(&dom.stdout);
    let selftest = dom
        .split("id=\"selftest\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no self-test in the page: {dom}"));
    assert!(selftest.contains("window "), "{selftest}");
    assert!(selftest.contains("\nok"), "{selftest}");
}

#[test]
fn the_other_architecture_has_its_timeline_too() {
    // Under qemu-user there is no keeper: the watcher thread takes the
    // points. The live heap at the last point is both phases' leaks.
    let d = scratch("timeline-foreign");
    cross_build(
        &d,
        "timeline_phases.c",
        "timeline_phases",
        &["-fno-builtin"],
    );
    let o = foreign_igprof(
        &d,
        &[
            "-mp",
            "--sample-every",
            "200ms",
            "-o",
            "prof.gz",
            "./timeline_phases",
            "0.5",
        ],
    );
    ok(&o);
    let (_, leaked) = phases(&String::from_utf8_lossy(&o.stdout));
    let (h, rows) = csv(&d, &["prof.gz"]);
    assert!(rows.len() >= 5, "{} points", rows.len());
    // The final point is the final profile's live heap (stdio's buffer
    // included), exactly.
    let last = rows.last().unwrap();
    let p = parse_strict(&read_text(&d.join("prof.gz"))).unwrap();
    let live_blocks = total(&p, "MEM_LIVE");
    assert_eq!(last[col(&h, "MEM_LIVE.count")], Some(live_blocks as f64));
    assert!(live_blocks >= 100 + (leaked / 10_000), "{live_blocks}");
}
