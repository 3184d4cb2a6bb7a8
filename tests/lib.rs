//! Helpers for the end-to-end tests in `tests/tests/`: build a C/C++ program
//! with the system compiler, run it under the launcher (the static release build), parse the profile
//! with a strict parser of IgProf's grammar, and name its addresses from the
//! objects' symbol tables (`nm`), independently of igprof-analyse.
//!
//! The tests need the release library, launcher and analyser (and the
//! library built for the other architecture, for the tests of foreign
//! programs): the first helper that needs one runs `cargo build --release`
//! for it, so a plain `cargo test --workspace` works in a fresh clone
//! (scripts/test builds them first, and the build is then a no-op). The
//! target directory is `$CARGO_TARGET_DIR` or the workspace's `target/`.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The cargo target directory.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let p = PathBuf::from(d);
            if p.is_absolute() {
                p
            } else {
                root().join(p)
            }
        }
        None => root().join("target"),
    }
}

/// The triple of the launcher's static build for this machine.
pub fn static_triple() -> String {
    format!("{}-unknown-linux-musl", std::env::consts::ARCH)
}

/// The triple of the launcher's static build for [`foreign_arch`].
fn foreign_static_triple() -> String {
    format!("{}-unknown-linux-musl", foreign_arch().0)
}

/// What a test runs from the release build.
#[derive(Clone, Copy, PartialEq)]
enum Build {
    /// libigprof.so and igprof-analyse, for the host.
    Host,
    /// The launcher users install: static, for `static_triple()`.
    Launcher,
    /// libigprof.so for [`foreign_arch`].
    Foreign,
    /// The static launcher for [`foreign_arch`].
    ForeignLauncher,
}

/// Runs `cargo build --release` of `what` once per test binary: the
/// artefacts the tests run are then those of the sources under test, even
/// when `cargo test` was not given `--release` (cargo holds no lock on the
/// release directory while tests run). Panics with cargo's status.
fn build_release(what: Build) {
    static HOST: std::sync::Once = std::sync::Once::new();
    static LAUNCHER: std::sync::Once = std::sync::Once::new();
    static FOREIGN: std::sync::Once = std::sync::Once::new();
    static FOREIGN_LAUNCHER: std::sync::Once = std::sync::Once::new();
    let once = match what {
        Build::Host => &HOST,
        Build::Launcher => &LAUNCHER,
        Build::Foreign => &FOREIGN,
        Build::ForeignLauncher => &FOREIGN_LAUNCHER,
    };
    once.call_once(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut c = Command::new(cargo);
        c.current_dir(root())
            .args(["build", "--release", "--quiet"]);
        match what {
            Build::Host => c.args(["-p", "igprof-rs", "-p", "igprof-analyse"]),
            Build::Launcher => c.args(["--target", &static_triple(), "-p", "igprof-launcher"]),
            Build::Foreign => c.args(["--target", &foreign_triple(), "-p", "igprof-rs"]),
            Build::ForeignLauncher => c.args([
                "--target",
                &foreign_static_triple(),
                "-p",
                "igprof-launcher",
            ]),
        };
        let st = c.status().expect("run cargo");
        assert!(
            st.success(),
            "{c:?} failed: {st} (scripts/setup adds the rustup targets)"
        );
    });
}

/// A release artefact, built first if needed.
fn release_artefact(what: Build, name: &str) -> PathBuf {
    build_release(what);
    let dir = match what {
        Build::Host => target_dir().join("release"),
        Build::Launcher => target_dir().join(static_triple()).join("release"),
        Build::Foreign => target_dir().join(foreign_triple()).join("release"),
        Build::ForeignLauncher => target_dir().join(foreign_static_triple()).join("release"),
    };
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing after cargo build --release",
        p.display()
    );
    p
}

/// The release libigprof.so.
pub fn lib() -> PathBuf {
    release_artefact(Build::Host, "libigprof.so")
}

