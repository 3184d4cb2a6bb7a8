//! The merged call tree of one or more profiles, for one counter.
//!
//! Owns: symbols (unique by name, as IgProf's analyser keeps them), the call
//! tree whose nodes are merged by symbol under the same parent across threads
//! and files, and reading dumps into it (selecting the report counter, its
//! normal or peak value, the hit filters and the baseline's negation).
//!
//! Must never: keep per-line data (memory is proportional to distinct call
//! paths), or panic on a malformed profile (errors carry file and line).

use crate::symbols::Resolver;
use igprof_format::read::{ReadError, Reader};
use rustc_hash::FxHashMap;
use std::io::BufRead;

/// Index of a symbol in [`Symbols`].
pub type SymId = u32;
/// Index of a node in [`Profile::nodes`].
pub type NodeId = u32;

/// Interned symbol names, each with the object file it was first seen in.
#[derive(Default)]
pub struct Symbols {
    names: Vec<String>,
    files: Vec<u32>,
    by_name: FxHashMap<String, SymId>,
    file_names: Vec<String>,
    file_ids: FxHashMap<String, u32>,
}

impl Symbols {
    pub fn file_id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.file_ids.get(name) {
            return i;
        }
        let i = self.file_names.len() as u32;
        self.file_names.push(name.to_string());
        self.file_ids.insert(name.to_string(), i);
        i
    }
    /// The symbol called `name`, created in `file` if new.
    pub fn intern(&mut self, name: &str, file: u32) -> SymId {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        let i = self.names.len() as SymId;
        self.names.push(name.to_string());
        self.files.push(file);
        self.by_name.insert(name.to_string(), i);
        i
    }
    pub fn get(&self, name: &str) -> Option<SymId> {
        self.by_name.get(name).copied()
    }
    pub fn name(&self, s: SymId) -> &str {
        &self.names[s as usize]
    }
    pub fn file(&self, s: SymId) -> u32 {
        self.files[s as usize]
    }
    pub fn file_name(&self, f: u32) -> &str {
        &self.file_names[f as usize]
    }
    pub fn len(&self) -> usize {
        self.names.len()
    }
    /// Forgets the symbols and files created after there were `symbols`
    /// and `files` of them.
    fn truncate(&mut self, symbols: usize, files: usize) {
        for name in self.names.drain(symbols.min(self.names.len())..) {
            self.by_name.remove(&name);
        }
        self.files.truncate(symbols);
        for name in self.file_names.drain(files.min(self.file_names.len())..) {
            self.file_ids.remove(&name);
        }
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// IgProf's `Counter`: self count and calls, and the cumulative ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    pub cnt: i64,
    pub freq: i64,
    pub ccnt: i64,
    pub cfreq: i64,
}

impl Counter {
    /// Adds self values (max of counts for `*_MAX` counters).
    pub fn add(&mut self, o: &Counter, is_max: bool) {
        self.freq += o.freq;
        if is_max {
            self.cnt = self.cnt.max(o.cnt);
        } else {
            self.cnt += o.cnt;
        }
    }
    /// Adds cumulative values of a child.
    pub fn accumulate(&mut self, o: &Counter, is_max: bool) {
        self.cfreq += o.cfreq;
        if is_max {
            self.ccnt = self.ccnt.max(o.ccnt);
        } else {
            self.ccnt += o.ccnt;
        }
    }
}

/// A call-tree node.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// The node's own symbol (IgProf's SYMBOL).
    pub sym: SymId,
    /// The name shown in reports when it differs (recursion `name'2`).
    pub report: Option<SymId>,
    /// Code inlined into its parent (`--inline`): the same stack frame as
    /// the parent's (where inlined and called code merged, false).
    pub inlined: bool,
    pub counter: Counter,
    pub children: Vec<NodeId>,
}

impl Node {
    pub fn symbol(&self) -> SymId {
        self.report.unwrap_or(self.sym)
    }
}

/// What to take from each counter value while reading.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Use the peak instead of the normal value (`--value peak`).
    pub peak: bool,
    /// IgProf's hit filters (-mc/-Mc/-mf/-Mf/--min-average-value/-Ma); <=0 is off.
    pub min_count: i64,
    pub max_count: i64,
    pub min_calls: i64,
    pub max_calls: i64,
    pub min_average: i64,
    pub max_average: i64,
}

