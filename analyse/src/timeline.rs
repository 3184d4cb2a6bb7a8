//! A run's dumps over time: which inputs are dumps of one process image
//! (same pid, same `started` note), the newest of them (the report) and
//! the others (its snapshots), `--timeline` (the newest dump's timeline
//! note as CSV, with its top allocation sites' live bytes at each
//! snapshot), `--between T1 T2` (the two dumps a window compares), and the
//! timeline the HTML page charts.
//!
//! Owns reading dumps' headers and the choices above. Must never: read a
//! dump's body to choose (only the header), or sum two dumps of one image.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use igprof_format::notes::{self, Timeline};

use crate::input;

/// One dump, from its header.
#[derive(Debug, Clone, PartialEq)]
pub struct Dump {
    pub path: String,
    pub pid: u64,
    pub started: Option<Duration>,
    pub dumped: Option<Duration>,
    /// The timeline note, if the dump has one (an error if it does not parse).
    pub timeline: Option<Result<Timeline, String>>,
}

impl Dump {
    /// Seconds since the process started when the dump was written.
    pub fn at(&self) -> Option<f64> {
        Some(self.dumped?.checked_sub(self.started?)?.as_secs_f64())
    }

    /// Whether `other` is a dump of the same image.
    fn same_image(&self, other: &Dump) -> bool {
        self.started.is_some() && self.pid == other.pid && self.started == other.started
    }
}

/// The header of the dump at `path`; None when it is not a readable dump.
pub fn header(path: &str) -> Option<Dump> {
    let input = input::open(path).ok()?;
    let reader = igprof_format::read::Reader::new(input, path).ok()?;
    let h = reader.header();
    Some(Dump {
        path: path.to_string(),
        pid: h.pid,
        started: notes::time(&h.program, notes::STARTED),
        dumped: notes::time(&h.program, notes::DUMPED),
        timeline: notes::timeline(&h.program),
    })
}

/// The inputs (files, or a directory's) grouped by image, each group's
/// dumps oldest first; files that are not dumps are left out.
pub fn images(files: &[String]) -> Result<Vec<Vec<Dump>>, String> {
    let sources = input::expand(files).map_err(|e| e.to_string())?;
    let mut groups: Vec<Vec<Dump>> = Vec::new();
    for s in &sources.files {
        let Some(d) = header(&s.path) else { continue };
        match groups.iter_mut().find(|g| g[0].same_image(&d)) {
            Some(g) => g.push(d),
            None => groups.push(vec![d]),
        }
    }
    for g in &mut groups {
        g.sort_by(|a, b| a.dumped.cmp(&b.dumped).then(a.path.cmp(&b.path)));
    }
    Ok(groups)
}

/// The inputs to read for a report: of several dumps of one image, only
/// the newest (a snapshot and the profile written after it hold the same
/// counts up to the snapshot: summed, they would count them twice).
/// Returns the files and, for `-v`, one line per image that had several.
pub fn newest_of_each_image(files: &[String]) -> (Vec<String>, Vec<String>) {
    let Ok(sources) = input::expand(files) else {
        return (files.to_vec(), Vec::new());
    };
    if !sources.several {
        return (files.to_vec(), Vec::new());
    }
    // (file, its header, how many dumps of its image were seen).
    let mut kept: Vec<(String, Option<Dump>, usize)> = Vec::new();
    for s in sources.files {
        // A leftover (a .tmp, an empty file) is the reader's to report.
        let d = match input::leftover(&s.path) {
            Some(_) => None,
            None => header(&s.path),
        };
        // Another dump of the image, written at another time (a copy of
        // one dump, damaged or not, is not a snapshot of it).
        let same = d.as_ref().and_then(|d| {
            kept.iter().position(|(_, k, _)| {
                k.as_ref()
                    .is_some_and(|k| k.same_image(d) && k.dumped != d.dumped)
            })
        });
        match (same, d) {
            (Some(i), Some(d)) => {
                let n = kept[i].2 + 1;
                if kept[i].1.as_ref().is_some_and(|k| k.dumped <= d.dumped) {
                    kept[i] = (s.path, Some(d), n);
                } else {
                    kept[i].2 = n;
                }
            }
            (_, d) => kept.push((s.path, d, 1)),
        }
    }
    let said = kept
        .iter()
        .filter(|(_, _, n)| *n > 1)
        .map(|(path, d, n)| {
            format!(
                "{n} dumps of one process (pid {}): the newest, {path}, is read",
                d.as_ref().map_or(0, |d| d.pid)
            )
        })
        .collect();
    (kept.into_iter().map(|(p, _, _)| p).collect(), said)
}

