//! From the call tree to per-function totals and call-graph edges (IgProf's
//! `TreeMapBuilderFilter`), their ranking, and the rows every report prints
//! (IgProf's `GProfMainRowBuilder`).
//!
//! Owns: recursion naming (`name'2` for a function already on the path),
//! self/cumulative/paths per function, caller and callee edges, the rank
//! order (cumulative desc, shallowest first, then name) and the row values.
//! Must never: print anything (reports do), or recurse per tree level.

use crate::filters::{walk, Phase};
use crate::profile::{NodeId, Profile, SymId};
use rustc_hash::{FxHashMap, FxHashSet};

/// Totals of one function: `[count, calls, paths]` self and cumulative.
#[derive(Debug, Clone, Default)]
pub struct FlatInfo {
    pub sym: SymId,
    pub self_key: [i64; 3],
    pub cum_key: [i64; 3],
    /// Fewest distinct functions on a path reaching it (IgProf's DEPTH).
    pub depth: i32,
    pub callers: Vec<SymId>,
    /// Edges to callees: callee -> `[count, calls, paths]`.
    pub calls: FxHashMap<SymId, [i64; 3]>,
}

/// The flat map of a profile.
pub struct Flat {
    pub infos: Vec<FlatInfo>,
    /// Symbol -> index in `infos`.
    pub index: FxHashMap<SymId, usize>,
    /// Totals `[count, calls]` (the root's cumulative values).
    pub totals: [i64; 2],
    pub is_max: bool,
}

fn accumulate(buf: &mut [i64; 3], c: i64, f: i64, is_max: bool) {
    if is_max {
        buf[0] = buf[0].max(c);
    } else {
        buf[0] += c;
    }
    buf[1] += f;
    buf[2] += 1;
}

impl Flat {
    /// Builds the flat map; sets each node's report symbol (recursion names).
    pub fn build(p: &mut Profile, is_max: bool) -> Flat {
        let mut infos: Vec<FlatInfo> = Vec::new();
        let mut index: FxHashMap<SymId, usize> = FxHashMap::default();
        let mut path = Path {
            presets: p.nodes.iter().any(|n| n.report.is_some()),
            ..Path::default()
        };
        let mut callers: Vec<FxHashSet<SymId>> = Vec::new();
        {
            let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, phase: Phase| {
                if phase == Phase::Post {
                    path.pop(p, node);
                    return;
                }
                let sym = symfor(p, &mut path, node);
                let i = *index.entry(sym).or_insert_with(|| {
                    infos.push(FlatInfo {
                        sym,
                        depth: -1,
                        ..FlatInfo::default()
                    });
                    callers.push(FxHashSet::default());
                    infos.len() - 1
                });
                let depth = path.seen.len() as i32;
                let info = &mut infos[i];
                if info.depth < 0 || depth < info.depth {
                    info.depth = depth;
                }
                let c = p.nodes[node as usize].counter;
                if let Some(parent) = parent {
                    let psym = p.nodes[parent as usize].symbol();
                    callers[i].insert(psym);
                    let pi = index[&psym];
                    accumulate(
                        infos[pi].calls.entry(sym).or_default(),
                        c.ccnt,
                        c.cfreq,
                        is_max,
                    );
                }
                let info = &mut infos[i];
                accumulate(&mut info.self_key, c.cnt, c.freq, is_max);
                accumulate(&mut info.cum_key, c.ccnt, c.cfreq, is_max);
            };
            walk(p, true, true, &mut f);
        }
        for (info, c) in infos.iter_mut().zip(callers) {
            info.callers = c.into_iter().collect();
        }
        let totals = infos
            .first()
            .map(|r| [r.cum_key[0], r.cum_key[1]])
            .unwrap_or([0, 0]);
        Flat {
            infos,
            index,
            totals,
            is_max,
        }
    }

    pub fn get(&self, sym: SymId) -> Option<&FlatInfo> {
        self.index.get(&sym).map(|&i| &self.infos[i])
    }

    /// Indices of `infos` in rank order: |cumulative| descending (ascending
    /// with `descending_order` false... as IgProf's -o), then shallowest, then name.
    pub fn ranked(&self, p: &Profile, reverse: bool) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.infos.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&self.infos[a], &self.infos[b]);
            let key = b.cum_key[0].abs().cmp(&a.cum_key[0].abs());
            let key = if reverse { key.reverse() } else { key };
            key.then(a.depth.cmp(&b.depth))
                .then_with(|| p.symbols.name(a.sym).cmp(p.symbols.name(b.sym)))
        });
        order
    }
}

/// The symbols on the current path of the walk (IgProf's `m_seen`), with
/// how many nodes of each original symbol it holds, so that the name of the
/// k-th nested call of `f` (`f'k`) is found without trying `f'2`..`f'k-1`.
#[derive(Default)]
struct Path {
    seen: FxHashSet<SymId>,
    nesting: FxHashMap<SymId, u32>,
    /// Some node had a report name before this walk: use IgProf's search.
    presets: bool,
}

