//! `igprof`, IgProf's launcher: runs a program under libigprof.so.
//!
//! What it owns: turning IgProf's options into the `IGPROF` environment
//! variable (the words the library parses; values are checked here, so a
//! mistake stops the run with one line instead of giving a run without a
//! profile), finding the program (in PATH as bash's `type -P` does),
//! refusing an -o the run could not write (a missing or read-only
//! directory, a directory named as the file), statically linked programs
//! (the ELF program headers, read here)
//! and programs the exec would run in the loader's secure-execution mode
//! (set-user-ID, set-group-ID, file capabilities: LD_PRELOAD ignored),
//! finding libigprof.so, and the environment of the exec: `IGPROF`,
//! `IGPROF_ROOT_PID` (this process's pid, which the exec keeps) and
//! `LD_PRELOAD` (a sanitizer runtime the program needs first:
//! [`sanitizers`]), or qemu-user with the library built for the program's
//! architecture when that is not this machine's.
//!
//! What it must never do: start another process before the exec (its own
//! cost is added to every profiled run, and to every command of a build
//! that wraps its commands in it), fork (the exit status is the program's),
//! change the program's signal dispositions or signal mask (hence
//! `no_main`: Rust's start-up would ignore SIGPIPE, and `Command` would
//! reset the mask), change any environment variable but those above, or
//! print anything but the usage (`-h`; no program) and one `igprof: ...`
//! line on stderr when it refuses to run the program (exit status 127) or
//! the exec fails (126, or 127 when the file is missing).
//!
//! The command line's grammar and the usage text: [`grammar`], which walks
//! the option table of `igprof-options`.
#![cfg_attr(not(test), no_main)]

use std::borrow::Cow;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};

mod glibc;
mod grammar;
mod sanitizers;

use grammar::Request;

/// PATH when it is unset: bash's default, which the shell launcher used.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin:.";

/// Why the launcher refuses to run the program: each is one line,
/// `igprof: <message>`, on stderr, and exit status 127.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
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
    /// The line's text after `igprof: `, as the shell launcher wrote it.
    fn message(&self) -> Vec<u8> {
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
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// The machines whose programs the launcher tells apart (by their loader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Machine {
    Aarch64,
    X86_64,
}

impl Machine {
    /// The name as in `std::env::consts::ARCH`, bash's HOSTTYPE and triples.
    fn name(self) -> &'static [u8] {
        match self {
            Machine::Aarch64 => b"aarch64",
            Machine::X86_64 => b"x86_64",
        }
    }

    fn what(self) -> &'static [u8] {
        match self {
            Machine::Aarch64 => b"an AArch64",
            Machine::X86_64 => b"an x86-64",
        }
    }

    /// The variable naming the library built for this machine.
    fn lib_var(self) -> &'static str {
        match self {
            Machine::Aarch64 => "IGPROF_LIB_AARCH64",
            Machine::X86_64 => "IGPROF_LIB_X86_64",
        }
    }

    /// The machine whose loader `interp` (PT_INTERP) is, if known.
    fn of_loader(interp: &[u8]) -> Option<Machine> {
        if contains(interp, b"ld-linux-aarch64") {
            Some(Machine::Aarch64)
        } else if contains(interp, b"ld-linux-x86-64") {
            Some(Machine::X86_64)
        } else {
            None
        }
    }
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether the run can write its profile at `path` (absolute): an existing
/// device or FIFO, or a file in an existing directory the user may create
/// files in. Checked before the program runs, so that a mistyped -o does
/// not cost a whole run (the library would then write the profile in the
/// temporary directory instead). A `%p` in the directory part is left to
/// the run.
fn output_place(path: &[u8]) -> Result<(), Refusal> {
    if let Some(m) = stat(path) {
        if m.is_dir() {
            return Err(Refusal::OutputIsDir(path.to_vec()));
        }
        if !m.is_file() {
            return Ok(());
        }
    }
    let dir = match path.iter().rposition(|&b| b == b'/') {
        Some(0) | None => b"/".to_vec(),
        Some(i) => path[..i].to_vec(),
    };
    if dir.windows(2).any(|w| w == b"%p") {
        return Ok(());
    }
    if !stat(&dir).is_some_and(|m| m.is_dir()) {
        return Err(Refusal::NoOutputDir(path.to_vec(), dir));
    }
    if !accessible(&dir, libc::W_OK | libc::X_OK) {
        return Err(Refusal::OutputDirNotWritable(path.to_vec(), dir));
    }
    Ok(())
}

