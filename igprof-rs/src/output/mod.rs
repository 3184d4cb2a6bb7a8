//! Writing profiles: merging every thread's tree, naming addresses, and
//! writing IgProf's format (format::write) into a file, gzipped whole by
//! libdeflate (`deflate`) or, past 32 MiB of text, streamed through
//! flate2's zlib-rs.
//!
//! Owns the dump's common path ([`dump_to`]; what triggers one is
//! `process/`'s), the output file name (`path`), and how records name
//! addresses: each distinct address
//! of the profile is named once per dump by `names` (the names `dladdr`
//! gives, from a per-object index; dumps never run in signal context).
//! Unknown names are written as IgProf does, `@?0x<address>`, and
//! igprof-analyse resolves them from the object and offset. With
//! `IGPROF_NAMES_CHECK=1` in the environment, every dump also writes
//! `<file>.dladdr`, the same profile named by `dladdr` itself, for
//! `bench/names-compare`. Dumps run with profiling paused on the dumping thread; other
//! threads keep sampling into their own trees, which are safe to read
//! concurrently.
//!
//! Must never: run from a signal handler, fork a compressor, or write a
//! partial file under the final name, or write through a link planted at
//! the name (see `create_output`).

mod deflate;
pub mod names;
pub mod path;

use std::collections::HashMap as StdHashMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use igprof_format::write::{CounterRef, FileRef, FuncRef, IoSink, Sink, WriteError, Writer};

use crate::base::counters::{self, Merge};
use crate::base::thread;
use crate::base::tree::{Node, TRUNCATED};

/// The dump's maps are keyed by addresses and node ids, which need no
/// protection against chosen collisions: a multiply-rotate hash (FxHash's)
/// instead of SipHash, a third of the merge's time on a large profile.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl core::hash::Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type HashMap<K, V> = StdHashMap<K, V, core::hash::BuildHasherDefault<FastHasher>>;

/// Why a dump failed.
#[derive(Debug)]
pub enum DumpError {
    NotProfiling,
    Busy,
    Create {
        path: String,
        errno: i32,
    },
    /// The program's address-space limit leaves no room for the dump.
    NoMemory {
        needed: usize,
        limit: u64,
    },
    /// A file that must be written in place was not safe to write.
    Refused {
        path: String,
        why: safefs::Refusal,
    },
    Write {
        path: String,
        err: WriteError,
    },
    Rename {
        path: String,
        errno: i32,
    },
}

impl core::fmt::Display for DumpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DumpError::NotProfiling => write!(f, "profiling is not active in this process"),
            DumpError::Busy => write!(f, "another dump is being written"),
            DumpError::Create { path, errno } => {
                write!(f, "cannot create {path}: {}", OsError(*errno))
            }
            DumpError::NoMemory { needed, limit } => write!(
                f,
                "the program's address-space limit (RLIMIT_AS, {} MiB) leaves no room for the dump (about {} MiB)",
                limit >> 20,
                needed >> 20
            ),
            DumpError::Refused { path, why } => write!(f, "not writing {path}: {why}"),
            DumpError::Write {
                path,
                err: WriteError::Io { errno },
            } => write!(f, "writing {path}: {}", OsError(*errno)),
            DumpError::Write { path, err } => write!(f, "writing {path}: {err}"),
            DumpError::Rename { path, errno } => write!(
                f,
                "cannot rename the finished dump to {path}: {}",
                OsError(*errno)
            ),
        }
    }
}

/// A system error's text, with the limit of the program's that caused it
/// where that is the usual reason.
struct OsError(i32);

impl core::fmt::Display for OsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))?;
        match self.0 {
            libc::EFBIG => write!(f, " (the program's file size limit, RLIMIT_FSIZE)"),
            libc::EMFILE => write!(
                f,
                " (the program holds every descriptor its RLIMIT_NOFILE allows)"
            ),
            _ => Ok(()),
        }
    }
}

static DUMPING: AtomicBool = AtomicBool::new(false);

/// In a fork child: no dump is in progress in this process.
pub fn reset_after_fork() {
    UNLOADED.lock.store(false, Ordering::Release);
    DUMPING.store(false, Ordering::Release);
}

/// What a dump contained.
#[derive(Default, Debug, Clone, Copy)]
pub struct DumpStats {
    pub nodes: usize,
    pub samples: u64,
    pub dropped: u64,
    pub truncated: u64,
    pub handler_ns: u64,
    /// Thread states (and so call trees) dumped: at most the peak number
    /// of threads alive at once, since new threads adopt ended ones' states.
    pub states: usize,
    /// Distinct code addresses named, and how many of them from `.symtab`.
    pub addresses: usize,
    pub from_symtab: usize,
    /// CPU time spent naming them, and on the whole dump (merge, name,
    /// write), on the dumping thread.
    pub naming_ns: u64,
    pub dump_ns: u64,
    /// CPU time merging the threads' trees (before naming).
    pub merge_ns: u64,
    /// With `IGPROF_NAMES_CHECK`: CPU time of the second profile, named by
    /// `dladdr` (naming and writing).
    pub dladdr_naming_ns: Option<u64>,
    /// The threads' descriptor caches (samples and hooks alike).
    pub descriptors: crate::unwind::CacheStats,
}

/// `Merged::value_at` of a node whose counters are all zero.
const NO_VALUES: u32 = u32::MAX;

