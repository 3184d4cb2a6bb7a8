//! Applying a journal (`PROFILE.journal`, see `igprof_format::journal`) to
//! the snapshot it follows: the allocations and frees, descriptors opened
//! and closed and PERF ticks a process counted after its last snapshot
//! near the memory limit, up to its end (an OOM kill leaves nothing else).
//!
//! Owns: finding a journal beside a profile and checking that it follows
//! that very dump ([`beside`]: the size; [`apply`]: the pid and the
//! `dumped` note's time), and the merged profile's text
//! ([`apply`]): the snapshot's nodes, counters and live blocks with the
//! journal's changes, as one profile in the same format, its snapshot
//! note saying what was added.
//!
//! A journal's stack is a list of addresses; the snapshot names a node by
//! function and offset. A node's object offset is its function's
//! definition offset minus the defining node's offset plus its own (the
//! format's rule), so an address of a stack the snapshot has finds its
//! node exactly; an address it lacks gets a function of its own,
//! `@?0x<address>` in its object, which symbol resolution names later.
//!
//! Must never: panic on a journal cut anywhere, or apply a journal to a
//! profile it does not follow (a later snapshot, or the final profile).

use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use igprof_format::journal::{Change, Family, Journal};
use igprof_format::read::{ReadError, Reader};
use igprof_format::write::{CounterRef, FileRef, FuncRef, IoSink, Writer};

/// The journals beside `path` of that file's size, to try in turn (the
/// snapshot's pid and time are checked by [`apply`]): `PROFILE.journal`,
/// then `PROFILE.journal.tmp`, which is the snapshot's own journal when
/// the process died between the snapshot's rename and its journal's (the
/// journal names its snapshot before that rename).
pub fn beside(path: &str) -> Result<Vec<Journal>, String> {
    let Ok(m) = std::fs::metadata(path) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for (jpath, placed) in [
        (format!("{path}.journal"), true),
        (format!("{path}.journal.tmp"), false),
    ] {
        match of_size(&jpath, m.len()) {
            Ok(Some(j)) => found.push(j),
            Ok(None) => {}
            // A journal in place must read; one still being made (or
            // given up) is passed over.
            Err(e) if placed => {
                return Err(format!(
                    "{jpath}: {e}; move it away to read the snapshot alone"
                ))
            }
            Err(_) => {}
        }
    }
    Ok(found)
}

/// The journal at `jpath` if it follows a snapshot of `size` bytes. One
/// of another dump (up to 64 MiB) is passed over on its header's first
/// words; a damaged one is read whole for the error (a journal that
/// parses has the header read first, so its size is `size`).
fn of_size(jpath: &str, size: u64) -> Result<Option<Journal>, String> {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(jpath) else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    let head = (&mut file)
        .take(64)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if head == 64 && igprof_format::journal::snapshot_size(&bytes).is_some_and(|s| s != size) {
        return Ok(None);
    }
    file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Journal::parse(&bytes).map(Some).map_err(|e| e.to_string())
}

/// The index of `s` in `names`, pushed there first if absent.
fn index_of(names: &mut Vec<String>, s: &str) -> u32 {
    match names.iter().position(|n| n == s) {
        Some(i) => i as u32,
        None => {
            names.push(s.to_string());
            names.len() as u32 - 1
        }
    }
}

/// The counter taken at the replayed peak of the live heap.
const AT_PEAK: &str = "MEM_LIVE_AT_PEAK";

struct Func {
    file: u32,
    /// Object offset of the function's start (its definition's object
    /// offset less the defining node's offset).
    start: i64,
    name: String,
}

#[derive(Default)]
struct Node {
    func: u32,
    offset: i64,
    kids: Vec<u32>,
    /// (counter, ticks, value, peak).
    values: Vec<(u32, i64, i64, i64)>,
    /// (counter, address, size).
    leaks: Vec<(u32, u64, i64)>,
}

impl Node {
    fn value(&mut self, c: u32) -> &mut (u32, i64, i64, i64) {
        let i = match self.values.iter().position(|v| v.0 == c) {
            Some(i) => i,
            None => {
                self.values.push((c, 0, 0, 0));
                self.values.len() - 1
            }
        };
        &mut self.values[i]
    }
}

