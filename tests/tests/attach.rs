//! `igprof --attach PID` / `--detach PID` / `--dump PID` on running
//! processes nobody restarted: tests/programs/attach_server.c (a server
//! whose allocation sites' truth is exact per request) and the refusals.
//! What is checked beside the profile is what the process must not see:
//! its answers byte for byte against an unprofiled server's, and after the
//! detach its code (every executable file mapping equal to the file), its
//! descriptors, threads, signal dispositions and masks as before.

use igprof_tests::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// attach_server built in a fresh directory (no sibling calls, so that
/// reply_buffer stays a frame of its own; no builtins, so that GCC keeps
/// the allocations).
fn built(name: &str) -> PathBuf {
    let d = scratch(name);
    build(
        &d,
        "attach_server.c",
        "attach_server",
        &["-fno-builtin", "-fno-optimize-sibling-calls"],
    );
    d
}

/// A running attach_server and its port.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(dir: &Path, prefix: &[&str]) -> Server {
        let exe = dir.join("attach_server");
        let mut cmd = match prefix {
            [] => Command::new(&exe),
            [p, rest @ ..] => {
                let mut c = Command::new(p);
                c.args(rest).arg(&exe);
                c
            }
        };
        let mut child = cmd
            .current_dir(dir)
            .env("IGPROF_CACHE_DIR", test_store())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("port ")
            .unwrap_or_else(|| panic!("no port: {line:?}"))
            .parse()
            .unwrap();
        Server { child, port }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn connect(&self) -> Client {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        Client {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    /// Sends requests `from..to` (pipelined a hundred at a time); the answers.
    fn requests(&mut self, from: u64, to: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut n = from;
        while n < to {
            let end = (n + 100).min(to);
            let batch: String = (n..end).map(|i| format!("{i}\n")).collect();
            self.w.write_all(batch.as_bytes()).unwrap();
            for _ in n..end {
                let mut l = String::new();
                self.r.read_line(&mut l).unwrap();
                out.extend_from_slice(l.as_bytes());
            }
            n = end;
        }
        out
    }

    fn say(&mut self, what: &str) -> String {
        self.w.write_all(format!("{what}\n").as_bytes()).unwrap();
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        l
    }
}

fn launcher_in(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(launcher())
        .args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib())
        .output()
        .unwrap()
}

/// What a process must find unchanged after a detach.
#[derive(Debug, PartialEq)]
struct Seen {
    fds: BTreeMap<String, String>,
    threads: usize,
    /// SigCgt and SigIgn of the process, SigBlk of each thread.
    signals: Vec<String>,
}

/// What [`seen`] finds once `settled` holds of it, or after 2 s what it
/// finds then.
fn seen_once(pid: i32, settled: impl Fn(&Seen) -> bool) -> Seen {
    for _ in 0..200 {
        let s = seen(pid);
        if settled(&s) {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    seen(pid)
}

/// glibc's internal all-signals mask as the kernel shows it in SigBlk
/// (see [`seen_as`]).
const GLIBC_ALL_BLOCKED: &str = "fffffffffffbfeff";

/// What [`seen`] finds once no thread is in a moment of glibc's
/// all-signals mask (see [`seen_as`]): the state to compare with after a
/// detach. Taken once, it caught a connection's thread in that moment,
/// and the detach, which left the thread as it was, failed the
/// comparison (3 of 8 runs of this suite here).
fn seen_before(pid: i32) -> Seen {
    seen_once(pid, |s| {
        !s.signals.iter().any(|m| m.ends_with(GLIBC_ALL_BLOCKED))
    })
}

/// What [`seen`] finds once the process has `threads` threads again (a
/// connection's thread ends a moment after its client closes).
fn seen_with(pid: i32, threads: usize) -> Seen {
    seen_once(pid, |s| s.threads == threads)
}

/// What [`seen`] finds once the process is as `want` again, or after 2 s
/// what it has then. Besides a connection's thread that ends a moment
/// after its client closes, a thread's SigBlk is glibc's internal
/// all-signals mask (the kernel shows fffffffffffbfeff: even SIGSEGV and
/// glibc's own signals 32 and 33) for a moment inside pthread_create,
/// pthread_kill or a thread's exit: a fresh clone's CI under load saw it
/// once, right after a detach. A mask the detach left behind stays, and
/// still fails the comparison.
fn seen_as(pid: i32, want: &Seen) -> Seen {
    seen_once(pid, |s| s == want)
}

/// Asserts that process `pid` is as `before` again (see [`seen_as`]);
/// if not, the message says what each of its tasks is doing: name, state,
/// mask, the system call it is in and its kernel stack (a fresh clone's
/// CI under load found a thread with every signal blocked after a detach,
/// and runs here could not make it again).
fn assert_as_before(pid: i32, before: &Seen) {
    let after = seen_as(pid, before);
    if after == *before {
        return;
    }
    let mut tasks = String::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let t = t.path();
        let read = |f: &str| std::fs::read_to_string(t.join(f)).unwrap_or_default();
        let status = read("status");
        let fields: Vec<&str> = status
            .lines()
            .filter(|l| {
                ["Name", "State", "Pid", "SigBlk"]
                    .iter()
                    .any(|f| l.starts_with(f))
            })
            .collect();
        tasks += &format!(
            "\n{fields:?} syscall {:?}\n{}",
            read("syscall").trim(),
            read("stack")
        );
    }
    panic!("after: {after:?}\nbefore: {before:?}\ntasks now:{tasks}");
}

/// What the process has now. Sockets are left out of its descriptors: a
/// server under load opens and closes them all the time.
fn seen(pid: i32) -> Seen {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?.display().to_string();
            (!target.starts_with("socket:"))
                .then(|| (e.file_name().to_string_lossy().into_owned(), target))
        })
        .collect();
    let tasks: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let field = |file: &Path, name: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    let status = PathBuf::from(format!("/proc/{pid}/status"));
    let mut signals = vec![field(&status, "SigCgt"), field(&status, "SigIgn")];
    let mut blocked: Vec<String> = tasks
        .iter()
        .map(|t| field(&t.join("status"), "SigBlk"))
        .filter(|b| !b.is_empty())
        .collect();
    blocked.sort();
    signals.extend(blocked);
    Seen {
        fds,
        threads: tasks.len(),
        signals,
    }
}