struct MNode {
    addr: usize,
    first_child: u32,
    /// The last of the children (appended to in O(1)).
    last_child: u32,
    next_sibling: u32,
}

/// All threads' trees merged by path of addresses.
struct Merged {
    nodes: Vec<MNode>,
    /// Per node: where its nslots (ticks, value, peak) start in `values`,
    /// or [`NO_VALUES`] while they are all zero (most nodes are callers
    /// that carry no counts of their own: a quarter of a compiler's -mp
    /// profile has any).
    value_at: Vec<u32>,
    values: Vec<(u64, u64, u64)>,
    index: HashMap<(u32, usize), u32>,
    nslots: usize,
    /// Thread-tree nodes that hold live resources (for LK records) ->
    /// the merged node each went into (`u32::MAX` until merged). Only
    /// those: a table of every node's origin cost a compiler's dump more
    /// than its merge (the vector's growth, its sort, its page faults).
    origin: HashMap<usize, u32>,
    /// (merged node, counter slot) -> leaked (address, size).
    leaks: HashMap<(u32, usize), Vec<(u64, u64)>>,
    /// Names of synthetic top-level functions (address SYNTHETIC_BASE + i).
    synthetic: Vec<&'static str>,
    /// The modules' readers of counters stored in another form.
    stored_forms: Vec<crate::modules::DumpValueFn>,
}

impl Merged {
    fn new(nslots: usize) -> Self {
        let mut m = Merged {
            nodes: Vec::new(),
            value_at: Vec::new(),
            values: Vec::new(),
            index: HashMap::default(),
            nslots,
            origin: HashMap::default(),
            leaks: HashMap::default(),
            synthetic: Vec::new(),
            stored_forms: Vec::new(),
        };
        m.push(0);
        m
    }

    fn push(&mut self, addr: usize) -> u32 {
        let id = self.nodes.len() as u32;
        self.nodes.push(MNode {
            addr,
            first_child: u32::MAX,
            last_child: u32::MAX,
            next_sibling: u32::MAX,
        });
        self.value_at.push(NO_VALUES);
        id
    }

    /// The counters of node `id`, None while all are zero.
    fn values_of(&self, id: u32) -> Option<&[(u64, u64, u64)]> {
        let at = self.value_at[id as usize];
        (at != NO_VALUES).then(|| &self.values[at as usize..at as usize + self.nslots])
    }

    /// The counters of node `id`, made (zero) if it had none.
    fn values_of_mut(&mut self, id: u32) -> &mut [(u64, u64, u64)] {
        let mut at = self.value_at[id as usize];
        if at == NO_VALUES {
            at = self.values.len() as u32;
            self.value_at[id as usize] = at;
            self.values
                .extend(std::iter::repeat_n((0, 0, 0), self.nslots));
        }
        &mut self.values[at as usize..at as usize + self.nslots]
    }

    fn child(&mut self, parent: u32, addr: usize) -> u32 {
        match self.index.get(&(parent, addr)) {
            Some(&c) => c,
            // Appended at the end of the sibling list: first-seen order.
            None => self.fresh_child(parent, addr, true),
        }
    }

    /// Room for `more` nodes, so that a large merge does not regrow and
    /// rehash its tables as it goes.
    fn reserve(&mut self, more: usize) {
        self.nodes.reserve(more);
        self.value_at.reserve(more);
    }

    /// A new child `addr` of `parent`, known not to be one already (its
    /// parent had no children before this merge, or the index said so).
    /// `indexed`: entered in the index, for later merges to find.
    fn fresh_child(&mut self, parent: u32, addr: usize, indexed: bool) -> u32 {
        let c = self.push(addr);
        if indexed {
            self.index.insert((parent, addr), c);
        }
        let p = &mut self.nodes[parent as usize];
        let last = core::mem::replace(&mut p.last_child, c);
        if last == u32::MAX {
            p.first_child = c;
        } else {
            self.nodes[last as usize].next_sibling = c;
        }
        c
    }

    fn add(&mut self, into: u32, from: &Node, merges: &[Merge]) {
        for (s, merge) in merges.iter().enumerate() {
            // A module may store a counter in another form than it is written.
            let stored = self.stored_forms.iter().find_map(|f| f(from, s));
            let (t, v, p) = stored.unwrap_or_else(|| from.counter(s).get());
            if (t, v, p) == (0, 0, 0) {
                // Adds nothing under any merge rule.
                continue;
            }
            let cur = &mut self.values_of_mut(into)[s];
            match merge {
                Merge::Sum => *cur = (cur.0 + t, cur.1 + v, cur.2 + p),
                Merge::Max => *cur = (cur.0 + t, cur.1.max(v), cur.2.max(p)),
                Merge::Live => *cur = (cur.0.wrapping_add(t), cur.1.wrapping_add(v), cur.2.max(p)),
            }
        }
    }

    /// Adds `ticks`/`value` (peak = value) to counter `slot` of the synthetic
    /// top-level function `name`.
    fn add_synthetic(&mut self, name: &'static str, slot: usize, ticks: u64, value: u64) {
        let i = match self.synthetic.iter().position(|&n| n == name) {
            Some(i) => i,
            None => {
                self.synthetic.push(name);
                self.synthetic.len() - 1
            }
        };
        let node = self.child(0, SYNTHETIC_BASE + i);
        let cur = &mut self.values_of_mut(node)[slot];
        *cur = (cur.0 + ticks, cur.1 + value, cur.2 + value);
    }

