//! igprof-analyse command line: IgProf's options (including its multi-letter
//! single-dash forms such as `-mr`, `-ml`, `-nf`, `-js`), turned into a
//! [`Config`]. Errors are one line on stderr and exit status 1.
#![forbid(unsafe_code)]
use clap::{CommandFactory, Parser, ValueEnum};
use igprof_analyse::{filters, profile::ReadOptions, symbols, views, Config, Output};
use std::io::Write;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Value {
    /// The accumulated amount.
    Normal,
    /// The peak amount.
    Peak,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Order {
    Ascending,
    Descending,
}

/// Reports from IgProf-format profiles (IgProf's and igprof-rs's): flat
/// cumulative and self profiles and a call graph, as IgProf prints them.
///
/// Profiles may be plain, gzip or bzip2; several files, or a directory of
/// them, are merged by symbol.
/// Function names come from the program and libraries named in the profile
/// (symbol tables, DWARF, separate debug files), else from the profile.
/// Debug files found in no debug directory are fetched by build id from the
/// debuginfod servers of DEBUGINFOD_URLS (plain http://, cached in
/// DEBUGINFOD_CACHE_PATH or ~/.cache/debuginfod_client; DEBUGINFOD_TIMEOUT
/// seconds per request, default 5).
#[derive(Parser, Debug)]
#[command(name = "igprof-analyse", version, max_term_width = 100)]
struct Args {
    /// Counter to report (PERF_TICKS, MEM_TOTAL, MEM_LIVE, MEM_MAX, FD_USED,
    /// FD_LIVE, MMAP_TOTAL, MMAP_LIVE, NRG_*...); default: the first counter
    /// in the profile.
    #[arg(short = 'r', long = "report", value_name = "COUNTER")]
    report: Option<String>,
    /// Use each counter's normal (accumulated) or peak value.
    #[arg(long, value_enum, default_value = "normal")]
    value: Value,
    /// Rank functions by cumulative count, largest first (ascending, IgProf's
    /// default) or smallest first (descending).
    #[arg(short = 'o', long, value_enum, default_value = "ascending")]
    order: Order,
    /// Show the number of distinct call paths (-p).
    #[arg(short = 'p', long)]
    paths: bool,
    /// Show call counts (-c; on by default for MEM_* counters).
    #[arg(short = 'c', long)]
    calls: bool,
    /// Rename and merge functions: s/REGEXP/REPLACEMENT/[;s/.../.../] applied
    /// to the name, else to the library; \1.. are groups (-mr; repeatable).
    #[arg(long = "merge-regexp", value_name = "S/RE/WITH/")]
    merge_regexp: Vec<String>,
    /// Merge all functions of a library into one entry named after it (-ml).
    #[arg(long = "merge-libraries")]
    merge_libraries: bool,
    /// Rename the function that completes the ancestor chain A>B>... to NEW,
    /// and everything below it to NEW:NAME (-ma).
    #[arg(long = "merge-ancestors", value_name = "A>B>.../NEW")]
    merge_ancestors: Option<String>,
    /// Keep the profiler's own frames and the malloc family (-nf).
    #[arg(long = "no-filter")]
    no_filter: bool,
    /// Text report (default) (-t).
    #[arg(short = 't', long)]
    text: bool,
    /// SQL for sqlite3 in IgProf's schema, on stdout (-s).
    #[arg(short = 's', long)]
    sqlite: bool,
    /// Write an SQLite database file in IgProf's schema (igprof-navigator).
    #[arg(long, value_name = "FILE")]
    db: Option<String>,
    /// JSON in IgProf's layout (-js).
    #[arg(long)]
    json: bool,
    /// The N call paths with the largest self counts (-tn).
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// The call tree as an indented outline (-T).
    #[arg(short = 'T', long)]
    tree: bool,
    /// Show each function's library (-l).
    #[arg(short = 'l', long)]
    libs: bool,
    /// Demangle C++, Rust and Fortran (gfortran module procedure) names (-d).
    #[arg(short = 'd', long)]
    demangle: bool,
    /// Accepted for IgProf compatibility: symbol resolution is built in and
    /// on by default (no gdb, nm or objdump is run) (-g).
    #[arg(short = 'g', long)]
    gdb: bool,
    /// Do not read the program and its libraries: use the names recorded in
    /// the profile (IgProf without -g).
    #[arg(long)]
    no_symbols: bool,
    /// Show each function inlined into another as a frame of its own,
    /// below the function it is inlined into (from DWARF), in every report
    /// and view (pprof: one location with a line per function).
    #[arg(long)]
    inline: bool,
    /// Append the source file and line of each call site to names.
    #[arg(long)]
    lines: bool,
    /// Also look for separate debug files under DIR (by build id,
    /// DIR/.build-id/xx/yyyy.debug, and by .gnu_debuglink, DIR/NAME and
    /// DIR/<object's directory>/NAME); repeatable, searched in order before
    /// /usr/lib/debug.
    #[arg(long, value_name = "DIR")]
    debug_dir: Vec<String>,
    /// Read the objects of a profile taken on another machine (another
    /// architecture, a container) from its root DIR: an object /P is read
    /// from DIR/P, else from /P (symbolic links in DIR are followed inside
    /// DIR); in a Debian cross root /usr/TRIPLET, /lib/TRIPLET/X and
    /// /usr/lib/TRIPLET/X are also looked for as DIR/lib/X. Debug files are
    /// also looked for under DIR/usr/lib/debug, before /usr/lib/debug.
    /// Objects found nowhere keep the names recorded in the profile.
    #[arg(long, value_name = "DIR")]
    sysroot: Option<String>,
    /// With --sysroot: read absolute object paths only under it, never
    /// from this machine (objects not there keep their recorded names).
    #[arg(long = "sysroot-only", requires = "sysroot")]
    sysroot_only: bool,
    /// Name JIT code from this perf map (`START SIZE NAME` lines) or jitdump
    /// FILE, used as it is for every profile, or from the perf-PID.map and
    /// jit-PID.dump files of each profiled process in DIR; repeatable.
    /// Without it, they are looked for next to the profile, then in /tmp,
    /// and used only if written while the process lived.
    #[arg(long = "jit-map", value_name = "FILE|DIR")]
    jit_map: Vec<String>,
    /// Print progress messages on stderr (-v).
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Subtract this profile (the baseline) from the others (-b).
    #[arg(short = 'b', long, value_name = "FILE")]
    baseline: Option<String>,
    /// With --baseline: percentages are changes relative to the baseline (-D).
    #[arg(short = 'D', long = "diff-mode")]
    diff_mode: bool,
    /// Ignore call paths whose count is above VALUE (-Mc).
    #[arg(long = "max-count-value", value_name = "VALUE")]
    max_count: Option<i64>,
    /// Ignore call paths whose count is below VALUE (-mc).
    #[arg(long = "min-count-value", value_name = "VALUE")]
    min_count: Option<i64>,
    /// Ignore call paths with more than VALUE calls (-Mf).
    #[arg(long = "max-calls-value", value_name = "VALUE")]
    max_calls: Option<i64>,
    /// Ignore call paths with fewer than VALUE calls (-mf).
    #[arg(long = "min-calls-value", value_name = "VALUE")]
    min_calls: Option<i64>,
    /// Ignore call paths whose count per call is above VALUE (-Ma).
    #[arg(long = "max-average-value", value_name = "VALUE")]
    max_average: Option<i64>,
    /// Ignore call paths whose count per call is below VALUE.
    #[arg(long = "min-average-value", value_name = "VALUE")]
    min_average: Option<i64>,
    /// Write folded stacks (`a;b;c VALUE`, root first) to FILE ('-': stdout)
    /// instead of the report; with -b, two values: baseline and profiles.
    #[arg(long, value_name = "FILE")]
    folded: Option<String>,
    /// Write an interactive SVG flame graph to FILE; with -b a differential
    /// one (red: grew, blue: shrank).
    #[arg(long, value_name = "FILE.svg")]
    flame: Option<String>,
    /// With --flame: draw it top-down (an icicle graph).
    #[arg(long)]
    icicle: bool,
    /// Write a gzipped pprof profile (profile.proto) to FILE: one or two
    /// sample types per counter, every counter of the profile without -r.
    #[arg(long, value_name = "FILE.pb.gz")]
    pprof: Option<String>,
    /// Write a callgrind file (KCachegrind, callgrind_annotate) to FILE
    /// ('-': stdout): one event per counter, every counter without -r.
    #[arg(long, value_name = "FILE")]
    callgrind: Option<String>,
    /// Write a self-contained HTML page to FILE: counter selector, sortable
    /// table, callers and callees, flame graph with zoom and search.
    #[arg(long, value_name = "FILE.html")]
    html: Option<String>,
    /// Write the run's timeline as CSV to FILE ('-': stdout): the
    /// newest dump's points (--sample-every, --dump-every) and its top
    /// allocation sites' live bytes at each snapshot given.
    #[arg(long, value_name = "FILE.csv")]
    timeline: Option<String>,
    /// Report what changed between two times of a run (seconds since the
    /// process started): the dumps given that were written last by T1 and
    /// by T2 are compared as -b compares a baseline.
    #[arg(long, num_args = 2, value_names = ["T1", "T2"], allow_negative_numbers = false)]
    between: Option<Vec<f64>>,
    /// Profiles to read, merged into one report. A directory stands for
    /// every file in it (a run directory: one profile per process). With
    /// several inputs, `.tmp` leftovers, empty and damaged files are skipped
    /// with a warning each.
    #[arg(value_name = "FILE|DIR", required = true)]
    files: Vec<String>,
}

/// IgProf's multi-letter single-dash options and their long forms.
const ALIASES: [(&str, &str); 11] = [
    ("-mr", "--merge-regexp"),
    ("-ml", "--merge-libraries"),
    ("-ma", "--merge-ancestors"),
    ("-nf", "--no-filter"),
    ("-js", "--json"),
    ("-tn", "--top"),
    ("-Mc", "--max-count-value"),
    ("-mc", "--min-count-value"),
    ("-Mf", "--max-calls-value"),
    ("-mf", "--min-calls-value"),
    ("-Ma", "--max-average-value"),
];

fn fail(msg: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "igprof-analyse: {msg}");
    std::process::exit(1);
}

