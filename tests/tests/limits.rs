//! Resource limits the program lowers in the middle of its run (a sandbox
//! that forbids itself file writes, new descriptors or new memory) never
//! kill it or change its exit status: the profile is written where that is
//! still possible, else one line says why.
//!
//! Each run starts with an empty descriptor store, as on a fresh machine:
//! the store's own files are written at exit too, and were what a file
//! size limit killed the program with.

use std::path::Path;
use std::process::{Command, Output};

use igprof_tests::*;

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run")
}

fn profiled(d: &Path, mode: &str, limit: &str, store: &Path) -> Output {
    let _ = std::fs::remove_dir_all(store);
    run(Command::new(launcher())
        .args([mode, "-o", "p.gz", "./limits_mid", limit])
        .current_dir(d)
        .env("IGPROF_LIB", lib())
        .env("IGPROF_CACHE_DIR", store)
        .env("TMPDIR", d))
}

#[test]
fn limits_lowered_mid_run_never_change_the_program() {
    let d = scratch("limits_mid");
    build(&d, "limits_mid.c", "limits_mid", &[]);
    let store = d.join("store");
    // What is still possible: (limit, the profile is written, else the
    // reason the line gives). With no descriptor left at all the process
    // cannot create the file, and its keeper (a process of its own, with
    // its own limits and few descriptors) writes it once it has ended.
    let cases = [
        ("fsize", None, Some("RLIMIT_FSIZE")),
        ("nofile", Some(()), None),
        ("nofile-hard", Some(()), Some("RLIMIT_NOFILE")),
        ("as", Some(()), None),
        ("as-full", None, Some("RLIMIT_AS")),
    ];
    for (limit, written, why) in cases {
        let plain = run(Command::new(d.join("limits_mid"))
            .arg(limit)
            .current_dir(&d));
        assert_eq!(plain.status.code(), Some(0), "{limit} unprofiled");
        for mode in ["-pp", "-mp", "-fd"] {
            let _ = std::fs::remove_file(d.join("p.gz"));
            let got = profiled(&d, mode, limit, &store);
            let err = String::from_utf8_lossy(&got.stderr);
            assert_eq!(
                (got.status.code(), &got.stdout),
                (plain.status.code(), &plain.stdout),
                "{limit} {mode}: {err}"
            );
            if let (Some(()), Some(why)) = (written, why) {
                assert!(
                    err.lines()
                        .any(|l| l.contains("could not write the profile")
                            && l.contains(why)
                            && l.ends_with("its keeper writes it once the process has ended")),
                    "{limit} {mode}: {err}"
                );
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while !d.join("p.gz").exists() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            if written.is_some() {
                let p = parse_strict(&read_text(&d.join("p.gz"))).unwrap();
                if mode == "-mp" {
                    assert_eq!(under(&p, "MEM_TOTAL", "allocate").0, 1000, "{limit}");
                }
            } else {
                let why = why.unwrap();
                assert!(
                    err.lines()
                        .any(|l| l.contains("could not write the profile") && l.contains(why)),
                    "{limit} {mode}: {err}"
                );
                assert!(!d.join("p.gz").exists(), "{limit} {mode}");
            }
            for e in std::fs::read_dir(&d).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                assert!(
                    !name.ends_with(".tmp"),
                    "{limit} {mode}: {name} left behind"
                );
            }
        }
    }
}
