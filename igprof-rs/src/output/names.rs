//! Naming code addresses at dump time: which loaded object holds an
//! address and which symbol covers it, with the answers glibc's `dladdr`
//! gives, from one pass over each object's symbols per dump.
//!
//! `dladdr` walks an object's whole dynamic symbol table for every address
//! (13% of the CPU time of a profiled cc1plus, 77% of its `-mp` dump). Here
//! the addresses of a dump are named in one `dl_iterate_phdr` pass: for
//! each object that holds some of them, one pass over the `.dynsym` entries
//! `dladdr` considers (found through the object's hash table, in the order
//! `dladdr` visits them) offers each symbol to the addresses it covers
//! (`value <= addr < value + max(size, 1)`, a binary search into the
//! sorted addresses); an address keeps the greatest value, the first
//! visited among equals: `dladdr`'s rule, so a name it gives is the name
//! given here.
//! An address `dladdr` leaves unnamed is named from the object file's
//! `.symtab` (the file mapped read-only, one pass over its function
//! symbols) when the file on disk is the one loaded (same program headers
//! and notes) and has one; otherwise it stays unnamed (`@?0x...` in the
//! profile, named later by the analyser from object and offset). The main
//! program's path is `dladdr`'s (the loader's `argv[0]`) when absolute,
//! else the executable's; the vDSO keeps its own name.
//!
//! Owns: the object list of a dump (path, base address as `dli_fbase`),
//! naming from each object's dynamic symbols, and reading `.symtab` from
//! object files.
//! Everything that reads the loader's memory happens inside the
//! `dl_iterate_phdr` callback, whose lock keeps each object mapped while it
//! is read (`dlclose` unmaps only after taking the object off that list);
//! the keeper, after the program's end, lists the objects from the
//! unwinder's module table instead, without that lock ([`each_object`]).
//!
//! Must never: run in a signal handler or a hook (it allocates, reads
//! files and calls `dladdr`), call `dladdr`/`dlopen`/`dlclose` inside the
//! `dl_iterate_phdr` callback (lock-order inversion with a concurrent
//! `dlclose`), or read loader memory outside an object's readable segments.

use trampoline::image::{dynsym_names, Image, SHN_ABS, SHN_UNDEF, SYM_SIZE};

/// An object that holds some of the named addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Lowest mapped address of the object (`dladdr`'s `dli_fbase`): the
    /// file key of the profile and the origin of object offsets.
    pub base: usize,
    /// The object's path as `dladdr` reports it; for the main program,
    /// the executable's absolute path when the loader's is not absolute.
    pub path: Vec<u8>,
}

/// The symbol that covers an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Its run-time address (`dli_saddr`).
    pub addr: usize,
    pub name: Vec<u8>,
}

/// Where an address was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The object's dynamic symbols, as `dladdr` names it.
    Dynsym,
    /// The object file's `.symtab` (`dladdr` has no name for it).
    Symtab,
}

/// The names of a dump's addresses.
///
/// Kept as the naming pass made them, in arrays beside the sorted
/// addresses and looked up by binary search: a hash table of them held a
/// small compiler's 3,700 names in 456 KiB, twice what they take here, in
/// the memory of a dump that often sets the process's peak.
#[derive(Default)]
pub struct Names {
    objects: Vec<Object>,
    /// Every address asked for, sorted, unique.
    addrs: Vec<usize>,
    /// Per address: its object's index in `objects` (`NO_OBJECT`: none).
    owner: Vec<u32>,
    /// Per address: its symbol, when it has one.
    syms: Vec<Option<(Symbol, Source)>>,
    /// Objects whose `.symtab` could not be used, and why (for `-d`).
    pub symtab_errors: Vec<(Vec<u8>, SymtabError)>,
    /// Bytes of the objects' symbol tables that the naming faulted in and
    /// gave back (`base::resident`).
    pub given_back: usize,
}

impl Names {
    /// The object and symbol of `addr`; None when no loaded object holds it.
    pub fn get(&self, addr: usize) -> Option<(&Object, Option<&Symbol>)> {
        let i = self.index(addr)?;
        Some((
            &self.objects[self.owner[i] as usize],
            self.syms[i].as_ref().map(|(s, _)| s),
        ))
    }

    /// How many addresses were named (with or without a symbol).
    pub fn len(&self) -> usize {
        self.owner.iter().filter(|&&o| o != NO_OBJECT).count()
    }

    /// Whether no address was named.
    pub fn is_empty(&self) -> bool {
        self.owner.iter().all(|&o| o == NO_OBJECT)
    }

