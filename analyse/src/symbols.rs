//! Built-in symbol resolution: names a return address given as (object file,
//! offset in the object), the way IgProf's `-g` does with nm, objdump and gdb,
//! but in-process with `object` and `addr2line` (no subprocesses).
//!
//! Owns: finding the object named in a profile (relative paths, `$PATH` for
//! bare names, symlinks), its separate debug file (build id and
//! `.gnu_debuglink` under the debug directory, `.gnu_debugaltlink`), and one
//! cache per object. Order of lookup, chosen to give IgProf's own names:
//! 1. the object's own `.symtab` (what `nm -n` shows; among aliases at one
//!    address the last name in `nm`'s order wins, as in IgProf);
//! 2. DWARF of the object or its debug file (what gdb prints: the function's
//!    linkage name, e.g. `__GI__IO_file_doallocate`, else its name);
//! 3. the debug file's `.symtab`, then the object's `.dynsym`;
//! 4. the name recorded in the profile (also used when the object is missing,
//!    or changed: the recorded dynamic symbol no longer covers the offset).
//!
//! Must never: run external programs, abort on a broken or foreign object
//! file (it is skipped and the recorded name is used), or read an object twice.

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};

/// How names are looked up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Look in the objects at all (off: recorded names only, like IgProf without -g).
    pub enabled: bool,
    /// Name a frame by the innermost inlined function at the address, with
    /// the chain of functions it was inlined into.
    pub inline: bool,
    /// Append the source file and line of the call site.
    pub lines: bool,
    /// Root of separate debug files (`/usr/lib/debug`).
    pub debug_dir: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            enabled: true,
            inline: false,
            lines: false,
            debug_dir: PathBuf::from("/usr/lib/debug"),
        }
    }
}

/// Symbols of one object file, loaded once.
struct ObjectSyms {
    /// `.symtab` of the object itself as (address, name), sorted, one name per address.
    symtab: Vec<(u64, String)>,
    /// `.symtab` of the separate debug file, same shape.
    debug_symtab: Vec<(u64, String)>,
    /// Function symbols of `.dynsym` as (address, size, name), sorted.
    dynsym: Vec<(u64, u64, String)>,
    /// DWARF of the object or of its debug file.
    /// Where the DWARF is (object or debug file, and its dwz supplement);
    /// loaded on first use, as many lookups never need it.
    dwarf_files: Option<(PathBuf, Option<PathBuf>)>,
    dwarf: std::cell::OnceCell<Option<addr2line::Loader>>,
    /// Link-time address of file offset 0 (first PT_LOAD vaddr - offset).
    vmbase: u64,
}

/// Resolves (object, offset) to a function name; one cache entry per object.
pub struct Resolver {
    options: Options,
    objects: FxHashMap<String, Option<ObjectSyms>>,
    paths: FxHashMap<String, String>,
}

/// `.symtab`-like symbols as `nm -n` lists them: defined, named, not file or
/// section symbols, not starting with '.'. Ties keep the greatest name, as
/// IgProf keeps the last of nm's name-sorted aliases.
fn nm_symbols(file: &object::File<'_>, dynamic: bool) -> Vec<(u64, String)> {
    let iter: Box<dyn Iterator<Item = object::Symbol<'_, '_>>> = if dynamic {
        Box::new(file.dynamic_symbols())
    } else {
        Box::new(file.symbols())
    };
    let mut v: Vec<(u64, String)> = iter
        .filter(|s| {
            s.is_definition() || s.kind() == SymbolKind::Data || s.kind() == SymbolKind::Text
        })
        .filter(|s| {
            !s.is_undefined() && !matches!(s.kind(), SymbolKind::File | SymbolKind::Section)
        })
        .filter_map(|s| {
            let name = s.name().ok()?;
            if name.is_empty() || name.starts_with('.') {
                return None;
            }
            Some((s.address(), name.to_string()))
        })
        .collect();
    v.sort();
    // Keep, for each address, the last (greatest) name.
    let mut out: Vec<(u64, String)> = Vec::with_capacity(v.len());
    for (a, n) in v {
        match out.last_mut() {
            Some(last) if last.0 == a => last.1 = n,
            _ => out.push((a, n)),
        }
    }
    out
}

/// IgProf's `symbolByOffset`: the symbol at or before `addr`, or the first.
fn by_offset(table: &[(u64, String)], addr: u64) -> Option<&str> {
    if table.is_empty() {
        return None;
    }
    let i = table.partition_point(|(a, _)| *a <= addr);
    Some(&table[i.saturating_sub(1)].1)
}

fn build_id_path(debug_dir: &Path, id: &[u8]) -> Option<PathBuf> {
    if id.len() < 2 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Some(
        debug_dir
            .join(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..])),
    )
}

