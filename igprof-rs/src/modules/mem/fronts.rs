//! Allocators' own entry points beyond malloc's names: Rust's global
//! allocator shims (`__rust_alloc`, ... whatever allocator is plugged in),
//! jemalloc's families (plain, `je_`, `_rjem_`, with `mallocx`, `rallocx`,
//! `xallocx`, `sdallocx`, `dallocx`), mimalloc's `mi_*` and tcmalloc's
//! `tc_*`. They are found by their symbols in each loaded object's
//! `.symtab` or `.dynsym` (local symbols included: a statically linked
//! allocator's are rarely exported), at start-up and after each `dlopen`.
//!
//! Owns: which names belong to which family and what each call means
//! ([`Shape`]), the table of hooked entry points (one replacement per
//! slot, [`MAX`] slots), the one-line notes for objects whose allocator
//! cannot be seen, and the "front" rule: while an entry point hooked here
//! runs its original, the thread is marked (`site::MEM_FRONT`) and every
//! allocation hook it reaches passes through unrecorded, so that one
//! allocation is counted once, charged to the caller of the outermost
//! entry point (a Rust `Box::new` that ends in glibc's malloc is one
//! allocation of the Rust caller).
//!
//! Must never: be called from a signal handler (the scan reads files), or
//! record anything itself except through `hooks`' recording functions.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::hooks;
use super::memo::EntryRegs;
use super::site::{self, MEM_FRONT};
use trampoline::objscan::Name;

/// Where an entry point's size is among its (up to four) arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Argument `i`.
    Arg(u8),
    /// Argument `i` times argument `j` (calloc's count and size).
    Product(u8, u8),
    /// The length of the string returned, with its NUL (strdup).
    StrResult,
}

/// What a call of an entry point does, in the terms the profile records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Returns a new block (null on failure). `zeroed`: its contents
    /// matter to the program, so -ei/-eu do not fill it.
    Alloc { size: Size, zeroed: bool },
    /// Moves or resizes block `ptr` (argument index), returning the new
    /// one (null on failure, the old block kept), as realloc.
    Realloc { ptr: u8, size: Size },
    /// Releases block `ptr`.
    Free { ptr: u8 },
    /// posix_memalign(out, align, size): 0 and the block in `*out`.
    PosixMemalign,
    /// jemalloc's xallocx(ptr, size, extra, flags): resizes in place and
    /// returns the usable size, at least `size` on success.
    Resize,
}

impl Shape {
    /// Packed for an atomic slot (0 = empty).
    fn pack(self) -> u32 {
        let size = |s: Size| match s {
            Size::Arg(i) => 1 | (i as u32) << 2,
            Size::Product(i, j) => 2 | (i as u32) << 2 | (j as u32) << 4,
            Size::StrResult => 3,
        };
        match self {
            Shape::Alloc { size: s, zeroed } => 1 | size(s) << 4 | (zeroed as u32) << 12,
            Shape::Realloc { ptr, size: s } => 2 | size(s) << 4 | (ptr as u32) << 13,
            Shape::Free { ptr } => 3 | (ptr as u32) << 13,
            Shape::PosixMemalign => 4,
            Shape::Resize => 5,
        }
    }

    fn unpack(v: u32) -> Option<Shape> {
        let s = (v >> 4) & 0xff;
        let size = match s & 3 {
            1 => Size::Arg(((s >> 2) & 3) as u8),
            2 => Size::Product(((s >> 2) & 3) as u8, ((s >> 4) & 3) as u8),
            _ => Size::StrResult,
        };
        let ptr = ((v >> 13) & 3) as u8;
        Some(match v & 0xf {
            1 => Shape::Alloc {
                size,
                zeroed: v & (1 << 12) != 0,
            },
            2 => Shape::Realloc { ptr, size },
            3 => Shape::Free { ptr },
            4 => Shape::PosixMemalign,
            5 => Shape::Resize,
            _ => return None,
        })
    }
}

impl Size {
    fn of(self, a: &[usize; 4], result: usize) -> usize {
        match self {
            Size::Arg(i) => a[i as usize],
            Size::Product(i, j) => a[i as usize].wrapping_mul(a[j as usize]),
            Size::StrResult if result != 0 => {
                // SAFETY: a string the allocator just returned (non-null).
                unsafe { libc::strlen(result as *const libc::c_char) + 1 }
            }
            Size::StrResult => 0,
        }
    }
}

