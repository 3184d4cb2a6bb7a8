//! `igprof --attach PID [--for TIME] OPTIONS...`, `igprof --detach PID`,
//! `igprof --dump PID [FILE]`: profiling a process that is already
//! running, without a debugger.
//!
//! An attach stops every thread of the process with ptrace
//! ([`ptrace::Stopped`]), has one of them call the process's own `dlopen`
//! on libigprof.so (once: a second attach finds it loaded), then
//! `igprof_attach(options, pcs, n)`, which starts the modules there,
//! hooks included, never patching bytes a stopped thread is inside (the
//! `pcs`; when one is, every thread runs 20 ms and the attach is tried
//! again), and lets the threads go. A detach stops them again for
//! `igprof_detach()`, which writes the profile and restores every patched
//! byte. The library's lines, kept in the process, are printed here.
//!
//! What it owns: the commands' grammar, the checks before tracing
//! ([`target::check`]), the order of the calls, `--for`'s wait (Ctrl-C
//! ends it early, with the detach).
//!
//! What it must never do: leave the process stopped or traced, print
//! anything into the process's own output, or attach with an option the
//! attached library cannot honour (those that need the program's signals,
//! a thread of the profiler's, or its start: refused in one line).

mod caller;
mod ptrace;
mod target;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ptrace::{data_arg, Stopped};

/// The results of `igprof_attach` (process/attach.rs in the library).
const ATTACHED: u64 = 0;
const THREAD_INSIDE: u64 = 2;
/// `igprof_detach_unhook`'s results (process/attach.rs).
const UNHOOKED: u64 = 0;
const BUSY: u64 = 1;
const NOT_DETACHING: u64 = 3;
/// `igprof_attach`: the threads were let run during the call (it waited
/// for a lock one held), so it wrote no more code.
const HELD_OFF: u64 = 5;
const HELD_OFF_AGAIN: u64 = 6;
/// `igprof_attach`: held off, and the threads were stopped again while it
/// held the loader's lock: called again at once.
const RESTOPPED: u64 = 7;
/// How often an attach is tried when a thread is inside a patch's bytes.
const TRIES: usize = 20;

/// Options an attached library cannot honour, and why.
const NOT_ATTACHED: &[(&str, &str)] = &[
    ("-t", "it chooses programs as they start"),
    ("--target", "it chooses programs as they start"),
    ("-pd", "recording starts with the attach"),
    ("-D", "it needs the profiler's watcher thread"),
    ("--dump-flag", "it needs the profiler's watcher thread"),
    (
        "--dump-every",
        "it needs the profiler's watcher thread (use igprof --dump PID)",
    ),
    (
        "--sample-every",
        "it needs the profiler's keeper or watcher",
    ),
    ("--snapshot-above", "it needs the profiler's keeper"),
    ("--dump-signal", "it takes one of the program's signals"),
    ("--toggle-signal", "it takes one of the program's signals"),
    ("--marks", "it takes one of the program's signals"),
    ("--mark-every", "it needs the profiler's watcher thread"),
    ("--mark-signal", "it takes one of the program's signals"),
    ("--jit", "it sets the program's environment at its start"),
    (
        "-ibs",
        "IBS is not supported attached (never run on IBS hardware)",
    ),
    (
        "-ibs-fetch",
        "IBS is not supported attached (never run on IBS hardware)",
    ),
    (
        "-np",
        "energy counters are opened for each thread as it starts",
    ),
    (
        "--energy-profile",
        "energy counters are opened for each thread as it starts",
    ),
    (
        "-finst",
        "the program calls the preloaded library's entry points",
    ),
];