/// The one image of the inputs, or why not.
fn one_image(files: &[String], what: &str) -> Result<Vec<Dump>, String> {
    let mut groups = images(files)?;
    match groups.len() {
        0 => Err(format!("{what}: no dump among the inputs")),
        1 => Ok(groups.remove(0)),
        n => Err(format!(
            "{what}: the inputs are dumps of {n} processes; give the dumps of one (its profile and its .snap files)"
        )),
    }
}

/// `--between T1 T2`: the baseline (the newest dump written at or before
/// `t1`; None: before the first, an empty profile) and the dump to compare
/// with it (the newest at or before `t2`), and a line saying which.
pub fn between(
    files: &[String],
    t1: f64,
    t2: f64,
) -> Result<(Option<String>, String, String), String> {
    if t1 >= t2 {
        return Err(format!(
            "--between {t1} {t2}: the first time must be before the second"
        ));
    }
    let dumps = one_image(files, "--between")?;
    let at_or_before = |t: f64| dumps.iter().rev().find(|d| d.at().is_some_and(|a| a <= t));
    let Some(to) = at_or_before(t2) else {
        let first = dumps.iter().filter_map(Dump::at).next().unwrap_or(0.0);
        return Err(format!(
            "--between {t1} {t2}: no dump was written by {t2} s (the first at {first:.3} s)"
        ));
    };
    let from = at_or_before(t1);
    let line = match from {
        Some(f) => format!(
            "--between: {} ({:.3} s) against {} ({:.3} s)",
            to.path,
            to.at().unwrap_or(0.0),
            f.path,
            f.at().unwrap_or(0.0)
        ),
        None => format!(
            "--between: {} ({:.3} s) against the start (no dump by {t1} s)",
            to.path,
            to.at().unwrap_or(0.0)
        ),
    };
    Ok((from.map(|d| d.path.clone()), to.path.clone(), line))
}

/// Live bytes per function (self MEM_LIVE, the report's names) of the dump
/// at `path`.
pub type SiteValues = BTreeMap<String, i64>;

/// The image's timeline for `--timeline` and the page: its dumps, the
/// newest dump's timeline (None if it has none), and `sites(path)` asked
/// for each dump when there are several.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub dumps: Vec<Dump>,
    pub timeline: Option<Timeline>,
    /// Per dump (in `dumps`' order): live bytes per function.
    pub sites: Vec<SiteValues>,
}

/// How many allocation sites the CSV and the page follow.
pub const TOP_SITES: usize = 5;