    /// The distinct code addresses of the profile (not the synthetic
    /// functions' or the truncation marker), sorted.
    fn code_addresses(&self) -> Vec<usize> {
        let synthetic = SYNTHETIC_BASE..SYNTHETIC_BASE + self.synthetic.len();
        let mut v: Vec<usize> = self.nodes[1..]
            .iter()
            .map(|n| n.addr)
            .filter(|a| *a != TRUNCATED && !synthetic.contains(a))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Merges the subtree under `from` (a tree node) into merged node `into`.
    /// `last`: no tree is merged after this one, so the nodes it adds need
    /// no index entries (each (parent, address) of one tree comes once).
    fn merge_tree(&mut self, into: u32, from: &Node, last: bool) {
        let merges: Vec<Merge> = (0..self.nslots)
            .map(|s| counters::def_of_slot(s).merge)
            .collect();
        // Nodes made by this merge: their children are all new too.
        let made = self.nodes.len() as u32;
        let mut stack: Vec<(u32, &Node)> = vec![(into, from)];
        while let Some((m, n)) = stack.pop() {
            self.add(m, n, &merges);
            if !self.origin.is_empty() {
                if let Some(o) = self.origin.get_mut(&(n as *const Node as usize)) {
                    *o = m;
                }
            }
            let fresh = m >= made && self.nodes[m as usize].first_child == u32::MAX;
            for c in n.children() {
                let known = if fresh {
                    None
                } else {
                    self.index.get(&(m, c.addr)).copied()
                };
                let mc = known.unwrap_or_else(|| self.fresh_child(m, c.addr, !last));
                stack.push((mc, c));
            }
        }
    }

    /// The merged node of thread-tree node `node`, if it was one of the
    /// nodes asked for in `origin` and merged.
    fn origin_of(&self, node: usize) -> Option<u32> {
        self.origin.get(&node).copied().filter(|&m| m != u32::MAX)
    }
}

/// Names of code addresses, with IgProf's function/file identities.
struct Symbols {
    files: HashMap<usize, (u32, Vec<u8>)>,
    funcs: HashMap<(usize, usize), u32>,
    exe: Vec<u8>,
}

struct Resolved {
    file_key: usize,
    file_path: Vec<u8>,
    /// Symbol start (or the address itself when unknown).
    sym_addr: usize,
    name: Vec<u8>,
    object_offset: u64,
}

/// Objects seen before a dlclose: (start, end, load base, path) of each
/// loaded segment, so that addresses in an unloaded library still get
/// their object and offset (names are then resolved by igprof-analyse).
/// (segment start, segment end, load base, object path).
type Segment = (usize, usize, usize, Vec<u8>);

struct Unloaded {
    lock: AtomicBool,
    list: std::cell::UnsafeCell<Vec<Segment>>,
}
// SAFETY: `list` is only touched with `lock` held.
unsafe impl Sync for Unloaded {}

static UNLOADED: Unloaded = Unloaded {
    lock: AtomicBool::new(false),
    list: std::cell::UnsafeCell::new(Vec::new()),
};

fn with_unloaded<R>(f: impl FnOnce(&mut Vec<Segment>) -> R) -> R {
    while UNLOADED.lock.swap(true, Ordering::Acquire) {
        std::hint::spin_loop();
    }
    // SAFETY: lock held.
    let r = f(unsafe { &mut *UNLOADED.list.get() });
    UNLOADED.lock.store(false, Ordering::Release);
    r
}

/// Before a dlclose (not signal context): remember every loaded object's
/// segments so that samples in a library unloaded later keep their object.
pub fn remember_objects() {
    extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> i32 {
        // SAFETY: dl_iterate_phdr passes valid info; data is our Vec.
        unsafe {
            let v = &mut *(data as *mut Vec<Segment>);
            let i = &*info;
            if i.dlpi_name.is_null() || *i.dlpi_name == 0 {
                return 0;
            }
            let name = std::ffi::CStr::from_ptr(i.dlpi_name).to_bytes();
            for k in 0..i.dlpi_phnum as usize {
                let ph = &*i.dlpi_phdr.add(k);
                if ph.p_type == libc::PT_LOAD {
                    let start = i.dlpi_addr as usize + ph.p_vaddr as usize;
                    v.push((
                        start,
                        start + ph.p_memsz as usize,
                        i.dlpi_addr as usize,
                        name.to_vec(),
                    ));
                }
            }
        }
        0
    }
    let mut now: Vec<Segment> = Vec::new();
    // SAFETY: cb matches the callback signature; `now` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut now as *mut _ as *mut libc::c_void) };
    with_unloaded(|list| {
        for e in now {
            if !list.contains(&e) {
                list.push(e);
            }
        }
    });
}

fn resolve_unloaded(addr: usize) -> Option<Resolved> {
    with_unloaded(|list| {
        // Latest first: an address range may have been reused by a later load.
        list.iter()
            .rev()
            .find(|e| e.0 <= addr && addr < e.1)
            .map(|e| Resolved {
                file_key: e.2,
                file_path: e.3.clone(),
                sym_addr: addr,
                name: format!("@?0x{addr:x}").into_bytes(),
                object_offset: (addr - e.2) as u64,
            })
    })
}

/// Addresses of synthetic top-level functions (below any code address).
const SYNTHETIC_BASE: usize = 0x100;

/// How a dump names code addresses.
enum Naming {
    /// Names found for every address of the profile beforehand.
    Index(crate::output::names::Names),
    /// `dladdr` per address (the comparison dump of `IGPROF_NAMES_CHECK`).
    Dladdr,
}

impl Naming {
    /// How many distinct addresses it names (0 when it does not know).
    fn addresses(&self) -> usize {
        match self {
            Naming::Index(names) => names.len(),
            Naming::Dladdr => 0,
        }
    }
}

fn resolve(addr: usize, exe: &[u8], synthetic: &[&'static str], naming: &Naming) -> Resolved {
    if (SYNTHETIC_BASE..SYNTHETIC_BASE + synthetic.len()).contains(&addr) {
        let name = synthetic[addr - SYNTHETIC_BASE].as_bytes();
        return Resolved {
            file_key: addr,
            file_path: name.to_vec(),
            sym_addr: addr,
            name: name.to_vec(),
            object_offset: 0,
        };
    }
    if addr == TRUNCATED {
        return Resolved {
            file_key: TRUNCATED,
            file_path: b"<truncated>".to_vec(),
            sym_addr: TRUNCATED,
            name: b"@igprof_stack_truncated".to_vec(),
            object_offset: 0,
        };
    }
    let found = match naming {
        Naming::Index(names) => names.get(addr).map(|(o, s)| Resolved {
            file_key: o.base,
            file_path: o.path.clone(),
            sym_addr: s.map_or(addr, |s| s.addr),
            name: s.map_or_else(|| format!("@?0x{addr:x}").into_bytes(), |s| s.name.clone()),
            object_offset: (addr - o.base) as u64,
        }),
        Naming::Dladdr => resolve_dladdr(addr, exe),
    };
    if let Some(r) = found {
        return r;
    }
    if let Some(r) = resolve_unloaded(addr) {
        return r;
    }
    Resolved {
        file_key: 0,
        file_path: b"<unknown>".to_vec(),
        sym_addr: addr,
        name: format!("@?0x{addr:x}").into_bytes(),
        object_offset: addr as u64,
    }
}

/// `addr`'s object and symbol as `dladdr` names them; None when no loaded
/// object holds it.
fn resolve_dladdr(addr: usize, exe: &[u8]) -> Option<Resolved> {
    // SAFETY: Dl_info is plain data filled by dladdr.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; not in signal context.
    let ok = unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } != 0;
    if !ok || info.dli_fbase.is_null() {
        return None;
    }
    let fbase = info.dli_fbase as usize;
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let mut path = if info.dli_fname.is_null() {
        Vec::new()
    } else {
        // SAFETY: as above, non-null.
        unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_bytes()
            .to_vec()
    };
    if path.is_empty() || !path.starts_with(b"/") && is_main_program(fbase) {
        path = exe.to_vec();
    }
    let (sym_addr, name) = if !info.dli_sname.is_null() && !info.dli_saddr.is_null() {
        // SAFETY: dli_sname is a NUL-terminated string owned by the loader.
        (
            info.dli_saddr as usize,
            unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }
                .to_bytes()
                .to_vec(),
        )
    } else {
        (addr, format!("@?0x{addr:x}").into_bytes())
    };
    Some(Resolved {
        file_key: fbase,
        file_path: path,
        sym_addr,
        name,
        object_offset: (addr - fbase) as u64,
    })
}

