//! The module table: which objects are mapped where, and where their unwind
//! information (`.eh_frame_hdr`, `.eh_frame`) lives in memory.
//!
//! Owns: building the table with `dl_iterate_phdr` (outside signal context
//! only: `refresh` takes a mutex and lets glibc take its loader lock),
//! publishing it through an `AtomicPtr` that walks read under a hazard slot
//! (`hazard.rs`), and freeing replaced tables once no slot holds them.
//! Object paths are kept in a never-freed arena, so `ModuleInfo::path`
//! stays valid after its table is gone. The table's arrays live in `mmap`ed
//! memory; framehop's per-module objects are made by the crate's global
//! allocator here, at refresh time, never during a walk. A new object's
//! `.eh_frame_hdr` is read once (for where `.eh_frame` starts), and the
//! file pages that read brought into the process are given back
//! (`base/resident.rs`); an object already in the replaced table keeps
//! what was read then.

use core::ops::Deref;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::collections::BTreeSet;
use std::sync::Mutex;

use framehop::{ExplicitModuleSectionInfo, MustNotAllocateDuringUnwind, Unwinder};

use super::descriptor::Descriptor;
use super::hazard::{self, Hazard};
use super::mem::{MapError, MmapBox, MmapSlice, Zeroable};
use super::store::{self, Ident, Registry, SaveReport, Stored};
use crate::base::resident::{Fresh, Pagemap};
use crate::sys::ErrnoGuard;

/// framehop's unwinder for the host architecture, reading unwind sections in
/// place from the mapped images.
pub(crate) type Framehop = framehop::UnwinderNative<SectionBytes, MustNotAllocateDuringUnwind>;

/// A byte range of a mapped image (`.eh_frame`, `.eh_frame_hdr`), read in
/// place by framehop.
#[derive(Clone, Copy)]
pub(crate) struct SectionBytes {
    ptr: *const u8,
    len: usize,
}

impl Default for SectionBytes {
    fn default() -> Self {
        SectionBytes {
            ptr: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len lies in a PT_LOAD segment of a loaded object
        // (checked when the table was built); it stays mapped while the
        // object is loaded. See "dlclose" in unwind/mod.rs for the window
        // after an unload.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// One loaded object.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct ModuleEntry {
    /// Lowest..highest address of the executable PT_LOAD segments.
    pub text: (usize, usize),
    /// Load bias (`dlpi_addr`): runtime address minus file address.
    pub base: usize,
    /// `.eh_frame_hdr` (from PT_GNU_EH_FRAME), or (0, 0).
    pub eh_frame_hdr: (usize, usize),
    /// `.eh_frame`: its start (from the header) to the end of its segment.
    pub eh_frame: (usize, usize),
    /// Address and length of the path in the never-freed name arena.
    name: (usize, usize),
    /// What its descriptors are derived from (for the descriptor store).
    pub(crate) ident: Ident,
    /// Its descriptors derived by earlier processes.
    pub(crate) stored: Stored,
    /// As `dl_iterate_phdr` listed it: its place in the loader's list,
    /// name (the loader's string) and program headers, all in memory the
    /// loader keeps while the object is loaded ([`listed_objects`]).
    order: usize,
    loader_name: usize,
    phdr: usize,
    phnum: usize,
}

// SAFETY: plain integers; all-zero is a valid (empty) entry.
unsafe impl Zeroable for ModuleEntry {}

/// A published snapshot of the loaded objects.
pub(crate) struct ModuleTable {
    /// Increases with every refresh; descriptor caches are tagged with it.
    pub(crate) generation: u32,
    /// Sorted by `text.0`.
    modules: MmapSlice<ModuleEntry>,
    /// Text range of the object that contains this unwinder (libigprof.so,
    /// or the test binary): frames there are the profiler's own.
    pub(crate) self_text: (usize, usize),
    pub(crate) framehop: Framehop,
    /// `Census::loads` when the table was built.
    loads: Option<(u64, u64)>,
}

/// What is known about the object containing an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Path as the dynamic loader knows it (the executable's is read from
    /// /proc/self/exe; the vDSO's is `linux-vdso.so.1`).
    pub path: &'static [u8],
    /// Load bias: subtract from an address to get the file's address.
    pub base: usize,
    /// The executable address range.
    pub text: (usize, usize),
}

/// Why the module table could not be rebuilt. The previous table (if any)
/// stays in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefreshError {
    /// Memory for the table could not be mapped.
    Map(MapError),
    /// Objects kept being loaded or unloaded while the table was built.
    KeptChanging { attempts: u32 },
}