/// The current directory as bash's `$PWD` at start-up: the inherited PWD
/// when it is absolute and names this directory, else getcwd.
fn bash_pwd() -> Vec<u8> {
    if let Some(p) = std::env::var_os("PWD") {
        if p.as_bytes().starts_with(b"/") {
            if let (Ok(a), Ok(b)) = (std::fs::metadata(&p), std::fs::metadata(".")) {
                if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                    return p.into_vec();
                }
            }
        }
    }
    std::env::current_dir()
        .map(|d| d.into_os_string().into_vec())
        .unwrap_or_default()
}

/// `p` made absolute against `pwd` (bytes concatenated, as the shell did).
fn absolute(p: Vec<u8>, pwd: &mut dyn FnMut() -> Vec<u8>) -> Vec<u8> {
    if p.starts_with(b"/") {
        p
    } else {
        [&pwd()[..], b"/", &p].concat()
    }
}

/// `file` made absolute as bash's full_pathname (sh_makepath with
/// MP_DOCWD|MP_RMDOT): `pwd`, a '/' unless it ends with one, `file` without
/// one leading "./".
fn full_pathname(file: &[u8], pwd: &mut dyn FnMut() -> Vec<u8>) -> Vec<u8> {
    if file.starts_with(b"/") {
        return file.to_vec();
    }
    let mut full = pwd();
    if !full.ends_with(b"/") {
        full.push(b'/');
    }
    full.extend_from_slice(file.strip_prefix(b"./").unwrap_or(file));
    full
}

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// The C string of `b` (which holds no NUL: it comes from argv or environ).
fn c_string(b: &[u8]) -> CString {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    CString::new(&b[..end]).unwrap_or_default()
}

/// What stat says of a path: exists, directory, regular file.
fn stat(p: &[u8]) -> Option<std::fs::Metadata> {
    std::fs::metadata(os(p)).ok()
}

fn is_file(p: &[u8]) -> bool {
    stat(p).is_some_and(|m| m.is_file())
}

/// Whether this process may execute `p` (bash's test -x: eaccess X_OK).
fn executable(p: &[u8]) -> bool {
    accessible(p, libc::X_OK)
}

/// Whether this process's effective ids give `mode` (`X_OK`, `W_OK`...)
/// on `p` (eaccess).
fn accessible(p: &[u8], mode: libc::c_int) -> bool {
    let c = c_string(p);
    // SAFETY: `c` is a NUL-terminated string alive for the call;
    // faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, libc::AT_EACCESS) == 0 }
}

