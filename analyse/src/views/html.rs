//! `--html FILE.html`: one self-contained page (every script and style
//! inline, nothing fetched) to explore a profile in a browser: a counter
//! selector (every counter of the profile without `-r`), a flat table of
//! self and cumulative values sortable by any column and filtered by name,
//! a function's callers and callees reached by clicking names (with back
//! and forward through the browser's history), and a flame graph (root at
//! the top) with click-to-zoom and search.
//!
//! The table and the call graph are the text report's (functions named as
//! there: nested recursion is `f'2`); the flame graph is the call tree by
//! function. For huge profiles, flame-graph frames below [`PRUNE`] of the
//! counter's total are left out (the page says how many); the table and the
//! call graph are complete.
//!
//! Owns: the page and the JSON it embeds. Must never: load anything from
//! the network, or show a difference against a baseline (`-b`: use
//! `--flame` and the text report).

use super::{CounterTree, Counters, FuncId, Input, Unit, View, ViewError};
use rustc_hash::FxHashMap;
use std::fmt::Write as _;
use std::io::Write;

pub struct Html;

/// Flame-graph frames whose cumulative value is below this share of the
/// total are left out of the page.
pub const PRUNE: f64 = 0.0001;

/// A JSON string, safe inside `<script>` (`<` escaped).
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_list<T>(
    out: &mut String,
    items: impl IntoIterator<Item = T>,
    mut f: impl FnMut(&mut String, T),
) {
    out.push('[');
    for (i, x) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        f(out, x);
    }
    out.push(']');
}

/// The text report's rows of one counter: per function (report name),
/// `[self, cumulative, self calls, cumulative calls]`, and the call-graph
/// edges `(caller, callee) -> [value, calls]`.
type Flat = (Vec<(FuncId, [i64; 4])>, Vec<((FuncId, FuncId), [i64; 2])>);

fn flat(ct: &CounterTree) -> Flat {
    let max = ct.counter.is_max;
    let add = |a: &mut i64, v: i64| {
        if max {
            *a = (*a).max(v);
        } else {
            *a += v;
        }
    };
    let mut rows: Vec<(FuncId, [i64; 4])> = Vec::new();
    let mut row_at: FxHashMap<FuncId, usize> = FxHashMap::default();
    let mut edges: Vec<((FuncId, FuncId), [i64; 2])> = Vec::new();
    let mut edge_at: FxHashMap<(FuncId, FuncId), usize> = FxHashMap::default();
    let nodes = &ct.tree.nodes;
    for n in nodes {
        let i = *row_at.entry(n.report).or_insert_with(|| {
            rows.push((n.report, [0; 4]));
            rows.len() - 1
        });
        let r = &mut rows[i].1;
        add(&mut r[0], n.value);
        add(&mut r[1], n.cum_value);
        r[2] += n.calls;
        r[3] += n.cum_calls;
        for &c in &n.children {
            let c = &nodes[c as usize];
            let key = (n.report, c.report);
            let e = *edge_at.entry(key).or_insert_with(|| {
                edges.push((key, [0; 2]));
                edges.len() - 1
            });
            add(&mut edges[e].1[0], c.cum_value);
            edges[e].1[1] += c.cum_calls;
        }
    }
    rows.retain(|r| r.1[1] != 0);
    edges.retain(|e| e.1[0] != 0);
    (rows, edges)
}