/// The separate debug file of `object` at `path`, through its build id or
/// `.gnu_debuglink` (same directory, `.debug/`, or under the debug dir).
fn find_debug_file(file: &object::File<'_>, path: &Path, debug_dir: &Path) -> Option<PathBuf> {
    if let Ok(Some(id)) = file.build_id() {
        if let Some(p) = build_id_path(debug_dir, id) {
            if p.is_file() {
                return Some(p);
            }
        }
    }
    if let Ok(Some((name, _crc))) = file.gnu_debuglink() {
        let name = std::str::from_utf8(name).ok()?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        for cand in [
            dir.join(name),
            dir.join(".debug").join(name),
            debug_dir.join(rel).join(name),
        ] {
            if cand.is_file() && cand != path {
                return Some(cand);
            }
        }
    }
    None
}

/// The `.gnu_debugaltlink` (dwz) file of a debug file, if any.
fn find_alt_file(file: &object::File<'_>, path: &Path, debug_dir: &Path) -> Option<PathBuf> {
    let data = file.section_by_name(".gnu_debugaltlink")?.data().ok()?;
    let nul = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..nul]).ok()?;
    let id = &data[nul + 1..];
    let cand = path.parent().unwrap_or(Path::new("/")).join(name);
    if cand.is_file() {
        return Some(cand);
    }
    build_id_path(debug_dir, id).filter(|p| p.is_file())
}

fn has_dwarf(file: &object::File<'_>) -> bool {
    file.section_by_name(".debug_info")
        .map(|s| s.size() > 0)
        .unwrap_or(false)
}

fn load_object(path: &Path, debug_dir: &Path) -> Option<ObjectSyms> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let vmbase = file
        .segments()
        .next()
        .map(|s| s.address().wrapping_sub(s.file_range().0))
        .unwrap_or(0);
    let symtab = nm_symbols(&file, false);
    let mut dynsym: Vec<(u64, u64, String)> = file
        .dynamic_symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect();
    dynsym.sort();
    let mut debug_symtab = Vec::new();
    let mut dwarf_files = None;
    if has_dwarf(&file) {
        dwarf_files = Some((path.to_path_buf(), None));
    } else if let Some(dbg) = find_debug_file(&file, path, debug_dir) {
        if let Ok(dbg_data) = std::fs::read(&dbg) {
            if let Ok(dbg_file) = object::File::parse(&*dbg_data) {
                debug_symtab = nm_symbols(&dbg_file, false);
                if has_dwarf(&dbg_file) {
                    let alt = find_alt_file(&dbg_file, &dbg, debug_dir);
                    dwarf_files = Some((dbg.clone(), alt));
                }
            }
        }
    }
    Some(ObjectSyms {
        symtab,
        debug_symtab,
        dynsym,
        dwarf_files,
        dwarf: std::cell::OnceCell::new(),
        vmbase,
    })
}

/// IgProf's name for an address nothing could resolve: `@{libc.so.6+1234}`.
pub fn unresolved_name(path: &str, offset: i64, recorded: &str) -> String {
    if !(recorded.starts_with("@?") && offset > 0) {
        return recorded.to_string();
    }
    if path.is_empty() {
        return format!("@?{offset:#x}{{<dynamically-generated>}}");
    }
    let base = path.rsplit('/').next().unwrap_or(path);
    format!("@{{{base}+{offset}}}")
}

impl ObjectSyms {
    fn dwarf_name(&self, addr: u64, opts: &Options) -> Option<String> {
        let dwarf = self
            .dwarf
            .get_or_init(|| {
                let (path, sup) = self.dwarf_files.as_ref()?;
                addr2line::Loader::new_with_sup(path, sup.as_deref()).ok()
            })
            .as_ref()?;
        let mut frames = dwarf.find_frames(addr).ok()?;
        let mut names: Vec<String> = Vec::new();
        let mut first_line = None;
        while let Ok(Some(f)) = frames.next() {
            if let Some(func) = f.function.as_ref() {
                if let Ok(n) = func.raw_name() {
                    names.push(n.into_owned());
                }
            }
            if first_line.is_none() {
                first_line = f
                    .location
                    .as_ref()
                    .and_then(|l| Some((l.file?.to_string(), l.line?)));
            }
        }
        // Frames come innermost first; the last one is the real function.
        let mut name = if opts.inline && names.len() > 1 {
            let inner = names[0].clone();
            format!("{inner} [inlined into {}]", names[1..].join(" < "))
        } else {
            names.pop()?
        };
        if opts.lines {
            if let Some((file, line)) = first_line {
                let base = file.rsplit('/').next().unwrap_or(&file).to_string();
                name = format!("{name} ({base}:{line})");
            }
        }
        Some(name)
    }

    /// False when the recorded dynamic symbol exists but does not cover
    /// `addr`: the object on disk is not the one that was profiled.
    fn matches_recorded(&self, addr: u64, recorded: &str) -> bool {
        if recorded.starts_with("@?") {
            return true;
        }
        let mut found = false;
        for (a, size, n) in &self.dynsym {
            if n == recorded {
                found = true;
                if *a <= addr && addr < a + (*size).max(1) {
                    return true;
                }
            }
        }
        !found
    }