/// Whether exec'ing `p` would put the process in the loader's
/// secure-execution mode (AT_SECURE), and why: a set-user-ID file owned by
/// another user than the real one, a set-group-ID file of another group
/// than the real one, or file capabilities for a user other than root.
/// None when the exec cannot raise privileges: a file system mounted
/// nosuid, or no_new_privs set on this process (both inherited by the
/// exec).
fn secure_exec(p: &[u8]) -> Option<[&'static [u8]; 2]> {
    let m = stat(p)?;
    let c = c_string(p);
    // SAFETY: no arguments are read; returns 0 or 1.
    if unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1 {
        return None;
    }
    // SAFETY: a zeroed statvfs is a valid out-buffer; `c` is NUL-terminated.
    let mut vfs: libc::statvfs = unsafe { core::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut vfs) } == 0 && vfs.f_flag & libc::ST_NOSUID != 0 {
        return None;
    }
    // SAFETY: plain queries of this process's ids.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mode = m.mode();
    if mode & libc::S_ISUID != 0 && m.uid() != uid {
        return Some([
            b"set-user-ID",
            b"run igprof as the file's owner, or profile a copy: cp drops the bit",
        ]);
    }
    // Without group execute permission the bit means mandatory locking.
    if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 && m.gid() != gid {
        return Some([
            b"set-group-ID",
            b"run igprof with the file's group as real group, or profile a copy: cp drops the bit",
        ]);
    }
    // SAFETY: `c` and the name are NUL-terminated; a null buffer of size 0
    // asks only whether the attribute exists (and its size).
    let caps = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            core::ptr::null_mut(),
            0,
        )
    };
    if uid != 0 && caps > 0 {
        return Some([
            b"given file capabilities",
            b"run igprof as root, or profile a copy: cp drops them",
        ]);
    }
    None
}

/// The file bash's `type -P name` names: the first executable non-directory
/// `dir/name` for the directories of `path` (an empty one is "."), else the
/// first existing `dir/name` if that is not a directory (the caller then
/// says "not executable"). An empty PATH: `name` in the current directory
/// if it is executable.
fn find_in_path(
    name: &[u8],
    path: Option<&[u8]>,
    pwd: &mut dyn FnMut() -> Vec<u8>,
) -> Option<Vec<u8>> {
    let path = path.unwrap_or(DEFAULT_PATH);
    if path.is_empty() {
        let found = stat(name).is_some_and(|m| !m.is_dir()) && executable(name);
        return found.then(|| full_pathname(name, pwd));
    }
    let mut first: Option<(Vec<u8>, bool)> = None;
    for dir in path.split(|&b| b == b':') {
        let dir = if dir.is_empty() { &b"."[..] } else { dir };
        let sep: &[u8] = if dir.ends_with(b"/") { b"" } else { b"/" };
        let full = [dir, sep, name].concat();
        let Some(m) = stat(&full) else { continue };
        if !m.is_dir() && executable(&full) {
            return Some(full);
        }
        if first.is_none() {
            first = Some((full, m.is_dir()));
        }
    }
    first.and_then(|(f, dir)| (!dir).then_some(f))
}

/// How the program file is linked, as far as preloading goes.
#[derive(Debug, PartialEq, Eq)]
enum Linkage {
    /// Not an ELF file (a script: its interpreter is what gets preloaded),
    /// or one that cannot be read.
    NotElf,
    /// A loader (PT_INTERP), and the machine it is for if known; or no
    /// loader but needed libraries (DT_NEEDED).
    Dynamic(Option<Machine>),
    /// No loader and no needed library, or unreadable program headers: no
    /// loader will put libigprof.so into it.
    Static,
}

/// Reads the ELF program headers of `path`: its loader (PT_INTERP), else
/// whether its dynamic section needs a library (DT_NEEDED).
fn linkage(path: &[u8]) -> Linkage {
    with_elf(path, |e| elf_linkage(e).unwrap_or(Linkage::Static)).unwrap_or(Linkage::NotElf)
}

/// `read(elf)` on the ELF file `path`; None when it is not one (or cannot
/// be opened).
fn with_elf<R>(path: &[u8], read: impl FnOnce(Option<&Elf>) -> R) -> Option<R> {
    let f = File::open(os(path)).ok()?;
    // The header, program headers, loader path and dynamic section sit in
    // the first pages of any linker's output: usually this one read is all.
    let mut head = [0u8; 4096];
    let n = read_at(&f, 0, &mut head);
    if !head[..n].starts_with(b"\x7fELF") {
        return None;
    }
    Some(read(Elf::new(&f, &head[..n]).as_ref()))
}