/// Runs `--attach`, `--detach` or `--dump` (`cmd`) with `args` (what
/// follows it); the exit status.
pub fn run(cmd: &str, args: &[OsString]) -> libc::c_int {
    let r = match cmd {
        "--attach" => attach_command(args),
        "--detach" => one_pid(args, "--detach PID").and_then(|pid| detach(pid, &checked_lib(pid)?)),
        _ => dump_command(args),
    };
    match r {
        Ok(()) => 0,
        Err(why) => {
            eprintln!("igprof: {cmd}: {why}");
            1
        }
    }
}

/// A refusal's line, without its `igprof: ` (the command adds its own).
fn said(r: crate::refusal::Refusal) -> String {
    String::from_utf8_lossy(&r.message()).into_owned()
}

/// libigprof.so, once process `pid` passed the checks made before tracing.
fn checked_lib(pid: i32) -> Result<Vec<u8>, String> {
    let lib = crate::find_lib(&mut crate::path::bash_pwd).map_err(said)?;
    target::check(pid, &lib)?;
    Ok(lib)
}

fn pid_of(word: &OsString, usage: &str) -> Result<i32, String> {
    word.to_str()
        .and_then(|s| s.parse().ok())
        .filter(|p: &i32| *p > 0)
        .ok_or_else(|| {
            format!(
                "'{}' is not a process id (usage: igprof {usage})",
                word.to_string_lossy()
            )
        })
}

fn one_pid(args: &[OsString], usage: &str) -> Result<i32, String> {
    match args {
        [p] => pid_of(p, usage),
        _ => Err(format!("usage: igprof {usage}")),
    }
}

fn attach_command(args: &[OsString]) -> Result<(), String> {
    let usage = "--attach PID [--for TIME] [OPTIONS...]";
    let pid = pid_of(args.first().ok_or(format!("usage: igprof {usage}"))?, usage)?;
    let mut rest: Vec<OsString> = args[1..].to_vec();
    let mut for_time = None;
    if let Some(i) = rest.iter().position(|a| a == "--for") {
        let v = rest.get(i + 1).ok_or("--for needs a time (5s, 500ms)")?;
        let ns = igprof_options::parse_time(v.as_bytes(), 1_000_000_000)
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--for: '{}' is not a time (5s, 500ms)", v.to_string_lossy()))?;
        for_time = Some(Duration::from_nanos(ns));
        rest.drain(i..i + 2);
    }
    for a in &rest {
        let a = a.to_string_lossy();
        let name = a.split(':').next().unwrap_or("");
        if let Some((o, why)) = NOT_ATTACHED
            .iter()
            .find(|(o, _)| name == *o || (*o == "-e" && a.starts_with("-e:")))
        {
            return Err(format!("{o} cannot be used with --attach: {why}"));
        }
    }
    let mut pwd = crate::path::bash_pwd;
    let lib = checked_lib(pid)?;
    if !rest.iter().any(|a| a == "-o" || a == "--output") {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        rest.push("-o".into());
        rest.push(format!("igprof.{}.{pid}.gz", comm.trim()).into());
    }
    rest.push("--".into());
    rest.push("attached".into());
    let words = match crate::grammar::parse(&rest, &mut pwd) {
        Ok(crate::grammar::Request::Run { igprof, output, .. }) => {
            if let Some(Err(r)) = output.as_deref().map(crate::output::output_place) {
                return Err(said(r));
            }
            igprof
        }
        Ok(_) => return Err(format!("usage: igprof {usage}")),
        Err(r) => return Err(said(r)),
    };
    let t0 = Instant::now();
    let (paused, threads, tries) = attach(pid, &lib, &words)?;
    let tries = if tries > 1 {
        format!(" over {tries} tries")
    } else {
        String::new()
    };
    eprintln!(
        "igprof: attached to process {pid} ({} stopped for {:.1} ms{tries}); igprof --detach {pid} writes the profile",
        threads_word(threads),
        paused.as_secs_f64() * 1e3
    );
    let Some(d) = for_time else { return Ok(()) };
    wait_interruptible(t0 + d);
    detach(pid, &lib)
}

/// "1 thread", "51 threads".
fn threads_word(n: usize) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