/// Whether `fbase` is the main program's (the first object
/// `dl_iterate_phdr` reports). For a program that is not position
/// independent (load bias 0) this says yes for every object: the
/// `dladdr` comparison dump keeps what dumps wrote before the index, which
/// named the vDSO of such a program after the executable.
fn is_main_program(fbase: usize) -> bool {
    extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> i32 {
        // SAFETY: called by dl_iterate_phdr with valid pointers; first entry is the main program.
        unsafe { *(data as *mut usize) = (*info).dlpi_addr as usize };
        1
    }
    let mut base: usize = usize::MAX;
    // SAFETY: cb matches dl_iterate_phdr's callback signature.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut base as *mut usize as *mut libc::c_void) };
    // A non-PIE executable has load bias 0 but dladdr reports its lowest mapping.
    base == fbase || base == 0
}

/// Address space a dump may need besides what the program holds: the
/// final dump's region (`alloc::final_arena`) and the compressor's state,
/// then per call-tree node its merged copy, counters and text.
const DUMP_MEMORY_BASE: usize = 12 << 20;
const DUMP_MEMORY_PER_NODE: usize = 512;

/// Writes the current profile of every thread to `path`.
pub fn dump_to(path: &str) -> Result<DumpStats, DumpError> {
    if !crate::base::run::active() {
        return Err(DumpError::NotProfiling);
    }
    if DUMPING.swap(true, Ordering::AcqRel) {
        return Err(DumpError::Busy);
    }
    // A program that lowered RLIMIT_AS may leave no room for the dump's
    // memory: an allocation failing halfway would abort the program.
    let nodes: usize = thread::all().map(|t| t.tree().len()).sum();
    let needed = DUMP_MEMORY_BASE + nodes.saturating_mul(DUMP_MEMORY_PER_NODE);
    let room = match crate::base::limits::AddressSpaceRoom::make(needed) {
        Ok(room) => room,
        Err(limit) => {
            DUMPING.store(false, Ordering::Release);
            return Err(DumpError::NoMemory { needed, limit });
        }
    };
    let r = dump_locked(path);
    drop(room);
    DUMPING.store(false, Ordering::Release);
    r
}