/// The process's file mappings: (range, permissions, file); those the
/// library brought (itself, and the libraries it needs) come after.
fn file_maps(pid: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(" /") && !l.contains("libigprof.so"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!("{} {} {}", f[0], f[1], f[5..].join(" "))
        })
        .collect()
}

/// Every executable mapping of a file in process `pid` holds the file's
/// own bytes (no patch left); the mappings compared.
fn code_as_in_files(pid: i32) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut compared = 0;
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let (start, end) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let off = u64::from_str_radix(f[2], 16).unwrap();
        let Ok(file) = std::fs::read(f[5]) else {
            continue;
        };
        let len = ((end - start) as usize).min(file.len().saturating_sub(off as usize));
        let mut live = vec![0u8; len];
        mem.seek(SeekFrom::Start(start)).unwrap();
        mem.read_exact(&mut live).unwrap();
        let want = &file[off as usize..off as usize + len];
        if let Some(i) = (0..len).find(|&i| live[i] != want[i]) {
            panic!(
                "{} differs from its file at {:#x} after the detach",
                f[5],
                start + i as u64
            );
        }
        compared += 1;
    }
    compared
}

/// (calls, bytes) under `func` for `counter` in `profile`.
fn site(profile: &Path, counter: &str, func: &str) -> (u64, u64) {
    let p = parse_strict(&read_text(profile)).unwrap();
    under(&p, counter, func)
}

