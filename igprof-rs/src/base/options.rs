//! Options of the injected library, parsed from the `IGPROF` environment
//! variable into fixed-size storage.
//!
//! As in IgProf, the launcher puts the profiler's options in `IGPROF` (it is
//! inherited by children, so fork+exec'd programs are profiled again). The
//! value is the launcher's option words, e.g. `-pp -z -o 'out dir/p.gz'`;
//! a word may be single-quoted to hold spaces. Recognised words:
//!
//! | word | meaning |
//! | --- | --- |
//! | `-pp` `-pu` `-pr` | CPU, user-CPU, wall-clock sampling (one of them) |
//! | `-mp` `-mo MODE` `-fd` `-np` `-ep` `-ei` `-eu` `-fp:FUNC[:LIB]` | other modules (must be built in) |
//! | `-pd` | start with recording off (`igprof_enable()`, the toggle signal) |
//! | `-pk` | a fork child keeps the parent's profile so far |
//! | `-j` | accepted (jemalloc is found as the allocator anyway) |
//! | `--toggle-signal N` | signal that turns recording off and on (default none) |
//! | `-finst` | calls and time of functions built with `-finstrument-functions` |
//! | `-o FILE` | output file (`%p` is replaced by the pid); gzip if `-z` or it ends in `.gz` |
//! | `-z` | gzip the output |
//! | `-t NAMES` | profile only programs whose name contains one of the comma-separated NAMES |
//! | `-D FILE` | dump whenever FILE appears (it is then removed) |
//! | `-d` | debug messages |
//! | `--interval TIME` | sampling interval: `5ms` (default), `100us`, `0.001s`, bare number = ms; 100us..1s |
//! | `--depth N` | stack depth limit (default 1024, 16..65536) |
//! | `--dump-signal N` | signal number that triggers a dump (default SIGRTMIN+8 = 42; 0 = none) |
//! | `--sampler KIND` | how samples are delivered: `auto` (default), `sigtrap`, `sigprof`, `timer` (see `perf`) |
//! | `--sample-bytes N` | -mp records a sample of allocations, one per N allocated bytes on average (`512K`, `1M`, bytes; 1..16M; see `mem::sample`) |
//! | `--sample-seed S` | seed of the allocation sampler (a u64; random by default) |
//!
//! Must never: allocate or panic. Parsing is pure over a byte string so that
//! it is unit-tested; [`init`] runs once in the constructor, before any hook
//! or thread of ours exists, and is the only writer of the global options.

use core::cell::UnsafeCell;
use core::fmt;

/// A string too long for its fixed storage, or containing a NUL byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotStorable;

/// A NUL-terminated byte string in fixed storage.
#[derive(Clone, Copy)]
pub struct FixedStr<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> FixedStr<N> {
    pub const fn new() -> Self {
        FixedStr {
            buf: [0; N],
            len: 0,
        }
    }
    /// Fails when `s` (plus the NUL) does not fit, or contains a NUL.
    pub fn set(&mut self, s: &[u8]) -> Result<(), NotStorable> {
        if s.len() + 1 > N || s.contains(&0) {
            return Err(NotStorable);
        }
        self.buf[..s.len()].copy_from_slice(s);
        self.buf[s.len()] = 0;
        self.len = s.len();
        Ok(())
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// With the trailing NUL, for system calls.
    pub fn as_bytes_nul(&self) -> &[u8] {
        &self.buf[..self.len + 1]
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<const N: usize> Default for FixedStr<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Which clock drives the sampling profiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfClock {
    /// -pp: the thread's CPU time (user + system).
    Cpu,
    /// -pu: the thread's CPU time, samples weighted by the user share.
    User,
    /// -pr: wall-clock time.
    Real,
}

/// How the sampling signal is delivered (`--sampler`; see the `perf` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampler {
    /// sigtrap when the kernel has it (5.13+), else sigprof, else timer.
    Auto,
    /// A task-clock perf event that raises SIGTRAP itself (attr.sigtrap).
    Sigtrap,
    /// A task-clock perf event whose ring-buffer wake-up sends SIGPROF.
    Sigprof,
    /// POSIX timers (SIGPROF) on the thread CPU clock: scheduler-tick resolution.
    Timer,
}

/// IgProf's `-mo` (memory overhead accounting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemOverhead {
    None,
    Include,
    Delta,
}

/// IgProf's empty-memory profilers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptyMode {
    /// -ep: bytes in still-zero pages at free.
    Ep,
    /// -ei: fill new blocks, count zero pages.
    Ei,
    /// -eu: fill new blocks, count pages still holding the pattern.
    Eu,
}

