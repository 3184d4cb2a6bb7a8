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
//! Options are parsed by hand, not with clap: IgProf's single-dash long
//! options (`-pp`, `-mo`) and "the first non-option is the program, the
//! rest are its arguments" are simpler so, and the launcher stays small.
#![cfg_attr(not(test), no_main)]

use std::borrow::Cow;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};

mod glibc;
mod sanitizers;

/// `igprof -h` (stdout, exit 0); also on stderr when no program is named.
const USAGE: &str = "\
igprof [options] [--] program [args...]

IgProf's options (as IgProf spells them):
  -pp, --perf-profile        CPU time (per-thread CPU-clock samplers)
  -pu, --perf-user           user CPU time
  -pr, --perf-real           wall-clock time
  -pd, --profile-disabled    start with recording off: the program turns it
                             on with igprof_enable() (and off with
                             igprof_disable()), or --toggle-signal N does
  -pk, --perf-keep           a fork child's profile goes on from its
                             parent's (default: it starts empty)
  -mp, --memory-profile      memory: MEM_TOTAL, MEM_MAX, MEM_LIVE
  -mo, --memory-overhead M   none | include | delta
  -fd, --file-descriptors    FD_USED, FD_LIVE
  -fp:FUNC[:LIB], -fpi:FUNC[:LIB], -fpf:FUNC[:LIB]
                             calls of FUNC counted per calling stack
                             (CALLS_TOTAL): FUNC of the program, or of
                             LIB (also when dlopen'ed later); several
                             allowed; -fpi/-fpf are the same as -fp here
  -j, --jemalloc             accepted: jemalloc (or any allocator defining
                             malloc) is found without it
  -np, --energy-profile      energy: NRG_PKG, NRG_PP0, NRG_PP1, NRG_DRAM
  -ep / -ei / -eu            empty-memory profilers
  -finst                     functions built with -finstrument-functions:
                             CALL_COUNT, CALL_TIME (self nanoseconds) per
                             path of instrumented calls
  -o, --output FILE          profile file (default igprof.<program>.<pid>.gz;
                             %p in FILE becomes the pid; other processes of
                             the run write FILE with .<pid> before .gz)
  -z, --compress             gzip the output (also when FILE ends in .gz)
  -t, --target NAMES         profile only programs whose name contains one of
                             the comma-separated NAMES (others run normally)
  -D, --dump-flag FILE       write the profile whenever FILE appears (then removed)
  -d, --debug                more messages from the profiler
  -h, --help                 this help
igprof-rs's own options:
  -e, --event EVENT[/PERIOD] sample a perf event on every thread (several
                             -e allowed): page-faults, context-switches,
                             cycles:u/100000, cycles/F999 (per second),
                             L1-dcache-load-misses,
                             cpu/event=0xc0,umask=0/, r01c2 (as perf -e);
                             counter EV_<EVENT>, e.g. EV_PAGE_FAULTS
  -pf, --page-faults         page faults per faulting stack: PAGE_FAULTS,
                             MAJOR_FAULTS; with -mp also MEM_FAULTS on the
                             stack that allocated the (64 KiB or larger)
                             heap block the fault is in
  -oc, --off-cpu             time off the CPU per stack where each thread
                             waited: OFFCPU_TIME (switches, nanoseconds)
  -ibs[:TERMS][/PERIOD]      AMD IBS op samples (IbsOpRip as the leaf):
                             IBS_OPS, IBS_LOADS, IBS_DC_MISS, IBS_LOAD_LAT...;
                             with -mp, the data they touch charged to the
                             stack that allocated it: IBS_OBJ_*; TERMS:
                             cnt_ctl, l3missonly, ldlat=N; PERIOD: cycles
                             (ops with cnt_ctl), a multiple of 16
  -ibs-fetch[:TERMS][/PERIOD] AMD IBS fetch samples: IBS_FETCHES,
                             IBS_IC_MISS, IBS_ITLB_MISS, IBS_FETCH_LAT;
                             TERMS: rand_en, l3missonly
  -c, --count EVENT,EVENT... a group of events counted per thread, read at
                             each -pp/-pu/-pr sample and charged to its
                             stack: CNT_<EVENT> (several -c: several groups)
  -i, --interval TIME        sampling interval: 5ms (default), 1ms, 100us...
      --depth N              stack depth limit (default 1024)
      --sampler KIND         how samples are taken: auto (default: sigtrap,
                             else sigprof, else timer), sigtrap (perf event
                             raising SIGTRAP, Linux 5.13+), sigprof (perf
                             event waking SIGPROF), timer (POSIX CPU timers,
                             scheduler-tick resolution)
      --sample-bytes N       with -mp: record a sample of the allocations,
                             one per N allocated bytes on average (512K, 1M,
                             or bytes; 1..16M); each recorded allocation
                             counts for the calls and bytes it stands for,
                             so totals and live bytes are unbiased estimates
                             and only recorded allocations walk the stack
      --sample-seed S        seed of that sampling (0..2^64-1; random by
                             default; the profile header names the seed used)
      --dump-signal N        signal that writes the profile (default 42 =
                             SIGRTMIN+8; 0 disables): kill -42 <pid>
      --dump-every TIME      also write the profile every TIME (60 = seconds,
                             10s, 500ms), so a run killed by SIGKILL keeps
                             its last snapshot (SIGTERM, SIGINT and other
                             fatal signals write the profile themselves)
      --toggle-signal N      each signal N turns recording off or on
                             (default: none), e.g. with -pd
Environment: IGPROF_LIB=/path/to/libigprof.so overrides the library search
(next to this program, as in the build tree's target/release, ../lib, then
$CARGO_TARGET_DIR/release).
A program of another architecture (AArch64 on x86-64, or the reverse) runs
under qemu-user (qemu-<arch> -L $QEMU_LD_PREFIX or /usr/<arch>-linux-gnu)
with the library built for it: IGPROF_LIB_AARCH64 / IGPROF_LIB_X86_64, else
<arch>/libigprof.so next to this program, else the build tree's
target/<arch>-unknown-linux-gnu/release (cargo build --release --target ...).
IGPROF_CACHE_DIR=DIR keeps what processes share (frame descriptors derived
once per object build-id, the hooked functions' plans) in DIR/unwind instead
of $XDG_CACHE_HOME/igprof-rs/unwind or ~/.cache/igprof-rs/unwind; none: off.
";

/// PATH when it is unset: bash's default, which the shell launcher used.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin:.";

/// Why the launcher refuses to run the program: each is one line,
/// `igprof: <message>`, on stderr, and exit status 127.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// An option that takes a value came last.
    NeedsValue(Vec<u8>),
    /// `-mo` with another value than none, include or delta.
    BadOverhead(Vec<u8>),
    /// `-fp:`, `-fpi:` or `-fpf:` without a function name, or with a
    /// character IGPROF cannot carry.
    BadFunction(Vec<u8>),
    /// A value with `'` for an option whose value IGPROF quotes (the option).
    Quote(Vec<u8>),
    BadSampleBytes(Vec<u8>),
    BadSampleSeed(Vec<u8>),
    BadSampler(Vec<u8>),
    /// `-e` with a specification that does not parse (the parser's message).
    BadEvent(String),
    /// An `-ibs` or `-ibs-fetch` option that does not parse (the reason
    /// names the option).
    BadIbs(String),
    UnknownOption(Vec<u8>),
    SampleWithoutMp,
    /// `-c` without a CPU profiler, whose samples read the counters.
    CountWithoutSamples,
    SampleWithEmpty,
    SeedWithoutSample,
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
            NeedsValue(o) => cat(&[b"option ", o, b" needs a value (see igprof -h)"]),
            BadOverhead(v) => cat(&[b"-mo: '", v, b"' is not none, include or delta"]),
            BadFunction(w) => cat(&[b"'", w, b"': give a function name, e.g. -fp:malloc or -fp:deflate:libz.so.1"]),
            Quote(o) => cat(&[o, b": a value containing ' cannot be passed"]),
            BadSampleBytes(v) => cat(&[
                b"--sample-bytes '",
                v,
                b"': give the mean number of bytes between samples, from 1 to 16M (K = 1024), e.g. --sample-bytes 512K",
            ]),
            BadSampleSeed(v) => cat(&[
                b"--sample-seed '",
                v,
                b"': give a decimal number from 0 to 18446744073709551615",
            ]),
            BadSampler(v) => cat(&[b"--sampler: '", v, b"' is not auto, sigtrap, sigprof or timer"]),
            BadEvent(why) => cat(&[b"-e: ", why.as_bytes()]),
            BadIbs(why) => why.as_bytes().to_vec(),
            UnknownOption(o) => cat(&[b"unknown option '", o, b"' (see igprof -h)"]),
            CountWithoutSamples => {
                b"-c counts beside the CPU samples, which read the counters: add -pp (or -pu, -pr)".to_vec()
            }
            SampleWithoutMp => {
                b"--sample-bytes samples the memory profiler's allocations: add -mp".to_vec()
            }
            SampleWithEmpty => b"--sample-bytes cannot be combined with -ep/-ei/-eu (they inspect every block): drop one of them".to_vec(),
            SeedWithoutSample => {
                b"--sample-seed seeds the allocation sampler: add --sample-bytes N".to_vec()
            }
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

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Help,
    /// No program named: the usage on stderr, exit status 127.
    NoProgram,
    /// Run `args[program..]` with `IGPROF=igprof`.
    Run {
        igprof: Vec<u8>,
        program: usize,
        /// -o's path, made absolute (checked by [`output_place`] before
        /// the run).
        output: Option<Vec<u8>>,
    },
}

/// Translates the options (`args`, without argv[0]) into IGPROF's words,
/// joined by single spaces; `pwd` gives the directory relative -o and -D
/// paths are made absolute against (the program's processes may run in
/// other directories and must write where the user asked).
fn parse(args: &[OsString], pwd: &mut dyn FnMut() -> Vec<u8>) -> Result<Request, Refusal> {
    let mut words: Vec<Cow<[u8]>> = Vec::with_capacity(args.len());
    let mut output = None;
    let (mut sampled, mut seeded, mut counted) = (false, false, false);
    let mut i = 0;
    while i < args.len() {
        let opt = args[i].as_bytes();
        let value = || match args.get(i + 1) {
            Some(v) => Ok(v.as_bytes()),
            None => Err(Refusal::NeedsValue(opt.to_vec())),
        };
        let no_quote = |v: &[u8]| match v.contains(&b'\'') {
            true => Err(Refusal::Quote(opt.to_vec())),
            false => Ok(()),
        };
        match opt {
            b"-h" | b"--help" => return Ok(Request::Help),
            b"-pp"
            | b"--perf-profile"
            | b"-pu"
            | b"--perf-user"
            | b"-pr"
            | b"--perf-real"
            | b"-mp"
            | b"--memory-profile"
            | b"-fd"
            | b"--file-descriptors"
            | b"-np"
            | b"--energy-profile"
            | b"-ep"
            | b"-ei"
            | b"-eu"
            | b"-pd"
            | b"--profile-disabled"
            | b"-pk"
            | b"--perf-keep"
            | b"-j"
            | b"--jemalloc"
            | b"-finst"
            | b"-pf"
            | b"--page-faults"
            | b"-oc"
            | b"--off-cpu"
            | b"-z"
            | b"--compress"
            | b"-d"
            | b"--debug" => {
                words.push(opt.into());
                i += 1;
                continue;
            }
            w if [&b"-fp:"[..], b"-fpi:", b"-fpf:"]
                .iter()
                .any(|p| w.starts_with(p)) =>
            {
                let func = &w[w.iter().position(|&b| b == b':').map_or(0, |p| p + 1)..];
                if func.is_empty()
                    || func.starts_with(b":")
                    || w.iter().any(|b| b.is_ascii_whitespace() || *b == b'\'')
                {
                    return Err(Refusal::BadFunction(w.to_vec()));
                }
                words.push(w.into());
                i += 1;
                continue;
            }
            w if w.starts_with(b"-ibs") => {
                let text = std::str::from_utf8(w).map_err(|_| {
                    Refusal::BadEvent(format!("'{}' is not text", String::from_utf8_lossy(w)))
                })?;
                igprof_events::ibs::parse_request(text).map_err(Refusal::BadIbs)?;
                words.push(w.into());
                i += 1;
                continue;
            }
            b"-mo" | b"--memory-overhead" => {
                let v = value()?;
                if !matches!(v, b"none" | b"include" | b"delta") {
                    return Err(Refusal::BadOverhead(v.to_vec()));
                }
                words.extend([b"-mo"[..].into(), v.into()]);
            }
            b"-o" | b"--output" | b"-D" | b"--dump-flag" => {
                let v = value()?;
                no_quote(v)?;
                let path = if v.starts_with(b"/") {
                    v.to_vec()
                } else {
                    [&pwd()[..], b"/", v].concat()
                };
                if matches!(opt, b"-o" | b"--output") {
                    output = Some(path.clone());
                }
                words.extend([opt.into(), [b"'", &path[..], b"'"].concat().into()]);
            }
            b"-t" | b"--target" => {
                let v = value()?;
                no_quote(v)?;
                words.extend([opt.into(), [b"'", v, b"'"].concat().into()]);
            }
            b"-i" | b"--interval" => words.extend([b"--interval"[..].into(), value()?.into()]),
            b"--depth" | b"--dump-signal" | b"--dump-every" | b"--toggle-signal" => {
                words.extend([opt.into(), value()?.into()])
            }
            b"--sample-bytes" => {
                let v = value()?;
                if !sample_bytes_ok(v) {
                    return Err(Refusal::BadSampleBytes(v.to_vec()));
                }
                words.extend([opt.into(), v.into()]);
                sampled = true;
            }
            b"--sample-seed" => {
                let v = value()?;
                if !sample_seed_ok(v) {
                    return Err(Refusal::BadSampleSeed(v.to_vec()));
                }
                words.extend([opt.into(), v.into()]);
                seeded = true;
            }
            b"-e" | b"--event" => {
                let v = value()?;
                let text = std::str::from_utf8(v).map_err(|_| {
                    Refusal::BadEvent(format!("'{}' is not text", String::from_utf8_lossy(v)))
                })?;
                igprof_events::parse(text).map_err(|e| Refusal::BadEvent(e.to_string()))?;
                words.extend([b"-e"[..].into(), v.into()]);
            }
            b"-c" | b"--count" => {
                let v = value()?;
                let text = std::str::from_utf8(v).map_err(|_| {
                    Refusal::BadEvent(format!("'{}' is not text", String::from_utf8_lossy(v)))
                })?;
                for spec in igprof_events::split_list(text) {
                    let s =
                        igprof_events::parse(spec).map_err(|e| Refusal::BadEvent(e.to_string()))?;
                    if s.period.is_some() {
                        return Err(Refusal::BadEvent(format!(
                            "event '{spec}': a counted event (-c) takes no period"
                        )));
                    }
                }
                words.extend([b"-c"[..].into(), v.into()]);
                counted = true;
            }
            b"--sampler" => {
                let v = value()?;
                if !matches!(v, b"auto" | b"sigtrap" | b"sigprof" | b"timer") {
                    return Err(Refusal::BadSampler(v.to_vec()));
                }
                words.extend([opt.into(), v.into()]);
            }
            b"--" => {
                i += 1;
                break;
            }
            _ if opt.starts_with(b"-") => return Err(Refusal::UnknownOption(opt.to_vec())),
            _ => break,
        }
        i += 2;
    }
    if i >= args.len() {
        return Ok(Request::NoProgram);
    }
    // Whether one of the words is one of `names` (the shell launcher looked
    // for " word " in " names... ", values included, and so does this).
    let has = |names: &[u8]| {
        let hay = [b" ", names, b" "].concat();
        words
            .iter()
            .any(|w| contains(&hay, &[b" ", &w[..], b" "].concat()))
    };
    if counted && !has(b"-pp --perf-profile -pu --perf-user -pr --perf-real") {
        return Err(Refusal::CountWithoutSamples);
    }
    if sampled {
        if !has(b"-mp --memory-profile") {
            return Err(Refusal::SampleWithoutMp);
        }
        if has(b"-ep -ei -eu") {
            return Err(Refusal::SampleWithEmpty);
        }
    } else if seeded {
        return Err(Refusal::SeedWithoutSample);
    }
    Ok(Request::Run {
        igprof: words.join(&b' '),
        program: i,
        output,
    })
}

/// The `--sample-bytes` rule (the library's): 1 to 12 digits, optionally
/// K/k/KiB/kiB (KiB), M/m/MiB (MiB) or G/g/GiB (GiB), from 1 byte to 16 MiB.
fn sample_bytes_ok(v: &[u8]) -> bool {
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    if !(1..=12).contains(&digits) {
        return false;
    }
    let shift = match &v[digits..] {
        b"" => 0,
        b"K" | b"k" | b"KiB" | b"kiB" => 10,
        b"M" | b"m" | b"MiB" => 20,
        b"G" | b"g" | b"GiB" => 30,
        _ => return false,
    };
    let n = v[..digits]
        .iter()
        .fold(0u128, |n, d| n * 10 + u128::from(d - b'0'));
    (1..=16 << 20).contains(&(n << shift))
}

/// The `--sample-seed` rule: a decimal number of 1 to 20 digits that fits
/// in 64 bits (leading zeros allowed).
fn sample_seed_ok(v: &[u8]) -> bool {
    (1..=20).contains(&v.len())
        && v.iter().all(u8::is_ascii_digit)
        && (v.len() < 20 || v < &b"18446744073709551616"[..])
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
    let (igprof, program) = match parse(&args, &mut pwd) {
        Ok(Request::Help) => {
            write_fd(1, USAGE.as_bytes());
            return 0;
        }
        Ok(Request::NoProgram) => {
            write_fd(2, USAGE.as_bytes());
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

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    fn parse_in(a: &[&str], dir: &str) -> Result<Request, Refusal> {
        parse(&args(a), &mut || dir.as_bytes().to_vec())
    }

    /// IGPROF for `a`, run in /w.
    fn igprof_of(a: &[&str]) -> String {
        match parse_in(a, "/w") {
            Ok(Request::Run { igprof, .. }) => String::from_utf8(igprof).unwrap(),
            other => panic!("{a:?}: {other:?}"),
        }
    }

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

    fn refusal_of(a: &[&str]) -> String {
        match parse_in(a, "/w") {
            Err(r) => String::from_utf8(r.message()).unwrap(),
            other => panic!("{a:?}: {other:?}"),
        }
    }

    #[test]
    fn igprofs_phase_fork_jemalloc_and_function_options_pass_through() {
        assert_eq!(
            igprof_of(&["-pd", "-pk", "-j", "-pp", "p"]),
            "-pd -pk -j -pp"
        );
        assert_eq!(
            igprof_of(&[
                "--toggle-signal",
                "43",
                "-fp:malloc",
                "-fpi:f:libm.so.6",
                "p"
            ]),
            "--toggle-signal 43 -fp:malloc -fpi:f:libm.so.6"
        );
        for bad in ["-fp:", "-fpf::libc.so.6"] {
            assert_eq!(
                refusal_of(&[bad, "p"]),
                format!("'{bad}': give a function name, e.g. -fp:malloc or -fp:deflate:libz.so.1")
            );
        }
        // The old floating-point exception placeholder is gone from -fp.
        assert_eq!(
            refusal_of(&["-fp", "p"]),
            "unknown option '-fp' (see igprof -h)"
        );
    }

    #[test]
    fn options_become_igprof_words() {
        assert_eq!(
            igprof_of(&[
                "-pp", "-o", "x.gz", "-t", "a,b", "-i", "1ms", "--depth", "5", "prog", "-mp"
            ]),
            "-pp -o '/w/x.gz' -t 'a,b' --interval 1ms --depth 5"
        );
        assert_eq!(
            igprof_of(&[
                "--memory-profile",
                "--memory-overhead",
                "delta",
                "--output",
                "/abs/p.gz",
                "-D",
                "flag",
                "p"
            ]),
            "--memory-profile -mo delta --output '/abs/p.gz' -D '/w/flag'"
        );
        assert_eq!(
            igprof_of(&["-mp", "--sample-bytes", "512K", "--sample-seed", "18446744073709551615", "--sampler", "timer", "--dump-signal", "0", "--dump-every", "10s", "--", "-p"]),
            "-mp --sample-bytes 512K --sample-seed 18446744073709551615 --sampler timer --dump-signal 0 --dump-every 10s"
        );
        assert_eq!(igprof_of(&["prog"]), "");
        assert_eq!(igprof_of(&["--target", "", "-z", "p"]), "--target '' -z");
        // The program is the first non-option; "--" ends the options.
        assert_eq!(
            parse_in(&["-pp", "--", "-x", "y"], "/w"),
            Ok(Request::Run {
                igprof: b"-pp".to_vec(),
                program: 2,
                output: None,
            })
        );
        assert_eq!(
            parse_in(&["-fd", "ls", "-pp"], "/w"),
            Ok(Request::Run {
                igprof: b"-fd".to_vec(),
                program: 1,
                output: None
            })
        );
        assert_eq!(parse_in(&["-pp", "-h", "-bogus"], "/w"), Ok(Request::Help));
        assert_eq!(parse_in(&["-pp"], "/w"), Ok(Request::NoProgram));
        assert_eq!(parse_in(&["-pp", "--"], "/w"), Ok(Request::NoProgram));
        assert_eq!(
            parse_in(&["-pp", "--sample-bytes", "1K"], "/w"),
            Ok(Request::NoProgram)
        );
    }

    #[test]
    fn bad_options_are_refused_with_the_launchers_messages() {
        for (a, says) in [
            (&["-pq", "p"][..], "unknown option '-pq' (see igprof -h)"),
            (&["-", "p"], "unknown option '-' (see igprof -h)"),
            (&["-pp", "-o"], "option -o needs a value (see igprof -h)"),
            (&["--depth"], "option --depth needs a value (see igprof -h)"),
            (&["--memory-overhead", "all", "p"], "-mo: 'all' is not none, include or delta"),
            (&["--output", "it's.gz", "p"], "--output: a value containing ' cannot be passed"),
            (&["-t", "a'b", "p"], "-t: a value containing ' cannot be passed"),
            (&["--sampler", "perf", "p"], "--sampler: 'perf' is not auto, sigtrap, sigprof or timer"),
            (&["-mp", "--sample-bytes", "0", "p"], "--sample-bytes '0': give the mean number of bytes between samples, from 1 to 16M (K = 1024), e.g. --sample-bytes 512K"),
            (&["-mp", "--sample-seed", "18446744073709551616", "p"], "--sample-seed '18446744073709551616': give a decimal number from 0 to 18446744073709551615"),
            (&["-pp", "--sample-bytes", "1K", "p"], "--sample-bytes samples the memory profiler's allocations: add -mp"),
            (&["-mp", "-eu", "--sample-bytes", "1K", "p"], "--sample-bytes cannot be combined with -ep/-ei/-eu (they inspect every block): drop one of them"),
            (&["-mp", "--sample-seed", "1", "p"], "--sample-seed seeds the allocation sampler: add --sample-bytes N"),
        ] {
            assert_eq!(refusal_of(a), says, "{a:?}");
        }
        // The shell launcher's check saw values too: --depth -mp counts.
        assert!(matches!(
            parse_in(&["--depth", "-mp", "--sample-bytes", "1K", "p"], "/w"),
            Ok(Request::Run { .. })
        ));
    }

    #[test]
    fn sample_bytes_rule() {
        for ok in [
            "1",
            "512K",
            "512k",
            "1KiB",
            "3kiB",
            "16M",
            "16m",
            "16MiB",
            "16384K",
            "16777216",
            "000000000001",
        ] {
            assert!(sample_bytes_ok(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "0",
            "0K",
            "16777217",
            "17M",
            "1G",
            "1g",
            "1GiB",
            "K",
            "1KB",
            "1 K",
            "-1",
            "1.5K",
            "0000000000001",
            "999999999999G",
            "1Mib",
            "+1",
        ] {
            assert!(!sample_bytes_ok(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn sample_seed_rule() {
        for ok in [
            "0",
            "42",
            "18446744073709551615",
            "00000000000000000001",
            "9999999999999999999",
        ] {
            assert!(sample_seed_ok(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "-1",
            "18446744073709551616",
            "99999999999999999999",
            "000000000000000000001",
            "1e3",
            "0x10",
        ] {
            assert!(!sample_seed_ok(bad.as_bytes()), "{bad}");
        }
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