impl Path {
    fn pop(&mut self, p: &Profile, node: NodeId) {
        let n = &p.nodes[node as usize];
        self.seen.remove(&n.symbol());
        if let Some(c) = self.nesting.get_mut(&n.sym) {
            *c = c.saturating_sub(1);
        }
    }
}

/// IgProf's `symfor`: the report symbol of `node`, `name'N` (the smallest
/// N >= 2 not on the path) when a function of the same name is already on
/// the current path.
fn symfor(p: &mut Profile, path: &mut Path, node: NodeId) -> SymId {
    if let Some(r) = p.nodes[node as usize].report {
        path.seen.insert(r);
        return r;
    }
    let sym = p.nodes[node as usize].sym;
    let nesting = path.nesting.entry(sym).or_insert(0);
    *nesting += 1;
    let nesting = *nesting;
    if path.seen.contains(&sym) {
        let name = p.symbols.name(sym).to_string();
        let base = match name.rfind('\'') {
            Some(i) if name[i + 1..].bytes().all(|b| b.is_ascii_digit()) && i + 1 < name.len() => {
                &name[..i]
            }
            _ => &name[..],
        }
        .to_string();
        let file = p.symbols.file(sym);
        // Without preset names the path holds f, f'2, .., f'(nesting-1): the
        // answer is f'nesting unless a function is literally called that.
        let guess = format!("{base}'{nesting}");
        let fast = match p.symbols.get(&guess) {
            Some(s) if path.seen.contains(&s) => None,
            _ if path.presets || nesting < 2 => None,
            _ => Some(p.symbols.intern(&guess, file)),
        };
        let r = match fast {
            Some(r) => r,
            None => {
                let mut k = 2;
                loop {
                    let cand = format!("{base}'{k}");
                    match p.symbols.get(&cand) {
                        Some(s) if path.seen.contains(&s) => k += 1,
                        _ => break p.symbols.intern(&cand, file),
                    }
                }
            }
        };
        p.nodes[node as usize].report = Some(r);
    }
    let s = p.nodes[node as usize].symbol();
    path.seen.insert(s);
    s
}

/// One caller or callee line of a call-graph entry.
#[derive(Debug, Clone)]
pub struct EdgeRow {
    pub sym: SymId,
    pub rank: usize,
    pub pct: f32,
    pub self_counts: i64,
    pub children_counts: i64,
    pub self_calls: i64,
    pub total_calls: i64,
    pub self_paths: i64,
    pub total_paths: i64,
}

/// One function's row: IgProf's `MainGProfRow`.
#[derive(Debug, Clone)]
pub struct MainRow {
    pub sym: SymId,
    pub rank: usize,
    pub pct: f32,
    pub self_pct: f32,
    pub cum: i64,
    pub self_: i64,
    pub kids: i64,
    pub self_all: [i64; 3],
    pub cum_all: [i64; 3],
    /// Ascending by (count, caller's total, name).
    pub callers: Vec<EdgeRow>,
    /// Descending by (count, callee's total), then name.
    pub calls: Vec<EdgeRow>,
}

/// An edge to or from `other`: the edge's values `v`, `other`'s totals.
fn edge_row(sym: SymId, rank: usize, pct: f32, v: &[i64; 3], other: &FlatInfo) -> EdgeRow {
    EdgeRow {
        sym,
        rank,
        pct,
        self_counts: v[0],
        children_counts: other.cum_key[0],
        self_calls: v[1],
        total_calls: other.cum_key[1],
        self_paths: v[2],
        total_paths: other.cum_key[2],
    }
}

/// IgProf's `percent`: a float of a double ratio; "new" (f32::MAX) in diff mode.
pub fn percent(a: i64, b: i64) -> f32 {
    ((a as f64 / b as f64) * 100.0) as f32
}

/// Baseline information for diff mode (`-b ... -D`).
pub struct Baseline<'a> {
    pub flat: &'a Flat,
    pub profile: &'a Profile,
    pub diff_mode: bool,
}