#[derive(Clone, Copy)]
pub struct Options {
    pub perf: Option<PerfClock>,
    pub mem: bool,
    pub mem_overhead: MemOverhead,
    pub fd: bool,
    pub energy: bool,
    pub empty: Option<EmptyMode>,
    /// `-fp:FUNC[:LIB]` (`-fpi`, `-fpf`): IgProf's function-call profiler
    /// (modules/calls), the option words as given, separated by spaces.
    pub functions: FixedStr<1024>,
    /// -finst: the `-finstrument-functions` profiler (modules/finst).
    pub finst: bool,
    /// `-e SPEC`: perf events sampled per thread (modules/event), the
    /// specifications separated by spaces (they have none).
    pub events: FixedStr<1024>,
    /// `-c LIST`: counting groups read at each CPU sample (modules/event),
    /// the groups separated by spaces (they have none).
    pub counts: FixedStr<1024>,
    /// `-ibs[:TERMS][/PERIOD]` and `-ibs-fetch[...]` words as given
    /// (checked by the launcher; resolved by modules/event at start-up).
    pub ibs: FixedStr<1024>,
    /// `-pf`: the page-fault profiler (modules/event).
    pub page_faults: bool,
    /// `-oc`: the off-CPU time profiler (modules/event).
    pub off_cpu: bool,
    pub output: FixedStr<4096>,
    pub gzip: bool,
    pub targets: FixedStr<1024>,
    pub flag_file: FixedStr<4096>,
    pub debug: bool,
    pub interval_ns: u64,
    pub max_depth: usize,
    pub dump_signal: i32,
    pub sampler: Sampler,
    /// `--dump-every`: write a snapshot this often (0: never).
    pub dump_every_ns: u64,
    /// `--sample-bytes`: mean bytes between two recorded allocations of
    /// -mp (0: every allocation is recorded).
    pub sample_bytes: u64,
    /// `--sample-seed`: the sampler's seed (None: random).
    pub sample_seed: Option<u64>,
    /// `-pd`: start with recording disabled (`igprof_enable()` or the
    /// toggle signal turns it on).
    pub start_disabled: bool,
    /// `-pk`: a fork child keeps the parent's profile so far (IgProf's
    /// `perf:keep`) instead of starting an empty one.
    pub fork_keep: bool,
    /// `--toggle-signal N`: signal that turns recording off and on (0: none).
    pub toggle_signal: i32,
}

pub const DEFAULT_INTERVAL_NS: u64 = 5_000_000;
pub const DEFAULT_DEPTH: usize = 1024;
pub const DEFAULT_DUMP_SIGNAL: i32 = 42;
/// Largest `--sample-bytes`: a sampled block's call estimate (up to N)
/// must fit the 24 bits the live table keeps for it (see `mem::sample`).
pub const MAX_SAMPLE_BYTES: u64 = 16 << 20;

impl Options {
    pub const fn new() -> Self {
        Options {
            perf: None,
            mem: false,
            mem_overhead: MemOverhead::None,
            fd: false,
            energy: false,
            empty: None,
            functions: FixedStr::new(),
            finst: false,
            events: FixedStr::new(),
            counts: FixedStr::new(),
            ibs: FixedStr::new(),
            page_faults: false,
            off_cpu: false,
            output: FixedStr::new(),
            gzip: false,
            targets: FixedStr::new(),
            flag_file: FixedStr::new(),
            debug: false,
            interval_ns: DEFAULT_INTERVAL_NS,
            max_depth: DEFAULT_DEPTH,
            dump_signal: DEFAULT_DUMP_SIGNAL,
            sampler: Sampler::Auto,
            dump_every_ns: 0,
            sample_bytes: 0,
            sample_seed: None,
            start_disabled: false,
            fork_keep: false,
            toggle_signal: 0,
        }
    }

    /// Whether any sampling timer is needed (-pp/-pu/-pr, or -np which
    /// samples energy on the same timers).
    pub fn needs_timers(&self) -> bool {
        self.perf.is_some() || self.energy
    }