/// The launcher users install: the static release build,
/// target/<arch>-unknown-linux-musl/release/igprof (target/release/igprof
/// is the same code linked to glibc, which costs each run glibc's start).
pub fn launcher() -> PathBuf {
    release_artefact(Build::Launcher, "igprof")
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("igprof-tests-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles tests/programs/<src> into `dir/<out>` with `flags`.
pub fn build(dir: &Path, src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let compiler = if src.ends_with(".cpp") { "c++" } else { "cc" };
    compile(compiler, dir, src, out, flags)
}

/// tests/programs/jemalloc_static.c linked with jemalloc's static library
/// (x86-64: scripts/setup installs libjemalloc-dev), built in `dir`.
pub fn build_jemalloc_static(dir: &Path) -> PathBuf {
    let lib = "/usr/lib/x86_64-linux-gnu/libjemalloc.a";
    assert!(
        Path::new(lib).exists(),
        "{lib} is missing: scripts/setup installs libjemalloc-dev"
    );
    build(
        dir,
        "jemalloc_static.c",
        "jemalloc_static",
        &[
            "-fno-builtin",
            "-Wl,--whole-archive",
            lib,
            "-Wl,--no-whole-archive",
            "-lm",
            "-lstdc++",
        ],
    )
}

/// Compiles tests/programs/<src> with `compiler` (-O2 -g, pthread and dl).
fn compile(compiler: &str, dir: &Path, src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let outp = dir.join(out);
    let st = Command::new(compiler)
        .args(["-O2", "-g"])
        .args(flags)
        .arg("-o")
        .arg(&outp)
        .arg(root().join("tests/programs").join(src))
        .args(["-lpthread", "-ldl"])
        .status()
        .unwrap_or_else(|e| panic!("{compiler}: {e} (scripts/setup installs the compilers)"));
    assert!(st.success(), "{compiler} {src} failed");
    outp
}

/// The release igprof-analyse.
pub fn analyser() -> PathBuf {
    release_artefact(Build::Host, "igprof-analyse")
}

/// Checks a profile of dlopen_main (main burns in plugin.so's plugin_burn
/// while another thread dlopens and dlcloses a copy): plugin_burn holds
/// the main thread's time, and plugin.so is named as an object.
pub fn check_dlopen(p: &Profile) {
    let s = cumulative_shares(p, "PERF_TICKS");
    // The main thread only burns in plugin_burn (the cycler thread's share
    // of the CPU depends on what else the machine runs).
    let in_main = s.get("main").copied().unwrap_or(0.0);
    assert!(
        in_main > 20.0 && s.get("plugin_burn").copied().unwrap_or(0.0) > 0.9 * in_main,
        "{s:?}"
    );
    assert!(
        p.funcs.values().any(|f| f.file.ends_with("/plugin.so")),
        "plugin.so appears as an object"
    );
}

/// The descriptor store of this test binary's runs (not the user's, in
/// ~/.cache): shared by its tests, so that most of them walk stacks with
/// descriptors an earlier process stored.
pub fn test_store() -> PathBuf {
    std::env::temp_dir().join(format!("igprof-tests-{}-descriptors", std::process::id()))
}

/// Runs `cmd` with its stdout and stderr piped, reads the first line it
/// prints, kills it with SIGKILL and waits for it: that line and how it
/// ended (a program that says when it is ready to be killed).
pub fn kill_after_first_line(mut cmd: Command) -> (String, Output) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the program");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    child.kill().unwrap();
    (line, child.wait_with_output().unwrap())
}

/// Runs `cmd` to its end with its output in files of `dir` (`cmd.out`,
/// `cmd.err`): how it ended and the CPU time (user and system, seconds)
/// the process and every descendant it waited for took, from `wait4`.
#[allow(clippy::zombie_processes, reason = "wait4 below reaps the child")]
pub fn output_and_cpu(mut cmd: Command, dir: &Path) -> (Output, f64) {
    use std::os::unix::process::ExitStatusExt;
    let (out, err) = (dir.join("cmd.out"), dir.join("cmd.err"));
    let child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start the program");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is this process's child, not yet waited for (the
    // Child is never waited on after this); both pointers are to locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(
        r,
        child.id() as i32,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let o = Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    };
    (o, secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// Runs the launcher (`igprof <args>`) in `dir`.
pub fn igprof(dir: &Path, args: &[&str]) -> Output {
    igprof_command(dir, args)
        .output()
        .expect("run the launcher")
}

/// The launcher (`igprof <args>`) in `dir` with the release library, not
/// yet run (to add variables).
pub fn igprof_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(launcher());
    c.args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib())
        .env("IGPROF_CACHE_DIR", test_store());
    c
}

