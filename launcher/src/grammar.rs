//! The command line: IgProf's options into the `IGPROF` words, and the
//! usage text, both by walking the option table (`igprof-options`).
//!
//! What it owns: which word is an option and which is the program (the
//! first non-option, or the word after `--`), making -o and -D paths
//! absolute and quoting the values that may hold spaces, the checks of
//! the events crate's grammars (-e, -c, -ibs), and the usage text around
//! the table's lines.
//!
//! What it must never do: know an option the table does not list, accept
//! a value or a combination the table's checker refuses (the library
//! checks the same words with the same checker, and a run it refuses
//! would be a run without a profile), or look at anything but the
//! arguments and the current directory.
//!
//! Options are parsed by hand, not with clap: IgProf's single-dash long
//! options (`-pp`, `-mo`) and "the first non-option is the program, the
//! rest are its arguments" are simpler so, and the launcher stays small.

use std::borrow::Cow;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use igprof_options::{self as table, Id, Section, Value};

use crate::refusal::Refusal;

/// The usage text's head: `igprof -h` (stdout, exit 0); also on stderr
/// when no program is named.
const HEAD: &str = "\
igprof [options] [--] program [args...]
igprof --mark PID [--mark-signal N]   (a process run with -mp --marks)
igprof --attach PID [--for TIME] [options]   (a running process, x86-64)
igprof --detach PID | --dump PID [FILE]      (a process attached to)

IgProf's options (as IgProf spells them):
";