// ---- the families ----

use Shape::{Alloc, Free, PosixMemalign, Realloc, Resize};
use Size::{Arg, Product, StrResult};

const fn alloc(size: Size) -> Shape {
    Alloc {
        size,
        zeroed: false,
    }
}
const fn zalloc(size: Size) -> Shape {
    Alloc { size, zeroed: true }
}
const fn realloc(ptr: u8, size: Size) -> Shape {
    Realloc { ptr, size }
}
const FREE0: Shape = Free { ptr: 0 };

/// Rust's allocator shims, by the identifier rustc gives them (plain, or
/// the last path segment of a v0-mangled `__rustc::` name).
const RUST: &[(&str, Shape)] = &[
    ("__rust_alloc", alloc(Arg(0))),
    ("__rust_alloc_zeroed", zalloc(Arg(0))),
    ("__rust_realloc", realloc(0, Arg(3))),
    ("__rust_dealloc", FREE0),
];

/// jemalloc's non-standard entry points, after the family's prefix.
/// mallocx's flags may ask for zeroed memory: never filled.
const JEMALLOC_EXT: &[(&str, Shape)] = &[
    ("mallocx", zalloc(Arg(0))),
    ("rallocx", realloc(0, Arg(1))),
    ("xallocx", Resize),
    ("sdallocx", FREE0),
    ("dallocx", FREE0),
];

/// The standard names, hooked here only under a prefix (`je_malloc`):
/// unprefixed, they are the process's malloc, hooked by `super::install`.
const STANDARD: &[(&str, Shape)] = &[
    ("malloc", alloc(Arg(0))),
    ("calloc", zalloc(Product(0, 1))),
    ("realloc", realloc(0, Arg(1))),
    ("free", FREE0),
    ("posix_memalign", PosixMemalign),
    ("aligned_alloc", alloc(Arg(1))),
    ("memalign", alloc(Arg(1))),
    ("valloc", alloc(Arg(0))),
];

const JEMALLOC_PREFIXES: &[&str] = &["_rjem_", "je_", ""];

/// mimalloc's allocation API (C++'s throwing `mi_new*` are left out: an
/// exception must not pass through a replacement).
const MIMALLOC: &[(&str, Shape)] = &[
    ("mi_malloc", alloc(Arg(0))),
    ("mi_malloc_small", alloc(Arg(0))),
    ("mi_zalloc", zalloc(Arg(0))),
    ("mi_zalloc_small", zalloc(Arg(0))),
    ("mi_calloc", zalloc(Product(0, 1))),
    ("mi_mallocn", alloc(Product(0, 1))),
    ("mi_realloc", realloc(0, Arg(1))),
    ("mi_reallocn", realloc(0, Product(1, 2))),
    ("mi_reallocarray", realloc(0, Product(1, 2))),
    ("mi_rezalloc", realloc(0, Arg(1))),
    ("mi_recalloc", realloc(0, Product(1, 2))),
    ("mi_free", FREE0),
    ("mi_cfree", FREE0),
    ("mi_free_size", FREE0),
    ("mi_free_aligned", FREE0),
    ("mi_free_size_aligned", FREE0),
    ("mi_malloc_aligned", alloc(Arg(0))),
    ("mi_malloc_aligned_at", alloc(Arg(0))),
    ("mi_zalloc_aligned", zalloc(Arg(0))),
    ("mi_zalloc_aligned_at", zalloc(Arg(0))),
    ("mi_calloc_aligned", zalloc(Product(0, 1))),
    ("mi_calloc_aligned_at", zalloc(Product(0, 1))),
    ("mi_realloc_aligned", realloc(0, Arg(1))),
    ("mi_realloc_aligned_at", realloc(0, Arg(1))),
    ("mi_rezalloc_aligned", realloc(0, Arg(1))),
    ("mi_rezalloc_aligned_at", realloc(0, Arg(1))),
    ("mi_recalloc_aligned", realloc(0, Product(1, 2))),
    ("mi_strdup", zalloc(StrResult)),
    ("mi_strndup", zalloc(StrResult)),
    ("mi_posix_memalign", PosixMemalign),
    ("mi_memalign", alloc(Arg(1))),
    ("mi_aligned_alloc", alloc(Arg(1))),
    ("mi_valloc", alloc(Arg(0))),
    ("mi_pvalloc", alloc(Arg(0))),
    ("mi_heap_malloc", alloc(Arg(1))),
    ("mi_heap_malloc_small", alloc(Arg(1))),
    ("mi_heap_zalloc", zalloc(Arg(1))),
    ("mi_heap_calloc", zalloc(Product(1, 2))),
    ("mi_heap_mallocn", alloc(Product(1, 2))),
    ("mi_heap_realloc", realloc(1, Arg(2))),
    ("mi_heap_reallocn", realloc(1, Product(2, 3))),
    ("mi_heap_rezalloc", realloc(1, Arg(2))),
    ("mi_heap_malloc_aligned", alloc(Arg(1))),
    ("mi_heap_zalloc_aligned", zalloc(Arg(1))),
    ("mi_heap_calloc_aligned", zalloc(Product(1, 2))),
    ("mi_heap_realloc_aligned", realloc(1, Arg(2))),
    ("mi_heap_strdup", zalloc(StrResult)),
    ("mi_heap_strndup", zalloc(StrResult)),
];

