//! IgProf's options with IgProf's meaning: -pd with igprof_enable() /
//! igprof_disable() and the toggle signal, -pk for fork children, -j (the
//! function-call profiler's flags are tested in calls.rs), and the
//! launcher's refusal of values the library would refuse. Exact counts where the truth is
//! exact (allocations), a share of the samples where it is statistical.

use std::path::Path;

use igprof_tests::*;

fn profile_in(d: &Path, file: &str) -> Profile {
    parse_strict(&read_text(&d.join(file))).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn recording_starts_off_and_follows_igprof_enable_and_disable() {
    let d = scratch("pd_api");
    build(&d, "phases.c", "phases", &["-ldl"]);
    let out = igprof(&d, &["-pd", "-mp", "-pp", "-o", "p.gz", "./phases", "api"]);
    ok(&out);
    // enable() found recording off, disable() found it on.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "enable 0 disable 1\n");
    let p = profile_in(&d, "p.gz");
    assert_eq!(
        under(&p, "MEM_TOTAL", "before").0,
        0,
        "nothing before enable"
    );
    assert_eq!(under(&p, "MEM_TOTAL", "during").0, 50);
    assert_eq!(
        under(&p, "MEM_TOTAL", "after").0,
        0,
        "nothing after disable"
    );
    // Frees are counted even while recording is off: during()'s blocks,
    // freed after disable, are no longer live.
    assert_eq!(under(&p, "MEM_LIVE", "during"), (0, 0));
    let ticks = |f| under(&p, "PERF_TICKS", f).0;
    let (b, m, a) = (ticks("before"), ticks("during"), ticks("after"));
    assert!(m >= 15, "150 ms at 5 ms: {m} ticks in during()");
    assert!(b + a <= 2, "{b} ticks before enable, {a} after disable");
    // Unprofiled, the program runs the same (it finds no igprof_enable).
    let plain = std::process::Command::new(d.join("phases"))
        .arg("api")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "enable -2 disable -2\n"
    );
}

#[test]
fn the_toggle_signal_turns_recording_on_and_off() {
    let d = scratch("pd_signal");
    build(&d, "phases.c", "phases", &["-ldl"]);
    let out = igprof(
        &d,
        &[
            "-pd",
            "--toggle-signal",
            "43",
            "-mp",
            "-o",
            "p.gz",
            "./phases",
            "signal",
            "43",
        ],
    );
    ok(&out);
    let p = profile_in(&d, "p.gz");
    assert_eq!(under(&p, "MEM_TOTAL", "before").0, 0);
    assert_eq!(under(&p, "MEM_TOTAL", "during").0, 50);
    assert_eq!(under(&p, "MEM_TOTAL", "after").0, 0);
}

#[test]
fn a_fork_child_starts_empty_unless_pk_keeps_the_parents_profile() {
    for keep in [false, true] {
        let d = scratch(if keep { "pk_keep" } else { "pk_reset" });
        build(&d, "phases.c", "phases", &["-ldl"]);
        let mut args = vec!["-mp", "-o", "p.gz", "./phases", "fork"];
        if keep {
            args.insert(0, "-pk");
        }
        let out = igprof(&d, &args);
        ok(&out);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "child 0\n");
        let parent = profile_in(&d, "p.gz");
        assert_eq!(under(&parent, "MEM_TOTAL", "parent_site").0, 40);
        assert_eq!(under(&parent, "MEM_TOTAL", "child_site").0, 0);
        // The child's file: p.<pid>.gz.
        let child_file = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|f| {
                let n = f.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with("p.") && n.ends_with(".gz") && n != "p.gz"
            })
            .expect("the child's profile");
        let child = parse_strict(&read_text(&child_file)).unwrap();
        assert_eq!(under(&child, "MEM_TOTAL", "child_site").0, 30);
        let inherited = under(&child, "MEM_TOTAL", "parent_site").0;
        assert_eq!(inherited, if keep { 40 } else { 0 }, "-pk {keep}");
        if keep {
            // The parent's blocks stay live in the child, which has one
            // thread: its live table came along.
            assert_eq!(under(&child, "MEM_LIVE", "parent_site").0, 40);
        }
    }
}

#[test]
fn j_is_accepted() {
    let d = scratch("j");
    build(&d, "phases.c", "phases", &["-ldl"]);
    let out = igprof(&d, &["-j", "-mp", "-o", "j.gz", "./phases", "api"]);
    ok(&out);
    assert_eq!(under(&profile_in(&d, "j.gz"), "MEM_TOTAL", "during").0, 50);
}

