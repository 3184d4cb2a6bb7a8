//! Loaded objects as the dynamic loader describes them (`dl_iterate_phdr`),
//! read with bounds checks, and their dynamic symbols as `dladdr` sees
//! them: which symbols it considers, in which order, and which one it
//! gives an address (one pass over the table for many addresses, or an
//! index of symbol starts), without calling `dladdr` once per question
//! (it scans the object's whole table every time); and one symbol by name
//! and address through the GNU hash table.
//!
//! Owns: reading an object's program headers, segments, notes, dynamic
//! section and dynamic symbol table in memory.
//!
//! Must never: read outside an object's readable segments, or be used on
//! an object after the `dl_iterate_phdr` callback that gave it returns
//! (the loader may unmap it then).

/// A loaded object as the loader describes it, with bounds-checked reads
/// of its readable segments.
pub struct Image {
    /// The load bias (`dlpi_addr`).
    pub bias: usize,
    phdr: *const libc::Elf64_Phdr,
    phnum: usize,
    /// (start, end, readable) of each PT_LOAD segment, at run-time addresses.
    segments: Vec<(usize, usize, bool)>,
    /// Whether each of `segments` is executable.
    exec: Vec<bool>,
}

/// A loaded object's program headers and notes as loaded ([`Image::identity`]),
/// copied so that its file can be checked after the loader's lock is let
/// go: a file whose program headers and notes (its GNU build-id among
/// them, when it has one) are the same is the object loaded.
#[derive(Clone, Debug, Default)]
pub struct LoadedIdentity {
    pub phdrs: Vec<u8>,
    /// (file offset, alignment, bytes) of each PT_NOTE segment.
    pub notes: Vec<(u64, usize, Vec<u8>)>,
}

