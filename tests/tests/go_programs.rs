//! A Go program linked with cgo, built at test time with Debian's Go
//! (scripts/setup installs golang-go): its runtime ends the process with a
//! raw `exit_group`, past every libc exit path, and used to leave no
//! profile and no word. Under each mode it must behave as unprofiled
//! (output, exit status, through the end of `main` and through
//! `os.Exit`) and leave its profile, with the C allocations exact.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use igprof_tests::*;

/// Builds tests/programs/go_cgo with external linking into `dir`, for
/// the host or (`foreign`) for [`foreign_arch`] with its C cross compiler.
fn build_go(dir: &Path, foreign: bool) -> PathBuf {
    let src = root().join("tests/programs/go_cgo/main.go");
    std::fs::copy(&src, dir.join("main.go")).unwrap();
    std::fs::write(dir.join("go.mod"), "module gocgo\n\ngo 1.19\n").unwrap();
    let out = dir.join(if foreign { "gocgo-foreign" } else { "gocgo" });
    let mut go = Command::new("go");
    go.args(["build", "-ldflags=-linkmode=external", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(dir)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("CGO_ENABLED", "1");
    if foreign {
        let (arch, cc, _) = foreign_arch();
        go.env("GOARCH", if arch == "aarch64" { "arm64" } else { "amd64" })
            .env("CC", cc);
    }
    let o = go
        .output()
        .expect("go build (scripts/setup installs golang-go)");
    assert!(
        o.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run")
}

/// Runs `prog args` in `dir` under the launcher with `mode`, its profile
/// going to `profile` (removed first).
fn profiled(dir: &Path, mode: &str, profile: &Path, prog: &Path, args: &[&str]) -> Output {
    let _ = std::fs::remove_file(profile);
    run(Command::new(launcher())
        .args([mode, "-o"])
        .arg(profile)
        .arg(prog)
        .args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib())
        .env("IGPROF_CACHE_DIR", test_store()))
}

#[test]
fn a_cgo_program_that_ends_with_a_raw_exit_group_leaves_its_profile() {
    let d = scratch("go_cgo");
    let prog = build_go(&d, false);
    for args in [&[][..], &["exit", "3"][..]] {
        let plain = run(Command::new(&prog).args(args));
        let status = if args.is_empty() { 0 } else { 3 };
        assert_eq!(plain.status.code(), Some(status));
        assert_eq!(String::from_utf8_lossy(&plain.stdout), "go done 1000\n");
        for mode in ["-pp", "-mp", "-fd"] {
            let p = d.join("p.gz");
            let got = profiled(&d, mode, &p, &prog, args);
            let err = String::from_utf8_lossy(&got.stderr);
            assert_eq!(
                (got.status.code(), &got.stdout),
                (plain.status.code(), &plain.stdout),
                "{mode} {args:?}: {err}"
            );
            assert!(p.exists(), "{mode} {args:?}: no profile; {err}");
            let prof = parse_strict(&read_text(&p)).unwrap();
            if mode == "-mp" {
                assert_eq!(
                    under(&prof, "MEM_TOTAL", "c_alloc"),
                    (5000, 500_000),
                    "{mode} {args:?}"
                );
            }
        }
    }
}

/// -pp on a Go program: the sampling signal lands on goroutine stacks of a
/// few KiB (the handler must run on the thread's signal stack, or it writes
/// over Go's heap: the program died of a "sigpanic"). The program's output
/// and status are unchanged, and its Go code and C code both get samples.
#[test]
fn sampling_go_code_leaves_the_program_unchanged() {
    let d = scratch("go_cgo_pp");
    let prog = build_go(&d, false);
    let plain = run(Command::new(&prog).arg("burn"));
    assert_eq!(plain.status.code(), Some(0));
    for round in 0..3 {
        let p = d.join("p.gz");
        let got = profiled(&d, "-pp", &p, &prog, &["burn"]);
        let err = String::from_utf8_lossy(&got.stderr);
        assert_eq!(
            (got.status.code(), &got.stdout),
            (plain.status.code(), &plain.stdout),
            "round {round}: {err}"
        );
        let prof = parse_strict(&read_text(&p)).unwrap();
        assert!(
            under(&prof, "PERF_TICKS", "main.goBurn").0 > 0,
            "round {round}"
        );
        assert!(under(&prof, "PERF_TICKS", "c_burn").0 > 0, "round {round}");
    }
}

#[test]
fn the_same_go_program_for_the_other_architecture_under_qemu() {
    let d = scratch("go_cgo_foreign");
    let prog = build_go(&d, true);
    let name = prog.file_name().unwrap().to_str().unwrap().to_string();
    let p = d.join("p.gz");
    let got = run(&mut foreign_igprof_command(
        &d,
        &["-mp", "-o", "p.gz", &format!("./{name}"), "exit", "3"],
    ));
    let err = String::from_utf8_lossy(&got.stderr);
    assert_eq!(got.status.code(), Some(3), "{err}");
    assert_eq!(String::from_utf8_lossy(&got.stdout), "go done 1000\n");
    let prof = parse_strict(&read_text(&p)).unwrap();
    // c_alloc is a local symbol of the foreign executable: found by its
    // exact count rather than its name.
    assert!(
        path_values(&prof, "MEM_TOTAL")
            .iter()
            .any(|(_, calls, bytes)| (*calls, *bytes) == (5000, 500_000)),
        "{:?}",
        path_values(&prof, "MEM_TOTAL")
    );
}
