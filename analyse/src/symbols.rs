//! Built-in symbol resolution: names a return address given as (object file,
//! offset in the object), the way IgProf's `-g` does with nm, objdump and gdb,
//! but in-process with `object` and `addr2line` (no subprocesses).
//!
//! Owns: finding the object named in a profile (relative paths, `$PATH` for
//! bare names, symlinks; under a `--sysroot` first, for a profile of another
//! machine), its separate debug file (build id and
//! `.gnu_debuglink`, whose CRC must match, under the debug directories;
//! else by build id from debuginfod servers, see [`crate::debuginfod`];
//! `.gnu_debugaltlink`), and one cache per object. Order of lookup, chosen to
//! give IgProf's own names:
//! 1. the object's own `.symtab` (what `nm -n` shows; among aliases at one
//!    address the last name in `nm`'s order wins, as in IgProf);
//! 2. DWARF of the object or its debug file (what gdb prints: the function's
//!    linkage name, e.g. `__GI__IO_file_doallocate`, else its name);
//! 3. the debug file's `.symtab`, then the object's `.dynsym`;
//! 4. the name recorded in the profile (also used when the object is missing,
//!    or changed: the recorded dynamic symbol no longer covers the offset);
//! 5. for an address nothing names (code of a stripped object), IgProf's
//!    `@{object+offset}` with the offset of the start of the enclosing
//!    function, known from the call-frame descriptions (FDEs) of the
//!    object's `.eh_frame`, so that every address of that function is one
//!    entry (IgProf names each return address, and splits one function into
//!    as many entries as it has call sites); the return address itself where
//!    no FDE covers it.
//!
//! Code outside any object (JIT code, recorded with the object
//! [`UNKNOWN_OBJECT`]) is named from the perf map or jitdump of the
//! profiled process (see [`crate::jit`]; the process is set by
//! [`Resolver::begin_dump`]), else keeps its recorded name, `@?0x<address>`,
//! as IgProf shows it.
//!
//! Must never: run external programs, abort on a broken or foreign object
//! file (it is skipped and the recorded name is used), or read an object twice.

// gimli as addr2line uses it (its re-export keeps the two versions in step).
use addr2line::gimli::{self, UnwindSection};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};

/// The object path the profiler records for an address outside every
/// loaded object (JIT code, a stack that went astray); the offset is then
/// the address itself.
pub const UNKNOWN_OBJECT: &str = "<unknown>";

/// Where separate debug files are looked for when no `--debug-dir` is given,
/// and after those given.
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// How names are looked up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Look in the objects at all (off: recorded names only, like IgProf without -g).
    pub enabled: bool,
    /// Show each function inlined at an address as a frame of its own,
    /// below the function it is inlined into (from DWARF).
    pub inline: bool,
    /// Append the source file and line of the call site.
    pub lines: bool,
    /// Roots of separate debug files, searched in order (by build id:
    /// `DIR/.build-id/xx/yyyy.debug`; by `.gnu_debuglink`: `DIR/NAME` and
    /// `DIR/<object's directory>/NAME`).
    pub debug_dirs: Vec<PathBuf>,
    /// The root of the profiled machine's files (`--sysroot`): an absolute
    /// object path `P` of the profile is read from `ROOT/P` when that
    /// exists (symlinks followed inside the root), else from `P`.
    pub sysroot: Option<PathBuf>,
    /// With a sysroot: absolute object paths are read only there, never
    /// from this machine's files (`--sysroot-only`: reports that do not
    /// depend on what happens to exist at a recorded path here).
    pub sysroot_only: bool,
    /// Servers to fetch missing debug files from, by build id, after the
    /// debug directories (`DEBUGINFOD_URLS`).
    pub debuginfod: Option<crate::debuginfod::Config>,
    /// Where the JIT maps of profiled processes are (`--jit-map`).
    pub jit: crate::jit::Search,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            enabled: true,
            inline: false,
            lines: false,
            debug_dirs: vec![PathBuf::from(SYSTEM_DEBUG_DIR)],
            sysroot: None,
            sysroot_only: false,
            debuginfod: None,
            jit: crate::jit::Search::default(),
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
    /// Function ranges [start, end) at link-time addresses from the FDEs of
    /// `.eh_frame`, sorted by start; only for objects without `.symtab`
    /// (with one, every address has a name).
    functions: Vec<(u64, u64)>,
}

