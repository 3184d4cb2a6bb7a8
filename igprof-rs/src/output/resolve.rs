//! Naming the merged tree's addresses for the records: objects and
//! functions (through `names`' per-object index, or `dladdr` for the check
//! profile), objects unloaded before the dump, and the synthetic frames.
//!
//! Owns the map from an address to the function and file identities the
//! writer uses ([`Resolved`], [`Naming`]) and the list of objects seen
//! before they were unloaded ([`remember_objects`]).
//!
//! Must never: name from signal context (dladdr and the object index
//! take the loader's lock).

use std::sync::atomic::{AtomicBool, Ordering};

use super::merge::{HashMap, SYNTHETIC_BASE};
use crate::base::tree::{ALLOCATOR_MMAP, TRUNCATED};

/// The call trees' synthetic markers: (address, file, name).
const MARKERS: [(usize, &[u8], &[u8]); 2] = [
    (TRUNCATED, b"<truncated>", b"@igprof_stack_truncated"),
    (ALLOCATOR_MMAP, b"<allocator mmap>", b"<allocator mmap>"),
];

/// Names of code addresses, with IgProf's function/file identities.
pub(super) struct Symbols {
    pub(super) files: HashMap<usize, (u32, Vec<u8>)>,
    pub(super) funcs: HashMap<(usize, usize), u32>,
    pub(super) exe: Vec<u8>,
}

pub(super) struct Resolved {
    pub(super) file_key: usize,
    pub(super) file_path: Vec<u8>,
    /// Symbol start (or the address itself when unknown).
    pub(super) sym_addr: usize,
    pub(super) name: Vec<u8>,
    pub(super) object_offset: u64,
}

/// Objects seen before a dlclose: (start, end, load base, path) of each
/// loaded segment, so that addresses in an unloaded library still get
/// their object and offset (names are then resolved by igprof-analyse).
/// (segment start, segment end, load base, object path).
type Segment = (usize, usize, usize, Vec<u8>);

pub(super) struct Unloaded {
    pub(super) lock: AtomicBool,
    pub(super) list: std::cell::UnsafeCell<Vec<Segment>>,
}
// SAFETY: `list` is only touched with `lock` held.
unsafe impl Sync for Unloaded {}

pub(super) static UNLOADED: Unloaded = Unloaded {
    lock: AtomicBool::new(false),
    list: std::cell::UnsafeCell::new(Vec::new()),
};

/// In a fork child: the parent's lock on the list is not held here.
pub(super) fn reset_after_fork() {
    UNLOADED.lock.store(false, Ordering::Release);
}

pub(super) fn with_unloaded<R>(f: impl FnOnce(&mut Vec<Segment>) -> R) -> R {
    crate::sys::spin_lock(&UNLOADED.lock);
    // SAFETY: lock held.
    let r = f(unsafe { &mut *UNLOADED.list.get() });
    UNLOADED.lock.store(false, Ordering::Release);
    r
}

/// Before a dlclose (not signal context): remember every loaded object's
/// segments so that samples in a library unloaded later keep their object.
pub fn remember_objects() {
    let mut now: Vec<Segment> = Vec::new();
    trampoline::image::first_object::<()>(|info| {
        let name = trampoline::image::object_name(info);
        if name.is_empty() {
            return None;
        }
        // SAFETY: a loaded object, read only inside first_object's callback.
        let img = unsafe { trampoline::image::Image::of(info) };
        for ph in img.phdrs().iter().filter(|ph| ph.p_type == libc::PT_LOAD) {
            let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
            now.push((
                start,
                start + ph.p_memsz as usize,
                info.dlpi_addr as usize,
                name.to_vec(),
            ));
        }
        None
    });
    with_unloaded(|list| {
        for e in now {
            if !list.contains(&e) {
                list.push(e);
            }
        }
    });
}

pub(super) fn resolve_unloaded(addr: usize) -> Option<Resolved> {
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

/// How a dump names code addresses.
pub(super) enum Naming {
    /// Names found for every address of the profile beforehand.
    Index(crate::output::names::Names),
    /// `dladdr` per address (the comparison dump of `IGPROF_NAMES_CHECK`).
    Dladdr,
}

impl Naming {
    /// How many distinct addresses it names (0 when it does not know).
    pub(super) fn addresses(&self) -> usize {
        match self {
            Naming::Index(names) => names.len(),
            Naming::Dladdr => 0,
        }
    }
}

pub(super) fn resolve(
    addr: usize,
    exe: &[u8],
    synthetic: &[&'static str],
    naming: &Naming,
) -> Resolved {
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
    if let Some(&(a, file, name)) = MARKERS.iter().find(|m| m.0 == addr) {
        return Resolved {
            file_key: a,
            file_path: file.to_vec(),
            sym_addr: a,
            name: name.to_vec(),
            object_offset: 0,
        };
    }
    let found = match naming {
        // An address the index was not made for (a node a running thread
        // added to the tree while a snapshot is written from it in place:
        // see view.rs) is named by dladdr.
        Naming::Index(names) => names
            .get(addr)
            .map(|(o, s)| Resolved {
                file_key: o.base,
                file_path: o.path.clone(),
                sym_addr: s.map_or(addr, |s| s.addr),
                name: s.map_or_else(|| format!("@?0x{addr:x}").into_bytes(), |s| s.name.clone()),
                object_offset: (addr - o.base) as u64,
            })
            .or_else(|| resolve_dladdr(addr, exe)),
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
pub(super) fn resolve_dladdr(addr: usize, exe: &[u8]) -> Option<Resolved> {
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
pub(super) fn is_main_program(fbase: usize) -> bool {
    // The first object dl_iterate_phdr reports is the main program.
    let base =
        trampoline::image::first_object(|info| Some(info.dlpi_addr as usize)).unwrap_or(usize::MAX);
    // A non-PIE executable has load bias 0 but dladdr reports its lowest mapping.
    base == fbase || base == 0
}
