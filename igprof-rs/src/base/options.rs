//! Options of the injected library, parsed from the `IGPROF` environment
//! variable into fixed-size storage.
//!
//! As in IgProf, the launcher puts the profiler's options in `IGPROF` (it is
//! inherited by children, so fork+exec'd programs are profiled again). The
//! value is the launcher's option words, e.g. `-pp -z -o 'out dir/p.gz'`;
//! a word may be single-quoted to hold spaces. Which words there are, what
//! values they take and which combinations are refused is the option table
//! of the `igprof-options` crate, which the launcher walks too (so a run it
//! starts never fails here); this file only stores each value where its
//! module reads it.
//!
//! Must never: allocate or panic. Parsing is pure over a byte string so that
//! it is unit-tested; [`init`] runs once in the constructor, before any hook
//! or thread of ours exists, and is the only writer of the global options.

use core::cell::UnsafeCell;
use core::fmt;
use igprof_options as table;

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
    /// sigtrap when the kernel has it (5.13+), else sigprof, else timer;
    /// sigprof in a process a debugger traces (which stops at SIGTRAP).
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
    /// `--jit`: the runtimes' JIT maps turned on and copied (modules/jit).
    pub jit: bool,
    /// -mm: anonymous mappings (modules/mmap).
    pub mmap: bool,
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
    /// `--sample-every`: add a point to the timeline this often (0: as
    /// [`Options::timeline_ns`] says).
    pub sample_every_ns: u64,
    /// `--marks` (or `--mark-every`): -mp's epochs (modules/mem/epoch).
    pub marks: bool,
    /// `--mark-every TIME`: a mark every TIME (0: none).
    pub mark_every_ns: u64,
    /// `--mark-signal N`: the signal of `igprof --mark PID`.
    pub mark_signal: i32,
    /// `--snapshot-above SIZE`: RSS at which a snapshot is written (0: none).
    pub snapshot_above: u64,
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
/// Largest `--sample-bytes` (see `mem::sample`).
pub const MAX_SAMPLE_BYTES: u64 = table::MAX_SAMPLE_BYTES;

impl Options {
    pub const fn new() -> Self {
        Options {
            perf: None,
            mem: false,
            mem_overhead: MemOverhead::None,
            fd: false,
            jit: false,
            mmap: false,
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
            sample_every_ns: 0,
            marks: false,
            mark_every_ns: 0,
            mark_signal: table::DEFAULT_MARK_SIGNAL,
            snapshot_above: 0,
            sample_bytes: 0,
            sample_seed: None,
            start_disabled: false,
            fork_keep: false,
            toggle_signal: 0,
        }
    }

