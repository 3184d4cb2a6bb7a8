//! `--folded FILE`: Brendan Gregg's folded stacks, one line per call path
//! with a value of its own: `root;caller;function VALUE`, root first, as
//! flamegraph.pl, inferno, speedscope and others read them.
//!
//! Values are the report counter's integer amounts (bytes, descriptors,
//! ticks of PERF_TICKS, units of NRG_*) for the path's own function, after
//! every filter and merge the text report applies. With `-b`, each line has
//! two values, the baseline's and the profiles' (`stack BEFORE AFTER`, the
//! input of flamegraph.pl's and inferno's differential mode).
//!
//! Owns: the line layout. Must never: emit a line with a zero value (or,
//! with `-b`, both zero).

use super::{folded_name, CounterTree, FuncId, Functions, Input, View, ViewError};
use rustc_hash::FxHashMap;
use std::fmt::Write as _;
use std::io::Write;

pub struct Folded;

impl View for Folded {
    fn name(&self) -> &'static str {
        "--folded"
    }
    fn write(&self, input: &Input<'_>, out: &mut dyn Write) -> Result<(), ViewError> {
        let ct = &input.counters[0];
        let mut line = String::new();
        let mut err = Ok(());
        for_each_line(ct, input.functions, |stack, values| {
            if err.is_err() {
                return;
            }
            line.clear();
            line.push_str(stack);
            for v in values {
                let _ = write!(line, " {v}");
            }
            line.push('\n');
            err = out.write_all(line.as_bytes());
        });
        Ok(err?)
    }
}

/// The folded stack of `path`.
fn join(path: &[FuncId], functions: &Functions, buf: &mut String) {
    buf.clear();
    for (i, &f) in path.iter().enumerate() {
        if i > 0 {
            buf.push(';');
        }
        buf.push_str(&folded_name(functions.name(f)));
    }
}

/// Calls `f` with each folded line: the stack and its one value, or with
/// `-b` the baseline's and the profiles' values (negative amounts, which
/// folded stacks cannot hold, shown as 0). Stacks come in tree order.
pub fn for_each_line(ct: &CounterTree, functions: &Functions, mut f: impl FnMut(&str, &[i64])) {
    let mut buf = String::new();
    let Some(base) = &ct.baseline else {
        ct.tree.for_each_stack(|path, node| {
            if node.value != 0 {
                join(path, functions, &mut buf);
                f(&buf, &[node.value]);
            }
        });
        return;
    };
    // The tree holds the differences (after - before) on every path of
    // either profile; the baseline's tree holds the befores.
    let mut before: FxHashMap<Vec<FuncId>, i64> = FxHashMap::default();
    base.for_each_stack(|path, node| {
        if node.value != 0 {
            *before.entry(path.to_vec()).or_default() += node.value;
        }
    });
    let mut lines: Vec<(Vec<FuncId>, [i64; 2])> = Vec::new();
    let mut at: FxHashMap<Vec<FuncId>, usize> = FxHashMap::default();
    ct.tree.for_each_stack(|path, node| {
        let b = before.get(path).copied().unwrap_or(0);
        if node.value == 0 && b == 0 {
            return;
        }
        match at.get(path) {
            Some(&i) => lines[i].1[1] += node.value,
            None => {
                at.insert(path.to_vec(), lines.len());
                lines.push((path.to_vec(), [b, b + node.value]));
            }
        }
    });
    // Baseline paths the merged tree lost (filters act alike on both, so
    // normally none).
    base.for_each_stack(|path, node| {
        if node.value != 0 && !at.contains_key(path) {
            at.insert(path.to_vec(), lines.len());
            lines.push((path.to_vec(), [before[path], 0]));
        }
    });
    for (path, [b, a]) in lines {
        if b == 0 && a == 0 {
            continue;
        }
        join(&path, functions, &mut buf);
        f(&buf, &[b.max(0), a.max(0)]);
    }
}