/// Resolves (object, offset) to a function name; one cache entry per object.
pub struct Resolver {
    options: Options,
    /// Keyed by the file read (on this machine).
    objects: FxHashMap<PathBuf, Option<ObjectSyms>>,
    /// Recorded object path -> (the path the report shows, the file to read).
    paths: FxHashMap<String, (String, PathBuf)>,
    debuginfod: Option<crate::debuginfod::Client>,
    /// Problems met while looking (debuginfod servers, JIT maps), for the
    /// caller to report: see [`Resolver::take_warnings`].
    warnings: Vec<String>,
    /// The process whose dump is being read, and the JIT map of each
    /// process met (loaded on its first address outside any object).
    process: Option<crate::jit::Process>,
    jit_maps: FxHashMap<crate::jit::Process, Option<crate::jit::JitMap>>,
}

/// The names of one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames {
    /// The function holding the address; with `--inline`, preceded by the
    /// functions it is inlined into (outermost first, the function of the
    /// object's symbol first, the innermost inlined function last).
    pub names: Vec<String>,
    /// The file the names come from when it is not the recorded object
    /// (the perf map or jitdump of JIT code).
    pub object: Option<String>,
}

/// Most symbolic links followed for one path (Linux's limit).
const MAX_LINKS: usize = 40;

/// `path` (absolute, as the profiled machine names it) resolved inside
/// `root` as a chroot would: `..` stops at the root and symbolic links are
/// followed with absolute targets taken from the root, not from this
/// machine. The result is the path inside the root, symlink-free; `None`
/// when no file is there.
fn resolve_under(root: &Path, path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut done = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            done.pop();
            continue;
        }
        let inside = done.join(&name);
        let host = root.join(inside.strip_prefix("/").ok()?);
        let meta = std::fs::symlink_metadata(&host).ok()?;
        if !meta.file_type().is_symlink() {
            done = inside;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return None;
        }
        let target = std::fs::read_link(&host).ok()?;
        if target.is_absolute() {
            done = PathBuf::from("/");
        }
        for c in target.components().rev() {
            match c {
                Component::Normal(n) => todo.push_front(n.to_os_string()),
                Component::ParentDir => todo.push_front("..".into()),
                _ => {}
            }
        }
    }
    root.join(done.strip_prefix("/").ok()?)
        .is_file()
        .then_some(done)
}

/// The paths under which `recorded` is looked for in `root`: the path
/// itself, then, when `root` is a Debian cross root `/usr/<triplet>` and
/// the path is in a multiarch directory of that triplet (`/lib/<triplet>/`
/// or `/usr/lib/<triplet>/`, where the native machine keeps its libraries),
/// the same file in `/lib/`, where the cross root keeps them.
fn sysroot_candidates(root: &Path, recorded: &Path) -> Vec<PathBuf> {
    let mut out = vec![recorded.to_path_buf()];
    if let Some(triplet) = root.file_name() {
        for dir in ["/lib", "/usr/lib"] {
            if let Ok(rest) = recorded.strip_prefix(Path::new(dir).join(triplet)) {
                out.push(Path::new("/lib").join(rest));
            }
        }
    }
    out
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

/// The separate debug file of `object` at `path`, with its contents:
/// through its build id under each debug dir, else through its
/// `.gnu_debuglink` (the object's directory, its `.debug/`, then each debug
/// dir and the object's directory under it), where a file only counts if
/// its CRC-32 is the one the link records (a debug file of another build
/// would name every address wrongly).
fn find_debug_file(
    file: &object::File<'_>,
    path: &Path,
    finder: &mut DebugFinder<'_>,
) -> Option<(PathBuf, Vec<u8>)> {
    let build_id = file.build_id().ok().flatten();
    if let Some(id) = build_id {
        for dir in finder.dirs {
            if let Some(p) = build_id_path(dir, id) {
                if let Ok(data) = std::fs::read(&p) {
                    return Some((p, data));
                }
            }
        }
    }
    if let Some(found) = find_debuglink_file(file, path, finder.dirs) {
        return Some(found);
    }
    let client = finder.debuginfod.as_mut()?;
    let (fetched, errors) = client.debuginfo(build_id?);
    finder
        .warnings
        .extend(errors.iter().map(ToString::to_string));
    let p = fetched?;
    let data = std::fs::read(&p).ok()?;
    Some((p, data))
}

/// Where separate debug files are looked for: the debug directories, then
/// the debuginfod servers (whose errors are noted in `warnings`).
struct DebugFinder<'a> {
    dirs: &'a [PathBuf],
    debuginfod: Option<&'a mut crate::debuginfod::Client>,
    warnings: &'a mut Vec<String>,
}

