//! The text report laid out exactly as IgProf's analyser prints it: flat
//! cumulative, flat self and the gprof-style call graph; plus `--top N` and
//! `--tree`.
//!
//! Owns: number formatting (`1'234'567`, `1.96` seconds for time counters),
//! column widths, thresholds (cumulative >= 1%, self >= 0.01%; first row
//! below is still printed, as IgProf does) and separators.
//! Must never: compute values (they come from `flat::rows`).

use crate::flat::MainRow;
use std::io::{self, Write};

/// IgProf's `thousands(int64)`: `-1'234'567`.
pub fn thousands(v: i64) -> String {
    let digits = v.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if v < 0 {
        out.push('-');
    }
    let lead = match digits.len() % 3 {
        0 => 3,
        r => r,
    };
    let (head, tail) = digits.split_at(lead.min(digits.len()));
    out.push_str(head);
    for group in tail.as_bytes().chunks(3) {
        out.push('\'');
        out.push_str(std::str::from_utf8(group).unwrap_or(""));
    }
    out
}

/// IgProf's `thousands(double, 0, 2)`: `1'234.57`. Unlike IgProf, keeps the
/// sign of values between -1 and 0 (IgProf prints `-0.5` as `0.50`).
pub fn thousands_f(v: f64) -> String {
    let v = (v * 100.0).round() / 100.0;
    let int = v.trunc() as i64;
    let frac = format!("{:.2}", (v - v.trunc()).abs());
    let sign = if v < 0.0 && int == 0 { "-" } else { "" };
    format!("{sign}{}{}", thousands(int), &frac[1..])
}

/// How values are shown.
pub struct Style<'a> {
    pub key: &'a str,
    /// Header decoration (`@PAGES` etc.), normally empty.
    pub is_perf_ticks: bool,
    pub tick_period: f32,
    pub show_calls: bool,
    pub show_paths: bool,
    pub show_libs: bool,
    pub diff_mode: bool,
}

impl Style<'_> {
    fn value(&self, v: i64) -> String {
        if self.is_perf_ticks {
            thousands_f(v as f64 * self.tick_period as f64)
        } else {
            thousands(v)
        }
    }
}

/// Writes `n` spaces.
fn pad(out: &mut dyn Write, mut n: usize) -> io::Result<()> {
    const SPACES: &[u8; 64] = &[b' '; 64];
    while n > 0 {
        let k = n.min(SPACES.len());
        out.write_all(&SPACES[..k])?;
        n -= k;
    }
    Ok(())
}

/// printf's `%*s`: `text` right-aligned in `width` columns. (std's fill
/// writes padding one character at a time, which shows on large reports.)
fn right(out: &mut dyn Write, text: &str, width: usize) -> io::Result<()> {
    pad(out, width.saturating_sub(text.chars().count()))?;
    out.write_all(text.as_bytes())
}

/// printf's `%-*s`: `text` left-aligned in `width` columns.
fn left(out: &mut dyn Write, text: &str, width: usize) -> io::Result<()> {
    out.write_all(text.as_bytes())?;
    pad(out, width.saturating_sub(text.chars().count()))
}

/// IgProf's `PercentagePrinter`.
fn pct(out: &mut dyn Write, diff: bool, v: f32, decimals: usize) -> io::Result<()> {
    if diff && v == f32::MAX {
        write!(out, "    new  ")
    } else {
        write!(out, "{:7.*}  ", decimals, v as f64)
    }
}

/// Names and files of symbols, resolved by the caller (demangling etc.).
pub trait Names {
    fn name(&self, sym: u32) -> &str;
    fn file(&self, sym: u32) -> &str;
}