impl core::fmt::Display for RefreshError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RefreshError::Map(e) => e.fmt(f),
            RefreshError::KeptChanging { attempts } => write!(
                f,
                "unwinder: the set of loaded objects changed during {attempts} attempts to list them; the old module table stays in use"
            ),
        }
    }
}

static TABLE: AtomicPtr<ModuleTable> = AtomicPtr::new(core::ptr::null_mut());
static GENERATION: AtomicU32 = AtomicU32::new(0);
/// Serialises refreshes; holds what only a refresh touches.
static REFRESH: Mutex<RefreshState> = Mutex::new(RefreshState {
    retired: Vec::new(),
    names: NameArena::new(),
    store: Registry::new(),
});
/// Replaced tables freed so far.
pub(crate) static TABLES_FREED: AtomicUsize = AtomicUsize::new(0);

struct RefreshState {
    /// Replaced tables that a walk may still have been reading (addresses).
    retired: Vec<usize>,
    names: NameArena,
    store: Registry,
}

/// Never-freed storage for object paths: a path seen once is kept for the
/// life of the process (a few KiB for hundreds of objects), once however
/// often its object is loaded again (a program that loads and unloads a
/// library in a loop kept its path again at each load: 32 bytes a round,
/// without end).
struct NameArena {
    chunk: usize,
    used: usize,
    cap: usize,
    kept: BTreeSet<&'static [u8]>,
}

impl NameArena {
    const fn new() -> Self {
        NameArena {
            chunk: 0,
            used: 0,
            cap: 0,
            kept: BTreeSet::new(),
        }
    }

    /// Copy `name` into the arena, or the copy made before; None if no
    /// memory could be mapped.
    fn keep(&mut self, name: &[u8]) -> Option<&'static [u8]> {
        if name.is_empty() {
            return Some(&[]);
        }
        if let Some(&kept) = self.kept.get(name) {
            return Some(kept);
        }
        if self.used + name.len() > self.cap {
            let cap = name.len().max(64 << 10);
            // Pages are faulted in as names are written, outside signal
            // context: a process's few paths touch one or two of them.
            self.chunk = MmapSlice::<u8>::zeroed_lazy(cap).ok()?.leak().as_mut_ptr() as usize;
            self.used = 0;
            self.cap = cap;
        }
        // SAFETY: chunk+used..+len lies in a leaked mapping of `cap` bytes,
        // not handed out before; it is never written again, so the shared
        // slice is valid for 'static.
        let dst = unsafe {
            core::slice::from_raw_parts_mut((self.chunk + self.used) as *mut u8, name.len())
        };
        dst.copy_from_slice(name);
        self.used += name.len();
        let dst: &'static [u8] = dst;
        self.kept.insert(dst);
        Some(dst)
    }
}

/// The current table read under `hazard`, which keeps it from being freed
/// until `hazard.clear()`. None before the first `refresh`.
/// Async-signal-safe.
/// The generation of the newest module table (being) built: a walk made
/// with a table of another generation may have seen other code.
/// Async-signal-safe (one atomic load).
#[inline]
pub fn generation() -> u32 {
    GENERATION.load(Ordering::Relaxed)
}

#[inline]
pub(crate) fn current(hazard: &Hazard) -> Option<&ModuleTable> {
    // SAFETY: a published table is fully built before its SeqCst
    // publication and is not freed while a hazard slot holds it.
    unsafe { hazard.protect(&TABLE).as_ref() }
}

/// Run `f` on the current table (under a briefly claimed hazard slot).
/// Async-signal-safe; None before the first `refresh` (or without memory
/// for a hazard slot).
pub(crate) fn with_current<R>(f: impl FnOnce(&ModuleTable) -> R) -> Option<R> {
    let h = Hazard::claim().ok()?;
    let r = current(h).map(f);
    h.release();
    r
}

