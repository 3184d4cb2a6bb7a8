//! End-to-end checks of the perf-event profilers (`-e`, `-pf`, `-oc`),
//! with the software events this machine has (no PMU here: hardware events
//! are checked for their message, and their resolution in `events/`):
//! page faults charged exactly to the function that takes them (main
//! thread, a second thread, a forked child), totals against `perf stat` for
//! `page-faults/100` and, between the program's own getrusage counts and
//! perf stat's, `context-switches`, the specification resolved as
//! `perf stat -vv` resolves it, the one-line messages for events this
//! machine cannot sample with the program's output unchanged; `-pf -mp`
//! charging the faults in three blocks to their allocating sites,
//! `-oc` charging sleeps and a lock wait to where they happen, and `-c`
//! counting groups read at the CPU samples adding up to perf stat.

use std::path::Path;
use std::process::Command;

use igprof_tests::*;

const COUNTER: &str = "EV_PAGE_FAULTS";

fn profile(d: &Path, name: &str) -> Profile {
    parse_strict(&read_text(&d.join(name))).unwrap()
}

/// `perf stat -x, -e EVENT -- cmd...` in `d`: the count perf prints, the
/// command's stdout and its stderr (perf's own lines among them).
fn perf_count(d: &Path, event: &str, cmd: &[&str]) -> (u64, Vec<u8>, String) {
    let o = Command::new("perf")
        .args(["stat", "-x,", "-e", event, "--"])
        .args(cmd)
        .current_dir(d)
        .env("IGPROF_LIB", lib())
        .env("OFFCPU_TIMES", "times.txt")
        .output()
        .expect("perf (scripts/setup installs linux-perf)");
    assert!(
        o.status.success(),
        "perf stat: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .rev()
        .find(|l| l.contains(&format!(",{event},")))
        .unwrap_or_else(|| panic!("no {event} count in: {err}"));
    let count = line.split(',').next().unwrap().parse().unwrap();
    (count, o.stdout, err.into_owned())
}

/// The main thread's context switches offcpu counted itself (getrusage),
/// from the `times.txt` its OFFCPU_TIMES names in `d`.
struct Switches {
    /// Voluntary, inside wait_here (one per sleep).
    wait_voluntary: u64,
    /// Involuntary (preemptions), inside wait_here.
    wait_involuntary: u64,
    /// Voluntary, from the start of main to its last printf.
    main_voluntary: u64,
    /// Involuntary, from the start of main to its last printf.
    main_involuntary: u64,
}

fn offcpu_switches(d: &Path) -> Switches {
    let text = std::fs::read_to_string(d.join("times.txt")).unwrap();
    let n: Vec<u64> = text
        .split_whitespace()
        .skip(2)
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(n.len(), 4, "offcpu's times.txt: {text}");
    Switches {
        wait_voluntary: n[0],
        wait_involuntary: n[1],
        main_voluntary: n[2],
        main_involuntary: n[3],
    }
}

#[test]
fn page_faults_are_charged_exactly_where_they_happen() {
    let d = scratch("ev-pf");
    build(&d, "page_faults.c", "page_faults", &[]);
    let at = |n: u64| {
        let out = format!("pf{n}.gz");
        let o = igprof(
            &d,
            &[
                "-e",
                "page-faults",
                "-o",
                &out,
                "./page_faults",
                &n.to_string(),
            ],
        );
        ok(&o);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("touch_pages {n} other_pages {} \n", n / 4)
        );
        let p = profile(&d, &out);
        (
            under(&p, COUNTER, "touch_pages"),
            under(&p, COUNTER, "other_pages"),
        )
    };
    // Every page written once faults once, under the function that writes
    // it, each fault a sample of period 1 (ticks = value). A call may take
    // one fault more: its frames reach a stack page not touched before,
    // depending on where the randomised stack starts (perf stat shows the
    // same 0 or 1 over 1.25 faults per page of n).
    for n in [5000, 10000] {
        let (pages, other) = at(n);
        assert_eq!(pages.0, pages.1, "touch_pages: one fault per sample");
        assert!(
            (n..=n + 1).contains(&pages.1),
            "touch_pages {pages:?} for {n} pages"
        );
        assert!(
            (n / 4..=n / 4 + 1).contains(&other.1),
            "other_pages {other:?} for {} pages",
            n / 4
        );
    }
}

