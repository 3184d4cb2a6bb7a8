//! Tree rewrites applied before reports, each one IgProf's filter of the same
//! name: dropping the profiler's own frames, folding the malloc family into
//! its caller (MEM_*), dropping GCC pool-allocator frames (MEM_LIVE), merging
//! by library (-ml), renaming/merging by regular expression (-mr), renaming
//! below ancestors (-ma), and summing cumulative counts.
//!
//! Owns: the order IgProf visits nodes in ([`walk`]: pre-order with an
//! explicit stack, the last child first) and the exact merge semantics.
//! Must never: recurse on the Rust stack per tree level (trees can be
//! thousands deep), or change totals except where IgProf's filter does.

use crate::profile::{NodeId, Profile, SymId};
use regex::Regex;
use rustc_hash::{FxHashMap, FxHashSet};

/// When a filter wants to be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// On the way down (IgProf's `pre`).
    Pre,
    /// After all of the node's children (IgProf's `post`).
    Post,
}

/// A filter callback: (profile, parent, node, phase).
pub type Visit<'a> = &'a mut dyn FnMut(&mut Profile, Option<NodeId>, NodeId, Phase);

/// IgProf's `walk`: calls `f` with [`Phase::Pre`] on the way down (if `pre`)
/// and [`Phase::Post`] after all of a node's children (if `post`); children
/// are visited in reverse order (stack order), and the children list is read
/// after the pre call (so it may rewrite it).
pub fn walk(p: &mut Profile, pre: bool, post: bool, f: Visit<'_>) {
    // (parent, node, is_post)
    let mut stack: Vec<(Option<NodeId>, NodeId, bool)> = vec![(None, 0, false)];
    let mut children = Vec::new();
    while let Some((parent, node, is_post)) = stack.pop() {
        if is_post {
            f(p, parent, node, Phase::Post);
            continue;
        }
        if pre {
            f(p, parent, node, Phase::Pre);
        }
        if post {
            stack.push((parent, node, true));
        }
        children.clear();
        children.extend_from_slice(&p.nodes[node as usize].children);
        for &c in &children {
            stack.push((Some(node), c, false));
        }
    }
}

fn remove_child(p: &mut Profile, parent: NodeId, node: NodeId) {
    p.nodes[parent as usize].children.retain(|&c| c != node);
}

/// IgProf's `mergeToNode`: moves the children of `node` under `parent`
/// (merging those whose symbol `parent` already has), then removes `node`
/// from `parent`. The node's own counts are dropped, as in IgProf.
pub fn merge_to_node(p: &mut Profile, parent: NodeId, node: NodeId, is_max: bool) {
    // Explicit work list instead of recursion: (parent, node) pairs.
    let mut work = vec![(parent, node)];
    let mut removals = Vec::new();
    while let Some((parent, node)) = work.pop() {
        let kids = p.nodes[node as usize].children.clone();
        for child in kids {
            let sym = p.nodes[child as usize].symbol();
            match p.child_by_symbol(parent, sym) {
                None => p.nodes[parent as usize].children.push(child),
                Some(same) if same != child => {
                    let c = p.nodes[child as usize].counter;
                    p.nodes[same as usize].counter.add(&c, is_max);
                    work.push((same, child));
                }
                Some(_) => {}
            }
        }
        removals.push((parent, node));
    }
    // IgProf removes `node` from `parent` after merging its children, deepest first.
    for (parent, node) in removals.into_iter().rev() {
        let sym = p.nodes[node as usize].symbol();
        if p.child_by_symbol(parent, sym) == Some(node) {
            remove_child(p, parent, node);
        }
    }
}

/// Drops the profiler's own frames (libigprof, IgProf, IgHook objects).
pub fn remove_igprof(p: &mut Profile, is_max: bool) {
    let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, _: Phase| {
        let Some(parent) = parent else { return };
        let file = p
            .symbols
            .file_name(p.symbols.file(p.nodes[node as usize].sym));
        let tail = &file[file.len().saturating_sub(20)..];
        if tail.contains("libigprof.") || tail.contains("IgProf.") || tail.contains("IgHook.") {
            merge_to_node(p, parent, node, is_max);
        }
    };
    walk(p, false, true, &mut f);
}

