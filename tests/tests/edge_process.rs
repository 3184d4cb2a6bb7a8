//! Edge cases of how a program treats its process: descriptors closed and
//! reused under the profiler, every way it can end (pthread_exit from main,
//! fatal signals with and without its own handlers, resource limits, a dump
//! request just before exit), longjmp out of signal handlers, dropping root
//! privileges, and time spent inside the profiler's hooks. Each program runs
//! unprofiled and under the launcher; what it prints and how it ends must be
//! the same, and its profile must be there and hold what it did.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use igprof_tests::*;

/// The module combinations every program runs under.
const MODES: &[&[&str]] = &[
    &["-pp", "-i", "1ms"],
    &["-mp"],
    &["-fd"],
    &["-pp", "-i", "1ms", "-mp", "-fd"],
];

/// Tells a hung child from a slow one on a loaded machine: a child is hung
/// once its CPU time (all its threads and the children it reaped,
/// /proc/PID/stat; the launcher execs the program in its own process)
/// has not grown for `idle` of wall
/// time (a deadlock, a wait that never ends), or it ran `idle` ten times
/// over (a loop that never ends).
struct Hang {
    pid: u32,
    idle: Duration,
    start: Instant,
    last: (u64, Instant),
}

impl Hang {
    fn new(pid: u32, idle: Duration) -> Hang {
        let now = Instant::now();
        Hang {
            pid,
            idle,
            start: now,
            last: (0, now),
        }
    }

    /// The child's CPU time and its reaped children's (utime, stime,
    /// cutime, cstime), in clock ticks (None once it is gone).
    fn cpu(&self) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // After the command name's closing parenthesis: state is field 3,
        // the times fields 14 to 17.
        let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
        fields
            .get(11..15)?
            .iter()
            .map(|f| f.parse::<u64>().ok())
            .sum()
    }

    /// Whether the child counts as hung now (see the type).
    fn hung(&mut self) -> bool {
        let now = Instant::now();
        if let Some(cpu) = self.cpu() {
            if cpu != self.last.0 {
                self.last = (cpu, now);
            }
        }
        now - self.last.1 > self.idle || now - self.start > self.idle * 10
    }
}

/// A thread that reads `from` to its end: a child whose output fills a
/// pipe must not wait for the test to read it.
fn drain(mut from: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        from.read_to_end(&mut all).unwrap();
        all
    })
}

/// Runs `cmd` to its end; kills it and fails when it hangs ([`Hang`],
/// idle `secs` seconds).
fn finish(mut cmd: Command, secs: u64, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let mut hang = Hang::new(child.id(), Duration::from_secs(secs));
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Output {
                status,
                stdout: stdout.join().unwrap(),
                stderr: stderr.join().unwrap(),
            };
        }
        if hang.hung() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: hung (no CPU time used in {secs} s, or running {}0 s); stderr: {}",
                secs,
                String::from_utf8_lossy(&stderr.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn plain(dir: &Path, prog: &str, args: &[&str]) -> Output {
    let mut c = Command::new(dir.join(prog));
    c.args(args).current_dir(dir);
    finish(c, 60, prog)
}

fn profiled(dir: &Path, mode: &[&str], prog: &str, args: &[&str]) -> Output {
    let mut c = Command::new(launcher());
    c.args(mode)
        .arg(format!("./{prog}"))
        .args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib());
    finish(c, 60, &format!("{prog} under {mode:?}"))
}

/// A fresh directory per mode, with the program built into it.
fn dir_for(name: &str, src: &str, mode: &[&str]) -> PathBuf {
    let d = scratch(&format!("{name}{}", mode.join("")));
    build(&d, src, name, &[]);
    d
}