/// tcmalloc's `tc_*` names (usually aliases of its malloc and operators,
/// then hooked once, under the standard name).
const TCMALLOC: &[(&str, Shape)] = &[
    ("tc_malloc", alloc(Arg(0))),
    ("tc_malloc_skip_new_handler", alloc(Arg(0))),
    ("tc_calloc", zalloc(Product(0, 1))),
    ("tc_realloc", realloc(0, Arg(1))),
    ("tc_free", FREE0),
    ("tc_free_sized", FREE0),
    ("tc_cfree", FREE0),
    ("tc_memalign", alloc(Arg(1))),
    ("tc_posix_memalign", PosixMemalign),
    ("tc_valloc", alloc(Arg(0))),
    ("tc_pvalloc", alloc(Arg(0))),
    ("tc_new", alloc(Arg(0))),
    ("tc_newarray", alloc(Arg(0))),
    ("tc_new_nothrow", alloc(Arg(0))),
    ("tc_newarray_nothrow", alloc(Arg(0))),
    ("tc_delete", FREE0),
    ("tc_deletearray", FREE0),
    ("tc_delete_sized", FREE0),
    ("tc_deletearray_sized", FREE0),
    ("tc_delete_nothrow", FREE0),
    ("tc_deletearray_nothrow", FREE0),
];

/// The family and shape of function `name`, if it is an allocator entry
/// point this file hooks.
pub fn shape_of(name: &str) -> Option<(Family, Shape)> {
    let find = |t: &[(&str, Shape)], n: &str| t.iter().find(|(k, _)| *k == n).map(|(_, s)| *s);
    if let Some(id) = rust_identifier(name) {
        return find(RUST, id).map(|s| (Family::Rust, s));
    }
    if name.starts_with("mi_") {
        return find(MIMALLOC, name).map(|s| (Family::Mimalloc, s));
    }
    if name.starts_with("tc_") {
        return find(TCMALLOC, name).map(|s| (Family::Tcmalloc, s));
    }
    for &p in JEMALLOC_PREFIXES {
        if let Some(rest) = name.strip_prefix(p) {
            if let Some(s) = find(JEMALLOC_EXT, rest) {
                return Some((Family::Jemalloc(p), s));
            }
            if !p.is_empty() {
                if let Some(s) = find(STANDARD, rest) {
                    return Some((Family::Jemalloc(p), s));
                }
            }
        }
    }
    None
}

/// The identifier of a Rust allocator shim's name: `__rust_alloc` as it
/// is, or the last segment of a v0-mangled path under `__rustc`
/// (`_RNvCs..._7___rustc12___rust_alloc`, rustc 1.86 and later).
fn rust_identifier(name: &str) -> Option<&str> {
    if name.starts_with("__rust_") {
        return Some(name);
    }
    let rest = name.strip_prefix("_RNv")?;
    let tail = &rest[rest.find("7___rustc")? + "7___rustc".len()..];
    let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
    let len: usize = tail[..digits].parse().ok()?;
    // v0 separates an identifier that starts with `_` from its length by
    // one more `_`.
    let id = tail[digits..].strip_prefix('_')?;
    (id.len() == len).then_some(id)
}

