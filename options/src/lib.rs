//! The profiler's options in one table: for each option its spellings,
//! value kind and accepted range, help line and owning module ([`TABLE`]).
//!
//! Three readers walk it: the launcher's parser (command line into the
//! `IGPROF` words), the launcher's usage text ([`write_usage`]) and the
//! library's parser (`IGPROF` at start-up, igprof-rs `base/options.rs`).
//! Both parsers check every value and every combination through one
//! [`Checker`], so whatever the library would refuse, the launcher refuses
//! before the program runs. Adding an option is one [`Opt`] entry here
//! (plus a [`Id`] variant) and the owning module's use of the value.
//!
//! What it owns: the grammar of one option word and its value (spellings,
//! numbers with units, sizes with binary suffixes, signal numbers, choices),
//! the limits of the library's fixed storage, the rules between options,
//! and the messages of a refusal.
//!
//! What it must never do: allocate, panic or use anything beyond `core`
//! (the library parses in its constructor, before its allocator is ready),
//! or know how a module uses a value (the parsers map an [`Id`] to it).
//! Grammars of their own (perf event specifications, IBS terms) belong to
//! the events crate, which the launcher consults after this table.
#![no_std]

use core::fmt;

/// Which option an entry is: what the parsers dispatch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Id {
    Help,
    PerfCpu,
    PerfUser,
    PerfReal,
    ProfileDisabled,
    PerfKeep,
    Mem,
    MemOverhead,
    Fd,
    Mmap,
    Functions,
    Jemalloc,
    Jit,
    Marks,
    MarkEvery,
    MarkSignal,
    SnapshotAbove,
    Energy,
    EmptyEp,
    EmptyEi,
    EmptyEu,
    Finst,
    Output,
    Compress,
    Target,
    DumpFlag,
    Debug,
    Event,
    PageFaults,
    OffCpu,
    Ibs,
    Count,
    Interval,
    Depth,
    Sampler,
    SampleBytes,
    SampleSeed,
    DumpSignal,
    DumpEvery,
    SampleEvery,
    ToggleSignal,
}

/// Number of [`Id`]s.
const IDS: usize = Id::ToggleSignal as usize + 1;
// The checker keeps one bit per id in a u64.
const _: () = assert!(IDS <= 64);

/// What follows an option, and which values it accepts.
#[derive(Clone, Copy, Debug)]
pub enum Value {
    /// Nothing: the option alone.
    Flag,
    /// The word itself carries the value after its prefix
    /// (`-fp:FUNC[:LIB]`): a function name, then an optional library.
    Function,
    /// The word itself carries the value after its prefix (`-ibs...`);
    /// its terms are the events crate's grammar.
    Ibs,
    /// One of these words; parsed as its index.
    Choice(&'static [&'static str]),
    /// A time with unit (`ns`, `us`, `ms`, `s`, decimals allowed), a bare
    /// number counting `bare_ns`; from `min_ns` to `max_ns`.
    Time {
        bare_ns: u64,
        min_ns: u64,
        max_ns: u64,
    },
    /// A decimal number (up to 18 digits) from `min` to `max`, none of `except`.
    Number {
        min: u64,
        max: u64,
        except: &'static [u64],
    },
    /// A byte count with an optional binary suffix (`512K`, `1MiB`), from
    /// `min` to `max`.
    Bytes { min: u64, max: u64 },
    /// Any decimal number that fits in 64 bits.
    U64,
    /// A path of at most `PATH_MAX` bytes (the launcher makes it absolute).
    Path,
    /// Names: several accumulate, comma-separated.
    Names,
    /// A word without blanks: several accumulate (e.g. `-e` specifications).
    Word,
}

/// Where an option is listed in the usage text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// IgProf's own options, spelt as IgProf spells them.
    IgProf,
    /// Options igprof-rs added.
    Own,
}

/// The module that owns an option's value: what the help line is for.
pub type Module = &'static str;

/// The launcher itself (`-h`): the library knows no such option.
pub const LAUNCHER: Module = "launcher";

