//! The table's own checks: every entry reachable and listed, the value
//! grammars, the limits of the library's storage and the rules between
//! options.

extern crate std;
use super::*;
use std::string::String;
use std::vec::Vec;

fn check<'a>(words: &[&'a str]) -> Result<Vec<Parsed<'a>>, String> {
    let mut c = Checker::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w: &'a [u8] = words[i].as_bytes();
        let opt = find(w).ok_or_else(|| std::format!("{}", Error::Unknown { word: w }))?;
        let v = words.get(i + 1).map(|v| v.as_bytes());
        out.push(c.check(opt, w, v).map_err(|e| std::format!("{e}"))?);
        i += 1 + opt.takes_value() as usize;
    }
    c.finish().map_err(|e| std::format!("{e}"))?;
    Ok(out)
}

#[test]
fn every_spelling_finds_its_entry_once() {
    let mut seen = Vec::new();
    for o in TABLE {
        for n in o.names {
            assert!(!seen.contains(n), "{n} twice");
            seen.push(*n);
            let word = std::format!("{n}{}", if o.is_prefix() { "x" } else { "" });
            assert_eq!(find(word.as_bytes()).map(|f| f.id), Some(o.id), "{n}");
        }
        assert!(!o.help.is_empty() && !o.module.is_empty(), "{:?}", o.id);
        assert_eq!(
            o.takes_value() || o.is_prefix(),
            !o.arg.is_empty(),
            "{:?}",
            o.id
        );
        assert_eq!(
            matches!(o.value, Value::Flag),
            o.expected.is_empty(),
            "{:?}",
            o.id
        );
    }
    assert!(find(b"-q").is_none() && find(b"-fp").is_none() && find(b"--").is_none());
    assert_eq!(entry(Id::Depth).name(), "--depth");
    assert_eq!(entry(Id::Interval).spelling(b"--interval"), "--interval");
    assert_eq!(entry(Id::Interval).spelling(b"-i"), "-i");
    assert_eq!(entry(Id::Functions).spelling(b"-fpi:f"), "-fp");
    assert_eq!(entry(Id::Functions).name(), "-fp");
}

#[test]
fn usage_lists_every_entry() {
    let mut text = String::new();
    write_usage(&mut text, Section::IgProf).unwrap();
    write_usage(&mut text, Section::Own).unwrap();
    for o in TABLE {
        let line = text
            .lines()
            .position(|l| {
                l.trim_start().starts_with(o.names[0]) && o.names.iter().all(|n| l.contains(n))
            })
            .unwrap_or_else(|| panic!("{:?} not in\n{text}", o.names));
        let lines: Vec<&str> = text.lines().collect();
        let joined = lines[line..(line + o.help.len() + 1).min(lines.len())].join("\n");
        for h in o.help {
            assert!(joined.contains(h), "{h} not in\n{joined}");
        }
    }
    assert!(
        text.contains("  -pp, --perf-profile        CPU time"),
        "{text}"
    );
    assert!(
        text.contains("      --depth N              stack depth"),
        "{text}"
    );
    assert!(
        text.contains("  -fp:FUNC[:LIB], -fpi:FUNC[:LIB], -fpf:FUNC[:LIB]\n"),
        "{text}"
    );
    assert!(text.lines().all(|l| l.len() <= 80), "{text}");
}

#[test]
fn values_out_of_range_are_refused_naming_the_option() {
    for (words, says) in [
        (&["--depth", "5"][..], "option --depth: bad value '5', expected 16 to 65536"),
        (&["-i", "0"], "option -i: bad value '0', expected a time from 100us to 1s, e.g. 5ms, 100us, 0.5ms"),
        (&["--interval", "50us"], "option --interval: bad value '50us'"),
        (&["--dump-signal", "99"], "option --dump-signal: bad value '99', expected a signal number 1..64 other than SIGKILL, SIGSTOP, SIGPROF, or 0"),
        (&["--dump-signal", "9"], "option --dump-signal: bad value '9'"),
        (&["--toggle-signal", "0"], "option --toggle-signal: bad value '0'"),
        (&["--dump-every", "50ms"], "option --dump-every: bad value '50ms'"),
        (&["-mo", "lots"], "option -mo: bad value 'lots', expected none, include or delta"),
        (&["--sampler", "perf"], "option --sampler: bad value 'perf'"),
        (&["-fp:"], "option -fp: bad value '-fp:', expected a function name"),
        (&["-fpf::libc.so.6"], "option -fp: bad value '-fpf::libc.so.6'"),
        (&["-e", "a b"], "option -e: bad value 'a b'"),
        (&["--depth"], "option --depth needs a value (see igprof -h)"),
        (&["-pq"], "unknown option '-pq' (see igprof -h)"),
    ] {
        let e = check(words).unwrap_err();
        assert!(e.starts_with(says), "{words:?}: {e}");
    }
    let ok = check(&[
        "--depth",
        "16",
        "-i",
        "1ms",
        "--dump-signal",
        "0",
        "--dump-every",
        "60",
        "--toggle-signal",
        "43",
    ])
    .unwrap();
    assert_eq!(
        ok,
        [
            Parsed::Number(16),
            Parsed::Number(1_000_000),
            Parsed::Number(0),
            Parsed::Number(60_000_000_000),
            Parsed::Number(43)
        ]
    );
    assert_eq!(
        check(&["--sampler", "timer", "-mo", "delta"]).unwrap(),
        [Parsed::Choice(3), Parsed::Choice(2)]
    );
}