/// [`igprof_command`] run by root without any capability (`setpriv` with
/// empty bounding, inheritable and ambient sets): permission checks and
/// `perf_event_paranoid` apply to it as to a user who is not root, while
/// the test's files (root's) stay its own.
pub fn igprof_without_caps(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--",
    ])
    .arg(launcher())
    .args(args)
    .current_dir(dir)
    .env("IGPROF_LIB", lib())
    .env("IGPROF_CACHE_DIR", test_store());
    c
}

/// The other architecture whose programs run here under qemu-user (see
/// the launcher, launcher/src/main.rs): its name as in `IGPROF_LIB_<ARCH>` and target triples,
/// and its C and C++ cross compilers (scripts/setup installs them).
pub fn foreign_arch() -> (&'static str, &'static str, &'static str) {
    if cfg!(target_arch = "x86_64") {
        ("aarch64", "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++")
    } else {
        ("x86_64", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++")
    }
}

/// The release libigprof.so built for [`foreign_arch`] (built first if
/// needed; scripts/setup installs the rustup target and cross linker).
pub fn foreign_lib() -> PathBuf {
    release_artefact(Build::Foreign, "libigprof.so")
}

/// The launcher's static build for [`foreign_arch`] (built first if
/// needed; run it under qemu-user).
pub fn foreign_launcher() -> PathBuf {
    release_artefact(Build::ForeignLauncher, "igprof")
}

/// The glibc triple of [`foreign_arch`].
fn foreign_triple() -> String {
    format!("{}-unknown-linux-gnu", foreign_arch().0)
}

/// Cross-compiles tests/programs/<src> for [`foreign_arch`] into
/// `dir/<out>` with `flags`, as [`build`] does for the host.
pub fn cross_build(dir: &Path, src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let (_, cc, cxx) = foreign_arch();
    compile(
        if src.ends_with(".cpp") { cxx } else { cc },
        dir,
        src,
        out,
        flags,
    )
}

/// The launcher (`igprof <args>`) in `dir` with the host library and the one
/// built for [`foreign_arch`], not yet run.
pub fn foreign_igprof_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(launcher());
    c.args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib())
        .env("IGPROF_CACHE_DIR", test_store())
        .env(
            format!("IGPROF_LIB_{}", foreign_arch().0.to_uppercase()),
            foreign_lib(),
        );
    c
}

/// Runs the launcher (`igprof <args>`) in `dir` for a program of [`foreign_arch`].
pub fn foreign_igprof(dir: &Path, args: &[&str]) -> Output {
    foreign_igprof_command(dir, args)
        .output()
        .expect("run the launcher")
}

/// The profiles (igprof.*.gz) written in `dir`.
pub fn profiles(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("igprof.") && n.ends_with(".gz")
        })
        .collect();
    v.sort();
    v
}

/// Reads a profile, gunzipping if needed.
pub fn read_text(p: &Path) -> String {
    let raw = std::fs::read(p).unwrap();
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_string(&mut s)
            .unwrap();
        s
    } else {
        String::from_utf8(raw).unwrap()
    }
}

/// A counter value on a node.
#[derive(Debug, Clone)]
pub struct Value {
    pub counter: String,
    pub ticks: u64,
    pub value: u64,
    pub peak: u64,
    pub leaks: Vec<(u64, u64)>,
}

/// One node line.
#[derive(Debug, Clone)]
pub struct PNode {
    pub depth: usize,
    pub parent: Option<usize>,
    pub func: u32,
    pub sym_offset: u64,
    pub values: Vec<Value>,
}