impl LoadedIdentity {
    /// Whether a file holds the same program headers (at `phoff`, its ELF
    /// header's `e_phoff`) and notes, where `same(offset, bytes)` says
    /// whether the file holds `bytes` at `offset` (or why it cannot be
    /// read).
    pub fn file_matches<E>(
        &self,
        phoff: u64,
        mut same: impl FnMut(u64, &[u8]) -> Result<bool, E>,
    ) -> Result<bool, E> {
        if !same(phoff, &self.phdrs)? {
            return Ok(false);
        }
        for (off, _, bytes) in &self.notes {
            if !same(*off, bytes)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether one of the notes holds a GNU build-id.
    pub fn has_build_id(&self) -> bool {
        self.notes
            .iter()
            .any(|(_, align, n)| build_id_in_notes(n, *align).is_some())
    }
}

/// The path the loader gives the object `info` describes (empty for the
/// main program and the vDSO).
pub fn object_name(info: &libc::dl_phdr_info) -> &[u8] {
    if info.dlpi_name.is_null() {
        return b"";
    }
    // SAFETY: dlpi_name is NUL-terminated, owned by the loader, and lives
    // as long as the object (`info` borrows from the loader's callback).
    unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes()
}

/// `f` on each loaded object, in the loader's order, until it returns
/// Some: inside `dl_iterate_phdr`, whose lock keeps every object loaded
/// while `f` runs (and which the program's other threads wait for to load
/// or look up a library: `f` should be short).
pub fn first_object<R>(mut f: impl FnMut(&libc::dl_phdr_info) -> Option<R>) -> Option<R> {
    struct Walk<'a, R> {
        f: &'a mut dyn FnMut(&libc::dl_phdr_info) -> Option<R>,
        out: Option<R>,
    }
    unsafe extern "C" fn cb<R>(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut core::ffi::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; data is our Walk.
        let (info, walk) = unsafe { (&*info, &mut *(data as *mut Walk<R>)) };
        match (walk.f)(info) {
            Some(r) => {
                walk.out = Some(r);
                1
            }
            None => 0,
        }
    }
    let mut walk = Walk {
        f: &mut f,
        out: None,
    };
    // SAFETY: the callback matches the type and only touches `walk`.
    unsafe {
        libc::dl_iterate_phdr(
            Some(cb::<R>),
            &mut walk as *mut Walk<R> as *mut core::ffi::c_void,
        )
    };
    walk.out
}

/// `f` on every loaded object, in the loader's order, inside
/// `dl_iterate_phdr` (see [`first_object`]).
pub fn each_object(mut f: impl FnMut(&libc::dl_phdr_info)) {
    first_object(|info| {
        f(info);
        None::<()>
    });
}

/// Whether `addr` may lie in the object `info` describes: inside the span
/// from its first loadable segment's page to the end of its last, where
/// every range [`Image::ranges`] gives lies. Reads only the loader's
/// program headers (no allocation: callers skip most objects with it).
///
/// # Safety
/// `info` must describe a loaded object (inside the `dl_iterate_phdr` call).
pub unsafe fn may_hold(info: &libc::dl_phdr_info, addr: usize, page: usize) -> bool {
    if info.dlpi_phdr.is_null() {
        return false;
    }
    let bias = info.dlpi_addr as usize;
    // SAFETY: dlpi_phnum entries of the loader's headers (guaranteed by the caller).
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let mut loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
    let Some(first) = loads.next() else {
        return false;
    };
    let lo = bias.wrapping_add(first.p_vaddr as usize & !(page - 1));
    let hi = core::iter::once(first)
        .chain(loads)
        .map(|p| bias.wrapping_add((p.p_vaddr + p.p_memsz) as usize))
        .max()
        .unwrap_or(lo);
    lo <= addr && addr < hi
}

impl Image {
    /// # Safety
    /// `info` must describe a loaded object and the object must stay
    /// loaded while the `Image` is used (inside the `dl_iterate_phdr` call).
    pub unsafe fn of(info: &libc::dl_phdr_info) -> Image {
        let bias = info.dlpi_addr as usize;
        let phnum = if info.dlpi_phdr.is_null() {
            0
        } else {
            info.dlpi_phnum as usize
        };
        let mut segments = Vec::new();
        let mut exec = Vec::new();
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
                exec.push(ph.p_flags & libc::PF_X != 0);
            }
        }
        Image {
            bias,
            phdr: info.dlpi_phdr,
            phnum,
            segments,
            exec,
        }
    }

    /// (start, end, executable) of each readable PT_LOAD segment.
    pub fn load_segments(&self) -> Vec<(usize, usize, bool)> {
        self.segments
            .iter()
            .zip(&self.exec)
            .filter(|((_, _, r), _)| *r)
            .map(|(&(lo, hi, _), &x)| (lo, hi, x))
            .collect()
    }

    pub fn phdrs(&self) -> &[libc::Elf64_Phdr] {
        if self.phnum == 0 {
            return &[];
        }
        // SAFETY: the loader's phnum program headers (see `of`).
        unsafe { core::slice::from_raw_parts(self.phdr, self.phnum) }
    }

    pub fn phdr_bytes(&self) -> Vec<u8> {
        let p = self.phdrs();
        // SAFETY: plain data viewed as bytes.
        unsafe { core::slice::from_raw_parts(p.as_ptr() as *const u8, core::mem::size_of_val(p)) }
            .to_vec()
    }

    /// What tells whether a file on disk is this object: a copy of its
    /// program headers and notes as loaded.
    pub fn identity(&self) -> LoadedIdentity {
        LoadedIdentity {
            phdrs: self.phdr_bytes(),
            notes: self.notes(),
        }
    }

    /// The PT_NOTE segments as loaded: (file offset, alignment, bytes).
    pub fn notes(&self) -> Vec<(u64, usize, Vec<u8>)> {
        let mut v = Vec::new();
        for ph in self.phdrs() {
            if ph.p_type == libc::PT_NOTE && ph.p_filesz > 0 && ph.p_filesz <= 1 << 16 {
                let at = self.bias.wrapping_add(ph.p_vaddr as usize);
                if let Some(b) = self.bytes(at, ph.p_filesz as usize) {
                    v.push((ph.p_offset, ph.p_align as usize, b.to_vec()));
                }
            }
        }
        v
    }

    /// `dladdr`'s `dli_fbase`: the start of the first PT_LOAD segment's page.
    pub fn map_start(&self, page: usize) -> Option<usize> {
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
    pub fn ranges(&self, base: usize, page: usize, program: bool) -> Vec<(usize, usize)> {
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
    pub fn readable(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.segments
            .iter()
            .any(|&(lo, hi, r)| r && lo <= addr && end <= hi)
    }

    pub fn bytes(&self, addr: usize, len: usize) -> Option<&[u8]> {
        if !self.readable(addr, len) {
            return None;
        }
        // SAFETY: inside a readable segment of a loaded object (see `of`).
        Some(unsafe { core::slice::from_raw_parts(addr as *const u8, len) })
    }

    pub fn read<T: Copy>(&self, addr: usize) -> Option<T> {
        if !self.readable(addr, core::mem::size_of::<T>()) {
            return None;
        }
        // SAFETY: inside a readable segment of a loaded object; T is plain
        // data (integers and structs of integers) read unaligned.
        Some(unsafe { core::ptr::read_unaligned(addr as *const T) })
    }

    /// A NUL-terminated string at `addr`, at most `max` bytes long.
    pub fn cstr(&self, addr: usize, max: usize) -> Option<&[u8]> {
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
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_VERDEF: i64 = 0x6fff_fffc;
const DT_VERDEFNUM: i64 = 0x6fff_fffd;
/// `.gnu.version`'s bit of a symbol version that is not the default one
/// (`name@VERSION`, not `name@@VERSION`).
const VERSYM_HIDDEN: u16 = 0x8000;
const STT_FUNC: u8 = 2;
const STT_TLS: u8 = 6;
const STT_GNU_IFUNC: u8 = 10;
pub const SHN_UNDEF: u16 = 0;
pub const SHN_ABS: u16 = 0xfff1;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const STV_INTERNAL: u8 = 1;
const STV_HIDDEN: u8 = 2;
pub const SYM_SIZE: usize = core::mem::size_of::<libc::Elf64_Sym>();

/// Where values fall among sorted addresses, in constant time: the range
/// from the first to the last address cut into about as many equal spans
/// as there are addresses, and where each span's addresses begin; a
/// question searches one span. [`dynsym_names`] asks it once per dynamic
/// symbol (cc1 has 28,902, a dump of it names 3,700 addresses in it), and
/// a binary search over all the addresses per symbol was most of the
/// naming's time.
struct Spans<'a> {
    addrs: &'a [usize],
    /// Each span is `1 << shift` bytes wide, the first starting at `addrs[0]`.
    shift: u32,
    /// `starts[k]`: the first address of span k (or later); one more entry
    /// than spans, `addrs.len()`.
    starts: Vec<u32>,
}

impl<'a> Spans<'a> {
    /// `addrs` sorted; at most `u32::MAX` of them.
    fn new(addrs: &'a [usize]) -> Self {
        let (Some(&lo), Some(&hi)) = (addrs.first(), addrs.last()) else {
            return Spans {
                addrs,
                shift: 0,
                starts: Vec::new(),
            };
        };
        let width = (hi - lo).div_ceil(addrs.len()).max(1);
        let shift = width.next_power_of_two().trailing_zeros();
        let spans = ((hi - lo) >> shift) + 1;
        let mut starts = Vec::with_capacity(spans + 1);
        let mut i = 0;
        for k in 0..spans {
            let from = lo + (k << shift);
            while addrs[i] < from {
                i += 1;
            }
            starts.push(i as u32);
        }
        starts.push(addrs.len() as u32);
        Spans {
            addrs,
            shift,
            starts,
        }
    }

    /// The index of the first address at or above `v` (`addrs.len()` when none).
    #[inline]
    fn first_from(&self, v: usize) -> usize {
        let Some(&lo) = self.addrs.first() else {
            return 0;
        };
        if v <= lo {
            return 0;
        }
        let k = (v - lo) >> self.shift;
        if k + 1 >= self.starts.len() {
            return self.addrs.len();
        }
        let (i, j) = (self.starts[k] as usize, self.starts[k + 1] as usize);
        i + self.addrs[i..j].partition_point(|&a| a < v)
    }
}

/// A whole file mapped read-only, for reading an object file's symbol
/// tables: only the pages read become resident, and they go with the
/// mapping. Reading the file into memory instead made the whole file
/// resident at once (`-fp` of a function in a program that loads
/// libLLVM, 110 MB: its peak resident set 49 -> 165 MB). The loader maps
/// the same files: one truncated under a running program faults there as
/// well.
pub struct MappedFile {
    ptr: *mut u8,
    len: usize,
}

impl MappedFile {
    /// The regular file at `path`, mapped (an empty file: no mapping, no
    /// bytes).
    pub fn open(path: impl AsRef<std::path::Path>) -> std::io::Result<MappedFile> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let len = usize::try_from(meta.len()).map_err(std::io::Error::other)?;
        if len == 0 {
            return Ok(MappedFile {
                ptr: core::ptr::NonNull::dangling().as_ptr(),
                len,
            });
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
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedFile { ptr: p.cast(), len })
    }
}

impl core::ops::Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping of len readable bytes, owned by self.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `open`, no longer referenced
            // (every slice borrows self).
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// The GNU build-id in the notes `notes` of a segment aligned to `align`.
pub fn build_id_in_notes(notes: &[u8], align: usize) -> Option<&[u8]> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align = if align == 8 { 8 } else { 4 };
    let word = |at: usize| -> Option<usize> {
        Some(u32::from_ne_bytes(notes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at)?, word(at + 4)?, word(at + 8)? as u32);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz)?.next_multiple_of(align);
        let end = desc_at.checked_add(descsz)?;
        if end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && notes.get(name_at..name_at + namesz)? == b"GNU\0" {
            return Some(&notes[desc_at..end]);
        }
        at = end.next_multiple_of(align);
    }
    None
}