#[test]
fn attach_counts_exactly_and_detach_leaves_the_server_as_it_was() {
    let d = built("attach-server");
    // The answers an unprofiled server gives to the same requests.
    let plain = Server::start(&d, &[]);
    let mut pc = plain.connect();
    let mut want = pc.requests(0, 100);
    let mut pc2 = plain.connect();
    want.extend(pc.requests(100, 5100));
    want.extend(pc2.requests(5100, 10100));
    want.extend(pc.requests(10100, 10200));
    drop(plain);

    let s = Server::start(&d, &[]);
    let mut a = s.connect();
    let mut got = a.requests(0, 100);
    // Let the connection's thread reach its read.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let before = seen_before(s.pid());
    let maps_before = file_maps(s.pid());
    let pid = s.pid().to_string();
    let o = launcher_in(&d, &["--attach", &pid, "-mp", "-fd", "-o", "first.gz"]);
    let err = ok(&o);
    assert!(err.contains("attached to process"), "{err}");
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("TracerPid"))
            .unwrap()
            .split_whitespace()
            .nth(1),
        Some("0"),
        "the process is not left traced"
    );
    // 5,000 requests on the thread that existed before the attach, 5,000
    // on one made after it.
    got.extend(a.requests(100, 5100));
    // The main thread was inside accept() at the attach: that call (b's)
    // is not seen, the next one (c's) is.
    let mut b = s.connect();
    got.extend(b.requests(5100, 10000));
    let mut c = s.connect();
    got.extend(c.requests(10000, 10100));
    assert_eq!(a.say("free-old"), "freed\n");
    // A snapshot while attached.
    let o = launcher_in(&d, &["--dump", &pid, "snap.gz"]);
    ok(&o);
    assert_eq!(
        site(&d.join("snap.gz"), "MEM_TOTAL", "keep_record").0,
        10_000
    );
    let o = launcher_in(&d, &["--detach", &pid]);
    let err = ok(&o);
    assert!(err.contains("detached from process"), "{err}");
    drop(b);
    drop(c);
    got.extend(a.requests(10100, 10200));
    assert!(
        got == want,
        "the answers differ from an unprofiled server's"
    );

    let first = d.join("first.gz");
    assert_eq!(
        site(&first, "MEM_TOTAL", "keep_record"),
        (10_000, 480_000),
        "one 48-byte record per request made while attached"
    );
    assert_eq!(site(&first, "MEM_LIVE", "keep_record"), (10_000, 480_000));
    assert_eq!(site(&first, "MEM_TOTAL", "reply_buffer"), (10_000, 640_000));
    assert_eq!(site(&first, "MEM_LIVE", "reply_buffer"), (0, 0));
    // -fd: c's connection, accepted while attached, still open then.
    assert_eq!(site(&first, "FD_USED", "main").0, 1);
    assert_eq!(site(&first, "FD_LIVE", "main").0, 1);
    let text = read_text(&first);
    let header = text.lines().next().unwrap();
    let freed: u64 = header
        .split("attached while running: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no attach note: {header}"));
    assert!(
        freed >= 1000,
        "the 1,000 old blocks' frees are counted apart: {header}"
    );
    let p = parse_strict(&text).unwrap();
    assert_eq!(site(&first, "MEM_TOTAL", "old_blocks"), (0, 0));
    assert!(p
        .nodes
        .iter()
        .flat_map(|n| &n.values)
        .all(|v| v.counter != "MEM_LIVE" || v.value < 1 << 40));

    // The process as it was: code and its protections, descriptors,
    // threads, signals.
    assert!(code_as_in_files(s.pid()) >= 3);
    let maps_after = file_maps(s.pid());
    for m in &maps_before {
        assert!(maps_after.contains(m), "{m} changed: {maps_after:#?}");
    }
    assert_as_before(s.pid(), &before);

    // The library loaded profiles what the first attach asked for.
    let o = launcher_in(&d, &["--attach", &pid, "-pp", "-mp", "-o", "cpu.gz"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("the same modules"),
        "-pp after -mp: {err}"
    );
    assert!(code_as_in_files(s.pid()) >= 3);
    // A second attach reuses the library and starts a fresh profile.
    let o = launcher_in(
        &d,
        &[
            "--attach",
            &pid,
            "-mp",
            "-fd",
            "-o",
            "second.gz",
            "--for",
            "1s",
        ],
    );
    let err = ok(&o);
    assert!(err.contains("detached from process"), "{err}");
    let o = launcher_in(&d, &["--attach", &pid, "-mp", "-fd", "-o", "third.gz"]);
    ok(&o);
    a.requests(0, 1000);
    let o = launcher_in(&d, &["--detach", &pid]);
    ok(&o);
    assert_eq!(
        site(&d.join("third.gz"), "MEM_TOTAL", "keep_record"),
        (1000, 48_000)
    );
    assert!(code_as_in_files(s.pid()) >= 3);
    assert_as_before(s.pid(), &before);
    assert_eq!(a.say("quit"), "bye\n");
}

#[test]
fn attach_refuses_in_one_line() {
    let d = built("attach-refusals");
    let one_line = |o: &std::process::Output, what: &str| {
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(err.starts_with("igprof: --"), "{what}: {err}");
        err
    };
    // No such process; not a number.
    one_line(
        &launcher_in(&d, &["--attach", "999999999", "-mp"]),
        "no process",
    );
    one_line(&launcher_in(&d, &["--attach", "x", "-mp"]), "not a pid");
    one_line(&launcher_in(&d, &["--detach", "1", "2"]), "usage");
    let s = Server::start(&d, &[]);
    let pid = s.pid().to_string();
    // Options the attached library cannot honour.
    let e = one_line(
        &launcher_in(&d, &["--attach", &pid, "-mp", "--dump-every", "1s"]),
        "watcher",
    );
    assert!(e.contains("--dump-every"), "{e}");
    // Detach or dump of a process never attached to.
    let e = one_line(&launcher_in(&d, &["--detach", &pid]), "never attached");
    assert!(e.contains("never attached"), "{e}");
    // Another user's process (as nobody, against ours).
    let o = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(launcher())
        .args(["--attach", &pid, "-mp", "-o", "/tmp/x.gz"])
        .env("IGPROF_LIB", lib())
        .current_dir("/tmp")
        .output()
        .unwrap();
    let e = one_line(&o, "another user");
    assert!(e.contains("another user"), "{e}");
    // A process being traced (strace holds it).
    let mut strace = Command::new("strace")
        .args(["-o", "/dev/null", "-p", &pid])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let traced = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .any(|l| l.starts_with("TracerPid:") && !l.ends_with("\t0"))
    });
    assert!(traced, "strace did not attach");
    let e = one_line(&launcher_in(&d, &["--attach", &pid, "-mp"]), "traced");
    assert!(e.contains("already traced"), "{e}");
    let _ = strace.kill();
    let _ = strace.wait();
    // A statically linked program.
    let st = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(d.join("static_sleep"))
        .arg("-x")
        .arg("c")
        .arg("-")
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .unwrap()
                .write_all(b"#include <unistd.h>\nint main(void){sleep(60);return 0;}\n")?;
            c.wait()
        })
        .unwrap();
    assert!(st.success());
    let mut stat = Command::new(d.join("static_sleep")).spawn().unwrap();
    let e = one_line(
        &launcher_in(&d, &["--attach", &stat.id().to_string(), "-mp"]),
        "static",
    );
    assert!(e.contains("statically linked"), "{e}");
    let _ = stat.kill();
    let _ = stat.wait();
    // An already profiled process.
    let prof = Server::start(&d, &[launcher().to_str().unwrap(), "-mp", "-o", "pre.gz"]);
    let e = one_line(
        &launcher_in(&d, &["--attach", &prof.pid().to_string(), "-mp"]),
        "already profiled",
    );
    assert!(e.contains("already profiled"), "{e}");
}