/// The `.gnu_debuglink` part of [`find_debug_file`].
fn find_debuglink_file(
    file: &object::File<'_>,
    path: &Path,
    debug_dirs: &[PathBuf],
) -> Option<(PathBuf, Vec<u8>)> {
    let (name, crc) = file.gnu_debuglink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
    for debug_dir in debug_dirs {
        candidates.push(debug_dir.join(name));
        candidates.push(debug_dir.join(rel).join(name));
    }
    candidates
        .into_iter()
        .filter(|c| c != path && c.is_file())
        .find_map(|c| {
            let data = std::fs::read(&c).ok()?;
            // The link's CRC is zlib's (and gzip's) CRC-32.
            let mut sum = flate2::Crc::new();
            sum.update(&data);
            (sum.sum() == crc).then_some((c, data))
        })
}

/// The `.gnu_debugaltlink` (dwz) file of a debug file, if any.
fn find_alt_file(file: &object::File<'_>, path: &Path, debug_dirs: &[PathBuf]) -> Option<PathBuf> {
    let data = file.section_by_name(".gnu_debugaltlink")?.data().ok()?;
    let nul = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..nul]).ok()?;
    let id = &data[nul + 1..];
    let cand = path.parent().unwrap_or(Path::new("/")).join(name);
    if cand.is_file() {
        return Some(cand);
    }
    debug_dirs
        .iter()
        .filter_map(|d| build_id_path(d, id))
        .find(|p| p.is_file())
}

/// The function ranges [start, end) the FDEs of `.eh_frame` describe, at
/// link-time addresses, sorted. Stops at the first entry it cannot parse
/// (what was read before stays usable).
fn fde_functions(file: &object::File<'_>) -> Vec<(u64, u64)> {
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.uncompressed_data() else {
        return Vec::new();
    };
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut eh_frame = gimli::EhFrame::new(&data, endian);
    eh_frame.set_address_size(if file.is_64() { 8 } else { 4 });
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    for (name, set) in [
        (".text", gimli::BaseAddresses::set_text as fn(_, _) -> _),
        (".got", gimli::BaseAddresses::set_got),
        (".eh_frame_hdr", gimli::BaseAddresses::set_eh_frame_hdr),
    ] {
        if let Some(s) = file.section_by_name(name) {
            bases = set(bases, s.address());
        }
    }
    let mut out = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        if let Ok(fde) =
            partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
        {
            let start = fde.initial_address();
            if fde.len() > 0 {
                out.push((start, start.saturating_add(fde.len())));
            }
        }
    }
    out.sort_unstable();
    out
}

/// The range in `functions` (sorted by start) that holds `addr`.
fn enclosing(functions: &[(u64, u64)], addr: u64) -> Option<(u64, u64)> {
    let i = functions.partition_point(|(start, _)| *start <= addr);
    let range = *functions.get(i.checked_sub(1)?)?;
    (addr < range.1).then_some(range)
}