/// The snapshot as a tree, with the tables it defines.
struct Tree {
    pid: u64,
    program: String,
    tick: f64,
    files: Vec<String>,
    funcs: Vec<Func>,
    counters: Vec<String>,
    /// Node 0 is a root above the profile's depth-1 nodes.
    nodes: Vec<Node>,
    /// (object path, object offset) -> (function, offset in it).
    at: HashMap<(String, i64), (u32, i64)>,
}

impl Tree {
    fn read<R: BufRead>(input: R, name: &str) -> Result<Tree, ReadError> {
        let mut r = Reader::new(input, name)?;
        let h = r.header().clone();
        let mut t = Tree {
            pid: h.pid,
            program: h.program,
            tick: h.tick_period,
            files: Vec::new(),
            funcs: Vec::new(),
            counters: Vec::new(),
            nodes: vec![Node::default()],
            at: HashMap::new(),
        };
        let mut path: Vec<u32> = vec![0];
        while let Some(n) = r.next_node()? {
            let (depth, func, offset) = (n.depth as usize, n.function, n.symbol_offset);
            let mut node = Node {
                func,
                offset,
                ..Node::default()
            };
            for v in n.counters {
                node.values.push((v.counter, v.ticks, v.value, v.peak));
                node.leaks
                    .extend(n.leaks(v).iter().map(|l| (v.counter, l.address, l.size)));
            }
            let defines = n.defines_function;
            let id = t.nodes.len() as u32;
            t.nodes.push(node);
            path.truncate(depth);
            let parent = *path.last().unwrap_or(&0);
            t.nodes[parent as usize].kids.push(id);
            path.push(id);
            let Some(f) = r.function(func) else { continue };
            if defines {
                let file = r.file(f.file).unwrap_or("").to_string();
                let fi = f.file as usize;
                if t.files.len() <= fi {
                    t.files.resize(fi + 1, String::new());
                }
                t.files[fi] = file;
                if t.funcs.len() <= func as usize {
                    t.funcs.resize_with(func as usize + 1, || Func {
                        file: 0,
                        start: 0,
                        name: String::new(),
                    });
                }
                t.funcs[func as usize] = Func {
                    file: f.file,
                    start: f.file_offset.wrapping_sub(offset),
                    name: f.name.clone(),
                };
            }
            let Some(f) = t.funcs.get(func as usize) else {
                continue;
            };
            let file = t.files[f.file as usize].clone();
            t.at.entry((file, f.start.wrapping_add(offset)))
                .or_insert((func, offset));
        }
        for (id, name) in r.counters() {
            if t.counters.len() <= id as usize {
                t.counters.resize(id as usize + 1, String::new());
            }
            t.counters[id as usize] = name.to_string();
        }
        Ok(t)
    }

    fn counter(&mut self, name: &str) -> u32 {
        index_of(&mut self.counters, name)
    }

    fn file(&mut self, path: &str) -> u32 {
        index_of(&mut self.files, path)
    }

    /// The function and offset of code address `addr`.
    fn frame(&mut self, j: &Journal, addr: u64) -> (u32, i64) {
        let (path, object, name) = match addr {
            1 => (
                "<truncated>".to_string(),
                0,
                "@igprof_stack_truncated".to_string(),
            ),
            2 => (
                "<allocator mmap>".to_string(),
                0,
                "<allocator mmap>".to_string(),
            ),
            _ => match j.modules.iter().find(|m| m.start <= addr && addr < m.end) {
                Some(m) => (
                    m.path.clone(),
                    (addr - m.base) as i64,
                    format!("@?0x{addr:x}"),
                ),
                None => (
                    "<unknown>".to_string(),
                    addr as i64,
                    format!("@?0x{addr:x}"),
                ),
            },
        };
        if let Some(&f) = self.at.get(&(path.clone(), object)) {
            return f;
        }
        let file = self.file(&path);
        self.funcs.push(Func {
            file,
            start: object,
            name,
        });
        let f = (self.funcs.len() as u32 - 1, 0);
        self.at.insert((path, object), f);
        f
    }