/// Every option, for the unknown-option message.
fn all_options() -> String {
    let cmd = Args::command();
    let mut v: Vec<String> = Vec::new();
    for a in cmd.get_arguments() {
        let mut names = Vec::new();
        if let Some(s) = a.get_short() {
            names.push(format!("-{s}"));
        }
        if let Some(l) = a.get_long() {
            if let Some((short, _)) = ALIASES.iter().find(|(_, long)| long[2..] == *l) {
                names.push(short.to_string());
            }
            names.push(format!("--{l}"));
        }
        if !names.is_empty() {
            v.push(names.join("/"));
        }
    }
    v.push("-h/--help".into());
    v.join(", ")
}

/// What the run is asked for besides the report (timeline.rs).
struct Timeline {
    csv: Option<String>,
    between: Option<(f64, f64)>,
}

fn parse() -> (Config, Timeline) {
    let mut argv: Vec<String> = std::env::args().collect();
    let mut after_dashdash = false;
    for a in argv.iter_mut().skip(1) {
        if a == "--" {
            after_dashdash = true;
        }
        if !after_dashdash {
            if let Some((_, long)) = ALIASES.iter().find(|(s, _)| s == a) {
                *a = long.to_string();
            }
        }
    }
    let args = match Args::try_parse_from(&argv) {
        Ok(a) => a,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                e.exit()
            }
            clap::error::ErrorKind::UnknownArgument => {
                let what = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "?".into());
                fail(&format!(
                    "unknown option '{what}'; the options are: {}",
                    all_options()
                ));
            }
            _ => {
                let msg = e.to_string();
                let first = msg
                    .lines()
                    .next()
                    .unwrap_or("bad arguments")
                    .trim_start_matches("error: ");
                let values = msg
                    .lines()
                    .find(|l| l.contains("possible values"))
                    .map(|l| format!(" {}", l.trim()))
                    .unwrap_or_default();
                fail(&format!("{first}{values} (see --help)"));
            }
        },
    };
    if args.diff_mode && args.baseline.is_none() {
        fail("--diff-mode (-D) needs --baseline (-b) FILE");
    }
    if let Some(root) = &args.sysroot {
        if !std::path::Path::new(root).is_dir() {
            fail(&format!("--sysroot {root}: not a directory"));
        }
    }
    for m in &args.jit_map {
        if !std::path::Path::new(m).exists() {
            fail(&format!(
                "--jit-map {m}: no such file or directory (give a perf map, a jitdump, or a directory of them)"
            ));
        }
    }
    let mut merge_regexp = Vec::new();
    for m in &args.merge_regexp {
        match filters::parse_merge_regexp(m) {
            Ok(r) => merge_regexp.extend(r),
            Err(e) => fail(&e.to_string()),
        }
    }
    let merge_ancestors = args
        .merge_ancestors
        .as_deref()
        .map(|a| filters::parse_merge_ancestors(a).unwrap_or_else(|e| fail(&e.to_string())));
    let output = if let Some(db) = args.db {
        Output::Db(db)
    } else if args.json {
        Output::Json
    } else if args.sqlite {
        Output::Sql
    } else {
        Output::Text
    };
    let _ = (args.text, args.gdb);
    let between = args.between.as_ref().map(|b| (b[0], b[1]));
    if between.is_some() && args.baseline.is_some() {
        fail("--between chooses the baseline itself: drop -b");
    }
    let timeline = Timeline {
        csv: args.timeline.clone(),
        between,
    };
    if args.icicle && args.flame.is_none() {
        fail("--icicle draws the --flame graph top-down: it needs --flame FILE.svg");
    }
    let mut views = views::Views::default();
    let mut view = |format, path: Option<String>| {
        if let Some(path) = path {
            views.requests.push(views::Request { format, path });
        }
    };
    view(views::Format::Folded, args.folded);
    view(
        views::Format::Flame {
            icicle: args.icicle,
        },
        args.flame,
    );
    view(views::Format::Pprof, args.pprof);
    view(views::Format::Callgrind, args.callgrind);
    view(views::Format::Html, args.html);
    let cfg = Config {
        files: args.files,
        key: args.report,
        read: ReadOptions {
            peak: matches!(args.value, Value::Peak),
            min_count: args.min_count.unwrap_or(-1),
            max_count: args.max_count.unwrap_or(-1),
            min_calls: args.min_calls.unwrap_or(-1),
            max_calls: args.max_calls.unwrap_or(-1),
            min_average: args.min_average.unwrap_or(-1),
            max_average: args.max_average.unwrap_or(-1),
        },
        descending: matches!(args.order, Order::Descending),
        show_paths: args.paths,
        show_calls: if args.calls { Some(true) } else { None },
        show_libs: args.libs,
        demangle: args.demangle,
        no_filter: args.no_filter,
        merge_libraries: args.merge_libraries,
        merge_regexp,
        merge_ancestors,
        output,
        top: args.top.unwrap_or(0),
        tree: args.tree,
        baseline: args.baseline,
        diff_mode: args.diff_mode,
        symbols: symbols::Options {
            enabled: !args.no_symbols,
            inline: args.inline,
            lines: args.lines,
            debug_dirs: args
                .debug_dir
                .iter()
                .map(std::path::PathBuf::from)
                .chain(
                    args.sysroot
                        .iter()
                        .map(|r| std::path::Path::new(r).join("usr/lib/debug")),
                )
                .chain([symbols::SYSTEM_DEBUG_DIR.into()])
                .collect(),
            sysroot: args.sysroot.as_ref().map(Into::into),
            sysroot_only: args.sysroot_only,
            debuginfod: igprof_analyse::debuginfod::Config::from_env(),
            jit: igprof_analyse::jit::Search {
                given: args.jit_map.iter().map(Into::into).collect(),
            },
        },
        verbose: args.verbose,
        views,
    };
    (cfg, timeline)
}

