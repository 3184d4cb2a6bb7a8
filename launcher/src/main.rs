//! `igprof`, IgProf's launcher: runs a program under libigprof.so.
//!
//! What it owns: the order of a launch, and the native one itself. The
//! command line becomes the `IGPROF` words ([`grammar`], which walks the
//! option table of `igprof-options`: values are checked there, so a
//! mistake stops the run with one line instead of giving a run without a
//! profile); an -o the run could not write is refused ([`output`]); the
//! program is found in PATH as bash's `type -P` does ([`path`]); refused
//! when the exec would run it in the loader's secure-execution mode
//! ([`secure`]) or when it is statically linked ([`elf`]); run under
//! qemu-user when it is of another machine ([`qemu`]); else libigprof.so is
//! found here (next to this program, `../lib`, `$CARGO_TARGET_DIR/release`,
//! the build tree's release directory, or `IGPROF_LIB`), checked against
//! the program's glibc ([`glibc`]), and
//! the environment of the exec set: `IGPROF`, `IGPROF_ROOT_PID` (this
//! process's pid, which the exec keeps) and `LD_PRELOAD` (a sanitizer
//! runtime the program needs first: [`sanitizers`]), and with `--jit` the
//! variables that make node and Python write perf maps ([`jit`]); then
//! [`exec`]. `igprof --mark PID` is a command of its own ([`mark`]), and
//! so are `igprof --attach/--detach/--dump PID` (`attach`, x86-64). Each
//! reason to refuse, and its line, is a [`refusal::Refusal`].
//!
//! Its release build is static, with musl (`--target
//! <arch>-unknown-linux-musl`): a glibc program's start-up, loader and CPU
//! detection, would add about 0.8 ms to every profiled run on a VM. So
//! nothing here may count on glibc: not `std::env::args` (see `main`), not
//! glibc's `execvp` fallback ([`exec`]), not a loader ([`glibc`]).
//!
//! What it must never do: start another process before the exec (its own
//! cost is added to every profiled run, and to every command of a build
//! that wraps its commands in it), fork (the exit status is the program's),
//! change the program's signal dispositions or signal mask (hence
//! `no_main`: Rust's start-up would ignore SIGPIPE, and `Command` would
//! reset the mask), change any environment variable but those above, or
//! print anything but the usage (`-h`; no program) and one `igprof: ...`
//! line on stderr when it refuses to run the program (exit status 127, 126
//! for a file that is not executable, as a shell's) or
//! the exec fails (126, or 127 when the file is missing).
#![cfg_attr(not(test), no_main)]

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

#[cfg(target_arch = "x86_64")]
mod attach;
mod exec;
mod glibc;
mod grammar;
mod jit;
mod mark;
mod output;
mod path;
mod qemu;
mod refusal;
mod sanitizers;
mod sys;

use igprof_execfile::{elf, secure};

use elf::{linkage, Linkage};
use exec::exec;
use grammar::Request;
use output::output_place;
use path::{absolute, bash_pwd, build_trees, find_in_path, here};
use refusal::{cat, Refusal};
use secure::secure_exec;
use sys::{env_set, executable, is_file, os, stat, write_fd};

/// Says why the program is not run; the exit status.
fn refuse(r: Refusal) -> libc::c_int {
    write_fd(2, &cat(&[b"igprof: ", &r.message(), b"\n"]));
    r.status()
}

/// The C entry point. The arguments come from `argv`, not
/// `std::env::args_os()`: the standard library fills that from glibc's
/// call of its initialisers with argc and argv, which musl (the C library
/// of the launcher's static build) does not make.
#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    let n = usize::try_from(argc).unwrap_or(0);
    let args = (1..n)
        .map(|i| {
            // SAFETY: the C start-up's argv holds argc NUL-terminated
            // strings, alive for the whole process.
            let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
            OsString::from(std::ffi::OsStr::from_bytes(arg.to_bytes()))
        })
        .collect();
    run(args)
}

/// The launcher, given its arguments (the program's name left out):
/// returns only when the program is not run, with the exit status.
#[cfg_attr(test, allow(dead_code))]
fn run(args: Vec<OsString>) -> libc::c_int {
    if args.first().is_some_and(|a| a == "--mark") {
        return mark::run(&args[1..]);
    }
    if let Some(cmd) = args
        .first()
        .and_then(|a| a.to_str())
        .filter(|a| ["--attach", "--detach", "--dump"].contains(a))
    {
        return attach_commands(cmd, &args[1..]);
    }
    let mut pwd_cache: Option<Vec<u8>> = None;
    let mut pwd = || pwd_cache.get_or_insert_with(bash_pwd).clone();
    let (igprof, program) = match grammar::parse(&args, &mut pwd) {
        Ok(Request::Help) => {
            write_fd(1, grammar::usage().as_bytes());
            return 0;
        }
        Ok(Request::NoProgram) => {
            write_fd(2, grammar::usage().as_bytes());
            return 127;
        }
        Ok(Request::Run {
            igprof,
            program,
            output,
        }) => match output.as_deref().map(output_place) {
            Some(Err(r)) => return refuse(r),
            _ => (igprof, program),
        },
        Err(r) => return refuse(r),
    };
    match launch(&args[program..], &igprof, &mut pwd) {
        Ok(status) => status,
        Err(r) => refuse(r),
    }
}