/// In the keeper: a dump the program's threads were writing when they
/// died will never finish.
pub fn forget_unfinished_dump() {
    DUMPING.store(false, Ordering::Release);
}

/// [`dump_to`], after waiting (at most a minute) for a dump another thread
/// is writing (a snapshot just before exit must not cost the final profile).
pub fn dump_after_others(path: &str) -> Result<DumpStats, DumpError> {
    let deadline = crate::base::sys::monotonic_ns() + 60_000_000_000;
    loop {
        match dump_to(path) {
            Err(DumpError::Busy) if crate::base::sys::monotonic_ns() < deadline => {
                crate::base::sys::sleep_ns(1_000_000)
            }
            r => return r,
        }
    }
}

fn dump_locked(path: &str) -> Result<DumpStats, DumpError> {
    let started = crate::base::sys::thread_cpu_ns();
    crate::modules::each(crate::base::options::get(), |m| {
        if let Some(f) = m.before_dump {
            f()
        }
    });
    let nslots = counters::nslots();
    let mut merged = Merged::new(nslots);
    crate::modules::each(crate::base::options::get(), |m| {
        merged.stored_forms.extend(m.dump_value)
    });
    // Live resources first: the merge notes where their nodes go.
    let mut live: Vec<(usize, usize, u64, u64)> = Vec::new();
    crate::modules::each(crate::base::options::get(), |md| {
        if let Some(f) = md.leaks {
            f(&mut |node, slot, addr, size| live.push((node as usize, slot, addr, size)));
        }
    });
    merged.origin = live.iter().map(|&(node, ..)| (node, u32::MAX)).collect();
    let mut stats = DumpStats::default();
    let states: Vec<_> = thread::all()
        .filter(|t| !t.stale.load(Ordering::Acquire))
        .collect();
    let last_tree = states.iter().rposition(|t| t.tree().root().is_some());
    for (i, t) in states.into_iter().enumerate() {
        stats.samples += t.stats.samples.load(Ordering::Relaxed);
        stats.dropped += t.stats.dropped.load(Ordering::Relaxed);
        stats.truncated += t.stats.truncated.load(Ordering::Relaxed);
        stats.handler_ns += t.stats.handler_ns.load(Ordering::Relaxed);
        if let Some(u) = &t.unwinder {
            let c = u.stats();
            stats.descriptors.hits += c.hits;
            stats.descriptors.misses += c.misses;
            stats.descriptors.framehop += c.framehop;
            stats.descriptors.stored += c.stored;
            stats.descriptors.stored_differ += c.stored_differ;
        }
        stats.states += 1;
        if let Some(root) = t.tree().root() {
            merged.reserve(t.tree().len() + 1);
            merged.merge_tree(0, root, Some(i) == last_tree);
        }
    }
    crate::modules::each(crate::base::options::get(), |m| {
        if let Some(f) = m.synthetic {
            f(&mut |name, slot, ticks, value| merged.add_synthetic(name, slot, ticks, value))
        }
    });
    stats.nodes = merged.nodes.len() - 1;
    stats.merge_ns = crate::base::sys::thread_cpu_ns() - started;
    for (node, slot, addr, size) in live {
        if let Some(m) = merged.origin_of(node) {
            merged
                .leaks
                .entry((m, slot))
                .or_default()
                .push((addr, size));
        }
    }

    let gzip = crate::base::options::get().gzip || path.ends_with(".gz");
    let exe = &crate::base::run::info().exe;
    let named_at = crate::base::sys::thread_cpu_ns();
    let addrs = merged.code_addresses();
    let names = crate::output::names::name_all(&addrs, exe);
    stats.naming_ns = crate::base::sys::thread_cpu_ns() - named_at;
    if crate::base::options::get().debug {
        for (file, e) in &names.symtab_errors {
            crate::igprof_log!(
                "dump: no names from the .symtab of {}: {e}",
                crate::base::log::Bytes(file)
            );
        }
    }
    stats.addresses = addrs.len();
    stats.from_symtab = addrs
        .iter()
        .filter(|&&a| names.source(a) == Some(crate::output::names::Source::Symtab))
        .count();
    write_named(path, gzip, &merged, &Naming::Index(names))?;
    if names_check() {
        let at = crate::base::sys::thread_cpu_ns();
        write_named(&format!("{path}.dladdr"), gzip, &merged, &Naming::Dladdr)?;
        stats.dladdr_naming_ns = Some(crate::base::sys::thread_cpu_ns() - at);
    }
    stats.dump_ns = crate::base::sys::thread_cpu_ns() - started;
    Ok(stats)
}