    /// As [`Self::get`], with where the symbol came from.
    pub fn source(&self, addr: usize) -> Option<Source> {
        self.syms[self.index(addr)?].as_ref().map(|(_, k)| *k)
    }

    /// Where `addr` is in the arrays, when an object holds it.
    fn index(&self, addr: usize) -> Option<usize> {
        let i = self.addrs.binary_search(&addr).ok()?;
        (self.owner[i] != NO_OBJECT).then_some(i)
    }
}

/// Names every address of `addrs` (any order, duplicates allowed). `exe` is
/// the executable's absolute path (`/proc/self/exe`).
pub fn name_all(addrs: &[usize], exe: &[u8]) -> Names {
    let mut sorted = addrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut pass = Pass {
        addrs: &sorted,
        owner: vec![NO_OBJECT; sorted.len()],
        syms: vec![None; sorted.len()],
        objects: Vec::new(),
        files: Vec::new(),
        main_path: main_program_path(exe),
        seen: 0,
        page: crate::sys::page_size(),
        pagemap: crate::base::resident::Pagemap::open(),
        given_back: 0,
    };
    each_object(collect, &mut pass as *mut Pass as *mut libc::c_void);
    let Pass {
        mut owner,
        mut syms,
        objects,
        files,
        given_back,
        ..
    } = pass;
    let mut symtab_errors = Vec::new();
    // Addresses dladdr leaves unnamed, from the files' .symtab.
    for f in files {
        let file_path = if f.object == 0 {
            exe
        } else {
            &objects[f.object].path[..]
        };
        let wanted: Vec<usize> = f.addrs.iter().map(|&i| sorted[i]).collect();
        match symtab_names(file_path, &f, &wanted) {
            Ok(found) => {
                for (&i, s) in f.addrs.iter().zip(found) {
                    syms[i] = s.map(|s| (s, Source::Symtab));
                }
            }
            Err(SymtabError::NoSymtab) => {}
            Err(e) => symtab_errors.push((file_path.to_vec(), e)),
        }
    }
    // Only the objects that hold some address are kept, in the order of
    // their first address.
    let mut index = vec![NO_OBJECT; objects.len()];
    let mut kept = Vec::new();
    for o in owner.iter_mut().filter(|o| **o != NO_OBJECT) {
        if index[*o as usize] == NO_OBJECT {
            index[*o as usize] = kept.len() as u32;
            kept.push(objects[*o as usize].clone());
        }
        *o = index[*o as usize];
    }
    Names {
        objects: kept,
        addrs: sorted,
        owner,
        syms,
        symtab_errors,
        given_back,
    }
}

const NO_OBJECT: u32 = u32::MAX;

/// A `dl_iterate_phdr` callback.
type EachObject =
    unsafe extern "C" fn(*mut libc::dl_phdr_info, usize, *mut libc::c_void) -> libc::c_int;

/// Calls `cb` with `data` for every loaded object, in the loader's order,
/// as `dl_iterate_phdr` does (until `cb` returns non-zero). In the keeper's
/// dump after the program's end, from the unwinder's module table instead
/// (`unwind::listed_objects`): a thread of the program killed inside
/// `dl_iterate_phdr` or `dlopen` holds the loader's lock for ever, and the
/// objects stay mapped with nothing left to unload them, but for one a
/// thread killed inside `dlclose` had unmapped before the table heard of
/// it: left out (reading it killed the keeper, and the profile with it).
fn each_object(cb: EachObject, data: *mut libc::c_void) {
    if crate::sys::abandoned() {
        for mut info in crate::unwind::listed_objects()
            .into_iter()
            .filter(still_mapped)
        {
            // SAFETY: a record as dl_iterate_phdr passes it, pointing into
            // objects that stay loaded; `data` is the caller's.
            if unsafe { cb(&mut info, core::mem::size_of::<libc::dl_phdr_info>(), data) } != 0 {
                break;
            }
        }
    } else {
        // SAFETY: the caller's callback and data, as dl_iterate_phdr takes them.
        unsafe { libc::dl_iterate_phdr(Some(cb), data) };
    }
}

