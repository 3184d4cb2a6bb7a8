//! End-to-end checks of the AMD IBS profilers (`-ibs`, `-ibs-fetch`).
//!
//! This machine has no IBS, so the sample path is driven through the
//! test seam (`IGPROF_IBS_TEST_RECORDS`, modules/event/ibs.rs): a real
//! per-thread task-clock event signals the thread, and each sample's raw
//! data, in the kernel's layout, comes from the program
//! (tests/programs/ibs_objects.c publishes the record a real op of each
//! phase would give, with the address of a real block, global or stack
//! slot it touches). Decoding, the leaf, the counters and the data-object
//! attribution are then the hardware path's. On this machine `-ibs` itself
//! is checked for its one-line message with the program unchanged.

use std::path::Path;
use std::process::Command;

use igprof_tests::*;

const SEAM: &str = "IGPROF_IBS_TEST_RECORDS";

/// How far a sampled share (in points) may be from `want` percent with `n`
/// samples: 5 points, or 4 standard deviations of a binomial share where
/// the run got few samples. Quiet runs land within 2 points; one CI run,
/// with the other tests of this file beside it on two cores, saw 51.9% for
/// 48%. A sample charged to the wrong object is off by tens of points.
fn share_tolerance(want: f64, n: u64) -> f64 {
    sampling_tolerance(want, n).max(5.0)
}

fn program(d: &Path) {
    // -rdynamic: the record is found with dlsym; no sibling calls: each
    // alloc_* keeps its frame on the allocating stack.
    build(
        d,
        "ibs_objects.c",
        "ibs_objects",
        &["-rdynamic", "-fno-optimize-sibling-calls"],
    );
}

fn seam_run(d: &Path, args: &[&str]) -> Profile {
    let o = Command::new(launcher())
        .args(args)
        .current_dir(d)
        .env("IGPROF_LIB", lib())
        .env(SEAM, "igprof_ibs_record")
        .output()
        .unwrap();
    ok(&o);
    let out = args[args.iter().position(|a| *a == "-o").unwrap() + 1];
    parse_strict(&read_text(&d.join(out))).unwrap()
}