/// The allocation functions IgProf folds into their caller for MEM_* reports.
pub const MALLOC_FAMILY: [&str; 13] = [
    "malloc",
    "calloc",
    "realloc",
    "memalign",
    "posix_memalign",
    "valloc",
    "zmalloc",
    "zcalloc",
    "zrealloc",
    "_Znwj",
    "_Znwm",
    "_Znaj",
    "_Znam",
];

/// Allocation entry points igprof-rs hooks beyond IgProf's list, folded the
/// same way: otherwise a report would charge the bytes to libc's or
/// libstdc++'s wrapper instead of the program's code.
pub const MALLOC_FAMILY_EXTRA: [&str; 3] = ["aligned_alloc", "reallocarray", "pvalloc"];

/// Whether `name` is an allocation function folded into its caller: IgProf's
/// list, [`MALLOC_FAMILY_EXTRA`], and every `operator new`/`new[]` variant
/// (nothrow, aligned: mangled `_Znw...`/`_Zna...`, which reach malloc
/// through each other, e.g. `_ZnamRKSt9nothrow_t` -> `_Znwm`).
pub fn is_malloc_family(name: &str) -> bool {
    MALLOC_FAMILY.contains(&name)
        || MALLOC_FAMILY_EXTRA.contains(&name)
        || name.starts_with("_Znw")
        || name.starts_with("_Zna")
}

/// Folds malloc-family leaves into their caller (counts move up, the node and
/// anything below it go). Post-order, so a chain of wrappers folds entirely.
pub fn fold_malloc(p: &mut Profile, is_max: bool) {
    let ids: FxHashSet<SymId> = (0..p.symbols.len() as SymId)
        .filter(|&s| is_malloc_family(p.symbols.name(s)))
        .collect();
    if ids.is_empty() {
        return;
    }
    let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, _: Phase| {
        let Some(parent) = parent else { return };
        if !ids.contains(&p.nodes[node as usize].symbol()) {
            return;
        }
        let c = p.nodes[node as usize].counter;
        p.nodes[parent as usize].counter.add(&c, is_max);
        remove_child(p, parent, node);
    };
    walk(p, false, true, &mut f);
}

/// Drops old GCC pool-allocator frames and everything below them (MEM_LIVE).
pub fn drop_gcc_pool_alloc(p: &mut Profile) {
    const NAMES: [&str; 3] = [
        "_ZNSt24__default_alloc_templateILb1ELi0EE14_S_chunk_allocEjRi",
        "_ZNSt24__default_alloc_templateILb1ELi0EE9_S_refillEj",
        "_ZNSt24__default_alloc_templateILb1ELi0EE8allocateEj",
    ];
    let ids: FxHashSet<SymId> = NAMES.iter().filter_map(|n| p.symbols.get(n)).collect();
    if ids.is_empty() {
        return;
    }
    let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, _: Phase| {
        if let Some(parent) = parent {
            if ids.contains(&p.nodes[node as usize].symbol()) {
                remove_child(p, parent, node);
            }
        }
    };
    walk(p, false, true, &mut f);
}

/// IgProf's `CollapsingFilter`: renames every node with `convert` and merges
/// a node into its parent when both get the same name, or into a sibling.
fn collapse(p: &mut Profile, is_max: bool, convert: &mut dyn FnMut(&mut Profile, NodeId)) {
    let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, _: Phase| {
        if parent.is_none() {
            return;
        }
        let mut todos: std::collections::VecDeque<NodeId> =
            std::mem::take(&mut p.nodes[node as usize].children).into();
        convert(p, node);
        while let Some(todo) = todos.pop_front() {
            convert(p, todo);
            let sym = p.nodes[todo as usize].symbol();
            let c = p.nodes[todo as usize].counter;
            if sym == p.nodes[node as usize].symbol() {
                todos.extend(p.nodes[todo as usize].children.iter().copied());
                p.nodes[node as usize].counter.add(&c, is_max);
            } else if let Some(same) = p.child_by_symbol(node, sym) {
                let kids = p.nodes[todo as usize].children.clone();
                p.nodes[same as usize].children.extend(kids);
                p.nodes[same as usize].counter.add(&c, is_max);
            } else {
                p.nodes[node as usize].children.push(todo);
            }
        }
    };
    walk(p, true, false, &mut f);
}