/// Whether the loadable segments of the object `info` describes (and its
/// program headers) are all mapped.
fn still_mapped(info: &libc::dl_phdr_info) -> bool {
    let n = info.dlpi_phnum as usize;
    let phdr_bytes = n * core::mem::size_of::<libc::Elf64_Phdr>();
    if info.dlpi_phdr.is_null() || !crate::sys::mapped(info.dlpi_phdr as usize, phdr_bytes) {
        return false;
    }
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers, mapped.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, n) };
    phdrs
        .iter()
        .filter(|p| p.p_type == libc::PT_LOAD && p.p_memsz > 0)
        .all(|p| {
            crate::sys::mapped(
                info.dlpi_addr as usize + p.p_vaddr as usize,
                p.p_memsz as usize,
            )
        })
}

/// State of one `dl_iterate_phdr` pass.
struct Pass<'a> {
    /// The addresses to name, sorted, unique.
    addrs: &'a [usize],
    /// Per address: index in `objects` of the first object holding it.
    owner: Vec<u32>,
    /// Per address: its symbol from `.dynsym`.
    syms: Vec<Option<(Symbol, Source)>>,
    /// Every object visited, in the loader's order (index 0: the program).
    objects: Vec<Object>,
    /// Objects with addresses left unnamed, to look up in their files.
    files: Vec<FileCheck>,
    main_path: Vec<u8>,
    /// Objects visited so far.
    seen: usize,
    page: usize,
    /// To give back the symbol-table pages the pass faulted in.
    pagemap: Option<crate::base::resident::Pagemap>,
    given_back: usize,
}

/// What is needed to read an object's `.symtab` after the pass: its load
/// bias, a copy of its program headers and notes as loaded (to check that
/// the file on disk is the object loaded), and the addresses to name.
struct FileCheck {
    object: usize,
    bias: usize,
    identity: trampoline::image::LoadedIdentity,
    /// Indexes into the pass's addresses.
    addrs: Vec<usize>,
}

/// The main program's path as the profile has always written it: the
/// loader's name for it (`argv[0]`, what `dladdr` answers), or `exe` when
/// that is empty or relative. Not through `dladdr`, which walks the
/// program's whole dynamic symbol table for the symbol it also answers
/// (1.7 ms of each dump of cc1plus, whose 31,000 symbols are exported):
/// the loader's `argv[0]` is the first word of the argument vector the
/// loader passed to the constructors, the one the standard library keeps
/// and reads anew at each call (a program that changed `argv[0]` is named
/// as `dladdr` names it).
fn main_program_path(exe: &[u8]) -> Vec<u8> {
    let path = std::env::args_os()
        .next()
        .map(|a| a.into_encoded_bytes())
        .unwrap_or_default();
    if path.first() == Some(&b'/') {
        path
    } else {
        exe.to_vec()
    }
}

/// The path of the `n`th object `dl_iterate_phdr` reports, as a dump
/// names it (`main_path` for the program, object 0).
fn object_path(info: &libc::dl_phdr_info, n: usize, main_path: &[u8]) -> Vec<u8> {
    if n == 0 {
        main_path.to_vec()
    } else if info.dlpi_name.is_null() {
        Vec::new()
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
            .to_bytes()
            .to_vec()
    }
}

/// Every loaded object's address ranges with the object a dump names them
/// by (its path and base, as [`name_all`] gives them): (low, high, object).
/// For the memory journal, which the analyser maps to the same objects.
pub fn object_ranges(exe: &[u8]) -> Vec<(usize, usize, Object)> {
    struct Walk {
        main_path: Vec<u8>,
        page: usize,
        seen: usize,
        out: Vec<(usize, usize, Object)>,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info for the call; data
        // is the Walk given to it.
        let (info, w) = unsafe { (&*info, &mut *(data as *mut Walk)) };
        let n = w.seen;
        w.seen += 1;
        // SAFETY: the loader's program headers of a loaded object.
        let image = unsafe { Image::of(info) };
        let Some(base) = image.map_start(w.page) else {
            return 0;
        };
        let path = object_path(info, n, &w.main_path);
        for (lo, hi) in image.ranges(base, w.page, n == 0) {
            w.out.push((
                lo,
                hi,
                Object {
                    base,
                    path: path.clone(),
                },
            ));
        }
        0
    }
    let mut w = Walk {
        main_path: main_program_path(exe),
        page: crate::sys::page_size(),
        seen: 0,
        out: Vec::new(),
    };
    each_object(each, &mut w as *mut Walk as *mut libc::c_void);
    w.out
}