    /// The node of `stack` (innermost first), made where missing.
    fn node(&mut self, j: &Journal, stack: &[u64]) -> u32 {
        let mut at = 0u32;
        for &addr in stack.iter().rev() {
            let (func, offset) = self.frame(j, addr);
            let found = self.nodes[at as usize].kids.iter().copied().find(|&k| {
                let n = &self.nodes[k as usize];
                n.func == func && n.offset == offset
            });
            at = match found {
                Some(k) => k,
                None => {
                    let k = self.nodes.len() as u32;
                    self.nodes.push(Node {
                        func,
                        offset,
                        ..Node::default()
                    });
                    self.nodes[at as usize].kids.push(k);
                    k
                }
            };
        }
        at
    }
}

/// What applying a journal did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub allocs: u64,
    pub frees: u64,
    /// Descriptors opened and closed.
    pub opens: u64,
    pub closes: u64,
    /// PERF ticks.
    pub ticks: u64,
    /// Changes whose stack the journal lost (its writer died writing it).
    pub unplaced: u64,
    /// Changes the snapshot already counted (made as it started).
    pub before: u64,
}

impl Applied {
    fn add(&mut self, f: Family, made: u64, gone: u64) {
        let (a, b) = match f {
            Family::Memory => (&mut self.allocs, &mut self.frees),
            Family::Descriptors => (&mut self.opens, &mut self.closes),
        };
        *a += made;
        *b += gone;
    }

    /// What the snapshot's note adds: the changes applied.
    fn said(&self) -> String {
        let mut s = format!("{} allocations and {} frees", self.allocs, self.frees);
        if self.opens + self.closes > 0 {
            s += &format!(
                ", {} descriptors opened and {} closed",
                self.opens, self.closes
            );
        }
        if self.ticks > 0 {
            s += &format!(", {} PERF ticks", self.ticks);
        }
        s
    }
}

/// The counters of one family.
#[derive(Clone, Copy)]
struct Counters {
    total: u32,
    max: Option<u32>,
    live: u32,
}

