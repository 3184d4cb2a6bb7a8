//! IgProf's two path reports: `--top N` (the N call paths with the largest
//! self counts, leaf first) and `--tree` (the call tree as an indented
//! massif-style outline, children above 1% / 0.1% of the total).
//!
//! Owns: the visiting order and thresholds of IgProf's TopNBuilderFilter and
//! MassifTreeBuilder. Must never: change counts (they are computed already).

use crate::filters::{walk, Phase};
use crate::flat::percent;
use crate::profile::{NodeId, Profile};
use crate::text::{thousands, thousands_f, Names};
use std::io::{self, Write};

/// `--top N`. Unlike IgProf, stops cleanly when fewer than N paths have a
/// non-zero count (IgProf prints a dangling `## Entry k (` line).
pub fn top_n(
    out: &mut dyn Write,
    p: &Profile,
    n: usize,
    is_perf_ticks: bool,
    names: &dyn Names,
) -> io::Result<()> {
    let mut values = vec![0i64; n];
    let mut traces: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    let mut path: Vec<NodeId> = Vec::new();
    // Same visiting order as IgProf's walk: pre-order, last child first.
    let mut stack: Vec<(NodeId, bool)> = vec![(0, false)];
    while let Some((node, is_post)) = stack.pop() {
        if is_post {
            path.pop();
            continue;
        }
        path.push(node);
        let cnt = p.nodes[node as usize].counter.cnt;
        let mut min: Option<usize> = None;
        for i in 0..n {
            if values[i] < cnt && min.is_none_or(|m| values[i] < values[m]) {
                min = Some(i);
            }
        }
        if let Some(m) = min {
            values[m] = cnt;
            traces[m] = path.clone();
        }
        stack.push((node, true));
        for &c in &p.nodes[node as usize].children {
            stack.push((c, false));
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(values[i]));
    for (k, &i) in order.iter().enumerate() {
        let value = values[i];
        if value == 0 {
            break;
        }
        write!(out, "## Entry {} (", k + 1)?;
        if is_perf_ticks {
            writeln!(
                out,
                "{} seconds)",
                thousands_f(value as f64 * p.tick_period as f64)
            )?;
        } else {
            writeln!(out, "{} bytes)", thousands(value))?;
        }
        for (j, &node) in traces[i].iter().rev().enumerate() {
            writeln!(out, "#{j} {}", names.name(p.nodes[node as usize].symbol()))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// `--tree`: IgProf's MassifTreeBuilder outline.
pub fn tree(out: &mut dyn Write, p: &mut Profile, names: &dyn Names) -> io::Result<()> {
    let mut kids: Vec<usize> = Vec::new();
    let mut indent = 0usize;
    let mut totals = 0i64;
    let mut result = Ok(());
    {
        let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, phase: Phase| {
            if phase == Phase::Post {
                indent -= 1;
                kids.truncate(indent);
                return;
            }
            let mut children = std::mem::take(&mut p.nodes[node as usize].children);
            // Largest cumulative first, stable for equal values.
            children.sort_by_key(|&c| std::cmp::Reverse(p.nodes[c as usize].counter.ccnt));
            let c = p.nodes[node as usize].counter;
            if parent.is_none() {
                totals = c.ccnt;
            }
            let pct = percent(c.ccnt, totals);
            let keep = children
                .iter()
                .take_while(|&&ch| {
                    let child_pct = percent(p.nodes[ch as usize].counter.ccnt, totals);
                    !((child_pct < 1.0 && pct < 1.0) || child_pct < 0.1)
                })
                .count();
            children.truncate(keep);
            // Ascending, so that the walk (last child first) prints the largest first.
            children.reverse();
            if kids.len() <= indent {
                kids.resize(indent + 1, 0);
            }
            kids[indent] = children.len();
            let mut line = String::new();
            for &k in &kids[..kids.len() - 1] {
                line.push(' ');
                line.push(if k == 0 { ' ' } else { '|' });
            }
            if c.cnt != 0 {
                line.push_str(&format!("->({:.2}) ", pct as f64));
            }
            let name = names.name(p.nodes[node as usize].symbol());
            line.push_str(if name.is_empty() { "<no symbol>" } else { name });
            if indent > 0 {
                kids[indent - 1] = kids[indent - 1].saturating_sub(1);
            }
            p.nodes[node as usize].children = children;
            if result.is_ok() {
                result = writeln!(out, "{line}");
            }
            indent += 1;
        };
        walk(p, true, true, &mut f);
    }
    result
}
