//! igprof-analyse: reads IgProf-format profiles (IgProf's own and igprof-rs's)
//! and prints IgProf's reports.
//!
//! Data flow: `input` expands run directories into their files and opens
//! (and decompresses, on a thread) each file, `profile` reads it with the streaming reader of `igprof-format` (parsing on
//! a second thread) into one merged call tree, naming functions through
//! `symbols`; `filters` rewrite the tree as IgProf's analyser does; `flat`
//! turns it into per-function rows; `text`, `tree_top` and `formats` print
//! them. This module wires the steps for one invocation.
//!
//! Where this analyser knowingly differs from IgProf's (each difference only
//! shows where IgProf's output is broken or depends on external tools):
//! - names are resolved before nodes are merged, so two return addresses in
//!   one function always merge (IgProf merges libc frames by the name before
//!   gdb renames them, and can show a function twice);
//! - `-mr` merges renamed nodes by name (IgProf creates a new symbol per node
//!   and can list one name twice); `-ma` names descendants `NEW:NAME` (IgProf
//!   appends one more `:` to NEW at every node);
//! - `--top N` stops after the last non-zero entry (IgProf prints a dangling
//!   `## Entry k (` line);
//! - times between -1 and 0 s keep their sign (IgProf prints -0.5 as `0.50`);
//! - JSON and SQL strings are escaped, and symbol/file ids are small integers
//!   instead of pointer values;
//! - `-o descending` works (IgProf reads the option name as its value);
//! - a profile without any counter value (a process that recorded nothing)
//!   gives the empty report IgProf prints for an absent counter, with a
//!   warning, and status 0 (IgProf stops: "No counter values in profile
//!   data.", status 1); the absent counter itself also gets a warning naming
//!   the counters that are there;
//! - among several inputs, leftovers of a run (`.tmp`, 0-byte files) and
//!   damaged profiles are skipped with a warning (IgProf stops at the first
//!   one), and a directory stands for the files in it;
//! - an address without a symbol in a stripped object is named after the
//!   start of its function (from `.eh_frame`), not after itself, so one
//!   function is one entry (see `symbols`).
//!
//! Must never: link the injected profiler (its hooks would profile us), or
//! panic on bad input: every failure is an [`Error`] with a one-line message.
#![forbid(unsafe_code)]

pub mod debuginfod;
pub mod filters;
pub mod flat;
pub mod formats;
pub mod input;
pub mod jit;
pub mod journal;
pub mod profile;
pub mod symbols;
pub mod text;
pub mod timeline;
pub mod tree_top;
pub mod views;

use igprof_format::read::ReadError;
use profile::{Profile, ReadOptions};
use std::io::Write;

/// Output kinds (IgProf's -t, -s, -js; plus a database file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Text,
    Sql,
    Json,
    /// Write an SQLite database file directly.
    Db(String),
}

/// Everything one run needs, from the command line. The default is
/// `igprof-analyse FILES...` without options.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub files: Vec<String>,
    pub key: Option<String>,
    pub read: ReadOptions,
    pub descending: bool,
    pub show_paths: bool,
    pub show_calls: Option<bool>,
    pub show_libs: bool,
    pub demangle: bool,
    pub no_filter: bool,
    pub merge_libraries: bool,
    pub merge_regexp: Vec<filters::RegexRule>,
    pub merge_ancestors: Option<filters::Ancestors>,
    pub output: Output,
    pub top: usize,
    pub tree: bool,
    pub baseline: Option<String>,
    pub diff_mode: bool,
    pub symbols: symbols::Options,
    pub verbose: bool,
    /// Other output formats (`--folded`, `--flame`...), written instead of
    /// the report.
    pub views: views::Views,
}

/// A failed run: the message is printed as one line.
#[derive(Debug)]
pub enum Error {
    /// A profile or directory could not be opened.
    Open(input::OpenError),
    /// A profile is not readable as one (the message has file and line).
    Read(profile::LoadError),
    /// Every one of several inputs was skipped (each with a warning).
    NothingReadable { skipped: usize },
    /// Nothing left to print after filtering.
    NothingToPrint,
    /// Writing the report failed.
    Output(String),
    /// The reader of the report went away (e.g. `| head`): not an error.
    BrokenPipe,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Open(e) => e.fmt(f),
            Error::Read(e) => e.fmt(f),
            Error::NothingReadable { skipped } => write!(
                f,
                "none of the {skipped} input files is a readable profile (see the warnings above)"
            ),
            Error::Output(m) => write!(f, "{m}"),
            Error::NothingToPrint => write!(f, "could not find any information to print"),
            Error::BrokenPipe => write!(f, "output closed"),
        }
    }
}

