//! A program of another architecture under the launcher: AArch64 builds of
//! the end-to-end programs on this (x86-64) host run under qemu-user with
//! the AArch64 libigprof.so, and their profiles pass the host tests' checks
//! (cpu.rs, mem_profiles.rs, fd_profiles.rs; the shared ones live in
//! mem_support). On an AArch64 host the roles are swapped.
//!
//! What qemu-user cannot do is said where it matters.

use std::process::Command;

mod mem_support;
use mem_support::*;

/// A scratch directory `name` with alloc_churn built for both
/// architectures (alloc_churn_host, alloc_churn_foreign).
fn churn_builds(name: &str) -> std::path::PathBuf {
    let d = scratch(name);
    cross_build(&d, "alloc_churn.c", "alloc_churn_foreign", &[]);
    build(&d, "alloc_churn.c", "alloc_churn_host", &[]);
    d
}

#[test]
fn a_program_of_another_architecture_runs_under_qemu_with_exact_counts() {
    let arch = foreign_arch().0;
    let d = churn_builds("foreign_arch");
    let mut counts = Vec::new();
    for prog in ["alloc_churn_host", "alloc_churn_foreign"] {
        let o = foreign_igprof(
            &d,
            &[
                "-mp",
                "-o",
                &format!("{prog}.gz"),
                &format!("./{prog}"),
                "20000",
                "5",
            ],
        );
        let err = ok(&o);
        assert!(err.contains("profiling"), "{prog}: {err}");
        let p = parse_strict(&read_text(&d.join(format!("{prog}.gz")))).unwrap();
        let sites: Vec<u64> = [
            "site_small",
            "site_mixed",
            "site_calloc",
            "site_realloc",
            "site_leak",
        ]
        .iter()
        .map(|s| under(&p, "MEM_TOTAL", s).0)
        .collect();
        counts.push(sites);
    }
    // site_realloc: a malloc and a realloc per round.
    assert_eq!(counts[0], vec![20000, 20000, 2000, 4000, 1000], "host");
    assert_eq!(
        counts[1], counts[0],
        "the {arch} run counts what the host run counts"
    );
}

#[test]
fn a_program_of_another_architecture_is_memory_sampled_under_qemu() {
    // -mp --sample-bytes 64: a 32-byte block is sampled with probability
    // 0.39, so most of site_small's allocations pass over through the
    // sampled hooks' jump to the real malloc (the foreign architecture's
    // entry stubs), and the others are recorded with weight 1/0.39. Each
    // site's estimated calls are within 6% of the exact counts (standard
    // errors under 1%: site_small's 20,000 blocks, 0.9%) on both
    // architectures.
    let arch = foreign_arch().0;
    let d = churn_builds("foreign_arch_sampled");
    let exact = [20000.0, 20000.0, 2000.0, 4000.0, 1000.0];
    for prog in ["alloc_churn_host", "alloc_churn_foreign"] {
        let out = format!("{prog}-sampled.gz");
        let o = foreign_igprof(
            &d,
            &[
                "-mp",
                "--sample-bytes",
                "64",
                "--sample-seed",
                "3",
                "-o",
                &out,
                &format!("./{prog}"),
                "20000",
                "5",
            ],
        );
        ok(&o);
        let p = parse_strict(&read_text(&d.join(&out))).unwrap();
        for (site, want) in [
            "site_small",
            "site_mixed",
            "site_calloc",
            "site_realloc",
            "site_leak",
        ]
        .iter()
        .zip(exact)
        {
            let got = under(&p, "MEM_TOTAL", site).0 as f64;
            assert!(
                (got / want - 1.0).abs() < 0.06,
                "{prog} ({arch} or host) {site}: {got} calls estimated, {want} made"
            );
        }
    }
}

