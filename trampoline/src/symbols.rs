//! Finding a function in the running process: its address and size; and
//! naming the data symbol that holds an address ([`data_symbols`]).
//!
//! Owns: `dlsym`/`dlvsym` lookups (first definition in the process, or in a
//! named library that is already loaded), the size of a function found by
//! name from its own dynamic symbol (through the object's hash table), and
//! otherwise the symbol size and padding from an index of each object's
//! dynamic symbols, made on first need (`image`: what `dladdr1` answers,
//! without its scan of the whole table per question), and the
//! fallback to the ELF `.symtab`/`.dynsym` of
//! the loaded objects' files (object crate) for names `dlsym` cannot see
//! and for sizes of implementations chosen by IFUNC resolvers.
//!
//! Must never: load a library (lookups use `RTLD_NOLOAD`), or be called from
//! a signal handler or a hook (it allocates, reads files, takes loader locks).

use crate::error::LookupError;
use crate::image::{
    dynsym_defines, dynsym_function, dynsym_named, first_object, has_gnu_hash, may_hold,
    object_name, versioned_function, DynEntry, DynIndex, Image, MappedFile,
};
use object::{Object, ObjectSymbol};
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};

/// A function in the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Name as looked up (may be empty for a bare address).
    pub name: String,
    /// Run-time address of the first instruction.
    pub addr: u64,
    /// Size from the symbol table, when known.
    pub size: Option<u64>,
}

impl Symbol {
    /// A function known only by its address (no name, size unknown).
    pub fn at(addr: u64) -> Symbol {
        Symbol {
            name: String::new(),
            addr,
            size: None,
        }
    }
}

/// Find function `name` in library `lib` (a soname or path of a loaded
/// object, e.g. "libc.so.6"), or the first definition in the process when
/// `lib` is `None`.
pub fn find_function(name: &str, lib: Option<&str>) -> Result<Symbol, LookupError> {
    lookup(name, None, lib)
}

/// As [`find_function`] for a versioned symbol, e.g.
/// `find_function_versioned("pthread_create", "GLIBC_2.2.5", None)`.
pub fn find_function_versioned(
    name: &str,
    version: &str,
    lib: Option<&str>,
) -> Result<Symbol, LookupError> {
    lookup(name, Some(version), lib)
}