impl ReadOptions {
    fn hit_filter(&self, value: &mut i64, freq: &mut i64, negate: bool) {
        if negate {
            *value = -*value;
            *freq = -*freq;
            return;
        }
        let (v, f) = (*value, *freq);
        let drop = (self.min_count > 0 && v < self.min_count)
            || (self.max_count > 0 && v > self.max_count)
            || (self.min_calls > 0 && f < self.min_calls)
            || (self.max_calls > 0 && f > self.max_calls)
            || (self.min_average > 0 && f != 0 && v / f < self.min_average)
            || (self.max_average > 0 && f != 0 && v / f > self.max_average);
        if drop {
            *value = 0;
            *freq = 0;
        }
    }
}

/// The merged tree. Node 0 is `<spontaneous>`, the parent of every root.
pub struct Profile {
    pub symbols: Symbols,
    pub nodes: Vec<Node>,
    /// The report counter (`-r`, else the first counter of the first dump).
    pub key: Option<String>,
    /// Every counter name seen, in order of appearance.
    pub counters_seen: Vec<String>,
    /// Seconds per tick from the last dump read (IgProf keeps a float).
    pub tick_period: f32,
    /// The dumps read that are snapshots, not final profiles (file, why:
    /// `igprof_format::notes::snapshot`), for the caller to report.
    pub snapshots: Vec<(String, String)>,
    /// The tree while reading (see [`ReadIndex`]); None between readings.
    reading: Option<ReadIndex>,
}

const NONE: NodeId = NodeId::MAX;

/// The tree while reading, in dense arrays indexed by node id: the dump
/// revisits nodes in the order they were created, so these stay in cache
/// where the nodes themselves would not. Children are first-child /
/// next-sibling chains in creation order; nodes with more than
/// [`ReadIndex::NARROW`] children are also found through a hash index.
#[derive(Default)]
struct ReadIndex {
    sym: Vec<SymId>,
    first: Vec<NodeId>,
    last: Vec<NodeId>,
    next: Vec<NodeId>,
    nkids: Vec<u32>,
    /// [`Node::inlined`] of each node, and whether any is.
    inlined: Vec<bool>,
    any_inlined: bool,
    /// (count, calls) read for each node.
    acc: Vec<[i64; 2]>,
    wide: FxHashMap<(NodeId, SymId), NodeId>,
    /// Per node, the last [`Undo::generation`] that saved its `acc`.
    saved_in: Vec<u32>,
    /// How to take back the dump being read, when it must be all or nothing.
    undo: Option<Undo>,
    /// Generations handed out to [`Undo`]s so far.
    generations: u32,
}

/// What reading one dump changed in nodes that existed before it, so that
/// a dump that fails half-way leaves no trace. Proportional to the nodes
/// the dump touched, not to its lines.
struct Undo {
    /// Nodes from this id on were created by the dump.
    first_new: NodeId,
    generation: u32,
    /// `acc` of older nodes before the dump added to them.
    acc: Vec<(NodeId, [i64; 2])>,
    /// Older parents given a new child: (parent, its `last` before).
    links: Vec<(NodeId, NodeId)>,
    /// Older nodes that stopped being inlined-only.
    called: Vec<NodeId>,
}

impl ReadIndex {
    const NARROW: u32 = 16;

    fn push(&mut self, sym: SymId, inlined: bool) -> NodeId {
        self.any_inlined |= inlined;
        let id = self.sym.len() as NodeId;
        self.sym.push(sym);
        self.inlined.push(inlined);
        self.first.push(NONE);
        self.last.push(NONE);
        self.next.push(NONE);
        self.nkids.push(0);
        self.acc.push([0, 0]);
        self.saved_in.push(0);
        id
    }

    /// Adds (count, calls) to a node's values.
    fn add(&mut self, node: NodeId, value: i64, freq: i64) {
        let n = node as usize;
        if let Some(u) = self.undo.as_mut() {
            if node < u.first_new && self.saved_in[n] != u.generation {
                self.saved_in[n] = u.generation;
                u.acc.push((node, self.acc[n]));
            }
        }
        self.acc[n][0] += value;
        self.acc[n][1] += freq;
    }