#[test]
fn pp_samples_a_thread_that_ran_before_the_attach() {
    let d = built("attach-pp");
    let s = Server::start(&d, &[]);
    let mut a = s.connect();
    a.requests(0, 10);
    let pid = s.pid().to_string();
    ok(&launcher_in(&d, &["--attach", &pid, "-pp", "-o", "cpu.gz"]));
    let spun: f64 = a
        .say("spin 1500")
        .trim()
        .strip_prefix("spun ")
        .unwrap()
        .parse()
        .unwrap();
    ok(&launcher_in(&d, &["--detach", &pid]));
    let p = parse_strict(&read_text(&d.join("cpu.gz"))).unwrap();
    // 5 ms a sample: against the thread's own CPU time, measured in the
    // same run, so that a loaded machine does not matter.
    let sampled = under(&p, "PERF_TICKS", "spin").0 as f64 * 5e3;
    let ratio = sampled / spun;
    assert!(
        (0.7..1.3).contains(&ratio),
        "spin: {sampled} us sampled, {spun} us measured"
    );
    assert_eq!(a.say("quit"), "bye\n");
}

/// A library the program loaded, hooked by `-fp` at the attach, then
/// unloaded by the program (dlclose) before the detach: the detach
/// restores every other patch and leaves the code as in the files (the
/// previous library's removal read the unloaded patch site first, faulted,
/// and left every other hook in place: the detach failed).
#[test]
fn a_detach_after_the_program_unloaded_a_hooked_library_restores_the_rest() {
    let d = built("attach-unloaded");
    let s = Server::start(&d, &[]);
    let mut a = s.connect();
    assert_eq!(a.say("load"), "loaded\n");
    let pid = s.pid().to_string();
    ok(&launcher_in(
        &d,
        &["--attach", &pid, "-mp", "-fp:compress2", "-o", "fp.gz"],
    ));
    a.requests(0, 100);
    assert_eq!(a.say("unload"), "unloaded\n");
    ok(&launcher_in(&d, &["--detach", &pid]));
    assert!(code_as_in_files(s.pid()) > 0);
    assert_eq!(
        site(&d.join("fp.gz"), "MEM_TOTAL", "keep_record"),
        (100, 4_800)
    );
    assert_eq!(a.say("quit"), "bye\n");
}

/// A server attached to with -mp (profile `out`), sent 300 requests, then
/// `last`, which ends its image (answered with `answer`); its directory.
fn attached_to_its_end(name: &str, out: &str, last: &str, answer: &str) -> PathBuf {
    let d = built(name);
    let mut s = Server::start(&d, &[]);
    let mut a = s.connect();
    let pid = s.pid().to_string();
    ok(&launcher_in(&d, &["--attach", &pid, "-mp", "-o", out]));
    a.requests(0, 300);
    assert_eq!(a.say(last), answer);
    // After an exec, /bin/true runs unprofiled and ends.
    assert!(s.child.wait().unwrap().success());
    d
}

#[test]
fn a_process_that_exits_while_attached_writes_its_profile() {
    let d = attached_to_its_end("attach-exit", "exit.gz", "quit", "bye\n");
    assert_eq!(
        site(&d.join("exit.gz"), "MEM_TOTAL", "keep_record"),
        (300, 14_400)
    );
}

#[test]
fn a_process_that_execs_while_attached_writes_its_profile() {
    let d = attached_to_its_end("attach-exec", "exec.gz", "exec", "exec\n");
    // Named as a preloaded image's profile written at its exec is.
    assert_eq!(
        site(&d.join("exec.exec0.gz"), "MEM_TOTAL", "keep_record"),
        (300, 14_400)
    );
    assert!(profiles(&d).is_empty(), "the new image is not profiled");
}