    fn name(&self, offset: u64, recorded: &str, opts: &Options) -> Option<String> {
        let addr = offset.wrapping_add(self.vmbase);
        if !self.matches_recorded(addr, recorded) {
            return None;
        }
        if !(self.symtab.is_empty() || opts.inline || opts.lines) {
            return by_offset(&self.symtab, addr).map(str::to_string);
        }
        if let Some(n) = self.dwarf_name(addr, opts) {
            return Some(n);
        }
        if let Some(n) =
            by_offset(&self.symtab, addr).or_else(|| by_offset(&self.debug_symtab, addr))
        {
            return Some(n.to_string());
        }
        let i = self.dynsym.partition_point(|(a, _, _)| *a <= addr);
        let (a, size, n) = self.dynsym.get(i.checked_sub(1)?)?;
        (addr < a + (*size).max(1)).then(|| n.clone())
    }
}

impl Resolver {
    pub fn new(options: Options) -> Self {
        Resolver {
            options,
            objects: FxHashMap::default(),
            paths: FxHashMap::default(),
        }
    }

    /// The absolute, symlink-free path IgProf uses for a recorded object path:
    /// bare names are searched in `$PATH`; unreadable paths stay as recorded.
    pub fn canonical_path(&mut self, recorded: &str) -> String {
        if let Some(p) = self.paths.get(recorded) {
            return p.clone();
        }
        let mut candidate = PathBuf::from(recorded);
        if !recorded.is_empty() && !recorded.contains('/') {
            if let Some(path) = std::env::var_os("PATH") {
                for dir in std::env::split_paths(&path) {
                    let dir = if dir.as_os_str().is_empty() {
                        PathBuf::from(".")
                    } else {
                        dir
                    };
                    let c = dir.join(recorded);
                    if c.is_file() {
                        candidate = c;
                        break;
                    }
                }
            }
        }
        let out = if recorded.is_empty() {
            "<dynamically generated>".to_string()
        } else {
            match std::fs::canonicalize(&candidate) {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(_) => recorded.to_string(),
            }
        };
        self.paths.insert(recorded.to_string(), out.clone());
        out
    }

    /// The name of the function at `offset` in object `recorded_path`,
    /// falling back to the `recorded` name from the profile.
    pub fn resolve(&mut self, recorded_path: &str, offset: i64, recorded: &str) -> String {
        if self.options.enabled && offset >= 0 && !recorded_path.is_empty() {
            let path = self.canonical_path(recorded_path);
            let debug_dir = self.options.debug_dir.clone();
            let syms = self
                .objects
                .entry(path.clone())
                .or_insert_with(|| load_object(Path::new(&path), &debug_dir));
            if let Some(syms) = syms {
                if let Some(n) = syms.name(offset as u64, recorded, &self.options) {
                    return n;
                }
            }
        }
        unresolved_name(recorded_path, offset, recorded)
    }
}

/// Demangles C++ (`_Z...`) and Rust (legacy and v0) names, keeping IgProf's
/// recursion suffix (`name'2`) intact; other names are returned unchanged.
pub fn demangle(name: &str) -> String {
    let (base, suffix) = match name.rfind('\'') {
        Some(i) if name[i + 1..].bytes().all(|b| b.is_ascii_digit()) && i + 1 < name.len() => {
            name.split_at(i)
        }
        _ => (name, ""),
    };
    if let Ok(d) = rustc_demangle::try_demangle(base) {
        return format!("{d:#}{suffix}");
    }
    if base.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(base) {
            if let Ok(d) = sym.demangle(&cpp_demangle::DemangleOptions::default()) {
                return format!("{d}{suffix}");
            }
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_cpp_and_rust_and_keeps_recursion_suffix() {
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(demangle("_Z3fooi'3"), "foo(int)'3");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_4test4main"), "test::main");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("recurse'2"), "recurse'2");
    }

    #[test]
    fn unresolved_names_follow_igprof() {
        assert_eq!(
            unresolved_name("/lib/libc.so.6", 1234, "@?0x7f00"),
            "@{libc.so.6+1234}"
        );
        assert_eq!(unresolved_name("/lib/libc.so.6", 1234, "printf"), "printf");
        assert_eq!(
            unresolved_name("", 16, "@?0x10"),
            "@?0x10{<dynamically-generated>}"
        );
    }

    #[test]
    fn by_offset_is_igprofs_symbol_by_offset() {
        let t = vec![(0x10, "a".to_string()), (0x20, "b".to_string())];
        assert_eq!(by_offset(&t, 0x5), Some("a"));
        assert_eq!(by_offset(&t, 0x10), Some("a"));
        assert_eq!(by_offset(&t, 0x1f), Some("a"));
        assert_eq!(by_offset(&t, 0x20), Some("b"));
        assert_eq!(by_offset(&t, 0x9999), Some("b"));
        assert_eq!(by_offset(&[], 1), None);
    }
}