#[test]
fn sample_bytes_and_seed_rules() {
    let bytes = |v: &'static str| parse_value(&entry(Id::SampleBytes).value, v.as_bytes());
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
        assert!(bytes(ok).is_some(), "{ok}");
    }
    assert_eq!(bytes("512K"), Some(Parsed::Number(512 << 10)));
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
        "999999999999G",
        "1Mib",
        "+1",
        "99999999999999999999",
    ] {
        assert!(bytes(bad).is_none(), "{bad}");
    }
    let seed = |v: &'static str| parse_value(&entry(Id::SampleSeed).value, v.as_bytes());
    for ok in [
        "0",
        "42",
        "18446744073709551615",
        "00000000000000000001",
        "9999999999999999999",
    ] {
        assert!(seed(ok).is_some(), "{ok}");
    }
    assert_eq!(seed("18446744073709551615"), Some(Parsed::Number(u64::MAX)));
    for bad in [
        "",
        "-1",
        "18446744073709551616",
        "99999999999999999999",
        "1e3",
        "0x10",
    ] {
        assert!(seed(bad).is_none(), "{bad}");
    }
}

#[test]
fn times_with_units() {
    assert_eq!(parse_time(b"5ms", 1_000_000), Some(5_000_000));
    assert_eq!(parse_time(b"100us", 1_000_000), Some(100_000));
    assert_eq!(parse_time(b"0.001s", 1_000_000), Some(1_000_000));
    assert_eq!(parse_time(b"2", 1_000_000), Some(2_000_000));
    assert_eq!(parse_time(b"2", 1_000_000_000), Some(2_000_000_000));
    assert_eq!(parse_time(b"0.5ms", 1_000_000), Some(500_000));
    assert_eq!(parse_time(b"x", 1), None);
    assert_eq!(parse_time(b".", 1), None);
    assert_eq!(parse_time(b"1.0000000001s", 1), None);
    // A bare number counts the option's unit, decimals or not: seconds
    // for --dump-every, milliseconds for -i.
    assert_eq!(
        check(&["--dump-every", "1.5"]).unwrap(),
        [Parsed::Number(1_500_000_000)]
    );
    assert_eq!(
        check(&["--dump-every", "150"]).unwrap(),
        [Parsed::Number(150_000_000_000)]
    );
    assert_eq!(
        check(&["-pp", "-i", "1.5"]).unwrap(),
        [Parsed::None, Parsed::Number(1_500_000)]
    );
    assert!(check(&["--dump-every", "0.09"]).is_err());
}

#[test]
fn rules_between_options() {
    for (words, says) in [
        (
            &["-pp", "-pr"][..],
            "only one of -pp, -pu, -pr may be given",
        ),
        (&["-c", "cycles"], "-c counts beside the CPU samples"),
        (
            &["-pp", "--sample-bytes", "1K"],
            "--sample-bytes samples the memory profiler's allocations: add -mp",
        ),
        (
            &["-mp", "-eu", "--sample-bytes", "1K"],
            "--sample-bytes cannot be combined with -ep/-ei/-eu",
        ),
        (
            &["-mp", "--sample-seed", "1"],
            "--sample-seed seeds the allocation sampler: add --sample-bytes N",
        ),
    ] {
        let e = check(words).unwrap_err();
        assert!(e.starts_with(says), "{words:?}: {e}");
    }
    for ok in [
        &["-pp", "--perf-profile", "-pp"][..],
        &["-pu", "-c", "cycles"],
        &["-mp", "--sample-bytes", "1K", "--sample-seed", "3"],
    ] {
        assert!(check(ok).is_ok(), "{ok:?}");
    }
}

#[test]
fn lists_fit_the_librarys_storage() {
    let name = "f".repeat(500);
    let a = std::format!("-fp:{name}");
    // Two words of 504 bytes and a space: 1009; a third does not fit.
    assert!(check(&[&a, &a]).is_ok());
    assert!(check(&[&a, &a, &a])
        .unwrap_err()
        .starts_with("option -fp: bad value"));
    let t = "t".repeat(511);
    assert!(check(&["-t", &t, "-t", &t]).is_ok());
    let e = check(&["-t", &t, "-t", &t, "-t", "x"]).unwrap_err();
    assert!(
        e.starts_with("option -t: bad value 'x', expected names under 1024 bytes"),
        "{e}"
    );
    let long = std::format!("/{}", "p".repeat(PATH_MAX));
    assert!(check(&["-o", &long])
        .unwrap_err()
        .starts_with("option -o: bad value"));
    assert!(check(&["-o", &long[1..]]).is_ok());
}
