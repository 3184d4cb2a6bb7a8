//! The notes after the program's name in the header: `N=(./app [note; note])`.
//!
//! Owns how notes are joined to the name and split from it, and the notes
//! whose meaning a reader relies on: when the process started and when the
//! dump was written (`started 1764322074.123456`, `dumped 1764322080.5`,
//! seconds since the Unix epoch), which tell a file of this process from
//! one left by another process with the same pid (a JIT's perf map).
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
}