/// Whether `IGPROF_NAMES_CHECK` asks for a second profile named by `dladdr`.
fn names_check() -> bool {
    std::env::var_os("IGPROF_NAMES_CHECK").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Writes the merged profile to `path` (through a temporary, see
/// [`create_output`]).
fn write_named(path: &str, gzip: bool, merged: &Merged, naming: &Naming) -> Result<(), DumpError> {
    let out = create_output(path)?;
    let written = {
        let _fsize = crate::base::limits::FsizeGuard::block();
        write_file(out.file(), gzip, merged, naming)
    };
    if let Err(err) = written {
        let path = out.written_path(Path::new(path)).display().to_string();
        out.discard();
        return Err(DumpError::Write { path, err });
    }
    out.finish(Path::new(path)).map_err(|e| DumpError::Rename {
        path: path.to_string(),
        errno: e.raw_os_error().unwrap_or(0),
    })
}

/// Streams the merged profile into `file`, gzipped or plain.
fn write_file(
    file: &std::fs::File,
    gzip: bool,
    merged: &Merged,
    naming: &Naming,
) -> Result<(), WriteError> {
    let io = |e: std::io::Error| WriteError::Io {
        errno: e.raw_os_error().unwrap_or(0),
    };
    if gzip {
        let expected = merged.nodes.len().saturating_mul(TEXT_PER_NODE);
        let out = GzipWriter::new(file, expected, WHOLE_GZIP_MAX);
        write_profile(IoSink::new(out), merged, naming)?
            .finish()?
            .finish()
            .map_err(io)?;
    } else {
        let mut f = write_profile(IoSink::new(file), merged, naming)?.finish()?;
        f.flush().map_err(io)?;
    }
    Ok(())
}

/// Text of a profile kept in memory and gzipped whole by libdeflate (see
/// `deflate`), up to this size; a larger one streams through zlib-rs.
const WHOLE_GZIP_MAX: usize = 32 << 20;

/// Bytes of text reserved per call-tree node (a small cc1's profile: 31 a
/// node), so that the text rarely grows by copying.
const TEXT_PER_NODE: usize = 40;

/// Gzips a dump's text into `file`: whole with libdeflate while it is at
/// most [`WHOLE_GZIP_MAX`] bytes, else (and if libdeflate fails) as a
/// stream through zlib-rs at level 3 (the cc1plus -mp profile, 8.3 MB of
/// text, in 36 ms where miniz_oxide took 64 ms), so that a dump's memory
/// stays bounded.
struct GzipWriter<'f> {
    file: &'f std::fs::File,
    /// The text so far, until it streams.
    text: Option<Vec<u8>>,
    /// The most text kept.
    whole_max: usize,
    stream: Option<flate2::write::GzEncoder<&'f std::fs::File>>,
}

impl<'f> GzipWriter<'f> {
    /// Room for `expected` bytes of text, kept whole up to `whole_max`.
    fn new(file: &'f std::fs::File, expected: usize, whole_max: usize) -> Self {
        GzipWriter {
            file,
            text: Some(Vec::with_capacity(expected.min(whole_max))),
            whole_max,
            stream: None,
        }
    }

    /// Switches to the stream, handing it the text so far.
    fn stream(&mut self) -> std::io::Result<&mut flate2::write::GzEncoder<&'f std::fs::File>> {
        if self.stream.is_none() {
            let mut enc = flate2::write::GzEncoder::new(self.file, flate2::Compression::new(3));
            enc.write_all(&self.text.take().unwrap_or_default())?;
            self.stream = Some(enc);
        }
        Ok(self.stream.as_mut().expect("set above"))
    }

    /// Compresses what is left and writes it out.
    fn finish(mut self) -> std::io::Result<()> {
        if let Some(text) = &self.text {
            if let Some(z) = deflate::gzip(text, deflate::LEVEL) {
                let mut f = self.file;
                return f.write_all(&z);
            }
        }
        self.stream()?.try_finish()
    }
}

impl Write for GzipWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match &mut self.text {
            Some(text) if text.len() + bytes.len() <= self.whole_max => {
                text.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            _ => self.stream()?.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // The text is written at `finish`; a stream flushes its own.
        match &mut self.stream {
            Some(s) => s.flush(),
            None => Ok(()),
        }
    }
}

/// The file a dump is written into (see `safefs`): a device or FIFO in
/// place; else a file created exclusively under an unpredictable name
/// beside `path` and renamed over it when complete (a link planted at
/// either name is never written through); or, when the process may no
/// longer create files there (it dropped its privileges: see
/// [`prepare_for_setuid`]), the prepared `path` itself, written in place
/// if it is a regular file, not a link, of the process's user or of the
/// user who started it.
fn create_output(path: &str) -> Result<safefs::Output, DumpError> {
    let dest = Path::new(path);
    let errno = match crate::base::limits::with_descriptor_room(|| safefs::Output::create(dest)) {
        Ok(out) => return Ok(out),
        Err(e) => e.raw_os_error().unwrap_or(0),
    };
    let create_failed = DumpError::Create {
        path: path.to_string(),
        errno,
    };
    if errno != libc::EACCES && errno != libc::EPERM {
        return Err(create_failed);
    }
    match safefs::open_in_place(dest, &file_owners()) {
        Ok(file) => Ok(safefs::Output::InPlace(file)),
        Err(safefs::Error::Refused(why)) => Err(DumpError::Refused {
            path: path.to_string(),
            why,
        }),
        Err(safefs::Error::Io(_)) => Err(create_failed),
    }
}

/// The users whose regular file a profile may be written into in place:
/// the process's effective user and the user who started it.
fn file_owners() -> [u32; 2] {
    [safefs::euid(), crate::base::run::info().start_uid]
}