/// Set by SIGINT or SIGTERM while `--for` waits.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn wait_interruptible(until: Instant) {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_interrupt as *const () as libc::sighandler_t) };
    }
    while Instant::now() < until && !INTERRUPTED.load(Ordering::Relaxed) {
        std::thread::sleep(
            Duration::from_millis(20).min(until.saturating_duration_since(Instant::now())),
        );
    }
}

/// libigprof.so among the process's objects, if loaded.
fn loaded_lib(pid: i32, lib: &[u8]) -> Result<Option<target::Mapped>, String> {
    let real = std::fs::canonicalize(crate::sys::os(lib)).ok();
    Ok(target::objects(pid)?.into_iter().find(|m| {
        std::fs::canonicalize(target::in_root(pid, &m.path)).ok() == real
            || m.path.ends_with("/libigprof.so")
    }))
}

/// Addresses of the library's entry points and log in the process.
struct Entry {
    base: u64,
    values: Vec<Option<u64>>,
    /// The library's path as the process maps it.
    path: String,
}

impl Entry {
    fn find(pid: i32, lib: &[u8], names: &[&str]) -> Result<Entry, String> {
        let m = loaded_lib(pid, lib)?.ok_or_else(|| {
            format!("process {pid} has no libigprof.so loaded: it was never attached to")
        })?;
        let values = target::symbols(&target::in_root(pid, &m.path), names)?;
        Ok(Entry {
            base: m.base,
            values,
            path: m.path,
        })
    }

    fn at(&self, i: usize) -> Result<u64, String> {
        self.values[i]
            .map(|v| self.base + v)
            .ok_or_else(|| "the libigprof.so loaded in the process is of another build: detach it with that build's igprof".into())
    }
}

const LOG: &[&str] = &["igprof_attach_log", "igprof_attach_log_len"];

/// Calls `func` in the process with the library's log emptied first,
/// then prints the lines the call kept there; the result and the call's
/// data as the call left it.
fn call_logged(
    stopped: &mut Stopped,
    e: &Entry,
    func: u64,
    args: &[u64],
    data: &[u8],
) -> Result<(u64, Vec<u8>), String> {
    if let Ok(len) = e.at(2) {
        ptrace::write_mem(stopped.pid, len, &0u64.to_le_bytes())?;
    }
    // A thread stopped inside the profiler may hold a lock the call needs:
    // the library refuses to run there, and the call goes to another. When
    // every thread tried was inside it (a program allocating on each of
    // its threads), a call that carries no picture of the stopped threads
    // (the attach's carries their pcs, which a pause would make stale) has
    // them all run 20 ms, and the round starts again.
    let rounds = if args.is_empty() && data.is_empty() {
        BUSY_ROUNDS
    } else {
        1
    };
    let busy = |r: &Result<(u64, Vec<u8>), String>| matches!(r, Ok((v, _)) if *v as u32 as i32 == CALLER_BUSY);
    let mut r = stopped.call_in_out(func, args, data);
    for round in 0..rounds {
        for _ in 0..CALLERS {
            if busy(&r) && stopped.avoid_caller() {
                r = stopped.call_in_out(func, args, data);
            } else {
                break;
            }
        }
        stopped.reset_callers();
        if !busy(&r) || round + 1 == rounds {
            break;
        }
        stopped.pause_in_place(Duration::from_millis(20))?;
        r = stopped.call_in_out(func, args, data);
    }
    print_log(stopped.pid, e, 1);
    match r {
        Ok((v, _)) if v as u32 as i32 == CALLER_BUSY => Err(format!(
            "process {}: every thread tried was inside the profiler: try again",
            stopped.pid
        )),
        r => r,
    }
}

/// The library's answer when the thread called on was inside it
/// (process/attach.rs), and how many threads are tried.
const CALLER_BUSY: i32 = 0x1b5;
const CALLERS: usize = 16;
/// How many times every thread is let run 20 ms when all those tried were
/// inside the profiler.
const BUSY_ROUNDS: usize = 10;