#[test]
fn every_thread_and_a_forked_child_sample_their_own_faults() {
    let d = scratch("ev-threads");
    build(&d, "page_faults.c", "page_faults", &[]);
    ok(&igprof(
        &d,
        &[
            "-e",
            "page-faults",
            "-o",
            "t.gz",
            "./page_faults",
            "8000",
            "threads",
        ],
    ));
    let p = profile(&d, "t.gz");
    let thread = under(&p, COUNTER, "thread_pages").1;
    assert!((4000..=4001).contains(&thread), "thread_pages {thread}");
    assert!((8000..=8001).contains(&under(&p, COUNTER, "touch_pages").1));

    ok(&igprof(
        &d,
        &[
            "-e",
            "page-faults",
            "-o",
            "f.gz",
            "./page_faults",
            "8000",
            "fork",
        ],
    ));
    let child = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("f.") && n != "f.gz")
        .expect("the forked child's profile f.<pid>.gz");
    let c = profile(&d, &child);
    // After fork the stack's pages are shared copy-on-write: the first
    // write to each of the pages a call's frames reach faults once more,
    // in either process.
    let in_child = under(&c, COUNTER, "child_pages").1;
    assert!((4000..=4003).contains(&in_child), "child_pages {in_child}");
    // The parent's profile has its own faults, not the child's.
    let parent = profile(&d, "f.gz");
    assert_eq!(under(&parent, COUNTER, "child_pages"), (0, 0));
    let in_parent = under(&parent, COUNTER, "touch_pages").1;
    assert!(
        (8000..=8003).contains(&in_parent),
        "touch_pages {in_parent}"
    );
}

#[test]
fn totals_match_perf_stat() {
    let d = scratch("ev-totals");
    build(&d, "page_faults.c", "page_faults", &[]);
    // page-faults/100: each sample stands for its period (drawn in 90-110):
    // the values add up to the kernel's count for the same (deterministic)
    // program, less the faults before the library starts and the part of
    // the last period no sample closed.
    let (kernel, ..) = perf_count(&d, "page-faults:u", &["./page_faults", "40000"]);
    ok(&igprof(
        &d,
        &[
            "-e",
            "page-faults/100",
            "-o",
            "p.gz",
            "./page_faults",
            "40000",
        ],
    ));
    let p = profile(&d, "p.gz");
    let (samples, events) = (
        total(&p, COUNTER),
        p.nodes
            .iter()
            .flat_map(|n| n.values.iter())
            .filter(|v| v.counter == COUNTER)
            .map(|v| v.value)
            .sum::<u64>(),
    );
    let off = (events as f64 - kernel as f64).abs() / kernel as f64;
    assert!(
        off < 0.01,
        "{events} events in {samples} samples, perf stat {kernel}"
    );
    assert!(
        (450..=560).contains(&samples),
        "{samples} samples of ~100 faults"
    );

    // page-faults/F1000: the kernel chooses the periods; each sample reads
    // what the event counted since the previous one, and what it counted
    // after the last sample goes to that sample's stack at the end.
    ok(&igprof(
        &d,
        &[
            "-e",
            "page-faults/F1000",
            "-o",
            "f.gz",
            "./page_faults",
            "40000",
        ],
    ));
    let p = profile(&d, "f.gz");
    let events = sum_values(&p, COUNTER);
    let off = (events as f64 - kernel as f64).abs() / kernel as f64;
    assert!(off < 0.01, "{events} events at F1000, perf stat {kernel}");
    assert!(total(&p, COUNTER) > 0);

    // context-switches, in the same run as perf stat, against what the
    // program counted itself. Each switch raises a SIGTRAP on the thread's
    // way back to user space, and two switches before it gets there (a
    // preemption on the way back, on a loaded machine) raise one: the
    // samples are at least the program's voluntary switches (each sleep
    // returns to user space before the next; with those taken in the
    // profiler's own code, which -d counts), at most all its switches
    // inside wait_here there, and at most perf stat's count of the whole
    // run (which adds the launcher's, the loader's and the dump's).
    build(&d, "offcpu.c", "offcpu", &[]);
    let launcher = launcher();
    let cmd = [
        launcher.to_str().unwrap(),
        "-d",
        "-e",
        "context-switches",
        "-o",
        "cs.gz",
        "./offcpu",
        "1000",
        "100",
        "0",
    ];
    let (kernel, out, err) = perf_count(&d, "context-switches", &cmd);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "slept 1000 x 100 us, blocked 0 ms\n"
    );
    let own = offcpu_switches(&d);
    let p = profile(&d, "cs.gz");
    let ours = total(&p, "EV_CONTEXT_SWITCHES");
    // "-e context-switches: N samples charged to ..., M taken in the
    // profiler's own code (not charged)"
    let line = err
        .lines()
        .find(|l| l.contains("-e context-switches: "))
        .unwrap_or_else(|| panic!("no -d line for the samples: {err}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{line}");
    assert_eq!(numbers[0], ours, "{line}");
    let taken = ours + numbers[1];
    assert!(
        own.main_voluntary <= taken && taken <= kernel,
        "{line}; the program counted {} voluntary switches in main, perf stat {kernel} in all",
        own.main_voluntary
    );
    let in_wait = under(&p, "EV_CONTEXT_SWITCHES", "wait_here").0;
    assert!(
        (own.wait_voluntary..=own.wait_voluntary + own.wait_involuntary).contains(&in_wait),
        "{in_wait} switches sampled in wait_here; the program counted {} voluntary and {} involuntary there",
        own.wait_voluntary,
        own.wait_involuntary
    );
}