/// The profile read from `input` (named `name`) with `j` applied, as
/// text; None when `j` follows another dump (its pid or the time of its
/// `dumped` note differ).
pub fn apply<R: BufRead>(
    input: R,
    name: &str,
    j: &Journal,
) -> Result<Option<(Vec<u8>, Applied)>, String> {
    let mut t = Tree::read(input, name).map_err(|e| e.to_string())?;
    let dumped = igprof_format::notes::time(&t.program, igprof_format::notes::DUMPED);
    if t.pid != j.pid || dumped.map(|d| d.as_micros() as u64) != Some(j.snapshot.0) {
        return Ok(None);
    }
    let mem = Counters {
        total: t.counter("MEM_TOTAL"),
        max: Some(t.counter("MEM_MAX")),
        live: t.counter("MEM_LIVE"),
    };
    let fds = Counters {
        total: t.counter("FD_USED"),
        max: None,
        live: t.counter("FD_LIVE"),
    };
    let counters = |f: Family| if f == Family::Memory { mem } else { fds };
    let (perf, at_peak) = (t.counter("PERF_TICKS"), t.counter(AT_PEAK));
    let sum = |t: &Tree, c: u32| -> i64 {
        t.nodes
            .iter()
            .flat_map(|n| n.values.iter().filter(|v| v.0 == c).map(|v| v.2))
            .sum()
    };
    // The live blocks and descriptors, by node and address: the
    // snapshot's, then as the journal changes them. A journal starts as
    // the snapshot reads them, so a change made before that read is in
    // both: an allocation of a block the snapshot has live, or a free of
    // one it does not, is already counted.
    let mut blocks: HashMap<(Family, u32, u64), i64> = HashMap::new();
    let mut listed: HashSet<Family> = HashSet::new();
    for (id, n) in t.nodes.iter_mut().enumerate() {
        n.leaks.retain(|&(c, addr, size)| {
            let family = [Family::Memory, Family::Descriptors]
                .into_iter()
                .find(|&f| counters(f).live == c);
            if let Some(f) = family {
                blocks.insert((f, id as u32, addr), size);
                listed.insert(f);
            }
            family.is_none()
        });
    }
    // Which changes count, where, and where the process's live heap was
    // highest if above the snapshot's peak (MEM_LIVE_AT_PEAK is every
    // stack's MEM_LIVE at that change).
    let mut done = Applied::default();
    let mut placed: HashMap<u64, u32> = HashMap::new();
    let mut touched: HashSet<(Family, u32)> = HashSet::new();
    let mut counted: Vec<Option<u32>> = Vec::with_capacity(j.changes.len());
    let mut running = sum(&t, mem.live);
    let mut highest = sum(&t, at_peak).max(running);
    let mut peak_at = None;
    for (i, (node, c)) in j.changes.iter().enumerate() {
        let Some(stack) = j.paths.get(node) else {
            done.unplaced += 1;
            counted.push(None);
            continue;
        };
        let n = *placed.entry(*node).or_insert_with(|| t.node(j, stack));
        let (counts, family, grew) = match *c {
            Change::Alloc {
                family,
                addr,
                bytes,
                ..
            }
            | Change::Restore {
                family,
                addr,
                bytes,
                ..
            } => {
                let fresh = !blocks.contains_key(&(family, n, addr));
                if fresh {
                    blocks.insert((family, n, addr), bytes as i64);
                }
                (fresh, Some(family), bytes as i64)
            }
            Change::Free {
                family,
                addr,
                bytes,
                ..
            } => {
                let live = blocks.remove(&(family, n, addr)).is_some();
                (live, Some(family), -(bytes as i64))
            }
            Change::Ticks { .. } => (true, None, 0),
        };
        if let Some(f) = family {
            touched.insert((f, n));
            if counts && f == Family::Memory {
                running += grew;
            }
        }
        if !counts {
            done.before += 1;
        }
        counted.push(counts.then_some(n));
        if running > highest {
            highest = running;
            peak_at = Some(i);
        }
    }
    for (i, (_, c)) in j.changes.iter().enumerate() {
        let Some(n) = counted[i] else { continue };
        let nd = &mut t.nodes[n as usize];
        match *c {
            Change::Alloc {
                family,
                calls,
                bytes,
                largest,
                ..
            } => {
                let cs = counters(family);
                done.add(family, calls, 0);
                let v = nd.value(cs.total);
                let now = v.2 + bytes as i64;
                *v = (v.0, v.1 + calls as i64, now, v.3.max(now));
                if let Some(max) = cs.max {
                    let v = nd.value(max);
                    *v = (v.0, v.1 + calls as i64, v.2.max(largest as i64), v.3);
                }
                add_live(nd, cs.live, calls as i64, bytes as i64);
            }
            Change::Restore {
                family,
                calls,
                bytes,
                ..
            } => add_live(nd, counters(family).live, calls as i64, bytes as i64),
            Change::Free {
                family,
                calls,
                bytes,
                ..
            } => {
                done.add(family, 0, calls);
                add_live(nd, counters(family).live, -(calls as i64), -(bytes as i64));
            }
            Change::Ticks { ticks, value } => {
                done.ticks += ticks;
                let v = nd.value(perf);
                let now = v.2 + value as i64;
                *v = (v.0, v.1 + ticks as i64, now, v.3.max(now));
            }
        }
        if peak_at == Some(i) {
            for nd in &mut t.nodes {
                let (_, lt, lv, _) = nd
                    .values
                    .iter()
                    .find(|v| v.0 == mem.live)
                    .copied()
                    .unwrap_or_default();
                nd.values.retain(|v| v.0 != at_peak);
                if (lt, lv) != (0, 0) {
                    nd.values.push((at_peak, lt, lv, lv));
                }
            }
        }
    }
    // Each stack has its live blocks (descriptors) as MEM_LIVE (FD_LIVE),
    // in a profile whose memory is not sampled, where the snapshot lists
    // them or the journal changed it: the snapshot read its counters just
    // after the blocks, so a change in flight on another thread between
    // the two reads is in one of them only (at most one per thread), and
    // the journal, which began at the read of the blocks, lacks a change
    // its thread made before it began but counted after (a CI run:
    // 5,832 blocks listed, MEM_LIVE 5,830, nothing in the journal).
    let sampled = igprof_format::notes::split(&t.program)
        .1
        .iter()
        .any(|n| n.starts_with("sampled"));
    let recount = |f: Family| f == Family::Descriptors || !sampled;
    let mut sums: HashMap<(Family, u32), (i64, i64)> = touched
        .into_iter()
        .filter(|&(f, _)| recount(f))
        .map(|k| (k, (0, 0)))
        .collect();
    for f in listed.into_iter().filter(|&f| recount(f)) {
        let live = counters(f).live;
        for (id, n) in t.nodes.iter().enumerate() {
            if n.values.iter().any(|v| v.0 == live) {
                sums.entry((f, id as u32)).or_insert((0, 0));
            }
        }
    }
    for (&(f, n, _), &size) in &blocks {
        if let Some(s) = sums.get_mut(&(f, n)) {
            *s = (s.0 + 1, s.1 + size);
        }
    }
    for ((f, n), (count, bytes)) in sums {
        let v = t.nodes[n as usize].value(counters(f).live);
        *v = (v.0, count, bytes, v.3.max(bytes));
    }
    for ((f, n, addr), size) in blocks {
        t.nodes[n as usize]
            .leaks
            .push((counters(f).live, addr, size));
    }
    for n in &mut t.nodes {
        n.leaks.sort_unstable();
    }
    // The snapshot's note says what the profile now holds.
    let (prog, notes) = igprof_format::notes::split(&t.program);
    let notes: Vec<String> = notes
        .into_iter()
        .map(|n| match n.strip_prefix(igprof_format::notes::SNAPSHOT) {
            Some(why) if why.starts_with(' ') => {
                format!(
                    "{n}, then its journal to the process's end: {}",
                    done.said()
                )
            }
            _ => n.to_string(),
        })
        .collect();
    let program =
        String::from_utf8_lossy(&igprof_format::notes::join(prog.as_bytes(), &notes)).into_owned();
    let text = write(&t, &program)
        .map_err(|e| format!("{name}: cannot write the merged profile: {e:?}"))?;
    Ok(Some((text, done)))
}