/// The usage text's tail: the environment the launcher reads.
const TAIL: &str = "\
Environment: IGPROF_LIB=/path/to/libigprof.so overrides the library search
(next to this program, ../lib, $CARGO_TARGET_DIR/release, then target/release
of the build tree this program is in).
A program of another architecture (AArch64 on x86-64, or the reverse) runs
under qemu-user (qemu-<arch> -L $QEMU_LD_PREFIX or /usr/<arch>-linux-gnu)
with the library built for it: IGPROF_LIB_AARCH64 / IGPROF_LIB_X86_64, else
<arch>/libigprof.so next to this program, else the build tree's
target/<arch>-unknown-linux-gnu/release (cargo build --release --target ...).
IGPROF_CACHE_DIR=DIR keeps what processes share (frame descriptors derived
once per object build-id, the hooked functions' plans) in DIR/unwind instead
of $XDG_CACHE_HOME/igprof-rs/unwind or ~/.cache/igprof-rs/unwind; none: off.
";

/// The usage text: every option of the table, in its order.
pub fn usage() -> String {
    let mut s = String::from(HEAD);
    // Writing into a String cannot fail.
    let _ = table::write_usage(&mut s, Section::IgProf);
    s.push_str("igprof-rs's own options:\n");
    let _ = table::write_usage(&mut s, Section::Own);
    s.push_str(TAIL);
    s
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Help,
    /// No program named: the usage on stderr, exit status 127.
    NoProgram,
    /// Run `args[program..]` with `IGPROF=igprof`.
    Run {
        igprof: Vec<u8>,
        program: usize,
        /// -o's path, made absolute (checked by `output_place` before
        /// the run).
        output: Option<Vec<u8>>,
    },
}

/// The refusal of a table error.
fn refusal(e: table::Error) -> Refusal {
    Refusal::Option(e.to_string())
}

/// `text` as UTF-8, for the events crate's parsers.
fn text(v: &[u8]) -> Result<&str, Refusal> {
    std::str::from_utf8(v)
        .map_err(|_| Refusal::BadEvent(format!("'{}' is not text", String::from_utf8_lossy(v))))
}

/// The events crate's check of the value of -e, -c or -ibs (other options
/// pass: the table checks them).
fn check_events(id: Id, v: &[u8]) -> Result<(), Refusal> {
    match id {
        Id::Event => {
            igprof_events::parse(text(v)?).map_err(|e| Refusal::BadEvent(e.to_string()))?;
        }
        Id::Count => {
            for spec in igprof_events::split_list(text(v)?) {
                let s = igprof_events::parse(spec).map_err(|e| Refusal::BadEvent(e.to_string()))?;
                if s.period.is_some() {
                    return Err(Refusal::BadEvent(format!(
                        "event '{spec}': a counted event (-c) takes no period"
                    )));
                }
            }
        }
        Id::Ibs => {
            igprof_events::ibs::parse_request(text(v)?).map_err(Refusal::BadIbs)?;
        }
        _ => {}
    }
    Ok(())
}

/// Translates the options (`args`, without argv[0]) into IGPROF's words,
/// joined by single spaces; `pwd` gives the directory relative -o and -D
/// paths are made absolute against (the program's processes may run in
/// other directories and must write where the user asked).
pub fn parse(args: &[OsString], pwd: &mut dyn FnMut() -> Vec<u8>) -> Result<Request, Refusal> {
    let mut words: Vec<Cow<[u8]>> = Vec::with_capacity(args.len());
    let mut output = None;
    let mut check = table::Checker::new();
    let mut i = 0;
    while i < args.len() {
        let word = args[i].as_bytes();
        if word == b"--" {
            i += 1;
            break;
        }
        let Some(opt) = table::find(word) else {
            if word.starts_with(b"-") {
                return Err(refusal(table::Error::Unknown { word }));
            }
            break;
        };
        if opt.id == Id::Help {
            return Ok(Request::Help);
        }
        let given = match opt.takes_value() {
            true => args.get(i + 1).map(|v| v.as_bytes()),
            false => None,
        };
        // Paths are made absolute; paths and names are quoted in IGPROF.
        let quoted = matches!(opt.value, Value::Path | Value::Names);
        let value: Option<Cow<[u8]>> = match given {
            Some(v) if matches!(opt.value, Value::Path) && !v.starts_with(b"/") => {
                Some([&pwd()[..], b"/", v].concat().into())
            }
            v => v.map(Cow::from),
        };
        if quoted && value.as_deref().is_some_and(|v| v.contains(&b'\'')) {
            return Err(Refusal::Quote(word.to_vec()));
        }
        // The events crate's grammars first: their messages say what is
        // wrong with an event; the table's then bound the lists' length.
        match opt.is_prefix() {
            true => check_events(opt.id, word)?,
            false => {
                if let Some(v) = value.as_deref() {
                    check_events(opt.id, v)?;
                }
            }
        }
        check.check(opt, word, value.as_deref()).map_err(refusal)?;
        if opt.id == Id::Output {
            output = value.as_deref().map(<[u8]>::to_vec);
        }
        words.push(word.into());
        match value {
            Some(v) if quoted => words.push([b"'", &v[..], b"'"].concat().into()),
            Some(v) => words.push(v),
            None => {}
        }
        i += 1 + opt.takes_value() as usize;
    }
    if i >= args.len() {
        return Ok(Request::NoProgram);
    }
    check.finish().map_err(refusal)?;
    Ok(Request::Run {
        igprof: words.join(&b' '),
        program: i,
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
                format!("option -fp: bad value '{bad}', expected a function name, e.g. -fp:malloc or -fp:deflate:libz.so.1")
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
                "-pp", "-o", "x.gz", "-t", "a,b", "-i", "1ms", "--depth", "50", "prog", "-mp"
            ]),
            "-pp -o '/w/x.gz' -t 'a,b' -i 1ms --depth 50"
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
            "--memory-profile --memory-overhead delta --output '/abs/p.gz' -D '/w/flag'"
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
            (&["--memory-overhead", "all", "p"], "option --memory-overhead: bad value 'all', expected none, include or delta"),
            (&["--output", "it's.gz", "p"], "--output: a value containing ' cannot be passed"),
            (&["-t", "a'b", "p"], "-t: a value containing ' cannot be passed"),
            (&["--sampler", "perf", "p"], "option --sampler: bad value 'perf', expected auto, sigtrap, sigprof or timer"),
            (&["-mp", "--sample-bytes", "0", "p"], "option --sample-bytes: bad value '0', expected a mean number of bytes between samples from 1 to 16M, e.g. 512K (K = 1024)"),
            (&["-mp", "--sample-seed", "18446744073709551616", "p"], "option --sample-seed: bad value '18446744073709551616', expected a decimal number from 0 to 18446744073709551615"),
            // Values the library refuses are refused here, before the run.
            (&["--depth", "5", "p"], "option --depth: bad value '5', expected 16 to 65536"),
            (&["-pp", "-i", "0", "p"], "option -i: bad value '0', expected a time from 100us to 1s, e.g. 5ms, 100us, 0.5ms"),
            (&["--dump-signal", "99", "p"], "option --dump-signal: bad value '99', expected a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF, or 0"),
            (&["--toggle-signal", "19", "p"], "option --toggle-signal: bad value '19', expected a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF"),
            (&["--dump-every", "1ms", "p"], "option --dump-every: bad value '1ms', expected a time of at least 100ms, e.g. 60 (seconds), 10s, 500ms"),
            // An event's own grammar speaks first.
            (&["-e", "", "p"], "-e: event '': empty: name an event (e.g. page-faults, cycles, cpu/event=0xc0/)"),
            (&["-e", "page faults", "p"], "-e: event 'page faults': ' ' cannot appear in an event"),
            (&["-pp", "-pu", "p"], "only one of -pp, -pu, -pr may be given"),
            (&["-pp", "--sample-bytes", "1K", "p"], "--sample-bytes samples the memory profiler's allocations: add -mp"),
            (&["-mp", "-eu", "--sample-bytes", "1K", "p"], "--sample-bytes cannot be combined with -ep/-ei/-eu (they inspect every block): drop one of them"),
            (&["-mp", "--sample-seed", "1", "p"], "--sample-seed seeds the allocation sampler: add --sample-bytes N"),
        ] {
            assert_eq!(refusal_of(a), says, "{a:?}");
        }
        // A value is never taken for an option: --depth -mp is a bad depth.
        assert_eq!(
            refusal_of(&["--depth", "-mp", "--sample-bytes", "1K", "p"]),
            "option --depth: bad value '-mp', expected 16 to 65536"
        );
        // Paths past the library's storage, and lists past it.
        let long = "d".repeat(table::PATH_MAX);
        assert!(refusal_of(&["-o", &long, "p"]).starts_with("option -o: bad value '/w/ddd"));
        let t = "t".repeat(600);
        assert!(refusal_of(&["-t", &t, "-t", &t, "p"]).starts_with("option -t: bad value 'ttt"));
    }

    #[test]
    fn the_usage_lists_every_option_of_the_table() {
        let u = usage();
        for o in table::TABLE {
            for n in o.names {
                assert!(
                    u.lines()
                        .any(|l| l.trim_start().starts_with(o.names[0]) && l.contains(n)),
                    "{n} not in\n{u}"
                );
            }
        }
        assert!(u.starts_with(HEAD) && u.ends_with(TAIL));
        assert!(
            u.contains("igprof-rs's own options:\n  -e, --event EVENT[/PERIOD] sample"),
            "{u}"
        );
    }
}
