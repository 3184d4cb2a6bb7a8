//! Views: output formats other than IgProf's reports. A view writes one
//! output format from the merged, filtered tree and the selected counter(s):
//! folded stacks (`--folded`), flame and icicle graphs (`--flame`,
//! `--icicle`), pprof (`--pprof`), callgrind (`--callgrind`) and a
//! self-contained page to explore them (`--html`).
//!
//! Every view reads [`CounterTree`]s taken from the run at the point where
//! the text report would be printed ([`Sink::take`], called from
//! [`crate::run`]), so `-r`, `--value`, `-mr`/`-ml`/`-ma`, `-b`, the hit
//! filters and the symbol options act on every view as on the text report.
//! Views showing several counters (pprof, callgrind) get one tree per
//! counter, each read and filtered as `-r COUNTER` would.
//!
//! Owns: the tree views read, the counters' units, running the requested
//! views and writing their files (`-` is standard output).
//! Must never: filter, merge or rename on its own (the report pipeline
//! does), or recurse per tree level (trees can be thousands deep).

pub mod callgrind;
pub mod flame;
pub mod folded;
pub mod html;
pub mod pprof;

use crate::profile::Profile;
use crate::text::Names;
use crate::{Config, Error};
use rustc_hash::FxHashMap;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// Index of a function in [`Functions`].
pub type FuncId = u32;

/// Function names (as reports show them: demangled with `-d`), each with
/// its object file; shared by the trees of every counter of a run, so that
/// the same function has the same id in all of them.
#[derive(Default)]
pub struct Functions {
    names: Vec<String>,
    objects: Vec<u32>,
    object_names: Vec<String>,
    by_name: FxHashMap<String, FuncId>,
    object_ids: FxHashMap<String, u32>,
}

impl Functions {
    /// The function called `name`, created in `object` if new.
    pub fn intern(&mut self, name: &str, object: &str) -> FuncId {
        if let Some(&f) = self.by_name.get(name) {
            return f;
        }
        let o = match self.object_ids.get(object) {
            Some(&o) => o,
            None => {
                let o = self.object_names.len() as u32;
                self.object_names.push(object.to_string());
                self.object_ids.insert(object.to_string(), o);
                o
            }
        };
        let f = self.names.len() as FuncId;
        self.names.push(name.to_string());
        self.objects.push(o);
        self.by_name.insert(name.to_string(), f);
        f
    }
    pub fn name(&self, f: FuncId) -> &str {
        &self.names[f as usize]
    }
    /// Index of the function's object in [`Functions::objects`].
    pub fn object_id(&self, f: FuncId) -> u32 {
        self.objects[f as usize]
    }
    pub fn object(&self, f: FuncId) -> &str {
        &self.object_names[self.objects[f as usize] as usize]
    }
    /// Every object file, in order of first use.
    pub fn objects(&self) -> &[String] {
        &self.object_names
    }
    pub fn len(&self) -> usize {
        self.names.len()
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// What a counter's values measure, for tooltips and sample types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// PERF_TICKS: a value is a number of ticks of `scale` seconds
    /// (CALL_TIME: of nanoseconds).
    Seconds,
    /// NRG_*: a value is a number of units of `scale` Joules.
    Joules,
    /// MEM_*.
    Bytes,
    /// FD_*.
    Descriptors,
    /// Anything else.
    Count,
}

impl Unit {
    /// The unit's name in tooltips and headers.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Seconds => "seconds",
            Unit::Joules => "Joules",
            Unit::Bytes => "bytes",
            Unit::Descriptors => "descriptors",
            Unit::Count => "counts",
        }
    }
}

/// One counter of the profile, as reports show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Counter {
    pub name: String,
    pub unit: Unit,
    /// Amount of `unit` in one unit of value: the profile's tick period for
    /// PERF_TICKS and NRG_* (the text report multiplies by it), 1e-9 for
    /// CALL_TIME (nanoseconds; the text report prints them as they are),
    /// else 1.
    pub scale: f64,
    /// A `*_MAX` counter: self and cumulative values are maxima, not sums.
    pub is_max: bool,
}