/// Rebuild the module table from `dl_iterate_phdr` and publish it.
/// Outside signal context only. See `unwind/mod.rs`.
pub fn refresh() -> Result<(), RefreshError> {
    let _errno = ErrnoGuard::save();
    let mut state = REFRESH.lock().unwrap_or_else(|e| e.into_inner());
    let state = &mut *state;
    // SAFETY: only a refresh frees tables, and this one holds the mutex,
    // so the published table stays valid here.
    let old = unsafe { TABLE.load(Ordering::Acquire).as_ref() };
    const ATTEMPTS: u32 = 4;
    for _ in 0..ATTEMPTS {
        let census = count_objects();
        if census.loads.is_some() && old.is_some_and(|t| t.loads == census.loads) {
            // Nothing was loaded or unloaded since the current table was
            // built (a dlopen of an object already loaded, say): keep it.
            reclaim(&mut state.retired);
            return Ok(());
        }
        let mut entries =
            MmapSlice::<ModuleEntry>::zeroed(census.count).map_err(RefreshError::Map)?;
        let mut fill = Fill {
            entries: entries.as_mut_slice(),
            names: &mut state.names,
            old,
            n: 0,
            overflow: false,
            pagemap: None,
        };
        // SAFETY: the callback only touches `fill` through the data pointer,
        // which outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(fill_one), (&mut fill as *mut Fill).cast()) };
        if fill.overflow || fill.n != census.count || count_objects() != census {
            continue;
        }
        entries.as_mut_slice().sort_unstable_by_key(|m| m.text.0);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let mut framehop = Framehop::new();
        for m in entries.as_slice() {
            if let Some(fm) = framehop_module(m) {
                framehop.add_module(fm);
            }
        }
        let self_addr = refresh as *const () as usize;
        let own = entries
            .as_slice()
            .iter()
            .find(|m| m.text.0 <= self_addr && self_addr < m.text.1);
        let self_text = own.map_or((0, 0), |m| m.text);
        if let Some(own) = own.filter(|m| m.ident.build_id_len != 0) {
            state.store.set_producer(own.ident);
        }
        state.store.attach_all(
            entries
                .as_mut_slice()
                .iter_mut()
                .map(|m| (&m.ident, &mut m.stored)),
        );
        let table = MmapBox::new(ModuleTable {
            generation,
            modules: entries,
            self_text,
            framehop,
            loads: census.loads,
        })
        .map_err(RefreshError::Map)?;
        let replaced = TABLE.swap(table.into_raw(), Ordering::SeqCst);
        if !replaced.is_null() {
            state.retired.push(replaced as usize);
        }
        reclaim(&mut state.retired);
        return Ok(());
    }
    Err(RefreshError::KeptChanging { attempts: ATTEMPTS })
}

/// Free the replaced tables that no walk holds any more.
fn reclaim(retired: &mut Vec<usize>) {
    retired.retain(|&t| {
        if hazard::in_use(t as *const ModuleTable) {
            return true;
        }
        // SAFETY: t came from MmapBox::into_raw and was replaced in TABLE
        // before this scan: a new walk finds only the newer table, and no
        // hazard slot holds t, so no walk reads it.
        drop(unsafe { MmapBox::from_raw(t as *mut ModuleTable) });
        TABLES_FREED.fetch_add(1, Ordering::Relaxed);
        false
    });
}

/// True if `table` was replaced and is not freed yet (tests).
#[cfg(test)]
pub(crate) fn is_retired(table: usize) -> bool {
    REFRESH
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retired
        .contains(&table)
}

impl ModuleTable {
    /// Every object of the table (tests).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> &[ModuleEntry] {
        self.modules.as_slice()
    }

    /// The object whose executable range contains `pc`. Async-signal-safe.
    pub(crate) fn find(&self, pc: usize) -> Option<&ModuleEntry> {
        let modules = self.modules.as_slice();
        let i = modules.partition_point(|m| m.text.0 <= pc);
        let m = modules.get(i.checked_sub(1)?)?;
        (pc < m.text.1).then_some(m)
    }

    /// True if the code at `pc` is `code`. Reads only inside a known
    /// object's executable range. Async-signal-safe.
    pub(crate) fn code_at(&self, pc: usize, code: &[u8]) -> bool {
        match self.find(pc) {
            Some(m) if pc.checked_add(code.len()).is_some_and(|e| e <= m.text.1) => {
                // SAFETY: pc..pc+len lies in an executable PT_LOAD segment of
                // a loaded object, which is mapped readable.
                unsafe { core::slice::from_raw_parts(pc as *const u8, code.len()) == code }
            }
            _ => false,
        }
    }

    pub(crate) fn info(&self, m: &ModuleEntry) -> ModuleInfo {
        ModuleInfo {
            path: m.path(),
            base: m.base,
            text: m.text,
        }
    }
}