    /// The profilers these options select: (the flag their module has in
    /// the registry, what it is for messages), in a fixed order.
    pub fn selected(&self) -> Vec<(&'static str, &'static str)> {
        let mut v = Vec::new();
        if self.perf.is_some() {
            v.push(("-pp", "the sampling profiler"));
        }
        if self.mem {
            v.push(("-mp", "the memory profiler"));
        }
        if self.fd {
            v.push(("-fd", "the file-descriptor profiler"));
        }
        if self.empty.is_some() {
            v.push(("-ep/-ei/-eu", "the empty-memory profiler"));
        }
        if self.energy {
            v.push(("-np", "the energy profiler"));
        }
        if !self.functions.is_empty() {
            v.push(("-fp", "the function-call profiler (-fp/-fpi/-fpf)"));
        }
        if self.finst {
            v.push(("-finst", "the function-instrumentation profiler"));
        }
        if self.samples_events() || !self.counts.is_empty() {
            v.push(("-e", "the perf-event profiler (-e, -pf, -oc, -c, -ibs)"));
        }
        v
    }

    /// Whether perf events of modules/event are sampled (-e, -pf, -oc,
    /// -ibs).
    pub fn samples_events(&self) -> bool {
        !self.events.is_empty() || self.page_faults || self.off_cpu || !self.ibs.is_empty()
    }

    /// The `-ibs` and `-ibs-fetch` options, in the order given.
    pub fn ibs_requests(&self) -> impl Iterator<Item = &str> {
        core::str::from_utf8(self.ibs.as_bytes())
            .unwrap_or("")
            .split(' ')
            .filter(|s| !s.is_empty())
    }

    /// Whether IBS samples' data addresses are charged to the allocating
    /// stacks of the blocks they touch (-ibs with exact -mp).
    pub fn ibs_objects(&self) -> bool {
        !self.ibs.is_empty() && self.mem && self.sample_bytes == 0
    }

    /// The `-c` groups (each a comma-separated list), in the order given.
    pub fn count_groups(&self) -> impl Iterator<Item = &str> {
        core::str::from_utf8(self.counts.as_bytes())
            .unwrap_or("")
            .split(' ')
            .filter(|s| !s.is_empty())
    }

    /// The `-fp:`/`-fpi:`/`-fpf:` words, in the order given.
    pub fn function_specs(&self) -> impl Iterator<Item = &str> {
        core::str::from_utf8(self.functions.as_bytes())
            .unwrap_or("")
            .split(' ')
            .filter(|s| !s.is_empty())
    }

    /// The `-e` specifications, in the order given.
    pub fn event_specs(&self) -> impl Iterator<Item = &str> {
        core::str::from_utf8(self.events.as_bytes())
            .unwrap_or("")
            .split(' ')
            .filter(|s| !s.is_empty())
    }

    /// Deselects the profiler of `flag` (one of [`Self::selected`]'s).
    pub fn deselect(&mut self, flag: &str) {
        match flag {
            "-pp" => self.perf = None,
            "-mp" => self.mem = false,
            "-fd" => self.fd = false,
            "-ep/-ei/-eu" => self.empty = None,
            "-np" => self.energy = false,
            "-fp" => self.functions = FixedStr::new(),
            "-finst" => self.finst = false,
            "-e" => {
                self.events = FixedStr::new();
                self.counts = FixedStr::new();
                self.page_faults = false;
                self.off_cpu = false;
                self.ibs = FixedStr::new();
            }
            _ => {}
        }
    }

    /// Whether `program` (the executable's path) passes the `-t` filter.
    pub fn targets_match(&self, program: &[u8]) -> bool {
        if self.targets.is_empty() {
            return true;
        }
        let base = match program.iter().rposition(|&b| b == b'/') {
            Some(i) => &program[i + 1..],
            None => program,
        };
        self.targets
            .as_bytes()
            .split(|&b| b == b',')
            .filter(|t| !t.is_empty())
            .any(|t| contains(base, t))
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// What is wrong with the option string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionError<'a> {
    Unknown {
        word: &'a [u8],
    },
    MissingValue {
        option: &'static str,
    },
    BadValue {
        option: &'static str,
        value: &'a [u8],
        expected: &'static str,
    },
    UnterminatedQuote,
    TwoPerfClocks,
    /// An option that cannot be used with the others given.
    Conflict {
        option: &'static str,
        problem: &'static str,
    },
}

impl fmt::Display for OptionError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::base::log::Bytes;
        match self {
            OptionError::Unknown { word } => write!(
                f,
                "unknown option '{}' in IGPROF (see igprof -h)",
                Bytes(word)
            ),
            OptionError::MissingValue { option } => write!(f, "option {option} needs a value"),
            OptionError::BadValue {
                option,
                value,
                expected,
            } => {
                write!(
                    f,
                    "option {option}: bad value '{}', expected {expected}",
                    Bytes(value)
                )
            }
            OptionError::UnterminatedQuote => write!(f, "unterminated ' quote in IGPROF"),
            OptionError::TwoPerfClocks => write!(f, "only one of -pp, -pu, -pr may be given"),
            OptionError::Conflict { option, problem } => write!(f, "option {option} {problem}"),
        }
    }
}