#[test]
fn op_samples_charge_their_instruction_and_the_owners_of_their_data() {
    let d = scratch("ibs-op");
    program(&d);
    let p = seam_run(
        &d,
        &["-mp", "-ibs/100000", "-o", "op.gz", "./ibs_objects", "op"],
    );
    // Every sample's leaf is IbsOpRip's function, wherever the interrupt
    // landed (spin_on, clock_gettime).
    let ops = total(&p, "IBS_OPS");
    assert!(ops > 1000, "{ops} samples");
    assert_eq!(under(&p, "IBS_OPS", "hot_access").0, ops);
    // Each sample counts its period (the task-clock's here, 100 us +-10%).
    let (_, period_sum) = under(&p, "IBS_OPS", "hot_access");
    let mean = period_sum as f64 / ops as f64;
    assert!((90_000.0..=110_000.0).contains(&mean), "{mean}");
    assert_eq!(total(&p, "IBS_LOADS"), ops);
    assert_eq!(total(&p, "IBS_DC_MISS"), ops);
    assert_eq!(under(&p, "IBS_TAG_TO_RET", "hot_access").1, 100 * ops);

    // Data objects: the phases last 600/300/100 ms on three heap blocks,
    // then 100/100/50 ms on a global array, the stack and an anonymous
    // page, 1250 ms in all.
    let obj = |f: &str| under(&p, "IBS_OBJ_SAMPLES", f).0;
    let all = total(&p, "IBS_OBJ_SAMPLES");
    assert_eq!(all, ops);
    for (f, ms) in [
        ("alloc_a", 600.0),
        ("alloc_b", 300.0),
        ("alloc_c", 100.0),
        ("<data> global_table", 100.0),
        ("<stack>", 100.0),
        ("<unknown>", 50.0),
    ] {
        let share = 100.0 * obj(f) as f64 / all as f64;
        let want = 100.0 * ms / 1250.0;
        // The phases are timed by the wall clock: on a loaded machine a
        // phase gets less CPU than its time says (a full run once put
        // alloc_a at 53.5% against 48%), hence at least 8 points.
        let tol = share_tolerance(want, all).max(8.0);
        assert!(
            (share - want).abs() <= tol,
            "{f}: {share:.1}% of {all} samples, want {want:.1}% +-{tol:.1}"
        );
    }
    // The three heap sites among themselves: 60/30/10.
    let heap = obj("alloc_a") + obj("alloc_b") + obj("alloc_c");
    for (f, want) in [("alloc_a", 60.0), ("alloc_b", 30.0), ("alloc_c", 10.0)] {
        let share = 100.0 * obj(f) as f64 / heap as f64;
        let tol = share_tolerance(want, heap);
        assert!(
            (share - want).abs() <= tol,
            "{f}: {share:.1}% of {heap} heap samples, want {want:.1}% +-{tol:.1}"
        );
    }
    // Exact per object: each phase's latency, miss, remote and HitM bits.
    for (f, lat, remote, hitm) in [
        ("alloc_a", 400, false, false),
        ("alloc_b", 200, true, true),
        ("alloc_c", 50, false, false),
        ("<data> global_table", 30, false, false),
        ("<stack>", 10, false, false),
        ("<unknown>", 5, false, false),
    ] {
        let n = obj(f);
        assert_eq!(under(&p, "IBS_OBJ_LAT", f), (n, lat * n), "{f}");
        assert_eq!(under(&p, "IBS_OBJ_MISS", f).0, n, "{f}");
        assert_eq!(
            under(&p, "IBS_OBJ_REMOTE", f).0,
            if remote { n } else { 0 },
            "{f}"
        );
        assert_eq!(
            under(&p, "IBS_OBJ_HITM", f).0,
            if hitm { n } else { 0 },
            "{f}"
        );
    }
    // Where the data came from, on the sampled stacks.
    assert_eq!(total(&p, "IBS_SRC_DRAM"), obj("alloc_a"));
    assert_eq!(total(&p, "IBS_SRC_REMOTE_CACHE"), obj("alloc_b"));
    assert_eq!(
        total(&p, "IBS_SRC_CACHE"),
        ops - obj("alloc_a") - obj("alloc_b")
    );
    // igprof-analyse answers "memory allocated where is slow to reach".
    let o = Command::new(analyser())
        .args(["-r", "IBS_OBJ_LAT", "op.gz"])
        .current_dir(&d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    let line = |f: &str| text.lines().position(|l| l.trim_end().ends_with(f));
    assert!(
        line("alloc_a").unwrap() < line("alloc_b").unwrap(),
        "{text}"
    );
}

#[test]
fn fetch_samples_and_no_objects_without_mp() {
    let d = scratch("ibs-fetch");
    program(&d);
    let p = seam_run(
        &d,
        &[
            "-ibs-fetch/100000",
            "-o",
            "fetch.gz",
            "./ibs_objects",
            "fetch",
        ],
    );
    let n = total(&p, "IBS_FETCHES");
    assert!(n > 300, "{n} samples");
    assert_eq!(under(&p, "IBS_FETCHES", "hot_access").0, n);
    assert_eq!(total(&p, "IBS_IC_MISS"), n);
    assert_eq!(under(&p, "IBS_FETCH_LAT", "hot_access"), (n, 60 * n));
    assert_eq!(total(&p, "IBS_OPS"), 0);
    // Op samples without -mp: no data objects.
    let p = seam_run(&d, &["-ibs/100000", "-o", "op.gz", "./ibs_objects", "op"]);
    assert!(total(&p, "IBS_OPS") > 1000);
    assert_eq!(total(&p, "IBS_OBJ_SAMPLES"), 0);
}

#[test]
fn without_ibs_the_run_says_why_and_the_program_is_unchanged() {
    let d = scratch("ibs-none");
    program(&d);
    for cmd in [
        &["./ibs_objects", "fetch"][..],
        &["python3", "-c", "import sys; print(6 * 7); sys.exit(3)"][..],
    ] {
        let plain = Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(&d)
            .output()
            .unwrap();
        let args: Vec<&str> = ["-ibs", "-ibs-fetch:l3missonly", "-o", "x.gz"]
            .iter()
            .chain(cmd)
            .copied()
            .collect();
        let o = igprof(&d, &args);
        assert_eq!(o.stdout, plain.stdout, "{cmd:?}");
        assert_eq!(o.status.code(), plain.status.code(), "{cmd:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        let said: Vec<&str> = err.lines().filter(|l| l.contains("IBS")).collect();
        assert_eq!(said.len(), 2, "{err}");
        assert!(
            said[0].starts_with("igprof: -ibs: no AMD IBS on this machine (")
                && said[0].contains("ibs_op does not exist")
                && said[0].ends_with("; running without it"),
            "{err}"
        );
        assert!(
            said[1].starts_with("igprof: -ibs-fetch:l3missonly: no AMD IBS"),
            "{err}"
        );
    }
    // A malformed option stops the launcher with one line.
    let o = igprof(&d, &["-ibs/1000", "./ibs_objects", "fetch"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("-ibs: period '1000' must be a multiple of 16"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