#[test]
fn a_program_of_another_architecture_without_its_library_is_refused_clearly() {
    let arch = foreign_arch().0;
    let d = scratch("foreign_arch_nolib");
    cross_build(&d, "alloc_churn.c", "alloc_churn_foreign", &[]);
    let o = Command::new(launcher())
        .args(["-mp", "./alloc_churn_foreign", "10", "1"])
        .current_dir(&d)
        .env("IGPROF_LIB", lib())
        .env(
            format!("IGPROF_LIB_{}", arch.to_uppercase()),
            d.join("nonexistent.so"),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no libigprof.so built for"), "{err}");
}

#[test]
fn a_program_of_another_architecture_is_sampled_under_qemu() {
    let d = scratch("foreign_arch_pp");
    cross_build(&d, "cpu_split.c", "cpu_split_foreign", &[]);
    // qemu-user has no perf events of the guest's: the automatic choice
    // falls back to POSIX timers; both must recognise their own signals.
    for sampler in ["auto", "timer"] {
        let out = format!("{sampler}.gz");
        let o = foreign_igprof(
            &d,
            &[
                "-pp",
                "-i",
                "1ms",
                "--sampler",
                sampler,
                "-o",
                &out,
                "./cpu_split_foreign",
                "400",
            ],
        );
        ok(&o);
        let p = parse_strict(&read_text(&d.join(&out))).unwrap();
        let s = cumulative_shares(&p, "PERF_TICKS");
        // Sampling error: four standard deviations of a share of n samples
        // (POSIX CPU timers fire on the scheduler tick: a few hundred
        // samples here, fewer on a loaded machine), at least 6 points.
        let n = total(&p, "PERF_TICKS");
        for (f, want) in [("hot_a", 50.0), ("hot_b", 30.0), ("hot_c", 20.0)] {
            let got = s.get(f).copied().unwrap_or(0.0);
            let tol = sampling_tolerance(want, n).max(6.0);
            assert!(
                (got - want).abs() < tol,
                "{sampler}: {f} {got:.1}%, {want}% expected (+-{tol:.1} for {n} ticks): {s:?}"
            );
        }
    }
}

/// Return addresses signed by pointer authentication
/// (`-mbranch-protection=pac-ret`: the AArch64 builds of most
/// distributions since 2022) are unwound through, as on CPUs that sign
/// them (Graviton 3 and later; qemu's `max`), and the call-frame
/// information of such functions is read (its `negate_ra_state`). Every
/// sample in the workload, in the leaf `spin` (its return address in x30,
/// unsigned) or in the body of work or hot_* (each saved a signed one),
/// has main > work above it.
#[test]
fn foreign_signed_return_addresses_are_unwound() {
    let arch = foreign_arch().0;
    if arch != "aarch64" {
        eprintln!("pointer authentication is AArch64's: nothing to check for {arch}");
        return;
    }
    let d = scratch("foreign_pac");
    cross_build(
        &d,
        "cpu_split.c",
        "cpu_split_pac",
        &["-mbranch-protection=pac-ret"],
    );
    let o = foreign_igprof_command(
        &d,
        &["-pp", "-i", "1ms", "-o", "pac.gz", "./cpu_split_pac", "100"],
    )
    .env("QEMU_CPU", "max")
    .output()
    .unwrap();
    ok(&o);
    let p = parse_strict(&read_text(&d.join("pac.gz"))).unwrap();
    let (mut in_work, mut whole) = (0, 0);
    let ours = |f: &str| f == "work" || f == "spin" || f.starts_with("hot_");
    for (path, ticks) in paths(&p, "PERF_TICKS") {
        if !path.last().is_some_and(|f| ours(f)) {
            continue;
        }
        in_work += ticks;
        let main = path.iter().position(|f| f == "main");
        if main.is_some_and(|m| path.get(m + 1).is_some_and(|f| f == "work")) {
            whole += ticks;
        }
    }
    assert!(in_work >= 20, "{in_work} samples in the workload");
    assert_eq!(whole, in_work, "{:?}", paths(&p, "PERF_TICKS"));
}

fn share(s: &std::collections::BTreeMap<String, f64>, f: &str) -> f64 {
    s.get(f).copied().unwrap_or(0.0)
}

#[test]
fn foreign_sixteen_threads_each_get_their_share() {
    let d = scratch("foreign_threads");
    cross_build(&d, "threads16.c", "threads16", &[]);
    ok(&foreign_igprof(
        &d,
        &["-pp", "-i", "1ms", "-o", "t.gz", "./threads16", "12000000"],
    ));
    let p = load(&d.join("t.gz"));
    let s = cumulative_shares(&p, "PERF_TICKS");
    for i in 0..16 {
        let want = 100.0 * (i + 1) as f64 / 136.0;
        let got = share(&s, &format!("t{i}"));
        assert!(
            (got - want).abs() <= 3.0,
            "t{i}: {got:.1}%, {want:.1}% expected: {s:?}"
        );
    }
}

#[test]
fn foreign_cpp_exception_through_50_frames_at_100us() {
    let d = scratch("foreign_throw");
    cross_build(&d, "throw50.cpp", "throw50", &[]);
    let o = foreign_igprof(
        &d,
        &["-pp", "-i", "100us", "-o", "t.gz", "./throw50", "10000"],
    );
    ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "caught 10000 of 10000"
    );
    assert!(total(&load(&d.join("t.gz")), "PERF_TICKS") > 100);
}