#[derive(Debug, Clone)]
pub struct Func {
    pub file: String,
    pub object_offset: u64,
    pub name: String,
}

/// A parsed profile.
#[derive(Debug, Default)]
pub struct Profile {
    pub pid: u64,
    /// The program's name, without the notes after it.
    pub program: String,
    /// The header's notes (`N=(program [note; note])`): sampling, counting
    /// groups, when the process started and the dump was written.
    pub notes: Vec<String>,
    pub tick: String,
    pub funcs: HashMap<u32, Func>,
    pub nodes: Vec<PNode>,
}

struct Cur<'a> {
    s: &'a str,
    line: usize,
}

impl<'a> Cur<'a> {
    fn err(&self, what: &str) -> String {
        format!(
            "line {}: {what} at '{}'",
            self.line,
            &self.s[..self.s.len().min(40)]
        )
    }
    fn lit(&mut self, l: &str) -> Result<(), String> {
        match self.s.strip_prefix(l) {
            Some(r) => {
                self.s = r;
                Ok(())
            }
            None => Err(self.err(&format!("expected '{l}'"))),
        }
    }
    fn eat(&mut self, l: &str) -> bool {
        self.lit(l).is_ok()
    }
    fn hex(&mut self) -> Result<u64, String> {
        let n = self
            .s
            .bytes()
            .take_while(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            .count();
        if n == 0 || n > 16 {
            return Err(self.err("expected lower-case hex"));
        }
        let v = u64::from_str_radix(&self.s[..n], 16).unwrap();
        self.s = &self.s[n..];
        Ok(v)
    }
    fn until(&mut self, end: &str) -> Result<&'a str, String> {
        match self.s.find(end) {
            Some(i) => {
                let r = &self.s[..i];
                self.s = &self.s[i..];
                Ok(r)
            }
            None => Err(self.err(&format!("missing '{end}'"))),
        }
    }
}

