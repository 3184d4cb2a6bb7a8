//! Finding a function in the running process: its address and size.
//!
//! Owns: `dlsym`/`dlvsym` lookups (first definition in the process, or in a
//! named library that is already loaded), the symbol size via `dladdr1`
//! (`RTLD_DL_SYMENT`), and the fallback to the ELF `.symtab`/`.dynsym` of
//! the loaded objects' files (object crate) for names `dlsym` cannot see
//! and for sizes of implementations chosen by IFUNC resolvers.
//!
//! Must never: load a library (lookups use `RTLD_NOLOAD`), or be called from
//! a signal handler or a hook (it allocates, reads files, takes loader locks).

use crate::error::LookupError;
use object::{Object, ObjectSymbol};
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
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

const RTLD_DL_SYMENT: libc::c_int = 1;

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
        None => libc::RTLD_DEFAULT,
        Some(l) => {
            let cl = CString::new(l).map_err(|_| LookupError::BadName { name: l.into() })?;
            // SAFETY: RTLD_NOLOAD never loads; it only returns a handle to an
            // object already present (and takes a reference, released below).
            let h = unsafe { libc::dlopen(cl.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if h.is_null() {
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
        return elf_fallback(name, version, lib).ok_or_else(not_found);
    }
    let addr = p as u64;
    Ok(Symbol {
        name: name.to_string(),
        addr,
        size: size_of_function_at(addr),
    })
}

/// Size of the function starting exactly at `addr`: from the dynamic symbol
/// `dladdr1` finds, else from the object's file symbol tables.
pub fn size_of_function_at(addr: u64) -> Option<u64> {
    // SAFETY: Dl_info is plain data; dladdr1 fills it (and `sym`) or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers; RTLD_DL_SYMENT makes `sym` an ElfW(Sym)*.
    let ok = unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut sym, RTLD_DL_SYMENT) };
    if ok == 0 {
        return None;
    }
    if !sym.is_null() && info.dli_saddr as u64 == addr {
        // SAFETY: glibc returns a pointer into the object's mapped .dynsym.
        let s = unsafe { &*(sym as *const libc::Elf64_Sym) };
        if s.st_size > 0 {
            return Some(s.st_size);
        }
    }
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let bias = info.dli_fbase as u64;
    let path = if path.is_empty() {
        "/proc/self/exe".to_string()
    } else {
        path
    };
    file_symbol_size(&path, bias, addr)
}

/// Whether a symbol is *defined* at `addr` (dladdr names a symbol that
/// starts there). False for the canonical PLT entry a non-PIE executable
/// exports for a function it only calls (`dlsym` returns that address, but
/// the symbol is undefined there and the code is a jump to the real one).
pub fn defined_at(addr: u64) -> bool {
    // SAFETY: Dl_info is plain data; dladdr1 fills it (and `sym`) or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers; RTLD_DL_SYMENT makes `sym` an ElfW(Sym)*.
    let ok = unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut sym, RTLD_DL_SYMENT) };
    // dladdr also names an undefined symbol that has a value (the PLT entry
    // of a non-PIE program): the section index tells them apart.
    ok != 0
        && info.dli_saddr as u64 == addr
        // SAFETY: glibc returns a pointer into the object's mapped .dynsym.
        && (sym.is_null() || unsafe { (*(sym as *const libc::Elf64_Sym)).st_shndx } != 0)
}

/// How many of the `max` bytes from `end` (the end of a function) are not
/// the start of another dynamic symbol, i.e. may be alignment padding.
/// (dladdr names the symbol that starts at or before an address: asking
/// for the last byte, then before each start found, needs one or two
/// look-ups instead of one per byte, and each scans the object's symbols.)
pub(crate) fn padding_after(end: u64, max: u64) -> u64 {
    let start_at_or_before = |a: u64| {
        // SAFETY: Dl_info is plain data filled by dladdr; any address is allowed.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        let ok = unsafe { libc::dladdr(a as *const c_void, &mut info) };
        (ok != 0 && !info.dli_saddr.is_null()).then_some(info.dli_saddr as u64)
    };
    if max == 0 {
        return 0;
    }
    // dladdr answers only for an address inside a symbol (or past one of
    // unknown size): when the last byte is in no symbol, a tiny one may
    // still start before it, so look byte by byte then.
    let Some(last) = start_at_or_before(end + max - 1) else {
        return (0..max)
            .find(|&k| start_at_or_before(end + k) == Some(end + k))
            .unwrap_or(max);
    };
    let mut first = None;
    let mut next = Some(last);
    while let Some(s) = next.filter(|&s| s >= end) {
        first = Some(s);
        if s == end {
            break;
        }
        next = start_at_or_before(s - 1);
    }
    first.map_or(max, |s| s - end)
}