    /// From now on, record what is needed to take back what follows.
    fn begin_undo(&mut self) {
        self.generations += 1;
        self.undo = Some(Undo {
            first_new: self.sym.len() as NodeId,
            generation: self.generations,
            acc: Vec::new(),
            links: Vec::new(),
            called: Vec::new(),
        });
    }

    /// Takes back everything since [`ReadIndex::begin_undo`].
    fn roll_back(&mut self) {
        let Some(u) = self.undo.take() else {
            return;
        };
        for &(node, acc) in &u.acc {
            self.acc[node as usize] = acc;
        }
        for &node in &u.called {
            self.inlined[node as usize] = true;
        }
        for &(parent, last) in u.links.iter().rev() {
            let p = parent as usize;
            self.last[p] = last;
            match last {
                NONE => self.first[p] = NONE,
                l => self.next[l as usize] = NONE,
            }
            self.nkids[p] -= 1;
        }
        let keep = u.first_new as usize;
        self.wide.retain(|_, child| *child < u.first_new);
        self.sym.truncate(keep);
        self.inlined.truncate(keep);
        self.first.truncate(keep);
        self.last.truncate(keep);
        self.next.truncate(keep);
        self.nkids.truncate(keep);
        self.acc.truncate(keep);
        self.saved_in.truncate(keep);
    }

    fn link(&mut self, parent: NodeId, child: NodeId) {
        let (p, c) = (parent as usize, child as usize);
        if let Some(u) = self.undo.as_mut() {
            if parent < u.first_new {
                u.links.push((parent, self.last[p]));
            }
        }
        match self.last[p] {
            NONE => self.first[p] = child,
            l => self.next[l as usize] = child,
        }
        self.last[p] = child;
        self.nkids[p] += 1;
        if self.nkids[p] == Self::NARROW + 1 {
            let mut k = self.first[p];
            while k != NONE {
                self.wide.insert((parent, self.sym[k as usize]), k);
                k = self.next[k as usize];
            }
        } else if self.nkids[p] > Self::NARROW + 1 {
            self.wide.insert((parent, self.sym[c]), child);
        }
    }

    /// The child of `parent` for `sym`, created if new; `inlined` when
    /// this frame is code inlined into the parent's.
    fn child(&mut self, parent: NodeId, sym: SymId, inlined: bool) -> NodeId {
        let found = if self.nkids[parent as usize] > Self::NARROW {
            self.wide.get(&(parent, sym)).copied()
        } else {
            let mut k = self.first[parent as usize];
            while k != NONE && self.sym[k as usize] != sym {
                k = self.next[k as usize];
            }
            (k != NONE).then_some(k)
        };
        if let Some(c) = found {
            // (`any_inlined`: without --inline, no look at the flags.)
            if !inlined && self.any_inlined && self.inlined[c as usize] {
                self.inlined[c as usize] = false;
                if let Some(u) = self.undo.as_mut().filter(|u| c < u.first_new) {
                    u.called.push(c);
                }
            }
            return c;
        }
        let id = self.push(sym, inlined);
        self.link(parent, id);
        id
    }

    fn children(&self, node: NodeId) -> Vec<NodeId> {
        let mut out = Vec::with_capacity(self.nkids[node as usize] as usize);
        let mut k = self.first[node as usize];
        while k != NONE {
            out.push(k);
            k = self.next[k as usize];
        }
        out
    }
}

/// Error while reading a dump into a profile.
#[derive(Debug)]
pub enum LoadError {
    Read(ReadError),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Read(e) => e.fmt(f),
        }
    }
}

impl From<ReadError> for LoadError {
    fn from(e: ReadError) -> Self {
        LoadError::Read(e)
    }
}

impl Profile {
    pub fn new(key: Option<String>) -> Self {
        let mut symbols = Symbols::default();
        let unknown = symbols.file_id("<unknown>");
        let spont = symbols.intern("<spontaneous>", unknown);
        Profile {
            symbols,
            nodes: vec![Node {
                sym: spont,
                ..Node::default()
            }],
            key,
            counters_seen: Vec::new(),
            tick_period: 0.01,
            snapshots: Vec::new(),
            reading: None,
        }
    }

