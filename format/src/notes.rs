//! The notes after the program's name in the header: `N=(./app [note; note])`.
//!
//! Owns how notes are joined to the name and split from it, and the notes
//! whose meaning a reader relies on: when the process started and when the
//! dump was written (`started 1764322074.123456`, `dumped 1764322080.5`,
//! seconds since the Unix epoch), which tell a file of this process from
//! one left by another process with the same pid (a JIT's perf map).
//!
//! The timeline note (`--sample-every`, `--dump-every`): the process's
//! totals at regular times since it started, written by the library and
//! read by igprof-analyse (`--timeline`, `--between`, the HTML chart):
//!
//! ```text
//! timeline = "timeline " every_ms " " column { "," column } { " " point }
//! point    = value { "," value }          (one value per column)
//! value    = [ "-" ] digits | "-"         ("-" alone: not known)
//! ```
//!
//! The first column is `t_ms`, milliseconds since the process started;
//! the others name what was measured then (`cpu_ms`, `rss_kib`,
//! `peak_rss_kib`, and `COUNTER.count` / `COUNTER.total`, the sums of a
//! counter's two values over the whole profile). Points are in time order;
//! `every_ms` is the step between them (it doubles when the fixed number
//! of points is full and every other point is dropped), the last point may
//! be closer.
//!
//! Must never: produce a note with `)` (IgProf's reader ends the name at
//! the first), `[`, `]` or `;` (they delimit notes).

use std::time::Duration;

/// The label of the note saying when the process (the profiled image)
/// started.
pub const STARTED: &str = "started";
/// The label of the note saying when the dump was written.
pub const DUMPED: &str = "dumped";

/// `program` followed by its notes, as the header's N=() holds them.
pub fn join(program: &[u8], notes: &[String]) -> Vec<u8> {
    let mut out = program.to_vec();
    if !notes.is_empty() {
        out.extend_from_slice(b" [");
        out.extend_from_slice(notes.join("; ").as_bytes());
        out.push(b']');
    }
    out
}

/// The program's name and its notes (none when the name does not end
/// with a bracketed list).
pub fn split(program: &str) -> (&str, Vec<&str>) {
    let Some(inner) = program.strip_suffix(']') else {
        return (program, Vec::new());
    };
    match inner.rfind(" [") {
        Some(open) if !inner[open + 2..].contains(['[', ']']) => {
            (&program[..open], inner[open + 2..].split("; ").collect())
        }
        _ => (program, Vec::new()),
    }
}

/// A time note: `LABEL SECONDS.MICROSECONDS` since the Unix epoch.
pub fn time_note(label: &str, since_epoch: Duration) -> String {
    format!(
        "{label} {}.{:06}",
        since_epoch.as_secs(),
        since_epoch.subsec_micros()
    )
}

/// The time of the note `label` among the notes of `program`.
pub fn time(program: &str, label: &str) -> Option<Duration> {
    let (_, notes) = split(program);
    notes.iter().find_map(|n| {
        let value = n.strip_prefix(label)?.strip_prefix(' ')?;
        let (secs, frac) = value.split_once('.').unwrap_or((value, "0"));
        if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let nanos: u32 = format!("{frac:0<9}").parse().ok()?;
        Some(Duration::new(secs.parse().ok()?, nanos))
    })
}

/// The label of the note a snapshot carries: a dump the process wrote
/// while it ran (near its memory limit, on request, periodically), not its
/// final profile. The final profile, written under the same name, has
/// none: a file that still carries it is from a process that died before
/// writing its final profile, or still runs.
pub const SNAPSHOT: &str = "snapshot";

/// The snapshot note, saying why it was written (the characters a note
/// may not hold are replaced by spaces).
pub fn snapshot_note(why: &str) -> String {
    format!("{SNAPSHOT} {}", why.replace([')', '[', ']', ';'], " "))
}

/// Why the dump whose program name is `program` is a snapshot; None for a
/// final profile.
pub fn snapshot(program: &str) -> Option<&str> {
    split(program)
        .1
        .into_iter()
        .find_map(|n| n.strip_prefix(SNAPSHOT)?.strip_prefix(' '))
}

/// The label of the timeline note.
pub const TIMELINE: &str = "timeline";

/// A process's totals over time (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// The step between points, in milliseconds.
    pub every_ms: u64,
    /// The columns' names; the first is `t_ms`.
    pub columns: Vec<String>,
    /// One row per point, one value per column (None: not known).
    pub points: Vec<Vec<Option<i64>>>,
}

impl Timeline {
    /// The index of the column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

/// The timeline note's text.
pub fn timeline_note(t: &Timeline) -> String {
    use std::fmt::Write as _;
    let mut s = format!("{TIMELINE} {} {}", t.every_ms, t.columns.join(","));
    for p in &t.points {
        s.push(' ');
        for (i, v) in p.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            match v {
                Some(v) => {
                    let _ = write!(s, "{v}");
                }
                None => s.push('-'),
            }
        }
    }
    s
}