/// Whether the object loaded at `bias` with program headers `phdrs` has
/// text relocations (DT_TEXTREL, or DF_TEXTREL in DT_FLAGS): its read-only
/// segments are then private copies, written by the loader, and differ
/// from the file's bytes.
pub fn text_relocated(bias: usize, phdrs: &[libc::Elf64_Phdr]) -> bool {
    const DT_TEXTREL: i64 = 22;
    const DT_FLAGS: i64 = 30;
    const DF_TEXTREL: u64 = 4;
    /// An entry of the dynamic section (Elf64_Dyn).
    #[repr(C)]
    struct Dyn {
        d_tag: i64,
        d_un: u64,
    }
    let Some(dynamic) = phdrs.iter().find(|ph| ph.p_type == libc::PT_DYNAMIC) else {
        return false;
    };
    let mut d = bias.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
    loop {
        // SAFETY: a loaded object's dynamic section, ended by DT_NULL.
        let e = unsafe { &*d };
        match e.d_tag {
            0 => return false,
            DT_TEXTREL => return true,
            DT_FLAGS if e.d_un & DF_TEXTREL != 0 => return true,
            _ => {}
        }
        // SAFETY: not yet at DT_NULL, so the next entry exists.
        d = unsafe { d.add(1) };
    }
}