impl Counter {
    pub fn new(name: &str, tick_period: f32) -> Counter {
        let (unit, scale) = if name == "PERF_TICKS" {
            (Unit::Seconds, tick_period as f64)
        } else if name == "CALL_TIME" {
            // -finst: nanoseconds (the header's tick is not its unit).
            (Unit::Seconds, 1e-9)
        } else if name.starts_with("NRG_") {
            (Unit::Joules, tick_period as f64)
        } else if name.starts_with("MEM_") {
            (Unit::Bytes, 1.0)
        } else if name.starts_with("FD_") {
            (Unit::Descriptors, 1.0)
        } else {
            (Unit::Count, 1.0)
        };
        Counter {
            name: name.to_string(),
            unit,
            scale,
            is_max: name.ends_with("_MAX"),
        }
    }
}

/// A node of a [`Tree`].
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The function.
    pub func: FuncId,
    /// Its name in call-graph reports: `f'2` for a call of `f` nested in
    /// `f` (IgProf's recursion naming), else `func`.
    pub report: FuncId,
    /// Self value and calls of the counter, as the text report sums them.
    pub value: i64,
    pub calls: i64,
    /// Cumulative value and calls (the node and everything below it).
    pub cum_value: i64,
    pub cum_calls: i64,
    pub children: Vec<u32>,
    /// Code inlined into its parent (`--inline`): pprof puts the two in
    /// one location.
    pub inlined: bool,
}

/// A call tree in pre-order: node 0 is `<spontaneous>`, the root, and each
/// node comes before its children.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

impl Tree {
    /// The tree of a prepared profile (filters applied, cumulative counts
    /// and recursion names set), as reachable from its root.
    pub fn from_profile(p: &Profile, names: &dyn Names, functions: &mut Functions) -> Tree {
        let mut ids: FxHashMap<u32, FuncId> = FxHashMap::default();
        let mut func = |sym: u32| -> FuncId {
            *ids.entry(sym)
                .or_insert_with(|| functions.intern(names.name(sym), names.file(sym)))
        };
        let mut nodes: Vec<Node> = Vec::new();
        // (profile node, index of the parent in `nodes`)
        let mut stack: Vec<(u32, Option<u32>)> = vec![(0, None)];
        while let Some((id, parent)) = stack.pop() {
            let n = &p.nodes[id as usize];
            let me = nodes.len() as u32;
            nodes.push(Node {
                func: func(n.sym),
                report: func(n.symbol()),
                value: n.counter.cnt,
                calls: n.counter.freq,
                cum_value: n.counter.ccnt,
                cum_calls: n.counter.cfreq,
                children: Vec::with_capacity(n.children.len()),
                inlined: n.inlined,
            });
            if let Some(parent) = parent {
                nodes[parent as usize].children.push(me);
            }
            for &c in n.children.iter().rev() {
                stack.push((c, Some(me)));
            }
        }
        Tree { nodes }
    }

    /// Calls `f` for every node in pre-order with its call stack, root
    /// first: `<spontaneous>` is left out of the stacks below it, and is the
    /// stack of the root itself.
    pub fn for_each_stack(&self, mut f: impl FnMut(&[FuncId], &Node)) {
        self.for_each_frames(|path, _, n| f(path, n));
    }

    /// [`Tree::for_each_stack`], also giving whether each function of the
    /// stack is inlined into the one before it ([`Node::inlined`]).
    pub fn for_each_frames(&self, mut f: impl FnMut(&[FuncId], &[bool], &Node)) {
        let Some(root) = self.nodes.first() else {
            return;
        };
        f(&[root.func], &[false], root);
        let mut path: Vec<FuncId> = Vec::new();
        let mut inlined: Vec<bool> = Vec::new();
        // (node, depth below the root)
        let mut stack: Vec<(u32, usize)> = root.children.iter().rev().map(|&c| (c, 1)).collect();
        while let Some((id, depth)) = stack.pop() {
            let n = &self.nodes[id as usize];
            path.truncate(depth - 1);
            inlined.truncate(depth - 1);
            path.push(n.func);
            // The first frame below the root is inlined into nothing.
            inlined.push(n.inlined && depth > 1);
            f(&path, &inlined, n);
            for &c in n.children.iter().rev() {
                stack.push((c, depth + 1));
            }
        }
    }
}

/// One counter's tree, as the text report of `-r COUNTER` sees it.
pub struct CounterTree {
    pub counter: Counter,
    /// With `-b`, the differences (the profiles minus the baseline), as the
    /// text report shows them.
    pub tree: Tree,
    /// With `-b`, the baseline's own tree, filtered alike.
    pub baseline: Option<Tree>,
    /// Every counter in the profiles, in order of appearance.
    pub counters_seen: Vec<String>,
}