/// python3 turns recording on and off itself through ctypes: with -pd only
/// the allocations of the phase it enables (20,000 blocks of 1000 bytes:
/// above pymalloc's limit, so each is a malloc) are in the profile; without
/// -pd the interpreter's start-up is there too; the phase after
/// igprof_disable() is in neither.
#[test]
fn python_profiles_only_the_phase_it_enables() {
    let d = scratch("pd_python");
    let script = "import ctypes\n\
                  l = ctypes.CDLL(None)\n\
                  l.igprof_enable()\n\
                  a = [bytes(1000) for i in range(20000)]\n\
                  l.igprof_disable()\n\
                  b = [bytes(1000) for i in range(20000)]\n\
                  print(len(a) + len(b))\n";
    let run = |extra: &[&str], out: &str| {
        let mut args = extra.to_vec();
        args.extend(["-mp", "-o", out, "/usr/bin/python3", "-c", script]);
        let o = igprof(&d, &args);
        ok(&o);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "40000\n");
        total(&profile_in(&d, out), "MEM_TOTAL")
    };
    let all = run(&[], "all.gz");
    let phase = run(&["-pd"], "phase.gz");
    assert!(
        (20_000..20_500).contains(&phase) && all >= phase + 1_000 && all < 30_000,
        "{phase} allocations recorded with -pd, {all} without"
    );
}

/// A program that cannot be run ends the launcher with a shell's status
/// for it: 127 for a missing file or command, 126 for a file that is not
/// executable (a directory too), with one line saying why.
#[test]
fn a_program_that_cannot_run_gets_the_shells_exit_status() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("cannot-run");
    let plain = d.join("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir_all(d.join("dir")).unwrap();
    for (prog, says) in [
        ("./plain.sh", "igprof: ./plain.sh: not executable\n"),
        (
            "./no-such-program",
            "igprof: ./no-such-program: no such file\n",
        ),
        ("./dir", ""),
        ("igprof-no-such-command", ""),
    ] {
        let shell = std::process::Command::new("sh")
            .args(["-c", &format!("exec {prog}")])
            .current_dir(&d)
            .output()
            .unwrap();
        let o = igprof(&d, &["-pp", prog]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), shell.status.code(), "{prog}: {err}");
        assert!(err.starts_with(says), "{prog}: {err}");
        assert!(o.stdout.is_empty(), "{prog}: the program ran");
    }
}

/// Values the library would refuse are refused by the launcher, before the
/// program runs: one line naming the option and what to give, exit 127,
/// and the program (here `touch`, which would leave a file) never started.
#[test]
fn values_the_library_refuses_stop_the_launcher() {
    let d = scratch("refused-values");
    for (opts, says) in [
        (&["--depth", "5"][..], "igprof: option --depth: bad value '5', expected 16 to 65536\n"),
        (&["-pp", "-i", "0"], "igprof: option -i: bad value '0', expected a time from 100us to 1s, e.g. 5ms, 100us, 0.5ms\n"),
        (&["--dump-signal", "99"], "igprof: option --dump-signal: bad value '99', expected a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF, or 0\n"),
        (&["-pp", "-pr"], "igprof: only one of -pp, -pu, -pr may be given\n"),
    ] {
        let mut a = opts.to_vec();
        a.extend(["touch", "ran"]);
        let o = igprof(&d, &a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(127), "{opts:?}: {err}");
        assert_eq!(err, says, "{opts:?}");
        assert!(!d.join("ran").exists(), "{opts:?}: the program ran");
    }
    // The same values within range run the program.
    let o = igprof(
        &d,
        &[
            "-mp",
            "--depth",
            "16",
            "-i",
            "100us",
            "--dump-signal",
            "0",
            "-o",
            "p.gz",
            "touch",
            "ran",
        ],
    );
    ok(&o);
    assert!(d.join("ran").exists() && d.join("p.gz").exists());
}

/// `igprof -h` lists every option of the table with its help.
#[test]
fn the_usage_lists_every_option() {
    let d = scratch("usage");
    let o = igprof(&d, &["-h"]);
    ok(&o);
    let usage = String::from_utf8_lossy(&o.stdout);
    for opt in igprof_options::TABLE {
        for name in opt.names {
            assert!(usage.contains(name), "{name} not in\n{usage}");
        }
        for line in opt.help {
            assert!(usage.contains(line), "{line} not in\n{usage}");
        }
    }
}