/// One option.
#[derive(Debug)]
pub struct Opt {
    pub id: Id,
    /// Its spellings, the one messages name for a prefix first. For
    /// [`Value::Function`] and [`Value::Ibs`] they are prefixes of the word.
    pub names: &'static [&'static str],
    /// The value's name in the usage text ("" for none).
    pub arg: &'static str,
    pub value: Value,
    /// What a refused value should have been ("16 to 65536").
    pub expected: &'static str,
    /// The usage text's lines for it (without the spellings).
    pub help: &'static [&'static str],
    pub section: Section,
    pub module: Module,
}

/// The signal `igprof --mark PID` sends by default (SIGRTMIN+9; the dump
/// signal is SIGRTMIN+8).
pub const DEFAULT_MARK_SIGNAL: i32 = 43;
/// The value `igprof --mark` sends with its signal (sigqueue): a process
/// answers only a mark that carries it, so a plain `kill` gets no signal
/// back.
pub const MARK_MAGIC: i32 = 0x1670_f001;

/// Longest path the library stores (without its NUL).
pub const PATH_MAX: usize = 4095;
/// Longest list of accumulated words (`-t`, `-e`, `-c`, `-fp`, `-ibs`),
/// separators included, that the library stores.
pub const LIST_MAX: usize = 1023;
/// Largest `--sample-bytes`: a sampled block's call estimate (up to N)
/// must fit the 24 bits the live table keeps for it (modules/mem/sample).
pub const MAX_SAMPLE_BYTES: u64 = 16 << 20;

const SIGNAL_EXCEPT: &[u64] = &[9, 19, 27];