/// Which counters a view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counters {
    /// The report's counter (`-r`, else the profile's first).
    Selected,
    /// The report's counter first, then, without `-r`, every other counter
    /// of the profile except `*_MAX` ones (their values do not add up).
    All,
}

/// What a view is given.
pub struct Input<'a> {
    /// The selected counter first; more with [`Counters::All`].
    pub counters: &'a [CounterTree],
    pub functions: &'a Functions,
    /// The profiles the trees come from.
    pub files: &'a [String],
    /// Names end with ` (file:line)` (`--lines`).
    pub lines: bool,
    /// Object files may be read (not `--no-symbols`).
    pub read_objects: bool,
    /// The run's timeline, if any (the page charts it).
    pub timeline: Option<&'a crate::timeline::Series>,
}

/// Why a view could not be written.
#[derive(Debug)]
pub enum ViewError {
    Io(io::Error),
    /// The view cannot show what was asked (e.g. negative costs).
    Unsupported {
        view: &'static str,
        reason: String,
    },
}

impl std::fmt::Display for ViewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ViewError::Io(e) => write!(f, "{e}"),
            ViewError::Unsupported { view, reason } => write!(f, "{view}: {reason}"),
        }
    }
}

impl From<io::Error> for ViewError {
    fn from(e: io::Error) -> Self {
        ViewError::Io(e)
    }
}

/// A view writes one output format from the merged, filtered tree and the
/// selected counter(s).
pub trait View {
    /// The option that asks for it, for messages.
    fn name(&self) -> &'static str;
    /// Which counters it shows.
    fn counters(&self) -> Counters {
        Counters::Selected
    }
    /// Writes the view of `input` to `out`.
    fn write(&self, input: &Input<'_>, out: &mut dyn Write) -> Result<(), ViewError>;
}

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Folded,
    Flame { icicle: bool },
    Pprof,
    Callgrind,
    Html,
}

impl Format {
    pub fn view(self) -> Box<dyn View> {
        match self {
            Format::Folded => Box::new(folded::Folded),
            Format::Flame { icicle } => Box::new(flame::Flame { icicle }),
            Format::Pprof => Box::new(pprof::Pprof),
            Format::Callgrind => Box::new(callgrind::Callgrind),
            Format::Html => Box::new(html::Html),
        }
    }
}

/// One requested output: a format and the file it goes to (`-`: stdout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub format: Format,
    pub path: String,
}

/// The views of a run: what the command line asked for, and where the run
/// hands its trees (set by [`run`] only).
#[derive(Debug, Clone, Default)]
pub struct Views {
    pub requests: Vec<Request>,
    pub(crate) sink: Option<Sink>,
    /// The run's timeline, for the page's chart (when the inputs are dumps
    /// of one process with a timeline note or several dumps).
    pub timeline: Option<crate::timeline::Series>,
}

#[derive(Default)]
struct Collected {
    functions: Functions,
    trees: Vec<CounterTree>,
}

/// Where [`crate::run`] leaves the tree of its counter when views are
/// written instead of a report.
#[derive(Clone, Default)]
pub struct Sink(Arc<Mutex<Collected>>);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

impl Sink {
    /// Takes the tree of the run's counter (and of the baseline, with `-b`).
    pub(crate) fn take(
        &self,
        key: &str,
        prof: &Profile,
        baseline: Option<&Profile>,
        names: &dyn Names,
        demangle: bool,
    ) -> Result<(), Error> {
        let mut c = self
            .0
            .lock()
            .map_err(|_| Error::Output("views: internal error".into()))?;
        let c = &mut *c;
        let tree = Tree::from_profile(prof, names, &mut c.functions);
        let baseline = baseline.map(|bp| {
            let bnames = crate::DisplayNames::new(bp, demangle);
            let mut t = Tree::from_profile(bp, &bnames, &mut c.functions);
            // The baseline is read negated (to be subtracted).
            for n in &mut t.nodes {
                n.value = -n.value;
                n.calls = -n.calls;
                n.cum_value = -n.cum_value;
                n.cum_calls = -n.cum_calls;
            }
            t
        });
        c.trees.push(CounterTree {
            counter: Counter::new(key, prof.tick_period),
            tree,
            baseline,
            counters_seen: prof.counters_seen.clone(),
        });
        Ok(())
    }
}