#[test]
fn foreign_dlopened_functions_by_name_and_dlclose_while_sampling() {
    let d = scratch("foreign_dlopen");
    cross_build(&d, "plugin.c", "plugin.so", &["-shared", "-fPIC"]);
    cross_build(&d, "plugin.c", "cycled.so", &["-shared", "-fPIC"]);
    cross_build(&d, "dlopen_main.c", "dlopen_main", &[]);
    let (plugin, cycled) = (d.join("plugin.so"), d.join("cycled.so"));
    ok(&foreign_igprof(
        &d,
        &[
            "-pp",
            "-i",
            "100us",
            "-o",
            "dl.gz",
            "./dlopen_main",
            plugin.to_str().unwrap(),
            cycled.to_str().unwrap(),
        ],
    ));
    check_dlopen(&load(&d.join("dl.gz")));
}

#[test]
fn foreign_frees_on_other_threads_are_charged_to_the_allocating_stack() {
    let (_d, out, _err, p) = run_foreign("foreign_handoff", "mem_handoff.c", &["-mp"], &["50000"]);
    check_handoff(&out, &p, 50_000);
}

#[test]
fn foreign_fd_churn_is_exact() {
    let (_d, out, _err, p) = run_foreign("foreign_fdchurn", "fd_churn.c", &["-fd"], &["2000"]);
    check_fd_churn(&out, &p, 2000);
}

#[test]
fn foreign_memory_descriptors_and_cpu_in_one_run() {
    let (_d, out, err, p) = run_foreign(
        "foreign_together",
        "fd_churn.c",
        &["-pp", "-mp", "-fd"],
        &["20000"],
    );
    check_fd_mem_cpu(&out, &err, &p, 20_000);
}

#[test]
fn foreign_dump_now_and_dump_signal() {
    let d = scratch("foreign_dumpnow");
    cross_build(&d, "sleep_burn.c", "sleep_burn", &[]);
    check_dump_now(&d, &foreign_igprof(&d, DUMP_NOW_ARGS));
}

#[test]
fn foreign_dump_on_flag_file() {
    let d = scratch("foreign_flag");
    cross_build(&d, "kill_mid.c", "kill_mid", &[]);
    let flag = d.join("dump-now");
    let snap = d.join("snap.gz");
    // The flag is there from the start: the watcher, polling every 200 ms,
    // finds it while the program runs. `kill_mid kill` then waits to be
    // killed, so the snapshot is taken while it runs however slowly qemu
    // starts on a loaded machine.
    std::fs::write(&flag, b"").unwrap();
    let mut child = foreign_igprof_command(
        &d,
        &[
            "-pr",
            "-D",
            flag.to_str().unwrap(),
            "-o",
            "snap.gz",
            "./kill_mid",
            "kill",
            "0",
        ],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !snap.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(snap.exists(), "the flag file produced a dump within 60 s");
    assert!(running, "snapshot taken while the program still runs");
    assert!(!flag.exists(), "the flag file is consumed");
    let mid = load(&snap);
    assert!(mid.program.ends_with("kill_mid"), "{}", mid.program);
}

/// procs.c under qemu-user: fork without exec, fork+exec of itself and
/// system(). The parent and the forked child each write their own profile
/// (the library starts no watcher thread in a fork child under qemu-user,
/// which aborts a forked child of a multi-threaded guest that creates a
/// thread: see runtime::after_fork_child; such a child writes its profile
/// when it exits, not on the dump signal, -D, --dump-every or a fatal
/// signal).
///
/// What qemu-user cannot do here, with or without the profiler: a guest's
/// execve goes to the host kernel, which cannot run an AArch64 file unless
/// qemu is registered with binfmt_misc (not the case on the test machines),
/// so the fork+exec child's exec fails (ENOEXEC) and it exits 127; and
/// system()'s /bin/sh is the host's, run natively, where the host loader
/// ignores the AArch64 library (it says so on stderr) and the shell writes
/// no profile. The exec child's image before its exec still writes its
/// `.exec0` profile, and the image that carries on after the failed exec
/// its own.
#[test]
fn foreign_fork_each_process_writes_its_own_profile() {
    let d = scratch("foreign_procs");
    cross_build(&d, "procs.c", "procs", &[]);
    let o = foreign_igprof(&d, &["-pp", "-i", "1ms", "./procs"]);
    let err = String::from_utf8_lossy(&o.stderr);
    // Forked child 0, exec child 127 (exec failed), system() 0: as unprofiled.
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0 127 0\n", "{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("assertion failed"), "qemu aborted: {err}");
    let ps = profiles(&d);
    let mut by_work = std::collections::BTreeMap::new();
    let (mut pre_exec, mut after_failed_exec) = (0, 0);
    for f in &ps {
        let p = load(f);
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("igprof.procs."),
            "{name}: no shell profile"
        );
        if name.ends_with(&format!(".{}.exec0.gz", p.pid)) {
            pre_exec += 1;
            continue;
        }
        assert!(
            name.ends_with(&format!(".{}.gz", p.pid)),
            "{name} names its pid {}",
            p.pid
        );
        // Each work function runs in one process only; where it runs it
        // is most of the CPU time (qemu's translation of the program's
        // code on first use, start-up and exit are the rest: more of it on
        // a busy machine).
        let s = cumulative_shares(&p, "PERF_TICKS");
        let ran: Vec<&str> = ["parent_work", "forked_child_work"]
            .into_iter()
            .filter(|w| share(&s, w) > 0.0)
            .collect();
        match ran[..] {
            [] => after_failed_exec += 1,
            [work] => {
                assert!(share(&s, work) > 50.0, "{name}: {s:?}");
                assert!(
                    by_work.insert(work, name.clone()).is_none(),
                    "two profiles for {work}"
                )
            }
            _ => panic!("{name} has samples of both: {s:?}"),
        }
    }
    assert_eq!(by_work.len(), 2, "parent and forked child: {ps:?}");
    assert_eq!(
        pre_exec, 1,
        "the fork+exec child's image before exec: {ps:?}"
    );
    assert_eq!(after_failed_exec, 1, "and after its exec failed: {ps:?}");
}