/// `dladdr`'s rule for one symbol covering `[start, end)`, visited after
/// the ones already in `best` (per address of `addrs`, sorted): it becomes
/// an address's symbol if it covers it and starts above its current one
/// (so among symbols at one address, the first visited stays).
fn offer(best: &mut [Option<(usize, u32)>], addrs: &Spans, start: usize, end: usize, name: u32) {
    let mut i = addrs.first_from(start);
    while i < addrs.addrs.len() && addrs.addrs[i] < end {
        if best[i].is_none_or(|(cur, _)| cur < start) {
            best[i] = Some((start, name));
        }
        i += 1;
    }
}

/// Calls `f(start, size, defined, name)` for every symbol of the object's
/// dynamic symbol table that `dladdr` considers, in the order it visits
/// them (through the GNU hash table's chains, else the whole table): a
/// symbol covers `[start, start + max(size, 1))` for `dladdr`, `defined`
/// is false for an undefined symbol with a value (a non-PIE program's
/// canonical PLT entry), `name` is its offset in the string table. A table
/// that cannot be read to its end yields what was read so far (`dladdr`
/// would have faulted on it). Returns the tables, to read names with.
fn each_dynsym(img: &Image, mut f: impl FnMut(usize, u64, bool, u32)) -> Option<DynTables> {
    let tables = DynTables::of(img)?;
    let mut visit = |ndx: usize, hashed: bool| -> Option<()> {
        let at = tables.symtab.checked_add(ndx.checked_mul(SYM_SIZE)?)?;
        let s: libc::Elf64_Sym = img.read(at)?;
        if considered(&s, hashed, tables.strsz) {
            let start = img.bias.wrapping_add(s.st_value as usize);
            f(start, s.st_size, s.st_shndx != SHN_UNDEF, s.st_name);
        }
        Some(())
    };
    let _ = tables.visit_all(img, &mut visit);
    Some(tables)
}

/// Whether `dladdr` considers symbol `s` (reached through the GNU hash
/// table when `hashed`; `strsz` the string table's size).
fn considered(s: &libc::Elf64_Sym, hashed: bool, strsz: usize) -> bool {
    let (bind, kind, vis) = (s.st_info >> 4, s.st_info & 0xf, s.st_other & 3);
    (hashed || (matches!(bind, STB_GLOBAL | STB_WEAK) && vis != STV_HIDDEN && vis != STV_INTERNAL))
        && kind != STT_TLS
        && (s.st_shndx != SHN_UNDEF || s.st_value != 0)
        && s.st_shndx != SHN_ABS
        && (s.st_name as usize) < strsz
}

/// The dynamic symbol named `name` that starts at `addr`, found through the
/// object's GNU hash table as the loader finds names: a few symbols read,
/// where a [`DynIndex`] reads and sorts them all (libc's 3,000, in every
/// profiled process's start-up). None when the
/// object has no GNU hash table or no such symbol `dladdr` would consider.
pub fn dynsym_named(img: &Image, name: &[u8], addr: usize) -> Option<DynEntry> {
    let s = hashed_symbol(img, name, |s| {
        img.bias.wrapping_add(s.st_value as usize) == addr
    })?;
    Some(DynEntry {
        start: addr,
        size: s.st_size,
        defined: s.st_shndx != SHN_UNDEF,
    })
}

/// Whether the object has a GNU hash table, through which [`dynsym_defines`]
/// and [`dynsym_function`] ask it.
pub fn has_gnu_hash(img: &Image) -> bool {
    DynTables::of(img).is_some_and(|t| t.gnu_hash != 0)
}

/// Whether the object defines (and exports) a dynamic symbol `name`, found
/// through its GNU hash table (false without one).
pub fn dynsym_defines(img: &Image, name: &[u8]) -> bool {
    hashed_symbol(img, name, |s| s.st_shndx != SHN_UNDEF).is_some()
}

/// The function the object defines and exports as `name` (an `STT_FUNC`,
/// or an `STT_GNU_IFUNC`'s resolver: both text, as the `object` crate
/// counts them): its run-time start and `st_size`, through the GNU hash
/// table in memory (None without one).
pub fn dynsym_function(img: &Image, name: &[u8]) -> Option<(usize, u64)> {
    let s = hashed_symbol(img, name, |s| {
        s.st_shndx != SHN_UNDEF && matches!(s.st_info & 0xf, STT_FUNC | STT_GNU_IFUNC)
    })?;
    Some((img.bias.wrapping_add(s.st_value as usize), s.st_size))
}