/// An allocator family. Its entry points are hooked in an object only if
/// the object defines one of the family's release functions and one of
/// its allocation functions (a lone `mallocx` may be somebody else's
/// function; a program linked with mimalloc keeps only the entry points
/// it calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Rust,
    /// jemalloc, with its symbol prefix.
    Jemalloc(&'static str),
    Mimalloc,
    Tcmalloc,
}

/// Whether `functions` (one object's entry points) hold an allocation and
/// a release function of `family`.
fn complete(family: Family, functions: &[trampoline::Symbol]) -> bool {
    let (mut alloc, mut release) = (false, false);
    for (fam, shape) in functions.iter().filter_map(|f| shape_of(&f.name)) {
        if fam == family {
            alloc |= matches!(shape, Alloc { .. });
            release |= matches!(shape, Free { .. });
        }
    }
    alloc && release
}

/// Names one of which an object that exports an allocator family exports
/// (its release functions, which every build keeps).
const MARKERS: &[&str] = &[
    "mi_free",
    "tc_free",
    "dallocx",
    "sdallocx",
    "je_dallocx",
    "je_sdallocx",
    "_rjem_dallocx",
    "_rjem_sdallocx",
    "__rust_dealloc",
];

/// A scan's test of a symbol name: most names of a large object (Python's
/// thousands of `_Py*`, node's C++ names) fail on their first bytes, read
/// before the name's end is found or any table is searched.
fn may_be_entry(name: Name<'_>) -> bool {
    let allocx = || name.get().is_some_and(|n| n.ends_with("allocx"));
    let candidate = match name.first() {
        Some(b'm') => name.starts_with(b"mi_") || allocx(),
        Some(b't') => name.starts_with(b"tc_"),
        Some(b'j') => name.starts_with(b"je_"),
        Some(b'_') => {
            name.starts_with(b"_RNv")
                && name
                    .get()
                    .is_some_and(|n| n.ends_with("alloc") || n.ends_with("_zeroed"))
                || name.starts_with(b"__rust_")
                || name.starts_with(b"_rjem_")
        }
        Some(b'r' | b'x' | b's' | b'd') => allocx(),
        _ => false,
    };
    candidate && name.get().is_some_and(|n| shape_of(n).is_some())
}

// ---- the hooked entry points ----

/// Entry points that can be hooked in one process.
pub const MAX: usize = 96;

struct Slot {
    chain: AtomicUsize,
    shape: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)] // each slot gets its own copy
const EMPTY: Slot = Slot {
    chain: AtomicUsize::new(0),
    shape: AtomicU32::new(0),
};
static SLOTS: [Slot; MAX] = [EMPTY; MAX];
static USED: AtomicUsize = AtomicUsize::new(0);

type Original = unsafe extern "C" fn(usize, usize, usize, usize) -> usize;