/// The launcher's static build for AArch64 (`cargo build --release
/// --target aarch64-unknown-linux-musl -p igprof-launcher`, which
/// scripts/test runs) starts under qemu-user and reads its command line
/// from `main`'s argv (musl fills no `std::env::args`): its usage, a
/// missing program refused, and an x86-64 program sent to qemu-x86_64,
/// refused here for the guest root it names.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_static_aarch64_launcher_reads_its_command_line_under_qemu() {
    let launcher = foreign_launcher();
    let run = |args: &[&str]| {
        Command::new("qemu-aarch64")
            .arg(&launcher)
            .args(args)
            .env("QEMU_LD_PREFIX", "/igprof-no-such-root")
            .output()
            .unwrap()
    };
    let o = run(&["-h"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("igprof [options] [--] program"));
    let o = run(&["-pp", "/igprof-no-such-program"]);
    assert_eq!(o.status.code(), Some(127));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "igprof: /igprof-no-such-program: no such file\n"
    );
    let o = run(&["-pp", "/bin/true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(
        err.starts_with("igprof: /bin/true is an x86-64 program: qemu-x86_64 needs its libraries under /igprof-no-such-root"),
        "{err}"
    );
}

/// The host's library in a program of the host's architecture run under
/// qemu-user, as a program of this machine's kind runs on a host of the
/// other (an x86-64 program on an AArch64 host, whose launcher runs it so).
/// qemu-user 7.2 (Debian 12's) enters an x86-64 program's signal handlers
/// with the stack 8 bytes off the ABI's alignment: the sampling handler
/// realigns it (without that, the program died of SIGSEGV at its first
/// sample). The program's output and status are its own, and the profile
/// holds its samples.
#[test]
fn a_program_under_qemu_user_of_its_own_architecture_keeps_running() {
    let d = scratch("qemu_same_arch");
    let prog = build(&d, "cpu_split.c", "cpu_split", &[]);
    let plain = Command::new(&prog).arg("20").output().unwrap();
    assert!(plain.status.success());
    let o = Command::new(format!("qemu-{}", std::env::consts::ARCH))
        .args(["-L", "/", "-E", "IGPROF_QEMU_USER=1"])
        .args(["-E", "IGPROF=-pp -i 1ms -o p.gz"])
        .arg("-E")
        .arg(format!("LD_PRELOAD={}", lib().display()))
        .arg("-E")
        .arg(format!("IGPROF_CACHE_DIR={}", test_store().display()))
        .arg(&prog)
        .arg("20")
        .current_dir(&d)
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(o.stdout, plain.stdout);
    let p = parse_strict(&read_text(&d.join("p.gz"))).unwrap();
    assert!(total(&p, "PERF_TICKS") > 0, "no sample");
}