/// The `dl_iterate_phdr` callback: claims the addresses inside this object
/// that no earlier object holds, and names them from its dynamic symbols.
extern "C" fn collect(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> i32 {
    // SAFETY: dl_iterate_phdr passes a valid info for the duration of the
    // call; data is the Pass given to dl_iterate_phdr.
    let (info, pass) = unsafe { (&*info, &mut *(data as *mut Pass)) };
    let n = pass.seen;
    pass.seen += 1;
    // The library's own headers from the copy made at start-up.
    let own;
    let info = match crate::base::code_pages::own_program_headers() {
        Some((bias, phdrs)) if bias == info.dlpi_addr as usize => {
            own = libc::dl_phdr_info {
                dlpi_phdr: phdrs.as_ptr(),
                dlpi_phnum: phdrs.len() as _,
                ..*info
            };
            &own
        }
        _ => info,
    };
    // SAFETY: the loader's program headers of a loaded object, or the copy
    // of the library's own.
    let image = unsafe { Image::of(info) };
    let path = object_path(info, n, &pass.main_path);
    let Some(base) = image.map_start(pass.page) else {
        return 0;
    };
    // Addresses inside this object that no earlier object holds.
    let mut mine: Vec<usize> = Vec::new();
    for (lo, hi) in image.ranges(base, pass.page, n == 0) {
        let from = pass.addrs.partition_point(|&a| a < lo);
        let to = pass.addrs.partition_point(|&a| a < hi);
        mine.extend((from..to).filter(|&i| pass.owner[i] == NO_OBJECT));
    }
    if mine.is_empty() {
        pass.objects.push(Object { base, path });
        return 0;
    }
    mine.sort_unstable();
    mine.dedup();
    let me = pass.objects.len();
    pass.objects.push(Object { base, path });
    let wanted: Vec<usize> = mine.iter().map(|&i| pass.addrs[i]).collect();
    // The dump often comes at the process's peak memory: the pages of the
    // symbol tables read here (2.4 MB for cc1plus) go again afterwards.
    let fresh = pass.pagemap.as_ref().and_then(|m| {
        // Only around the tables the naming reads: cc1's read-only
        // segments are 30 MB, whose pagemap took 0.66 ms a dump to read.
        let spans = trampoline::image::dynamic_table_spans(&image);
        crate::base::resident::Fresh::near(
            m,
            image.bias,
            image.phdrs(),
            pass.page,
            &spans,
            crate::base::resident::FAULT_AROUND,
        )
    });
    let found = dynsym_names(&image, &wanted);
    if let Some(f) = fresh {
        pass.given_back += f.give_back();
    }
    let found = found
        .into_iter()
        .map(|s| s.map(|(addr, name)| Symbol { addr, name }));
    let mut unnamed = Vec::new();
    for (&i, s) in mine.iter().zip(found) {
        pass.owner[i] = me as u32;
        match s {
            Some(s) => pass.syms[i] = Some((s, Source::Dynsym)),
            None => unnamed.push(i),
        }
    }
    if !unnamed.is_empty() && (n == 0 || pass.objects[me].path.first() == Some(&b'/')) {
        pass.files.push(FileCheck {
            object: me,
            bias: image.bias,
            identity: image.identity(),
            addrs: unnamed,
        });
    }
    0
}

/// Why an object file's `.symtab` could not name its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymtabError {
    /// The file could not be opened or read (errno).
    Read { errno: i32 },
    /// Not a 64-bit little-endian ELF file of this machine's layout.
    NotElf,
    /// The file's program headers or notes differ from the loaded object's:
    /// it was replaced after it was loaded.
    Changed,
    /// The file has no `.symtab` (stripped): not an error.
    NoSymtab,
    /// A section lies outside the file or is implausibly large.
    BadSection { which: &'static str },
}

impl core::fmt::Display for SymtabError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SymtabError::Read { errno } => write!(f, "cannot read the object file (errno {errno})"),
            SymtabError::NotElf => write!(f, "not a 64-bit ELF file"),
            SymtabError::Changed => write!(
                f,
                "the file on disk is not the object that was loaded (replaced since)"
            ),
            SymtabError::NoSymtab => write!(f, "no .symtab (stripped)"),
            SymtabError::BadSection { which } => write!(f, "{which} lies outside the file"),
        }
    }
}

/// A whole object file mapped read-only (the loader maps the same file;
/// a file truncated under a running program faults there as well).
struct FileMap(trampoline::image::MappedFile);

impl FileMap {
    fn open(path: &[u8]) -> Result<FileMap, SymtabError> {
        use std::os::unix::ffi::OsStrExt;
        let map = trampoline::image::MappedFile::open(std::ffi::OsStr::from_bytes(path))
            .map_err(io_err)?;
        if map.len() < ELF_HEADER {
            return Err(SymtabError::NotElf);
        }
        Ok(FileMap(map))
    }