/// Parses a profile with IgProf's grammar, strictly: exact header, only node
/// lines, ids defined once before use, depths starting at 1 and growing by
/// at most one, lower-case hex, a final newline and nothing after.
pub fn parse_strict(text: &str) -> Result<Profile, String> {
    let mut p = Profile::default();
    let body = text.strip_suffix('\n').ok_or("no final newline")?;
    let mut lines = body.split('\n');
    let head = lines.next().ok_or("empty profile")?;
    let mut c = Cur { s: head, line: 1 };
    c.lit("P=(HEX ID=")?;
    p.pid = c.hex()?;
    c.lit(" N=(")?;
    let named = c.until(") T=")?;
    // igprof-rs always writes notes; IgProf's own profiles have none.
    match named.strip_suffix(']').and_then(|n| n.rsplit_once(" [")) {
        Some((program, notes)) => {
            p.program = program.to_string();
            p.notes = notes.split("; ").map(str::to_string).collect();
        }
        None => p.program = named.to_string(),
    }
    c.lit(") T=")?;
    let t = c.until(")")?;
    let (a, b) = t.split_once('.').ok_or_else(|| c.err("T= is not %f"))?;
    if a.is_empty()
        || !a.bytes().all(|x| x.is_ascii_digit())
        || b.len() != 6
        || !b.bytes().all(|x| x.is_ascii_digit())
    {
        return Err(c.err("T= is not %f"));
    }
    p.tick = t.to_string();
    c.lit(")")?;
    if !c.s.is_empty() {
        return Err(c.err("extra header text"));
    }
    let mut files: HashMap<u32, String> = HashMap::new();
    let mut counters: HashMap<u32, String> = HashMap::new();
    let mut stack: Vec<usize> = Vec::new();
    for (i, l) in lines.enumerate() {
        let mut c = Cur { s: l, line: i + 2 };
        c.lit("C")?;
        let depth = c.hex()? as usize;
        if depth == 0 || depth > stack.len() + 1 {
            return Err(c.err(&format!("depth {depth} after depth {}", stack.len())));
        }
        c.lit(" FN")?;
        let fid = c.hex()? as u32;
        if c.eat("=(F") {
            if p.funcs.contains_key(&fid) {
                return Err(c.err("FN redefined"));
            }
            let file = c.hex()? as u32;
            if c.eat("=(") {
                let path = c.until(")+")?.to_string();
                c.lit(")")?;
                if files.insert(file, path).is_some() {
                    return Err(c.err("F redefined"));
                }
            }
            let path = files
                .get(&file)
                .ok_or_else(|| c.err("F used before definition"))?
                .clone();
            c.lit("+")?;
            let off = c.hex()?;
            c.lit(" N=(")?;
            let name = c.until("))+")?.to_string();
            c.lit("))")?;
            p.funcs.insert(
                fid,
                Func {
                    file: path,
                    object_offset: off,
                    name,
                },
            );
        } else if !p.funcs.contains_key(&fid) {
            return Err(c.err("FN used before definition"));
        }
        c.lit("+")?;
        let sym_offset = c.hex()?;
        let mut values = Vec::new();
        while c.eat(" V") {
            let cid = c.hex()? as u32;
            if c.eat("=(") {
                let name = c.until(")")?.to_string();
                c.lit(")")?;
                if counters.insert(cid, name).is_some() {
                    return Err(c.err("V redefined"));
                }
            }
            let counter = counters
                .get(&cid)
                .ok_or_else(|| c.err("V used before definition"))?
                .clone();
            c.lit(":(")?;
            let ticks = c.hex()?;
            c.lit(",")?;
            let value = c.hex()?;
            c.lit(",")?;
            let peak = c.hex()?;
            c.lit(")")?;
            let mut leaks = Vec::new();
            while c.eat(";LK=(0x") {
                let a = c.hex()?;
                c.lit(",")?;
                let s = c.hex()?;
                c.lit(")")?;
                leaks.push((a, s));
            }
            values.push(Value {
                counter,
                ticks,
                value,
                peak,
                leaks,
            });
        }
        if !c.s.is_empty() {
            return Err(c.err("trailing text"));
        }
        stack.truncate(depth - 1);
        let parent = stack.last().copied();
        p.nodes.push(PNode {
            depth,
            parent,
            func: fid,
            sym_offset,
            values,
        });
        stack.push(p.nodes.len() - 1);
    }
    Ok(p)
}

/// Function names of an object from its symbol table: sorted (start, end, name).
fn symbols_of(path: &str) -> Vec<(u64, u64, String)> {
    let out = Command::new("nm")
        .args(["--defined-only", "-S", path])
        .output();
    let mut v = Vec::new();
    if let Ok(o) = out {
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 4 && matches!(f[2], "T" | "t" | "W" | "w") {
                if let (Ok(a), Ok(s)) =
                    (u64::from_str_radix(f[0], 16), u64::from_str_radix(f[1], 16))
                {
                    v.push((a, a + s.max(1), f[3].to_string()));
                }
            }
        }
    }
    v.sort();
    v
}

/// Names every node's address (object offset -> symbol via nm).
pub struct Namer {
    syms: HashMap<String, Vec<(u64, u64, String)>>,
}

impl Default for Namer {
    fn default() -> Self {
        Self::new()
    }
}

impl Namer {
    pub fn new() -> Self {
        Namer {
            syms: HashMap::new(),
        }
    }

    /// The function name of node `i` of `p`.
    pub fn name(&mut self, p: &Profile, i: usize) -> String {
        let n = &p.nodes[i];
        let f = &p.funcs[&n.func];
        if !f.name.starts_with("@?") {
            return f.name.clone();
        }
        let off = f.object_offset + n.sym_offset;
        let syms = self
            .syms
            .entry(f.file.clone())
            .or_insert_with(|| symbols_of(&f.file));
        // Return addresses point after the call: look up off, then off-1.
        for o in [off, off.wrapping_sub(1)] {
            let idx = syms.partition_point(|s| s.0 <= o);
            if idx > 0 && o < syms[idx - 1].1 {
                return syms[idx - 1].2.clone();
            }
        }
        // No symbol table (e.g. a stripped libc): name it by object and offset,
        // which is stable across runs (the absolute address is not).
        let base = f.file.rsplit('/').next().unwrap_or(&f.file);
        format!("{base}+{off:x}")
    }
}