/// Sizes from the ELF file's symbol tables: the function symbol whose
/// run-time address (`bias` + value, `bias` = 0 for ET_EXEC) is `addr`.
fn file_symbol_size(path: &str, base: u64, addr: u64) -> Option<u64> {
    let data = std::fs::read(path).ok()?;
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
fn load_bias(file: &object::File, base: u64) -> u64 {
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
/// `name`. Versioned lookups are answered by `dlvsym` only (the fallback
/// cannot tell symbol versions apart), so they return `None` here.
fn elf_fallback(name: &str, version: Option<&str>, lib: Option<&str>) -> Option<Symbol> {
    if version.is_some() {
        return None;
    }
    for (path, base) in loaded_objects() {
        if let Some(l) = lib {
            let tail_matches = path == l || path.ends_with(&format!("/{l}"));
            if !tail_matches {
                continue;
            }
        }
        let file_path = if path.is_empty() {
            "/proc/self/exe".to_string()
        } else {
            path.clone()
        };
        let defs = text_definitions(&file_path, base);
        if let Some(&(addr, size)) = defs.get(name) {
            return Some(Symbol {
                name: name.to_string(),
                addr,
                size: (size > 0).then_some(size),
            });
        }
    }
    None
}

/// Function name -> (run-time address, size).
type Definitions = HashMap<String, (u64, u64)>;

/// Run-time address and size of every function defined in the symbol
/// tables of the file at `path` loaded at `base`, parsed once per object:
/// looking up several names that an object does not export (an allocator's
/// entry points, C++ operators) would otherwise read and parse the whole
/// file for each, which every profiled process paid at start-up.
fn text_definitions(path: &str, base: u64) -> Arc<Definitions> {
    /// (path, load address) of each object parsed, with its definitions.
    type Parsed = ((String, u64), Arc<Definitions>);
    static CACHE: Mutex<Vec<Parsed>> = Mutex::new(Vec::new());
    let key = (path.to_string(), base);
    if let Some((_, d)) = CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
    {
        return d.clone();
    }
    let mut defs = HashMap::new();
    if let Ok(data) = std::fs::read(path) {
        if let Ok(file) = object::File::parse(&*data) {
            let bias = load_bias(&file, base);
            // The first definition of a name wins (.symtab before .dynsym).
            for s in file.symbols().chain(file.dynamic_symbols()) {
                if s.kind() == object::SymbolKind::Text && s.is_definition() {
                    if let Ok(n) = s.name() {
                        defs.entry(n.to_string())
                            .or_insert((s.address().wrapping_add(bias), s.size()));
                    }
                }
            }
        }
    }
    let d = Arc::new(defs);
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((key, d.clone()));
    d
}

/// (path, load address) of every object in the process, main program first
/// (its path is empty).
pub fn loaded_objects() -> Vec<(String, u64)> {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our Vec pointer.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<(String, u64)>)) };
        let name = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }
                .to_string_lossy()
                .into_owned()
        };
        // dlpi_addr is the bias; report the load address of the lowest PT_LOAD.
        let mut min_vaddr = u64::MAX;
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD {
                min_vaddr = min_vaddr.min(ph.p_vaddr);
            }
        }
        let base = if min_vaddr == u64::MAX {
            info.dlpi_addr
        } else {
            info.dlpi_addr + (min_vaddr & !0xfff)
        };
        out.push((name, base));
        0
    }
    let mut out: Vec<(String, u64)> = Vec::new();
    // SAFETY: the callback only writes into `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut out as *mut _ as *mut c_void) };
    out
}