/// The `type` and `config` perf prints for `spec` (`perf stat -vv`).
fn perf_attr(spec: &str) -> Option<(u32, u64)> {
    let o = Command::new("perf")
        .args(["stat", "-vv", "-e", spec, "true"])
        .output()
        .expect("perf (scripts/setup installs linux-perf)");
    let err = String::from_utf8_lossy(&o.stderr);
    let block = err.split("perf_event_attr:").nth(1)?;
    // perf leaves out the fields that are 0 (the type of a hardware event).
    let field = |name: &str| {
        block
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let type_ = field("type").map_or(0, |t| t.parse().unwrap());
    let config = field("config")
        .map(|c| u64::from_str_radix(c.trim_start_matches("0x"), 16).unwrap())
        .unwrap_or(0);
    Some((type_, config))
}

#[test]
fn specifications_resolve_as_perf_resolves_them() {
    for spec in [
        "page-faults",
        "faults",
        "major-faults",
        "context-switches",
        "cpu-migrations",
        "task-clock",
        "cycles",
        "instructions",
        "branch-misses",
        "L1-dcache-load-misses",
        "LLC-store-misses",
        "dTLB-loads",
        "r01c2",
        "msr/tsc/",
    ] {
        let ours = igprof_events::resolve(
            &igprof_events::parse(spec).unwrap(),
            Path::new(igprof_events::DEVICES),
        )
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
        let perf =
            perf_attr(spec).unwrap_or_else(|| panic!("perf stat -vv -e {spec} printed no attr"));
        assert_eq!((ours.type_, ours.config), perf, "{spec}");
    }
}

#[test]
fn events_this_machine_cannot_sample_are_named_and_the_program_runs_on() {
    let d = scratch("ev-refused");
    let plain = Command::new("/bin/echo").arg("hi").output().unwrap();
    for (spec, says) in [
        ("cycles", "-e cycles: not supported here"),
        (
            "msr/tsc/",
            "-e msr/tsc/: its PMU can count it but not sample it",
        ),
        ("cache-misss", "'cache-misss' is not a generic event"),
        (
            "nopmu/event=1/",
            "no PMU 'nopmu' on this machine (PMUs here: ",
        ),
    ] {
        let o = igprof(&d, &["-e", spec, "-o", "x.gz", "/bin/echo", "hi"]);
        let err = ok(&o);
        assert_eq!(o.stdout, plain.stdout, "{spec}");
        let line = err
            .lines()
            .find(|l| l.contains(says))
            .unwrap_or_else(|| panic!("{spec}: {err}"));
        assert!(
            line.starts_with("igprof: ") && line.ends_with("; running without it"),
            "{line}"
        );
    }
    // With a sampled event beside it, the run goes on with that one.
    let o = igprof(
        &d,
        &[
            "-e",
            "cycles",
            "-e",
            "page-faults",
            "-o",
            "y.gz",
            "/bin/echo",
            "hi",
        ],
    );
    let err = ok(&o);
    assert!(
        err.contains("EV_PAGE_FAULTS (page-faults, every 1)"),
        "{err}"
    );
    assert!(profile(&d, "y.gz")
        .nodes
        .iter()
        .any(|n| n.values.iter().any(|v| v.counter == COUNTER)));
    // Syntax is the launcher's: one line, status 127, nothing run.
    let o = igprof(&d, &["-e", "cycles/F0", "/bin/echo", "hi"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(o.stdout.is_empty());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("igprof: -e: event 'cycles/F0': 'F0' is not a frequency"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn page_faults_by_name_and_whose_memory_they_fault_in() {
    let d = scratch("ev-mem-faults");
    build(&d, "mem_faults.c", "mem_faults", &[]);
    let o = igprof(&d, &["-pf", "-mp", "-o", "mf.gz", "./mem_faults"]);
    let err = ok(&o);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "pages 1024 512 256\n");
    assert!(
        err.contains("page faults (PAGE_FAULTS, MAJOR_FAULTS, MEM_FAULTS)"),
        "{err}"
    );
    let p = profile(&d, "mf.gz");
    // Each block's first page holds malloc's chunk header, written (and
    // faulted in) by malloc itself: fill_all faults in the others, 1789 of
    // the 1792 pages (one more if its frame reaches a fresh stack page).
    let fill = under(&p, "PAGE_FAULTS", "fill_all");
    assert!((1789..=1790).contains(&fill.1), "fill_all {fill:?}");
    // The same faults, on the stacks that allocated the blocks: 4:2:1.
    for (site, pages) in [("site_a", 1023), ("site_b", 511), ("site_c", 255)] {
        assert_eq!(under(&p, "MEM_FAULTS", site), (pages, pages), "{site}");
    }
    assert_eq!(total(&p, "MEM_FAULTS"), 1789);
    // Without -mp there is no allocation to charge.
    ok(&igprof(&d, &["-pf", "-o", "nomem.gz", "./mem_faults"]));
    let p = profile(&d, "nomem.gz");
    assert_eq!(total(&p, "MEM_FAULTS"), 0);
    assert!((1789..=1790).contains(&under(&p, "PAGE_FAULTS", "fill_all").1));
}

#[test]
fn off_cpu_time_is_charged_where_threads_wait() {
    let d = scratch("ev-offcpu");
    build(&d, "offcpu.c", "offcpu", &[]);
    let o = Command::new(launcher())
        .args(["-oc", "-o", "oc.gz", "./offcpu", "100", "10000", "500"])
        .current_dir(&d)
        .env("IGPROF_LIB", lib())
        .env("OFFCPU_TIMES", "times.txt")
        .output()
        .unwrap();
    let err = ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "slept 100 x 10000 us, blocked 500 ms\n"
    );
    assert!(err.contains("off-CPU time (OFFCPU_TIME, ns)"), "{err}");
    let p = profile(&d, "oc.gz");
    // 100 sleeps of 10 ms in wait_here, 500 ms on a mutex in lock_here: the
    // time each thread spent off the CPU (wall minus its own CPU time)
    // since its previous switch, in nanoseconds, to +-5% of what the
    // program measured around each (at least the nominal times; more on a
    // loaded machine, where a woken thread waits for a CPU).
    let times = std::fs::read_to_string(d.join("times.txt")).unwrap();
    let measured: Vec<f64> = times
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(measured[0] >= 1e9 && measured[1] >= 4.9e8, "{times}");
    let near = |f: &str, ns: f64| {
        let (switches, v) = under(&p, "OFFCPU_TIME", f);
        assert!(
            (v as f64 - ns).abs() < 0.05 * ns,
            "{f}: {v} ns in {switches} switches, the program measured {ns} ns"
        );
        switches
    };
    assert!(near("wait_here", measured[0]) >= 100);
    assert!(near("lock_here", measured[1]) >= 1);
}

/// Sum of a counter's values over the profile.
fn sum_values(p: &Profile, counter: &str) -> u64 {
    p.nodes
        .iter()
        .flat_map(|n| n.values.iter())
        .filter(|v| v.counter == counter)
        .map(|v| v.value)
        .sum()
}

#[test]
fn counting_groups_add_up_to_perf_stat() {
    let d = scratch("ev-count");
    build(&d, "page_faults.c", "page_faults", &[]);
    build(&d, "offcpu.c", "offcpu", &[]);
    // Page faults: the same deterministic program, counted by perf stat
    // unprofiled; each -pp sample charges what the group counted since the
    // previous one, and the thread's last counts go to its last sample.
    let (kernel, ..) = perf_count(&d, "page-faults:u", &["./page_faults", "40000"]);
    let o = igprof(
        &d,
        &[
            "-pp",
            "-c",
            "page-faults,context-switches",
            "-o",
            "c.gz",
            "./page_faults",
            "40000",
        ],
    );
    let err = ok(&o);
    assert!(
        err.contains("counting CNT_PAGE_FAULTS, CNT_CONTEXT_SWITCHES at each sample"),
        "{err}"
    );
    let p = profile(&d, "c.gz");
    let ours = sum_values(&p, "CNT_PAGE_FAULTS");
    let off = (ours as f64 - kernel as f64).abs() / kernel as f64;
    assert!(off < 0.01, "{ours} faults counted, perf stat {kernel}");
    assert!(
        p.notes
            .contains(&"counting groups: page-faults,context-switches counted 100%".to_string()),
        "{:?}",
        p.notes
    );
    // Context switches, in the same run as perf stat: the group is read at
    // each sample and at the thread's end, so it holds every switch of
    // main the program counted itself (getrusage), and at most what perf
    // stat counts for the whole run (the launcher's, the loader's and the
    // dump's too; on a loaded machine each of them preempted more often).
    let launcher = launcher();
    let cmd = [
        launcher.to_str().unwrap(),
        "-pp",
        "-c",
        "context-switches",
        "-o",
        "cs.gz",
        "./offcpu",
        "1000",
        "100",
        "0",
    ];
    let (kernel, ..) = perf_count(&d, "context-switches", &cmd);
    let own = offcpu_switches(&d);
    let in_main = own.main_voluntary + own.main_involuntary;
    let ours = sum_values(&profile(&d, "cs.gz"), "CNT_CONTEXT_SWITCHES");
    assert!(
        in_main <= ours && ours <= kernel,
        "{ours} switches counted; the program counted {in_main} in main, perf stat {kernel} in all"
    );
    // Software events are never multiplexed: a group of six counts whole.
    let six =
        "page-faults,minor-faults,major-faults,context-switches,cpu-migrations,alignment-faults";
    let o = igprof(
        &d,
        &[
            "-pp",
            "-d",
            "-c",
            six,
            "-o",
            "six.gz",
            "./page_faults",
            "4000",
        ],
    );
    let err = ok(&o);
    assert!(
        err.contains(&format!(
            "-c {six}: counted 100.0% of the time it was enabled"
        )),
        "{err}"
    );
    // Software counters are not user-readable: every read was read(2).
    assert!(err.contains("-c: 0 group reads with rdpmc, "), "{err}");
    let p = profile(&d, "six.gz");
    assert_eq!(
        sum_values(&p, "CNT_PAGE_FAULTS"),
        sum_values(&p, "CNT_MINOR_FAULTS") + sum_values(&p, "CNT_MAJOR_FAULTS")
    );
    // The launcher: -c needs the CPU samples that read it.
    let o = igprof(&d, &["-c", "page-faults", "./page_faults", "10"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&o.stderr).starts_with("igprof: -c counts beside the CPU samples")
    );
}

#[test]
fn major_faults_and_events_that_would_share_a_signal() {
    let d = scratch("ev-major");
    build(&d, "major_faults.c", "major_faults", &[]);
    // 64 pages dropped from the page cache and read through a mapping
    // without readahead: 64 major faults, as perf stat counts them in the
    // same run.
    let launcher = launcher();
    let cmd = [
        launcher.to_str().unwrap(),
        "-pf",
        "-o",
        "mj.gz",
        "./major_faults",
        "file",
        "64",
    ];
    let (kernel, out, _) = perf_count(&d, "major-faults", &cmd);
    assert_eq!(String::from_utf8_lossy(&out), "64\n");
    let p = profile(&d, "mj.gz");
    assert_eq!(under(&p, "MAJOR_FAULTS", "read_file_pages"), (64, 64));
    // perf stat also counts what the profile does not: major faults of the
    // launcher and of the profiler's own start-up and dump, which happen
    // when a page of a library or program was dropped from the page cache
    // (this VM runs DAMON's proactive reclaim, `pageout` on physical
    // memory: a full CI run once saw 65 against 64).
    let seen = total(&p, "MAJOR_FAULTS");
    assert!(
        seen <= kernel && kernel <= seen + 3,
        "MAJOR_FAULTS {seen}, perf stat {kernel}"
    );
    // Two sampled events that fire on the same fault or switch would get
    // one SIGTRAP between them: the later one is refused, named.
    let o = igprof(
        &d,
        &[
            "-pf",
            "-e",
            "minor-faults",
            "-pr",
            "-oc",
            "-o",
            "x.gz",
            "./major_faults",
            "file2",
            "4",
        ],
    );
    let err = ok(&o);
    assert!(
        err.contains(
            "-e minor-faults: it fires on the same kernel entries as -pf (sampled already)"
        ),
        "{err}"
    );
    assert!(
        err.contains("-oc: -pr charges the time off the CPU already"),
        "{err}"
    );
}

#[test]
fn without_sigtrap_events_the_rings_signal_instead() {
    // --sampler sigprof stands for a kernel without sigtrap perf events
    // (before 5.13): each event's ring wakes its thread with SIGPROF
    // through fasync, the descriptor naming the event.
    let d = scratch("ev-fasync");
    build(&d, "page_faults.c", "page_faults", &[]);
    build(&d, "offcpu.c", "offcpu", &[]);
    for sampler in [
        &["--sampler", "sigprof"][..],
        &["--sampler", "sigprof", "-pp"],
        &["--sampler", "timer", "-pp"],
    ] {
        let out = "fa.gz";
        let mut args: Vec<&str> = sampler.to_vec();
        args.extend([
            "-e",
            "page-faults",
            "-o",
            out,
            "./page_faults",
            "8000",
            "threads",
        ]);
        let o = igprof(&d, &args);
        ok(&o);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "touch_pages 8000 other_pages 2000 threads\n"
        );
        let p = profile(&d, out);
        let pages = under(&p, COUNTER, "touch_pages").1;
        let thread = under(&p, COUNTER, "thread_pages").1;
        // With -pp the CPU samples' SIGPROF and a fault's can meet before
        // either is delivered: the kernel keeps one (a standard signal
        // does not queue), and a fault now and then goes unsampled; each
        // such meeting needs a CPU sample taken in the same function.
        let lost = |f: &str| {
            if sampler.contains(&"-pp") {
                under(&p, "PERF_TICKS", f).0 + 1
            } else {
                0
            }
        };
        assert!(
            (8000 - lost("touch_pages")..=8001).contains(&pages),
            "{sampler:?}: touch_pages {pages}"
        );
        assert!(
            (4000 - lost("thread_pages")..=4001).contains(&thread),
            "{sampler:?}: thread_pages {thread}"
        );
    }
    // A switch event's own signal would interrupt every blocking call it
    // follows: refused, named; the program runs as unprofiled. offcpu
    // reads the clock through the vDSO first, whose data page's fault is
    // retried by Linux 6.4+: with a page-faults signal pending during it,
    // the program used to take that fault forever.
    let o = igprof(
        &d,
        &[
            "--sampler",
            "sigprof",
            "-oc",
            "-e",
            "page-faults",
            "-o",
            "oc.gz",
            "./offcpu",
            "20",
            "1000",
            "50",
        ],
    );
    let err = ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "slept 20 x 1000 us, blocked 50 ms\n"
    );
    assert!(
        err.contains("-oc: needs sigtrap perf events (Linux 5.13+"),
        "{err}"
    );
}