fn add_live(nd: &mut Node, live: u32, calls: i64, bytes: i64) {
    let v = nd.value(live);
    let now = v.2 + bytes;
    *v = (v.0, v.1 + calls, now, v.3.max(now));
}

fn write(t: &Tree, program: &str) -> Result<Vec<u8>, igprof_format::write::WriteError> {
    let mut w = Writer::new(IoSink::new(Vec::new()));
    w.header(t.pid, program.as_bytes(), t.tick)?;
    let mut file_done = vec![false; t.files.len()];
    let mut func_done = vec![false; t.funcs.len()];
    let mut counter_done = vec![false; t.counters.len()];
    let mut stack: Vec<(u32, u32)> = t.nodes[0].kids.iter().rev().map(|&k| (k, 1)).collect();
    while let Some((id, depth)) = stack.pop() {
        let n = &t.nodes[id as usize];
        let f = &t.funcs[n.func as usize];
        let func = if std::mem::replace(&mut func_done[n.func as usize], true) {
            FuncRef::Known(n.func)
        } else {
            let fid = f.file as usize;
            FuncRef::New {
                id: n.func,
                file: if std::mem::replace(&mut file_done[fid], true) {
                    FileRef::Known(f.file)
                } else {
                    FileRef::New {
                        id: f.file,
                        path: t.files[fid].as_bytes(),
                    }
                },
                object_offset: (f.start + n.offset) as u64,
                name: f.name.as_bytes(),
            }
        };
        w.node(depth, func, n.offset as u64)?;
        for &(c, ticks, value, peak) in &n.values {
            if (ticks, value, peak) == (0, 0, 0) {
                continue;
            }
            let cref = if std::mem::replace(&mut counter_done[c as usize], true) {
                CounterRef::Known(c)
            } else {
                CounterRef::New {
                    id: c,
                    name: t.counters[c as usize].as_bytes(),
                }
            };
            w.counter(
                cref,
                ticks.max(0) as u64,
                value.max(0) as u64,
                peak.max(0) as u64,
            )?;
            for &(lc, addr, size) in &n.leaks {
                if lc == c {
                    w.leak(addr, size.max(0) as u64)?;
                }
            }
        }
        w.end_node()?;
        stack.extend(n.kids.iter().rev().map(|&k| (k, depth + 1)));
    }
    w.into_sink().finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use igprof_format::journal::Module;

    /// A snapshot (hexadecimal): main (at ./app+0x100, its call at +0x10)
    /// -> grow (at +0x200, its call at +0x8) with one live block of 100
    /// bytes at 0x500.
    const SNAPSHOT: &str = "P=(HEX ID=2a N=(./app [dumped 1.0; snapshot at 90.0 MiB]) T=0.000000)\n\
C1 FN0=(F0=(./app)+110 N=(main))+10\n\
C2 FN1=(F0+208 N=(grow))+8 V0=(MEM_TOTAL):(1,64,64) V1=(MEM_MAX):(1,64,0) V2=(MEM_LIVE):(1,64,64);LK=(0x500,64) V3=(MEM_LIVE_AT_PEAK):(1,64,64)\n";

    fn journal(changes: Vec<(u64, Change)>, paths: &[(u64, Vec<u64>)]) -> Journal {
        Journal {
            pid: 0x2a,
            snapshot: (1_000_000, 0),
            modules: vec![Module {
                start: 0x1000,
                end: 0x2000,
                base: 0x1000,
                path: "./app".into(),
            }],
            paths: paths.iter().cloned().collect(),
            changes,
            ..Journal::default()
        }
    }

    fn merged(
        j: &Journal,
    ) -> (
        igprof_format::read::Reader<std::io::Cursor<Vec<u8>>>,
        Applied,
    ) {
        let (text, done) = apply(SNAPSHOT.as_bytes(), "snap", j).unwrap().unwrap();
        (
            Reader::new(std::io::Cursor::new(text), "merged").unwrap(),
            done,
        )
    }

    /// Each node's (depth, function name, counters by name, leak addresses).
    type Line = (u32, String, Vec<(String, i64, i64, i64)>, Vec<u64>);

    fn lines(r: &mut igprof_format::read::Reader<std::io::Cursor<Vec<u8>>>) -> Vec<Line> {
        let mut out = Vec::new();
        while let Some(n) = r.next_node().unwrap() {
            let (depth, func) = (n.depth, n.function);
            let values: Vec<_> = n.counters.to_vec();
            let leaks: Vec<u64> = values
                .iter()
                .flat_map(|v| n.leaks(v).iter().map(|l| l.address))
                .collect();
            let named = values
                .iter()
                .map(|v| {
                    (
                        r.counter(v.counter).unwrap().to_string(),
                        v.ticks,
                        v.value,
                        v.peak,
                    )
                })
                .collect();
            out.push((depth, r.function(func).unwrap().name.clone(), named, leaks));
        }
        out
    }

    #[test]
    fn a_known_stack_adds_to_its_node_and_a_new_one_makes_nodes() {
        // Main's node is at 0x1110 (object offset 0x110), grow's at 0x1208;
        // 0x1300 is an address the snapshot lacks.
        let j = journal(
            vec![
                (
                    7,
                    Change::Alloc {
                        family: Family::Memory,
                        addr: 0x600,
                        calls: 1,
                        bytes: 32,
                        largest: 32,
                    },
                ),
                (
                    8,
                    Change::Alloc {
                        family: Family::Memory,
                        addr: 0x700,
                        calls: 1,
                        bytes: 16,
                        largest: 16,
                    },
                ),
                (
                    7,
                    Change::Free {
                        family: Family::Memory,
                        addr: 0x500,
                        calls: 1,
                        bytes: 100,
                    },
                ),
            ],
            &[(7, vec![0x1208, 0x1110]), (8, vec![0x1300, 0x1110])],
        );
        let (mut r, done) = merged(&j);
        assert_eq!(
            done,
            Applied {
                allocs: 2,
                frees: 1,
                ..Applied::default()
            }
        );
        let l = lines(&mut r);
        assert_eq!(l.len(), 3, "{l:?}");
        assert_eq!((l[0].0, l[0].1.as_str()), (1, "main"));
        let grow = &l[1];
        assert_eq!(grow.1, "grow");
        let v = |line: &Line, c: &str| line.2.iter().find(|v| v.0 == c).map(|v| (v.1, v.2, v.3));
        assert_eq!(v(grow, "MEM_TOTAL"), Some((2, 132, 132)));
        assert_eq!(v(grow, "MEM_MAX"), Some((2, 100, 0)));
        assert_eq!(v(grow, "MEM_LIVE"), Some((1, 32, 132)));
        assert_eq!(grow.3, [0x600], "the freed block left its node's list");
        // The new stack: a function of its own, named by its address.
        assert_eq!((l[2].0, l[2].1.as_str()), (2, "@?0x1300"));
        assert_eq!(v(&l[2], "MEM_LIVE"), Some((1, 16, 16)));
        // The live heap was highest (148 bytes) after the second allocation.
        assert_eq!(v(grow, "MEM_LIVE_AT_PEAK"), Some((2, 132, 132)));
        assert_eq!(v(&l[2], "MEM_LIVE_AT_PEAK"), Some((1, 16, 16)));
        let prog = &r.header().program;
        assert!(
            prog.contains("snapshot at 90.0 MiB, then its journal to the process's end: 2 allocations and 1 frees"),
            "{prog}"
        );
        assert!(prog.contains("dumped 1.0"), "{prog}");
    }

    /// The journal began as the snapshot read the live blocks: a change
    /// made before that read is in both, and counts once.
    #[test]
    fn changes_the_snapshot_already_holds_count_once() {
        let alloc = |addr| Change::Alloc {
            family: Family::Memory,
            addr,
            calls: 1,
            bytes: 100,
            largest: 100,
        };
        let free = |addr| Change::Free {
            family: Family::Memory,
            addr,
            calls: 1,
            bytes: 100,
        };
        let j = journal(
            vec![
                // Allocated before the read: the snapshot has it live.
                (7, alloc(0x500)),
                // Allocated and freed before the read: it has neither.
                (7, alloc(0x900)),
                (7, free(0x900)),
                // Freed after the read, allocated again at the address.
                (7, free(0x500)),
                (7, alloc(0x500)),
            ],
            &[(7, vec![0x1208, 0x1110])],
        );
        let (mut r, done) = merged(&j);
        assert_eq!((done.allocs, done.frees, done.before), (2, 2, 1));
        let l = lines(&mut r);
        let v = |c: &str| l[1].2.iter().find(|v| v.0 == c).map(|v| (v.1, v.2));
        // MEM_TOTAL also counts the block allocated and freed before the
        // read, twice: the one change the addresses cannot tell.
        assert_eq!(v("MEM_TOTAL"), Some((3, 300)));
        assert_eq!(v("MEM_LIVE"), Some((1, 100)));
        assert_eq!(l[1].3, [0x500]);
    }

    /// The snapshot read its live blocks, then its counters: a block
    /// whose thread counted it live only after the counters' read, and
    /// joined the journal before that (so the journal lacks it), is in
    /// the list and not in MEM_LIVE. Each stack's MEM_LIVE is its listed
    /// blocks with the journal's changes, changed or not.
    #[test]
    fn a_listed_block_the_counter_lacks_is_live() {
        let lagging = SNAPSHOT.replace(
            "V2=(MEM_LIVE):(1,64,64);LK=(0x500,64)",
            "V2=(MEM_LIVE):(1,64,64);LK=(0x500,64);LK=(0x600,64)",
        );
        let (text, _) = apply(lagging.as_bytes(), "snap", &journal(vec![], &[]))
            .unwrap()
            .unwrap();
        let mut r = Reader::new(std::io::Cursor::new(text), "merged").unwrap();
        let l = lines(&mut r);
        let v = |c: &str| l[1].2.iter().find(|v| v.0 == c).map(|v| (v.1, v.2, v.3));
        assert_eq!(v("MEM_LIVE"), Some((2, 200, 200)));
        assert_eq!(
            v("MEM_TOTAL"),
            Some((1, 100, 100)),
            "as the snapshot read it"
        );
        assert_eq!(l[1].3, [0x500, 0x600]);
    }

    /// Descriptors opened and closed, and PERF ticks, go to their own
    /// counters; a descriptor is told by its number as a block by its
    /// address.
    #[test]
    fn descriptors_and_ticks_go_to_their_counters() {
        let open = |fd| Change::Alloc {
            family: Family::Descriptors,
            addr: fd,
            calls: 1,
            bytes: 1,
            largest: 0,
        };
        let close = |fd| Change::Free {
            family: Family::Descriptors,
            addr: fd,
            calls: 1,
            bytes: 1,
        };
        let j = journal(
            vec![
                (7, open(3)),
                (7, open(4)),
                (7, close(3)),
                // Closed before the snapshot read: not live there.
                (7, close(9)),
                (8, Change::Ticks { ticks: 5, value: 5 }),
            ],
            &[(7, vec![0x1208, 0x1110]), (8, vec![0x1110])],
        );
        let (mut r, done) = merged(&j);
        assert_eq!(
            (done.opens, done.closes, done.ticks, done.before),
            (2, 1, 5, 1)
        );
        let l = lines(&mut r);
        let v = |line: &Line, c: &str| line.2.iter().find(|v| v.0 == c).map(|v| (v.1, v.2, v.3));
        assert_eq!(v(&l[1], "FD_USED"), Some((2, 2, 2)));
        assert_eq!(v(&l[1], "FD_LIVE"), Some((1, 1, 2)));
        assert_eq!(
            l[1].3,
            [0x500, 4],
            "MEM_LIVE's block, then FD_LIVE's descriptor"
        );
        assert_eq!(v(&l[0], "PERF_TICKS"), Some((5, 5, 5)));
        assert_eq!(v(&l[1], "MEM_LIVE"), Some((1, 100, 100)), "unchanged");
        let prog = &r.header().program;
        assert!(
            prog.contains("2 descriptors opened and 1 closed, 5 PERF ticks"),
            "{prog}"
        );
    }

    #[test]
    fn a_change_whose_stack_was_lost_is_counted_not_placed() {
        let j = journal(
            vec![(
                9,
                Change::Alloc {
                    family: Family::Memory,
                    addr: 0x800,
                    calls: 1,
                    bytes: 8,
                    largest: 8,
                },
            )],
            &[],
        );
        let (mut r, done) = merged(&j);
        assert_eq!(done.unplaced, 1);
        assert_eq!(lines(&mut r).len(), 2);
    }

    #[test]
    fn a_journal_of_another_dump_is_not_applied() {
        let mut j = journal(Vec::new(), &[]);
        j.snapshot.0 += 1;
        assert!(apply(SNAPSHOT.as_bytes(), "snap", &j).unwrap().is_none());
        let mut j = journal(Vec::new(), &[]);
        j.pid += 1;
        assert!(apply(SNAPSHOT.as_bytes(), "snap", &j).unwrap().is_none());
    }

    /// A journal file's bytes: a header naming a snapshot of `size` bytes
    /// dumped at `dumped_us`, no modules, no records.
    fn journal_file(dumped_us: u64, size: u64) -> Vec<u8> {
        use igprof_format::journal as layout;
        let mut b = vec![0u8; layout::HEADER_BYTES];
        for (i, v) in [
            (layout::W_MAGIC, layout::MAGIC),
            (layout::W_PID, 42),
            (layout::W_DUMPED_US, dumped_us),
            (layout::W_SIZE, size),
            (layout::W_MODULES_AT, layout::HEADER_BYTES as u64),
            (layout::W_RECORDS_AT, layout::HEADER_BYTES as u64),
        ] {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn the_journal_still_being_renamed_is_found_beside_its_snapshot() {
        let d = std::env::temp_dir().join(format!("igprof-beside-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let snap = d.join("p.gz");
        let snap = snap.to_str().unwrap();
        std::fs::write(snap, b"0123456789").unwrap();
        let (placed, tmp) = (format!("{snap}.journal"), format!("{snap}.journal.tmp"));
        // No journal; then only the one of the snapshot before (another
        // size), as a kill between the two renames leaves it.
        assert!(beside(snap).unwrap().is_empty());
        std::fs::write(&placed, journal_file(7, 9)).unwrap();
        assert!(beside(snap).unwrap().is_empty());
        // The snapshot's own, not yet renamed: found.
        std::fs::write(&tmp, journal_file(8, 10)).unwrap();
        let found = beside(snap).unwrap();
        assert_eq!(
            found.iter().map(|j| j.snapshot).collect::<Vec<_>>(),
            [(8, 10)]
        );
        // One still being made (no header yet) is passed over; a damaged
        // one in place is an error naming it.
        std::fs::write(&tmp, vec![0u8; 8192]).unwrap();
        assert!(beside(snap).unwrap().is_empty());
        std::fs::write(&placed, b"IGPRJNL1 cut").unwrap();
        let e = beside(snap).unwrap_err();
        assert!(e.contains(&placed) && e.contains("move it away"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_damaged_snapshot_is_an_error_with_its_line() {
        let j = journal(Vec::new(), &[]);
        let bad = "P=(HEX ID=2a N=(./app) T=0.000000)\nC1 FN0+0\n";
        let e = apply(bad.as_bytes(), "snap", &j).unwrap_err();
        assert!(e.contains("snap") && e.contains('2'), "{e}");
    }
}
