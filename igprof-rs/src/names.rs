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
//! program's path is `dladdr`'s (`argv[0]`, one call per dump) when
//! absolute, else the executable's; the vDSO keeps its own name.
//!
//! Owns: the object list of a dump (path, base address as `dli_fbase`),
//! naming from each object's dynamic symbols, and reading `.symtab` from
//! object files.
//! Everything that reads the loader's memory happens inside the
//! `dl_iterate_phdr` callback, whose lock keeps each object mapped while it
//! is read (`dlclose` unmaps only after taking the object off that list).
//!
//! Must never: run in a signal handler or a hook (it allocates, reads
//! files and calls `dladdr`), call `dladdr`/`dlopen`/`dlclose` inside the
//! `dl_iterate_phdr` callback (lock-order inversion with a concurrent
//! `dlclose`), or read loader memory outside an object's readable segments.

use std::collections::HashMap;

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
#[derive(Default)]
pub struct Names {
    objects: Vec<Object>,
    /// address -> (index in `objects`, its symbol).
    named: HashMap<usize, (u32, Option<(Symbol, Source)>)>,
    /// Objects whose `.symtab` could not be used, and why (for `-d`).
    pub symtab_errors: Vec<(Vec<u8>, SymtabError)>,
}

impl Names {
    /// The object and symbol of `addr`; None when no loaded object holds it.
    pub fn get(&self, addr: usize) -> Option<(&Object, Option<&Symbol>)> {
        let (o, s) = self.named.get(&addr)?;
        Some((&self.objects[*o as usize], s.as_ref().map(|(s, _)| s)))
    }

    /// As [`Self::get`], with where the symbol came from.
    pub fn source(&self, addr: usize) -> Option<Source> {
        self.named.get(&addr)?.1.as_ref().map(|(_, k)| *k)
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
        page: page_size(),
    };
    // SAFETY: `collect` matches dl_iterate_phdr's callback type and `pass`
    // outlives the call; the callback only reads the objects it is given.
    unsafe { libc::dl_iterate_phdr(Some(collect), &mut pass as *mut Pass as *mut libc::c_void) };
    let Pass {
        owner,
        mut syms,
        objects,
        files,
        ..
    } = pass;
    let mut names = Names {
        objects: Vec::with_capacity(objects.len()),
        named: HashMap::with_capacity(sorted.len()),
        symtab_errors: Vec::new(),
    };
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
            Err(e) => names.symtab_errors.push((file_path.to_vec(), e)),
        }
    }
    let mut index = vec![u32::MAX; objects.len()];
    for (i, &addr) in sorted.iter().enumerate() {
        let o = owner[i];
        if o == NO_OBJECT {
            continue;
        }
        if index[o as usize] == u32::MAX {
            index[o as usize] = names.objects.len() as u32;
            names.objects.push(objects[o as usize].clone());
        }
        names
            .named
            .insert(addr, (index[o as usize], syms[i].take()));
    }
    names
}

const NO_OBJECT: u32 = u32::MAX;

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
}

/// What is needed to read an object's `.symtab` after the pass: its load
/// bias, a copy of its program headers and notes as loaded (to check that
/// the file on disk is the object loaded), and the addresses to name.
struct FileCheck {
    object: usize,
    bias: usize,
    phdrs: Vec<u8>,
    /// (file offset, bytes) of each PT_NOTE segment as loaded.
    notes: Vec<(u64, Vec<u8>)>,
    /// Indexes into the pass's addresses.
    addrs: Vec<usize>,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The main program's path as the profile has always written it: the
/// loader's name for it (`argv[0]`, what `dladdr` answers), or `exe` when
/// that is empty or relative. One `dladdr` call, before the pass.
fn main_program_path(exe: &[u8]) -> Vec<u8> {
    extern "C" fn first(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; data is our usize.
        unsafe {
            let i = &*info;
            for k in 0..i.dlpi_phnum as usize {
                let ph = &*i.dlpi_phdr.add(k);
                if ph.p_type == libc::PT_LOAD {
                    *(data as *mut usize) = i.dlpi_addr as usize + ph.p_vaddr as usize;
                    break;
                }
            }
        }
        1
    }
    let mut at: usize = 0;
    // SAFETY: `first` matches the callback type; `at` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut at as *mut usize as *mut libc::c_void) };
    let mut path = Vec::new();
    if at != 0 {
        // SAFETY: Dl_info is plain data that dladdr fills.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables; not in signal context.
        if unsafe { libc::dladdr(at as *const libc::c_void, &mut info) } != 0
            && !info.dli_fname.is_null()
        {
            // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
            path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
                .to_bytes()
                .to_vec();
        }
    }
    if path.first() != Some(&b'/') {
        path = exe.to_vec();
    }
    path
}

/// The `dl_iterate_phdr` callback: claims the addresses inside this object
/// that no earlier object holds, and names them from its dynamic symbols.
extern "C" fn collect(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> i32 {
    // SAFETY: dl_iterate_phdr passes a valid info for the duration of the
    // call; data is the Pass given to dl_iterate_phdr.
    let (info, pass) = unsafe { (&*info, &mut *(data as *mut Pass)) };
    let n = pass.seen;
    pass.seen += 1;
    // SAFETY: the loader's program headers of a loaded object.
    let image = unsafe { Image::of(info) };
    let path = if n == 0 {
        pass.main_path.clone()
    } else if info.dlpi_name.is_null() {
        Vec::new()
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
            .to_bytes()
            .to_vec()
    };
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
    let found = dynsym_names(&image, &wanted);
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
            phdrs: image.phdr_bytes(),
            notes: image.notes(),
            addrs: unnamed,
        });
    }
    0
}