/// The rows of every report, in rank order, without functions whose
/// cumulative count is 0. Also returns the totals `[count, calls]`.
pub fn rows(
    flat: &Flat,
    p: &Profile,
    order: &[usize],
    base: Option<&Baseline<'_>>,
) -> (Vec<MainRow>, [i64; 2]) {
    let mut rank_of: FxHashMap<SymId, usize> = FxHashMap::default();
    for (r, &i) in order.iter().enumerate() {
        rank_of.insert(flat.infos[i].sym, r + 1);
    }
    let mut totals = flat.totals;
    if let Some(b) = base {
        totals[0] -= b.flat.totals[0];
        totals[1] -= b.flat.totals[1];
    }
    let diff = base.map(|b| b.diff_mode).unwrap_or(false);
    // Baseline values are looked up by name (the baseline has its own symbols).
    let base_info = |sym: SymId| -> Option<&FlatInfo> {
        let b = base?;
        b.flat.get(b.profile.symbols.get(p.symbols.name(sym))?)
    };
    let base_call = |from: SymId, to: SymId| -> Option<i64> {
        let b = base?;
        let to = b.profile.symbols.get(p.symbols.name(to))?;
        base_info(from)?.calls.get(&to).map(|v| v[0])
    };
    let mut out = Vec::new();
    for &i in order {
        let info = &flat.infos[i];
        if info.cum_key[0] == 0 {
            continue;
        }
        let orig = if diff { base_info(info.sym) } else { None };
        let (pct, self_pct) = if diff {
            (
                match orig {
                    Some(o) if o.cum_key[0] != 0 => percent(info.cum_key[0], o.cum_key[0].abs()),
                    _ => f32::MAX,
                },
                match orig {
                    Some(o) if o.self_key[0] != 0 => percent(info.self_key[0], o.self_key[0].abs()),
                    _ => f32::MAX,
                },
            )
        } else {
            (
                percent(info.cum_key[0], totals[0]),
                percent(info.self_key[0], totals[0]),
            )
        };
        let edge_pct = |v: i64, from: SymId, to: SymId| -> f32 {
            if diff {
                match base_call(from, to) {
                    Some(o) => percent(v, o.abs()),
                    None => f32::MAX,
                }
            } else {
                percent(v, totals[0])
            }
        };
        let mut callers = Vec::new();
        for &c in &info.callers {
            let origin = flat.get(c).expect("caller has a flat entry");
            let v = origin.calls.get(&info.sym).copied().unwrap_or_default();
            if v[0] == 0 {
                continue;
            }
            callers.push(edge_row(
                c,
                rank_of[&c],
                edge_pct(v[0], c, info.sym),
                &v,
                origin,
            ));
        }
        let mut callmax = 0;
        let mut calls = Vec::new();
        for (&callee, v) in &info.calls {
            if v[0] == 0 {
                continue;
            }
            callmax = callmax.max(v[0]);
            let ci = flat.get(callee).expect("callee has a flat entry");
            calls.push(edge_row(
                callee,
                rank_of[&callee],
                edge_pct(v[0], info.sym, callee),
                v,
                ci,
            ));
        }
        let name = |s: SymId| p.symbols.name(s);
        callers.sort_by(|a, b| {
            a.self_counts
                .cmp(&b.self_counts)
                .then(a.children_counts.cmp(&b.children_counts))
                .then_with(|| name(a.sym).cmp(name(b.sym)))
        });
        calls.sort_by(|a, b| {
            b.self_counts
                .cmp(&a.self_counts)
                .then(b.children_counts.cmp(&a.children_counts))
                .then_with(|| name(a.sym).cmp(name(b.sym)))
        });
        out.push(MainRow {
            sym: info.sym,
            rank: rank_of[&info.sym],
            pct,
            self_pct,
            cum: info.cum_key[0],
            self_: info.self_key[0],
            kids: if flat.is_max {
                callmax
            } else {
                info.cum_key[0] - info.self_key[0]
            },
            self_all: info.self_key,
            cum_all: info.cum_key,
            callers,
            calls,
        });
    }
    (out, totals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::ReadOptions;
    use crate::symbols::{Options, Resolver};

    /// Report names along the single path of a one-path profile.
    fn path_names(names: &[&str]) -> Vec<String> {
        let mut text = String::from("P=(ID=1 N=(p) T=0.010000)\n");
        let mut ids: Vec<&str> = Vec::new();
        for (d, n) in names.iter().enumerate() {
            let id = match ids.iter().position(|x| x == n) {
                Some(i) => i,
                None => {
                    ids.push(n);
                    usize::MAX
                }
            };
            let fun = if id == usize::MAX {
                let i = ids.len() - 1;
                format!(
                    "FN{i}=(F0{}+{} N=({n}))",
                    if i == 0 { "=(/nonexistent)" } else { "" },
                    16 * (i + 1)
                )
            } else {
                format!("FN{id}")
            };
            let v = if d + 1 == names.len() {
                " V0=(PERF_TICKS):(1,1,1)"
            } else {
                ""
            };
            text.push_str(&format!("C{} {fun}+0{v}\n", d + 1));
        }
        let mut p = Profile::new(None);
        let mut r = Resolver::new(Options {
            enabled: false,
            ..Options::default()
        });
        p.read(text.as_bytes(), "t", &mut r, &ReadOptions::default(), false)
            .unwrap();
        p.finish_reading();
        crate::filters::add_cumulative(&mut p, false);
        Flat::build(&mut p, false);
        let mut out = Vec::new();
        let mut n = 0;
        while let Some(&c) = p.nodes[n as usize].children.first() {
            out.push(p.symbols.name(p.nodes[c as usize].symbol()).to_string());
            n = c;
        }
        out
    }

    #[test]
    fn recursion_names_are_the_smallest_free_suffix() {
        assert_eq!(
            path_names(&["a", "b", "a", "a", "b"]),
            ["a", "b", "a'2", "a'3", "b'2"]
        );
        // A function literally called f'2 on the path: IgProf's search skips it.
        assert_eq!(
            path_names(&["f", "f'2", "f", "f"]),
            ["f", "f'2", "f'3", "f'4"]
        );
        let deep = vec!["r"; 50];
        let got = path_names(&deep);
        assert_eq!(got[0], "r");
        assert_eq!(got[49], "r'50");
    }
}
