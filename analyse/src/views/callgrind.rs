//! `--callgrind FILE`: the callgrind format (valgrind's), for KCachegrind,
//! QCachegrind and callgrind_annotate.
//!
//! One event column per counter (without `-r`, every counter of the
//! profile except `*_MAX` ones), in the counters' integer amounts (bytes,
//! descriptors, ticks of PERF_TICKS). Functions are the text report's:
//! nested recursion is `f'2`, `f'3`... as in IgProf's call graph (and
//! callgrind's own `--separate-recs`), so that a function's self cost plus
//! the inclusive costs of its calls is its cumulative value, and the
//! inclusive cost of all calls to it too. Each `fn=` block has the self
//! costs, then one `cfn=`/`calls=` pair per callee with the inclusive cost
//! of the calls; `calls=` is the report's call count of the edge (at least
//! 1: the format has no calls without a count). Source files are unknown
//! (`fl=???`); objects are `ob=`/`cob=`. Names are compressed (`(id)`).
//!
//! Must never: write a negative cost (no `-b`) or add up maxima (no
//! `*_MAX` counter).

use super::{Counters, FuncId, Functions, Input, View, ViewError};
use rustc_hash::FxHashMap;
use std::io::Write;

pub struct Callgrind;

/// One function's costs: self per counter, and per callee the inclusive
/// costs and the call count.
struct Costs {
    func: FuncId,
    self_: Vec<i64>,
    calls: Vec<(FuncId, Vec<i64>, Option<i64>)>,
    callee_at: FxHashMap<FuncId, usize>,
}

/// `(id) name` the first time, `(id)` after.
struct Compressed {
    ids: FxHashMap<u32, usize>,
}

impl Compressed {
    fn new() -> Compressed {
        Compressed {
            ids: FxHashMap::default(),
        }
    }
    fn write(&mut self, out: &mut dyn Write, key: u32, name: &str) -> std::io::Result<()> {
        let n = self.ids.len() + 1;
        match self.ids.get(&key) {
            Some(id) => write!(out, "({id})"),
            None => {
                self.ids.insert(key, n);
                write!(out, "({n}) {}", name.replace(['\n', '\r'], " "))
            }
        }
    }
}

fn costs(out: &mut dyn Write, v: &[i64]) -> std::io::Result<()> {
    out.write_all(b"0")?;
    for x in v {
        write!(out, " {x}")?;
    }
    out.write_all(b"\n")
}

impl View for Callgrind {
    fn name(&self) -> &'static str {
        "--callgrind"
    }
    fn counters(&self) -> Counters {
        Counters::All
    }
    fn write(&self, input: &Input<'_>, out: &mut dyn Write) -> Result<(), ViewError> {
        let unsupported = |reason: &str| ViewError::Unsupported {
            view: "--callgrind",
            reason: reason.to_string(),
        };
        if input.counters.iter().any(|c| c.baseline.is_some()) {
            return Err(unsupported(
                "callgrind costs cannot be negative, so there is no callgrind file of a difference (-b); \
                 write one per profile and compare them in KCachegrind",
            ));
        }
        if let Some(c) = input.counters.iter().find(|c| c.counter.is_max) {
            return Err(unsupported(&format!(
                "{} holds maxima, and callgrind adds costs up; choose another counter with -r",
                c.counter.name
            )));
        }
        let width = input.counters.len();
        let mut funcs: Vec<Costs> = Vec::new();
        let mut at: FxHashMap<FuncId, usize> = FxHashMap::default();
        let mut index = |f: FuncId, funcs: &mut Vec<Costs>| -> usize {
            *at.entry(f).or_insert_with(|| {
                funcs.push(Costs {
                    func: f,
                    self_: vec![0; width],
                    calls: Vec::new(),
                    callee_at: FxHashMap::default(),
                });
                funcs.len() - 1
            })
        };
        for (k, ct) in input.counters.iter().enumerate() {
            let nodes = &ct.tree.nodes;
            for n in nodes {
                let i = index(n.report, &mut funcs);
                funcs[i].self_[k] += n.value;
                for &c in &n.children {
                    let c = &nodes[c as usize];
                    if c.cum_value == 0 {
                        continue;
                    }
                    let f = &mut funcs[i];
                    let e = match f.callee_at.get(&c.report) {
                        Some(&e) => e,
                        None => {
                            f.callee_at.insert(c.report, f.calls.len());
                            f.calls.push((c.report, vec![0; width], None));
                            f.calls.len() - 1
                        }
                    };
                    let call = &mut f.calls[e];
                    call.1[k] += c.cum_value;
                    if call.2.is_none() || k == 0 {
                        *call.2.get_or_insert(0) += c.cum_calls;
                    }
                }
            }
        }
        if funcs.iter().any(|f| {
            f.self_.iter().any(|&v| v < 0) || f.calls.iter().any(|c| c.1.iter().any(|&v| v < 0))
        }) {
            return Err(unsupported("negative amounts in the profile"));
        }
        write_file(out, input, &funcs)?;
        Ok(())
    }
}

fn write_file(out: &mut dyn Write, input: &Input<'_>, funcs: &[Costs]) -> std::io::Result<()> {
    let fns: &Functions = input.functions;
    writeln!(out, "# callgrind format")?;
    writeln!(out, "version: 1")?;
    writeln!(out, "creator: igprof-analyse")?;
    writeln!(out, "cmd: {}", input.files.join(" "))?;
    writeln!(out, "positions: line")?;
    for ct in input.counters {
        let c = &ct.counter;
        let what = match c.unit {
            super::Unit::Seconds => format!("ticks of {} s", c.scale),
            super::Unit::Joules => format!("units of {} J", c.scale),
            u => u.name().to_string(),
        };
        writeln!(out, "event: {} : {} ({what})", c.name, c.name)?;
    }
    let names: Vec<&str> = input
        .counters
        .iter()
        .map(|c| c.counter.name.as_str())
        .collect();
    writeln!(out, "events: {}", names.join(" "))?;
    let mut obs = Compressed::new();
    let mut fnames = Compressed::new();
    let mut totals = vec![0i64; input.counters.len()];
    for f in funcs {
        for (t, v) in totals.iter_mut().zip(&f.self_) {
            *t += v;
        }
        let called = |c: &(FuncId, Vec<i64>, Option<i64>)| c.1.iter().any(|&v| v != 0);
        if f.self_.iter().all(|&v| v == 0) && !f.calls.iter().any(called) {
            continue;
        }
        let my_ob = fns.object_id(f.func);
        out.write_all(b"\nob=")?;
        obs.write(out, my_ob, fns.object(f.func))?;
        out.write_all(b"\nfl=???\nfn=")?;
        fnames.write(out, f.func, fns.name(f.func))?;
        out.write_all(b"\n")?;
        if f.self_.iter().any(|&v| v != 0) {
            costs(out, &f.self_)?;
        }
        for (callee, incl, calls) in &f.calls {
            if incl.iter().all(|&v| v == 0) {
                continue;
            }
            let ob = fns.object_id(*callee);
            if ob != my_ob {
                out.write_all(b"cob=")?;
                obs.write(out, ob, fns.object(*callee))?;
                out.write_all(b"\n")?;
            }
            out.write_all(b"cfn=")?;
            fnames.write(out, *callee, fns.name(*callee))?;
            writeln!(out, "\ncalls={} 0", calls.unwrap_or(1).max(1))?;
            costs(out, incl)?;
        }
    }
    let t: Vec<String> = totals.iter().map(|v| v.to_string()).collect();
    writeln!(out, "\ntotals: {}", t.join(" "))
}