#[test]
fn ctrl_c_ends_for_early_with_the_detach() {
    let d = built("attach-interrupt");
    let s = Server::start(&d, &[]);
    let mut a = s.connect();
    // The connection's thread exists, and glibc's own signal handlers.
    a.requests(0, 10);
    let pid = s.pid().to_string();
    let before = seen_before(s.pid());
    let mut l = Command::new(launcher())
        .args(["--attach", &pid, "-mp", "--for", "60s", "-o", "int.gz"])
        .current_dir(&d)
        .env("IGPROF_LIB", lib())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(l.stderr.take().unwrap()).lines();
    let first = lines.find(|x| x.as_ref().is_ok_and(|x| x.contains("attached to process")));
    assert!(first.is_some(), "no attach line");
    a.requests(0, 200);
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(l.id() as i32, libc::SIGINT) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(l.wait().unwrap().success(), "{rest:?}");
    assert!(
        rest.iter().any(|x| x.contains("detached from process")),
        "{rest:?}"
    );
    assert_eq!(
        site(&d.join("int.gz"), "MEM_TOTAL", "keep_record"),
        (200, 9_600)
    );
    assert!(code_as_in_files(s.pid()) >= 3);
    assert_as_before(s.pid(), &before);
}

/// Loads `http://127.0.0.1:port/` from a thread until `stop`: (answers,
/// failures, each failure said with the time since the start).
fn load(
    port: u16,
    start: std::time::Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    use std::io::Read;
    std::thread::spawn(move || {
        let (mut good, mut bad) = (0, Vec::new());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let r = (|| -> std::io::Result<Vec<u8>> {
                let mut s = TcpStream::connect(("127.0.0.1", port))?;
                s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
                s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
                let mut body = Vec::new();
                s.read_to_end(&mut body)?;
                Ok(body)
            })();
            let at = start.elapsed().as_secs_f64();
            match r {
                Ok(b) if b.starts_with(b"HTTP/1.") && b.windows(6).any(|w| w == b" 200 O") => {
                    good += 1
                }
                Ok(b) => bad.push(format!(
                    "{at:.3} s: answer {:?}",
                    String::from_utf8_lossy(&b[..b.len().min(80)])
                )),
                Err(e) => bad.push(format!("{at:.3} s: {e}")),
            }
        }
        (good, bad)
    })
}