    /// IgProf's `getChildrenBySymbol`: the child of `parent` with symbol `sym`.
    pub fn child_by_symbol(&self, parent: NodeId, sym: SymId) -> Option<NodeId> {
        self.nodes[parent as usize]
            .children
            .iter()
            .copied()
            .find(|&c| self.nodes[c as usize].symbol() == sym)
    }

    /// Starts (or resumes) reading: the tree moves into a [`ReadIndex`].
    fn start_reading(&mut self) -> &mut ReadIndex {
        if self.reading.is_none() {
            let mut ri = ReadIndex::default();
            for n in &self.nodes {
                ri.push(n.sym, n.inlined);
            }
            for id in 0..self.nodes.len() {
                for c in std::mem::take(&mut self.nodes[id].children) {
                    ri.link(id as NodeId, c);
                }
            }
            self.reading = Some(ri);
        }
        self.reading.get_or_insert_with(ReadIndex::default)
    }

    /// Ends reading: nodes, counts and children move into [`Profile::nodes`]
    /// (filters restructure the tree afterwards).
    pub fn finish_reading(&mut self) {
        let Some(ri) = self.reading.take() else {
            return;
        };
        for id in self.nodes.len()..ri.sym.len() {
            self.nodes.push(Node {
                sym: ri.sym[id],
                ..Node::default()
            });
        }
        for (id, node) in self.nodes.iter_mut().enumerate() {
            node.inlined = ri.inlined[id];
            node.counter.cnt += ri.acc[id][0];
            node.counter.freq += ri.acc[id][1];
            node.children = ri.children(id as NodeId);
        }
    }