fn lookup(name: &str, version: Option<&str>, lib: Option<&str>) -> Result<Symbol, LookupError> {
    let not_found = || LookupError::NotFound {
        name: name.to_string(),
        version: version.map(str::to_string),
        lib: lib.map(str::to_string),
    };
    let cname = CString::new(name).map_err(|_| LookupError::BadName { name: name.into() })?;
    let cver = match version {
        Some(v) => Some(CString::new(v).map_err(|_| LookupError::BadName { name: v.into() })?),
        None => None,
    };
    let handle = match lib {
        None if !may_define(cname.as_bytes()) => {
            return elf_fallback(name, version, lib).ok_or_else(not_found);
        }
        None => libc::RTLD_DEFAULT,
        Some(l) => {
            if let Some(s) = in_named_object(name, version, l) {
                return Ok(s);
            }
            let cl = CString::new(l).map_err(|_| LookupError::BadName { name: l.into() })?;
            // SAFETY: RTLD_NOLOAD never loads; it only returns a handle to an
            // object already present (and takes a reference, released below).
            let h = unsafe { libc::dlopen(cl.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if h.is_null() {
                forget_dl_error();
                // Perhaps the object is loaded under a path whose tail is `l`.
                return elf_fallback(name, version, lib)
                    .ok_or(LookupError::LibraryNotLoaded { lib: l.into() });
            }
            h
        }
    };
    // SAFETY: handle is RTLD_DEFAULT or a live handle; names are NUL-terminated.
    let p = unsafe {
        match &cver {
            Some(v) => libc::dlvsym(handle, cname.as_ptr(), v.as_ptr()),
            None => libc::dlsym(handle, cname.as_ptr()),
        }
    };
    if handle != libc::RTLD_DEFAULT {
        // SAFETY: balances the RTLD_NOLOAD dlopen above.
        unsafe { libc::dlclose(handle) };
    }
    if p.is_null() {
        forget_dl_error();
        return elf_fallback(name, version, lib).ok_or_else(not_found);
    }
    let addr = p as u64;
    Ok(Symbol {
        name: name.to_string(),
        addr,
        size: size_of_named_function_at(name, addr),
    })
}

/// Function `name` (of `version`, else the default one) as defined by the
/// loaded object `lib` itself, read from its tables in memory: what
/// `dlvsym`/`dlsym` on a `dlopen(lib, RTLD_NOLOAD)` handle give for the
/// functions the profiler hooks, without that `dlopen`, which allocates
/// with the program's malloc (at start-up, its heap's first blocks). None
/// where memory cannot tell (no such object, no GNU hash table, an IFUNC,
/// a name the object does not define but a dependency may): then the
/// loader is asked.
fn in_named_object(name: &str, version: Option<&str>, lib: &str) -> Option<Symbol> {
    // The first object of that name answers, found or not (as the
    // loader's handle would be that object).
    first_other_object(Some(lib), |img| {
        Some(versioned_function(
            img,
            name.as_bytes(),
            version.map(str::as_bytes),
        ))
    })
    .flatten()
    .map(|(addr, size)| Symbol {
        name: name.to_string(),
        addr: addr as u64,
        size: if size > 0 {
            Some(size)
        } else {
            size_of_function_at(addr as u64)
        },
    })
}

/// `f` on each loaded object but the profiler's own (only those `lib`
/// names, when given: [`is_lib`]), in load order, until it answers; inside
/// [`first_object`]'s walk.
fn first_other_object<R>(lib: Option<&str>, mut f: impl FnMut(&Image) -> Option<R>) -> Option<R> {
    let own = own_library_base();
    first_object(|info| {
        if Some(object_base(info)) == own {
            return None;
        }
        if let Some(l) = lib {
            let path = std::str::from_utf8(object_name(info)).unwrap_or("");
            if !is_lib(path, l) {
                return None;
            }
        }
        // SAFETY: a loaded object, read only inside first_object's callback.
        f(&unsafe { Image::of(info) })
    })
}

/// `dlsym(RTLD_DEFAULT, name)`, asked only when some loaded object may
/// define `name` ([`may_define`]): for the profiler's questions about
/// functions most programs lack (a sanitizer's, cgo's).
pub fn global_symbol(name: &CStr) -> Option<usize> {
    if !may_define(name.to_bytes()) {
        return None;
    }
    // SAFETY: a NUL-terminated name looked up in the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        forget_dl_error();
    }
    (!p.is_null()).then_some(p as usize)
}

/// Whether a loaded object defines a dynamic symbol `name`, asked of each
/// object's GNU hash table in memory; true as well when an object other
/// than the vDSO has no such table (then only the loader can tell).
///
/// A `dlsym` that fails leaves its error text pending in the thread's
/// `dlerror` state (allocated with the program's malloc): the program's
/// next `dlerror()` returned "libigprof.so: undefined symbol:
/// _cgo_topofstack" under `-np`. Names no object defines are not asked.
fn may_define(name: &[u8]) -> bool {
    // SAFETY: getauxval has no preconditions.
    let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    first_object(|info| {
        if vdso != 0 && object_base(info) == vdso {
            return None;
        }
        // SAFETY: a loaded object, read only inside first_object's callback.
        let img = unsafe { Image::of(info) };
        (!has_gnu_hash(&img) || dynsym_defines(&img, name)).then_some(())
    })
    .is_some()
}

/// Clears the error a failed `dlopen`/`dlsym` of the profiler left pending,
/// so the program's next `dlerror()` does not return it. The failed call
/// had already cleared whatever error was pending before it (glibc clears
/// the state at each call), so nothing of the program's is lost here.
fn forget_dl_error() {
    // SAFETY: dlerror has no preconditions; its string is not kept.
    unsafe { libc::dlerror() };
}

/// Size of the function starting exactly at `addr`: from the dynamic symbol
/// `dladdr1` would find, else from the object's file symbol tables.
pub fn size_of_function_at(addr: u64) -> Option<u64> {
    let (o, e) = symbol_at(addr, None)?;
    size_or_file(&o, e, addr)
}

/// [`size_of_function_at`] for the function `name` found there: its own
/// dynamic symbol, found through the hash table, gives the size without
/// an index of the object's symbols. None for the canonical PLT entry a
/// non-PIE program exports for a function it only calls (an undefined
/// symbol with a value: no function of that size there), without looking
/// further: the program's index and its file's `.symtab` (node: 75,000
/// and 109,000 symbols, 2-3 ms at each start-up) could only name the
/// stub.
fn size_of_named_function_at(name: &str, addr: u64) -> Option<u64> {
    match symbol_at(addr, Some(name))? {
        (_, Some(e)) if e.size > 0 => Some(e.size),
        (_, Some(e)) if !e.defined => None,
        _ => size_of_function_at(addr),
    }
}

/// The size of dynamic symbol `e` if it has one, else the size the
/// object's file symbol tables give the function at `addr`.
fn size_or_file(o: &Indexed, e: Option<DynEntry>, addr: u64) -> Option<u64> {
    if let Some(e) = e.filter(|e| e.size > 0) {
        return Some(e.size);
    }
    file_symbol_size(file_of(&o.path), o.base as u64, addr)
}

/// Whether a symbol is *defined* at `addr` (the dynamic symbol `dladdr`
/// names there starts there and is defined). False for the canonical PLT
/// entry a non-PIE executable exports for a function it only calls
/// (`dlsym` returns that address, but the symbol is undefined there and
/// the code is a jump to the real one).
pub fn defined_at(addr: u64) -> bool {
    symbol_at(addr, None)
        .and_then(|(_, e)| e)
        .is_some_and(|e| e.defined)
}

/// [`defined_at`] for a function found by name ([`find_function`]): its
/// own dynamic symbol says, found through the hash table (without an index
/// of the object's symbols); else as [`defined_at`].
pub fn defined(sym: &Symbol) -> bool {
    match symbol_at(sym.addr, Some(&sym.name)) {
        Some((_, Some(e))) => e.defined,
        _ => defined_at(sym.addr),
    }
}

/// How many of the `max` bytes from `end` (the end of a function) are not
/// the start of another dynamic symbol, i.e. may be alignment padding.
pub(crate) fn padding_after(end: u64, max: u64) -> u64 {
    let Some(o) = object_holding(end, Query::Index) else {
        return max;
    };
    o.index
        .get()
        .and_then(|i| i.first_start_in(end as usize, (end + max) as usize))
        .map_or(max, |s| s as u64 - end)
}

/// The object holding `addr` and the dynamic symbol starting there: the
/// one named `name` when given and found through the hash table, else the
/// one `dladdr1` names (from the object's index, made on first need).
fn symbol_at(addr: u64, name: Option<&str>) -> Option<(Arc<Indexed>, Option<DynEntry>)> {
    let query = match name {
        Some(n) if !n.is_empty() => Query::Named(n.as_bytes()),
        _ => Query::Index,
    };
    let mut named = None;
    let o = object_holding_then(addr, query, &mut named)?;
    if let Query::Named(_) = query {
        // None: not in the hash table; the caller falls back on the index.
        return Some((o, named));
    }
    let e = o.index.get().and_then(|i| i.starting_at(addr as usize));
    Some((o, e))
}

/// A loaded object with the index of its dynamic symbols (made on the
/// first question that needs it).
struct Indexed {
    /// `dladdr`'s `dli_fbase` and `dli_fname` ("" for the main program).
    base: usize,
    path: String,
    index: std::sync::OnceLock<DynIndex>,
}

/// What to find in the object holding an address, while the loader keeps
/// it described (`image`'s rule: only inside the `dl_iterate_phdr` call).
#[derive(Clone, Copy)]
enum Query<'a> {
    /// Its index of dynamic symbols, made if missing.
    Index,
    /// The dynamic symbol with this name starting at the address.
    Named(&'a [u8]),
}

/// An object's identity while loaded: (load bias, program headers'
/// address); an object unloaded and another loaded in its place has other
/// headers.
type ObjectKey = (usize, usize);

/// Indexes made so far.
static INDEXED: Mutex<Vec<(ObjectKey, Arc<Indexed>)>> = Mutex::new(Vec::new());

/// The object `dladdr` would name for `addr`, with its index of dynamic
/// symbols (made once per object: `dladdr` scans the object's whole symbol
/// table for each question).
fn object_holding(addr: u64, query: Query) -> Option<Arc<Indexed>> {
    object_holding_then(addr, query, &mut None)
}

/// [`object_holding`] answering `query`: a named symbol goes to `named`.
fn object_holding_then(
    addr: u64,
    query: Query,
    named: &mut Option<DynEntry>,
) -> Option<Arc<Indexed>> {
    let addr = addr as usize;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let mut seen = 0;
    first_object(|info| {
        let program = seen == 0;
        seen += 1;
        // SAFETY: a loaded object, inside first_object's callback.
        if !unsafe { may_hold(info, addr, page) } {
            return None;
        }
        // SAFETY: a loaded object, read only inside first_object's callback.
        let img = unsafe { Image::of(info) };
        let base = img.map_start(page)?;
        if !img
            .ranges(base, page, program)
            .iter()
            .any(|&(lo, hi)| lo <= addr && addr < hi)
        {
            return None;
        }
        let key = (img.bias, info.dlpi_phdr as usize);
        let mut cache = INDEXED.lock().unwrap_or_else(|e| e.into_inner());
        let o = match cache.iter().find(|(k, _)| *k == key) {
            Some((_, o)) => o.clone(),
            None => {
                let path = if program {
                    String::new()
                } else {
                    String::from_utf8_lossy(object_name(info)).into_owned()
                };
                let o = Arc::new(Indexed {
                    base,
                    path,
                    index: std::sync::OnceLock::new(),
                });
                cache.push((key, o.clone()));
                o
            }
        };
        drop(cache);
        // The question, answered on the object inside the callback.
        match query {
            Query::Named(name) => *named = dynsym_named(&img, name, addr),
            Query::Index => {
                o.index.get_or_init(|| DynIndex::of(&img));
            }
        }
        Some(o)
    })
}

/// Sizes from the ELF file's symbol tables: the function symbol whose
/// run-time address (`bias` + value, `bias` = 0 for ET_EXEC) is `addr`.
fn file_symbol_size(path: &str, base: u64, addr: u64) -> Option<u64> {
    let data = MappedFile::open(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let bias = load_bias(&file, base);
    file.symbols()
        .chain(file.dynamic_symbols())
        .find(|s| {
            s.kind() == object::SymbolKind::Text
                && s.address().wrapping_add(bias) == addr
                && s.size() > 0
        })
        .map(|s| s.size())
}

/// `dli_fbase`/`dlpi_addr` is the load address of the first segment for
/// shared objects; convert it into the bias added to symbol values.
pub(crate) fn load_bias(file: &object::File, base: u64) -> u64 {
    if file.kind() == object::ObjectKind::Executable {
        0
    } else {
        // For ET_DYN the lowest segment has vaddr 0 in practice; subtract it anyway.
        use object::ObjectSegment;
        let min = file.segments().map(|s| s.address()).min().unwrap_or(0);
        base.wrapping_sub(min & !0xfff)
    }
}

/// Search the symbol tables of every loaded object (in load order) for
/// `name`: first the exported functions ([`exported_function`], in
/// memory), then each object file's `.symtab` and `.dynsym`. Versioned
/// lookups are answered by `dlvsym` only (the fallback cannot tell symbol
/// versions apart), so they return `None` here.
fn elf_fallback(name: &str, version: Option<&str>, lib: Option<&str>) -> Option<Symbol> {
    if version.is_some() {
        return None;
    }
    if let Some(s) = exported_function(name, lib) {
        return Some(s);
    }
    let own = own_library_base();
    for (path, base) in loaded_objects() {
        if Some(base) == own {
            continue;
        }
        if lib.is_some_and(|l| !is_lib(&path, l)) {
            continue;
        }
        if let Some(s) = file_definition(&path, base, name) {
            return Some(s);
        }
    }
    None
}

/// Whether `path` (a loaded object's name) is the object `lib` names: the
/// same, or a path ending in it.
fn is_lib(path: &str, lib: &str) -> bool {
    path == lib || path.ends_with(&format!("/{lib}"))
}

/// The first loaded object (in load order; only `lib` when given; never
/// the profiler's own) that exports function `name`, found through its
/// GNU hash table in memory. What `dlsym(RTLD_DEFAULT)` misses in a
/// library loaded with `RTLD_LOCAL` (a plugin) is found here without
/// reading its file: the file's parsed symbols, kept for later lookups,
/// took 6.6 MB of the program's memory for libLLVM-14.
fn exported_function(name: &str, lib: Option<&str>) -> Option<Symbol> {
    first_other_object(lib, |img| {
        dynsym_function(img, name.as_bytes()).map(|(addr, size)| Symbol {
            name: name.to_string(),
            addr: addr as u64,
            size: (size > 0).then_some(size),
        })
    })
}

/// The function `name` defined in the symbol tables (`.symtab`, then
/// `.dynsym`) of the file of the object loaded at `base` from `path`
/// (as [`loaded_objects`] gives them), by [`crate::objscan::scan_object`].
/// The answer is kept per object and name, so that a name looked up again
/// after each dlopen reads no file twice; the object's other names are
/// not kept (every function of every object, parsed for a name no object
/// defines, stayed in the program's memory: 10 MB with libLLVM-14).
fn file_definition(path: &str, base: u64, name: &str) -> Option<Symbol> {
    /// (path, load address, name) asked, and the answer.
    type Answer = ((String, u64, String), Option<Symbol>);
    static ANSWERS: Mutex<Vec<Answer>> = Mutex::new(Vec::new());
    let answers = || ANSWERS.lock().unwrap_or_else(|e| e.into_inner());
    let key = (path.to_string(), base, name.to_string());
    if let Some((_, a)) = answers().iter().find(|(k, _)| *k == key) {
        return a.clone();
    }
    let found =
        crate::objscan::scan_object(path, base, crate::objscan::Tables::All, &|n| n.is(name))
            .and_then(|scan| scan.functions.into_iter().next());
    answers().push((key, found.clone()));
    found
}

/// (run-time start, end, name) of one object's data symbols, by start.
type DataDefinitions = Vec<(u64, u64, String)>;

/// The data symbols (global variables, arrays: `STT_OBJECT` with a size)
/// of the loaded objects, to name the one holding an address.
pub struct DataSymbols(Vec<Arc<DataDefinitions>>);

impl DataSymbols {
    /// The name of the data symbol that holds `addr`, if any.
    pub fn at(&self, addr: u64) -> Option<&str> {
        self.0.iter().find_map(|defs| {
            let i = defs.partition_point(|(start, _, _)| *start <= addr);
            let (_, end, name) = defs.get(i.checked_sub(1)?)?;
            (addr < *end).then_some(name.as_str())
        })
    }
}

/// The data symbols of every loaded object's symbol tables (`.symtab`
/// and `.dynsym` of its file), each object's read once per process.
pub fn data_symbols() -> DataSymbols {
    type Parsed = ((String, u64), Arc<DataDefinitions>);
    static CACHE: Mutex<Vec<Parsed>> = Mutex::new(Vec::new());
    let mut all = Vec::new();
    let own = own_library_base();
    for (path, base) in loaded_objects() {
        if Some(base) == own {
            continue;
        }
        let key = (path.clone(), base);
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = cache.iter().find(|(k, _)| *k == key) {
            all.push(d.clone());
            continue;
        }
        let mut defs = Vec::new();
        if let Ok(data) = MappedFile::open(file_of(&path)) {
            if let Ok(file) = object::File::parse(&*data) {
                let bias = load_bias(&file, base);
                for s in file.symbols().chain(file.dynamic_symbols()) {
                    if s.kind() == object::SymbolKind::Data && s.is_definition() && s.size() > 0 {
                        if let Ok(n) = s.name() {
                            let start = s.address().wrapping_add(bias);
                            defs.push((start, start + s.size(), n.to_string()));
                        }
                    }
                }
            }
        }
        defs.sort();
        defs.dedup_by_key(|d| d.0);
        let d = Arc::new(defs);
        cache.push((key, d.clone()));
        all.push(d);
    }
    DataSymbols(all)
}

/// (path, load address) of every object in the process, main program first
/// (its path is empty).
pub fn loaded_objects() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    first_object::<()>(|info| {
        let name = String::from_utf8_lossy(object_name(info)).into_owned();
        out.push((name, object_base(info)));
        None
    });
    out
}

/// The base (`dli_fbase`, the first page: what [`loaded_objects`] calls
/// an object's base) of the loaded object that holds `addr`, if any. Read
/// from the program headers: `dladdr` would also look for the nearest
/// symbol, a scan of the object's whole symbol table (28,900 entries in
/// cc1, which exports its functions).
pub fn object_base_of(addr: usize) -> Option<u64> {
    let page = crate::nearmem::page_size() as usize;
    first_object(|info| {
        // SAFETY: a loaded object, inside first_object's callback.
        unsafe { may_hold(info, addr, page) }.then(|| object_base(info))
    })
}

/// The base of the shared library this crate is linked into (the
/// profiler's), None when it is the main program (a test). The file
/// fallbacks skip it: its functions are never a hook's target nor its
/// data a program's, and its file (with debug information, 15 MB) was
/// read whole into memory at each -fp lookup of a name not exported.
/// Found once: objects do not move.
fn own_library_base() -> Option<u64> {
    static OWN: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| {
        let own = object_base_of(own_library_base as *const () as usize)?;
        // SAFETY: getauxval reads the process's auxiliary vector.
        let entry = unsafe { libc::getauxval(libc::AT_ENTRY) } as usize;
        (object_base_of(entry) != Some(own)).then_some(own)
    })
}

/// The load address of an object's lowest `PT_LOAD` segment (`dlpi_addr`
/// is its bias): what [`loaded_objects`] calls its base.
pub(crate) fn object_base(info: &libc::dl_phdr_info) -> u64 {
    let mut min_vaddr = u64::MAX;
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD {
            min_vaddr = min_vaddr.min(ph.p_vaddr);
        }
    }
    if min_vaddr == u64::MAX {
        info.dlpi_addr
    } else {
        info.dlpi_addr + (min_vaddr & !0xfff)
    }
}

/// The file of a loaded object whose path the loader gives as `path`:
/// the main program's is empty, and is read through `/proc/self/exe`.
pub(crate) fn file_of(path: &str) -> &str {
    if path.is_empty() {
        "/proc/self/exe"
    } else {
        path
    }
}