fn set_symbol(p: &mut Profile, node: NodeId, sym: SymId) {
    let n = &mut p.nodes[node as usize];
    n.sym = sym;
    n.report = None;
}

/// `-ml`: one node per library (object file) instead of per function.
pub fn merge_libraries(p: &mut Profile, is_max: bool) {
    let mut convert = |p: &mut Profile, node: NodeId| {
        let file = p.symbols.file(p.nodes[node as usize].symbol());
        let name = p.symbols.file_name(file).to_string();
        let sym = p.symbols.intern(&name, file);
        set_symbol(p, node, sym);
    };
    collapse(p, is_max, &mut convert);
}

/// One `-mr` rule: `s/REGEX/WITH/`.
#[derive(Debug, Clone)]
pub struct RegexRule {
    pub re: Regex,
    /// Replacement in the `regex` crate's syntax (`\1` already turned into `${1}`).
    pub with: String,
}

/// Errors in `-mr` and `-ma` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleError {
    /// The text at byte `at` of `arg` does not follow `s/RE/WITH/[;s/...]`.
    BadSubstitution { arg: String, at: usize },
    /// The regular expression does not compile.
    BadRegex { re: String, reason: String },
    /// `-ma` needs `A>B>.../NEW`.
    BadAncestors { arg: String },
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleError::BadSubstitution { arg, at } => write!(
                f,
                "--merge-regexp '{arg}': expected s/REGEXP/REPLACEMENT/ (several separated by ';') at character {}",
                at + 1
            ),
            RuleError::BadRegex { re, reason } => write!(f, "bad regular expression '{re}': {reason}"),
            RuleError::BadAncestors { arg } => {
                write!(f, "--merge-ancestors '{arg}': expected ANCESTOR1>ANCESTOR2>.../NEWNAME")
            }
        }
    }
}

fn compile(re: &str) -> Result<Regex, RuleError> {
    Regex::new(re).map_err(|e| RuleError::BadRegex {
        re: re.to_string(),
        reason: e.to_string(),
    })
}

/// Parses IgProf's `-mr` argument: `s/RE/WITH/` rules separated by `;`, any
/// separator character after `s`; `\N` in WITH is capture group N.
pub fn parse_merge_regexp(arg: &str) -> Result<Vec<RegexRule>, RuleError> {
    let b = arg.as_bytes();
    let mut rules = Vec::new();
    let mut i = 0;
    let bad = |at: usize| RuleError::BadSubstitution {
        arg: arg.to_string(),
        at,
    };
    while i < b.len() {
        if b[i] != b's' {
            return Err(bad(i));
        }
        i += 1;
        let Some(&sep) = b.get(i) else {
            return Err(bad(i));
        };
        i += 1;
        let part = |i: &mut usize| -> Result<String, RuleError> {
            let start = *i;
            while *i < b.len() && b[*i] != sep {
                *i += 1;
            }
            if *i >= b.len() {
                return Err(bad(*i));
            }
            let s = String::from_utf8_lossy(&b[start..*i]).into_owned();
            *i += 1;
            Ok(s)
        };
        let re = part(&mut i)?;
        let with = part(&mut i)?;
        if i < b.len() {
            if b[i] != b';' {
                return Err(bad(i));
            }
            i += 1;
        }
        let mut repl = String::new();
        let mut chars = with.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek().is_some_and(|d| d.is_ascii_digit()) => {
                    repl.push_str(&format!("${{{}}}", chars.next().unwrap_or('0')));
                }
                '$' => repl.push_str("$$"),
                c => repl.push(c),
            }
        }
        rules.push(RegexRule {
            re: compile(&re)?,
            with: repl,
        });
    }
    Ok(rules)
}