fn the_profile(dir: &Path) -> Profile {
    let ps = profiles(dir);
    assert_eq!(
        ps.len(),
        1,
        "one profile expected in {}: {ps:?}",
        dir.display()
    );
    parse_strict(&read_text(&ps[0])).unwrap_or_else(|e| panic!("{}: {e}", ps[0].display()))
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// Asserts that the profiled run under `mode` exited with status 0.
fn ran(got: &Output, mode: &[&str]) {
    assert_eq!(
        got.status.code(),
        Some(0),
        "{mode:?}: {}",
        text(&got.stderr)
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The number a test program printed on stderr after `name ` (a line of
/// its own, among the profiler's messages).
fn reported(stderr: &[u8], name: &str) -> f64 {
    let t = text(stderr);
    t.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no '{name} N' line in stderr: {t}"))
}

/// A profile's PERF_TICKS stacks of at least `min` ticks, a line each
/// (outermost caller first), for a failure message.
fn tick_paths(p: &Profile, min: u64) -> String {
    paths(p, "PERF_TICKS")
        .into_iter()
        .filter(|(_, ticks)| *ticks >= min)
        .map(|(path, ticks)| format!("{ticks:6} {}", path.join(";")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn uses(mode: &[&str], flag: &str) -> bool {
    mode.contains(&flag)
}

/// The profiler's own lookups of names a program lacks (cgo's
/// `_cgo_topofstack`, a sanitizer's callback, an `-fp` function of a
/// library not loaded yet) must not leave their error in the program's
/// `dlerror()`: under `-np` its first `dlerror()` returned
/// "libigprof.so: undefined symbol: _cgo_topofstack".
#[test]
fn the_programs_dlerror_says_what_it_says_unprofiled() {
    let modes: &[&[&str]] = &[
        &["-pp"],
        &["-mp"],
        &["-fd"],
        &["-np"],
        &["-ep"],
        &["-fp:no_such_function"],
        &["-fp:zlibVersion:libz.so.1"],
    ];
    prints_as_unprofiled("dlerror_state", modes, "dlerror()");
}

/// Runs tests/programs/`name`.c unprofiled and under each of `modes`: it
/// must print the same (`what` names it in the failure).
fn prints_as_unprofiled(name: &str, modes: &[&[&str]], what: &str) {
    for &mode in modes {
        let d = dir_for(name, &format!("{name}.c"), mode);
        let want = plain(&d, name, &[]);
        assert!(want.status.success(), "unprofiled run failed");
        let got = profiled(&d, &[mode, &["-o", "p.gz"]].concat(), name, &[]);
        ran(&got, mode);
        assert_eq!(
            text(&got.stdout),
            text(&want.stdout),
            "{mode:?}: {what} differs"
        );
    }
}

/// A program started with descriptor 2 closed (a daemon, `2>&-`) that
/// opens a file of its own gets number 2 for it: the profiler's lines must
/// not go there. They did (every `-d` line, and any warning at exit): the
/// check that descriptor 2 is still the stderr the program started with
/// had nothing to compare with and let every line through.
#[test]
fn a_closed_stderr_reused_by_the_program_gets_no_line_of_ours() {
    let d = scratch("stderr_reuse");
    build(&d, "stderr_reuse.c", "stderr_reuse", &[]);
    for mode in [&["-mp", "-d"][..], &["-pp", "-fd", "-d"]] {
        let _ = std::fs::remove_file(d.join("p.gz"));
        let o = Command::new("/bin/sh")
            .args(["-c", "exec 2>&-; exec \"$@\"", "sh"])
            .arg(launcher())
            .args(mode)
            .args(["-o", "p.gz", "./stderr_reuse", "out.txt"])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", test_store())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{mode:?}");
        assert_eq!(
            std::fs::read_to_string(d.join("out.txt")).unwrap(),
            "fd 2\n",
            "{mode:?}: the program's file"
        );
        let p = parse_strict(&read_text(&d.join("p.gz"))).unwrap();
        if mode[0] == "-mp" {
            assert_eq!(under(&p, "MEM_TOTAL", "allocate").0, 1000);
        }
    }
}

/// The C library's heap when `main` starts is the program's: the
/// profiler's start-up allocates nothing in it (its own memory comes from
/// mmap). Finding the hooked functions with `dlopen(libc.so.6,
/// RTLD_NOLOAD)` made glibc's arena and left 704 bytes in use, where the
/// program finds none. (A profiler with nothing to profile, `-np` where
/// no energy counter can be read, sets a variable in the environment for
/// the next exec'd image, which does allocate.)
#[test]
fn the_programs_heap_at_main_is_as_unprofiled() {
    let modes: &[&[&str]] = &[&["-pp"], &["-mp"], &["-fd"], &["-mp", "-fd", "-pp"]];
    prints_as_unprofiled("heap_at_main", modes, "the heap at main");
}

#[test]
fn descriptors_closed_and_reused_by_the_program_stay_its_own() {
    for variant in ["", "stderr"] {
        for &mode in MODES {
            let d = dir_for("fd_closeall", "fd_closeall.c", mode);
            let args: Vec<&str> = ["data.txt", variant]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect();
            let want = plain(&d, "fd_closeall", &args);
            assert!(want.status.success(), "unprofiled run failed");
            let want_data = std::fs::read_to_string(d.join("data.txt")).unwrap();
            std::fs::remove_file(d.join("data.txt")).unwrap();
            // Ask for a dump while the program's file is open (signal 42);
            // with -d the profiler has lines to say at exit, after the
            // program reused stderr's number.
            let mut c = Command::new(launcher());
            if variant == "stderr" {
                c.arg("-d");
            }
            c.args(mode)
                .args(["./fd_closeall"])
                .args(&args)
                .current_dir(&d)
                .env("IGPROF_LIB", lib())
                .env("DUMP_SIGNAL", "42");
            let got = finish(c, 60, "fd_closeall");
            let ctx = format!("{mode:?} {variant}");
            assert_eq!(
                text(&got.stdout),
                text(&want.stdout),
                "{ctx}: output differs"
            );
            assert_eq!(got.status.code(), Some(0), "{ctx}: {}", text(&got.stderr));
            let data = std::fs::read_to_string(d.join("data.txt")).unwrap();
            assert_eq!(
                data, want_data,
                "{ctx}: the program's data file was changed"
            );
            let p = the_profile(&d);
            if uses(mode, "-pp") {
                // after_close_all runs after every descriptor was closed:
                // 100 ms of its thread's CPU time, 100 samples of 1 ms; at
                // least half of them, whatever else runs beside it.
                let (ticks, _) = under(&p, "PERF_TICKS", "after_close_all");
                assert!(
                    ticks >= 50,
                    "{ctx}: sampling stopped after close-all ({ticks} ticks of 1 ms in after_close_all)"
                );
            }
        }
    }
}

#[test]
fn pthread_exit_from_main_ends_the_process() {
    for &mode in MODES {
        let d = dir_for("pthread_exit_main", "pthread_exit_main.c", mode);
        let got = profiled(&d, mode, "pthread_exit_main", &[]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        let mut lines: Vec<String> = text(&got.stdout).lines().map(String::from).collect();
        lines.sort();
        assert_eq!(lines, ["worker 0 done", "worker 1 done"], "{mode:?}");
        let p = the_profile(&d);
        if uses(mode, "-mp") {
            let (calls, _) = under(&p, "MEM_TOTAL", "work");
            // 2 x 1000 allocations, and stdout's buffer if printf made it there.
            assert!(
                (2000..=2001).contains(&calls),
                "{mode:?}: {calls} allocations under work"
            );
        }
    }
}

#[test]
fn longjmp_out_of_signal_handlers_keeps_the_thread_sampled() {
    for mode in [
        &["-pp", "-i", "100us"][..],
        &["-pp", "-i", "100us", "-mp"][..],
    ] {
        let d = dir_for("jump_out", "jump_out.c", mode);
        let got = profiled(&d, mode, "jump_out", &[]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), "1000 jumps\n");
        let p = the_profile(&d);
        // after_jumps burns 300 ms of CPU after the last jump.
        let (ticks, _) = under(&p, "PERF_TICKS", "after_jumps");
        assert!(
            ticks as f64 * 0.1 >= 150.0,
            "{mode:?}: after the jumps only {ticks} samples of 100 us in after_jumps"
        );
        if uses(mode, "-mp") {
            // Every malloc that returned is counted; one the alarm jumped
            // out of may or may not be.
            let returned = reported(&got.stderr, "mallocs");
            let (calls, _) = under(&p, "MEM_TOTAL", "spin_until_alarm");
            assert!(
                (returned..=returned + 1000.0).contains(&(calls as f64)),
                "{mode:?}: {calls} allocations counted, {returned} returned"
            );
        }
    }
}

/// A program started by [`until_ready`]: the child, its stdout reader,
/// what it printed so far, and the thread that reads its stderr all along
/// (a program that writes more than a pipe holds there, the profiler's -d
/// lines of many dumps on a loaded machine, must not wait for a reader).
struct Started {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    seen: String,
    err: std::thread::JoinHandle<Vec<u8>>,
}

/// `prog` built in `d`, run unprofiled (`mode` None) or under the launcher
/// with `mode`, with argument `arg`, stdin piped if `stdin`, until it
/// prints "ready".
fn until_ready(d: &Path, mode: Option<&[&str]>, prog: &str, arg: &str, stdin: bool) -> Started {
    let mut c = match mode {
        Some(m) => {
            let mut c = Command::new(launcher());
            c.args(m).arg(format!("./{prog}")).env("IGPROF_LIB", lib());
            c
        }
        None => Command::new(d.join(prog)),
    };
    if stdin {
        c.stdin(Stdio::piped());
    }
    // The signals these tests send take their default action, whatever
    // this test process inherited (nohup ignores SIGHUP, and an ignored
    // signal stays ignored across exec).
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let mut child = c
        .arg(arg)
        .current_dir(d)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = drain(child.stderr.take().unwrap());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.ends_with("ready\n") {
        assert!(
            out.read_line(&mut seen).unwrap() > 0,
            "no ready line: {seen}"
        );
    }
    Started {
        child,
        out,
        seen,
        err,
    }
}

/// Starts `die_by_signal <arg>` (profiled when `mode` is given), waits for
/// its "ready", sends `sig`, and returns what it printed and how it ended.
fn killed(d: &Path, mode: Option<&[&str]>, arg: &str, sig: i32) -> Output {
    let started = until_ready(d, mode, "die_by_signal", arg, false);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(started.child.id() as i32, sig) };
    rest_of(started)
}

/// Waits for a child [`until_ready`] started: its output, stdout whole.
fn rest_of(mut s: Started) -> Output {
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut s.out, &mut rest).unwrap();
    let status = s.child.wait().unwrap();
    Output {
        status,
        stdout: format!("{}{rest}", s.seen).into_bytes(),
        stderr: s.err.join().unwrap(),
    }
}

#[test]
fn fatal_signals_write_the_profile_and_end_the_same_way() {
    use std::os::unix::process::ExitStatusExt;
    for (sig, mode) in [
        (libc::SIGTERM, &["-pp"][..]),
        (libc::SIGINT, &["-mp"][..]),
        (libc::SIGHUP, &["-pp", "-mp", "-fd"][..]),
    ] {
        let d = dir_for("die_by_signal", "die_by_signal.c", mode);
        let want = killed(&d, None, "default", sig);
        let got = killed(&d, Some(mode), "default", sig);
        let ctx = format!("signal {sig} under {mode:?}");
        assert_eq!(want.status.signal(), Some(sig));
        assert_eq!(
            got.status.signal(),
            Some(sig),
            "{ctx}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), text(&want.stdout), "{ctx}");
        assert!(leftovers(&d).is_empty(), "{ctx}: {:?}", leftovers(&d));
        let p = the_profile(&d);
        let counter = if uses(mode, "-pp") {
            "PERF_TICKS"
        } else {
            "MEM_TOTAL"
        };
        let (n, _) = under(&p, counter, "until_killed");
        assert!(n > 0, "{ctx}: nothing in until_killed");
    }
    // The program's own handler still runs, and it still sees SIG_DFL where
    // it set nothing.
    let d = dir_for("die_by_signal", "die_by_signal.c", &["-pp", "handler"]);
    for arg in ["handler", "query"] {
        let want = killed(&d, None, arg, libc::SIGTERM);
        let got = killed(&d, Some(&["-pp"]), arg, libc::SIGTERM);
        assert_eq!(text(&got.stdout), text(&want.stdout), "{arg}");
        assert_eq!(got.status.code(), want.status.code(), "{arg}");
        assert_eq!(got.status.signal(), want.status.signal(), "{arg}");
    }
}

#[test]
fn a_file_size_limit_fails_the_profile_not_the_program() {
    for &mode in MODES {
        let d = dir_for("limits_end", "limits_end.c", mode);
        let got = profiled(&d, mode, "limits_end", &["fsize"]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), "done\n");
        assert!(
            text(&got.stderr).contains("could not write the profile"),
            "{mode:?}: the failure must be said: {}",
            text(&got.stderr)
        );
        assert!(leftovers(&d).is_empty(), "{mode:?}: {:?}", leftovers(&d));
    }
}

#[test]
fn a_dump_requested_just_before_exit_does_not_cost_the_final_profile() {
    for _ in 0..5 {
        let d = dir_for("limits_end", "limits_end.c", &["-mp", "dump"]);
        let got = profiled(&d, &["-mp"], "limits_end", &["dump", "300000"]);
        assert_eq!(got.status.code(), Some(0), "{}", text(&got.stderr));
        let p = the_profile(&d);
        let (calls, _) = under(&p, "MEM_TOTAL", "allocate");
        assert_eq!(
            calls, 300000,
            "the final profile must have every allocation"
        );
    }
}

#[test]
fn a_process_that_drops_root_privileges_keeps_its_profile() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: setuid cannot be tested here (the test needs to start as root)");
        return;
    }
    let d = dir_for("drop_privileges", "drop_privileges.c", &["-mp"]);
    let got = profiled(&d, &["-mp"], "drop_privileges", &[]);
    assert_eq!(got.status.code(), Some(0), "{}", text(&got.stderr));
    assert_eq!(text(&got.stdout), "uid 65534\n");
    let p = the_profile(&d);
    assert_eq!(under(&p, "MEM_TOTAL", "allocate").0, 1000);
}

#[test]
fn a_program_that_would_change_its_user_is_refused_with_the_reason() {
    // A set-user-ID or set-group-ID program of another user, or one with
    // file capabilities, runs in the loader's secure-execution mode, which
    // ignores LD_PRELOAD: unprofiled, with no profile and no word. The
    // launcher refuses it (127, one line saying why and what to do) for a
    // user the exec would change; its owner (root) profiles it as usual,
    // and so does the user with a plain copy.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: set-user-ID files of another user cannot be made here");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = dir_for("secure_exec", "endings.c", &[]);
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let copy = |name: &str, mode: u32| {
        std::fs::copy(d.join("secure_exec"), d.join(name)).unwrap();
        std::fs::set_permissions(d.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    copy("suid", 0o4755);
    copy("sgid", 0o2755);
    copy("plain", 0o755);
    let mut cases = vec![
        ("suid", "is set-user-ID", "the file's owner"),
        ("sgid", "is set-group-ID", "the file's group"),
    ];
    copy("caps", 0o755);
    let setcap = Command::new("setcap")
        .args(["cap_net_raw+ep"])
        .arg(d.join("caps"))
        .status();
    match setcap {
        Ok(st) if st.success() => cases.push(("caps", "is given file capabilities", "as root")),
        _ => eprintln!("setcap (libcap2-bin) unavailable: file capabilities not checked"),
    }
    // As nobody.
    let as_nobody = |prog: &str| {
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(launcher())
            .args(["-pp", "-o"])
            .arg(out.join(format!("{prog}.gz")))
            .arg(format!("./{prog}"))
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", "none")
            .output()
            .expect("setpriv (util-linux)");
        (
            o.status.code(),
            text(&o.stderr),
            out.join(format!("{prog}.gz")).exists(),
        )
    };
    for (prog, why, advice) in cases {
        let (code, err, profile) = as_nobody(prog);
        assert_eq!(code, Some(127), "{prog}: {err}");
        assert!(
            err.starts_with("igprof: ")
                && err.contains(why)
                && err.contains("secure-execution mode")
                && err.contains(advice)
                && err.lines().count() == 1,
            "{prog}: {err}"
        );
        assert!(!profile, "{prog}");
    }
    let (code, err, profile) = as_nobody("plain");
    assert_eq!(code, Some(0), "{err}");
    assert!(profile, "the plain copy is profiled: {err}");
    // Its owner: no change of user, profiled.
    let o = profiled(&d, &["-pp", "-o", "out/root.gz"], "suid", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(out.join("root.gz").exists());
}

#[test]
fn a_program_that_changes_directory_leaves_its_profile_where_it_started() {
    // The default name and a relative -o given to the library directly
    // (the launcher makes -o absolute itself) are taken from the directory
    // the program started in, as the start-up line says, not the one it
    // exits in.
    let d = dir_for("moves_away", "moves_away.c", &[]);
    let away = d.join("away");
    std::fs::create_dir(&away).unwrap();
    let o = profiled(&d, &["-mp"], "moves_away", &["away"]);
    assert_eq!(text(&o.stdout), "moved\n");
    let err = ok(&o);
    let ps = profiles(&d);
    assert_eq!(ps.len(), 1, "{err}");
    assert!(
        err.contains(&format!("profile -> {}", ps[0].display())),
        "{err}"
    );
    assert!(profiles(&away).is_empty());
    let p = parse_strict(&read_text(&ps[0])).unwrap();
    // Its 100 blocks and stdout's buffer.
    assert_eq!(under(&p, "MEM_TOTAL", "main").0, 101);
    let o = Command::new(d.join("moves_away"))
        .arg("away")
        .current_dir(&d)
        .env("LD_PRELOAD", lib())
        .env("IGPROF", "-mp -o rel.gz")
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout), "moved\n", "{}", text(&o.stderr));
    assert!(d.join("rel.gz").exists(), "{}", text(&o.stderr));
    assert!(!away.join("rel.gz").exists());
}

#[test]
fn a_profile_that_cannot_be_written_where_asked_is_not_lost() {
    // The launcher refuses an -o it can tell is unwritable before the run
    // (127, one line); a path that fails only at the end (a library
    // preloaded without the launcher, a directory removed meanwhile) gets
    // the profile in $TMPDIR instead, and says where.
    let d = dir_for("unwritable", "moves_away.c", &[]);
    std::fs::create_dir(d.join("away")).unwrap();
    let o = profiled(
        &d,
        &["-mp", "-o", "no/such/dir/p.gz"],
        "moves_away",
        &["away"],
    );
    assert_eq!(o.status.code(), Some(127));
    let err = text(&o.stderr);
    assert!(
        err.starts_with("igprof: -o ") && err.contains("no directory") && err.lines().count() == 1,
        "{err}"
    );
    assert_eq!(text(&o.stdout), "", "the program did not run");
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let o = Command::new(d.join("unwritable"))
        .arg("away")
        .current_dir(&d)
        .env("LD_PRELOAD", lib())
        .env("IGPROF", "-mp -o /no/such/dir/p.gz")
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout), "moved\n");
    let err = text(&o.stderr);
    let alt = tmp.join("p.gz");
    assert!(
        err.contains("could not write the profile at exit")
            && err.contains("No such file or directory")
            && err.contains(&format!("wrote {} instead", alt.display())),
        "{err}"
    );
    let p = parse_strict(&read_text(&alt)).unwrap();
    // Its 100 blocks and stdout's buffer.
    assert_eq!(under(&p, "MEM_TOTAL", "main").0, 101);
}

#[test]
fn time_inside_the_hooks_is_charged_to_the_program() {
    let mode = ["-d", "-pp", "-mp", "-fd"];
    let d = dir_for("hook_time", "hook_time.c", &mode);
    let stolen_before = steal_ms();
    let got = profiled(&d, &mode, "hook_time", &["3000000"]);
    let stolen = steal_ms() - stolen_before;
    let err = ok(&got);
    let cpu_ms: f64 = err
        .lines()
        .find_map(|l| l.strip_prefix("cpu_ms "))
        .expect("cpu_ms line")
        .parse()
        .unwrap();
    let p = the_profile(&d);
    let ticks = total(&p, "PERF_TICKS") as f64;
    let profiled_ms = ticks * 5.0;
    assert!(
        (profiled_ms - cpu_ms).abs() <= cpu_ms * 0.05 + 10.0 + stolen,
        "PERF_TICKS say {profiled_ms} ms, the process used {cpu_ms} ms ({stolen} ms stolen by the hypervisor meanwhile)"
    );
    // "wrote ... at exit: N samples, M dropped ..."
    let stats = err
        .lines()
        .find(|l| l.contains(" samples, "))
        .expect("-d statistics line");
    let nums: Vec<u64> = stats
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let words: Vec<&str> = stats.split_whitespace().collect();
    let at = |w: &str| {
        let i = words
            .iter()
            .position(|x| x.trim_end_matches(',') == w)
            .unwrap();
        words[i - 1].parse::<u64>().unwrap()
    };
    let (samples, dropped) = (at("samples"), at("dropped"));
    assert!(!nums.is_empty());
    assert!(
        dropped * 100 <= samples,
        "{dropped} of {samples} samples dropped: {stats}"
    );
    let (in_churn, _) = under(&p, "PERF_TICKS", "churn");
    assert!(
        in_churn > 0,
        "no time charged to churn, which calls the hooks"
    );
}

#[test]
fn one_start_up_line_for_a_run_of_many_processes() {
    let d = scratch("startline");
    let script = "/bin/true; /bin/true; ls / >/dev/null; echo hi";
    let o = igprof(&d, &["-pp", "sh", "-c", script]);
    let err = ok(&o);
    assert_eq!(text(&o.stdout), "hi\n");
    let lines = err
        .lines()
        .filter(|l| l.starts_with("igprof: profiling"))
        .count();
    assert_eq!(lines, 1, "{err}");
    // -np says why it cannot profile (no energy source on a VM), or that it
    // profiles: in either case once for the run, not once per process.
    let o = igprof(&d, &["-np", "sh", "-c", script]);
    let err = ok(&o);
    assert_eq!(text(&o.stdout), "hi\n");
    let lines = err.lines().filter(|l| l.starts_with("igprof: ")).count();
    assert!(lines <= 2, "start-up lines of every process: {err}");
}

#[test]
fn python_multiprocessing_pool_terminate_leaves_every_profile() {
    let script = "from multiprocessing import Pool\n\
                  def f(x):\n    return sum(i * i for i in range(x))\n\
                  if __name__ == '__main__':\n    \
                  with Pool(2) as p:\n        print(sum(p.map(f, [20000] * 200)))\n";
    let want = Command::new("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(want.status.success());
    for _ in 0..3 {
        let d = scratch("pool");
        let o = igprof(&d, &["-pp", "python3", "-c", script]);
        ok(&o);
        assert_eq!(text(&o.stdout), text(&want.stdout));
        assert!(leftovers(&d).is_empty(), "{:?}", leftovers(&d));
        let ps = profiles(&d);
        assert!(ps.len() >= 3, "parent and two workers: {ps:?}");
        for p in &ps {
            parse_strict(&read_text(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
}

#[test]
fn a_program_that_refuses_perf_events_to_itself_is_still_sampled() {
    for mode in [&["-pp", "-i", "1ms"][..], &["-pr", "-i", "1ms"][..]] {
        let d = dir_for("sandboxed", "sandboxed.c", mode);
        let got = profiled(&d, mode, "sandboxed", &[]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), "perf_event_open now refused\n");
        let p = the_profile(&d);
        // Each thread burns 200 ms of CPU after the filter is in place
        // (the fallback timers tick at the scheduler's 4 ms); -pr counts
        // the wall-clock time that took. On a loaded machine the kernel may
        // fire a CPU-clock timer only a few times in 200 ms: a thread's time
        // after its last sample is charged to that sample's stack, so the
        // total stays exact. A thread no signal reached at all is not in the
        // profile, and the profiler must say so.
        let err = text(&got.stderr);
        // The fallback is said, once.
        assert_eq!(
            err.matches("perf_event_open(task-clock): refused").count(),
            1,
            "{mode:?}: {err}"
        );
        let unsampled = err
            .lines()
            .find_map(|l| {
                l.strip_prefix("igprof: ")?
                    .split_once(" thread(s) ran ")
                    .filter(|(_, rest)| rest.contains("no sample reached them"))?
                    .0
                    .parse::<usize>()
                    .ok()
            })
            .unwrap_or(0);
        let mut missing = 0;
        for f in ["first", "second"] {
            let (ticks, _) = under(&p, "PERF_TICKS", f);
            let ms = if mode[0] == "-pr" {
                reported(&got.stderr, f)
            } else {
                200.0
            };
            if ticks == 0 && mode[0] == "-pp" && missing < unsampled {
                missing += 1;
                continue;
            }
            assert!(
                (ms * 0.7..=ms * 1.3).contains(&(ticks as f64)),
                "{mode:?}: {f} has {ticks} ticks of 1 ms for {ms} ms"
            );
        }
    }
}

#[test]
fn wall_clock_profiling_never_interrupts_blocking_calls() {
    for mode in [&["-pr", "-i", "1ms"][..], &["-pp", "-i", "1ms"][..]] {
        let d = dir_for("blocking", "blocking.c", mode);
        let got = profiled(&d, mode, "blocking", &[]);
        ran(&got, mode);
        assert_eq!(
            text(&got.stdout),
            "eintr 0\n",
            "{mode:?}: calls interrupted"
        );
        if mode[0] != "-pr" {
            continue;
        }
        // Each thread waits about 200 ms (ten 20 ms waits, or one of
        // 200 ms): its wall-clock time is charged where it waited.
        let p = the_profile(&d);
        for f in ["in_poll", "in_select", "in_nanosleep", "in_read", "in_cond"] {
            let (ticks, _) = under(&p, "PERF_TICKS", f);
            let ms = reported(&got.stderr, f);
            assert!(
                (ms * 0.8..=ms * 1.2 + 10.0).contains(&(ticks as f64)),
                "{f}: {ticks} ticks of 1 ms for {ms} ms of waiting; the profile's \
                 stacks of 3 ticks or more:\n{}\nthe run's stderr:\n{}",
                tick_paths(&p, 3),
                text(&got.stderr)
            );
        }
    }
}

#[test]
fn a_wait_ended_by_the_programs_own_sigtrap_is_charged_under_pr() {
    // The program's SIGTRAP is pending when the waiter runs again, so the
    // kernel drops the SIGTRAP of the waiter's context-switch event: the
    // 200 ms in pause() must be charged all the same (they were lost).
    let mode = ["-pr", "-i", "1ms"];
    let d = dir_for("trap_wakes", "trap_wakes.c", &mode);
    let got = profiled(&d, &mode, "trap_wakes", &[]);
    assert_eq!(got.status.code(), Some(0), "{}", text(&got.stderr));
    assert_eq!(text(&got.stdout), "traps 1\n", "the program's handler");
    let p = the_profile(&d);
    let ms = reported(&got.stderr, "waiter");
    let (ticks, _) = under(&p, "PERF_TICKS", "waiter");
    let in_pause = ["pause", "__libc_pause"]
        .map(|f| under(&p, "PERF_TICKS", f).0)
        .into_iter()
        .max()
        .unwrap();
    let why = || {
        format!(
            "the profile's stacks of 3 ticks or more:\n{}\nthe run's stderr:\n{}",
            tick_paths(&p, 3),
            text(&got.stderr)
        )
    };
    assert!(
        (ms * 0.8..=ms * 1.2 + 10.0).contains(&(ticks as f64)),
        "waiter: {ticks} ticks of 1 ms for {ms} ms; {}",
        why()
    );
    // 20 ms of the wait are in nanosleep, the rest in pause().
    assert!(
        in_pause as f64 >= (ms - 20.0) * 0.8,
        "pause: {in_pause} ticks of the waiter's {ms} ms; {}",
        why()
    );
}

#[test]
fn periodic_dumps_leave_a_profile_when_the_program_is_killed_by_sigkill() {
    use std::os::unix::process::ExitStatusExt;
    let mode = ["-pp", "--dump-every", "100ms"];
    let d = dir_for("die_by_signal", "die_by_signal.c", &mode);
    let mut child = Command::new(launcher())
        .args(mode)
        .args(["-o", "killed.gz", "./die_by_signal", "default"])
        .env("IGPROF_LIB", lib())
        .current_dir(&d)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    assert_eq!(l, "ready\n");
    // A snapshot written after "ready": until_killed has run by then.
    let _ = std::fs::remove_file(d.join("killed.gz"));
    let start = Instant::now();
    while !d.join("killed.gz").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no periodic dump"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(libc::SIGKILL));
    let p = parse_strict(&read_text(&d.join("killed.gz"))).unwrap();
    assert!(under(&p, "PERF_TICKS", "until_killed").0 > 0);
}

#[test]
fn small_thread_stacks_and_alternate_signal_stacks_are_enough() {
    for &mode in MODES.iter().chain([&["-pp", "-i", "100us"][..]].iter()) {
        let d = dir_for("small_stacks", "small_stacks.c", mode);
        let want = plain(&d, "small_stacks", &[]);
        let got = profiled(&d, mode, "small_stacks", &[]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), text(&want.stdout), "{mode:?}");
        let p = the_profile(&d);
        if uses(mode, "-mp") {
            // Two small-stack threads, the deep thread and the handler.
            assert_eq!(under(&p, "MEM_TOTAL", "allocate_1000").0, 4000, "{mode:?}");
        }
        if uses(mode, "-pp") {
            for f in ["on_small_stack", "deep", "on_altstack"] {
                assert!(
                    under(&p, "PERF_TICKS", f).0 > 0,
                    "{mode:?}: no samples in {f}"
                );
            }
        }
    }
}

#[test]
fn threads_made_by_raw_clone_are_profiled_as_threads() {
    for &mode in MODES {
        let d = dir_for("raw_clone", "raw_clone.c", mode);
        let got = profiled(&d, mode, "raw_clone", &[]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), "2 clone threads done\n", "{mode:?}");
        let p = the_profile(&d);
        if uses(mode, "-mp") {
            // Main allocates while the clones do: each counts its own.
            assert_eq!(under(&p, "MEM_TOTAL", "allocate_1000").0, 2000, "{mode:?}");
            assert_eq!(
                under(&p, "MEM_TOTAL", "main_allocates_1000").0,
                1000,
                "{mode:?}"
            );
            assert_eq!(under(&p, "MEM_TOTAL", "cloned").0, 2000, "{mode:?}");
        }
        if uses(mode, "-pp") {
            // Two threads burn 100 ms of their own CPU time each: 200 ticks of 1 ms.
            let (ticks, _) = under(&p, "PERF_TICKS", "burn_thread_ms");
            assert!(
                (140..=260).contains(&ticks),
                "{mode:?}: {ticks} ticks of 1 ms in the clone threads, ~200 expected"
            );
        }
    }
}

#[test]
fn a_thread_after_asynchronous_cancellations_is_sampled() {
    let modes: [(&[&str], f64); 3] = [
        (&["-pp", "-i", "100us"], 0.1),
        (&["-pp", "-i", "100us", "-fd"], 0.1),
        (&["-pp", "-i", "1ms", "-mp", "-fd"], 1.0),
    ];
    for (mode, tick_ms) in modes {
        let d = dir_for("async_cancel", "async_cancel.c", mode);
        let got = profiled(&d, mode, "async_cancel", &[]);
        assert_eq!(
            got.status.code(),
            Some(0),
            "{mode:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), "40 cancelled\n", "{mode:?}");
        let p = the_profile(&d);
        // The last thread burns 200 ms of its own CPU time.
        let ms = under(&p, "PERF_TICKS", "burn_thread_ms").0 as f64 * tick_ms;
        assert!(
            (140.0..=260.0).contains(&ms),
            "{mode:?}: {ms} ms sampled in the thread after the cancellations, 200 expected"
        );
    }
}

#[test]
fn more_ways_to_end_or_multiply_keep_the_program_and_its_profiles() {
    // (ending, profiles written, calls of work() across them: 100 allocations each)
    let endings = [
        ("thread-exit", 1, 200),
        ("cancel", 1, 100),
        ("spawn", 3, 100),
        ("fork-mt", 2, 200),
        ("segv", 1, 200),
        ("exec-chain", 4, 300),
    ];
    for &mode in MODES {
        let d = dir_for("more_endings", "more_endings.c", mode);
        for (how, n, calls) in endings {
            let want = plain(&d, "more_endings", &[how]);
            for p in profiles(&d) {
                std::fs::remove_file(p).unwrap();
            }
            let got = profiled(&d, mode, "more_endings", &[how]);
            assert_eq!(
                got.status.code(),
                want.status.code(),
                "{mode:?} {how}: {}",
                text(&got.stderr)
            );
            assert_eq!(text(&got.stdout), text(&want.stdout), "{mode:?} {how}");
            let ps = profiles(&d);
            assert_eq!(ps.len(), n, "{mode:?} {how}: {ps:?}");
            assert!(
                leftovers(&d).is_empty(),
                "{mode:?} {how}: {:?}",
                leftovers(&d)
            );
            let mut seen = 0;
            for p in &ps {
                let prof = parse_strict(&read_text(p))
                    .unwrap_or_else(|e| panic!("{mode:?} {how}: {}: {e}", p.display()));
                seen += under(&prof, "MEM_TOTAL", "work").0;
            }
            if uses(mode, "-mp") {
                assert_eq!(seen, calls, "{mode:?} {how}: allocations of work()");
            }
        }
    }
}

#[test]
fn a_relative_output_path_holds_in_processes_that_change_directory() {
    let d = scratch("relative_output");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::create_dir_all(d.join("prof")).unwrap();
    std::fs::write(d.join("sub/Makefile"), "all:\n\t@sh -c true\n").unwrap();
    let mut c = Command::new(launcher());
    c.args(["-pp", "-o", "prof/x.gz", "make", "-s", "-C", "sub"])
        .current_dir(&d)
        .env("IGPROF_LIB", lib());
    let o = finish(c, 60, "make -C under -pp");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !text(&o.stderr).contains("cannot create"),
        "{}",
        text(&o.stderr)
    );
    // make and the shell it starts in sub/ both write into prof/.
    let n = std::fs::read_dir(d.join("prof")).unwrap().count();
    assert!(n >= 2, "{n} profiles in prof/");
    assert!(!d.join("sub/prof").exists());
}

#[test]
fn a_profile_sent_to_a_pipe_or_device_leaves_it_in_place() {
    // `-o` naming something other than a file (/dev/null, a FIFO) is
    // written in place: a temporary renamed over it replaced /dev/null
    // itself with a plain file when run as root.
    use std::os::unix::fs::FileTypeExt;
    let d = scratch("output_fifo");
    build(&d, "alloc_churn.c", "alloc_churn", &[]);
    let fifo = d.join("pipe");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let o = igprof(
        &d,
        &["-mp", "-z", "-o", "pipe", "./alloc_churn", "1000", "3"],
    );
    ok(&o);
    assert!(
        std::fs::metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO was replaced"
    );
    assert!(!d.join("pipe.tmp").exists());
    // A reader still waiting for a writer (no profile came) is let go: a
    // writer of ours opens and closes (once it has read all, this fails).
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
    }
    let bytes = reader.join().unwrap();
    std::fs::write(d.join("got.gz"), &bytes).unwrap();
    let p = parse_strict(&read_text(&d.join("got.gz"))).unwrap();
    // alloc_churn's site_leak: 1000 blocks of 1000 bytes never freed.
    assert_eq!(under(&p, "MEM_LIVE", "site_leak"), (1000, 1_000_000));
    // A character device: a null device of the test's own where the
    // system lets it make one (root), not /dev/null, which a regression
    // would replace.
    let null = d.join("null");
    let _ = std::fs::remove_file(&null);
    let c = std::ffi::CString::new(null.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; makedev(1, 3) is the null device.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
        // A shell and its two children: every process writes to the device
        // (no `null.<pid>` beside it).
        let o = igprof(
            &d,
            &[
                "-mp",
                "-o",
                "null",
                "sh",
                "-c",
                "./alloc_churn 1000 3; ./alloc_churn 1000 3",
            ],
        );
        ok(&o);
        assert!(std::fs::metadata(&null)
            .unwrap()
            .file_type()
            .is_char_device());
        let beside: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("null."))
            .collect();
        assert!(beside.is_empty(), "{beside:?}");
    }
}

/// Runs `solo` (unprofiled with `mode` None) with `n` allocations; sends
/// it signal `sig` every 25 ms while it allocates (0: none). Returns its
/// output and how many signals were sent.
fn solo_run(d: &Path, mode: Option<&[&str]>, n: &str, sig: i32) -> (Output, usize) {
    use std::io::Write;
    let mut started = until_ready(d, mode, "solo", n, true);
    let child = &mut started.child;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut hang = Hang::new(child.id(), Duration::from_secs(60));
    let mut sent = 0;
    while child.try_wait().unwrap().is_none() {
        assert!(!hang.hung(), "solo hung");
        std::thread::sleep(Duration::from_millis(25));
        if sig != 0 {
            // SAFETY: kill(2) on our own child (it has not been reaped).
            if unsafe { libc::kill(child.id() as i32, sig) } == 0 {
                sent += 1;
            }
        }
    }
    (rest_of(started), sent)
}

#[test]
fn a_single_threaded_program_gets_no_thread_and_its_dump_requests_are_served() {
    let want = {
        let d = dir_for("solo", "solo.c", &["plain"]);
        solo_run(&d, None, "1000", 0).0
    };
    assert_eq!(text(&want.stdout), "tasks 1\nready\ntasks 1\ndone\n");
    // No thread of the profiler's: glibc stays single-threaded, as unprofiled.
    for mode in MODES {
        let d = dir_for("solo", "solo.c", mode);
        let (got, _) = solo_run(&d, Some(mode), "1000", 0);
        assert_eq!(text(&got.stdout), text(&want.stdout), "{mode:?}: {got:?}");
        the_profile(&d);
    }
    // The dump signal (42) is served on the program's thread, also when it
    // arrives inside a hook (then as the hook ends); the counts stay exact.
    for mode in [
        &["-mp", "-d"][..],
        &["-pp", "-i", "1ms", "-mp", "-fd", "-d"][..],
    ] {
        let d = dir_for("solo", "solo.c", mode);
        let n = 12_000_000u64;
        let (got, sent) = solo_run(&d, Some(mode), &n.to_string(), 42);
        let err = text(&got.stderr);
        assert!(got.status.success(), "{mode:?}: {err}");
        assert_eq!(text(&got.stdout), text(&want.stdout), "{mode:?}");
        let written = err.matches("dump written to").count();
        assert!(
            sent >= 3 && written * 2 >= sent,
            "{mode:?}: {sent} dump signals sent, {written} dumps written: {err}"
        );
        assert!(!err.contains("requested dump failed"), "{mode:?}: {err}");
        let p = the_profile(&d);
        assert_eq!(under(&p, "MEM_TOTAL", "churn").0, n, "{mode:?}");
        assert_eq!(under(&p, "MEM_LIVE", "churn"), (0, 0), "{mode:?}");
        assert!(leftovers(&d).is_empty(), "{mode:?}");
    }
}

/// The library needs only glibc (libc, and libpthread and libdl, where
/// glibc 2.28, which it is linked for, has the thread and dl functions)
/// and the loader: Rust's standard
/// library names the C unwinder (`libgcc_s.so.1`), which every profiled C
/// program would otherwise load for nothing, so the library keeps hidden
/// stand-ins of its own (`base/nounwind.rs`). None of them may be
/// exported: a C++ program preloaded with the library would throw through
/// them. Checked on the host library and the foreign-architecture one.
#[test]
fn the_library_needs_only_libc_and_exports_no_unwinder() {
    for lib in [lib(), foreign_lib()] {
        let readelf = |args: &[&str]| {
            let out = Command::new("readelf")
                .args(args)
                .arg(&lib)
                .output()
                .expect("readelf (binutils) runs");
            assert!(out.status.success(), "readelf {args:?} {}", lib.display());
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let needed: Vec<String> = readelf(&["-dW"])
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| Some(l.split_once('[')?.1.trim_end_matches(']').to_string()))
            .collect();
        assert!(
            needed
                .iter()
                .all(|n| ["libc.so", "libpthread.so", "libdl.so", "ld-linux"]
                    .iter()
                    .any(|p| n.starts_with(p))),
            "{} needs {needed:?}",
            lib.display()
        );
        let exported: Vec<String> = readelf(&["--dyn-syms", "-W"])
            .lines()
            .filter(|l| l.contains("_Unwind_"))
            .map(str::to_string)
            .collect();
        assert!(
            exported.is_empty(),
            "{} names unwinder symbols: {exported:?}",
            lib.display()
        );
    }
}

/// A child forked with every signal blocked, as a program about to exec
/// forks, that resets every handler by raw system calls and then unblocks
/// (by a raw call, or by sigprocmask as chromium's children do) lives on
/// under samplers that fire at every page fault or every millisecond: it
/// is not sampled before it execs. A child that unblocks with sigprocmask,
/// its handlers left alone, is sampled from there: its 300 ms of work are
/// in its profile (under burn_ms: child_burn calls it as a tail call).
#[test]
fn a_child_forked_with_signals_blocked_is_sampled_once_it_unblocks_them() {
    let modes: [&[&str]; 3] = [&["-pf"], &["-pp", "-i", "1ms"], &["-e", "page-faults"]];
    for how in ["raw", "reset"] {
        for mode in modes {
            let d = dir_for("fork_blocked", "fork_blocked.c", mode);
            let want = plain(&d, "fork_blocked", &[how]);
            assert_eq!(text(&want.stdout), "child exit 0\n", "{how} unprofiled");
            let got = profiled(&d, mode, "fork_blocked", &[how]);
            ran(&got, mode);
            assert_eq!(got.stdout, want.stdout, "{how} under {mode:?}");
        }
    }
    let mode: &[&str] = &["-pp", "-i", "1ms"];
    let d = dir_for("fork_blocked", "fork_blocked.c", &["-pp", "libc"]);
    let got = profiled(&d, mode, "fork_blocked", &["libc"]);
    ran(&got, mode);
    assert_eq!(text(&got.stdout), "child exit 0\n");
    let ps = profiles(&d);
    assert_eq!(ps.len(), 2, "the parent's and the child's: {ps:?}");
    let ticks: u64 = ps
        .iter()
        .map(|p| {
            let prof = parse_strict(&read_text(p)).unwrap();
            under(&prof, "PERF_TICKS", "burn_ms").0
        })
        .sum();
    assert!(
        (200..=400).contains(&ticks),
        "{ticks} ticks of 1 ms under burn_ms, which the child runs for 300 ms"
    );
}

/// A program that makes its parent its tracer (an anti-debugging check:
/// ptrace(PTRACE_TRACEME) with no debugger there) is stopped for good by
/// any signal sent to it afterwards: sampling ends at that call, said in
/// one line, and the program runs to its end as unprofiled (before, the
/// first sample stopped it and its parent waited for ever).
#[test]
fn a_program_that_calls_ptrace_traceme_runs_to_its_end() {
    use std::os::unix::process::ExitStatusExt;
    let d = scratch("traceme");
    build(&d, "traceme.c", "traceme", &[]);
    for mode in [
        &["-pp", "-i", "1ms"][..],
        &["-pp", "-e", "task-clock/100000"],
    ] {
        let mut args = mode.to_vec();
        args.extend(["./traceme", "300"]);
        // To files, not pipes: a stopped program would hold a pipe open.
        let (out, err) = (d.join("out"), d.join("err"));
        let mut child = igprof_command(&d, &args)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let status = loop {
            // The test is the program's parent, so its tracer: a stop is
            // reported here.
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{mode:?}: still running"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.stopped_signal().is_some() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let err = std::fs::read_to_string(&err).unwrap();
        assert_eq!(status.code(), Some(0), "{mode:?}: {status:?}; {err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "traceme 0\n");
        assert!(
            err.contains("ptrace(PTRACE_TRACEME): sampling ends here"),
            "{mode:?}: {err}"
        );
    }
}