    /// Reads one dump into the tree. `negate` reads it as a baseline
    /// (values subtracted). Parsing runs on a second thread, one batch of
    /// lines ahead of the tree building here.
    pub fn read<R: BufRead + Send>(
        &mut self,
        input: R,
        name: &str,
        resolver: &mut Resolver,
        opts: &ReadOptions,
        negate: bool,
    ) -> Result<(), LoadError> {
        self.start_reading();
        let reader = Reader::new(input, name)?;
        let header = reader.header();
        self.tick_period = header.tick_period as f32;
        if let Some(why) = igprof_format::notes::snapshot(&header.program).filter(|_| !negate) {
            self.snapshots.push((name.to_string(), why.to_string()));
        }
        use igprof_format::notes::{time, DUMPED, STARTED};
        let dir = std::path::Path::new(name)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        resolver.begin_dump(crate::jit::Process {
            pid: header.pid,
            started: time(&header.program, STARTED),
            dumped: time(&header.program, DUMPED),
            dir: dir.to_path_buf(),
        });
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(4);
            scope.spawn(move || produce(reader, tx));
            let mut state = DumpState::default();
            for batch in rx {
                self.consume(batch?, &mut state, resolver, opts, negate);
            }
            Ok(())
        })
    }

    /// [`Profile::read`], all or nothing: a dump that fails part-way (a
    /// truncated or corrupt file) leaves the profile as it was before.
    pub fn read_whole<R: BufRead + Send>(
        &mut self,
        input: R,
        name: &str,
        resolver: &mut Resolver,
        opts: &ReadOptions,
        negate: bool,
    ) -> Result<(), LoadError> {
        let before = (
            self.symbols.names.len(),
            self.symbols.file_names.len(),
            self.key.clone(),
            self.counters_seen.len(),
            self.tick_period,
        );
        self.start_reading().begin_undo();
        let result = self.read(input, name, resolver, opts, negate);
        let ri = self.reading.get_or_insert_with(ReadIndex::default);
        if result.is_ok() {
            ri.undo = None;
            return result;
        }
        ri.roll_back();
        let (symbols, files, key, counters, tick_period) = before;
        self.symbols.truncate(symbols, files);
        self.key = key;
        self.counters_seen.truncate(counters);
        self.tick_period = tick_period;
        result
    }

    fn consume(
        &mut self,
        b: Batch,
        st: &mut DumpState,
        resolver: &mut Resolver,
        opts: &ReadOptions,
        negate: bool,
    ) {
        for (id, name) in b.counter_names {
            let id = id as usize;
            if st.counter_names.len() <= id {
                st.counter_names.resize(id + 1, None);
            }
            st.counter_names[id] = Some(name);
        }
        let mut defs = b.defs.into_iter();
        let w = &b.words;
        let mut i = 0;
        while i + 5 <= w.len() {
            let (depth, function, flags, symbol_offset, n) = (
                w[i] as usize,
                w[i + 1] as usize,
                w[i + 2],
                w[i + 3],
                w[i + 4] as usize,
            );
            i += 5;
            let inline = resolver.inline();
            if flags & DEFINES != 0 {
                if let Some((path, offset, name)) = defs.next() {
                    let f = FunctionSyms {
                        def: Some((path, offset.wrapping_sub(symbol_offset), name)),
                        at: FxHashMap::default(),
                    };
                    if inline {
                        if st.fn_defs.len() <= function {
                            st.fn_defs.resize_with(function + 1, Default::default);
                        }
                        st.fn_defs[function] = f;
                    } else {
                        // IgProf names a function by the address that
                        // defined it.
                        let frames = self.resolve_frames(&f, resolver, offset, false);
                        let sym = frames.first().copied().unwrap_or(0);
                        if st.fn_syms.len() <= function {
                            st.fn_syms.resize(function + 1, SymId::MAX);
                        }
                        st.fn_syms[function] = sym;
                    }
                }
            }
            // With --inline, names depend on the address, not only on the
            // function (one function holds code inlined from others), and a
            // frame that has frames below it is a return address, looked
            // up as such (see Resolver::frames).
            let sym;
            let chain = if inline {
                let return_address = flags & HAS_CHILDREN != 0;
                match st.fn_defs.get_mut(function) {
                    Some(f) => self.chain_at(f, resolver, symbol_offset, return_address),
                    None => &[0],
                }
            } else {
                // The reader guarantees definition before use.
                sym = st.fn_syms.get(function).copied().unwrap_or(0);
                std::slice::from_ref(&sym)
            };
            st.stack.truncate(depth.saturating_sub(1));
            let mut id = st.stack.last().copied().unwrap_or(0);
            let ri = self.reading.get_or_insert_with(ReadIndex::default);
            for (k, &sym) in chain.iter().enumerate() {
                id = ri.child(id, sym, k > 0);
            }
            st.stack.push(id);
            for _ in 0..n {
                let Some(v) = w.get(i..i + 4) else { break };
                i += 4;
                let c = v[0] as usize;
                if st.is_key.len() <= c {
                    st.is_key.resize(c + 1, None);
                }
                let k = match st.is_key[c] {
                    Some(k) => k,
                    None => {
                        let cname = st
                            .counter_names
                            .get(c)
                            .cloned()
                            .flatten()
                            .unwrap_or_default();
                        if !self.counters_seen.contains(&cname) {
                            self.counters_seen.push(cname.clone());
                        }
                        if self.key.is_none() {
                            self.key = Some(cname.clone());
                        }
                        let k = self.key.as_deref() == Some(cname.as_str());
                        st.is_key[c] = Some(k);
                        k
                    }
                };
                if k {
                    let mut value = if opts.peak { v[3] } else { v[2] };
                    let mut freq = v[1];
                    opts.hit_filter(&mut value, &mut freq, negate);
                    self.reading
                        .get_or_insert_with(ReadIndex::default)
                        .add(id, value, freq);
                }
            }
        }
    }
}

/// Flags of a node in [`Batch::words`].
const DEFINES: i64 = 1;
/// The node has children (its address is a return address).
const HAS_CHILDREN: i64 = 2;

/// A function of a dump: its definition, and with `--inline` its
/// symbols once resolved.
#[derive(Default)]
struct FunctionSyms {
    /// (object path, offset of the symbol's start, recorded name).
    def: Option<(String, i64, String)>,
    /// With `--inline`: the symbols of the frames at an offset in the
    /// symbol, outermost first, as a sampled address (false) or a return
    /// address (true).
    at: FxHashMap<(i64, bool), Vec<SymId>>,
}