/// Where an object's dynamic symbol tables lie (its hash tables, symbol
/// table, string table and version table), each as (start, end): what
/// [`dynsym_names`] and the lookups by name read. A table whose length
/// the dynamic section does not give runs to the next table's start or,
/// the last, to the end of its segment.
pub fn dynamic_table_spans(img: &Image) -> Vec<(usize, usize)> {
    let Some(t) = DynTables::of(img) else {
        return Vec::new();
    };
    let mut starts: Vec<usize> = [t.gnu_hash, t.hash, t.symtab, t.strtab, t.versym, t.verdef]
        .into_iter()
        .filter(|&a| a != 0)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    starts
        .iter()
        .enumerate()
        .filter_map(|(i, &start)| {
            let (_, seg_end, _) = *img
                .segments
                .iter()
                .find(|&&(lo, hi, r)| r && lo <= start && start < hi)?;
            let end = if start == t.strtab {
                start.saturating_add(t.strsz)
            } else {
                starts.get(i + 1).copied().unwrap_or(seg_end)
            };
            Some((start, end.min(seg_end)))
        })
        .collect()
}

/// The function named `name` that the object itself defines, as `dlsym`
/// on the object's handle finds it there (`version` None: the default
/// version, `name@@V`, or an unversioned one) or `dlvsym` (`version`: that
/// version, default or not): its run-time start and `st_size`, through
/// the GNU hash table in memory. Plain functions only (`dlsym` answers an
/// IFUNC with its resolver's choice, not the symbol's address); None for
/// anything else, and without a GNU hash table.
pub fn versioned_function(
    img: &Image,
    name: &[u8],
    version: Option<&[u8]>,
) -> Option<(usize, u64)> {
    let t = DynTables::of(img)?;
    if t.gnu_hash == 0 {
        return None;
    }
    let (s, _) = hashed_symbol_in(img, &t, name, |s, ndx| {
        s.st_shndx != SHN_UNDEF && s.st_info & 0xf == STT_FUNC && t.version_is(img, ndx, version)
    })?;
    Some((img.bias.wrapping_add(s.st_value as usize), s.st_size))
}

/// The dynamic symbol named `name` that `accept` takes, through the GNU
/// hash table.
fn hashed_symbol(
    img: &Image,
    name: &[u8],
    accept: impl Fn(&libc::Elf64_Sym) -> bool,
) -> Option<libc::Elf64_Sym> {
    let t = DynTables::of(img)?;
    hashed_symbol_in(img, &t, name, |s, _| accept(s)).map(|(s, _)| s)
}

/// [`hashed_symbol`] in the tables `t`, `accept` also given the symbol's
/// index; returns the symbol and its index.
fn hashed_symbol_in(
    img: &Image,
    t: &DynTables,
    name: &[u8],
    accept: impl Fn(&libc::Elf64_Sym, usize) -> bool,
) -> Option<(libc::Elf64_Sym, usize)> {
    if t.gnu_hash == 0 {
        return None;
    }
    let h = name
        .iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
    let g = GnuHash::of(img, t.gnu_hash)?;
    if g.nbuckets == 0 {
        return None;
    }
    let mut ndx = g.first(img, (h % g.nbuckets) as usize)??;
    loop {
        let ch = g.hash(img, ndx)?;
        if ch | 1 == h | 1 {
            let s: libc::Elf64_Sym = img.read(t.symtab + ndx as usize * SYM_SIZE)?;
            if considered(&s, true, t.strsz)
                && accept(&s, ndx as usize)
                && img.cstr(t.strtab + s.st_name as usize, t.strsz - s.st_name as usize)
                    == Some(name)
            {
                return Some((s, ndx as usize));
            }
        }
        if ch & 1 != 0 {
            return None;
        }
        ndx += 1;
    }
}

/// The symbol `dladdr` gives each address of `addrs` (sorted, all in this
/// object): (its start, its name), from the object's dynamic section and
/// symbol table as loaded, in one pass over the symbols.
pub fn dynsym_names(img: &Image, addrs: &[usize]) -> Vec<Option<(usize, Vec<u8>)>> {
    let mut best: Vec<Option<(usize, u32)>> = vec![None; addrs.len()];
    let spans = Spans::new(addrs);
    let Some(tables) = each_dynsym(img, |start, size, _, name| {
        let end = start.saturating_add((size as usize).max(1));
        offer(&mut best, &spans, start, end, name)
    }) else {
        return vec![None; addrs.len()];
    };
    best.into_iter()
        .map(|b| {
            let (start, name) = b?;
            let at = tables.strtab.checked_add(name as usize)?;
            let name = img.cstr(at, tables.strsz - name as usize)?;
            Some((start, name.to_vec()))
        })
        .collect()
}