    /// `len` bytes at file offset `off`.
    fn at(&self, off: u64, len: usize, which: &'static str) -> Result<&[u8], SymtabError> {
        let off = usize::try_from(off).map_err(|_| SymtabError::BadSection { which })?;
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.0.len())
            .ok_or(SymtabError::BadSection { which })?;
        Ok(&self.0[off..end])
    }
}

const ELF_HEADER: usize = 64;
const SECTION_HEADER: usize = 64;
const SHT_SYMTAB: u32 = 2;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(w)
}

/// The NUL-terminated string at `off` in `table` (empty when out of range).
fn c_name(table: &[u8], off: usize) -> &[u8] {
    let s = table.get(off..).unwrap_or(&[]);
    &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
}

/// The `.symtab` function symbol of each address of `addrs` (sorted):
/// among the symbols that start at or below it, the last in (start, end,
/// name) order, if it reaches past the address (so among aliases of one
/// range, the greatest name, as `nm -n` order and the analyser pick).
///
/// One pass over the table: each symbol goes to the bucket of the first
/// address at or above its start, a bucket keeps its greatest symbol, and
/// an address's answer is the greatest of the buckets up to its own. Names
/// are read only to break ties and for the answers.
fn symtab_names(
    path: &[u8],
    check: &FileCheck,
    addrs: &[usize],
) -> Result<Vec<Option<Symbol>>, SymtabError> {
    let map = FileMap::open(path)?;
    let eh = map.at(0, ELF_HEADER, "the ELF header")?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Err(SymtabError::NotElf);
    }
    // The file is the loaded object: same program headers and notes.
    let same = check.identity.file_matches(u64_at(eh, 32), |off, want| {
        Ok(map.at(off, want.len(), "the program headers or a note")? == want)
    })?;
    if !same {
        return Err(SymtabError::Changed);
    }
    let shoff = u64_at(eh, 40);
    let mut shnum = u16_at(eh, 60) as usize;
    if shoff == 0 {
        return Err(SymtabError::NoSymtab);
    }
    if shnum == 0 {
        // Extended numbering: the count is in section 0's size.
        let sh0 = map.at(shoff, SECTION_HEADER, "the section table")?;
        shnum = usize::try_from(u64_at(sh0, 32)).unwrap_or(usize::MAX);
    }
    let shdrs = map.at(
        shoff,
        shnum.saturating_mul(SECTION_HEADER),
        "the section table",
    )?;
    let sh = |i: usize| &shdrs[i * SECTION_HEADER..(i + 1) * SECTION_HEADER];
    let Some(symtab) = (0..shnum).find(|&i| u32_at(sh(i), 4) == SHT_SYMTAB) else {
        return Err(SymtabError::NoSymtab);
    };
    let link = u32_at(sh(symtab), 40) as usize;
    if link >= shnum {
        return Err(SymtabError::BadSection {
            which: ".symtab's string table",
        });
    }
    let table = map.at(
        u64_at(sh(symtab), 24),
        usize::try_from(u64_at(sh(symtab), 32)).unwrap_or(usize::MAX),
        ".symtab",
    )?;
    let strings = map.at(
        u64_at(sh(link), 24),
        usize::try_from(u64_at(sh(link), 32)).unwrap_or(usize::MAX),
        ".strtab",
    )?;
    // (start, start + max(size, 1), name offset)
    type Sym = (usize, usize, usize);
    let order = |a: &Sym, b: &Sym| {
        (a.0, a.1)
            .cmp(&(b.0, b.1))
            .then_with(|| c_name(strings, a.2).cmp(c_name(strings, b.2)))
    };
    let mut best: Vec<Option<Sym>> = vec![None; addrs.len()];
    let buckets = Buckets::new(addrs);
    for s in table.chunks_exact(SYM_SIZE) {
        let name = u32_at(s, 0) as usize;
        let kind = s[4] & 0xf;
        let shndx = u16_at(s, 6);
        let value = u64_at(s, 8) as usize;
        let size = u64_at(s, 16) as usize;
        if !matches!(kind, STT_FUNC | STT_GNU_IFUNC)
            || shndx == SHN_UNDEF
            || shndx == SHN_ABS
            || value == 0
            || name == 0
            || name >= strings.len()
        {
            continue;
        }
        let start = check.bias.wrapping_add(value);
        let sym = (start, start.saturating_add(size.max(1)), name);
        let bucket = buckets.of(start);
        if let Some(b) = best.get_mut(bucket) {
            if b.is_none_or(|cur| order(&sym, &cur).is_gt()) {
                *b = Some(sym);
            }
        }
    }
    let mut out = Vec::with_capacity(addrs.len());
    let mut upto: Option<Sym> = None;
    for (&addr, b) in addrs.iter().zip(&best) {
        if let Some(b) = b {
            if upto.is_none_or(|cur| order(b, &cur).is_gt()) {
                upto = Some(*b);
            }
        }
        out.push(upto.and_then(|(start, end, name)| {
            let name = c_name(strings, name);
            (addr < end && !name.is_empty()).then(|| Symbol {
                addr: start,
                name: name.to_vec(),
            })
        }));
    }
    Ok(out)
}