/// The timeline among the notes of `program`: None when there is no such
/// note, an error saying what is wrong with one that does not parse.
pub fn timeline(program: &str) -> Option<Result<Timeline, String>> {
    let (_, notes) = split(program);
    let body = notes
        .iter()
        .find_map(|n| n.strip_prefix(TIMELINE)?.strip_prefix(' '))?;
    Some(parse_timeline(body))
}

fn parse_timeline(body: &str) -> Result<Timeline, String> {
    let mut words = body.split(' ');
    let every_ms = words
        .next()
        .and_then(|w| w.parse::<u64>().ok())
        .ok_or("timeline note: no step in milliseconds")?;
    let columns: Vec<String> = words
        .next()
        .filter(|w| !w.is_empty())
        .ok_or("timeline note: no columns")?
        .split(',')
        .map(str::to_string)
        .collect();
    if columns[0] != "t_ms" || columns.iter().any(|c| c.is_empty()) {
        return Err("timeline note: the first column is not t_ms".into());
    }
    let mut points = Vec::new();
    for (i, w) in words.enumerate() {
        let row: Vec<Option<i64>> = w
            .split(',')
            .map(|v| match v {
                "-" => Ok(None),
                v => v.parse::<i64>().map(Some).map_err(|_| ()),
            })
            .collect::<Result<_, _>>()
            .map_err(|_| format!("timeline note: point {} is not a list of integers", i + 1))?;
        if row.len() != columns.len() || row[0].is_none() {
            return Err(format!(
                "timeline note: point {} has {} values for {} columns",
                i + 1,
                row.len(),
                columns.len()
            ));
        }
        points.push(row);
    }
    Ok(Timeline {
        every_ms,
        columns,
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_join_and_split_back() {
        let t = Duration::new(1_764_322_074, 123_456_789);
        let notes = vec![
            "sampled: --sample-bytes 1".to_string(),
            time_note(STARTED, t),
        ];
        let n = String::from_utf8(join(b"./a [x]", &notes)).unwrap();
        assert_eq!(
            n,
            "./a [x] [sampled: --sample-bytes 1; started 1764322074.123456]"
        );
        assert_eq!(split(&n), ("./a [x]", vec![notes[0].as_str(), &notes[1]]));
        assert_eq!(
            time(&n, STARTED),
            Some(Duration::new(1_764_322_074, 123_456_000))
        );
        assert_eq!(time(&n, DUMPED), None);
        assert_eq!(join(b"./a", &[]), b"./a");
        assert_eq!(split("./a"), ("./a", vec![]));
        assert_eq!(split("./a [b] c]"), ("./a [b] c]", vec![]));
        assert_eq!(time("./a [started x.1]", STARTED), None);
        assert_eq!(
            time("./a [started 12]", STARTED),
            Some(Duration::from_secs(12))
        );
        assert_eq!(time("./a [startedx 12.5]", STARTED), None);
    }

    #[test]
    fn a_snapshot_says_why_and_a_final_profile_does_not() {
        let why = "at 90.1 MiB of the cgroup's 96.0 MiB memory limit; [x] (y)";
        let n = String::from_utf8(join(
            b"./a",
            &[
                snapshot_note(why),
                time_note(DUMPED, Duration::from_secs(5)),
            ],
        ))
        .unwrap();
        assert_eq!(
            snapshot(&n),
            Some("at 90.1 MiB of the cgroup's 96.0 MiB memory limit   x  (y ")
        );
        assert_eq!(time(&n, DUMPED), Some(Duration::from_secs(5)));
        assert_eq!(snapshot("./a [dumped 5.0]"), None);
        assert_eq!(snapshot("./a [snapshots 1]"), None);
        assert_eq!(snapshot("./a"), None);
    }

    #[test]
    fn timeline_note_round_trip_and_errors() {
        let t = Timeline {
            every_ms: 1000,
            columns: vec!["t_ms".into(), "rss_kib".into(), "MEM_LIVE.total".into()],
            points: vec![
                vec![Some(0), None, Some(0)],
                vec![Some(1000), Some(512), Some(-3)],
            ],
        };
        let note = timeline_note(&t);
        assert_eq!(
            note,
            "timeline 1000 t_ms,rss_kib,MEM_LIVE.total 0,-,0 1000,512,-3"
        );
        let n =
            String::from_utf8(join(b"./a", &[time_note(STARTED, Duration::ZERO), note])).unwrap();
        assert_eq!(timeline(&n), Some(Ok(t)));
        assert_eq!(timeline("./a [started 1.0]"), None);
        for (bad, why) in [
            ("timeline x t_ms", "no step"),
            ("timeline 5 rss 1", "first column"),
            (
                "timeline 5 t_ms,rss 1",
                "point 1 has 1 values for 2 columns",
            ),
            ("timeline 5 t_ms 1 x", "point 2 is not"),
            ("timeline 5 t_ms,rss -,1", "point 1 has"),
        ] {
            let e = timeline(&format!("./a [{bad}]")).unwrap().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