impl Profile {
    /// With `--inline`: the symbols of the frames at `symbol_offset` in
    /// function `f`, outermost first (resolved on first use).
    fn chain_at<'f>(
        &mut self,
        f: &'f mut FunctionSyms,
        resolver: &mut Resolver,
        symbol_offset: i64,
        return_address: bool,
    ) -> &'f [SymId] {
        let key = (symbol_offset, return_address);
        if !f.at.contains_key(&key) {
            let start = f.def.as_ref().map_or(0, |d| d.1);
            let chain = self.resolve_frames(
                f,
                resolver,
                start.wrapping_add(symbol_offset),
                return_address,
            );
            f.at.insert(key, chain);
        }
        f.at.get(&key).map_or(&[], Vec::as_slice)
    }

    /// The symbols of the frames at `offset` in `f`'s object.
    fn resolve_frames(
        &mut self,
        f: &FunctionSyms,
        resolver: &mut Resolver,
        offset: i64,
        return_address: bool,
    ) -> Vec<SymId> {
        // The reader guarantees definition before use.
        let Some((path, _, recorded)) = &f.def else {
            return vec![0];
        };
        let frames = resolver.frames(path, offset, recorded, return_address);
        let object = match frames.object {
            Some(o) => o,
            None => resolver.canonical_path(path),
        };
        let file = self.symbols.file_id(&object);
        frames
            .names
            .iter()
            .map(|n| self.symbols.intern(n, file))
            .collect()
    }
}

/// Per-dump tables while consuming batches.
#[derive(Default)]
struct DumpState {
    /// Dump function id -> its symbol (without `--inline`).
    fn_syms: Vec<SymId>,
    /// Dump function id -> its definition and symbols (with `--inline`).
    fn_defs: Vec<FunctionSyms>,
    /// Dump counter id -> is it the report counter.
    is_key: Vec<Option<bool>>,
    counter_names: Vec<Option<String>>,
    stack: Vec<NodeId>,
}

/// Parsed lines handed from the parsing thread to the tree builder.
#[derive(Default)]
struct Batch {
    /// Per node: depth, function id, flags ([`DEFINES`], [`HAS_CHILDREN`]),
    /// offset in the symbol, number of counters; then per counter: counter id, ticks, value, peak.
    words: Vec<i64>,
    /// (object path, offset, recorded name) of each defining node, in order.
    defs: Vec<(String, i64, String)>,
    /// Counter ids first used in this batch, with their names.
    counter_names: Vec<(u32, String)>,
}

/// The parsing thread: reads `reader` to the end in batches.
fn produce<R: BufRead>(
    mut reader: Reader<R>,
    tx: std::sync::mpsc::SyncSender<Result<Batch, ReadError>>,
) {
    const WORDS: usize = 1 << 16;
    let mut named: Vec<bool> = Vec::new();
    let mut new_counters: Vec<u32> = Vec::new();
    let mut batch = Batch::default();
    // The flags word and depth of the last node in `batch`: its children
    // are known when the next node is read.
    let mut last: Option<(usize, u32)> = None;
    loop {
        let (function, defines) = match reader.next_node() {
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
            Ok(None) => break,
            Ok(Some(n)) => {
                if let Some((flags, depth)) = last {
                    if n.depth > depth {
                        batch.words[flags] |= HAS_CHILDREN;
                    }
                }
                if batch.words.len() >= WORDS && tx.send(Ok(std::mem::take(&mut batch))).is_err() {
                    return;
                }
                last = Some((batch.words.len() + 2, n.depth));
                batch.words.extend([
                    n.depth as i64,
                    n.function as i64,
                    n.defines_function as i64,
                    n.symbol_offset,
                    n.counters.len() as i64,
                ]);
                for v in n.counters {
                    batch
                        .words
                        .extend([v.counter as i64, v.ticks, v.value, v.peak]);
                    if !named.get(v.counter as usize).copied().unwrap_or(false) {
                        new_counters.push(v.counter);
                    }
                }
                (n.function, n.defines_function)
            }
        };
        if defines {
            if let Some(d) = reader.function(function) {
                let path = reader.file(d.file).unwrap_or("").to_string();
                batch.defs.push((path, d.file_offset, d.name.clone()));
            }
        }
        for id in new_counters.drain(..) {
            if named.len() <= id as usize {
                named.resize(id as usize + 1, false);
            }
            if !named[id as usize] {
                named[id as usize] = true;
                batch
                    .counter_names
                    .push((id, reader.counter(id).unwrap_or("").to_string()));
            }
        }
    }
    let _ = tx.send(Ok(batch));
}