/// Reads into `buf` at `off` until it is full or the file ends; the count.
fn read_at(f: &File, off: u64, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    n
}

/// Fields of an ELF file of either class and byte order.
struct Elf<'a> {
    f: &'a File,
    head: &'a [u8],
    wide: bool,
    big: bool,
}

const PT_LOAD: u64 = 1;
const PT_DYNAMIC: u64 = 2;
const PT_INTERP: u64 = 3;
const DT_NEEDED: u64 = 1;

/// One program header: p_type, p_offset, p_vaddr, p_filesz.
struct Segment {
    kind: u64,
    offset: u64,
    vaddr: u64,
    size: u64,
}

impl<'a> Elf<'a> {
    /// The reader of the ELF file `f` whose first bytes are `head`; None
    /// for an unknown class or byte order.
    fn new(f: &'a File, head: &'a [u8]) -> Option<Elf<'a>> {
        let wide = match head.get(4)? {
            1 => false,
            2 => true,
            _ => return None,
        };
        let big = match head.get(5)? {
            1 => false,
            2 => true,
            _ => return None,
        };
        Some(Elf { f, head, wide, big })
    }

    /// `len` bytes at `off`: from the first read when it holds them.
    fn bytes(&self, off: u64, len: u64) -> Option<Cow<'_, [u8]>> {
        let end = off.checked_add(len)?;
        if end <= self.head.len() as u64 {
            return Some(self.head[off as usize..end as usize].into());
        }
        if len > 1 << 20 {
            return None;
        }
        let mut v = vec![0; len as usize];
        (read_at(self.f, off, &mut v) == v.len()).then_some(v.into())
    }

    fn uint(&self, b: &[u8], off: usize, size: usize) -> Option<u64> {
        let b = b.get(off..off + size)?;
        let fold = |n: u64, &d: &u8| n << 8 | u64::from(d);
        Some(match self.big {
            true => b.iter().fold(0, fold),
            false => b.iter().rev().fold(0, fold),
        })
    }

    /// A word: 8 bytes in a 64-bit file, 4 in a 32-bit one.
    fn word(&self, b: &[u8], off64: usize, off32: usize) -> Option<u64> {
        match self.wide {
            true => self.uint(b, off64, 8),
            false => self.uint(b, off32, 4),
        }
    }

    /// The program headers; None when they cannot be read (also when
    /// their entry size is too small for one).
    fn segments(&self) -> Option<Vec<Segment>> {
        let head = self.head;
        let phoff = self.word(head, 32, 28)?;
        let (entsize, count) = match self.wide {
            true => (self.uint(head, 54, 2)?, self.uint(head, 56, 2)?),
            false => (self.uint(head, 42, 2)?, self.uint(head, 44, 2)?),
        };
        if entsize < if self.wide { 56 } else { 32 } {
            return None;
        }
        let table = self.bytes(phoff, entsize * count)?;
        table
            .chunks_exact(entsize as usize)
            .map(|ph| {
                Some(Segment {
                    kind: self.uint(ph, 0, 4)?,
                    offset: self.word(ph, 8, 4)?,
                    vaddr: self.word(ph, 16, 8)?,
                    size: self.word(ph, 32, 16)?,
                })
            })
            .collect()
    }

    /// The entries (tag, value) of the dynamic section `dynamic` before
    /// its DT_NULL.
    fn dynamic(&self, dynamic: &Segment) -> Option<Vec<(u64, u64)>> {
        let entries = self.bytes(dynamic.offset, dynamic.size)?;
        let mut v = Vec::new();
        for d in entries.chunks_exact(if self.wide { 16 } else { 8 }) {
            match (self.word(d, 0, 0)?, self.word(d, 8, 4)?) {
                (0, _) => break,
                e => v.push(e),
            }
        }
        Some(v)
    }
}