/// Per leaf-path statistics of one counter: for each node with that counter,
/// the function names from the outermost caller to it, and its ticks.
pub fn paths(p: &Profile, counter: &str) -> Vec<(Vec<String>, u64)> {
    path_values(p, counter)
        .into_iter()
        .map(|(path, ticks, _)| (path, ticks))
        .collect()
}

/// Like [`paths`], with both the ticks and the value of the counter.
pub fn path_values(p: &Profile, counter: &str) -> Vec<(Vec<String>, u64, u64)> {
    let mut namer = Namer::new();
    let mut names: Vec<String> = Vec::with_capacity(p.nodes.len());
    for i in 0..p.nodes.len() {
        names.push(namer.name(p, i));
    }
    let mut out = Vec::new();
    for (i, n) in p.nodes.iter().enumerate() {
        for v in n.values.iter().filter(|v| v.counter == counter) {
            let mut path = Vec::new();
            let mut j = Some(i);
            while let Some(k) = j {
                path.push(names[k].clone());
                j = p.nodes[k].parent;
            }
            path.reverse();
            out.push((path, v.ticks, v.value));
        }
    }
    out
}

/// Four standard deviations, in points, of a share of `want` percent
/// among `n` samples taken at random: how far chance alone may put a
/// sampled share (beyond it, once in about 16,000 runs).
pub fn sampling_tolerance(want: f64, n: u64) -> f64 {
    let p = want / 100.0;
    4.0 * 100.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt()
}

/// Cumulative share (percent of all ticks) of every function name.
pub fn cumulative_shares(p: &Profile, counter: &str) -> BTreeMap<String, f64> {
    let ps = paths(p, counter);
    let total: u64 = ps.iter().map(|x| x.1).sum();
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for (path, t) in &ps {
        let mut seen: Vec<&String> = Vec::new();
        for n in path {
            if !seen.contains(&n) {
                seen.push(n);
                *m.entry(n.clone()).or_default() += t;
            }
        }
    }
    m.into_iter()
        .map(|(k, v)| (k, 100.0 * v as f64 / total.max(1) as f64))
        .collect()
}

/// Sum of one counter's (ticks, value) over the nodes at or below any
/// frame of function `func` (self values, so each node counts once).
pub fn under(p: &Profile, counter: &str, func: &str) -> (u64, u64) {
    let mut namer = Namer::new();
    let names: Vec<String> = (0..p.nodes.len()).map(|i| namer.name(p, i)).collect();
    let (mut ticks, mut value) = (0, 0);
    for (i, n) in p.nodes.iter().enumerate() {
        for v in n.values.iter().filter(|v| v.counter == counter) {
            let mut j = Some(i);
            while let Some(k) = j {
                if names[k] == func {
                    ticks += v.ticks;
                    value += v.value;
                    break;
                }
                j = p.nodes[k].parent;
            }
        }
    }
    (ticks, value)
}

/// What tests/programs/dlopen_rss.c printed ("rss EARLY END peak PEAK"):
/// its anonymous resident set after 100 rounds and at the end, and its
/// peak resident set, in kB.
pub fn dlopen_rss_kb(stdout: &[u8]) -> [i64; 3] {
    let text = String::from_utf8_lossy(stdout);
    let f: Vec<i64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    f.try_into()
        .unwrap_or_else(|_| panic!("not dlopen_rss's line: {text:?}"))
}

/// Milliseconds every CPU of this machine lost to its hypervisor so far
/// (the steal time of /proc/stat; 0 where there is none). A perf
/// task-clock event times a thread on the CPU by the wall clock, so its
/// samples count time the hypervisor took while the thread's own CPU clock
/// does not: a test comparing the two allows for what was stolen meanwhile.
pub fn steal_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: f64 = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no memory preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks * 1000.0 / hz
}