/// The replacement installed in slot `I`: a naked stub that leaves the
/// four argument registers as the program set them and adds the program's
/// stack pointer and frame pointer at the call (and LR on AArch64), so the
/// stack memo can answer as for malloc's hook, then jumps to
/// [`with_regs`]. The allocation APIs take at most four arguments, none a
/// floating-point one; those the original does not take are passed on
/// unread, and its result register is returned as it left it (nothing,
/// for a void function).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
extern "C" fn front<const I: usize>() {
    core::arch::naked_asm!("mov r8, rsp", "mov r9, rbp", "jmp {imp}", imp = sym with_regs::<I>)
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
extern "C" fn front<const I: usize>() {
    core::arch::naked_asm!("mov x4, sp", "mov x5, x29", "mov x6, x30", "b {imp}", imp = sym with_regs::<I>)
}

#[cfg(target_arch = "x86_64")]
extern "C" fn with_regs<const I: usize>(
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    sp: usize,
    fp: usize,
) -> usize {
    call(I, [a, b, c, d], EntryRegs { sp, fp, lr: 0 })
}

#[cfg(target_arch = "aarch64")]
#[allow(clippy::too_many_arguments)] // the registers of a call, as they came
extern "C" fn with_regs<const I: usize>(
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    sp: usize,
    fp: usize,
    lr: usize,
) -> usize {
    call(I, [a, b, c, d], EntryRegs { sp, fp, lr })
}

/// Runs slot `i`'s original for arguments `a`, recording what it did;
/// `regs` are the program's at the call.
#[inline(never)]
fn call(i: usize, a: [usize; 4], regs: EntryRegs) -> usize {
    let slot = &SLOTS[i];
    // SAFETY: the chain of slot i is the original of the function hooked
    // there, stored before the hook was enabled; it takes at most four
    // integer arguments (the tables above), so passing four is harmless.
    let orig: Original = unsafe { core::mem::transmute(slot.chain.load(Ordering::Relaxed)) };
    // SAFETY: the program's own call, forwarded unchanged.
    let run = || unsafe { orig(a[0], a[1], a[2], a[3]) };
    let shape = Shape::unpack(slot.shape.load(Ordering::Relaxed));
    let Some(shape) = shape.filter(|_| !site::inside_front()) else {
        // Inside another entry point hooked here: that one records.
        return run();
    };
    let ptr = |k: u8| a[k as usize] as *mut c_void;
    match shape {
        Alloc { size, zeroed } => {
            let r = as_front(run);
            hooks::allocated_by_front(r as *mut c_void, size.of(&a, r), !zeroed, regs);
            r
        }
        Realloc { ptr: k, size } => {
            hooks::reallocated_by_front(ptr(k), size.of(&a, 0), regs, || {
                as_front(run) as *mut c_void
            }) as usize
        }
        Free { ptr: k } => {
            hooks::freed_by_front(ptr(k));
            as_front(run)
        }
        PosixMemalign => {
            let r = as_front(run);
            let out = a[0] as *mut *mut c_void;
            if r as u32 == 0 && !out.is_null() {
                // SAFETY: on success the block was stored in *out.
                hooks::allocated_by_front(unsafe { *out }, a[2], true, regs);
            }
            r
        }
        Resize => {
            let r = as_front(run);
            if r >= a[1] {
                // Resized in place: the block now has its new size.
                hooks::freed_by_front(ptr(0));
                hooks::allocated_by_front(ptr(0), a[1], false, regs);
            }
            r
        }
    }
}

/// Runs `f` (an original) with the thread marked as inside an entry point.
#[inline(always)]
fn as_front(f: impl FnOnce() -> usize) -> usize {
    site::with_outer(MEM_FRONT, f)
}

/// The replacement of slot `i`.
fn replacement(i: usize) -> *const () {
    macro_rules! slots {
        ($($n:literal)*) => {
            match i {
                $($n => front::<$n> as *const (),)*
                _ => core::ptr::null(),
            }
        };
    }
    slots!(
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
        61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89
        90 91 92 93 94 95
    )
}

// ---- finding them ----

/// Objects scanned so far (path, load address), and the addresses hooked
/// by the memory module (the standard names' and the entry points'), so a
/// name at an address already hooked (an alias) is hooked once.
struct Scanned {
    objects: Vec<(String, u64)>,
    hooked: crate::hook::Hooked,
    /// Objects whose symbol tables were not read, an earlier process
    /// having found no entry point there (`scanned`).
    known_empty: usize,
}

static SCANNED: Mutex<Scanned> = Mutex::new(Scanned {
    objects: Vec::new(),
    hooked: crate::hook::Hooked::new(),
    known_empty: 0,
});

/// Start-up: scans every loaded object. `hooked` holds the addresses the
/// standard names were hooked at.
pub fn install(hooked: crate::hook::Hooked) {
    let mut s = SCANNED.lock().unwrap_or_else(|e| e.into_inner());
    s.hooked = hooked;
    scan_new(&mut s);
}

/// After a dlopen or dlclose: scans the objects not seen before.
pub fn objects_changed() {
    let mut s = SCANNED.lock().unwrap_or_else(|e| e.into_inner());
    scan_new(&mut s);
}

fn scan_new(s: &mut Scanned) {
    let t0 = crate::sys::monotonic_ns();
    let objects = trampoline::loaded_objects();
    // An object unloaded since is forgotten: another may load there.
    s.objects.retain(|o| objects.contains(o));
    let ours = own_base();
    let mut scanned = 0;
    for (path, base) in objects {
        if s.objects.iter().any(|(p, b)| *p == path && *b == base) {
            continue;
        }
        s.objects.push((path.clone(), base));
        if skipped(&path) || Some(base & !0xfff) == ours {
            continue;
        }
        scanned += 1;
        scan_one(s, &path, base);
    }
    if let Err(e) = super::scanned::save() {
        crate::igprof_debug!(
            "memory: could not keep the objects found without allocator entry points: {e}"
        );
    }
    if scanned > 0 {
        crate::igprof_debug!(
            "memory: allocator entry points: {scanned} object(s) scanned in {:.2} ms ({} symbol table(s) known to hold none), {} hooked in all",
            (crate::sys::monotonic_ns() - t0) as f64 / 1e6,
            s.known_empty,
            USED.load(Ordering::Relaxed)
        );
    }
}

/// Objects that define no allocator family: the dynamic loader, glibc's
/// libraries (libc's malloc is hooked by name; libpthread and libdl are
/// loaded in every profiled process, as this library needs them on
/// glibc 2.28), the vDSO. (This library is told by its address:
/// [`own_base`].)
fn skipped(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("ld-linux")
        || file.starts_with("linux-vdso")
        || file.starts_with("linux-gate")
        || GLIBC_LIBRARIES.contains(&file)
}

/// glibc's own libraries, by their sonames.
const GLIBC_LIBRARIES: [&str; 6] = [
    "libc.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "libm.so.6",
    "librt.so.1",
    "libresolv.so.2",
];

/// Where this library is loaded (its first page), as
/// `trampoline::loaded_objects` gives an object's base: the profiler's own
/// Rust allocator entry points must never be taken for the program's,
/// whatever the library's file is called (`IGPROF_LIB` may name a copy;
/// by its name alone, a renamed copy hooked its own `__rust_alloc`).
fn own_base() -> Option<u64> {
    trampoline::object_base_of(own_base as fn() -> Option<u64> as usize)
}

fn scan_one(s: &mut Scanned, path: &str, base: u64) {
    use trampoline::objscan::{exports_any, scan_object, Tables};
    let wanted = may_be_entry;
    // The headers first (is there a .symtab, is it Rust); the exported
    // symbols are read only when the loader's hash tables say the object
    // exports one of the families' markers, or it is Rust code (whose
    // shims' names carry a crate hash): a program built with -rdynamic
    // (cc1) exports tens of thousands of names. The .symtab is read only
    // where no family is exported and a hidden allocator is likely: the
    // program itself, Rust code, an object that defines malloc; not a
    // large C++ library with its symbols (libLLVM).
    let Some(headers) = scan_object(path, base, Tables::Headers, &wanted) else {
        return;
    };
    let allocator = exports_any(base, &["malloc"]);
    let mut scan = if headers.rust || exports_any(base, MARKERS) {
        match scan_object(path, base, Tables::Dynamic, &wanted) {
            Some(s) => s,
            None => return,
        }
    } else {
        headers
    };
    let exported = scan
        .functions
        .iter()
        .filter_map(|f| shape_of(&f.name))
        .any(|(family, _)| complete(family, &scan.functions));
    let likely = path.is_empty() || scan.rust || allocator;
    // An object whose symbol table an earlier process read: read only if
    // it held entry points (they must be hooked in this process too).
    let mut symtab_id = None;
    if !exported && likely && scan.symtab {
        if let Some(id) = scan.build_id.take() {
            if super::scanned::holds_none(&id) {
                s.known_empty += 1;
                return;
            }
            symtab_id = Some(id);
        }
        match scan_object(path, base, Tables::All, &wanted) {
            Some(all) => scan = all,
            None => return,
        }
    }
    let mut families = 0;
    for f in &scan.functions {
        let Some((family, shape)) = shape_of(&f.name) else {
            continue;
        };
        if complete(family, &scan.functions) {
            families += 1;
            hook_one(s, f, shape);
        }
    }
    if let (Some(id), 0) = (symtab_id, families) {
        super::scanned::remember(&id);
    }
    if scan.symtab || families > 0 {
        return;
    }
    if scan.rust || allocator {
        let name = if path.is_empty() {
            std::fs::read_link("/proc/self/exe")
                .map_or_else(|_| "the program".into(), |p| p.display().to_string())
        } else {
            path.to_string()
        };
        let what = if allocator {
            "an allocator of its own"
        } else {
            "Rust code"
        };
        crate::igprof_log!(
            "memory: {name} has {what} and no symbol table: allocations through entry points it does not export (a Rust global allocator, jemalloc's mallocx, mimalloc's mi_*) are not seen, those through malloc are; an unstripped build is seen in full"
        );
    }
}

fn hook_one(s: &mut Scanned, f: &trampoline::Symbol, shape: Shape) {
    let i = USED.load(Ordering::Relaxed);
    if i >= MAX {
        if i == MAX {
            crate::igprof_log!(
                "memory: more than {MAX} allocator entry points: {} and later ones are not hooked",
                f.name
            );
            USED.store(MAX + 1, Ordering::Relaxed);
        }
        return;
    }
    SLOTS[i].shape.store(shape.pack(), Ordering::Relaxed);
    site::FRONTS_HOOKED.store(true, Ordering::Relaxed);
    match s.hooked.hook(f, replacement(i), |c| {
        SLOTS[i].chain.store(c as usize, Ordering::Release)
    }) {
        Ok(true) => {
            USED.store(i + 1, Ordering::Relaxed);
        }
        Ok(false) => SLOTS[i].shape.store(0, Ordering::Relaxed),
        Err(err) => {
            SLOTS[i].shape.store(0, Ordering::Relaxed);
            crate::igprof_log!(
                "memory: cannot hook {}: {err}; its allocations are not seen",
                f.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_survive_packing() {
        let all = RUST
            .iter()
            .chain(JEMALLOC_EXT)
            .chain(STANDARD)
            .chain(MIMALLOC)
            .chain(TCMALLOC);
        for (name, s) in all {
            assert_eq!(Shape::unpack(s.pack()), Some(*s), "{name}");
        }
        assert_eq!(Shape::unpack(0), None);
    }

    #[test]
    fn glibcs_libraries_and_the_loader_are_not_scanned() {
        for path in [
            "/lib/x86_64-linux-gnu/libpthread.so.0",
            "/usr/lib/aarch64-linux-gnu/libdl.so.2",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "linux-vdso.so.1",
        ] {
            assert!(skipped(path), "{path}");
        }
        for path in [
            "",
            "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
            "/opt/app/libmimalloc.so.2",
            "/usr/lib/libc.so.6.custom",
        ] {
            assert!(!skipped(path), "{path}");
        }
    }

    #[test]
    fn names_are_told_apart() {
        assert_eq!(
            shape_of("_RNvCsfLfy6EI15iL_7___rustc14___rust_realloc"),
            Some((Family::Rust, realloc(0, Arg(3))))
        );
        assert_eq!(shape_of("__rust_dealloc"), Some((Family::Rust, FREE0)));
        // Other __rustc items are not allocator shims.
        assert_eq!(shape_of("_RNvCsfLfy6EI15iL_7___rustc10rust_panic"), None);
        assert_eq!(shape_of("_RNvCsfLfy6EI15iL_7___rustc11___rdl_alloc"), None);
        assert_eq!(
            shape_of("_rjem_sdallocx"),
            Some((Family::Jemalloc("_rjem_"), FREE0))
        );
        assert_eq!(
            shape_of("je_calloc"),
            Some((Family::Jemalloc("je_"), zalloc(Product(0, 1))))
        );
        assert_eq!(
            shape_of("mallocx"),
            Some((Family::Jemalloc(""), zalloc(Arg(0))))
        );
        // Unprefixed standard names belong to the process's malloc.
        assert_eq!(shape_of("malloc"), None);
        assert_eq!(
            shape_of("mi_heap_realloc"),
            Some((Family::Mimalloc, realloc(1, Arg(2))))
        );
        assert_eq!(shape_of("mi_new"), None);
        assert_eq!(shape_of("tc_deletearray"), Some((Family::Tcmalloc, FREE0)));
        let name = |s: &'static str| Name::new(s.as_bytes());
        assert!(!may_be_entry(name("main\0")));
        assert!(!may_be_entry(name("mi_\0")));
        assert!(may_be_entry(name("mi_malloc\0_Z3foov\0")));
        assert!(may_be_entry(name("mallocx\0")));
        assert!(may_be_entry(name("__rust_alloc\0")));
        assert!(!may_be_entry(name("_ZN4node5AllocEm\0")));
        // Not NUL-terminated in its table: no name.
        assert!(!may_be_entry(name("mi_malloc")));
    }

    #[test]
    fn sizes_read_the_right_arguments() {
        let a = [3, 5, 7, 11];
        assert_eq!(Arg(2).of(&a, 0), 7);
        assert_eq!(Product(1, 3).of(&a, 0), 55);
        let s = b"abc\0";
        assert_eq!(StrResult.of(&a, s.as_ptr() as usize), 4);
        assert_eq!(StrResult.of(&a, 0), 0);
    }
}