/// The linkage of ELF file `e` (None: an unknown class or byte order);
/// None when its headers cannot be read (readelf would fail: the shell
/// launcher then called the program statically linked).
fn elf_linkage(e: Option<&Elf>) -> Option<Linkage> {
    let e = e?;
    let segments = e.segments()?;
    if let Some(s) = segments.iter().find(|s| s.kind == PT_INTERP) {
        let interp = e.bytes(s.offset, s.size)?;
        return Some(Linkage::Dynamic(Machine::of_loader(&interp)));
    }
    let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) else {
        return Some(Linkage::Static);
    };
    Some(match e.dynamic(dynamic)?.iter().any(|d| d.0 == DT_NEEDED) {
        true => Linkage::Dynamic(None),
        false => Linkage::Static,
    })
}

/// Writes all of `b` to `fd` (errors ignored: nowhere to report them).
fn write_fd(fd: libc::c_int, mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: the pointer and length are those of the live slice `b`.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n > 0 {
            b = &b[n as usize..];
        } else if n == 0
            || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
        {
            return;
        }
    }
}

/// Says why the program is not run; the exit status.
fn refuse(r: Refusal) -> libc::c_int {
    write_fd(2, &cat(&[b"igprof: ", &r.message(), b"\n"]));
    127
}

/// Replaces this process with `file` run with `argv`, as the shell's exec
/// did: a relative `file` made absolute first (bash's full_pathname: its
/// PWD, one leading "./" dropped), and a file without `#!` the kernel
/// refuses run by /bin/sh (execvp; `file` always has a '/', so there is no
/// PATH search). Returns only when the exec fails, with the exit status
/// to leave with: 127 when the file (or its interpreter) is missing, else 126.
fn exec(file: &[u8], argv: &[&[u8]], pwd: &mut dyn FnMut() -> Vec<u8>) -> libc::c_int {
    let file = full_pathname(file, pwd);
    let file_c = c_string(&file);
    let args: Vec<CString> = argv.iter().map(|a| c_string(a)).collect();
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: `file_c` and the strings `ptrs` points to are alive and
    // NUL-terminated, and `ptrs` ends with a null pointer; execvp only
    // returns on failure.
    unsafe { libc::execvp(file_c.as_ptr(), ptrs.as_ptr()) };
    let e = std::io::Error::last_os_error();
    let code = e.raw_os_error().unwrap_or(0);
    let is_dir = stat(&file).is_some_and(|m| m.is_dir());
    let why =
        std::io::Error::from_raw_os_error(if is_dir { libc::EISDIR } else { code }).to_string();
    // "Is a directory (os error 21)" without the code.
    let why = why.split(" (os error").next().unwrap_or_default();
    write_fd(
        2,
        &cat(&[
            b"igprof: exec: ",
            &file,
            b": cannot execute: ",
            why.as_bytes(),
            b"\n",
        ]),
    );
    if code == libc::ENOENT {
        127
    } else {
        126
    }
}

#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    run()
}

