//! Why the launcher refuses to run the program, and the line it says so
//! with.
//!
//! What it owns: every reason ([`Refusal`]) and its message, written as
//! the shell launcher wrote them: what is wrong and what to do, on one line.
//!
//! What it must never do: decide anything (the checks are in the modules
//! that name a reason) or print (`main` writes the line and exits with
//! [`Refusal::status`]).

use crate::elf::Machine;
use crate::glibc;

/// Why the launcher refuses to run the program: each is one line,
/// `igprof: <message>`, on stderr, and exit status 127 (126 for a file
/// that is not executable, as a shell).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// An option, value or combination the option table refuses (its
    /// message).
    Option(String),
    /// A value with `'` for an option whose value IGPROF quotes (the option).
    Quote(Vec<u8>),
    /// `-e` or `-c` with a specification that does not parse (the parser's
    /// message).
    BadEvent(String),
    /// An `-ibs` or `-ibs-fetch` option that does not parse (the reason
    /// names the option).
    BadIbs(String),
    CommandNotFound(Vec<u8>),
    NoSuchFile(Vec<u8>),
    NotExecutable(Vec<u8>),
    /// -o names a directory.
    OutputIsDir(Vec<u8>),
    /// -o's directory does not exist (the path, the directory).
    NoOutputDir(Vec<u8>, Vec<u8>),
    /// -o's directory is not writable by the user (the path, the directory).
    OutputDirNotWritable(Vec<u8>, Vec<u8>),
    /// Set-user-ID, set-group-ID or given file capabilities: how, and
    /// what to do.
    SecureExec(Vec<u8>, [&'static [u8]; 2]),
    Static(Vec<u8>),
    /// A program of `machine` and no qemu-user for it.
    NoQemu {
        prog: Vec<u8>,
        machine: Machine,
    },
    /// qemu-user without the guest's libraries under `root`.
    NoGuestRoot {
        prog: Vec<u8>,
        machine: Machine,
        root: Vec<u8>,
    },
    NoGuestLib {
        prog: Vec<u8>,
        machine: Machine,
    },
    /// IGPROF_LIB names no file.
    NoIgprofLib(Vec<u8>),
    NoLib,
    /// The library needs a glibc newer than the program's.
    OldGlibc(Vec<u8>, glibc::Missing),
}

impl Refusal {
    /// The exit status the launcher leaves with: a shell's for the same
    /// program (126 for a file that is there but not executable), 127 for
    /// everything else.
    pub fn status(&self) -> libc::c_int {
        match self {
            Refusal::NotExecutable(_) => 126,
            _ => 127,
        }
    }

    /// The line's text after `igprof: `, as the shell launcher wrote it.
    pub fn message(&self) -> Vec<u8> {
        use Refusal::*;
        let host = std::env::consts::ARCH.as_bytes();
        match self {
            Option(why) => why.as_bytes().to_vec(),
            Quote(o) => cat(&[o, b": a value containing ' cannot be passed"]),
            BadEvent(why) => cat(&[b"-e: ", why.as_bytes()]),
            BadIbs(why) => why.as_bytes().to_vec(),
            CommandNotFound(p) => cat(&[p, b": command not found"]),
            NoSuchFile(p) => cat(&[p, b": no such file"]),
            NotExecutable(p) => cat(&[p, b": not executable"]),
            OutputIsDir(p) => cat(&[b"-o ", p, b": is a directory (give a file name in it, e.g. ", p, b"/p.gz)"]),
            NoOutputDir(p, d) => cat(&[b"-o ", p, b": no directory ", d, b" (create it first, or give another path)"]),
            OutputDirNotWritable(p, d) => cat(&[b"-o ", p, b": cannot create files in ", d, b" (give a directory you can write in)"]),
            SecureExec(p, [how, advice]) => cat(&[
                p,
                b" is ",
                how,
                b": the loader runs it in secure-execution mode, which ignores LD_PRELOAD, so it would run without the profiler (",
                advice,
                b")",
            ]),
            Static(p) => cat(&[
                p,
                b" is statically linked: libigprof.so can only be preloaded into dynamically linked programs (rebuild it without -static)",
            ]),
            NoQemu { prog, machine } => cat(&[
                prog,
                b" is ",
                machine.what(),
                b" program and this machine is ",
                host,
                b": install qemu-user (qemu-",
                machine.name(),
                b") to run it here, or run igprof on such a machine",
            ]),
            NoGuestRoot { prog, machine, root } => cat(&[
                prog,
                b" is ",
                machine.what(),
                b" program: qemu-",
                machine.name(),
                b" needs its libraries under ",
                root,
                b" (install the ",
                machine.name(),
                b" libc, e.g. libc6-dev-arm64-cross, or set QEMU_LD_PREFIX)",
            ]),
            NoGuestLib { prog, machine } => cat(&[
                prog,
                b" is ",
                machine.what(),
                b" program: no libigprof.so built for ",
                machine.name(),
                b" (cargo build --release --target ",
                machine.name(),
                b"-unknown-linux-gnu -p igprof-rs, or set ",
                machine.lib_var().as_bytes(),
                b")",
            ]),
            NoIgprofLib(l) => cat(&[b"IGPROF_LIB=", l, b": no such file"]),
            OldGlibc(lib, m) => m.message(lib),
            NoLib => b"cannot find libigprof.so (looked next to this program, in ../lib and target/release; build with 'cargo build --release' or set IGPROF_LIB)".to_vec(),
        }
    }
}

/// The concatenation of `parts`.
pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}