/// `--timeline`: the CSV, then the end of the run.
fn write_timeline(cfg: &Config, to: &str) -> Result<(), String> {
    let series =
        igprof_analyse::timeline::series(&cfg.files, |path| igprof_analyse::live_sites(cfg, path))?;
    let mut text = Vec::new();
    series
        .write_csv(&mut text)
        .map_err(|e| format!("cannot write the timeline: {e}"))?;
    if to == "-" {
        std::io::stdout()
            .write_all(&text)
            .map_err(|e| format!("cannot write the timeline: {e}"))
    } else {
        igprof_analyse::views::write_file(to, &text).map_err(|e| format!("cannot write {to}: {e}"))
    }
}

fn main() {
    let (mut cfg, timeline) = parse();
    if let Some(to) = &timeline.csv {
        if let Err(e) = write_timeline(&cfg, to) {
            fail(&e);
        }
        return;
    }
    if cfg
        .views
        .requests
        .iter()
        .any(|r| r.format == views::Format::Html)
    {
        // The page charts the run's timeline when the inputs have one.
        let cfg2 = cfg.clone();
        cfg.views.timeline = igprof_analyse::timeline::series(&cfg2.files, |path| {
            igprof_analyse::live_sites(&cfg2, path)
        })
        .ok();
    }
    if let Some((t1, t2)) = timeline.between {
        match igprof_analyse::timeline::between(&cfg.files, t1, t2) {
            Ok((baseline, file, line)) => {
                eprintln!("igprof-analyse: {line}");
                cfg.baseline = baseline;
                cfg.files = vec![file];
            }
            Err(e) => fail(&e),
        }
    }
    // Deep call trees: run on a thread with a generous stack.
    let worker = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
            let r = igprof_analyse::run(&cfg, &mut out, &mut |w| {
                let _ = writeln!(std::io::stderr(), "igprof-analyse: warning: {w}");
            });
            let flushed = out.flush();
            match (r, flushed) {
                (Err(igprof_analyse::Error::BrokenPipe), _) => Ok(()),
                (Err(e), _) => Err(e.to_string()),
                (Ok(()), Err(e)) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(format!("cannot write the report: {e}"))
                }
                _ => Ok(()),
            }
        });
    match worker.map(|h| h.join()) {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(m))) => fail(&m),
        _ => fail("internal error"),
    }
}