/// One dynamic symbol of an object's [`DynIndex`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynEntry {
    pub start: usize,
    /// `st_size` (0 when unknown).
    pub size: u64,
    /// False for an undefined symbol with a value (see [`each_dynsym`]).
    pub defined: bool,
}

/// An object's dynamic symbols sorted by start, the first visited by
/// `dladdr` first among symbols that start at one address: answers what
/// `dladdr1` answers about a symbol *starting* at an address without
/// scanning the table for each question.
#[derive(Debug, Default)]
pub struct DynIndex {
    entries: Vec<DynEntry>,
}

impl DynIndex {
    pub fn of(img: &Image) -> DynIndex {
        let mut entries = Vec::new();
        each_dynsym(img, |start, size, defined, _| {
            entries.push(DynEntry {
                start,
                size,
                defined,
            })
        });
        // Stable: among equal starts, dladdr's visit order stays.
        entries.sort_by_key(|e| e.start);
        DynIndex { entries }
    }

    /// The symbol `dladdr` names for `addr` when one starts exactly there.
    pub fn starting_at(&self, addr: usize) -> Option<DynEntry> {
        let i = self.entries.partition_point(|e| e.start < addr);
        self.entries.get(i).filter(|e| e.start == addr).copied()
    }

    /// The first symbol start in `[from, to)`.
    pub fn first_start_in(&self, from: usize, to: usize) -> Option<usize> {
        let i = self.entries.partition_point(|e| e.start < from);
        self.entries.get(i).map(|e| e.start).filter(|&s| s < to)
    }
}

/// A GNU hash table (`DT_GNU_HASH`) as loaded: its buckets give each
/// chain's first symbol index; a chain runs over consecutive symbols, each
/// with its hash (bit 0 set on the chain's last).
struct GnuHash {
    nbuckets: u32,
    symbias: u32,
    buckets: usize,
    chain0: usize,
}

impl GnuHash {
    /// The table at `at` (None when its header cannot be read).
    fn of(img: &Image, at: usize) -> Option<GnuHash> {
        let nbuckets: u32 = img.read(at)?;
        let symbias: u32 = img.read(at + 4)?;
        let bloom_words: u32 = img.read(at + 8)?;
        let buckets = at + 16 + bloom_words as usize * 8;
        Some(GnuHash {
            nbuckets,
            symbias,
            buckets,
            chain0: buckets + nbuckets as usize * 4,
        })
    }

    /// The first symbol index of bucket `b`'s chain, None for an empty
    /// bucket (outer None: unreadable).
    fn first(&self, img: &Image, b: usize) -> Option<Option<u32>> {
        let ndx: u32 = img.read(self.buckets + b * 4)?;
        Some((ndx != 0 && ndx >= self.symbias).then_some(ndx))
    }

    /// The chain hash of symbol `ndx` (at or after its bucket's first).
    fn hash(&self, img: &Image, ndx: u32) -> Option<u32> {
        img.read(self.chain0 + (ndx - self.symbias) as usize * 4)
    }
}

/// Where an object's dynamic symbols are, from its dynamic section.
struct DynTables {
    symtab: usize,
    strtab: usize,
    strsz: usize,
    hash: usize,
    gnu_hash: usize,
    /// `.gnu.version` and `.gnu.version_d` (0: none) and the latter's
    /// number of entries.
    versym: usize,
    verdef: usize,
    verdefnum: usize,
}

/// An entry of `.gnu.version_d` (Elf64_Verdef).
#[derive(Clone, Copy)]
#[repr(C)]
struct Verdef {
    version: u16,
    flags: u16,
    ndx: u16,
    cnt: u16,
    hash: u32,
    aux: u32,
    next: u32,
}

impl DynTables {
    /// Whether symbol `ndx` has `version` (None: the default version, or
    /// no version at all).
    fn version_is(&self, img: &Image, ndx: usize, version: Option<&[u8]>) -> bool {
        if self.versym == 0 {
            return version.is_none();
        }
        let Some(v) = img.read::<u16>(self.versym.wrapping_add(ndx.wrapping_mul(2))) else {
            return false;
        };
        match version {
            None => v & VERSYM_HIDDEN == 0,
            Some(want) => self.version_name(img, v & !VERSYM_HIDDEN) == Some(want),
        }
    }