    /// How often the timeline gets a point: `--sample-every`, else every
    /// second with `--dump-every`; 0: no timeline.
    pub fn timeline_ns(&self) -> u64 {
        match (self.sample_every_ns, self.dump_every_ns) {
            (0, 0) => 0,
            (0, _) => 1_000_000_000,
            (n, _) => n,
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
        if self.mmap {
            v.push(("-mm", "the mapping profiler"));
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
            "-mm" => self.mmap = false,
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

/// What is wrong with the option string: a refusal of the option table
/// (the launcher's words), or a quote the launcher never writes unclosed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionError<'a> {
    Table(table::Error<'a>),
    UnterminatedQuote,
}

impl<'a> From<table::Error<'a>> for OptionError<'a> {
    fn from(e: table::Error<'a>) -> Self {
        OptionError::Table(e)
    }
}

impl fmt::Display for OptionError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Said of IGPROF: here it was set by hand (the launcher never
            // writes an unknown word), and the user must look there.
            OptionError::Table(table::Error::Unknown { word }) => write!(
                f,
                "unknown option '{}' in IGPROF (see igprof -h)",
                table::Bytes(word)
            ),
            OptionError::Table(e) => e.fmt(f),
            OptionError::UnterminatedQuote => write!(f, "unterminated ' quote in IGPROF"),
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

/// Appends `v` to the `sep`-separated list in `f` (the table's checker has
/// made sure it fits: [`table::LIST_MAX`]).
fn append(f: &mut FixedStr<1024>, sep: u8, v: &[u8]) {
    let mut joined = [0u8; 1024];
    let old = f.as_bytes();
    let n = old.len() + (!old.is_empty()) as usize + v.len();
    if n >= joined.len() {
        return;
    }
    joined[..old.len()].copy_from_slice(old);
    if !old.is_empty() {
        joined[old.len()] = sep;
    }
    joined[n - v.len()..n].copy_from_slice(v);
    let _ = f.set(&joined[..n]);
}

/// Parses the whole option string: each word is looked up in the option
/// table, its value checked there; what remains here is where each value
/// goes.
pub fn parse(s: &[u8]) -> Result<Options, OptionError<'_>> {
    use table::{Id, Parsed};
    let mut o = Options::new();
    let mut check = table::Checker::new();
    let mut words = Words { s };
    while let Some(w) = words.next() {
        let w = w?;
        if w == b"igprof" {
            continue; // IgProf put its own name first; accepted for compatibility.
        }
        let opt = match table::find(w) {
            Some(opt) if opt.module != table::LAUNCHER => opt,
            _ => return Err(table::Error::Unknown { word: w }.into()),
        };
        let value = match opt.takes_value() {
            true => words.next().transpose()?,
            false => None,
        };
        let v = check.check(opt, w, value)?;
        let text = match v {
            Parsed::Text(t) => t,
            _ => b"",
        };
        let n = v.number();
        match opt.id {
            Id::Help | Id::Jemalloc => {} // jemalloc is found as the allocator that defines malloc.
            Id::PerfCpu => o.perf = Some(PerfClock::Cpu),
            Id::PerfUser => o.perf = Some(PerfClock::User),
            Id::PerfReal => o.perf = Some(PerfClock::Real),
            Id::ProfileDisabled => o.start_disabled = true,
            Id::PerfKeep => o.fork_keep = true,
            Id::Mem => o.mem = true,
            // Choices in the table's order.
            Id::MemOverhead => {
                o.mem_overhead =
                    [MemOverhead::None, MemOverhead::Include, MemOverhead::Delta][n as usize]
            }
            Id::Fd => o.fd = true,
            Id::Jit => o.jit = true,
            Id::Marks => o.marks = true,
            Id::MarkEvery => {
                o.marks = true;
                o.mark_every_ns = n;
            }
            Id::SnapshotAbove => o.snapshot_above = n,
            Id::MarkSignal => {
                o.marks = true;
                o.mark_signal = n as i32;
            }
            Id::Mmap => o.mmap = true,
            // Several accumulate (resolved by the module at start-up and
            // after each dlopen).
            Id::Functions => append(&mut o.functions, b' ', text),
            Id::Energy => o.energy = true,
            Id::EmptyEp => o.empty = Some(EmptyMode::Ep),
            Id::EmptyEi => o.empty = Some(EmptyMode::Ei),
            Id::EmptyEu => o.empty = Some(EmptyMode::Eu),
            Id::Finst => o.finst = true,
            Id::Output => {
                let _ = o.output.set(text);
            }
            Id::Compress => o.gzip = true,
            Id::Target => append(&mut o.targets, b',', text),
            Id::DumpFlag => {
                let _ = o.flag_file.set(text);
            }
            Id::Debug => o.debug = true,
            // Several -e, -c, -ibs accumulate (resolved by the module at
            // start-up).
            Id::Event => append(&mut o.events, b' ', text),
            Id::Count => append(&mut o.counts, b' ', text),
            Id::Ibs => append(&mut o.ibs, b' ', text),
            Id::PageFaults => o.page_faults = true,
            Id::OffCpu => o.off_cpu = true,
            Id::Interval => o.interval_ns = n,
            Id::Depth => o.max_depth = n as usize,
            Id::Sampler => {
                o.sampler = [
                    Sampler::Auto,
                    Sampler::Sigtrap,
                    Sampler::Sigprof,
                    Sampler::Timer,
                ][n as usize]
            }
            Id::SampleBytes => o.sample_bytes = n,
            Id::SampleSeed => o.sample_seed = Some(n),
            Id::DumpSignal => o.dump_signal = n as i32,
            Id::DumpEvery => o.dump_every_ns = n,
            Id::SampleEvery => o.sample_every_ns = n,
            Id::ToggleSignal => o.toggle_signal = n as i32,
        }
    }
    check.finish()?;
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
        assert_eq!(
            parse(b"-e").err(),
            Some(OptionError::Table(table::Error::MissingValue {
                option: "-e"
            }))
        );
    }

    #[test]
    fn intervals_with_units() {
        assert_eq!(parse(b"-pp --interval 0.5ms").unwrap().interval_ns, 500_000);
        assert_eq!(parse(b"-pp -i 2").unwrap().interval_ns, 2_000_000);
        assert_eq!(
            parse(b"-pp --dump-every 2").unwrap().dump_every_ns,
            2_000_000_000
        );
        assert!(matches!(
            parse(b"--interval 50us"),
            Err(OptionError::Table(table::Error::BadValue {
                option: "--interval",
                ..
            }))
        ));
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            parse(b"-pp -q").err(),
            Some(OptionError::Table(table::Error::Unknown { word: b"-q" }))
        );
        let mut line = crate::base::log::Line::new();
        core::fmt::Write::write_fmt(&mut line, format_args!("{}", parse(b"-q").err().unwrap()))
            .unwrap();
        assert_eq!(
            line.as_bytes(),
            b"igprof: unknown option '-q' in IGPROF (see igprof -h)"
        );
        assert_eq!(
            parse(b"-o").err(),
            Some(OptionError::Table(table::Error::MissingValue {
                option: "-o"
            }))
        );
        assert_eq!(
            parse(b"-o 'abc").err(),
            Some(OptionError::UnterminatedQuote)
        );
        assert!(matches!(
            parse(b"-pp -pr").err(),
            Some(OptionError::Table(table::Error::Conflict { .. }))
        ));
        assert_eq!(
            parse(b"-pp --sampler timer").unwrap().sampler,
            Sampler::Timer
        );
        assert!(matches!(
            parse(b"-pp --sampler itimer").err(),
            Some(OptionError::Table(table::Error::BadValue {
                option: "--sampler",
                ..
            }))
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
                    Some(OptionError::Table(table::Error::BadValue {
                        option: "--sample-bytes",
                        ..
                    })) | Some(OptionError::Table(table::Error::MissingValue {
                        option: "--sample-bytes"
                    }))
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            parse(b"-mp --sample-bytes 1K --sample-seed x1").err(),
            Some(OptionError::Table(table::Error::BadValue {
                option: "--sample-seed",
                ..
            }))
        ));
        assert!(matches!(
            parse(b"-pp --sample-bytes 512K").err(),
            Some(OptionError::Table(table::Error::Conflict { .. }))
        ));
        assert!(matches!(
            parse(b"-mp --sample-seed 3").err(),
            Some(OptionError::Table(table::Error::Conflict { .. }))
        ));
        assert!(matches!(
            parse(b"-mp -ep --sample-bytes 512K").err(),
            Some(OptionError::Table(table::Error::Conflict { .. }))
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