/// The full text report.
pub fn report(
    out: &mut dyn Write,
    s: &Style<'_>,
    rows: &[MainRow],
    totals: [i64; 2],
    names: &dyn Names,
) -> io::Result<()> {
    writeln!(out, "Counter: {}", s.key)?;
    let maxcnt = if s.is_perf_ticks {
        8.max(s.value(totals[0]).len())
            .max(s.value(totals[1]).len())
    } else {
        8.max(thousands(totals[0]).len())
            .max(thousands(totals[1]).len())
    };
    let maxval = maxcnt + usize::from(s.is_perf_ticks);
    let dashes = "-".repeat(70);
    let pct_title = if s.diff_mode {
        "delta %  "
    } else {
        "% total  "
    };
    let header = |out: &mut dyn Write, desc: &str, kind: &str| -> io::Result<()> {
        write!(out, "\n{dashes}\n{desc}\n\n")?;
        write!(out, "{pct_title}")?;
        write!(out, "{kind:>maxval$}  ")?;
        if s.show_calls {
            write!(out, "{:>maxcnt$}  ", "Calls")?;
        }
        if s.show_paths {
            write!(out, "{:>maxcnt$}  ", "Paths")?;
        }
        writeln!(out, "Function")
    };

    if s.diff_mode {
        header(
            out,
            "Flat profile (cumulatively different entries only)",
            "Total",
        )?;
    } else {
        header(out, "Flat profile (cumulative >= 1%)", "Total")?;
    }
    // One flat table: (percentage, decimals, value, calls, threshold) per row.
    let table = |out: &mut dyn Write,
                 rows: &mut dyn Iterator<Item = &MainRow>,
                 self_table: bool|
     -> io::Result<()> {
        for r in rows {
            let (p, decimals, value, calls, min) = if self_table {
                (r.self_pct, 2, r.self_, r.self_all[1], 0.01)
            } else {
                (r.pct, 1, r.cum, r.cum_all[1], 1.0)
            };
            pct(out, s.diff_mode, p, decimals)?;
            right(out, &s.value(value), maxval)?;
            pad(out, 2)?;
            if s.show_calls {
                right(out, &thousands(calls), maxcnt)?;
                pad(out, 2)?;
            }
            if s.show_paths {
                right(out, &thousands(r.self_all[2]), maxcnt)?;
                pad(out, 2)?;
            }
            write!(out, "{} [{}]", names.name(r.sym), r.rank)?;
            if s.show_libs {
                write!(out, "{}", names.file(r.sym))?;
            }
            writeln!(out)?;
            // IgProf prints the first row below the threshold, then stops.
            if (p < min && !s.diff_mode) || value == 0 {
                break;
            }
        }
        Ok(())
    };
    table(out, &mut rows.iter(), false)?;
    writeln!(out)?;

    let mut by_self: Vec<&MainRow> = rows.iter().collect();
    by_self.sort_by_key(|r| std::cmp::Reverse(r.self_.unsigned_abs()));
    if s.diff_mode {
        header(out, "Flat profile (self different entries only)", "Self")?;
    } else {
        header(out, "Flat profile (self >= 0.01%)", "Self")?;
    }
    table(out, &mut by_self.into_iter(), true)?;
    write!(out, "\n\n{dashes}\n")?;
    writeln!(out, "Call tree profile (cumulative)")?;

    let divlen = 34
        + 3 * maxval
        + if s.show_calls { 2 * maxcnt + 5 } else { 0 }
        + if s.show_paths { 2 * maxcnt + 5 } else { 0 };
    let sep = "- ".repeat(divlen.div_ceil(2));
    let dots = ".".repeat(maxval);
    let fraction = |out: &mut dyn Write, w: usize, a: &str, b: &str| -> io::Result<()> {
        right(out, a, w)?;
        out.write_all(b" / ")?;
        left(out, b, w)
    };
    for r in rows {
        write!(out, "\n{sep}\n")?;
        if r.rank % 10 == 1 {
            write!(out, "{:<8}", "Rank")?;
            write!(out, "{pct_title}")?;
            write!(out, "{:>maxval$}  ", "Self")?;
            fraction(out, maxval, "Self", "Children")?;
            write!(out, "  ")?;
            if s.show_calls {
                fraction(out, maxcnt, "Calls", "Total")?;
                write!(out, "  ")?;
            }
            if s.show_paths {
                fraction(out, maxcnt, "Paths", "Total")?;
                write!(out, "  ")?;
            }
            writeln!(out, "Function")?;
        }
        let edge = |out: &mut dyn Write, e: &crate::flat::EdgeRow| -> io::Result<()> {
            write!(out, "        ")?;
            if s.diff_mode && e.pct == f32::MAX {
                write!(out, "    new  ")?;
            } else {
                write!(out, "{:7.1}  ", e.pct as f64)?;
            }
            write!(out, "{dots}  ")?;
            fraction(
                out,
                maxval,
                &s.value(e.self_counts),
                &s.value(e.children_counts),
            )?;
            write!(out, "  ")?;
            if s.show_calls {
                fraction(
                    out,
                    maxcnt,
                    &thousands(e.self_calls),
                    &thousands(e.total_calls),
                )?;
                write!(out, "  ")?;
            }
            if s.show_paths {
                fraction(
                    out,
                    maxcnt,
                    &thousands(e.self_paths),
                    &thousands(e.total_paths),
                )?;
                write!(out, "  ")?;
            }
            write!(out, "  {} [{}]", names.name(e.sym), e.rank)?;
            if s.show_libs {
                write!(out, "  {}", names.file(e.sym))?;
            }
            writeln!(out)
        };
        for e in &r.callers {
            edge(out, e)?;
        }
        left(out, &format!("[{}]", r.rank), 8)?;
        pct(out, s.diff_mode, r.pct, 1)?;
        right(out, &s.value(r.cum), maxval)?;
        pad(out, 2)?;
        fraction(out, maxval, &s.value(r.self_), &s.value(r.kids))?;
        write!(out, "  ")?;
        if s.show_calls {
            right(out, &thousands(r.cum_all[1]), maxcnt)?;
            pad(out, maxcnt + 5)?;
        }
        if s.show_paths {
            right(out, &thousands(r.self_all[2]), maxcnt)?;
            pad(out, maxcnt + 5)?;
        }
        write!(out, "{}", names.name(r.sym))?;
        if s.show_libs {
            write!(out, "{}", names.file(r.sym))?;
        }
        writeln!(out)?;
        for e in &r.calls {
            edge(out, e)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_like_igprof() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1'000");
        assert_eq!(thousands(431226080), "431'226'080");
        assert_eq!(thousands(-1234567), "-1'234'567");
        assert_eq!(thousands_f(392.0 * 0.005f32 as f64), "1.96");
        assert_eq!(thousands_f(1234.567), "1'234.57");
        assert_eq!(thousands_f(-1.5), "-1.50");
        assert_eq!(thousands_f(-0.5), "-0.50");
        assert_eq!(thousands_f(0.0), "0.00");
    }
}