/// Writes every requested view: reads the profiles once per counter shown
/// (through [`crate::run`], so every option applies), then each view.
pub fn run(
    cfg: &Config,
    out: &mut dyn Write,
    warn: &mut dyn FnMut(crate::Warning),
) -> Result<(), Error> {
    let sink = Sink::default();
    let mut c = cfg.clone();
    c.views.sink = Some(sink.clone());
    // Each counter's reading says the same warnings: say each once.
    let mut said: Vec<crate::Warning> = Vec::new();
    let mut warn_once = |w: crate::Warning| {
        if !said.contains(&w) {
            said.push(w.clone());
            warn(w);
        }
    };
    crate::run(&c, out, &mut warn_once)?;
    let views: Vec<(Box<dyn View>, &Request)> = cfg
        .views
        .requests
        .iter()
        .map(|r| (r.format.view(), r))
        .collect();
    if cfg.key.is_none() && views.iter().any(|(v, _)| v.counters() == Counters::All) {
        let (first, seen) = {
            let g = sink
                .0
                .lock()
                .map_err(|_| Error::Output("views: internal error".into()))?;
            (
                g.trees[0].counter.name.clone(),
                g.trees[0].counters_seen.clone(),
            )
        };
        for k in seen
            .into_iter()
            .filter(|k| *k != first && !k.ends_with("_MAX"))
        {
            crate::verbose(cfg, &format!("reading counter {k} for the views"));
            c.key = Some(k);
            match crate::run(&c, out, &mut warn_once) {
                Ok(()) | Err(Error::NothingToPrint) => {}
                Err(e) => return Err(e),
            }
        }
    }
    let collected = std::mem::take(
        &mut *sink
            .0
            .lock()
            .map_err(|_| Error::Output("views: internal error".into()))?,
    );
    for (view, req) in views {
        let counters = match view.counters() {
            Counters::Selected => &collected.trees[..1],
            Counters::All => &collected.trees[..],
        };
        let input = Input {
            counters,
            functions: &collected.functions,
            files: &cfg.files,
            lines: cfg.symbols.lines,
            read_objects: cfg.symbols.enabled,
            timeline: cfg.views.timeline.as_ref(),
        };
        crate::verbose(cfg, &format!("writing {} to {}", view.name(), req.path));
        let failed = |e: ViewError| match e {
            ViewError::Io(e) if e.kind() == io::ErrorKind::BrokenPipe => Error::BrokenPipe,
            ViewError::Io(e) => {
                Error::Output(format!("{}: cannot write {}: {e}", req.path, view.name()))
            }
            e => Error::Output(e.to_string()),
        };
        if req.path == "-" {
            view.write(&input, out).map_err(failed)?;
        } else {
            // Through a temporary renamed over the name (or in place for
            // a device or FIFO): a link planted at the name is replaced,
            // never written through (see `safefs`).
            let dest = std::path::Path::new(&req.path);
            let mut out = safefs::Output::create(dest).map_err(|e| {
                Error::Output(format!(
                    "{}: cannot create ({}): {e}",
                    req.path,
                    view.name()
                ))
            })?;
            let written = {
                let mut w = io::BufWriter::with_capacity(1 << 16, out.file_mut());
                view.write(&input, &mut w)
                    .and_then(|()| w.flush().map_err(ViewError::Io))
            };
            match written {
                Ok(()) => out.finish(dest).map_err(|e| failed(ViewError::Io(e)))?,
                Err(e) => {
                    out.discard();
                    return Err(failed(e));
                }
            }
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` as the views are written: through a
/// temporary renamed over the name (or in place for a device or FIFO), so
/// that a link planted at the name is replaced, never written through.
pub fn write_file(path: &str, bytes: &[u8]) -> io::Result<()> {
    let dest = std::path::Path::new(path);
    let mut out = safefs::Output::create(dest)?;
    match out.file_mut().write_all(bytes) {
        Ok(()) => out.finish(dest),
        Err(e) => {
            out.discard();
            Err(e)
        }
    }
}

/// `name` with `;` (the folded-stack separator) and line breaks replaced.
pub fn folded_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains([';', '\n', '\r']) {
        name.replace([';', '\n', '\r'], "_").into()
    } else {
        name.into()
    }
}