/// `-mr`: renames symbols (or, failing that, their library) by the first
/// rule that changes them; renamed nodes merge like `-ml`.
pub fn merge_regexp(p: &mut Profile, rules: &[RegexRule], is_max: bool) {
    let mut converted: FxHashSet<SymId> = FxHashSet::default();
    let mut cache: FxHashMap<SymId, Option<SymId>> = FxHashMap::default();
    let mut convert = |p: &mut Profile, node: NodeId| {
        let sym = p.nodes[node as usize].symbol();
        if converted.contains(&sym) {
            return;
        }
        let target = *cache.entry(sym).or_insert_with(|| {
            let name = p.symbols.name(sym).to_string();
            let file = p.symbols.file(sym);
            let file_name = p.symbols.file_name(file).to_string();
            for r in rules {
                let mut t = r.re.replace_all(&name, r.with.as_str()).into_owned();
                if t == name {
                    t = r.re.replace_all(&file_name, r.with.as_str()).into_owned();
                    if t == file_name {
                        continue;
                    }
                }
                return Some(p.symbols.intern(&t, file));
            }
            None
        });
        if let Some(t) = target {
            converted.insert(t);
            set_symbol(p, node, t);
        }
    };
    collapse(p, is_max, &mut convert);
}

/// A parsed `-ma A>B>C/NEW` argument.
#[derive(Debug, Clone)]
pub struct Ancestors {
    pub chain: Vec<Regex>,
    pub with: String,
}

pub fn parse_merge_ancestors(arg: &str) -> Result<Ancestors, RuleError> {
    let Some(slash) = arg.find('/') else {
        return Err(RuleError::BadAncestors {
            arg: arg.to_string(),
        });
    };
    let (chain, with) = (&arg[..slash], &arg[slash + 1..]);
    if chain.is_empty() {
        return Err(RuleError::BadAncestors {
            arg: arg.to_string(),
        });
    }
    let chain = chain
        .split('>')
        .map(compile)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Ancestors {
        chain,
        with: with.to_string(),
    })
}

/// `-ma`: along each path, the node that completes the ancestor chain (each
/// regex matched by some node, in order) is renamed NEW and every node below
/// it NEW:NAME. IgProf's version appends one more ':' to NEW at every node
/// (a bug); this one does what its documentation says.
pub fn merge_ancestors(p: &mut Profile, a: &Ancestors) {
    let last = a.chain.len();
    // (node, matched-so-far on entry)
    let mut stack: Vec<(NodeId, usize)> = vec![(0, 0)];
    while let Some((node, matched)) = stack.pop() {
        let sym = p.nodes[node as usize].symbol();
        let mut now = matched;
        if matched >= last {
            let name = format!("{}:{}", a.with, p.symbols.name(sym));
            let s = p.symbols.intern(&name, p.symbols.file(sym));
            set_symbol(p, node, s);
        } else if a.chain[matched].is_match(p.symbols.name(sym)) {
            now += 1;
            if now == last {
                let s = p.symbols.intern(&a.with, p.symbols.file(sym));
                set_symbol(p, node, s);
            }
        }
        for &c in &p.nodes[node as usize].children {
            stack.push((c, now));
        }
    }
}

/// Sets cumulative counts: self plus all descendants (max for *_MAX).
pub fn add_cumulative(p: &mut Profile, is_max: bool) {
    let mut f = |p: &mut Profile, parent: Option<NodeId>, node: NodeId, phase: Phase| match phase {
        Phase::Pre => {
            let c = &mut p.nodes[node as usize].counter;
            c.ccnt = c.cnt;
            c.cfreq = c.freq;
        }
        Phase::Post => {
            if let Some(parent) = parent {
                let c = p.nodes[node as usize].counter;
                p.nodes[parent as usize].counter.accumulate(&c, is_max);
            }
        }
    };
    walk(p, true, true, &mut f);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_regexp_argument_syntax() {
        let r = parse_merge_regexp("s/^std::(.*)$/STL \\1/;s|a|b|").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0].re.replace_all("std::vector", r[0].with.as_str()),
            "STL vector"
        );
        assert_eq!(r[1].re.replace_all("banana", r[1].with.as_str()), "bbnbnb");
        assert!(matches!(
            parse_merge_regexp("x/a/b/"),
            Err(RuleError::BadSubstitution { at: 0, .. })
        ));
        assert!(matches!(
            parse_merge_regexp("s/a/b"),
            Err(RuleError::BadSubstitution { .. })
        ));
        assert!(matches!(
            parse_merge_regexp("s/(/b/"),
            Err(RuleError::BadRegex { .. })
        ));
        assert!(parse_merge_ancestors("main>work/X").is_ok());
        assert!(parse_merge_ancestors("main").is_err());
    }
}