/// Every option, in the order of the usage text.
pub static TABLE: &[Opt] = &[
    Opt {
        id: Id::PerfCpu,
        names: &["-pp", "--perf-profile"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["CPU time (per-thread CPU-clock samplers)"],
        section: Section::IgProf,
        module: "cpu",
    },
    Opt {
        id: Id::PerfUser,
        names: &["-pu", "--perf-user"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["user CPU time"],
        section: Section::IgProf,
        module: "cpu",
    },
    Opt {
        id: Id::PerfReal,
        names: &["-pr", "--perf-real"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["wall-clock time"],
        section: Section::IgProf,
        module: "cpu",
    },
    Opt {
        id: Id::ProfileDisabled,
        names: &["-pd", "--profile-disabled"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "start with recording off: the program turns it",
            "on with igprof_enable() (and off with",
            "igprof_disable()), or --toggle-signal N does",
        ],
        section: Section::IgProf,
        module: "process",
    },
    Opt {
        id: Id::PerfKeep,
        names: &["-pk", "--perf-keep"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "a fork child's profile goes on from its",
            "parent's (default: it starts empty)",
        ],
        section: Section::IgProf,
        module: "process",
    },
    Opt {
        id: Id::Mem,
        names: &["-mp", "--memory-profile"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["memory: MEM_TOTAL, MEM_MAX, MEM_LIVE"],
        section: Section::IgProf,
        module: "mem",
    },
    Opt {
        id: Id::MemOverhead,
        names: &["-mo", "--memory-overhead"],
        arg: "M",
        value: Value::Choice(&["none", "include", "delta"]),
        expected: "none, include or delta",
        help: &["none | include | delta"],
        section: Section::IgProf,
        module: "mem",
    },
    Opt {
        id: Id::Fd,
        names: &["-fd", "--file-descriptors"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["FD_USED, FD_LIVE"],
        section: Section::IgProf,
        module: "fd",
    },
    Opt {
        id: Id::Mmap,
        names: &["-mm", "--mmap-profile"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["anonymous mappings: MMAP_TOTAL, MMAP_LIVE"],
        section: Section::IgProf,
        module: "mmap",
    },
    Opt {
        id: Id::Functions,
        names: &["-fp:", "-fpi:", "-fpf:"],
        arg: "FUNC[:LIB]",
        value: Value::Function,
        expected: "a function name, e.g. -fp:malloc or -fp:deflate:libz.so.1",
        help: &[
            "calls of FUNC counted per calling stack",
            "(CALLS_TOTAL): FUNC of the program, or of",
            "LIB (also when dlopen'ed later); several",
            "allowed; -fpi/-fpf are the same as -fp here",
        ],
        section: Section::IgProf,
        module: "calls",
    },
    Opt {
        id: Id::Jemalloc,
        names: &["-j", "--jemalloc"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "accepted: jemalloc (or any allocator defining",
            "malloc) is found without it",
        ],
        section: Section::IgProf,
        module: "mem",
    },
    Opt {
        id: Id::Energy,
        names: &["-np", "--energy-profile"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["energy: NRG_PKG, NRG_PP0, NRG_PP1, NRG_DRAM"],
        section: Section::IgProf,
        module: "energy",
    },
    Opt {
        id: Id::EmptyEp,
        names: &["-ep"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["empty memory: bytes in still-zero pages at free"],
        section: Section::IgProf,
        module: "mem",
    },
    Opt {
        id: Id::EmptyEi,
        names: &["-ei"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["empty memory: new blocks filled, zero pages", "counted"],
        section: Section::IgProf,
        module: "mem",
    },
    Opt {
        id: Id::EmptyEu,
        names: &["-eu"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "empty memory: new blocks filled, pages still",
            "holding the pattern counted",
        ],
        section: Section::IgProf,
        module: "mem",
    },
    Opt {
        id: Id::Finst,
        names: &["-finst"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "functions built with -finstrument-functions:",
            "CALL_COUNT, CALL_TIME (self nanoseconds) per",
            "path of instrumented calls",
        ],
        section: Section::IgProf,
        module: "finst",
    },
    Opt {
        id: Id::Output,
        names: &["-o", "--output"],
        arg: "FILE",
        value: Value::Path,
        expected: "a path shorter than 4096 bytes",
        help: &[
            "profile file (default igprof.<program>.<pid>.gz;",
            "%p in FILE becomes the pid; other processes of",
            "the run write FILE with .<pid> before .gz)",
        ],
        section: Section::IgProf,
        module: "output",
    },
    Opt {
        id: Id::Compress,
        names: &["-z", "--compress"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["gzip the output (also when FILE ends in .gz)"],
        section: Section::IgProf,
        module: "output",
    },
    Opt {
        id: Id::Target,
        names: &["-t", "--target"],
        arg: "NAMES",
        value: Value::Names,
        expected: "names under 1024 bytes in all",
        help: &[
            "profile only programs whose name contains one of",
            "the comma-separated NAMES (others run normally)",
        ],
        section: Section::IgProf,
        module: "process",
    },
    Opt {
        id: Id::DumpFlag,
        names: &["-D", "--dump-flag"],
        arg: "FILE",
        value: Value::Path,
        expected: "a path shorter than 4096 bytes",
        help: &["write the profile whenever FILE appears (then", "removed)"],
        section: Section::IgProf,
        module: "process",
    },
    Opt {
        id: Id::Debug,
        names: &["-d", "--debug"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["more messages from the profiler"],
        section: Section::IgProf,
        module: "base",
    },
    Opt {
        id: Id::Help,
        names: &["-h", "--help"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &["this help"],
        section: Section::IgProf,
        module: LAUNCHER,
    },
    Opt {
        id: Id::Event,
        names: &["-e", "--event"],
        arg: "EVENT[/PERIOD]",
        value: Value::Word,
        expected: "event specifications under 1024 bytes in all, without spaces",
        help: &[
            "sample a perf event on every thread (several",
            "-e allowed): page-faults, context-switches,",
            "cycles:u/100000, cycles/F999 (per second),",
            "L1-dcache-load-misses,",
            "cpu/event=0xc0,umask=0/, r01c2 (as perf -e);",
            "counter EV_<EVENT>, e.g. EV_PAGE_FAULTS",
        ],
        section: Section::Own,
        module: "event",
    },
    Opt {
        id: Id::PageFaults,
        names: &["-pf", "--page-faults"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "page faults per faulting stack: PAGE_FAULTS,",
            "MAJOR_FAULTS; with -mp also MEM_FAULTS on the",
            "stack that allocated the (64 KiB or larger)",
            "heap block the fault is in",
        ],
        section: Section::Own,
        module: "event",
    },
    Opt {
        id: Id::OffCpu,
        names: &["-oc", "--off-cpu"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "time off the CPU per stack where each thread",
            "waited: OFFCPU_TIME (switches, nanoseconds)",
        ],
        section: Section::Own,
        module: "event",
    },
    Opt {
        id: Id::Ibs,
        names: &["-ibs"],
        arg: "[:TERMS][/PERIOD]",
        value: Value::Ibs,
        expected: "-ibs options under 1024 bytes in all",
        help: &[
            "AMD IBS op samples (IbsOpRip as the leaf):",
            "IBS_OPS, IBS_LOADS, IBS_DC_MISS, IBS_LOAD_LAT...;",
            "with -mp, the data they touch charged to the",
            "stack that allocated it: IBS_OBJ_*; TERMS:",
            "cnt_ctl, l3missonly, ldlat=N; PERIOD: cycles",
            "(ops with cnt_ctl), a multiple of 16",
        ],
        section: Section::Own,
        module: "event",
    },
    Opt {
        id: Id::Ibs,
        names: &["-ibs-fetch"],
        arg: "[:TERMS][/PERIOD]",
        value: Value::Ibs,
        expected: "-ibs options under 1024 bytes in all",
        help: &[
            "AMD IBS fetch samples: IBS_FETCHES,",
            "IBS_IC_MISS, IBS_ITLB_MISS, IBS_FETCH_LAT;",
            "TERMS: rand_en, l3missonly",
        ],
        section: Section::Own,
        module: "event",
    },
    Opt {
        id: Id::Count,
        names: &["-c", "--count"],
        arg: "EVENT,EVENT...",
        value: Value::Word,
        expected: "event lists under 1024 bytes in all, without spaces",
        help: &[
            "a group of events counted per thread, read at",
            "each -pp/-pu/-pr sample and charged to its",
            "stack: CNT_<EVENT> (several -c: several groups)",
        ],
        section: Section::Own,
        module: "event",
    },
    Opt {
        id: Id::Interval,
        names: &["-i", "--interval"],
        arg: "TIME",
        value: Value::Time {
            bare_ns: 1_000_000,
            min_ns: 100_000,
            max_ns: 1_000_000_000,
        },
        expected: "a time from 100us to 1s, e.g. 5ms, 100us, 0.5ms",
        help: &[
            "sampling interval: 5ms (default), 1ms, 100us...",
            "(100us..1s)",
        ],
        section: Section::Own,
        module: "cpu",
    },
    Opt {
        id: Id::Depth,
        names: &["--depth"],
        arg: "N",
        value: Value::Number {
            min: 16,
            max: 65536,
            except: &[],
        },
        expected: "16 to 65536",
        help: &["stack depth limit (default 1024, 16..65536)"],
        section: Section::Own,
        module: "base",
    },
    Opt {
        id: Id::Sampler,
        names: &["--sampler"],
        arg: "KIND",
        value: Value::Choice(&["auto", "sigtrap", "sigprof", "timer"]),
        expected: "auto, sigtrap, sigprof or timer",
        help: &[
            "how samples are taken: auto (default: sigtrap,",
            "else sigprof, else timer; sigprof when a",
            "debugger traces the program), sigtrap (perf",
            "event raising SIGTRAP, Linux 5.13+), sigprof",
            "(perf event waking SIGPROF), timer (POSIX CPU",
            "timers, scheduler-tick resolution)",
        ],
        section: Section::Own,
        module: "cpu",
    },
    Opt {
        id: Id::SampleBytes,
        names: &["--sample-bytes"],
        arg: "N",
        value: Value::Bytes {
            min: 1,
            max: MAX_SAMPLE_BYTES,
        },
        expected: "a mean number of bytes between samples from 1 to 16M, e.g. 512K (K = 1024)",
        help: &[
            "with -mp: record a sample of the allocations,",
            "one per N allocated bytes on average (512K, 1M,",
            "or bytes; 1..16M); each recorded allocation",
            "counts for the calls and bytes it stands for,",
            "so totals and live bytes are unbiased estimates",
            "and only recorded allocations walk the stack",
        ],
        section: Section::Own,
        module: "mem",
    },
    Opt {
        id: Id::SampleSeed,
        names: &["--sample-seed"],
        arg: "S",
        value: Value::U64,
        expected: "a decimal number from 0 to 18446744073709551615",
        help: &[
            "seed of that sampling (0..2^64-1; random by",
            "default; the profile header names the seed used)",
        ],
        section: Section::Own,
        module: "mem",
    },
    Opt {
        id: Id::DumpSignal,
        names: &["--dump-signal"],
        arg: "N",
        value: Value::Number {
            min: 0,
            max: 64,
            except: SIGNAL_EXCEPT,
        },
        expected: "a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF, or 0",
        help: &[
            "signal that writes the profile (default 42 =",
            "SIGRTMIN+8; 0 disables): kill -42 <pid>",
        ],
        section: Section::Own,
        module: "process",
    },
    Opt {
        id: Id::DumpEvery,
        names: &["--dump-every"],
        arg: "TIME",
        value: Value::Time {
            bare_ns: 1_000_000_000,
            min_ns: 100_000_000,
            max_ns: u64::MAX,
        },
        expected: "a time of at least 100ms, e.g. 60 (seconds), 10s, 500ms",
        help: &[
            "also write the profile every TIME (a bare",
            "number is seconds: 60, 1.5; or 10s, 500ms),",
            "each snapshot kept as STEM.snap<ms>.gz too, for",
            "igprof-analyse --between and --timeline",
        ],
        section: Section::Own,
        module: "process",
    },
    Opt {
        id: Id::SampleEvery,
        names: &["--sample-every"],
        arg: "TIME",
        value: Value::Time {
            bare_ns: 1_000_000_000,
            min_ns: 100_000_000,
            max_ns: u64::MAX,
        },
        expected: "a time of at least 100ms, e.g. 1 (second), 5s, 500ms",
        help: &[
            "record the process's totals every TIME (CPU,",
            "RSS, live heap, calls, descriptors) as the",
            "profile's timeline (--dump-every: every second)",
        ],
        section: Section::Own,
        module: "process",
    },
    Opt {
        id: Id::ToggleSignal,
        names: &["--toggle-signal"],
        arg: "N",
        value: Value::Number {
            min: 1,
            max: 64,
            except: SIGNAL_EXCEPT,
        },
        expected: "a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF",
        help: &[
            "each signal N turns recording off or on",
            "(default: none), e.g. with -pd",
        ],
        section: Section::Own,
        module: "process",
    },
    Opt {
        id: Id::Jit,
        names: &["--jit"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "name JIT code: turn on the perf maps of node",
            "(NODE_OPTIONS), Python 3.12+ (PYTHONPERFSUPPORT)",
            "and the JVM, and copy each process's map",
            "beside its profile",
        ],
        section: Section::Own,
        module: "jit",
    },
    Opt {
        id: Id::Marks,
        names: &["--marks"],
        arg: "",
        value: Value::Flag,
        expected: "",
        help: &[
            "with -mp: epochs; each igprof_mark() starts one,",
            "and MEM_LIVE_SINCE_MARK holds what was allocated",
            "since the last mark and is still live",
        ],
        section: Section::Own,
        module: "mem",
    },
    Opt {
        id: Id::MarkEvery,
        names: &["--mark-every"],
        arg: "TIME",
        value: Value::Time {
            bare_ns: 1_000_000_000,
            min_ns: 100_000_000,
            max_ns: u64::MAX,
        },
        expected: "a time of at least 100ms, e.g. 60 (seconds), 10s, 500ms",
        help: &["--marks, and a mark every TIME"],
        section: Section::Own,
        module: "mem",
    },
    Opt {
        id: Id::MarkSignal,
        names: &["--mark-signal"],
        arg: "N",
        value: Value::Number {
            min: 1,
            max: 64,
            except: SIGNAL_EXCEPT,
        },
        expected: "a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF",
        help: &[
            "with --marks: the signal igprof --mark PID sends",
            "(default 43 = SIGRTMIN+9)",
        ],
        section: Section::Own,
        module: "mem",
    },
    Opt {
        id: Id::SnapshotAbove,
        names: &["--snapshot-above"],
        arg: "SIZE",
        value: Value::Bytes {
            min: 1 << 20,
            max: 1 << 50,
        },
        expected: "a size of at least 1M, e.g. 512M or 2G (K = 1024)",
        help: &[
            "write a snapshot each time the process's RSS",
            "rises above SIZE (512M, 2G): the evidence",
            "before an OOM kill where no cgroup limit is",
            "set (one is watched by itself)",
        ],
        section: Section::Own,
        module: "process",
    },
];

impl Opt {
    /// The spelling written into `IGPROF` and named in messages (a
    /// prefix's trailing `:` dropped).
    pub fn name(&self) -> &'static str {
        let n = self.names[0];
        n.strip_suffix(':').unwrap_or(n)
    }

    /// The spelling `word` is, for messages ([`Self::name`] for a prefix).
    pub fn spelling(&self, word: &[u8]) -> &'static str {
        match self.names.iter().find(|n| n.as_bytes() == word) {
            Some(n) if !self.is_prefix() => n,
            _ => self.name(),
        }
    }

    /// Whether the option takes the next word as its value.
    pub fn takes_value(&self) -> bool {
        !matches!(self.value, Value::Flag | Value::Function | Value::Ibs)
    }

    /// Whether the word itself is the value (`-fp:...`, `-ibs...`).
    pub fn is_prefix(&self) -> bool {
        matches!(self.value, Value::Function | Value::Ibs)
    }
}

/// The entry `word` is a spelling of (exactly, or by prefix for the
/// options whose word carries the value).
pub fn find(word: &[u8]) -> Option<&'static Opt> {
    TABLE.iter().find(|o| {
        o.names.iter().any(|n| {
            let n = n.as_bytes();
            if o.is_prefix() {
                word.starts_with(n)
            } else {
                word == n
            }
        })
    })
}

/// The entry of `id` (the first, for an id with several entries).
pub fn entry(id: Id) -> &'static Opt {
    match TABLE.iter().find(|o| o.id == id) {
        Some(o) => o,
        None => &TABLE[0],
    }
}

/// A value once checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A flag.
    None,
    /// A number, time in nanoseconds, byte count or seed.
    Number(u64),
    /// The index of a [`Value::Choice`] word.
    Choice(usize),
    /// Text: a path, names, a word, or the whole prefixed word.
    Text(&'a [u8]),
}

impl Parsed<'_> {
    /// The number (0 for what is none).
    pub fn number(self) -> u64 {
        match self {
            Parsed::Number(n) => n,
            Parsed::Choice(i) => i as u64,
            _ => 0,
        }
    }
}

/// Why options are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error<'a> {
    /// A word that names no option.
    Unknown { word: &'a [u8] },
    /// An option that takes a value came last.
    MissingValue { option: &'static str },
    /// A value outside the option's grammar or range.
    BadValue {
        option: &'static str,
        value: &'a [u8],
        expected: &'static str,
    },
    /// Options that cannot be used together: the whole message.
    Conflict { message: &'static str },
}

impl fmt::Display for Error<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unknown { word } => {
                write!(f, "unknown option '{}' (see igprof -h)", Bytes(word))
            }
            Error::MissingValue { option } => {
                write!(f, "option {option} needs a value (see igprof -h)")
            }
            Error::BadValue {
                option,
                value,
                expected,
            } => write!(
                f,
                "option {option}: bad value '{}', expected {expected}",
                Bytes(value)
            ),
            Error::Conflict { message } => f.write_str(message),
        }
    }
}

/// Bytes that may not be UTF-8 (paths), shown lossily without allocating.
pub struct Bytes<'a>(pub &'a [u8]);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str("\u{fffd}")?;
            }
        }
        Ok(())
    }
}

/// Checks options one by one and then together: what both parsers use.
pub struct Checker {
    /// Bit `id` is set once an option of that id was given.
    seen: u64,
    /// Bytes the accumulated values of each id take in the library's
    /// storage, separators included.
    used: [usize; IDS],
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

impl Checker {
    pub const fn new() -> Self {
        Checker {
            seen: 0,
            used: [0; IDS],
        }
    }

    /// Whether an option of `id` was given.
    pub fn seen(&self, id: Id) -> bool {
        self.seen & (1 << id as u8) != 0
    }

    /// Checks `opt` given as `word` with `value` (the next word, for
    /// options that take one; `None` when there was none).
    pub fn check<'a>(
        &mut self,
        opt: &'static Opt,
        word: &'a [u8],
        value: Option<&'a [u8]>,
    ) -> Result<Parsed<'a>, Error<'a>> {
        let v = if opt.is_prefix() {
            word
        } else if opt.takes_value() {
            value.ok_or(Error::MissingValue {
                option: opt.spelling(word),
            })?
        } else {
            b""
        };
        let bad = Error::BadValue {
            option: opt.spelling(word),
            value: v,
            expected: opt.expected,
        };
        let parsed = parse_value(&opt.value, v).ok_or(bad)?;
        if matches!(
            opt.value,
            Value::Function | Value::Ibs | Value::Names | Value::Word
        ) {
            // Accumulated in one buffer, separated by one byte.
            let used = &mut self.used[opt.id as usize];
            let n = *used + (*used != 0) as usize + v.len();
            if n > LIST_MAX {
                return Err(bad);
            }
            *used = n;
        }
        self.seen |= 1 << opt.id as u8;
        Ok(parsed)
    }

    /// The rules between options, once all are checked.
    pub fn finish(&self) -> Result<(), Error<'static>> {
        let any = |ids: &[Id]| ids.iter().any(|&i| self.seen(i));
        let clocks = [Id::PerfCpu, Id::PerfUser, Id::PerfReal];
        let marks = any(&[Id::Marks, Id::MarkEvery, Id::MarkSignal]);
        let rules: [(bool, &'static str); 7] = [
            (
                marks && !self.seen(Id::Mem),
                "--marks, --mark-every and --mark-signal mark the memory profiler's epochs: add -mp",
            ),
            (
                marks && self.seen(Id::SampleBytes),
                "--marks needs the exact memory profile (a sampled block has no room for its epoch): drop --sample-bytes",
            ),
            (
                clocks.iter().filter(|&&i| self.seen(i)).count() > 1,
                "only one of -pp, -pu, -pr may be given",
            ),
            (
                self.seen(Id::Count) && !any(&clocks),
                "-c counts beside the CPU samples, which read the counters: add -pp (or -pu, -pr)",
            ),
            (
                self.seen(Id::SampleBytes) && !self.seen(Id::Mem),
                "--sample-bytes samples the memory profiler's allocations: add -mp",
            ),
            (
                self.seen(Id::SampleBytes) && any(&[Id::EmptyEp, Id::EmptyEi, Id::EmptyEu]),
                "--sample-bytes cannot be combined with -ep/-ei/-eu (they inspect every block): drop one of them",
            ),
            (
                self.seen(Id::SampleSeed) && !self.seen(Id::SampleBytes),
                "--sample-seed seeds the allocation sampler: add --sample-bytes N",
            ),
        ];
        match rules.iter().find(|r| r.0) {
            Some(&(_, message)) => Err(Error::Conflict { message }),
            None => Ok(()),
        }
    }
}

/// `v` as a value of kind `kind`, if it is one.
fn parse_value<'a>(kind: &Value, v: &'a [u8]) -> Option<Parsed<'a>> {
    let blank = |b: &u8| b.is_ascii_whitespace();
    Some(match *kind {
        Value::Flag => Parsed::None,
        Value::Function => {
            let func = &v[v.iter().position(|&b| b == b':')? + 1..];
            if func.is_empty() || func[0] == b':' || v.iter().any(|b| blank(b) || *b == b'\'') {
                return None;
            }
            Parsed::Text(v)
        }
        Value::Ibs | Value::Word => {
            if v.is_empty() || v.iter().any(blank) {
                return None;
            }
            Parsed::Text(v)
        }
        Value::Choice(words) => Parsed::Choice(words.iter().position(|w| w.as_bytes() == v)?),
        Value::Time {
            bare_ns,
            min_ns,
            max_ns,
        } => {
            let ns = parse_time(v, bare_ns)?;
            if !(min_ns..=max_ns).contains(&ns) {
                return None;
            }
            Parsed::Number(ns)
        }
        Value::Number { min, max, except } => {
            let n = parse_decimal(v)?;
            if !(min..=max).contains(&n) || except.contains(&n) {
                return None;
            }
            Parsed::Number(n)
        }
        Value::Bytes { min, max } => {
            let n = parse_bytes(v)?;
            if !(min..=max).contains(&n) {
                return None;
            }
            Parsed::Number(n)
        }
        Value::U64 => Parsed::Number(parse_u64(v)?),
        Value::Path => {
            if v.len() > PATH_MAX || v.contains(&0) {
                return None;
            }
            Parsed::Text(v)
        }
        Value::Names => {
            if v.len() > LIST_MAX || v.contains(&0) {
                return None;
            }
            Parsed::Text(v)
        }
    })
}