/// 20 attach/detach cycles with -pp -mp on a server nobody here wrote
/// (`cmd` prints a line naming its port), under load: no failed request,
/// every profile readable and holding allocations; the process's
/// descriptors and threads as before at the end.
fn cycles(name: &str, cmd: &[&str], port_of: impl Fn(&str) -> Option<u16>) {
    // Its requests time out after 10 s: not beside 25 spinning threads.
    let _cores = CORES.read().unwrap_or_else(|e| e.into_inner());
    let d = scratch(name);
    let mut child = Command::new(cmd[0])
        .args(&cmd[1..])
        .current_dir(&d)
        .env("IGPROF_CACHE_DIR", test_store())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Both outputs read line by line (so the program never blocks on a
    // full pipe), checked for lines of ours, and sent here.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let readers: Vec<std::thread::JoinHandle<()>> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|r| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines() {
                let Ok(l) = l else { break };
                assert!(
                    !l.contains("igprof:"),
                    "a line of igprof in the program's output: {l}"
                );
                let _ = tx.send(l);
            }
        })
    })
    .collect();
    // Killed and reaped however the test ends.
    let child = Reaped(child);
    let port = rx
        .iter()
        .find_map(|l| port_of(&l))
        .unwrap_or_else(|| panic!("{name}: no port"));
    let pid = child.0.id() as i32;
    // Descriptors compared while no request is served.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = seen_before(pid);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = std::time::Instant::now();
    let loader = load(port, start, stop.clone());
    // When each attach and detach began and ended, to set beside a failure.
    let mut began = Vec::new();
    let at = || (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    for i in 0..20 {
        let out = format!("c{i}.gz");
        let a = at();
        ok(&launcher_in(
            &d,
            &["--attach", &pid.to_string(), "-pp", "-mp", "-o", &out],
        ));
        began.push(("attach", a, at()));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let a = at();
        ok(&launcher_in(&d, &["--detach", &pid.to_string()]));
        began.push(("detach", a, at()));
        let p = parse_strict(&read_text(&d.join(&out))).unwrap();
        assert!(
            total(&p, "MEM_TOTAL") > 0,
            "{name}: cycle {i} holds no allocation"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (good, bad) = loader.join().unwrap();
    assert!(
        bad.is_empty(),
        "{name}: {} failed requests of {}: {bad:?}; (call, began, ended), s: {began:?}",
        bad.len(),
        good + bad.len() as u64,
    );
    assert!(good > 200, "{name}: only {good} requests answered");
    assert_eq!(seen_with(pid, before.threads).fds, before.fds, "{name}");
    assert!(code_as_in_files(pid) >= 3);
    drop(child);
    for r in readers {
        r.join().expect("no line of igprof in the program's output");
    }
}

#[test]
fn python_http_server_under_load_attached_twenty_times() {
    cycles(
        "attach-python",
        &[
            "/usr/bin/python3",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
        ],
        |l| l.split(" port ").nth(1)?.split(' ').next()?.parse().ok(),
    );
}

#[test]
fn node_http_server_under_load_attached_twenty_times() {
    cycles(
        "attach-node",
        &[
            "/usr/bin/node",
            "-e",
            "const s=require('http').createServer((q,r)=>r.end(Buffer.alloc(1000,'x')));s.listen(0,'127.0.0.1',()=>console.log('port '+s.address().port))",
        ],
        |l| l.trim().strip_prefix("port ")?.parse().ok(),
    );
}

#[test]
fn sqlite3_query_attached_for_two_seconds_gives_its_result() {
    let d = scratch("attach-sqlite");
    let n: u64 = 40_000_000;
    let q = format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{n}) SELECT sum(x) FROM c;"
    );
    let child = Command::new("/usr/bin/sqlite3")
        .args([":memory:", &q])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = child.id().to_string();
    let t0 = std::time::Instant::now();
    let cpu_before = cpu_ns(child.id());
    let o = launcher_in(&d, &["--attach", &pid, "-pp", "--for", "2s", "-o", "q.gz"]);
    let cpu = cpu_ns(child.id()) - cpu_before;
    let err = ok(&o);
    assert!(err.contains("detached from process"), "{err}");
    assert!(t0.elapsed() >= std::time::Duration::from_secs(2));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (n * (n + 1) / 2).to_string(),
        "the query's result"
    );
    let p = parse_strict(&read_text(&d.join("q.gz"))).unwrap();
    let s = cumulative_shares(&p, "PERF_TICKS");
    assert!(
        s.get("sqlite3VdbeExec").copied().unwrap_or(0.0) > 50.0,
        "the query's engine holds the time: {s:?}"
    );
    // The CPU time of the two seconds attached (5 ms per sample), against
    // the process's own from before the attach to after the detach,
    // measured in the same run, so that a loaded machine does not matter.
    let ticks = total(&p, "PERF_TICKS");
    let ratio = ticks as f64 * 5e6 / cpu as f64;
    assert!(
        (0.7..1.3).contains(&ratio),
        "{ticks} samples of 5 ms against {} ms of CPU time",
        cpu / 1_000_000
    );
}

#[test]
fn fifty_busy_threads_survive_ten_attach_detach_cycles() {
    let _cores = cores_busy();
    let d = scratch("attach-threads");
    build(&d, "attach_threads.c", "attach_threads", &[]);
    let mut reaped = Reaped(
        Command::new(d.join("attach_threads"))
            .env("IGPROF_CACHE_DIR", test_store())
            .spawn()
            .unwrap(),
    );
    let child = &mut reaped.0;
    let pid = child.id().to_string();
    let threads = || std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    for _ in 0..100 {
        if threads() == 51 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(threads(), 51);
    for i in 0..10 {
        let (p, _) = attached_for(&d, child, &format!("t{i}.gz"), 150, i);
        assert!(
            under(&p, "PERF_TICKS", "spin").0 > 0,
            "cycle {i}: the spinning threads were not sampled"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process died after the last detach"
    );
    assert!(code_as_in_files(child.id() as i32) >= 3);
}

/// Both threads of tests/programs/attach_all_busy.c allocate without
/// pause: no thread sleeps in a wait, and a thread stopped anywhere is
/// most likely inside malloc or free with its arena locked. The thread
/// called on is first run alone out of libc's code; without that, the
/// attach's dlopen waited for the lock its own thread held and every
/// attach gave up after a minute. Two cycles: the process lives on, and
/// each profile holds the threads' allocations.
#[test]
fn attach_to_threads_that_all_allocate() {
    let d = scratch("attach-busy");
    build(
        &d,
        "attach_all_busy.c",
        "attach_all_busy",
        &["-fno-optimize-sibling-calls"],
    );
    let mut child = started_ready(&d, "attach_all_busy");
    for i in 0..2 {
        let t0 = std::time::Instant::now();
        let (p, _) = attached_for(&d, &mut child.0, &format!("b{i}.gz"), 100, i);
        // A call that waits for its own thread's lock gives up after a
        // minute.
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "cycle {i} took {:?}",
            t0.elapsed()
        );
        assert!(
            under(&p, "MEM_TOTAL", "churn").0 > 1000,
            "cycle {i}: the allocations are not in the profile"
        );
    }
}

/// Cycle `cycle` of a test: `child` attached to with `-pp -mp` (the
/// profile to `out` in `d`), left to run `ms`, detached; it must still
/// run. Its profile, and the longer of the times the attach and the
/// detach said they held the threads stopped.
fn attached_for(
    d: &Path,
    child: &mut Child,
    out: &str,
    ms: u64,
    cycle: usize,
) -> (Profile, std::time::Duration) {
    let pid = child.id().to_string();
    let attach = ok(&launcher_in(
        d,
        &["--attach", &pid, "-pp", "-mp", "-o", out],
    ));
    std::thread::sleep(std::time::Duration::from_millis(ms));
    let detach = ok(&launcher_in(d, &["--detach", &pid]));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process died in cycle {cycle}"
    );
    let said = stopped_for(&attach).max(stopped_for(&detach));
    (parse_strict(&read_text(&d.join(out))).unwrap(), said)
}