/// A loaded object as the loader describes it, with bounds-checked reads
/// of its readable segments.
struct Image {
    bias: usize,
    phdr: *const libc::Elf64_Phdr,
    phnum: usize,
    /// (start, end, readable) of each PT_LOAD segment, at run-time addresses.
    segments: Vec<(usize, usize, bool)>,
}

impl Image {
    /// # Safety
    /// `info` must describe a loaded object and the object must stay
    /// loaded while the `Image` is used (inside the `dl_iterate_phdr` call).
    unsafe fn of(info: &libc::dl_phdr_info) -> Image {
        let bias = info.dlpi_addr as usize;
        let phnum = if info.dlpi_phdr.is_null() {
            0
        } else {
            info.dlpi_phnum as usize
        };
        let mut segments = Vec::new();
        for k in 0..phnum {
            // SAFETY: k < dlpi_phnum entries of the loader's headers.
            let ph = unsafe { &*info.dlpi_phdr.add(k) };
            if ph.p_type == libc::PT_LOAD && ph.p_memsz > 0 {
                let lo = bias.wrapping_add(ph.p_vaddr as usize);
                segments.push((
                    lo,
                    lo.wrapping_add(ph.p_memsz as usize),
                    ph.p_flags & libc::PF_R != 0,
                ));
            }
        }
        Image {
            bias,
            phdr: info.dlpi_phdr,
            phnum,
            segments,
        }
    }

    fn phdrs(&self) -> &[libc::Elf64_Phdr] {
        if self.phnum == 0 {
            return &[];
        }
        // SAFETY: the loader's phnum program headers (see `of`).
        unsafe { core::slice::from_raw_parts(self.phdr, self.phnum) }
    }

    fn phdr_bytes(&self) -> Vec<u8> {
        let p = self.phdrs();
        // SAFETY: plain data viewed as bytes.
        unsafe { core::slice::from_raw_parts(p.as_ptr() as *const u8, core::mem::size_of_val(p)) }
            .to_vec()
    }

    /// The PT_NOTE segments as loaded: (file offset, bytes).
    fn notes(&self) -> Vec<(u64, Vec<u8>)> {
        let mut v = Vec::new();
        for ph in self.phdrs() {
            if ph.p_type == libc::PT_NOTE && ph.p_filesz > 0 && ph.p_filesz <= 1 << 16 {
                let at = self.bias.wrapping_add(ph.p_vaddr as usize);
                if let Some(b) = self.bytes(at, ph.p_filesz as usize) {
                    v.push((ph.p_offset, b.to_vec()));
                }
            }
        }
        v
    }

    /// `dladdr`'s `dli_fbase`: the start of the first PT_LOAD segment's page.
    fn map_start(&self, page: usize) -> Option<usize> {
        let first = self.phdrs().iter().find(|p| p.p_type == libc::PT_LOAD)?;
        Some(self.bias.wrapping_add(first.p_vaddr as usize & !(page - 1)))
    }