impl std::error::Error for Error {}

/// Something the user should know about a run that still gives a report;
/// printed as `igprof-analyse: warning: ...` by the command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// The requested counter is not in the profiles: the report is empty,
    /// as IgProf's analyser prints it.
    CounterMissing { key: String, available: Vec<String> },
    /// No profile holds any counter value (a process that recorded nothing
    /// writes a header alone): the report is empty.
    NothingRecorded,
    /// One of several inputs is left out of the report: a leftover of the
    /// run, or a damaged profile (`line` is where reading stopped).
    Skipped {
        file: String,
        reason: String,
        line: Option<u64>,
    },
    /// A debug file could not be fetched (debuginfod), or a JIT map is
    /// missing or not used: the names stay what the objects (or the
    /// profile) give.
    Symbols(String),
    /// The newest dump of a process among the inputs is a snapshot it
    /// wrote while it ran, not its final profile (which replaces it under
    /// the same name): where there is none, the process died before
    /// writing it, or still runs.
    Snapshot { file: String, why: String },
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::CounterMissing { key, available } => write!(
                f,
                "counter '{key}' is not in the profile; it has: {} (choose one with -r)",
                available.join(", ")
            ),
            Warning::NothingRecorded => write!(
                f,
                "no counter values in the profile data: nothing was recorded"
            ),
            Warning::Symbols(m) => write!(f, "{m}"),
            Warning::Snapshot { file, why } => write!(
                f,
                "{file} is a snapshot written while the process ran ({why}), not its final profile: \
                 where the process wrote none, it died first (SIGKILL, the OOM killer) or still runs"
            ),
            Warning::Skipped { file, reason, line } => {
                write!(f, "skipping {file}: {reason}")?;
                match line {
                    Some(n) => write!(f, " (line {n})"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The counter named in the report when no profile has any counter and none
/// was asked for with `-r`.
pub const NO_COUNTER: &str = "<none>";

fn verbose(cfg: &Config, msg: &str) {
    if cfg.verbose {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let t = START.get_or_init(std::time::Instant::now).elapsed();
        eprintln!("igprof-analyse: [{:7.3} s] {msg}", t.as_secs_f64());
    }
}

fn read_file(
    p: &mut Profile,
    path: &str,
    res: &mut symbols::Resolver,
    opts: &ReadOptions,
    negate: bool,
) -> Result<(), Error> {
    let input = input::open(path).map_err(Error::Open)?;
    p.read(input, path, res, opts, negate).map_err(Error::Read)
}

/// What a read error says without its `file:line:` prefix, and the line.
fn skip_reason(e: &ReadError) -> (String, Option<u64>) {
    let full = e.to_string();
    let (prefix, line) = match e {
        ReadError::Empty { file } => (format!("{file}: "), None),
        ReadError::Syntax { at, column, .. } => (format!("{at}:{column}: "), Some(at.line)),
        ReadError::Io { at, .. }
        | ReadError::Truncated { at }
        | ReadError::Undefined { at, .. }
        | ReadError::Redefined { at, .. }
        | ReadError::IdTooLarge { at, .. }
        | ReadError::BadDepth { at, .. } => (format!("{at}: "), Some(at.line)),
    };
    let reason = full.strip_prefix(&prefix).unwrap_or(&full).to_string();
    let reason = match e {
        ReadError::Syntax { column, .. } => reason.replacen(
            "syntax error:",
            &format!("syntax error at column {column}:"),
            1,
        ),
        _ => reason,
    };
    (reason, line)
}

/// Reads the profiles of several inputs (a run directory, or files of
/// several processes) into `p`, leaving out, each with a warning, `.tmp`
/// and 0-byte leftovers, damaged profiles (taken back entirely when they
/// fail part-way) and listed files that vanished. Errors only when nothing
/// is left.
fn read_several(
    p: &mut Profile,
    sources: &[input::Source],
    cfg: &Config,
    res: &mut symbols::Resolver,
    warn: &mut dyn FnMut(Warning),
) -> Result<(), Error> {
    let mut skipped = 0;
    for src in sources {
        let path = &src.path;
        let mut skip = |reason: String, line: Option<u64>| {
            skipped += 1;
            warn(Warning::Skipped {
                file: path.clone(),
                reason,
                line,
            });
        };
        if let Some(why) = input::leftover(path) {
            skip(why.to_string(), None);
            continue;
        }
        verbose(cfg, &format!("reading {path}"));
        let opened = match input::open(path) {
            Ok(i) => i,
            Err(e) if src.listed => {
                let msg = e.to_string();
                let prefix = format!("{path}: ");
                skip(msg.strip_prefix(&prefix).unwrap_or(&msg).to_string(), None);
                continue;
            }
            Err(e) => return Err(Error::Open(e)),
        };
        match p.read_whole(opened, path, res, &cfg.read, false) {
            Ok(()) => {}
            Err(profile::LoadError::Read(e)) => {
                let (reason, line) = skip_reason(&e);
                skip(reason, line);
            }
        }
    }
    if skipped == sources.len() {
        return Err(Error::NothingReadable { skipped });
    }
    Ok(())
}

/// IgProf's `prepdata`: default filters, merges, cumulative counts.
pub fn prepare(p: &mut Profile, cfg: &Config) {
    let key = p.key.clone().unwrap_or_default();
    let is_max = key.ends_with("_MAX");
    if !cfg.no_filter {
        filters::remove_igprof(p, is_max);
        if key.starts_with("MEM_") {
            filters::fold_malloc(p, is_max);
        }
        if key == "MEM_LIVE" {
            filters::drop_gcc_pool_alloc(p);
        }
    }
    if cfg.merge_libraries {
        filters::merge_libraries(p, is_max);
    }
    if !cfg.merge_regexp.is_empty() {
        filters::merge_regexp(p, &cfg.merge_regexp, is_max);
    }
    if let Some(a) = &cfg.merge_ancestors {
        filters::merge_ancestors(p, a);
    }
    filters::add_cumulative(p, is_max);
}

/// The live bytes of each function (self MEM_LIVE, as the report names
/// it) in the dump at `path`: what `--timeline` and the page follow over a
/// run's snapshots.
pub fn live_sites(cfg: &Config, path: &str) -> Result<timeline::SiteValues, String> {
    let mut resolver = symbols::Resolver::new(cfg.symbols.clone());
    let mut p = Profile::new(Some("MEM_LIVE".to_string()));
    read_file(&mut p, path, &mut resolver, &cfg.read, false).map_err(|e| e.to_string())?;
    p.finish_reading();
    if !p.counters_seen.iter().any(|c| c == "MEM_LIVE") {
        return Ok(Default::default());
    }
    prepare(&mut p, cfg);
    let fl = flat::Flat::build(&mut p, false);
    let names = DisplayNames::new(&p, cfg.demangle);
    Ok(fl
        .infos
        .iter()
        .filter(|i| i.self_key[0] != 0)
        .map(|i| (text::Names::name(&names, i.sym).to_string(), i.self_key[0]))
        .collect())
}

/// Display names (demangled with -d) and files of every symbol.
pub struct DisplayNames {
    names: Vec<String>,
    files: Vec<String>,
}

impl DisplayNames {
    pub fn new(p: &Profile, demangle: bool) -> Self {
        let n = p.symbols.len();
        let names = (0..n as u32)
            .map(|s| {
                let name = p.symbols.name(s);
                if demangle {
                    symbols::demangle(name)
                } else {
                    name.to_string()
                }
            })
            .collect();
        let files = (0..n as u32)
            .map(|s| p.symbols.file_name(p.symbols.file(s)).to_string())
            .collect();
        DisplayNames { names, files }
    }
}

impl text::Names for DisplayNames {
    fn name(&self, sym: u32) -> &str {
        &self.names[sym as usize]
    }
    fn file(&self, sym: u32) -> &str {
        &self.files[sym as usize]
    }
}

/// Runs one invocation, writing the report to `out` and handing each
/// warning to `warn` as it arises.
pub fn run(cfg: &Config, out: &mut dyn Write, warn: &mut dyn FnMut(Warning)) -> Result<(), Error> {
    if !cfg.views.requests.is_empty() && cfg.views.sink.is_none() {
        return views::run(cfg, out, warn);
    }
    let mut resolver = symbols::Resolver::new(cfg.symbols.clone());
    let mut prof = Profile::new(cfg.key.clone());
    let mut base_flat = None;
    if let Some(b) = &cfg.baseline {
        verbose(cfg, &format!("reading baseline {b}"));
        let mut bp = Profile::new(cfg.key.clone());
        read_file(&mut bp, b, &mut resolver, &cfg.read, true)?;
        bp.finish_reading();
        prepare(&mut bp, cfg);
        let is_max = bp.key.as_deref().unwrap_or("").ends_with("_MAX");
        let f = flat::Flat::build(&mut bp, is_max);
        if prof.key.is_none() {
            prof.key = bp.key.clone();
        }
        read_file(&mut prof, b, &mut resolver, &cfg.read, true)?;
        base_flat = Some((bp, f));
    }
    // Several dumps of one process: the newest only (timeline.rs).
    let (files, same) = timeline::newest_of_each_image(&cfg.files);
    for line in same {
        verbose(cfg, &line);
    }
    let sources = input::expand(&files).map_err(Error::Open)?;
    if sources.several {
        read_several(&mut prof, &sources.files, cfg, &mut resolver, warn)?;
    } else {
        for f in &sources.files {
            verbose(cfg, &format!("reading {}", f.path));
            read_file(&mut prof, &f.path, &mut resolver, &cfg.read, false)?;
        }
    }
    prof.finish_reading();
    for w in resolver.take_warnings() {
        warn(Warning::Symbols(w));
    }
    for (file, why) in std::mem::take(&mut prof.snapshots) {
        warn(Warning::Snapshot { file, why });
    }
    // A counter without values gives IgProf's empty report: the same
    // headings, no rows (every count is zero).
    if prof.counters_seen.is_empty() {
        warn(Warning::NothingRecorded);
    } else if let Some(key) = prof
        .key
        .as_ref()
        .filter(|k| !prof.counters_seen.contains(k))
    {
        warn(Warning::CounterMissing {
            key: key.clone(),
            available: prof.counters_seen.clone(),
        });
    }
    let key = prof.key.clone().unwrap_or_else(|| NO_COUNTER.to_string());
    let is_max = key.ends_with("_MAX");
    let is_perf_ticks = key == "PERF_TICKS" || key.starts_with("NRG_");
    verbose(cfg, "applying filters");
    prepare(&mut prof, cfg);
    verbose(cfg, "building the call graph");
    let fl = flat::Flat::build(&mut prof, is_max);
    if fl.infos.is_empty() {
        return Err(Error::NothingToPrint);
    }
    let order = fl.ranked(&prof, cfg.descending);
    let names = DisplayNames::new(&prof, cfg.demangle);
    if let Some(sink) = &cfg.views.sink {
        let base = base_flat.as_ref().map(|(bp, _)| bp);
        return sink.take(&key, &prof, base, &names, cfg.demangle);
    }
    verbose(cfg, "writing the report");
    let io = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Error::BrokenPipe
        } else {
            Error::Output(format!("cannot write the report: {e}"))
        }
    };

    if cfg.top > 0 {
        return tree_top::top_n(out, &prof, cfg.top, is_perf_ticks, &names).map_err(io);
    }
    if cfg.tree {
        return tree_top::tree(out, &mut prof, &names).map_err(io);
    }
    let baseline = base_flat.as_ref().map(|(bp, bf)| flat::Baseline {
        flat: bf,
        profile: bp,
        diff_mode: cfg.diff_mode,
    });
    let (rows, totals) = flat::rows(&fl, &prof, &order, baseline.as_ref());
    match &cfg.output {
        Output::Text => {
            let style = text::Style {
                key: &key,
                is_perf_ticks,
                tick_period: prof.tick_period,
                show_calls: cfg.show_calls.unwrap_or(key.starts_with("MEM_")),
                show_paths: cfg.show_paths,
                show_libs: cfg.show_libs,
                diff_mode: cfg.diff_mode,
            };
            text::report(out, &style, &rows, totals, &names).map_err(io)
        }
        Output::Json => {
            formats::json(out, &key, totals, prof.tick_period, &rows, &prof, &names).map_err(io)
        }
        Output::Sql => {
            formats::sql(out, &key, totals, prof.tick_period, &rows, &prof, &names).map_err(io)
        }
        Output::Db(path) => {
            formats::sqlite_db(path, &key, totals, prof.tick_period, &rows, &prof, &names)
                .map_err(|e| Error::Output(format!("{path}: {e}")))
        }
    }
}