/// The "stopped for N ms" of an attach or detach line in `stderr`.
fn stopped_for(stderr: &str) -> std::time::Duration {
    let ms = stderr
        .split_once("stopped for ")
        .and_then(|(_, rest)| rest.split_once(" ms"))
        .and_then(|(n, _)| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no 'stopped for N ms' in: {stderr}"));
    std::time::Duration::from_secs_f64(ms / 1e3)
}

/// A thread holds the loader's lock 3 s at a time (tests/programs/
/// attach_loader_lock.c): the process's dlopen of the library and the
/// writing of the profile wait for it, so the launcher lets the threads
/// run during those calls, serving their stops, and writes no code while
/// they run. Three cycles: the process lives on, the allocating thread is
/// profiled in each, and the code is as in its files after each detach.
#[test]
fn attach_waits_out_a_thread_holding_the_loader_lock() {
    let d = scratch("attach-lock");
    build(&d, "attach_loader_lock.c", "attach_loader_lock", &[]);
    let mut child = started_ready(&d, "attach_loader_lock");
    let id = child.0.id() as i32;
    let before = seen_before(id);
    for i in 0..3 {
        let ((p, said), stopped) = longest_stop_during(id, || {
            attached_for(&d, &mut child.0, &format!("l{i}.gz"), 300, i)
        });
        assert!(
            under(&p, "MEM_TOTAL", "churn").0 > 0,
            "cycle {i}: the allocating thread's calls are not in the profile"
        );
        assert!(code_as_in_files(id) >= 3, "cycle {i}");
        // A call waiting for the lock lets the other threads run once it
        // is seen blocked in a futex (50 ms of looks), not after 2 s.
        assert!(
            stopped < std::time::Duration::from_secs(1),
            "cycle {i}: a thread stayed stopped for {stopped:?}"
        );
        // What the attach and detach lines say leaves out the time the
        // threads ran during the calls (most of the 3 s the lock is held).
        assert!(
            said < std::time::Duration::from_secs(1),
            "cycle {i}: the lines say the threads were stopped for {said:?}"
        );
    }
    assert_eq!(seen_with(id, before.threads).fds, before.fds);
}

/// What `f` returns, and the longest time any thread of `pid` stayed in a
/// tracing stop meanwhile (`/proc/PID/task/TID/stat`, looked at every
/// millisecond).
fn longest_stop_during<T>(pid: i32, f: impl FnOnce() -> T) -> (T, std::time::Duration) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let mut since: BTreeMap<String, Instant> = BTreeMap::new();
            let mut longest = Duration::ZERO;
            while !done.load(Ordering::Acquire) {
                let now = Instant::now();
                let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
                    .into_iter()
                    .flatten();
                for t in tasks.flatten() {
                    let tid = t.file_name().to_string_lossy().into_owned();
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    let state = stat
                        .rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().next());
                    if state == Some("t") {
                        let at = *since.entry(tid).or_insert(now);
                        longest = longest.max(now - at);
                    } else {
                        since.remove(&tid);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            longest
        });
        let r = f();
        done.store(true, Ordering::Release);
        (r, watch.join().expect("the watching thread panicked"))
    })
}