/// Reads the inputs' one image: its dumps and timeline, and with several
/// dumps each one's live bytes per function (`sites`).
pub fn series(
    files: &[String],
    mut sites: impl FnMut(&str) -> Result<SiteValues, String>,
) -> Result<Series, String> {
    let dumps = one_image(files, "--timeline")?;
    let timeline = match dumps.last().and_then(|d| d.timeline.clone()) {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => return Err(format!("{}: {e}", dumps.last().map_or("", |d| &d.path))),
        None => None,
    };
    if timeline.is_none() && dumps.len() < 2 {
        return Err(format!(
            "{}: no timeline in this profile: run it with --sample-every TIME or --dump-every TIME",
            dumps[0].path
        ));
    }
    let per_dump = if dumps.len() > 1 {
        dumps
            .iter()
            .map(|d| sites(&d.path))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(Series {
        dumps,
        timeline,
        sites: per_dump,
    })
}

/// How many functions the page keeps per dump, enough for any window's
/// top changes: those with the most live bytes in any dump.
pub const PAGE_SITES: usize = 50;

impl Series {
    /// The [`PAGE_SITES`] functions with the most live bytes in any dump.
    pub fn page_sites(&self) -> Vec<String> {
        let mut best: BTreeMap<&String, i64> = BTreeMap::new();
        for d in &self.sites {
            for (n, &b) in d {
                let e = best.entry(n).or_insert(0);
                *e = (*e).max(b.abs());
            }
        }
        let mut v: Vec<(&String, i64)> = best.into_iter().filter(|(_, b)| *b > 0).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.into_iter()
            .take(PAGE_SITES)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The [`TOP_SITES`] functions with the most live bytes in the newest dump.
    pub fn top_sites(&self) -> Vec<String> {
        let Some(last) = self.sites.last() else {
            return Vec::new();
        };
        let mut v: Vec<(&String, &i64)> = last.iter().filter(|(_, &b)| b > 0).collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.into_iter()
            .take(TOP_SITES)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The CSV (`--timeline`): a row per point of the timeline (or per
    /// dump when there is none), `t_s` first, then the note's columns in
    /// readable units, then `live:<site>` for the top sites, filled on the
    /// row nearest each dump.
    pub fn write_csv(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let top = self.top_sites();
        let mut header = vec!["t_s".to_string()];
        let cols: Vec<(String, f64, bool)> = match &self.timeline {
            Some(t) => t.columns[1..]
                .iter()
                .map(|c| match c.as_str() {
                    "cpu_ms" => ("cpu_s".into(), 0.001, true),
                    "rss_kib" => ("rss_bytes".into(), 1024.0, false),
                    "peak_rss_kib" => ("peak_rss_bytes".into(), 1024.0, false),
                    other => (other.to_string(), 1.0, false),
                })
                .collect(),
            None => Vec::new(),
        };
        header.extend(cols.iter().map(|c| c.0.clone()));
        header.extend(top.iter().map(|s| csv_quote(&format!("live:{s}"))));
        writeln!(out, "{}", header.join(","))?;
        // Rows: the timeline's points, or the dumps' times.
        let times: Vec<f64> = match &self.timeline {
            Some(t) => t
                .points
                .iter()
                .map(|p| p[0].unwrap_or(0) as f64 / 1000.0)
                .collect(),
            None => self.dumps.iter().filter_map(Dump::at).collect(),
        };
        // The row each dump's sites go on: the nearest in time.
        let mut site_row: BTreeMap<usize, usize> = BTreeMap::new();
        if !top.is_empty() {
            for (i, d) in self.dumps.iter().enumerate() {
                let Some(at) = d.at() else { continue };
                if let Some((row, _)) = times
                    .iter()
                    .enumerate()
                    .min_by(|a, b| (a.1 - at).abs().total_cmp(&(b.1 - at).abs()))
                {
                    site_row.insert(row, i);
                }
            }
        }
        for (r, t) in times.iter().enumerate() {
            let mut row = vec![format!("{t:.3}")];
            if let Some(tl) = &self.timeline {
                for (c, (_, scale, fraction)) in tl.points[r][1..].iter().zip(&cols) {
                    row.push(match c {
                        None => String::new(),
                        Some(v) if *fraction => format!("{:.3}", *v as f64 * scale),
                        Some(v) => format!("{}", (*v as f64 * scale) as i64),
                    });
                }
            }
            for s in &top {
                row.push(match site_row.get(&r) {
                    Some(&d) => self.sites[d].get(s).copied().unwrap_or(0).to_string(),
                    None => String::new(),
                });
            }
            writeln!(out, "{}", row.join(","))?;
        }
        Ok(())
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(path: &str, pid: u64, started: u64, dumped_ms: u64) -> Dump {
        Dump {
            path: path.into(),
            pid,
            started: Some(Duration::from_secs(started)),
            dumped: Some(Duration::from_secs(started) + Duration::from_millis(dumped_ms)),
            timeline: None,
        }
    }

    #[test]
    fn dumps_of_one_image_are_told_apart_from_others() {
        let a = dump("a", 7, 100, 500);
        assert!(a.same_image(&dump("b", 7, 100, 900)));
        assert!(!a.same_image(&dump("c", 7, 101, 900)), "pid reused");
        assert!(!a.same_image(&dump("d", 8, 100, 900)));
        assert_eq!(a.at(), Some(0.5));
    }

    #[test]
    fn csv_fields_with_commas_are_quoted() {
        assert_eq!(csv_quote("live:f"), "live:f");
        assert_eq!(
            csv_quote("live:std::map<int, int>::at"),
            "\"live:std::map<int, int>::at\""
        );
        assert_eq!(csv_quote("a\"b,"), "\"a\"\"b,\"");
    }
}