    /// The name of version index `index`, from `.gnu.version_d` (versions
    /// the object defines; a symbol it defines has one of them).
    fn version_name<'i>(&self, img: &'i Image, index: u16) -> Option<&'i [u8]> {
        let mut at = self.verdef;
        if at == 0 {
            return None;
        }
        for _ in 0..self.verdefnum.clamp(1, 1 << 16) {
            let d: Verdef = img.read(at)?;
            if d.ndx == index {
                let name: u32 = img.read(at.checked_add(d.aux as usize)?)?;
                let off = name as usize;
                return img.cstr(self.strtab.checked_add(off)?, self.strsz.checked_sub(off)?);
            }
            if d.next == 0 {
                return None;
            }
            at = at.checked_add(d.next as usize)?;
        }
        None
    }

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
            versym: 0,
            verdef: 0,
            verdefnum: 0,
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
                DT_VERSYM => t.versym = img.dyn_ptr(d.val),
                DT_VERDEF => t.verdef = img.dyn_ptr(d.val),
                DT_VERDEFNUM => t.verdefnum = d.val as usize,
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
            let g = GnuHash::of(img, self.gnu_hash)?;
            for b in 0..g.nbuckets as usize {
                let Some(mut ndx) = g.first(img, b)? else {
                    continue;
                };
                loop {
                    visit(ndx as usize, true)?;
                    let h = g.hash(img, ndx)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A file is the loaded object when its program headers and every note
    /// are the loaded bytes; one differing byte anywhere, or a read that
    /// fails, and it is not.
    #[test]
    fn a_file_matches_the_loaded_identity_only_byte_for_byte() {
        let mut file = vec![0u8; 4096];
        let phdrs: Vec<u8> = (0..112).map(|i| i as u8).collect();
        let note: Vec<u8> = (0..36).map(|i| 200 - i as u8).collect();
        file[64..176].copy_from_slice(&phdrs);
        file[800..836].copy_from_slice(&note);
        let id = LoadedIdentity {
            phdrs,
            notes: vec![(800, 4, note)],
        };
        let check = |f: &[u8]| {
            id.file_matches(64, |off, want| {
                let off = off as usize;
                f.get(off..off + want.len())
                    .map(|b| b == want)
                    .ok_or("short file")
            })
        };
        assert_eq!(check(&file), Ok(true));
        for at in [64, 175, 800, 835] {
            let mut other = file.clone();
            other[at] ^= 1;
            assert_eq!(check(&other), Ok(false), "byte {at} changed");
        }
        assert_eq!(check(&file[..820]), Err("short file"));
        assert!(!id.has_build_id(), "no GNU build-id note here");
    }

    #[test]
    fn dynsym_rule_prefers_the_greatest_covering_address_then_first_visited() {
        // In visit order: a big symbol covering all, an alias at 0x200
        // visited before a longer one there, a size-0 one at 0x300.
        let addrs = [0x50, 0x210, 0x285, 0x290, 0x300, 0x301, 0x1000];
        let mut best = vec![None; addrs.len()];
        let spans = Spans::new(&addrs);
        for (start, end, name) in [
            (0x100, 0x1000, 10),
            (0x200, 0x280, 20),
            (0x300, 0x301, 40),
            (0x200, 0x290, 30),
        ] {
            offer(&mut best, &spans, start, end, name);
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

    /// `first_from` agrees with a binary search over all the addresses,
    /// for spread, clustered, repeated and single addresses, at and
    /// between every address and beyond both ends.
    #[test]
    fn spans_find_what_a_binary_search_finds() {
        let sets: [&[usize]; 5] = [
            &[0x1000],
            &[0x10, 0x10, 0x10, 0x11],
            &[
                0x400000,
                0x400001,
                0x400002,
                0x7fff_0000_0000,
                0x7fff_0000_0008,
            ],
            &[
                3,
                90,
                91,
                200,
                201,
                202,
                5000,
                5001,
                70000,
                70001,
                70002,
                1 << 40,
            ],
            &[],
        ];
        for addrs in sets {
            let spans = Spans::new(addrs);
            let mut probes = vec![0, 1, usize::MAX];
            for &a in addrs {
                probes.extend([a - 1, a, a + 1, a + 1000]);
            }
            for v in probes {
                assert_eq!(
                    spans.first_from(v),
                    addrs.partition_point(|&a| a < v),
                    "{v:#x} in {addrs:x?}"
                );
            }
        }
    }

    extern "C" fn index_libc(
        info: *mut libc::dl_phdr_info,
        _: usize,
        out: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; out is our Vec.
        let (info, out) = unsafe { (&*info, &mut *(out as *mut Vec<DynEntry>)) };
        if !object_name(info).ends_with(b"/libc.so.6") {
            return 0;
        }
        // SAFETY: a loaded object, read inside the callback.
        let img = unsafe { Image::of(info) };
        let idx = DynIndex::of(&img);
        out.extend(idx.entries.iter().copied());
        1
    }

    extern "C" fn named_in_libc(
        info: *mut libc::dl_phdr_info,
        _: usize,
        out: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; out is our counter.
        let (info, out) = unsafe { (&*info, &mut *(out as *mut usize)) };
        if !object_name(info).ends_with(b"/libc.so.6") {
            return 0;
        }
        // SAFETY: a loaded object, read inside the callback.
        let img = unsafe { Image::of(info) };
        let mut all = Vec::new();
        let tables = each_dynsym(&img, |start, size, defined, name| {
            all.push((start, size, defined, name))
        })
        .unwrap();
        let name_of = |n: u32| {
            img.cstr(tables.strtab + n as usize, tables.strsz - n as usize)
                .unwrap()
        };
        for &(start, _, _, name) in &all {
            let name = name_of(name);
            let s = String::from_utf8_lossy(name);
            let found = dynsym_named(&img, name, start).unwrap_or_else(|| panic!("{s}"));
            // One of the symbols of that name there (versions of one
            // name may share an address: _sys_siglist).
            assert!(
                all.iter().any(|&(st, size, defined, n)| st == start
                    && name_of(n) == name
                    && (size, defined) == (found.size, found.defined)),
                "{s}: {found:?}"
            );
            assert_eq!(dynsym_named(&img, name, start + 1), None, "{s} one byte on");
            *out += 1;
        }
        assert_eq!(dynsym_named(&img, b"no_such_function_anywhere", 0), None);
        1
    }

    extern "C" fn holders_of_malloc(
        info: *mut libc::dl_phdr_info,
        _: usize,
        out: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; out is our Vec.
        let (info, out) = unsafe { (&*info, &mut *(out as *mut Vec<(bool, bool)>)) };
        // SAFETY: a NUL-terminated name; dlsym takes no lock held here.
        let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as usize;
        // SAFETY: a loaded object, inside the callback.
        let img = unsafe { Image::of(info) };
        let holds = img
            .segments
            .iter()
            .any(|&(lo, hi, _)| lo <= malloc && malloc < hi);
        // SAFETY: as above.
        out.push((holds, unsafe { may_hold(info, malloc, 4096) }));
        0
    }

    /// The cheap test says "may hold" for the object whose segment holds an
    /// address, and "no" for most of the others.
    #[test]
    fn may_hold_keeps_the_holder_and_skips_the_others() {
        let mut seen: Vec<(bool, bool)> = Vec::new();
        // SAFETY: the callback matches the type; seen outlives the call.
        unsafe {
            libc::dl_iterate_phdr(
                Some(holders_of_malloc),
                &mut seen as *mut Vec<(bool, bool)> as *mut libc::c_void,
            )
        };
        assert_eq!(seen.iter().filter(|&&(h, _)| h).count(), 1, "{seen:?}");
        assert!(seen.iter().all(|&(h, m)| !h || m), "{seen:?}");
        assert!(
            seen.iter().filter(|&&(_, m)| m).count() < seen.len(),
            "{seen:?}"
        );
    }

    /// The hash-table lookup finds every symbol the index holds, under its
    /// name at its start, with its size and definedness; nothing elsewhere.
    #[test]
    fn every_dynamic_symbol_of_libc_is_found_by_name_at_its_start() {
        let mut checked = 0usize;
        // SAFETY: the callback matches the type; checked outlives the call.
        unsafe {
            libc::dl_iterate_phdr(
                Some(named_in_libc),
                &mut checked as *mut usize as *mut libc::c_void,
            )
        };
        assert!(checked > 1000, "{checked} symbols");
    }

    #[test]
    fn the_index_answers_as_dladdr1_for_every_symbol_start_of_libc() {
        let mut entries: Vec<DynEntry> = Vec::new();
        // SAFETY: the callback matches the type; entries outlives the call.
        unsafe {
            libc::dl_iterate_phdr(
                Some(index_libc),
                &mut entries as *mut Vec<DynEntry> as *mut libc::c_void,
            )
        };
        assert!(entries.len() > 1000, "{} symbols", entries.len());
        let idx = DynIndex { entries };
        let mut checked = 0;
        for e in idx.entries.iter().filter(|e| e.defined) {
            // SAFETY: plain data filled by dladdr1.
            let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
            let mut sym: *mut libc::c_void = core::ptr::null_mut();
            // SAFETY: valid out-pointers; 1 (RTLD_DL_SYMENT) makes sym an Elf64_Sym*.
            let ok =
                unsafe { libc::dladdr1(e.start as *const libc::c_void, &mut info, &mut sym, 1) };
            assert!(ok != 0 && !sym.is_null(), "{:#x}", e.start);
            if info.dli_saddr as usize != e.start {
                continue; // a larger symbol's start dladdr prefers (as the index's first)
            }
            // SAFETY: glibc's pointer into the mapped .dynsym.
            let s = unsafe { &*(sym as *const libc::Elf64_Sym) };
            let mine = idx.starting_at(e.start).unwrap();
            assert_eq!(
                (mine.size, mine.defined),
                (s.st_size, s.st_shndx != 0),
                "{:#x}",
                e.start
            );
            checked += 1;
        }
        assert!(checked > 1000, "{checked}");
        let first = idx.entries[0].start;
        assert_eq!(idx.first_start_in(first, first + 1), Some(first));
        assert_eq!(idx.first_start_in(0, first), None);
    }
}