/// The bucket of a symbol that starts at `start`: the index of the first
/// of the sorted `addrs` at or above it (`addrs.partition_point(|&a| a <
/// start)`), found through the bucket of each page's first byte, so that
/// only the few addresses of the symbol's page are searched (a binary
/// search of node's 1,200 unnamed addresses for each of its 109,000
/// `.symtab` symbols took 3-4 ms of its dump).
struct Buckets<'a> {
    addrs: &'a [usize],
    /// The page of the first address.
    lo: usize,
    /// `pages[p]`: how many addresses lie below page `lo + p` (one more
    /// page than the last address's). Empty: no table (no address, or
    /// more than `MAX_PAGES` pages between the first and the last).
    pages: Vec<u32>,
}

impl<'a> Buckets<'a> {
    const SHIFT: u32 = 12;
    const MAX_PAGES: usize = 1 << 20;

    fn new(addrs: &'a [usize]) -> Self {
        let mut b = Buckets {
            addrs,
            lo: 0,
            pages: Vec::new(),
        };
        let (Some(&first), Some(&last)) = (addrs.first(), addrs.last()) else {
            return b;
        };
        b.lo = first >> Self::SHIFT << Self::SHIFT;
        let n = ((last - b.lo) >> Self::SHIFT) + 2;
        if n > Self::MAX_PAGES || addrs.len() > u32::MAX as usize {
            return b;
        }
        b.pages.reserve_exact(n);
        let mut below = 0;
        for p in 0..n {
            let page = b.lo + (p << Self::SHIFT);
            while below < addrs.len() && addrs[below] < page {
                below += 1;
            }
            b.pages.push(below as u32);
        }
        b
    }

    #[inline]
    fn of(&self, start: usize) -> usize {
        if self.pages.is_empty() {
            return self.addrs.partition_point(|&a| a < start);
        }
        if start <= self.lo {
            return 0;
        }
        let p = (start - self.lo) >> Self::SHIFT;
        if p + 1 >= self.pages.len() {
            // Past the last address's page.
            return self.addrs.len();
        }
        let (from, to) = (self.pages[p] as usize, self.pages[p + 1] as usize);
        from + self.addrs[from..to].partition_point(|&a| a < start)
    }
}