    /// The address ranges `dladdr` takes as this object's (glibc's
    /// `l_contiguous`): from the map start to the end of the last segment
    /// when the loader counts the object as one piece, else each segment.
    /// A library the loader mapped is one piece when it is ET_DYN (its
    /// holes are reserved); the program and the dynamic loader (mapped by
    /// the kernel) when their segments follow each other page by page
    /// (x86-64's 4 KiB-aligned ones do, AArch64's 64 KiB-aligned ones do
    /// not); the vDSO never.
    fn ranges(&self, base: usize, page: usize, program: bool) -> Vec<(usize, usize)> {
        let seg: Vec<(usize, usize)> = self.segments.iter().map(|&(lo, hi, _)| (lo, hi)).collect();
        let Some(end) = seg.iter().map(|s| s.1).max() else {
            return seg;
        };
        // SAFETY: getauxval only reads the process's auxiliary vector.
        let (vdso, loader) = unsafe {
            (
                libc::getauxval(libc::AT_SYSINFO_EHDR) as usize,
                libc::getauxval(libc::AT_BASE) as usize,
            )
        };
        if base == vdso {
            return seg;
        }
        let by_kernel = program || self.bias == loader;
        let adjacent = seg
            .windows(2)
            .all(|w| w[1].0 & !(page - 1) == w[0].1.wrapping_add(page - 1) & !(page - 1));
        // e_type of the ELF header the first segment maps at its start.
        let shared = !by_kernel
            && self
                .phdrs()
                .iter()
                .find(|p| p.p_type == libc::PT_LOAD)
                .is_some_and(|p| p.p_offset == 0)
            && self.read::<u16>(base.wrapping_add(16)) == Some(ET_DYN);
        if shared || adjacent {
            vec![(base, end)]
        } else {
            seg
        }
    }

    /// Whether `[addr, addr + len)` lies in one readable segment.
    fn readable(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.segments
            .iter()
            .any(|&(lo, hi, r)| r && lo <= addr && end <= hi)
    }

    fn bytes(&self, addr: usize, len: usize) -> Option<&[u8]> {
        if !self.readable(addr, len) {
            return None;
        }
        // SAFETY: inside a readable segment of a loaded object (see `of`).
        Some(unsafe { core::slice::from_raw_parts(addr as *const u8, len) })
    }

    fn read<T: Copy>(&self, addr: usize) -> Option<T> {
        if !self.readable(addr, core::mem::size_of::<T>()) {
            return None;
        }
        // SAFETY: inside a readable segment of a loaded object; T is plain
        // data (integers and structs of integers) read unaligned.
        Some(unsafe { core::ptr::read_unaligned(addr as *const T) })
    }

    /// A NUL-terminated string at `addr`, at most `max` bytes long.
    fn cstr(&self, addr: usize, max: usize) -> Option<&[u8]> {
        let (_, hi, _) = *self
            .segments
            .iter()
            .find(|&&(lo, hi, r)| r && lo <= addr && addr < hi)?;
        let room = (hi - addr).min(max);
        // SAFETY: [addr, addr + room) is inside one readable segment.
        let s = unsafe { core::slice::from_raw_parts(addr as *const u8, room) };
        let len = s.iter().position(|&b| b == 0)?;
        Some(&s[..len])
    }

    /// A dynamic-section pointer: the loader has added the load bias to it
    /// in memory, except where the section is read-only (the vDSO).
    fn dyn_ptr(&self, v: u64) -> usize {
        let unrelocated = self.bias.wrapping_add(v as usize);
        if self
            .segments
            .iter()
            .any(|&(lo, hi, _)| lo <= unrelocated && unrelocated < hi)
        {
            unrelocated
        } else {
            v as usize
        }
    }
}

/// One entry of a dynamic section (`Elf64_Dyn`).
#[derive(Clone, Copy)]
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

const ET_DYN: u16 = 3;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_STRSZ: i64 = 10;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const STT_TLS: u8 = 6;
const SHN_UNDEF: u16 = 0;
const SHN_ABS: u16 = 0xfff1;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const STV_INTERNAL: u8 = 1;
const STV_HIDDEN: u8 = 2;
const SYM_SIZE: usize = core::mem::size_of::<libc::Elf64_Sym>();

/// `dladdr`'s rule for one symbol covering `[start, end)`, visited after
/// the ones already in `best` (per address of `addrs`, sorted): it becomes
/// an address's symbol if it covers it and starts above its current one
/// (so among symbols at one address, the first visited stays).
fn offer(best: &mut [Option<(usize, u32)>], addrs: &[usize], start: usize, end: usize, name: u32) {
    let mut i = addrs.partition_point(|&a| a < start);
    while i < addrs.len() && addrs[i] < end {
        if best[i].is_none_or(|(cur, _)| cur < start) {
            best[i] = Some((start, name));
        }
        i += 1;
    }
}