impl ModuleEntry {
    fn path(&self) -> &'static [u8] {
        // SAFETY: `name` was made from a slice of the never-freed name
        // arena (or is empty).
        unsafe { core::slice::from_raw_parts(self.name.0 as *const u8, self.name.1) }
    }

    /// The descriptor an earlier process derived for return address `pc`
    /// (in this object), if any. Interrupted PCs (`first`) are not
    /// stored: a sampled PC is seldom sampled again by another process,
    /// and storing them would grow the files with every run.
    /// Async-signal-safe.
    #[inline]
    pub(crate) fn stored_descriptor(&self, pc: usize, first: bool) -> Option<Descriptor> {
        if first {
            return None;
        }
        store::lookup(&self.stored, store::key(pc.wrapping_sub(self.base), first))
    }

    /// Logs a descriptor derived here for `pc`, for [`save_descriptors`]
    /// (return addresses only). Async-signal-safe.
    #[inline]
    pub(crate) fn derived(&self, pc: usize, first: bool, d: Descriptor) {
        if !first {
            store::record(
                self.stored.object,
                store::key(pc.wrapping_sub(self.base), first),
                d,
            )
        }
    }
}

/// Adds the descriptors this process derived to the descriptor store (see
/// `store.rs`). Outside signal context.
pub fn save_descriptors() -> SaveReport {
    let state = if crate::sys::abandoned() {
        // The keeper after the program's end: a thread killed in a
        // refresh holds the lock for ever, and the store can wait.
        match REFRESH.try_lock() {
            Ok(s) => s,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return SaveReport::default(),
        }
    } else {
        REFRESH.lock().unwrap_or_else(|e| e.into_inner())
    };
    state.store.save()
}

/// The loaded objects as `dl_iterate_phdr` listed them at the last
/// refresh, in its order, as the records it passes its callback (address,
/// name and program headers; no load counts, no TLS). For the keeper's
/// dump after the program's end, which must not call the loader: a thread
/// killed inside `dl_iterate_phdr` or `dlopen` holds the loader's lock for
/// ever. The objects are still mapped (nothing can unload them), and so
/// are the loader's strings and headers the records point to.
pub fn listed_objects() -> Vec<libc::dl_phdr_info> {
    let mut entries: Vec<ModuleEntry> =
        with_current(|t| t.modules.as_slice().to_vec()).unwrap_or_default();
    entries.sort_unstable_by_key(|m| m.order);
    entries
        .iter()
        .map(|m| {
            // SAFETY: dl_phdr_info is plain data; all-zero is valid (null
            // pointers, no TLS module).
            let mut i: libc::dl_phdr_info = unsafe { core::mem::zeroed() };
            i.dlpi_addr = m.base as _;
            i.dlpi_name = m.loader_name as *const libc::c_char;
            i.dlpi_phdr = m.phdr as *const _;
            i.dlpi_phnum = m.phnum as _;
            i
        })
        .collect()
}

/// The object containing `pc` in the current table. Async-signal-safe.
pub fn module_of(pc: usize) -> Option<ModuleInfo> {
    with_current(|t| t.find(pc).map(|m| t.info(m))).flatten()
}

fn framehop_module(m: &ModuleEntry) -> Option<framehop::Module<SectionBytes>> {
    if m.text.0 >= m.text.1 {
        return None;
    }
    let svma = |r: (usize, usize)| (r.0 - m.base) as u64..(r.0 - m.base + r.1) as u64;
    let bytes = |r: (usize, usize)| SectionBytes {
        ptr: r.0 as *const u8,
        len: r.1,
    };
    let mut info = ExplicitModuleSectionInfo::<SectionBytes> {
        base_svma: 0,
        ..Default::default()
    };
    if m.eh_frame_hdr.1 != 0 && m.eh_frame.1 != 0 {
        info.eh_frame_hdr_svma = Some(svma(m.eh_frame_hdr));
        info.eh_frame_hdr = Some(bytes(m.eh_frame_hdr));
        info.eh_frame_svma = Some(svma(m.eh_frame));
        info.eh_frame = Some(bytes(m.eh_frame));
    }
    // An empty name does not allocate.
    Some(framehop::Module::new(
        String::new(),
        m.text.0 as u64..m.text.1 as u64,
        m.base as u64,
        info,
    ))
}