fn has_dwarf(file: &object::File<'_>) -> bool {
    file.section_by_name(".debug_info")
        .map(|s| s.size() > 0)
        .unwrap_or(false)
}

fn load_object(path: &Path, finder: &mut DebugFinder<'_>) -> Option<ObjectSyms> {
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
    } else if let Some((dbg, dbg_data)) = find_debug_file(&file, path, finder) {
        if let Ok(dbg_file) = object::File::parse(&*dbg_data) {
            debug_symtab = nm_symbols(&dbg_file, false);
            if has_dwarf(&dbg_file) {
                let alt = find_alt_file(&dbg_file, &dbg, finder.dirs);
                dwarf_files = Some((dbg.clone(), alt));
            }
        }
    }
    let functions = if symtab.is_empty() {
        fde_functions(&file)
    } else {
        Vec::new()
    };
    Some(ObjectSyms {
        symtab,
        debug_symtab,
        dynsym,
        dwarf_files,
        dwarf: std::cell::OnceCell::new(),
        vmbase,
        functions,
    })
}

/// One function of the DWARF frames at an address.
struct DwarfFrame {
    name: Option<String>,
    /// Source file and line.
    line: Option<(String, u32)>,
}

/// `name`, with `lines`, followed by ` (file:line)` (the file's base name).
pub fn with_line(name: String, lines: bool, at: Option<&(String, u32)>) -> String {
    match (lines, at) {
        (true, Some((file, line))) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{name} ({base}:{line})")
        }
        _ => name,
    }
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
    /// The DWARF frames at `addr`, innermost first (the last is the
    /// function the code is in, the others are inlined into it): each
    /// function's linkage name and the source location in it.
    fn dwarf_frames(&self, addr: u64) -> Option<Vec<DwarfFrame>> {
        let dwarf = self
            .dwarf
            .get_or_init(|| {
                let (path, sup) = self.dwarf_files.as_ref()?;
                addr2line::Loader::new_with_sup(path, sup.as_deref()).ok()
            })
            .as_ref()?;
        let mut frames = dwarf.find_frames(addr).ok()?;
        let mut out = Vec::new();
        while let Ok(Some(f)) = frames.next() {
            out.push(DwarfFrame {
                name: f
                    .function
                    .as_ref()
                    .and_then(|func| func.raw_name().ok())
                    .map(|n| n.into_owned()),
                line: f
                    .location
                    .as_ref()
                    .and_then(|l| Some((l.file?.to_string(), l.line?))),
            });
        }
        Some(out)
    }

    /// The name of the function at `addr` from DWARF, with `--lines` the
    /// source line: of the innermost inlined code, or with `--inline`
    /// (where each inlined function is a frame of its own) of the call
    /// site of the outermost inlined function.
    fn dwarf_name(&self, addr: u64, opts: &Options) -> Option<String> {
        let frames = self.dwarf_frames(addr)?;
        let outer = frames.iter().rev().find(|f| f.name.is_some())?;
        let name = outer.name.clone()?;
        let line = if opts.inline {
            &outer.line
        } else {
            &frames.first()?.line
        };
        Some(with_line(name, opts.lines, line.as_ref()))
    }

    /// With `--inline`: the functions inlined at `offset`, outermost first
    /// (none without DWARF or inlining).
    fn inlined(&self, offset: u64, opts: &Options) -> Vec<String> {
        let Some(frames) = self.dwarf_frames(offset.wrapping_add(self.vmbase)) else {
            return Vec::new();
        };
        let Some(outer) = frames.iter().rposition(|f| f.name.is_some()) else {
            return Vec::new();
        };
        frames[..outer]
            .iter()
            .rev()
            .filter_map(|f| Some(with_line(f.name.clone()?, opts.lines, f.line.as_ref())))
            .collect()
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

    /// The offset of the start of the function that holds `offset`, from
    /// the FDEs (objects without `.symtab` only).
    fn function_start(&self, offset: u64) -> Option<u64> {
        let (start, _) = enclosing(&self.functions, offset.wrapping_add(self.vmbase))?;
        Some(start.wrapping_sub(self.vmbase))
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
        let debuginfod = options
            .debuginfod
            .clone()
            .map(crate::debuginfod::Client::new);
        Resolver {
            options,
            objects: FxHashMap::default(),
            paths: FxHashMap::default(),
            debuginfod,
            warnings: Vec::new(),
            process: None,
            jit_maps: FxHashMap::default(),
        }
    }

    /// Whether each inlined function is a frame of its own (`--inline`).
    pub fn inline(&self) -> bool {
        self.options.inline
    }

    /// The dump read next is of this process: its code outside any object
    /// is named from its JIT maps.
    pub fn begin_dump(&mut self, process: crate::jit::Process) {
        self.process = Some(process);
    }

    /// The name of JIT code at `addr` from the current process's maps.
    fn jit_name(&mut self, addr: u64) -> Option<(String, String)> {
        let p = self.process.as_ref()?;
        if !self.jit_maps.contains_key(p) {
            let (map, warnings) = crate::jit::find(&self.options.jit, p);
            self.warnings.extend(warnings);
            self.jit_maps.insert(p.clone(), map);
        }
        let found = self.jit_maps.get(p)?.as_ref()?.lookup(addr)?;
        let line = found.line.map(|(f, l)| (f.to_string(), l));
        let name = with_line(found.name.to_string(), self.options.lines, line.as_ref());
        Some((name, found.source.to_string()))
    }

    /// The absolute, symlink-free path IgProf uses for a recorded object path:
    /// bare names are searched in `$PATH`; unreadable paths stay as recorded.
    /// An object found under the sysroot is shown by its path there (as the
    /// profiled machine names it).
    pub fn canonical_path(&mut self, recorded: &str) -> String {
        self.locate(recorded).0.clone()
    }

    /// The path shown for `recorded`, and the file to read for it.
    fn locate(&mut self, recorded: &str) -> &(String, PathBuf) {
        if !self.paths.contains_key(recorded) {
            let found = self.find(recorded);
            self.paths.insert(recorded.to_string(), found);
        }
        &self.paths[recorded]
    }

    fn find(&self, recorded: &str) -> (String, PathBuf) {
        if recorded == UNKNOWN_OBJECT {
            return (recorded.to_string(), PathBuf::from(recorded));
        }
        if recorded.is_empty() {
            let shown = "<dynamically generated>".to_string();
            return (shown.clone(), PathBuf::from(shown));
        }
        if let (Some(root), true) = (&self.options.sysroot, recorded.starts_with('/')) {
            for c in sysroot_candidates(root, Path::new(recorded)) {
                if let Some(inside) = resolve_under(root, &c) {
                    let file = root.join(inside.strip_prefix("/").unwrap_or(&inside));
                    return (inside.to_string_lossy().into_owned(), file);
                }
            }
            if self.options.sysroot_only {
                // Not under the root: unreadable, named as recorded.
                let missing = root.join(recorded.trim_start_matches('/'));
                return (recorded.to_string(), missing);
            }
        }
        let mut candidate = PathBuf::from(recorded);
        if !recorded.contains('/') {
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
        match std::fs::canonicalize(&candidate) {
            Ok(p) => (p.to_string_lossy().into_owned(), p),
            Err(_) => (recorded.to_string(), PathBuf::from(recorded)),
        }
    }

    /// The problems met since the last call (one line each).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// The name of the function at `offset` in object `recorded_path`,
    /// falling back to the `recorded` name from the profile.
    pub fn resolve(&mut self, recorded_path: &str, offset: i64, recorded: &str) -> String {
        self.frames(recorded_path, offset, recorded, false)
            .names
            .swap_remove(0)
    }

    /// The names of the code at `offset` in object `recorded_path`
    /// (see [`Frames`]).
    pub fn frames(
        &mut self,
        recorded_path: &str,
        offset: i64,
        recorded: &str,
        return_address: bool,
    ) -> Frames {
        if recorded_path == UNKNOWN_OBJECT {
            if self.options.enabled && offset > 0 {
                if let Some((name, object)) = self.jit_name(offset as u64) {
                    return Frames {
                        names: vec![name],
                        object: Some(object),
                    };
                }
            }
            return Frames {
                names: vec![recorded.to_string()],
                object: None,
            };
        }
        Frames {
            names: self.resolve_object(recorded_path, offset, recorded, return_address),
            object: None,
        }
    }

    fn resolve_object(
        &mut self,
        recorded_path: &str,
        offset: i64,
        recorded: &str,
        return_address: bool,
    ) -> Vec<String> {
        if self.options.enabled && offset >= 0 && !recorded_path.is_empty() {
            // With --inline, a return address is looked up one byte back:
            // the functions inlined there are those of the call, not of the
            // code after it (perf does the same).
            let at = if self.options.inline && return_address && offset > 0 {
                offset as u64 - 1
            } else {
                offset as u64
            };
            let file = self.locate(recorded_path).1.clone();
            let mut finder = DebugFinder {
                dirs: &self.options.debug_dirs,
                debuginfod: self.debuginfod.as_mut(),
                warnings: &mut self.warnings,
            };
            let syms = self
                .objects
                .entry(file)
                .or_insert_with_key(|file| load_object(file, &mut finder));
            if let Some(syms) = syms {
                if let Some(n) = syms.name(at, recorded, &self.options) {
                    let mut names = vec![n];
                    if self.options.inline {
                        names.extend(syms.inlined(at, &self.options));
                    }
                    return names;
                }
                if recorded.starts_with("@?") {
                    if let Some(start) = syms.function_start(offset as u64) {
                        return vec![unresolved_name(recorded_path, start as i64, recorded)];
                    }
                }
            }
        }
        vec![unresolved_name(recorded_path, offset, recorded)]
    }
}

/// Demangles C++ (`_Z...`), Rust (legacy and v0) and gfortran's module
/// procedure names (`__work_MOD_churn` -> `work::churn`), keeping IgProf's
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
    if let Some(d) = fortran_module_procedure(base) {
        return format!("{d}{suffix}");
    }
    name.to_string()
}

