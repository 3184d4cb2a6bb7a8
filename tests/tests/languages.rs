//! Programs of the other compiled languages the profiler is for, built at
//! test time with the system's compilers: Fortran (gfortran; ALLOCATE and
//! DEALLOCATE through its runtime) and Rust (rustc; its system allocator,
//! and panics unwinding through frames while they are sampled). Each runs
//! unprofiled and under `-mp` and `-pp -i 1ms` (Rust: `-pp -i 1ms -mp`),
//! and is checked through `igprof-analyse -d`: the output is unchanged,
//! the allocating routine's calls and bytes are exactly what the source
//! makes, the block it leaks is live at exit, and its two hot routines
//! share the CPU samples as they shared the CPU time the program measured
//! itself in the same run (within 5 points), under their source names.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use igprof_tests::*;

/// Compiles tests/programs/`src` with `cmd` (the compiler and its flags;
/// the output is `out` in `dir`).
fn compile(dir: &Path, cmd: &[&str], src: &str, out: &str) {
    let st = Command::new(cmd[0])
        .args(&cmd[1..])
        .arg("-o")
        .arg(dir.join(out))
        .arg(root().join("tests/programs").join(src))
        .status()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup installs it)", cmd[0]));
    assert!(st.success(), "{} {src} failed", cmd[0]);
}

/// Runs `./exe args` unprofiled in `dir`; its stdout.
fn plain(dir: &Path, exe: &str, args: &[&str]) -> String {
    let o = Command::new(dir.join(exe))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{exe} failed unprofiled");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `./exe args` under `opts` in `dir`, the profile in `out`; its
/// stdout and stderr.
fn profiled(dir: &Path, opts: &[&str], exe: &str, args: &[&str], out: &str) -> (String, String) {
    let prog = format!("./{exe}");
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", out, &prog]);
    a.extend(args);
    let o = igprof(dir, &a);
    ok(&o);
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Cumulative shares of `a` and `b` in a CPU profile: `a`'s share of
/// their sum within 5 points of the share of the CPU time the program
/// measured for them in the same run (its stderr line `TAG cpu_ns A B`).
fn shares_as_measured(rows: &BTreeMap<String, FlatRow>, a: &str, b: &str, err: &str, tag: &str) {
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{tag} cpu_ns ")))
        .unwrap_or_else(|| panic!("no '{tag} cpu_ns' line in: {err}"));
    let ns: Vec<f64> = line
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let measured = 100.0 * ns[0] / (ns[0] + ns[1]);
    let (pa, pb) = (flat_row(rows, a, tag).pct, flat_row(rows, b, tag).pct);
    let share = 100.0 * pa / (pa + pb);
    assert!(
        (share - measured).abs() <= 5.0,
        "{tag}: {a} {pa}%, {b} {pb}%: {share:.1}% of the two; \
         the program measured {measured:.1}% ({line} ns)"
    );
}

#[test]
fn a_fortran_program_under_mp_and_pp() {
    let d = scratch("lang-fortran");
    // -J: gfortran's module file goes in the scratch directory, not the
    // test's working directory.
    let modules = d.display().to_string();
    compile(
        &d,
        &["gfortran", "-O2", "-g", "-fno-inline", "-J", &modules],
        "fortran_work.f90",
        "fortran_work",
    );

    // 20,000 ALLOCATEs of 100 doubles in churn, 8,000 bytes kept.
    let want = plain(&d, "fortran_work", &["20000", "1"]);
    assert_eq!(want, "fortran done 20000 T\n");
    let (got, _) = profiled(&d, &["-mp"], "fortran_work", &["20000", "1"], "mp.gz");
    assert_eq!(got, want);
    let total = flat_cumulative(&d, "MEM_TOTAL", "mp.gz");
    let churn = flat_row(&total, "work::churn", "MEM_TOTAL");
    assert_eq!((churn.value, churn.calls), (16_000_000, Some(20_000)));
    let live = flat_cumulative(&d, "MEM_LIVE", "mp.gz");
    assert_eq!(flat_row(&live, "work::keep", "MEM_LIVE").value, 8_000);
    assert!(!live.contains_key("work::churn"), "{live:?}");

    // About half a second of hot_a and hot_b.
    let want = plain(&d, "fortran_work", &["1000", "800"]);
    let (got, err) = profiled(
        &d,
        &["-pp", "-i", "1ms"],
        "fortran_work",
        &["1000", "800"],
        "pp.gz",
    );
    assert_eq!(got, want);
    let ticks = flat_cumulative(&d, "PERF_TICKS", "pp.gz");
    shares_as_measured(&ticks, "work::hot_a", "work::hot_b", &err, "fortran");
}

#[test]
fn a_rust_program_under_mp_and_pp_with_panics() {
    let d = scratch("lang-rust");
    compile(
        &d,
        &["rustc", "-O", "-g", "--edition", "2021"],
        "rust_work.rs",
        "rust_work",
    );

    // 20,000 Vecs of 100 u64 made and dropped in churn, 1,000 bytes kept,
    // 1,000 panics caught.
    let args = ["20000", "1", "1000"];
    let want = plain(&d, "rust_work", &args);
    assert_eq!(want, "rust done 20000 1000 true caught 1000\n");
    let (got, _) = profiled(&d, &["-mp"], "rust_work", &args, "mp.gz");
    assert_eq!(got, want);
    let total = flat_cumulative(&d, "MEM_TOTAL", "mp.gz");
    let churn = flat_row(&total, "rust_work::churn", "MEM_TOTAL");
    assert_eq!((churn.value, churn.calls), (16_000_000, Some(20_000)));
    let live = flat_cumulative(&d, "MEM_LIVE", "mp.gz");
    let keep = flat_row(&live, "rust_work::keep", "MEM_LIVE");
    assert_eq!((keep.value, keep.calls), (1_000, Some(1)));
    assert!(!live.contains_key("rust_work::churn"), "{live:?}");

    // Half a second of hot_a and hot_b, then 3,000 panics unwinding
    // through 20 frames, sampled every millisecond and their allocations
    // recorded.
    let args = ["1000", "800", "3000"];
    let want = plain(&d, "rust_work", &args);
    let (got, err) = profiled(
        &d,
        &["-pp", "-i", "1ms", "-mp"],
        "rust_work",
        &args,
        "ppmp.gz",
    );
    assert_eq!(got, want);
    let ticks = flat_cumulative(&d, "PERF_TICKS", "ppmp.gz");
    shares_as_measured(&ticks, "rust_work::hot_a", "rust_work::hot_b", &err, "rust");
}