struct Fill<'a> {
    entries: &'a mut [ModuleEntry],
    names: &'a mut NameArena,
    /// The table being replaced: its paths are reused.
    old: Option<&'a ModuleTable>,
    n: usize,
    /// The objects changed under us, or no memory for a path: retry.
    overflow: bool,
    /// `/proc/self/pagemap`, opened when a new object's header is read.
    pagemap: Option<Option<Pagemap>>,
}

impl Fill<'_> {
    fn pagemap(&mut self) -> Option<&Pagemap> {
        self.pagemap.get_or_insert_with(Pagemap::open).as_ref()
    }
}

/// How far from a new object's `.eh_frame_hdr` its pages are looked at
/// before and after the header is read.
const HEADER_READ_REACH: usize = crate::base::resident::FAULT_AROUND;

/// What one pass over the loaded objects saw.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Census {
    count: usize,
    /// glibc's counts of objects ever loaded and unloaded (`dlpi_adds`,
    /// `dlpi_subs`); None if the C library does not report them.
    loads: Option<(u64, u64)>,
}

fn count_objects() -> Census {
    unsafe extern "C" fn count(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: data is the Census passed below; info is valid for the
        // duration of the callback, with `size` bytes.
        let (c, info) = unsafe { (&mut *data.cast::<Census>(), &*info) };
        c.count += 1;
        if size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
            c.loads = Some((info.dlpi_adds, info.dlpi_subs));
        }
        0
    }
    let mut census = Census::default();
    // SAFETY: the callback only writes to census through data.
    unsafe { libc::dl_iterate_phdr(Some(count), (&mut census as *mut Census).cast()) };
    census
}

unsafe extern "C" fn fill_one(
    info: *mut libc::dl_phdr_info,
    _: usize,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: data is the Fill passed by refresh; info is valid for the call.
    let (fill, info) = unsafe { (&mut *data.cast::<Fill>(), &*info) };
    if fill.n >= fill.entries.len() {
        fill.overflow = true;
        return 1;
    }
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr as usize;
    let mut entry = ModuleEntry {
        base,
        order: fill.n,
        loader_name: info.dlpi_name as usize,
        phdr: info.dlpi_phdr as usize,
        phnum: info.dlpi_phnum as usize,
        ..Default::default()
    };
    let mut text = (usize::MAX, 0usize);
    for ph in phdrs {
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
            text.0 = text.0.min(base + ph.p_vaddr as usize);
            text.1 = text.1.max(base + (ph.p_vaddr + ph.p_memsz) as usize);
        } else if ph.p_type == libc::PT_GNU_EH_FRAME {
            entry.eh_frame_hdr = (base + ph.p_vaddr as usize, ph.p_memsz as usize);
        }
    }
    if text.0 < text.1 {
        entry.text = text;
    }
    // SAFETY: the loader's program headers of the object loaded at `base`.
    if let Some(id) = unsafe { store::build_id_of(base, phdrs) } {
        if id.len() <= entry.ident.build_id.len() {
            entry.ident.build_id[..id.len()].copy_from_slice(id);
            entry.ident.build_id_len = id.len() as u8;
        }
    }
    entry.ident.layout = [
        entry.text.0.wrapping_sub(base) as u64,
        entry.text.1.wrapping_sub(base) as u64,
        entry.eh_frame_hdr.0.wrapping_sub(base) as u64,
        entry.eh_frame_hdr.1 as u64,
    ];
    // The table being replaced is sorted by text start.
    let known = fill.old.and_then(|t| {
        let old = t.modules.as_slice();
        let i = old.binary_search_by_key(&entry.text.0, |m| m.text.0).ok()?;
        Some(&old[i])
            .filter(|m| m.base == base && m.ident == entry.ident && m.ident.build_id_len != 0)
    });
    if let Some(m) = known {
        // The same object as in the table being replaced: its header is
        // not read again.
        entry.eh_frame = m.eh_frame;
    } else if entry.eh_frame_hdr.1 != 0 {
        // Reading the header faults in the file's pages around it: an
        // object whose frames are never unwound (most of a program's
        // libraries) would keep them resident for the whole run. The ones
        // the program did not have are given back once it is read.
        let page = crate::sys::page_size();
        let fresh = fill.pagemap().and_then(|map| {
            Fresh::around(
                map,
                base,
                phdrs,
                page,
                entry.eh_frame_hdr.0,
                HEADER_READ_REACH,
            )
        });
        // SAFETY: PT_GNU_EH_FRAME lies inside a loaded segment.
        let hdr = unsafe {
            core::slice::from_raw_parts(entry.eh_frame_hdr.0 as *const u8, entry.eh_frame_hdr.1)
        };
        let start = eh_frame_start(hdr, entry.eh_frame_hdr.0);
        if let Some(fresh) = fresh {
            fresh.give_back();
        }
        if let Some(start) = start {
            // .eh_frame has no program header of its own: it runs at most to
            // the end of the PT_LOAD segment that holds it.
            let seg = phdrs.iter().find(|ph| {
                let lo = base + ph.p_vaddr as usize;
                ph.p_type == libc::PT_LOAD && lo <= start && start < lo + ph.p_memsz as usize
            });
            if let Some(ph) = seg {
                entry.eh_frame = (start, base + (ph.p_vaddr + ph.p_memsz) as usize - start);
            }
        }
    }
    // SAFETY: NUL-terminated (possibly empty) string.
    let name = unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let mut exe = [0u8; libc::PATH_MAX as usize];
    let name = if name.is_empty() && fill.n == 0 {
        // The first object is the executable, listed without a name.
        // SAFETY: readlink writes at most exe.len() bytes into exe.
        let n = unsafe {
            libc::readlink(
                c"/proc/self/exe".as_ptr(),
                exe.as_mut_ptr().cast(),
                exe.len(),
            )
        };
        if n > 0 {
            &exe[..n as usize]
        } else {
            name
        }
    } else {
        name
    };
    let kept = fill
        .old
        .and_then(|t| {
            t.modules
                .as_slice()
                .iter()
                .map(ModuleEntry::path)
                .find(|p| *p == name)
        })
        .or_else(|| fill.names.keep(name));
    let Some(kept) = kept else {
        fill.overflow = true;
        return 1;
    };
    entry.name = (kept.as_ptr() as usize, kept.len());
    fill.entries[fill.n] = entry;
    fill.n += 1;
    0
}