/// A decimal number of 1 to 18 digits (so that a unit may multiply it).
pub fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.len() > 18 {
        return None;
    }
    parse_u64(s)
}

/// Any decimal number that fits in 64 bits (leading zeros allowed).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add((b - b'0') as u64)
        } else {
            None
        }
    })
}

/// Parses `5ms`, `100us`, `0.001s`, `250000ns`, or a bare number counting
/// `bare_ns` nanoseconds (at most 9 digits after a decimal point); in
/// nanoseconds.
pub fn parse_time(s: &[u8], bare_ns: u64) -> Option<u64> {
    let (num, scale): (&[u8], u64) = if let Some(n) = s.strip_suffix(b"ns") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix(b"us") {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix(b"ms") {
        (n, 1_000_000)
    } else if let Some(n) = s.strip_suffix(b"s") {
        (n, 1_000_000_000)
    } else {
        (s, bare_ns)
    };
    let (int, frac) = match num.iter().position(|&b| b == b'.') {
        Some(i) => (&num[..i], &num[i + 1..]),
        None => (num, &b""[..]),
    };
    if frac.len() > 9 || (int.is_empty() && frac.is_empty()) {
        return None;
    }
    let whole = if int.is_empty() {
        0
    } else {
        parse_decimal(int)?
    };
    let mut ns = whole.checked_mul(scale)?;
    if !frac.is_empty() {
        let f = parse_decimal(frac)?;
        let div = 10u64.pow(frac.len() as u32);
        ns = ns.checked_add(f.checked_mul(scale)? / div)?;
    }
    Some(ns)
}

/// Parses a byte count: digits with an optional binary suffix `K`, `M`,
/// `G` (also `KiB`, `k`...): `512K` = 524288.
pub fn parse_bytes(s: &[u8]) -> Option<u64> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    let (num, unit) = s.split_at(digits);
    let shift = match unit {
        b"" => 0,
        b"K" | b"k" | b"KiB" | b"kiB" => 10,
        b"M" | b"m" | b"MiB" => 20,
        b"G" | b"g" | b"GiB" => 30,
        _ => return None,
    };
    parse_decimal(num)?.checked_mul(1 << shift)
}