#[cfg(target_arch = "x86_64")]
fn attach_commands(cmd: &str, args: &[OsString]) -> libc::c_int {
    attach::run(cmd, args)
}

#[cfg(not(target_arch = "x86_64"))]
fn attach_commands(cmd: &str, _: &[OsString]) -> libc::c_int {
    write_fd(
        2,
        format!("igprof: {cmd}: attaching is built for x86-64 only so far\n").as_bytes(),
    );
    1
}

/// Finds the program `cmd[0]`, checks it, and execs it (`cmd[1..]` its
/// arguments) under the library; returns only if it could not.
fn launch(
    cmd: &[OsString],
    igprof: &[u8],
    pwd: &mut dyn FnMut() -> Vec<u8>,
) -> Result<libc::c_int, Refusal> {
    let prog = cmd[0].as_bytes();
    let resolved = if prog.contains(&b'/') {
        prog.to_vec()
    } else {
        let path = std::env::var_os("PATH");
        find_in_path(prog, path.as_ref().map(|p| p.as_bytes()), pwd)
            .ok_or_else(|| Refusal::CommandNotFound(prog.to_vec()))?
    };
    if stat(&resolved).is_none() {
        return Err(Refusal::NoSuchFile(resolved));
    }
    if !executable(&resolved) {
        return Err(Refusal::NotExecutable(resolved));
    }
    // A program that the exec gives another user, group or capabilities
    // runs in the loader's secure-execution mode, which drops LD_PRELOAD:
    // it would run without the profiler and leave no profile.
    if let Some(how) = secure_exec(&resolved) {
        return Err(Refusal::SecureExec(resolved, how));
    }
    // A statically linked program has no dynamic loader: LD_PRELOAD cannot
    // put the profiler into it, so the run would silently give no profile.
    let machine = match linkage(&resolved) {
        Linkage::Static => return Err(Refusal::Static(resolved)),
        Linkage::Dynamic(m) => m,
        Linkage::NotElf => None,
    };
    // A sanitizer's runtime the program needs goes first in LD_PRELOAD
    // (ASan aborts otherwise; see sanitizers.rs).
    let runtimes = sanitizers::runtimes(&resolved);
    let user_preload = env_set("LD_PRELOAD");
    let args: Vec<&[u8]> = cmd[1..].iter().map(|a| a.as_bytes()).collect();
    if jit::asked(igprof) {
        jit::set_env();
    }

    if let Some(machine) = machine.filter(|m| m.name() != std::env::consts::ARCH.as_bytes()) {
        return qemu::launch(
            machine,
            resolved,
            &args,
            igprof,
            &runtimes,
            user_preload.as_deref(),
            pwd,
        );
    }

    let pid = std::process::id().to_string();
    let lib = find_lib(pwd)?;
    if let Some(m) = glibc::check(&lib, &resolved) {
        return Err(Refusal::OldGlibc(lib, m));
    }
    let preload = sanitizers::preload(&runtimes, &lib, user_preload.as_deref());
    std::env::set_var("IGPROF", os(igprof));
    std::env::set_var("IGPROF_ROOT_PID", &pid);
    std::env::set_var("LD_PRELOAD", os(&preload));
    let mut argv: Vec<&[u8]> = Vec::with_capacity(args.len() + 1);
    argv.push(prog);
    argv.extend(&args);
    Ok(exec(&resolved, &argv, pwd))
}

/// libigprof.so: `IGPROF_LIB`, else next to this program, `../lib`,
/// `$CARGO_TARGET_DIR/release`, or the release directory of the build tree
/// this program is in (`target/`, which holds the static launcher in
/// `<triple>/release/`); an absolute path.
pub(crate) fn find_lib(pwd: &mut dyn FnMut() -> Vec<u8>) -> Result<Vec<u8>, Refusal> {
    let target_dir = env_set("CARGO_TARGET_DIR");
    let lib = match env_set("IGPROF_LIB") {
        Some(l) if is_file(&l) => l,
        Some(l) => return Err(Refusal::NoIgprofLib(l)),
        None => {
            let here = here();
            let mut candidates = Vec::with_capacity(5);
            if let Some(h) = &here {
                candidates.push([h, &b"/libigprof.so"[..]].concat());
                candidates.push([h, &b"/../lib/libigprof.so"[..]].concat());
            }
            if let Some(t) = &target_dir {
                candidates.push([t, &b"/release/libigprof.so"[..]].concat());
            }
            // The build tree's release library, from a launcher built in
            // it for another profile or target.
            if let Some(h) = &here {
                for t in build_trees(h) {
                    candidates.push([&t, &b"/release/libigprof.so"[..]].concat());
                }
            }
            candidates
                .into_iter()
                .find(|c| is_file(c))
                .ok_or(Refusal::NoLib)?
        }
    };
    Ok(absolute(lib, pwd))
}