/// The JSON the page reads.
pub fn data(input: &Input<'_>) -> String {
    let fns = input.functions;
    let mut o = String::with_capacity(1 << 16);
    o.push_str("{\"files\":");
    json_list(&mut o, input.files, |o, f| json_str(o, f));
    let _ = write!(o, ",\"prune\":{PRUNE}");
    o.push_str(",\"names\":");
    json_list(&mut o, 0..fns.len() as FuncId, |o, f| {
        json_str(o, fns.name(f))
    });
    o.push_str(",\"objects\":");
    json_list(&mut o, fns.objects(), |o, f| json_str(o, f));
    o.push_str(",\"object\":");
    json_list(&mut o, 0..fns.len() as FuncId, |o, f| {
        let _ = write!(o, "{}", fns.object_id(f));
    });
    o.push_str(",\"counters\":");
    json_list(&mut o, input.counters, |o, ct| {
        let c = &ct.counter;
        let root = ct.tree.nodes.first();
        let total = root.map(|r| r.cum_value).unwrap_or(0);
        let unit = match c.unit {
            Unit::Seconds => "s",
            Unit::Joules => "J",
            Unit::Bytes => "B",
            Unit::Descriptors => "fd",
            Unit::Count => "",
        };
        o.push_str("{\"name\":");
        json_str(o, &c.name);
        let _ = write!(
            o,
            ",\"unit\":\"{unit}\",\"scale\":{},\"max\":{},\"total\":{total}",
            c.scale, c.is_max
        );
        let (rows, edges) = flat(ct);
        o.push_str(",\"flat\":");
        json_list(o, &rows, |o, (f, v)| {
            let _ = write!(o, "[{f},{},{},{},{}]", v[0], v[1], v[2], v[3]);
        });
        o.push_str(",\"edges\":");
        json_list(o, &edges, |o, ((a, b), v)| {
            let _ = write!(o, "[{a},{b},{},{}]", v[0], v[1]);
        });
        // The flame tree in pre-order: function, depth, cumulative, self.
        let limit = total.unsigned_abs() as f64 * PRUNE;
        let (mut f, mut d, mut v, mut s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut pruned = 0u64;
        if let Some(root) = root {
            let mut stack: Vec<(u32, u32)> = vec![(0, 0)];
            while let Some((id, depth)) = stack.pop() {
                let n = &ct.tree.nodes[id as usize];
                if id != 0 && (n.cum_value.unsigned_abs() as f64) < limit.max(1.0) {
                    if n.cum_value != 0 {
                        pruned += 1;
                    }
                    continue;
                }
                f.push(if id == 0 { root.func } else { n.func });
                d.push(depth);
                v.push(n.cum_value);
                s.push(n.value);
                for &c in n.children.iter().rev() {
                    stack.push((c, depth + 1));
                }
            }
        }
        let _ = write!(o, ",\"pruned\":{pruned},\"tree\":{{\"f\":");
        json_list(o, &f, |o, x| {
            let _ = write!(o, "{x}");
        });
        o.push_str(",\"d\":");
        json_list(o, &d, |o, x| {
            let _ = write!(o, "{x}");
        });
        o.push_str(",\"v\":");
        json_list(o, &v, |o, x| {
            let _ = write!(o, "{x}");
        });
        o.push_str(",\"s\":");
        json_list(o, &s, |o, x| {
            let _ = write!(o, "{x}");
        });
        o.push_str("}}");
    });
    if let Some(t) = input.timeline {
        o.push_str(",\"timeline\":");
        timeline_json(&mut o, t);
    }
    o.push('}');
    o
}

/// The chart's data: the timeline's columns and points (time in seconds),
/// and per dump its time, file and the live bytes of the functions the
/// page follows ([`crate::timeline::PAGE_SITES`] of them).
fn timeline_json(o: &mut String, t: &crate::timeline::Series) {
    o.push_str("{\"columns\":");
    match &t.timeline {
        Some(tl) => {
            json_list(o, &tl.columns, |o, c| json_str(o, c));
            let _ = write!(o, ",\"every\":{}", tl.every_ms as f64 / 1000.0);
            o.push_str(",\"points\":");
            json_list(o, &tl.points, |o, p| {
                json_list(o, p.iter().enumerate(), |o, (i, v)| match v {
                    Some(v) if i == 0 => {
                        let _ = write!(o, "{}", *v as f64 / 1000.0);
                    }
                    Some(v) => {
                        let _ = write!(o, "{v}");
                    }
                    None => o.push_str("null"),
                })
            });
        }
        None => o.push_str("[],\"every\":0,\"points\":[]"),
    }
    let sites = t.page_sites();
    o.push_str(",\"sites\":");
    json_list(o, &sites, |o, s| json_str(o, s));
    o.push_str(",\"top\":");
    json_list(o, t.top_sites(), |o, s| json_str(o, &s));
    o.push_str(",\"dumps\":");
    json_list(o, t.dumps.iter().enumerate(), |o, (i, d)| {
        let _ = write!(o, "{{\"t\":{},\"file\":", d.at().unwrap_or(0.0));
        json_str(o, &d.path);
        o.push_str(",\"live\":");
        json_list(o, &sites, |o, s| {
            let v = t.sites.get(i).and_then(|m| m.get(s)).copied().unwrap_or(0);
            let _ = write!(o, "{v}");
        });
        o.push('}');
    });
    o.push('}');
}

impl View for Html {
    fn name(&self) -> &'static str {
        "--html"
    }
    fn counters(&self) -> Counters {
        Counters::All
    }
    fn write(&self, input: &Input<'_>, out: &mut dyn Write) -> Result<(), ViewError> {
        if input.counters.iter().any(|c| c.baseline.is_some()) {
            return Err(ViewError::Unsupported {
                view: "--html",
                reason: "the page shows one profile, not a difference against a baseline (-b): \
                         use --flame for a differential flame graph and the text report for the differences"
                    .into(),
            });
        }
        let mut title = String::new();
        for c in input.files.join(" ").chars() {
            match c {
                '<' => title.push_str("&lt;"),
                '>' => title.push_str("&gt;"),
                '&' => title.push_str("&amp;"),
                c => title.push(c),
            }
        }
        let page = PAGE
            .replace("@TITLE@", &title)
            .replace("@DATA@", &data(input));
        out.write_all(page.as_bytes())?;
        Ok(())
    }
}

const PAGE: &str = include_str!("html_page.html");