/// Column where the usage text's help lines start.
const HELP_COLUMN: usize = 29;

/// The usage text's lines for the options of `section`, from the table.
pub fn write_usage(w: &mut dyn fmt::Write, section: Section) -> fmt::Result {
    for o in TABLE.iter().filter(|o| o.section == section) {
        // "  -pp, --perf-profile", "      --depth N", "  -fp:FUNC[:LIB], ...".
        let mut width = 2;
        w.write_str("  ")?;
        if o.names[0].starts_with("--") {
            w.write_str("    ")?;
            width += 4;
        }
        for (i, n) in o.names.iter().enumerate() {
            if i > 0 {
                w.write_str(", ")?;
                width += 2;
            }
            w.write_str(n)?;
            width += n.len();
            if o.is_prefix() {
                w.write_str(o.arg)?;
                width += o.arg.len();
            }
        }
        if !o.is_prefix() && !o.arg.is_empty() {
            write!(w, " {}", o.arg)?;
            width += 1 + o.arg.len();
        }
        for (i, line) in o.help.iter().enumerate() {
            if i == 0 && width < HELP_COLUMN {
                write!(w, "{:pad$}{line}", "", pad = HELP_COLUMN - width)?;
            } else {
                write!(w, "\n{:pad$}{line}", "", pad = HELP_COLUMN)?;
            }
        }
        w.write_str("\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