/// Prints the lines the library kept in the process since its last call.
fn print_log(pid: i32, e: &Entry, first: usize) {
    let (Ok(buf), Ok(len)) = (e.at(first), e.at(first + 1)) else {
        return;
    };
    let Ok(n) = ptrace::read_mem(pid, len, 8) else {
        return;
    };
    let n = u64::from_le_bytes(n.try_into().unwrap_or([0; 8])).min(16 << 10) as usize;
    if let Ok(text) = ptrace::read_mem(pid, buf, n) {
        eprint!("{}", String::from_utf8_lossy(&text));
    }
}

/// Loads the library if needed and starts it; how long the threads were
/// stopped, how many threads, and at which try it started.
fn attach(pid: i32, lib: &[u8], words: &[u8]) -> Result<(Duration, usize, usize), String> {
    let loaded = loaded_lib(pid, lib)?.is_some();
    let preloaded = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .any(|v| v.starts_with(b"IGPROF="));
    if loaded && preloaded {
        return Err(format!(
            "process {pid} is already profiled (it was started under igprof): igprof --dump {pid} writes a snapshot of its profile"
        ));
    }
    let t0 = Instant::now();
    let mut stopped = Stopped::all(pid)?;
    if !loaded {
        let objs = target::objects(pid)?;
        let dlopen = target::dlopen_in(pid, &objs)?;
        let mut data = lib.to_vec();
        data.push(0);
        let handle = stopped.call(dlopen, &[data_arg(0), libc::RTLD_NOW as u64], &data)?;
        if handle == 0 {
            return Err(format!(
                "process {pid} could not load {} (its dlopen failed): is it the same machine and a glibc of 2.28 or newer?",
                String::from_utf8_lossy(lib)
            ));
        }
    }
    let names = [
        "igprof_attach",
        LOG[0],
        LOG[1],
        "igprof_attach_others_ran",
        "igprof_attach_patching",
        "igprof_detach_unhook",
        "igprof_attach_restop",
    ];
    let e = Entry::find(pid, lib, &names)?;
    let entry = e.at(0)?;
    stopped.gate = Some(ptrace::Gate {
        others_ran: e.at(3)?,
        patching: e.at(4)?,
        restop: e.at(6)?,
    });
    stopped.library = Some(e.path.clone());
    let mut paused = t0.elapsed();
    for tried in 1..=TRIES {
        // The caller's place may move before the call: taken after.
        stopped.ready_caller()?;
        let threads = stopped.threads();
        let mut data = words.to_vec();
        data.push(0);
        data.resize(data.len().next_multiple_of(8), 0);
        let at = data.len();
        for w in threads.iter().flatten() {
            data.extend_from_slice(&w.to_le_bytes());
        }
        let t = Instant::now();
        let args = [data_arg(0), data_arg(at), threads.len() as u64];
        stopped.moves = Some((at, threads.clone()));
        let called = call_logged(&mut stopped, &e, entry, &args, &data);
        stopped.moves = None;
        let (r, back) = called?;
        match r as u32 as i32 as i64 as u64 {
            ATTACHED => {
                // Threads moved out of a patch's bytes go on in its
                // trampoline (already done where the threads ran during
                // the call: they have run since).
                if !stopped.others_ran {
                    stopped.apply_moves(&threads, &back[at..at + threads.len() * 24]);
                }
                let threads = stopped.thread_count();
                stopped.release();
                paused += t.elapsed();
                return Ok((paused.saturating_sub(stopped.ran), threads, tried));
            }
            THREAD_INSIDE | HELD_OFF_AGAIN => {
                paused += t.elapsed();
                stopped.release_without_samples();
                stopped = stopped.pause(Duration::from_millis(20))?;
            }
            RESTOPPED => paused += t.elapsed(),
            HELD_OFF => {
                // The hooks written before the threads ran come off now,
                // every thread held.
                stopped.hold_others = true;
                let _ = call_logged(&mut stopped, &e, e.at(5)?, &[], &[]);
                stopped.release_without_samples();
                return Err(format!("process {pid} runs on, unprofiled"));
            }
            _ => return Err(format!("process {pid} runs on, unprofiled")),
        }
    }
    Err(format!(
        "a thread of process {pid} stayed inside the first bytes of a function to hook ({TRIES} tries): try again"
    ))
}

