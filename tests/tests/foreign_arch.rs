//! A program of another architecture under the launcher: an AArch64 build
//! of alloc_churn on this (x86-64) host runs under qemu-user with the
//! AArch64 libigprof.so, and its memory profile is as exact as the host's.
//! On an AArch64 host the roles are swapped.

use std::path::Path;
use std::process::Command;

use igprof_tests::*;

fn foreign() -> (&'static str, &'static str) {
    if cfg!(target_arch = "x86_64") {
        ("aarch64", "aarch64-linux-gnu-gcc")
    } else {
        ("x86_64", "x86_64-linux-gnu-gcc")
    }
}

fn cross_build(dir: &Path, cc: &str, src: &str, out: &str) {
    let st = Command::new(cc)
        .args(["-O2", "-g", "-o"])
        .arg(dir.join(out))
        .arg(root().join("tests/programs").join(src))
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (scripts/setup installs the cross compiler)"));
    assert!(st.success(), "{cc} {src} failed");
}

#[test]
fn a_program_of_another_architecture_runs_under_qemu_with_exact_counts() {
    let (arch, cc) = foreign();
    let xlib = target_dir().join(format!("{arch}-unknown-linux-gnu/release/libigprof.so"));
    assert!(
        xlib.exists(),
        "{} missing: cargo build --release --target {arch}-unknown-linux-gnu -p igprof-rs (scripts/test does)",
        xlib.display()
    );
    let d = scratch("foreign_arch");
    cross_build(&d, cc, "alloc_churn.c", "alloc_churn_foreign");
    build(&d, "alloc_churn.c", "alloc_churn_host", &[]);
    let mut counts = Vec::new();
    for prog in ["alloc_churn_host", "alloc_churn_foreign"] {
        let o = Command::new(root().join("scripts/igprof"))
            .args(["-mp", "-o", &format!("{prog}.gz"), &format!("./{prog}"), "20000", "5"])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env(format!("IGPROF_LIB_{}", arch.to_uppercase()), &xlib)
            .output()
            .unwrap();
        let err = ok(&o);
        assert!(err.contains("profiling"), "{prog}: {err}");
        let p = parse_strict(&read_text(&d.join(format!("{prog}.gz")))).unwrap();
        let sites: Vec<u64> = ["site_small", "site_mixed", "site_calloc", "site_realloc", "site_leak"]
            .iter()
            .map(|s| under(&p, "MEM_TOTAL", s).0)
            .collect();
        counts.push(sites);
    }
    // site_realloc: a malloc and a realloc per round.
    assert_eq!(counts[0], vec![20000, 20000, 2000, 4000, 1000], "host");
    assert_eq!(counts[1], counts[0], "the {arch} run counts what the host run counts");
}

#[test]
fn a_program_of_another_architecture_without_its_library_is_refused_clearly() {
    let (arch, cc) = foreign();
    let d = scratch("foreign_arch_nolib");
    cross_build(&d, cc, "alloc_churn.c", "alloc_churn_foreign");
    let o = Command::new(root().join("scripts/igprof"))
        .args(["-mp", "./alloc_churn_foreign", "10", "1"])
        .current_dir(&d)
        .env("IGPROF_LIB", lib())
        .env(format!("IGPROF_LIB_{}", arch.to_uppercase()), d.join("nonexistent.so"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no libigprof.so built for"), "{err}");
}

#[test]
fn a_program_of_another_architecture_is_sampled_under_qemu() {
    let (arch, cc) = foreign();
    let xlib = target_dir().join(format!("{arch}-unknown-linux-gnu/release/libigprof.so"));
    assert!(xlib.exists(), "{} missing (scripts/test builds it)", xlib.display());
    let d = scratch("foreign_arch_pp");
    cross_build(&d, cc, "cpu_split.c", "cpu_split_foreign");
    // qemu-user has no perf events of the guest's: the automatic choice
    // falls back to POSIX timers; both must recognise their own signals.
    for sampler in ["auto", "timer"] {
        let out = format!("{sampler}.gz");
        let o = Command::new(root().join("scripts/igprof"))
            .args(["-pp", "-i", "1ms", "--sampler", sampler, "-o", &out])
            .args(["./cpu_split_foreign", "200"])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env(format!("IGPROF_LIB_{}", arch.to_uppercase()), &xlib)
            .output()
            .unwrap();
        ok(&o);
        let p = parse_strict(&read_text(&d.join(&out))).unwrap();
        let s = cumulative_shares(&p, "PERF_TICKS");
        for (f, want) in [("hot_a", 50.0), ("hot_b", 30.0), ("hot_c", 20.0)] {
            let got = s.get(f).copied().unwrap_or(0.0);
            assert!(
                (got - want).abs() < 6.0,
                "{sampler}: {f} {got:.1}%, {want}% expected: {s:?}"
            );
        }
    }
}