/// The launcher: returns only when the program is not run, with the
/// exit status.
#[cfg_attr(test, allow(dead_code))]
fn run() -> libc::c_int {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
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

/// A variable of the environment, None when unset or empty.
fn env_set(name: &str) -> Option<Vec<u8>> {
    std::env::var_os(name)
        .map(OsString::into_vec)
        .filter(|v| !v.is_empty())
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
    // This program's directory (the real one: /proc/self/exe), looked up
    // only when no variable names the library.
    let here = || -> Option<Vec<u8>> {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.as_os_str().as_bytes().to_vec())
    };
    let target_dir = env_set("CARGO_TARGET_DIR");
    let pid = std::process::id().to_string();
    let args: Vec<&[u8]> = cmd[1..].iter().map(|a| a.as_bytes()).collect();

    if let Some(machine) = machine.filter(|m| m.name() != std::env::consts::ARCH.as_bytes()) {
        // Another architecture: qemu-user with the library built for it.
        let arch = machine.name();
        let triple_lib = [arch, b"-unknown-linux-gnu/release/libigprof.so"].concat();
        let xlib = env_set(machine.lib_var()).or_else(|| {
            let here = here();
            let mut candidates = Vec::with_capacity(3);
            if let Some(h) = &here {
                candidates.push([h, &b"/"[..], arch, b"/libigprof.so"].concat());
            }
            if let Some(t) = &target_dir {
                candidates.push([t, &b"/"[..], &triple_lib].concat());
            }
            if let Some(h) = &here {
                candidates.push([h, &b"/../"[..], &triple_lib].concat());
            }
            candidates.into_iter().find(|c| is_file(c))
        });
        let qemu_name = [b"qemu-", arch].concat();
        let qemu = find_in_path(
            &qemu_name,
            std::env::var_os("PATH").as_ref().map(|p| p.as_bytes()),
            pwd,
        );
        let root =
            env_set("QEMU_LD_PREFIX").unwrap_or_else(|| [b"/usr/", arch, b"-linux-gnu"].concat());
        let Some(qemu) = qemu else {
            return Err(Refusal::NoQemu {
                prog: resolved,
                machine,
            });
        };
        if !stat(&root).is_some_and(|m| m.is_dir()) {
            return Err(Refusal::NoGuestRoot {
                prog: resolved,
                machine,
                root,
            });
        }
        let xlib = match xlib {
            Some(x) if is_file(&x) => absolute(x, pwd),
            _ => {
                return Err(Refusal::NoGuestLib {
                    prog: resolved,
                    machine,
                })
            }
        };
        let guest_preload = [
            &b"LD_PRELOAD="[..],
            &sanitizers::preload(&runtimes, &xlib, user_preload.as_deref()),
        ]
        .concat();
        std::env::set_var("IGPROF", os(igprof));
        std::env::set_var("IGPROF_ROOT_PID", &pid);
        // The library then starts no watcher thread in fork children,
        // which qemu-user cannot give a thread (see runtime::after_fork_child).
        std::env::set_var("IGPROF_QEMU_USER", "1");
        std::env::remove_var("LD_PRELOAD");
        let mut argv: Vec<&[u8]> = vec![&qemu, b"-L", &root, b"-E", &guest_preload, &resolved];
        argv.extend(&args);
        return Ok(exec(&qemu, &argv, pwd));
    }

    let lib = match env_set("IGPROF_LIB") {
        Some(l) if is_file(&l) => l,
        Some(l) => return Err(Refusal::NoIgprofLib(l)),
        None => {
            let here = here();
            let mut candidates = Vec::with_capacity(4);
            if let Some(h) = &here {
                candidates.push([h, &b"/libigprof.so"[..]].concat());
                candidates.push([h, &b"/../lib/libigprof.so"[..]].concat());
            }
            if let Some(t) = &target_dir {
                candidates.push([t, &b"/release/libigprof.so"[..]].concat());
            }
            // The build tree when this program is not a release build.
            if let Some(h) = &here {
                candidates.push([h, &b"/../release/libigprof.so"[..]].concat());
            }
            candidates
                .into_iter()
                .find(|c| is_file(c))
                .ok_or(Refusal::NoLib)?
        }
    };
    let lib = absolute(lib, pwd);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn an_output_the_run_cannot_write_is_refused() {
        let d = std::env::temp_dir().join(format!("igprof-launcher-out-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let path = |p: &str| d.join(p).into_os_string().into_vec();
        assert_eq!(output_place(&path("p.gz")), Ok(()));
        assert_eq!(output_place(b"/dev/null"), Ok(()));
        assert_eq!(output_place(&path("x%p/p.gz")), Ok(()), "left to the run");
        let msg = |r: Result<(), Refusal>| String::from_utf8(r.unwrap_err().message()).unwrap();
        assert_eq!(
            msg(output_place(&path("no/p.gz"))),
            format!(
                "-o {0}/no/p.gz: no directory {0}/no (create it first, or give another path)",
                d.display()
            )
        );
        let dir = d.clone().into_os_string().into_vec();
        assert_eq!(
            msg(output_place(&dir)),
            format!(
                "-o {0}: is a directory (give a file name in it, e.g. {0}/p.gz)",
                d.display()
            )
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn path_lookup_is_bash_type_p() {
        let d = std::env::temp_dir().join(format!("igprof-launcher-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["a", "b", "c/foo"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("a/foo"), "#!/bin/sh\n").unwrap();
        std::fs::copy(d.join("a/foo"), d.join("b/foo")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("a/foo"), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(d.join("b/foo"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = |s: &str| d.join(s).into_os_string().into_vec();
        let find = |path: &[u8]| {
            find_in_path(b"foo", Some(path), &mut || b"/nowhere".to_vec())
                .map(|p| String::from_utf8(p).unwrap())
        };
        let s = |v: Vec<u8>| String::from_utf8(v).unwrap();
        let ab = [dir("a"), dir("b")].join(&b':');
        assert_eq!(find(&ab), Some(s(dir("b/foo"))), "executable first");
        assert_eq!(
            find(&dir("a")),
            Some(s(dir("a/foo"))),
            "else the first file"
        );
        let ca = [dir("c"), dir("a")].join(&b':');
        assert_eq!(find(&ca), None, "unless it is a directory");
        let slash = [dir("b"), b"/".to_vec()].concat();
        assert_eq!(find(&slash), Some(s(dir("b/foo"))));
        let slashes = [dir("b"), b"//".to_vec()].concat();
        assert_eq!(find(&slashes), Some(s(dir("b//foo"))));
        assert_eq!(find_in_path(b"", Some(&ab), &mut Vec::new), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn elf_linkage_static_dynamic_and_scripts() {
        let host = Machine::of_loader(match std::env::consts::ARCH {
            "aarch64" => b"/lib/ld-linux-aarch64.so.1",
            _ => b"/lib64/ld-linux-x86-64.so.2",
        });
        assert_eq!(linkage(b"/bin/true"), Linkage::Dynamic(host));
        let d = std::env::temp_dir().join(format!("igprof-launcher-elf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = |n: &str| d.join(n).into_os_string().into_vec();
        std::fs::write(
            d.join("script"),
            "#!/bin/sh\nexec /lib/ld-linux-aarch64.so.1\n",
        )
        .unwrap();
        assert_eq!(linkage(&p("script")), Linkage::NotElf);
        assert_eq!(linkage(&p("missing")), Linkage::NotElf);
        // An ELF whose headers cannot be read: readelf failed on it, and
        // the shell launcher refused it as statically linked.
        let t = std::fs::read("/bin/true").unwrap();
        std::fs::write(d.join("cut"), &t[..40]).unwrap();
        assert_eq!(linkage(&p("cut")), Linkage::Static);
        std::fs::write(
            d.join("main.c"),
            "#include <stdio.h>\nint main(void) { return puts(\"x\") < 0; }\n",
        )
        .unwrap();
        let cc = |flags: &[&str], out: &str| {
            Command::new("cc")
                .args(flags)
                .arg("-o")
                .arg(d.join(out))
                .arg(d.join("main.c"))
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(cc(&[], "dynamic"), "cc");
        assert_eq!(linkage(&p("dynamic")), Linkage::Dynamic(host));
        // Without a static libc (no libc.a) there is nothing to check.
        if cc(&["-static"], "static") {
            assert_eq!(linkage(&p("static")), Linkage::Static);
        }
        if cc(&["-static-pie"], "static-pie") {
            assert_eq!(linkage(&p("static-pie")), Linkage::Static);
        }
        // A shared library has no loader but needs libc (puts): not refused.
        if cc(&["-shared", "-fPIC"], "lib.so") {
            assert_eq!(linkage(&p("lib.so")), Linkage::Dynamic(None));
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