/// Writes the profile and restores the process's code (`lib`: from
/// [`checked_lib`]).
fn detach(pid: i32, lib: &[u8]) -> Result<(), String> {
    let e = Entry::find(
        pid,
        lib,
        &["igprof_detach", LOG[0], LOG[1], "igprof_detach_unhook"],
    )?;
    let t0 = Instant::now();
    let mut stopped = Stopped::all(pid)?;
    stopped.library = Some(e.path.clone());
    let threads = stopped.thread_count();
    // The profile first (the other threads may have to run while it is
    // written), then the unpatching, every other thread held stopped. A
    // detach cut short between the two is finished by the next one.
    let dumped = call_logged(&mut stopped, &e, e.at(0)?, &[], &[])
        .map_err(|why| format!("writing the profile: {why}"));
    let mut r = Err(String::new());
    if dumped.is_ok() {
        for _ in 0..TRIES {
            stopped.hold_others = true;
            r = call_logged(&mut stopped, &e, e.at(3)?, &[], &[])
                .map(|(r, _)| r)
                .map_err(|why| format!("restoring the code: {why}"));
            stopped.hold_others = false;
            match r {
                Ok(BUSY) => stopped = stopped.pause(Duration::from_millis(20))?,
                _ => break,
            }
        }
    }
    stopped.release_without_samples();
    dumped?;
    match r? {
        UNHOOKED => {
            eprintln!(
                "igprof: detached from process {pid} ({} stopped for {:.1} ms)",
                threads_word(threads),
                t0.elapsed().saturating_sub(stopped.ran).as_secs_f64() * 1e3
            );
            Ok(())
        }
        NOT_DETACHING => Err(format!("process {pid} is not attached to")),
        BUSY => Err(format!(
            "process {pid}: a thread stayed inside the profiler's hook registry ({TRIES} tries): run igprof --detach {pid} again"
        )),
        _ => Err(format!(
            "process {pid} was not detached cleanly (see above)"
        )),
    }
}

fn dump_command(args: &[OsString]) -> Result<(), String> {
    let usage = "--dump PID [FILE]";
    let (pid, file) = match args {
        [p] => (pid_of(p, usage)?, None),
        [p, f] => (pid_of(p, usage)?, Some(f)),
        _ => return Err(format!("usage: igprof {usage}")),
    };
    let mut pwd = crate::path::bash_pwd;
    let lib = checked_lib(pid)?;
    let e = Entry::find(pid, &lib, &["igprof_dump_now", LOG[0], LOG[1]])?;
    let mut data = Vec::new();
    let arg = match file {
        Some(f) => {
            let path = crate::path::absolute(f.as_bytes().to_vec(), &mut pwd);
            crate::output::output_place(&path).map_err(said)?;
            data.extend_from_slice(&path);
            data.push(0);
            data_arg(0)
        }
        None => 0,
    };
    let mut stopped = Stopped::all(pid)?;
    stopped.library = Some(e.path.clone());
    let r = call_logged(&mut stopped, &e, e.at(0)?, &[arg], &data);
    stopped.release();
    match r?.0 as u32 as i32 {
        0 => {
            eprintln!("igprof: process {pid} wrote a snapshot");
            Ok(())
        }
        _ => Err(format!(
            "process {pid} wrote no snapshot (is it attached to?)"
        )),
    }
}