fn io_err(e: std::io::Error) -> SymtabError {
    SymtabError::Read {
        errno: e.raw_os_error().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_a_binary_searchs() {
        // Addresses bunched in a few pages, spread, and far apart (no
        // table); starts below, among, between and past them.
        let sets: [Vec<usize>; 5] = [
            vec![],
            vec![0x5000],
            vec![
                0x1000, 0x1008, 0x1ff8, 0x2000, 0x2001, 0x9000, 0x9fff, 0x40_0000,
            ],
            (0..300).map(|i| 0x7f00_0000_0000 + i * 0x777).collect(),
            vec![0x1000, 0x7fff_ffff_f000],
        ];
        for addrs in &sets {
            let b = Buckets::new(addrs);
            let mut starts = vec![0, 1, 0xfff, usize::MAX];
            for &a in addrs {
                starts.extend([a.saturating_sub(1), a, a + 1, a & !0xfff, (a | 0xfff) + 1]);
            }
            for s in starts {
                assert_eq!(
                    b.of(s),
                    addrs.partition_point(|&a| a < s),
                    "{s:#x} in {addrs:x?}"
                );
            }
        }
    }

    /// dladdr's (dli_fbase, dli_fname, (dli_saddr, dli_sname)).
    type Answer = (usize, Vec<u8>, Option<(usize, Vec<u8>)>);

    fn dladdr(addr: usize) -> Option<Answer> {
        // SAFETY: plain data filled by dladdr.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables.
        if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 {
            return None;
        }
        // SAFETY: NUL-terminated strings owned by the loader.
        let fname = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_bytes()
            .to_vec();
        let sym = (!info.dli_sname.is_null() && !info.dli_saddr.is_null()).then(|| {
            (
                info.dli_saddr as usize,
                // SAFETY: as above.
                unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }
                    .to_bytes()
                    .to_vec(),
            )
        });
        Some((info.dli_fbase as usize, fname, sym))
    }

    /// Every readable segment of every loaded object (but the test program,
    /// whose own text is large), sampled every few bytes.
    fn sample_addresses() -> Vec<usize> {
        let mut segs: Vec<(usize, usize)> = Vec::new();
        trampoline::image::first_object::<()>(|info| {
            // SAFETY: a loaded object, read only inside first_object's callback.
            let img = unsafe { trampoline::image::Image::of(info) };
            for ph in img.phdrs().iter().filter(|ph| ph.p_type == libc::PT_LOAD) {
                let lo = info.dlpi_addr as usize + ph.p_vaddr as usize;
                segs.push((lo, lo + ph.p_memsz as usize));
            }
            None
        });
        let mut v = Vec::new();
        for (lo, hi) in segs {
            let step = ((hi - lo) / 20_000).max(1) | 1;
            let mut a = lo;
            while a < hi {
                v.push(a);
                a += step;
            }
            v.push(lo.saturating_sub(1));
            v.push(hi);
        }
        v
    }

    #[test]
    fn every_name_dladdr_gives_is_the_same() {
        let exe = std::fs::read_link("/proc/self/exe")
            .unwrap()
            .into_os_string()
            .into_encoded_bytes();
        let addrs = sample_addresses();
        let names = name_all(&addrs, &exe);
        let (mut named, mut from_symtab) = (0, 0);
        for &a in &addrs {
            let want = dladdr(a);
            let got = names.get(a);
            match (&want, got) {
                (None, None) => {}
                (Some((fbase, fname, sym)), Some((o, s))) => {
                    assert_eq!(o.base, *fbase, "base of {a:#x}");
                    if fname.first() == Some(&b'/') {
                        assert_eq!(&o.path, fname, "object of {a:#x}");
                    }
                    match sym {
                        Some((saddr, sname)) => {
                            named += 1;
                            let s = s.unwrap_or_else(|| {
                                panic!("{a:#x}: dladdr says {}", String::from_utf8_lossy(sname))
                            });
                            assert_eq!(
                                (s.addr, &s.name),
                                (*saddr, sname),
                                "{a:#x}: {} vs dladdr {}",
                                String::from_utf8_lossy(&s.name),
                                String::from_utf8_lossy(sname)
                            );
                            assert_eq!(names.source(a), Some(Source::Dynsym));
                        }
                        None => {
                            if s.is_some() {
                                from_symtab += 1;
                                assert_eq!(names.source(a), Some(Source::Symtab));
                            }
                        }
                    }
                }
                _ => panic!("{a:#x}: dladdr {want:?}, index {:?}", got.map(|g| g.0)),
            }
        }
        eprintln!(
            "{} addresses: {named} named as dladdr does, {from_symtab} more from .symtab",
            addrs.len()
        );
        assert!(
            named > 1000,
            "only {named} of {} addresses named",
            addrs.len()
        );
        // The test program itself is not stripped: its static functions
        // are named from its .symtab.
        assert!(from_symtab > 0, "nothing named from .symtab");
    }

    #[test]
    fn a_static_function_of_this_program_is_named_from_symtab() {
        #[inline(never)]
        fn local_marker_function(x: u64) -> u64 {
            core::hint::black_box(x).wrapping_mul(3)
        }
        let exe = std::fs::read_link("/proc/self/exe")
            .unwrap()
            .into_os_string()
            .into_encoded_bytes();
        let f = local_marker_function as fn(u64) -> u64 as usize;
        assert_eq!(local_marker_function(2), 6);
        let names = name_all(&[f + 1], &exe);
        let (o, s) = names.get(f + 1).expect("in this program");
        assert_eq!(o.path, exe);
        let s = s.expect("named");
        assert_eq!(s.addr, f);
        assert!(
            String::from_utf8_lossy(&s.name).contains("local_marker_function"),
            "{}",
            String::from_utf8_lossy(&s.name)
        );
        assert!(names.get(0x10).is_none(), "no object at 0x10");
    }

    #[test]
    fn symtab_names_are_readelfs_function_symbols() {
        // Reference: this program's FUNC symbols from readelf, sorted by
        // (start, end, name); an address takes the last one starting at or
        // below it, if it reaches past it.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let out = match std::process::Command::new("readelf")
            .args(["-sW", "--wide"])
            .arg(&exe)
            .output()
        {
            Ok(o) if o.status.success() => o.stdout,
            _ => return, // no binutils here
        };
        let text = String::from_utf8_lossy(&out);
        let mut in_symtab = false;
        let mut reference: Vec<(usize, usize, String)> = Vec::new();
        for l in text.lines() {
            if l.starts_with("Symbol table") {
                in_symtab = l.contains("'.symtab'");
                continue;
            }
            let f: Vec<&str> = l.split_whitespace().collect();
            if !in_symtab || f.len() < 8 || !matches!(f[3], "FUNC" | "IFUNC") {
                continue;
            }
            let (Ok(v), Ok(sz)) = (usize::from_str_radix(f[1], 16), f[2].parse::<usize>()) else {
                continue;
            };
            if v == 0 || f[6] == "UND" || f[6] == "ABS" {
                continue;
            }
            let name = f[7].split('@').next().unwrap_or("").to_string();
            reference.push((v, v + sz.max(1), name));
        }
        reference.sort();
        // The load bias of this program and its program headers as loaded.
        let (bias, phdrs) = trampoline::image::first_object(|info| {
            // SAFETY: a loaded object, read only inside first_object's callback.
            let img = unsafe { trampoline::image::Image::of(info) };
            Some((img.bias, img.phdr_bytes()))
        })
        .unwrap();
        let check = FileCheck {
            object: 0,
            bias,
            identity: trampoline::image::LoadedIdentity {
                phdrs,
                notes: Vec::new(),
            },
            addrs: Vec::new(),
        };
        let lo = reference.first().unwrap().0;
        let hi = reference.last().unwrap().1;
        let step = ((hi - lo) / 5000).max(1) | 1;
        let rel: Vec<usize> = (lo..hi).step_by(step).collect();
        let addrs: Vec<usize> = rel.iter().map(|&a| a + bias).collect();
        let path = exe.into_os_string().into_encoded_bytes();
        let got = symtab_names(&path, &check, &addrs).unwrap();
        let mut named = 0;
        for (&a, g) in rel.iter().zip(&got) {
            let i = reference.partition_point(|s| s.0 <= a);
            let want = i
                .checked_sub(1)
                .map(|i| &reference[i])
                .filter(|s| a < s.1)
                .map(|s| (s.0 + bias, s.2.as_bytes().to_vec()));
            // Names are compared up to an '@' on both sides: readelf adds
            // versions after one, and some symbols have one in their name
            // (AArch64 erratum 843419 veneers, `e843419@0006_000002a1_bdc`).
            let g = g.as_ref().map(|s| {
                let end = s
                    .name
                    .iter()
                    .position(|&b| b == b'@')
                    .unwrap_or(s.name.len());
                (s.addr, s.name[..end].to_vec())
            });
            assert_eq!(g, want, "{a:#x}");
            named += g.is_some() as usize;
        }
        assert!(named > 100, "{named} of {} named", rel.len());
    }

    #[test]
    fn an_object_unmapped_under_its_record_is_left_out() {
        let page = crate::sys::page_size();
        let p = crate::sys::mmap_anon(4 * page) as usize;
        // Program headers at the start of the first page: one PT_LOAD of
        // the first two pages, of a base of `p`.
        let phdr = p as *mut libc::Elf64_Phdr;
        // SAFETY: the mapping holds two program headers, zeroed.
        unsafe {
            (*phdr).p_type = libc::PT_LOAD;
            (*phdr).p_vaddr = 0;
            (*phdr).p_memsz = 2 * page as u64;
        }
        // SAFETY: all-zero is a valid dl_phdr_info (null pointers).
        let mut info: libc::dl_phdr_info = unsafe { core::mem::zeroed() };
        info.dlpi_addr = p as _;
        info.dlpi_phdr = phdr;
        info.dlpi_phnum = 1;
        assert!(still_mapped(&info));
        // SAFETY: the mapping's second page, used by nothing.
        unsafe { crate::sys::munmap((p + page) as *mut u8, page) };
        assert!(!still_mapped(&info));
        // Its segment mapped but its headers not.
        info.dlpi_phdr = (p + page) as *const _;
        assert!(!still_mapped(&info));
        // SAFETY: the rest of the mapping, used by nothing.
        unsafe {
            crate::sys::munmap(p as *mut u8, page);
            crate::sys::munmap((p + 2 * page) as *mut u8, 2 * page);
        }
    }
}