/// gfortran's name of a module procedure, `__<module>_MOD_<procedure>`
/// (both lower-case Fortran names), as `module::procedure`.
fn fortran_module_procedure(name: &str) -> Option<String> {
    let (module, procedure) = name.strip_prefix("__")?.split_once("_MOD_")?;
    let fortran_name = |s: &str| {
        s.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    (fortran_name(module) && fortran_name(procedure)).then(|| format!("{module}::{procedure}"))
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
        assert_eq!(demangle("__work_MOD_hot_a"), "work::hot_a");
        assert_eq!(demangle("__work_MOD_churn'2"), "work::churn'2");
        assert_eq!(demangle("__my_mod2_MOD_f"), "my_mod2::f");
        // Not gfortran's: unchanged.
        for other in [
            "__x_MOD_",
            "___MOD_f",
            "__X_MOD_f",
            "__libc_MOD_f(int)",
            "MAIN__",
        ] {
            assert_eq!(demangle(other), other);
        }
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
    fn addresses_map_to_the_fde_range_that_holds_them() {
        let f = vec![(0x100, 0x180), (0x180, 0x200), (0x300, 0x340)];
        assert_eq!(enclosing(&f, 0x100), Some((0x100, 0x180)));
        assert_eq!(enclosing(&f, 0x17f), Some((0x100, 0x180)));
        assert_eq!(enclosing(&f, 0x180), Some((0x180, 0x200)));
        // Between functions, before the first and after the last: none.
        assert_eq!(enclosing(&f, 0x250), None);
        assert_eq!(enclosing(&f, 0xff), None);
        assert_eq!(enclosing(&f, 0x340), None);
        assert_eq!(enclosing(&[], 0x100), None);
    }

    #[test]
    fn code_outside_any_object_keeps_its_recorded_address() {
        let mut r = Resolver::new(Options::default());
        assert_eq!(
            r.resolve(UNKNOWN_OBJECT, 0x7f29_ccee_dd70, "@?0x7f29cceedd70"),
            "@?0x7f29cceedd70"
        );
        assert_eq!(r.canonical_path(UNKNOWN_OBJECT), UNKNOWN_OBJECT);
    }

    #[test]
    fn paths_resolve_inside_the_sysroot_as_a_chroot_would() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib/x")).unwrap();
        std::fs::write(r.join("usr/lib/x/libz.so.1.3"), b"").unwrap();
        // Merged /usr (relative), a versioned link (relative) and a link
        // with an absolute target, which means the root's /usr, not ours.
        std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
        std::os::unix::fs::symlink("libz.so.1.3", r.join("usr/lib/x/libz.so.1")).unwrap();
        std::os::unix::fs::symlink("/usr/lib/x/libz.so.1", r.join("usr/lib/x/libz.so")).unwrap();
        std::os::unix::fs::symlink("loop", r.join("loop")).unwrap();
        let inside = |p: &str| resolve_under(r, Path::new(p));
        let z = Some(PathBuf::from("/usr/lib/x/libz.so.1.3"));
        assert_eq!(inside("/lib/x/libz.so.1"), z);
        assert_eq!(inside("/usr/lib/x/libz.so"), z);
        assert_eq!(inside("/lib/x/../x/libz.so"), z);
        // `..` stops at the root.
        assert_eq!(inside("/../../lib/x/libz.so.1"), z);
        assert_eq!(inside("/lib/x/libc.so.6"), None);
        assert_eq!(inside("/lib/x"), None, "directories are not objects");
        assert_eq!(inside("/loop"), None);
    }

    #[test]
    fn a_debian_cross_root_keeps_multiarch_libraries_in_lib() {
        let root = Path::new("/usr/aarch64-linux-gnu");
        let c = |p: &str| sysroot_candidates(root, Path::new(p));
        assert_eq!(
            c("/lib/aarch64-linux-gnu/libc.so.6"),
            [
                PathBuf::from("/lib/aarch64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/libc.so.6")
            ]
        );
        assert_eq!(
            c("/usr/lib/aarch64-linux-gnu/libstdc++.so.6")[1],
            PathBuf::from("/lib/libstdc++.so.6")
        );
        // Another triplet's directory, or none: only the path itself.
        assert_eq!(c("/lib/x86_64-linux-gnu/libc.so.6").len(), 1);
        assert_eq!(c("/lib/libc.so.6"), [PathBuf::from("/lib/libc.so.6")]);
    }

    #[test]
    fn objects_missing_from_the_sysroot_are_read_from_their_path() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("lib")).unwrap();
        std::fs::write(root.path().join("lib/libfoo.so"), b"").unwrap();
        let host = tempfile::tempdir().unwrap();
        let bar = host.path().join("libbar.so");
        std::fs::write(&bar, b"").unwrap();
        let mut res = Resolver::new(Options {
            sysroot: Some(root.path().to_path_buf()),
            ..Options::default()
        });
        assert_eq!(res.canonical_path("/lib/libfoo.so"), "/lib/libfoo.so");
        assert_eq!(
            res.locate("/lib/libfoo.so").1,
            root.path().join("lib/libfoo.so")
        );
        let bar_real = std::fs::canonicalize(&bar).unwrap();
        assert_eq!(res.locate(bar.to_str().unwrap()).1, bar_real);
        assert_eq!(res.canonical_path("/nowhere/libx.so"), "/nowhere/libx.so");
        // --sysroot-only: a file of this machine is never read.
        let mut only = Resolver::new(Options {
            sysroot: Some(root.path().to_path_buf()),
            sysroot_only: true,
            ..Options::default()
        });
        assert_eq!(
            only.locate("/lib/libfoo.so").1,
            root.path().join("lib/libfoo.so")
        );
        let (shown, file) = only.locate(bar.to_str().unwrap()).clone();
        assert_eq!(shown, bar.to_str().unwrap());
        assert!(file.starts_with(root.path()) && !file.exists(), "{file:?}");
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