/// Splits the option string into words; `'...'` quotes a word.
struct Words<'a> {
    s: &'a [u8],
}

impl<'a> Iterator for Words<'a> {
    type Item = Result<&'a [u8], OptionError<'a>>;
    fn next(&mut self) -> Option<Self::Item> {
        while let [b' ' | b'\t' | b'\n', rest @ ..] = self.s {
            self.s = rest;
        }
        if self.s.is_empty() {
            return None;
        }
        if self.s[0] == b'\'' {
            let body = &self.s[1..];
            return match body.iter().position(|&b| b == b'\'') {
                Some(end) => {
                    self.s = &body[end + 1..];
                    Some(Ok(&body[..end]))
                }
                None => {
                    self.s = &[];
                    Some(Err(OptionError::UnterminatedQuote))
                }
            };
        }
        let end = self
            .s
            .iter()
            .position(|&b| b == b' ' || b == b'\t' || b == b'\n')
            .unwrap_or(self.s.len());
        let w = &self.s[..end];
        self.s = &self.s[end..];
        Some(Ok(w))
    }
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 18 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            Some(acc * 10 + (b - b'0') as u64)
        } else {
            None
        }
    })
}

/// Parses `5ms`, `100us`, `0.001s`, `250000ns`, or a bare number of ms.
pub fn parse_interval(s: &[u8]) -> Option<u64> {
    let (num, scale): (&[u8], u64) = if let Some(n) = s.strip_suffix(b"ns") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix(b"us") {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix(b"ms") {
        (n, 1_000_000)
    } else if let Some(n) = s.strip_suffix(b"s") {
        (n, 1_000_000_000)
    } else {
        (s, 1_000_000)
    };
    // Decimal fraction: at most 9 digits after the point.
    let (int, frac) = match num.iter().position(|&b| b == b'.') {
        Some(i) => (&num[..i], &num[i + 1..]),
        None => (num, &b""[..]),
    };
    if frac.len() > 9 || (int.is_empty() && frac.is_empty()) {
        return None;
    }
    let whole = if int.is_empty() { 0 } else { parse_u64(int)? };
    let mut ns = whole.checked_mul(scale)?;
    if !frac.is_empty() {
        let f = parse_u64(frac)?;
        let mut div = 1u64;
        for _ in 0..frac.len() {
            div *= 10;
        }
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
    parse_u64(num)?.checked_mul(1 << shift)
}

/// Parses a decimal u64 (the whole range, for seeds).
fn parse_u64_full(s: &[u8]) -> Option<u64> {
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

/// Appends word `v` (no space in it) to the space-separated words of `f`;
/// false when it does not fit or is not a word.
fn append_word(f: &mut FixedStr<1024>, v: &[u8]) -> bool {
    let mut joined = [0u8; 1024];
    let old = f.as_bytes();
    let n = old.len() + (!old.is_empty()) as usize + v.len();
    if v.is_empty() || v.contains(&b' ') || n >= joined.len() {
        return false;
    }
    joined[..old.len()].copy_from_slice(old);
    if !old.is_empty() {
        joined[old.len()] = b' ';
    }
    joined[n - v.len()..n].copy_from_slice(v);
    f.set(&joined[..n]).is_ok()
}

/// Parses the whole option string.
pub fn parse(s: &[u8]) -> Result<Options, OptionError<'_>> {
    let mut o = Options::new();
    let mut words = Words { s };
    while let Some(w) = words.next() {
        let w = w?;
        let mut value = |option: &'static str| -> Result<&[u8], OptionError<'_>> {
            match words.next() {
                Some(Ok(v)) => Ok(v),
                Some(Err(e)) => Err(e),
                None => Err(OptionError::MissingValue { option }),
            }
        };
        let set_perf = |o: &mut Options, c: PerfClock| -> Result<(), OptionError<'static>> {
            if o.perf.is_some_and(|p| p != c) {
                return Err(OptionError::TwoPerfClocks);
            }
            o.perf = Some(c);
            Ok(())
        };
        match w {
            b"igprof" => {} // IgProf put its own name first; accepted for compatibility.
            b"-pp" | b"--perf-profile" => set_perf(&mut o, PerfClock::Cpu)?,
            b"-pu" | b"--perf-user" => set_perf(&mut o, PerfClock::User)?,
            b"-pr" | b"--perf-real" => set_perf(&mut o, PerfClock::Real)?,
            b"-mp" | b"--memory-profile" => o.mem = true,
            b"-mo" | b"--memory-overhead" => {
                let v = value("-mo")?;
                o.mem_overhead = match v {
                    b"none" => MemOverhead::None,
                    b"include" => MemOverhead::Include,
                    b"delta" => MemOverhead::Delta,
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "-mo",
                            value: v,
                            expected: "none, include or delta",
                        })
                    }
                };
            }
            b"-fd" | b"--file-descriptors" => o.fd = true,
            b"-np" | b"--energy-profile" => o.energy = true,
            b"-ep" => o.empty = Some(EmptyMode::Ep),
            b"-ei" => o.empty = Some(EmptyMode::Ei),
            b"-eu" => o.empty = Some(EmptyMode::Eu),
            b"-pd" | b"--profile-disabled" => o.start_disabled = true,
            b"-pk" | b"--perf-keep" => o.fork_keep = true,
            // jemalloc is found as the allocator that defines malloc.
            b"-j" | b"--jemalloc" => {}
            w if w.starts_with(b"-fp:") || w.starts_with(b"-fpi:") || w.starts_with(b"-fpf:") => {
                // Several accumulate (checked by the launcher; resolved by
                // the module at start-up and after each dlopen).
                if !append_word(&mut o.functions, w) {
                    return Err(OptionError::BadValue {
                        option: "-fp",
                        value: w,
                        expected: "FUNC[:LIB] words under 1024 bytes in all",
                    });
                }
            }
            b"-finst" => o.finst = true,
            b"-pf" | b"--page-faults" => o.page_faults = true,
            b"-oc" | b"--off-cpu" => o.off_cpu = true,
            w if w.starts_with(b"-ibs") => {
                if !append_word(&mut o.ibs, w) {
                    return Err(OptionError::BadValue {
                        option: "-ibs",
                        value: w,
                        expected: "-ibs options under 1024 bytes in all",
                    });
                }
            }
            b"-e" | b"--event" => {
                // Several -e accumulate (checked by the launcher; resolved
                // by the module at start-up).
                let v = value("-e")?;
                if !append_word(&mut o.events, v) {
                    return Err(OptionError::BadValue {
                        option: "-e",
                        value: v,
                        expected: "event specifications under 1024 bytes in all, without spaces",
                    });
                }
            }
            b"-c" | b"--count" => {
                let v = value("-c")?;
                if !append_word(&mut o.counts, v) {
                    return Err(OptionError::BadValue {
                        option: "-c",
                        value: v,
                        expected: "event lists under 1024 bytes in all, without spaces",
                    });
                }
            }
            b"-z" | b"--compress" => o.gzip = true,
            b"-d" | b"--debug" => o.debug = true,
            b"-o" | b"--output" => {
                let v = value("-o")?;
                o.output.set(v).map_err(|_| OptionError::BadValue {
                    option: "-o",
                    value: v,
                    expected: "a path shorter than 4096 bytes",
                })?;
            }
            b"-t" | b"--target" => {
                let v = value("-t")?;
                // Several -t accumulate, comma-separated.
                let mut merged = [0u8; 1024];
                let old = o.targets.as_bytes();
                let total = old.len() + (!old.is_empty()) as usize + v.len();
                if total >= merged.len() {
                    return Err(OptionError::BadValue {
                        option: "-t",
                        value: v,
                        expected: "names under 1024 bytes",
                    });
                }
                merged[..old.len()].copy_from_slice(old);
                let mut n = old.len();
                if n > 0 {
                    merged[n] = b',';
                    n += 1;
                }
                merged[n..n + v.len()].copy_from_slice(v);
                n += v.len();
                let _ = o.targets.set(&merged[..n]);
            }
            b"-D" | b"--dump-flag" => {
                let v = value("-D")?;
                o.flag_file.set(v).map_err(|_| OptionError::BadValue {
                    option: "-D",
                    value: v,
                    expected: "a path shorter than 4096 bytes",
                })?;
            }
            b"--interval" => {
                let v = value("--interval")?;
                match parse_interval(v) {
                    Some(ns) if (100_000..=1_000_000_000).contains(&ns) => o.interval_ns = ns,
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--interval",
                            value: v,
                            expected: "a time from 100us to 1s, e.g. 5ms, 100us, 0.5ms",
                        })
                    }
                }
            }
            b"--depth" => {
                let v = value("--depth")?;
                match parse_u64(v) {
                    Some(n) if (16..=65536).contains(&n) => o.max_depth = n as usize,
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--depth",
                            value: v,
                            expected: "16 to 65536",
                        })
                    }
                }
            }
            b"--toggle-signal" => {
                let v = value("--toggle-signal")?;
                match parse_u64(v) {
                    Some(n) if (1..=64).contains(&n) && ![9, 19, 27].contains(&n) => {
                        o.toggle_signal = n as i32
                    }
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--toggle-signal",
                            value: v,
                            expected: "a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF",
                        })
                    }
                }
            }
            b"--dump-signal" => {
                let v = value("--dump-signal")?;
                match parse_u64(v) {
                    Some(n) if n == 0 || (1..=64).contains(&n) && ![9, 19, 27].contains(&n) => {
                        o.dump_signal = n as i32
                    }
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--dump-signal",
                            value: v,
                            expected:
                                "a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF, or 0",
                        })
                    }
                }
            }
            b"--dump-every" => {
                let v = value("--dump-every")?;
                // A bare number is seconds here.
                let ns = if v.iter().all(|b| b.is_ascii_digit()) {
                    parse_u64(v).and_then(|n| n.checked_mul(1_000_000_000))
                } else {
                    parse_interval(v)
                };
                match ns {
                    Some(ns) if ns >= 100_000_000 => o.dump_every_ns = ns,
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--dump-every",
                            value: v,
                            expected: "a time of at least 100ms, e.g. 60 (seconds), 10s, 500ms",
                        })
                    }
                }
            }
            b"--sampler" => {
                let v = value("--sampler")?;
                o.sampler = match v {
                    b"auto" => Sampler::Auto,
                    b"sigtrap" => Sampler::Sigtrap,
                    b"sigprof" => Sampler::Sigprof,
                    b"timer" => Sampler::Timer,
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--sampler",
                            value: v,
                            expected: "auto, sigtrap, sigprof or timer",
                        })
                    }
                };
            }
            b"--sample-bytes" => {
                let v = value("--sample-bytes")?;
                match parse_bytes(v) {
                    Some(n) if (1..=MAX_SAMPLE_BYTES).contains(&n) => o.sample_bytes = n,
                    _ => {
                        return Err(OptionError::BadValue {
                            option: "--sample-bytes",
                            value: v,
                            expected: "a mean number of bytes between samples from 1 to 16M, e.g. 512K (K = 1024)",
                        })
                    }
                }
            }
            b"--sample-seed" => {
                let v = value("--sample-seed")?;
                match parse_u64_full(v) {
                    Some(n) => o.sample_seed = Some(n),
                    None => {
                        return Err(OptionError::BadValue {
                            option: "--sample-seed",
                            value: v,
                            expected: "a decimal number from 0 to 18446744073709551615",
                        })
                    }
                }
            }
            _ => return Err(OptionError::Unknown { word: w }),
        }
    }
    if o.sample_bytes != 0 && !o.mem {
        return Err(OptionError::Conflict {
            option: "--sample-bytes",
            problem: "samples the memory profiler's allocations: add -mp",
        });
    }
    if o.sample_seed.is_some() && o.sample_bytes == 0 {
        return Err(OptionError::Conflict {
            option: "--sample-seed",
            problem: "seeds the allocation sampler: add --sample-bytes N",
        });
    }
    if o.sample_bytes != 0 && o.empty.is_some() {
        return Err(OptionError::Conflict {
            option: "--sample-bytes",
            problem:
                "cannot be combined with -ep/-ei/-eu (they inspect every block): drop one of them",
        });
    }
    Ok(o)
}