/// The symbol `dladdr` gives each address of `addrs` (sorted, all in this
/// object), from the object's dynamic section and symbol table as loaded:
/// one pass over the symbols `dladdr` considers, in the order it visits
/// them (through the GNU hash table's chains, else the whole table).
fn dynsym_names(img: &Image, addrs: &[usize]) -> Vec<Option<Symbol>> {
    let mut out = vec![None; addrs.len()];
    let Some(tables) = DynTables::of(img) else {
        return out;
    };
    let mut best: Vec<Option<(usize, u32)>> = vec![None; addrs.len()];
    let mut visit = |ndx: usize, hashed: bool| -> Option<()> {
        let at = tables.symtab.checked_add(ndx.checked_mul(SYM_SIZE)?)?;
        let s: libc::Elf64_Sym = img.read(at)?;
        let (bind, kind, vis) = (s.st_info >> 4, s.st_info & 0xf, s.st_other & 3);
        let eligible = (hashed
            || (matches!(bind, STB_GLOBAL | STB_WEAK) && vis != STV_HIDDEN && vis != STV_INTERNAL))
            && kind != STT_TLS
            && (s.st_shndx != SHN_UNDEF || s.st_value != 0)
            && s.st_shndx != SHN_ABS
            && (s.st_name as usize) < tables.strsz;
        if eligible {
            let start = img.bias.wrapping_add(s.st_value as usize);
            let end = start.saturating_add((s.st_size as usize).max(1));
            offer(&mut best, addrs, start, end, s.st_name);
        }
        Some(())
    };
    // A table that cannot be read to its end names what was found so far
    // (dladdr would have faulted on it).
    let _ = tables.visit_all(img, &mut visit);
    for (o, b) in out.iter_mut().zip(best) {
        *o = b.and_then(|(start, name)| {
            let at = tables.strtab.checked_add(name as usize)?;
            let name = img.cstr(at, tables.strsz - name as usize)?;
            Some(Symbol {
                addr: start,
                name: name.to_vec(),
            })
        });
    }
    out
}

/// Where an object's dynamic symbols are, from its dynamic section.
struct DynTables {
    symtab: usize,
    strtab: usize,
    strsz: usize,
    hash: usize,
    gnu_hash: usize,
}

impl DynTables {
    /// None when the object has no dynamic symbols.
    fn of(img: &Image) -> Option<DynTables> {
        let dynamic = img.phdrs().iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
        let mut at = img.bias.wrapping_add(dynamic.p_vaddr as usize);
        let mut t = DynTables {
            symtab: 0,
            strtab: 0,
            strsz: 0,
            hash: 0,
            gnu_hash: 0,
        };
        loop {
            let d: Dyn = img.read(at)?;
            match d.tag {
                0 => break,
                DT_SYMTAB => t.symtab = img.dyn_ptr(d.val),
                DT_STRTAB => t.strtab = img.dyn_ptr(d.val),
                DT_STRSZ => t.strsz = d.val as usize,
                DT_HASH => t.hash = img.dyn_ptr(d.val),
                DT_GNU_HASH => t.gnu_hash = img.dyn_ptr(d.val),
                _ => {}
            }
            at += core::mem::size_of::<Dyn>();
        }
        (t.symtab != 0 && t.strtab != 0).then_some(t)
    }

