//! `--flame FILE.svg`: an interactive SVG flame graph (inferno's, the Rust
//! port of flamegraph.pl: click to zoom, Ctrl-F to search), of the folded
//! stacks of [`super::folded`]; `--icicle` draws it top-down. With `-b` it is
//! a differential flame graph: widths are the profiles' amounts, red frames
//! grew and blue frames shrank against the baseline.
//!
//! Tooltips carry the counter's unit: bytes for MEM_*, seconds for
//! PERF_TICKS, Joules for NRG_*, descriptors for FD_*. inferno rounds
//! `value x factor` to an integer in tooltips (1.96 s would read "2
//! seconds"), so time and energy go in as integer ticks under a marker unit
//! and the tooltips are rewritten with the scaled amount afterwards.
//!
//! Owns: the graph's options and tooltip units.

use super::{folded::for_each_line, Input, Unit, View, ViewError};
use inferno::flamegraph::{self, Direction, Options};
use std::io::Write;

pub struct Flame {
    /// Top-down (icicle) instead of bottom-up.
    pub icicle: bool,
}

/// The count name given to inferno when tooltips are rewritten afterwards.
const SCALED: &str = "igprof-scaled-units";

impl View for Flame {
    fn name(&self) -> &'static str {
        if self.icicle {
            "--icicle"
        } else {
            "--flame"
        }
    }
    fn write(&self, input: &Input<'_>, out: &mut dyn Write) -> Result<(), ViewError> {
        let ct = &input.counters[0];
        let c = &ct.counter;
        let mut lines: Vec<String> = Vec::new();
        for_each_line(ct, input.functions, |stack, values| {
            let mut l = String::with_capacity(stack.len() + 24);
            l.push_str(stack);
            for v in values {
                l.push(' ');
                l.push_str(&v.to_string());
            }
            lines.push(l);
        });
        if lines.is_empty() {
            return Err(ViewError::Unsupported {
                view: self.name(),
                reason: format!("no call path has a {} value left to draw", c.name),
            });
        }
        let scaled = matches!(c.unit, Unit::Seconds | Unit::Joules);
        let mut opts = Options::default();
        let kind = match (ct.baseline.is_some(), self.icicle) {
            (false, false) => "Flame graph",
            (false, true) => "Icicle graph",
            (true, false) => "Differential flame graph",
            (true, true) => "Differential icicle graph",
        };
        opts.title = format!("{kind}: {}", c.name);
        let mut sub = input.files.join(" ");
        if ct.baseline.is_some() {
            sub.push_str(" (red: grew, blue: shrank against the baseline)");
        }
        opts.subtitle = Some(sub);
        opts.count_name = if scaled {
            SCALED.to_string()
        } else {
            c.unit.name().to_string()
        };
        opts.name_type = "Function:".to_string();
        opts.hash = true;
        opts.deterministic = true;
        if self.icicle {
            opts.direction = Direction::Inverted;
        }
        let mut svg: Vec<u8> = Vec::new();
        flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)?;
        if scaled {
            let text = String::from_utf8_lossy(&svg);
            out.write_all(rescale(&text, c.scale, c.unit.name()).as_bytes())?;
        } else {
            out.write_all(&svg)?;
        }
        Ok(())
    }
}

/// Decimals that show one unit of `scale` (at least 2, at most 9).
fn decimals(scale: f64) -> usize {
    if scale <= 0.0 || !scale.is_finite() {
        return 2;
    }
    ((-scale.log10()).ceil().max(2.0) as usize).min(9)
}

/// `1234567.891` as `1,234,567.891` (inferno's thousands separator).
fn grouped(v: f64, decimals: usize) -> String {
    let s = format!("{:.*}", decimals, v.abs());
    let (int, frac) = s.split_once('.').unwrap_or((&s, ""));
    let mut out = String::with_capacity(s.len() + int.len() / 3 + 1);
    if v < 0.0 {
        out.push('-');
    }
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// Rewrites `(N igprof-scaled-units, ...` in tooltips as `(N*scale unit, ...`.
fn rescale(svg: &str, scale: f64, unit: &str) -> String {
    let re = regex::Regex::new(&format!(r"\(([0-9,]+) {SCALED}([,)])")).expect("fixed pattern");
    let d = decimals(scale);
    re.replace_all(svg, |c: &regex::Captures<'_>| {
        let n: f64 = c[1].replace(',', "").parse().unwrap_or(0.0);
        format!("({} {unit}{}", grouped(n * scale, d), &c[2])
    })
    .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tooltips_show_scaled_amounts() {
        assert_eq!(decimals(0.005), 3);
        assert_eq!(decimals(0.01), 2);
        assert_eq!(decimals(1.0), 2);
        assert_eq!(decimals(0.000015), 5);
        assert_eq!(grouped(1234567.891, 3), "1,234,567.891");
        assert_eq!(grouped(0.5, 2), "0.50");
        assert_eq!(grouped(-1234.0, 2), "-1,234.00");
        let svg = "<title>all (392 igprof-scaled-units, 100%)</title>\
                   <title>spin (1,200 igprof-scaled-units, 50.80%; +1.00%)</title>";
        assert_eq!(
            rescale(svg, 0.005, "seconds"),
            "<title>all (1.960 seconds, 100%)</title>\
             <title>spin (6.000 seconds, 50.80%; +1.00%)</title>"
        );
    }
}