struct Global(UnsafeCell<Options>);
// SAFETY: written once by `init` in the constructor before any other thread
// of ours runs or any hook is installed; read-only afterwards.
unsafe impl Sync for Global {}

static OPTIONS: Global = Global(UnsafeCell::new(Options::new()));

/// Stores the parsed options (constructor only).
///
/// # Safety
/// Must be called before any other thread could read the options.
pub unsafe fn init(o: Options) {
    *OPTIONS.0.get() = o;
}

/// The process's options.
pub fn get() -> &'static Options {
    // SAFETY: see Global.
    unsafe { &*OPTIONS.0.get() }
}

pub fn debug() -> bool {
    get().debug
}

/// An `igprof:` line, only with `-d`.
#[macro_export]
macro_rules! igprof_debug {
    ($($arg:tt)*) => {{
        if $crate::base::options::debug() {
            $crate::igprof_log!($($arg)*);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_igprof_style_words() {
        let o =
            parse(b"igprof -pp -z -o 'my dir/out.gz' -t a,b -t c -D /tmp/flag -d --interval 1ms --depth 600").unwrap();
        assert_eq!(o.perf, Some(PerfClock::Cpu));
        assert!(o.gzip && o.debug);
        assert_eq!(o.output.as_bytes(), b"my dir/out.gz");
        assert_eq!(o.output.as_bytes_nul(), b"my dir/out.gz\0");
        assert_eq!(o.targets.as_bytes(), b"a,b,c");
        assert_eq!(o.flag_file.as_bytes(), b"/tmp/flag");
        assert_eq!(o.interval_ns, 1_000_000);
        assert_eq!(o.max_depth, 600);
        let o = parse(b"-pr -mp -mo delta -fd -np").unwrap();
        assert_eq!(o.perf, Some(PerfClock::Real));
        assert!(o.mem && o.fd && o.energy);
        assert_eq!(o.mem_overhead, MemOverhead::Delta);
        assert!(o.needs_timers());
        assert!(!parse(b"-mp").unwrap().needs_timers());
        let o = parse(b"-finst").unwrap();
        assert!(o.finst && !o.needs_timers());
        assert_eq!(
            o.selected(),
            vec![("-finst", "the function-instrumentation profiler")]
        );
    }

    #[test]
    fn events_accumulate() {
        let o = parse(b"-e page-faults/100 -pp --event cpu/event=0xc0,umask=0/u").unwrap();
        assert_eq!(
            o.event_specs().collect::<Vec<_>>(),
            ["page-faults/100", "cpu/event=0xc0,umask=0/u"]
        );
        assert!(o
            .selected()
            .contains(&("-e", "the perf-event profiler (-e, -pf, -oc, -c, -ibs)")));
        let o = parse(b"-pp -c page-faults,cs -c cpu/event=1,umask=2/").unwrap();
        assert_eq!(
            o.count_groups().collect::<Vec<_>>(),
            ["page-faults,cs", "cpu/event=1,umask=2/"]
        );
        let o = parse(b"-pf -oc").unwrap();
        assert!(o.page_faults && o.off_cpu && o.event_specs().next().is_none());
        assert!(parse(b"-pp").unwrap().event_specs().next().is_none());
        assert!(matches!(
            parse(b"-e"),
            Err(OptionError::MissingValue { option: "-e" })
        ));
    }

    #[test]
    fn intervals_with_units() {
        assert_eq!(parse_interval(b"5ms"), Some(5_000_000));
        assert_eq!(parse_interval(b"100us"), Some(100_000));
        assert_eq!(parse_interval(b"0.001s"), Some(1_000_000));
        assert_eq!(parse_interval(b"2"), Some(2_000_000));
        assert_eq!(parse_interval(b"0.5ms"), Some(500_000));
        assert_eq!(parse_interval(b"x"), None);
        assert_eq!(parse_interval(b"."), None);
        assert!(matches!(
            parse(b"--interval 50us"),
            Err(OptionError::BadValue {
                option: "--interval",
                ..
            })
        ));
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            parse(b"-pp -q").err(),
            Some(OptionError::Unknown { word: b"-q" })
        );
        assert_eq!(
            parse(b"-o").err(),
            Some(OptionError::MissingValue { option: "-o" })
        );
        assert_eq!(
            parse(b"-o 'abc").err(),
            Some(OptionError::UnterminatedQuote)
        );
        assert_eq!(parse(b"-pp -pr").err(), Some(OptionError::TwoPerfClocks));
        assert_eq!(
            parse(b"-pp --sampler timer").unwrap().sampler,
            Sampler::Timer
        );
        assert!(matches!(
            parse(b"-pp --sampler itimer").err(),
            Some(OptionError::BadValue {
                option: "--sampler",
                ..
            })
        ));
        let mut line = crate::base::log::Line::new();
        core::fmt::Write::write_fmt(
            &mut line,
            format_args!("{}", parse(b"-mo lots").err().unwrap()),
        )
        .unwrap();
        assert_eq!(
            line.as_bytes(),
            b"igprof: option -mo: bad value 'lots', expected none, include or delta"
        );
    }

    #[test]
    fn sample_bytes_and_seed() {
        let o = parse(b"-mp --sample-bytes 512K --sample-seed 18446744073709551615").unwrap();
        assert_eq!(o.sample_bytes, 512 * 1024);
        assert_eq!(o.sample_seed, Some(u64::MAX));
        assert_eq!(parse(b"-mp").unwrap().sample_bytes, 0);
        assert_eq!(parse(b"-mp --sample-bytes 1").unwrap().sample_bytes, 1);
        assert_eq!(
            parse(b"-mp --sample-bytes 2MiB").unwrap().sample_bytes,
            2 << 20
        );
        assert_eq!(
            parse(b"-mp --sample-bytes 16M").unwrap().sample_bytes,
            16 << 20
        );
        for bad in [
            &b"0"[..],
            b"17M",
            b"1G",
            b"-5",
            b"512X",
            b"",
            b"K",
            b"99999999999999999999",
        ] {
            let mut s = b"-mp --sample-bytes ".to_vec();
            s.extend_from_slice(bad);
            if bad.is_empty() {
                s.pop();
            }
            assert!(
                matches!(
                    parse(&s).err(),
                    Some(OptionError::BadValue {
                        option: "--sample-bytes",
                        ..
                    }) | Some(OptionError::MissingValue {
                        option: "--sample-bytes"
                    })
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            parse(b"-mp --sample-bytes 1K --sample-seed x1").err(),
            Some(OptionError::BadValue {
                option: "--sample-seed",
                ..
            })
        ));
        assert!(matches!(
            parse(b"-pp --sample-bytes 512K").err(),
            Some(OptionError::Conflict {
                option: "--sample-bytes",
                ..
            })
        ));
        assert!(matches!(
            parse(b"-mp --sample-seed 3").err(),
            Some(OptionError::Conflict {
                option: "--sample-seed",
                ..
            })
        ));
        assert!(matches!(
            parse(b"-mp -ep --sample-bytes 512K").err(),
            Some(OptionError::Conflict {
                option: "--sample-bytes",
                ..
            })
        ));
        let mut line = crate::base::log::Line::new();
        core::fmt::Write::write_fmt(
            &mut line,
            format_args!("{}", parse(b"-mp --sample-bytes 0").err().unwrap()),
        )
        .unwrap();
        assert_eq!(
            line.as_bytes(),
            &b"igprof: option --sample-bytes: bad value '0', expected a mean number of bytes between samples from 1 to 16M, e.g. 512K (K = 1024)"[..]
        );
    }

    #[test]
    fn target_filter_matches_basename_substrings() {
        let o = parse(b"-pp -t cpu_,python").unwrap();
        assert!(o.targets_match(b"/tmp/x/cpu_split"));
        assert!(o.targets_match(b"python3"));
        assert!(!o.targets_match(b"/usr/bin/sh"));
        assert!(!o.targets_match(b"/cpu_dir/sh"));
        assert!(parse(b"-pp").unwrap().targets_match(b"anything"));
    }

    #[test]
    fn function_specs_accumulate_in_order() {
        let o = parse(b"-fp:malloc -fpi:f:libm.so.6 -fpf:sqrt").unwrap();
        assert_eq!(
            o.function_specs().collect::<Vec<_>>(),
            ["-fp:malloc", "-fpi:f:libm.so.6", "-fpf:sqrt"]
        );
        assert_eq!(o.selected()[0].0, "-fp");
        let long = format!("-fp:{}", "f".repeat(1100));
        assert!(parse(long.as_bytes()).is_err());
    }
}