    /// Calls `visit(index, through the hash table)` for every symbol
    /// `dladdr` considers, in its order.
    fn visit_all(
        &self,
        img: &Image,
        visit: &mut impl FnMut(usize, bool) -> Option<()>,
    ) -> Option<()> {
        if self.gnu_hash != 0 {
            // glibc's dladdr visits, bucket by bucket, every symbol of the
            // bucket's chain (the last has bit 0 of its hash set).
            let gnu_hash = self.gnu_hash;
            let nbuckets: u32 = img.read(gnu_hash)?;
            let symbias: u32 = img.read(gnu_hash + 4)?;
            let bloom_words: u32 = img.read(gnu_hash + 8)?;
            let buckets = gnu_hash + 16 + bloom_words as usize * 8;
            let chain0 = buckets + nbuckets as usize * 4;
            for b in 0..nbuckets as usize {
                let mut ndx: u32 = img.read(buckets + b * 4)?;
                if ndx == 0 || ndx < symbias {
                    continue;
                }
                loop {
                    visit(ndx as usize, true)?;
                    let h: u32 = img.read(chain0 + (ndx - symbias) as usize * 4)?;
                    if h & 1 != 0 {
                        break;
                    }
                    ndx += 1;
                }
            }
        } else {
            // Without a GNU hash table: every symbol, in table order; their
            // number is the SysV hash table's chain count, or else the
            // symbols end where the string table starts.
            let count = if self.hash != 0 {
                img.read::<u32>(self.hash + 4)? as usize
            } else if self.strtab > self.symtab {
                (self.strtab - self.symtab) / SYM_SIZE
            } else {
                0
            };
            for ndx in 0..count {
                visit(ndx, false)?;
            }
        }
        Some(())
    }
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
struct FileMap {
    ptr: *mut u8,
    len: usize,
}

impl FileMap {
    fn open(path: &[u8]) -> Result<FileMap, SymtabError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let file = std::fs::File::open(std::ffi::OsStr::from_bytes(path)).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len() as usize;
        if len < ELF_HEADER {
            return Err(SymtabError::NotElf);
        }
        // SAFETY: a new read-only private mapping of an open file; the
        // result is checked. The descriptor may close once it is mapped.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SymtabError::Read {
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        Ok(FileMap { ptr: p.cast(), len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping of len readable bytes, owned by self.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// `len` bytes at file offset `off`.
    fn at(&self, off: u64, len: usize, which: &'static str) -> Result<&[u8], SymtabError> {
        let off = usize::try_from(off).map_err(|_| SymtabError::BadSection { which })?;
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or(SymtabError::BadSection { which })?;
        Ok(&self.bytes()[off..end])
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, no longer referenced (every
        // slice borrows self).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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
    let phdrs = map.at(u64_at(eh, 32), check.phdrs.len(), "the program headers")?;
    if phdrs != check.phdrs {
        return Err(SymtabError::Changed);
    }
    for (off, bytes) in &check.notes {
        if map.at(*off, bytes.len(), "a note")? != *bytes {
            return Err(SymtabError::Changed);
        }
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
        let bucket = addrs.partition_point(|&a| a < start);
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

fn io_err(e: std::io::Error) -> SymtabError {
    SymtabError::Read {
        errno: e.raw_os_error().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        extern "C" fn cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> i32 {
            // SAFETY: valid info; data is our Vec.
            unsafe {
                let v = &mut *(data as *mut Vec<(usize, usize)>);
                let i = &*info;
                for k in 0..i.dlpi_phnum as usize {
                    let ph = &*i.dlpi_phdr.add(k);
                    if ph.p_type == libc::PT_LOAD {
                        let lo = i.dlpi_addr as usize + ph.p_vaddr as usize;
                        v.push((lo, lo + ph.p_memsz as usize));
                    }
                }
            }
            0
        }
        let mut segs: Vec<(usize, usize)> = Vec::new();
        // SAFETY: cb matches the callback type; segs outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(cb), &mut segs as *mut _ as *mut libc::c_void) };
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
        extern "C" fn first(i: *mut libc::dl_phdr_info, _: usize, d: *mut libc::c_void) -> i32 {
            // SAFETY: valid info; d is our Option.
            unsafe {
                let i = &*i;
                let phdrs = core::slice::from_raw_parts(
                    i.dlpi_phdr as *const u8,
                    i.dlpi_phnum as usize * core::mem::size_of::<libc::Elf64_Phdr>(),
                );
                *(d as *mut Option<(usize, Vec<u8>)>) =
                    Some((i.dlpi_addr as usize, phdrs.to_vec()));
            }
            1
        }
        let mut me: Option<(usize, Vec<u8>)> = None;
        // SAFETY: `first` matches the callback type; `me` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(first), &mut me as *mut _ as *mut libc::c_void) };
        let (bias, phdrs) = me.unwrap();
        let check = FileCheck {
            object: 0,
            bias,
            phdrs,
            notes: Vec::new(),
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
            let g = g.as_ref().map(|s| (s.addr, s.name.clone()));
            assert_eq!(g, want, "{a:#x}");
            named += g.is_some() as usize;
        }
        assert!(named > 100, "{named} of {} named", rel.len());
    }

    #[test]
    fn dynsym_rule_prefers_the_greatest_covering_address_then_first_visited() {
        // In visit order: a big symbol covering all, an alias at 0x200
        // visited before a longer one there, a size-0 one at 0x300.
        let addrs = [0x50, 0x210, 0x285, 0x290, 0x300, 0x301, 0x1000];
        let mut best = vec![None; addrs.len()];
        for (start, end, name) in [
            (0x100, 0x1000, 10),
            (0x200, 0x280, 20),
            (0x300, 0x301, 40),
            (0x200, 0x290, 30),
        ] {
            offer(&mut best, &addrs, start, end, name);
        }
        let names: Vec<Option<u32>> = best.iter().map(|b| b.map(|(_, n)| n)).collect();
        assert_eq!(
            names,
            [
                None,     // below every symbol
                Some(20), // two aliases at 0x200: the first visited
                Some(30), // only the longer alias covers it
                Some(10), // past the aliases: the big one
                Some(40), // size 0: only its own address
                Some(10),
                None, // the big one's end
            ]
        );
    }
}