/// The main thread is stopped holding glibc's main arena lock, blocked
/// in a write (tests/programs/attach_arena_held.c): the attach's calls
/// (dlopen allocates) must run on the other thread, asleep in pause().
/// On the main thread they would wait for a lock that thread holds, and
/// the attach would fail after a minute. The program then runs on: its
/// stderr whole, its allocations made after the attach counted exactly.
#[test]
fn attach_calls_avoid_a_thread_holding_the_malloc_lock() {
    let d = scratch("attach-arena");
    build(
        &d,
        "attach_arena_held.c",
        "attach_arena_held",
        &["-fno-optimize-sibling-calls"],
    );
    let mut child = Reaped(
        Command::new(d.join("attach_arena_held"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let filler: usize = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    // Let the main thread reach malloc_stats()'s blocked write.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let pid = child.0.id().to_string();
    let t0 = std::time::Instant::now();
    let err = ok(&launcher_in(
        &d,
        &["--attach", &pid, "-mp", "-o", "arena.gz"],
    ));
    assert!(err.contains("attached to process"), "{err}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "the attach waited {:?}",
        t0.elapsed()
    );
    let mut stderr = child.0.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut v).unwrap();
        v
    });
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("done "), "{line}");
    ok(&launcher_in(&d, &["--detach", &pid]));
    drop(child.0.stdin.take());
    assert!(child.0.wait().unwrap().success());
    let err = drain.join().unwrap();
    assert!(err[..filler].iter().all(|&b| b == b'x'), "the filler bytes");
    let stats = String::from_utf8_lossy(&err[filler..]);
    assert!(
        stats.starts_with("Arena 0:\n") && stats.contains("in use bytes"),
        "malloc_stats()'s lines: {stats:?}"
    );
    assert_eq!(
        site(&d.join("arena.gz"), "MEM_TOTAL", "alloc_site"),
        (1000, 4_242_000)
    );
}

/// CPU time of every thread of `pid` so far, in ns (schedstat).
fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| {
            let s = std::fs::read_to_string(e.ok()?.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Counted and sampled perf events on threads that ran before the
/// attach: `-c task-clock` counts, on the 50 threads of
/// tests/programs/attach_threads.c, at least the kernel's own CPU time of
/// the process between the attach's return and the detach's start, and
/// at most its CPU time from before the attach to after the detach (the
/// counting starts and ends while every thread is stopped); `-pf` samples
/// their faults; `-oc` charges the sleeping threads' waits to nanosleep.
/// The process lives on and its code is as in its files.
#[test]
fn per_thread_events_count_threads_from_before_the_attach() {
    let _cores = cores_busy();
    let d = scratch("attach-events");
    build(&d, "attach_threads.c", "attach_threads", &[]);
    let child = Reaped(Command::new(d.join("attach_threads")).spawn().unwrap());
    let (id, pid) = (child.0.id(), child.0.id().to_string());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let outer0 = cpu_ns(id);
    ok(&launcher_in(
        &d,
        &[
            "--attach",
            &pid,
            "-pp",
            "-c",
            "task-clock",
            "-pf",
            "-o",
            "c.gz",
        ],
    ));
    let inner0 = cpu_ns(id);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let inner = cpu_ns(id) - inner0;
    ok(&launcher_in(&d, &["--detach", &pid]));
    let outer = cpu_ns(id) - outer0;
    let p = parse_strict(&read_text(&d.join("c.gz"))).unwrap();
    let values = |c: &str| {
        p.nodes
            .iter()
            .flat_map(|n| n.values.iter())
            .filter(|v| v.counter == c)
            .map(|v| v.value)
            .sum::<u64>()
    };
    let counted = values("CNT_TASK_CLOCK");
    assert!(
        counted as f64 >= 0.97 * inner as f64 && counted as f64 <= 1.02 * outer as f64,
        "CNT_TASK_CLOCK {counted} ns; the process ran {inner} ns of CPU while surely attached, {outer} ns around it"
    );
    assert!(under(&p, "CNT_TASK_CLOCK", "spin").1 as f64 >= 0.9 * counted as f64);
    assert!(
        values("PAGE_FAULTS") > 0,
        "no fault of the spinning threads' allocations sampled"
    );
    assert!(code_as_in_files(id as i32) >= 3);
    // Other modules: another process (one keeps its first attach's).
    let other = Reaped(Command::new(d.join("attach_threads")).spawn().unwrap());
    let (id, pid) = (other.0.id(), other.0.id().to_string());
    std::thread::sleep(std::time::Duration::from_millis(300));
    ok(&launcher_in(&d, &["--attach", &pid, "-oc", "-o", "oc.gz"]));
    std::thread::sleep(std::time::Duration::from_millis(500));
    ok(&launcher_in(&d, &["--detach", &pid]));
    let p = parse_strict(&read_text(&d.join("oc.gz"))).unwrap();
    assert!(
        under(&p, "OFFCPU_TIME", "nap").1 > 25 * 200_000_000,
        "the 25 sleeping threads' waits are not charged to them"
    );
    assert!(code_as_in_files(id as i32) >= 3);
}

/// Program `exe` of `d` started, once it printed "ready".
fn started_ready(d: &Path, exe: &str) -> Reaped {
    let mut child = Reaped(
        Command::new(d.join(exe))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ready = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    child
}

/// The machine's two cores: a test that keeps them busy (25 threads
/// spinning) takes them whole ([`cores_busy`]); a test whose checks a
/// starved process could fail (a served request's timeout) shares them
/// with its like only. What each measures is unchanged.
static CORES: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn cores_busy() -> std::sync::RwLockWriteGuard<'static, ()> {
    CORES.write().unwrap_or_else(|e| e.into_inner())
}

/// A child killed and reaped however the test ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