/// Before the process gives up its privileges (setuid and friends, to the
/// effective user `uid`): makes sure the profile can still be written where
/// the user asked, by creating the output file now, owned by `uid`; a dump
/// that can no longer create its temporary there writes it in place. Not signal
/// context.
pub fn prepare_for_setuid(uid: libc::uid_t) {
    if !crate::base::run::active() {
        return;
    }
    let path = path::output_path();
    if path::is_device_or_pipe(path.as_bytes()) {
        return;
    }
    if let Err(safefs::Error::Refused(why)) = safefs::prepare(Path::new(&path), &file_owners(), uid)
    {
        crate::igprof_log!("not preparing {path} for the profile: {why}");
    }
}

fn write_profile<S: Sink>(sink: S, m: &Merged, naming: &Naming) -> Result<S, WriteError> {
    let mut w = Writer::new(sink);
    let rt = crate::base::run::info();
    let mut tick = None;
    crate::modules::each(crate::base::options::get(), |md| {
        tick = tick.or(md.header_tick.map(|f| f(crate::base::options::get())))
    });
    let tick = tick.unwrap_or(0.0);
    // A sampled memory profile says so after the program's name (IgProf's
    // grammar has no other room; both readers ignore the name).
    let mut notes: Vec<String> = Vec::new();
    crate::modules::each(crate::base::options::get(), |md| {
        notes.extend(md.header_note.and_then(|f| f()))
    });
    let note = notes.join("; ");
    let program = if note.is_empty() {
        std::borrow::Cow::Borrowed(&rt.program[..])
    } else {
        std::borrow::Cow::Owned([&rt.program[..], b" [", note.as_bytes(), b"]"].concat())
    };
    w.header(crate::base::sys::getpid() as u64, &program, tick)?;
    let mut syms = Symbols {
        files: HashMap::default(),
        funcs: HashMap::default(),
        exe: rt.exe.clone(),
    };
    let mut counter_defined = vec![false; m.nslots];
    // Per code address once written: its symbol's start and its
    // function's id. Its names are needed only once, for the function's
    // definition; kept small and sized for every address at once, the
    // table costs no regrowth (a small cc1's 3,700 addresses made it
    // rehash four times, 400 page faults in all).
    let mut known: HashMap<usize, (usize, u32)> =
        HashMap::with_capacity_and_hasher(naming.addresses(), Default::default());
    let mut kids = Vec::new();
    // Iterative pre-order walk: (node, depth).
    let mut stack: Vec<(u32, u32)> = Vec::new();
    let mut c = m.nodes[0].first_child;
    while c != u32::MAX {
        stack.push((c, 1));
        c = m.nodes[c as usize].next_sibling;
    }
    stack.reverse();
    while let Some((id, depth)) = stack.pop() {
        let node = &m.nodes[id as usize];
        let addr = node.addr;
        // A function met for the first time: its names and file.
        let mut fresh = None;
        let (sym_addr, fnid) = match known.get(&addr) {
            Some(&k) => k,
            None => {
                let r = resolve(addr, &syms.exe, &m.synthetic, naming);
                let next_file = syms.files.len() as u32;
                let mut new_file = false;
                let fid = syms
                    .files
                    .entry(r.file_key)
                    .or_insert_with(|| {
                        new_file = true;
                        (next_file, r.file_path.clone())
                    })
                    .0;
                let next_fn = syms.funcs.len() as u32;
                let mut new_fn = false;
                let fnid = *syms
                    .funcs
                    .entry((r.file_key, r.sym_addr))
                    .or_insert_with(|| {
                        new_fn = true;
                        next_fn
                    });
                known.insert(addr, (r.sym_addr, fnid));
                let sym_addr = r.sym_addr;
                if new_fn {
                    fresh = Some((r, new_file, fid));
                }
                (sym_addr, fnid)
            }
        };
        let func = match &fresh {
            Some((r, new_file, fid)) => FuncRef::New {
                id: fnid,
                file: if *new_file {
                    FileRef::New {
                        id: *fid,
                        path: &r.file_path,
                    }
                } else {
                    FileRef::Known(*fid)
                },
                object_offset: r.object_offset,
                name: &r.name,
            },
            None => FuncRef::Known(fnid),
        };
        w.node(depth, func, (addr - sym_addr) as u64)?;
        let values = m.values_of(id).unwrap_or(&[]);
        for ((s, defined), &(t, v, p)) in counter_defined.iter_mut().enumerate().zip(values) {
            if t == 0 && v == 0 && p == 0 {
                continue;
            }
            let cref = if *defined {
                CounterRef::Known(s as u32)
            } else {
                *defined = true;
                CounterRef::New {
                    id: s as u32,
                    name: counters::def_of_slot(s).name.as_bytes(),
                }
            };
            w.counter(cref, t, v, p)?;
            if m.leaks.is_empty() {
                continue;
            }
            if let Some(l) = m.leaks.get(&(id, s)) {
                for &(addr, size) in l {
                    w.leak(addr, size)?;
                }
            }
        }
        w.end_node()?;
        // Children in order.
        kids.clear();
        let mut c = node.first_child;
        while c != u32::MAX {
            kids.push(c);
            c = m.nodes[c as usize].next_sibling;
        }
        for &k in kids.iter().rev() {
            stack.push((k, depth + 1));
        }
    }
    Ok(w.into_sink())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::counters::{self, CounterId};
    use crate::base::tree::CallTree;

    #[test]
    fn gzip_writer_keeps_small_texts_whole_and_streams_large_ones() {
        use std::io::{Read, Seek};
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("C{} FN{:x}+{:x}\n", i % 30, i % 500, i).into_bytes())
            .collect();
        // Whole (one libdeflate call), then past the limit from the start,
        // then past it halfway.
        for whole_max in [usize::MAX, 0, text.len() / 2] {
            let mut file = unnamed_temp_file();
            let mut w = GzipWriter::new(&file, 64, whole_max);
            for chunk in text.chunks(8192) {
                w.write_all(chunk).unwrap();
            }
            let streamed = w.stream.is_some();
            w.finish().unwrap();
            assert_eq!(streamed, whole_max < text.len(), "whole_max {whole_max}");
            file.rewind().unwrap();
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&mut file)
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, text, "whole_max {whole_max}");
        }
    }

    /// An unnamed file in the temporary directory, removed when closed.
    fn unnamed_temp_file() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "igprof-gzip-test.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn threads_merge_by_path_with_each_counters_rule() {
        let _g = counters::TEST_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counters::reset_for_test();
        counters::enable(CounterId::PerfTicks);
        counters::enable(CounterId::MemMax);
        counters::enable(CounterId::MemLive);
        let (ticks, max, live) = (
            counters::slot(CounterId::PerfTicks).unwrap(),
            counters::slot(CounterId::MemMax).unwrap(),
            counters::slot(CounterId::MemLive).unwrap(),
        );
        let mut a = CallTree::new();
        let mut b = CallTree::new();
        // SAFETY (all derefs below): nodes returned by node_for are live.
        let n = a.node_for(&[0x30, 0x20, 0x10], false);
        let live_in_a = n as usize;
        unsafe { &*n }.counter(ticks).add(3, 3);
        unsafe { &*n }.counter(max).record_max(100);
        unsafe { &*n }.counter(live).tick_shared(64);
        let n = b.node_for(&[0x30, 0x20, 0x10], false);
        unsafe { &*n }.counter(ticks).add(2, 2);
        unsafe { &*n }.counter(max).record_max(40);
        unsafe { &*n }.counter(live).tick_shared(16);
        unsafe { &*n }.counter(live).tick_shared(16);
        unsafe { &*n }.counter(live).release_shared(16);
        let n = b.node_for(&[0x31, 0x20, 0x10], false);
        let live_in_b = n as usize;
        unsafe { &*n }.counter(ticks).add(1, 1);

        let mut m = Merged::new(counters::nslots());
        // Nodes holding live resources: where they are merged is noted.
        m.origin = [(live_in_a, u32::MAX), (live_in_b, u32::MAX)]
            .into_iter()
            .collect();
        m.merge_tree(0, a.root().unwrap(), false);
        m.merge_tree(0, b.root().unwrap(), true);
        m.add_synthetic("<unattributed>", ticks, 1, 7);
        m.add_synthetic("<unattributed>", ticks, 1, 5);
        // root, 0x10, 0x20, 0x30, 0x31, synthetic
        assert_eq!(m.nodes.len(), 6);
        let find = |m: &Merged, path: &[usize]| {
            // By the children lists: the last tree's nodes are not indexed.
            let mut id = 0u32;
            for &addr in path {
                let mut c = m.nodes[id as usize].first_child;
                while m.nodes[c as usize].addr != addr {
                    c = m.nodes[c as usize].next_sibling;
                }
                id = c;
            }
            id as usize
        };
        let leaf = find(&m, &[0x10, 0x20, 0x30]);
        let v = |id: usize, s: usize| m.values_of(id as u32).map_or((0, 0, 0), |v| v[s]);
        assert_eq!(v(leaf, ticks), (5, 5, 5), "PERF_TICKS adds up");
        assert_eq!(v(leaf, max), (2, 100, 0), "MEM_MAX keeps the largest");
        assert_eq!(
            v(leaf, live),
            (2, 80, 64),
            "MEM_LIVE adds what is live, keeps the largest peak"
        );
        assert_eq!(v(find(&m, &[0x10, 0x20, 0x31]), ticks), (1, 1, 1));
        assert_eq!(m.origin_of(live_in_a), Some(leaf as u32));
        assert_eq!(
            m.origin_of(live_in_b),
            Some(find(&m, &[0x10, 0x20, 0x31]) as u32)
        );
        assert_eq!(m.origin_of(n as usize + 8), None, "not asked for");
        assert_eq!(
            v(find(&m, &[0x10, 0x20]), ticks),
            (0, 0, 0),
            "callers carry no self counts"
        );
        let synth = find(&m, &[SYNTHETIC_BASE]);
        assert_eq!(v(synth, ticks), (2, 12, 12));
        assert_eq!(m.synthetic, vec!["<unattributed>"]);
        assert_eq!(
            resolve(SYNTHETIC_BASE, b"", &m.synthetic, &Naming::Dladdr).name,
            b"<unattributed>"
        );
        assert_eq!(
            resolve(TRUNCATED, b"", &m.synthetic, &Naming::Dladdr).name,
            b"@igprof_stack_truncated"
        );
    }
}