/// Total ticks of a counter.
pub fn total(p: &Profile, counter: &str) -> u64 {
    p.nodes
        .iter()
        .flat_map(|n| n.values.iter())
        .filter(|v| v.counter == counter)
        .map(|v| v.ticks)
        .sum()
}

/// Asserts the run succeeded and returns stderr as text.
pub fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "run failed: {:?}\nstdout: {}\nstderr: {err}",
        o.status,
        String::from_utf8_lossy(&o.stdout)
    );
    err
}

/// The igprof arguments of the dump-signal check: sleep_burn sends itself
/// the dump signal (and calls igprof_dump_now) while burning.
pub const DUMP_NOW_ARGS: &[&str] = &[
    "-pp",
    "-d",
    "-i",
    "1ms",
    "-o",
    "final.gz",
    "./sleep_burn",
    "42",
];

/// Checks a run of [`DUMP_NOW_ARGS`] in `d`: igprof_dump_now wrote
/// snapshot.gz (mostly burner's CPU), the dump signal wrote final.gz and said
/// so, and both profiles parse.
pub fn check_dump_now(d: &Path, o: &Output) {
    let err = ok(o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("dump_now 0"),
        "{o:?}"
    );
    let snap = parse_strict(&read_text(&d.join("snapshot.gz"))).unwrap();
    let burner = cumulative_shares(&snap, "PERF_TICKS")
        .get("burner")
        .copied()
        .unwrap_or(0.0);
    // 400 ms of burner's CPU against the CPU of everything else the program
    // ran before the snapshot: a few ms natively, and up to 10% under qemu,
    // whose first run of each piece of code (the sleep, the print) costs
    // translation time. A wall-clock profile would give burner about half.
    assert!(burner > 80.0, "burner {burner:.1}% of the snapshot");
    assert!(
        err.contains(&format!("dump written to {}", d.join("final.gz").display())),
        "the dump signal wrote a profile: {err}"
    );
    parse_strict(&read_text(&d.join("final.gz"))).unwrap();
}

/// One row of a flat profile: the value, and the calls when the counter
/// has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlatRow {
    pub pct: f64,
    pub value: u64,
    pub calls: Option<u64>,
}

/// `igprof-analyse -d -r counter` on `profile`: the rows of its flat
/// cumulative profile by (demangled) function name.
pub fn flat_cumulative(dir: &Path, counter: &str, profile: &str) -> BTreeMap<String, FlatRow> {
    let o = Command::new(analyser())
        .args(["-d", "-r", counter, profile])
        .current_dir(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "igprof-analyse: {text}");
    let section = text
        .split("Flat profile (cumulative")
        .nth(1)
        .and_then(|s| s.split("-----").next())
        .unwrap_or_else(|| panic!("no flat cumulative profile: {text}"));
    let with_calls = section.lines().any(|l| l.contains("Calls"));
    let mut rows = BTreeMap::new();
    for l in section.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(pct) = f.first().and_then(|x| x.parse::<f64>().ok()) else {
            continue;
        };
        let num = |s: &str| s.replace('\'', "").parse::<u64>().ok();
        let (value, calls, name_at) = if with_calls {
            (num(f[1]), num(f[2]), 3)
        } else {
            // PERF_TICKS: seconds with two decimals; the share is the row's.
            (Some(0), None, 2)
        };
        // The name, without its trailing rank ("[7]"); it may hold spaces.
        let name = f[name_at..f.len() - 1].join(" ");
        rows.insert(
            name,
            FlatRow {
                pct,
                value: value.unwrap_or_else(|| panic!("value in {l:?}")),
                calls,
            },
        );
    }
    rows
}

/// The row of `name` (panics naming `what` and the rows there are).
pub fn flat_row<'a>(rows: &'a BTreeMap<String, FlatRow>, name: &str, what: &str) -> &'a FlatRow {
    rows.get(name)
        .unwrap_or_else(|| panic!("{what}: no {name} in {:?}", rows.keys()))
}