/// Decode `eh_frame_ptr` from an `.eh_frame_hdr` at address `hdr_addr`.
pub(crate) fn eh_frame_start(hdr: &[u8], hdr_addr: usize) -> Option<usize> {
    const OMIT: u8 = 0xff;
    if hdr.len() < 4 || hdr[0] != 1 || hdr[1] == OMIT {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let (value, _) = read_encoded(field, enc & 0x0f)?;
    let applied = match enc & 0x70 {
        0x00 => value,
        0x10 => (hdr_addr as u64 + 4).wrapping_add(value), // pcrel: from the field
        0x30 => (hdr_addr as u64).wrapping_add(value),     // datarel: from the header
        _ => return None,
    };
    Some(applied as usize)
}

/// A value of DWARF pointer format `format` (the low nibble of an
/// encoding) at the start of `b`, and its length.
#[link_section = "igprof_hot"]
pub(crate) fn read_encoded(b: &[u8], format: u8) -> Option<(u64, usize)> {
    let le = |n: usize| -> Option<u64> {
        let s = b.get(..n)?;
        Some(s.iter().rev().fold(0u64, |acc, &x| acc << 8 | x as u64))
    };
    Some(match format {
        0x00 | 0x04 => (le(8)?, 8),
        0x02 => (le(2)?, 2),
        0x03 => (le(4)?, 4),
        0x0a => (le(2)? as u16 as i16 as i64 as u64, 2),
        0x0b => (le(4)? as u32 as i32 as i64 as u64, 4),
        0x0c => (le(8)?, 8),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eh_frame_ptr_encodings() {
        // version 1, pcrel|sdata4, udata4 count, datarel|sdata4 table; eh_frame_ptr = -0x100
        let hdr = [1u8, 0x1b, 0x03, 0x3b, 0x00, 0xff, 0xff, 0xff];
        assert_eq!(eh_frame_start(&hdr, 0x10000), Some(0x10004 - 0x100));
        let hdr = [1u8, 0x03, 0x03, 0x3b, 0x78, 0x56, 0x34, 0x12];
        assert_eq!(eh_frame_start(&hdr, 0x10000), Some(0x12345678));
        let hdr = [1u8, 0xff, 0x03, 0x3b, 0, 0, 0, 0];
        assert_eq!(eh_frame_start(&hdr, 0x10000), None, "omitted pointer");
        let hdr = [2u8, 0x1b, 0x03, 0x3b, 0, 0, 0, 0];
        assert_eq!(eh_frame_start(&hdr, 0x10000), None, "unknown version");
    }
}
