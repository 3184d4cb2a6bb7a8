//! Scanning one loaded object's file for the functions a caller names:
//! local symbols of `.symtab` included (a statically linked allocator's
//! entry points, Rust's allocator shims), which `dlsym` cannot see.
//!
//! Owns: mapping an object's file read-only for the scan (only the pages
//! of its headers and symbol tables are read: a 150 MB library costs its
//! symbol table, not its size), and what the scan reports besides the
//! functions: whether the file has a `.symtab`, and whether it was built
//! by rustc (its `.comment`, or a `.rustc` section).
//!
//! Must never: be called from a signal handler or a hook (it opens files
//! and allocates), keep a descriptor open after it returns, or keep the
//! mapping.

use crate::symbols::{load_bias, Symbol};
use object::{Object, ObjectSection, ObjectSymbol};

/// What a scan of one object's file found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The functions defined in the file whose names the caller wanted, at
    /// their run-time addresses (the first definition of a name wins,
    /// `.symtab` before `.dynsym`).
    pub functions: Vec<Symbol>,
    /// Whether the file has a static symbol table (it is not stripped).
    pub symtab: bool,
    /// Whether rustc built (or linked) the file.
    pub rust: bool,
}

/// Which symbol tables a scan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tables {
    /// None: only what the headers say (`.symtab` present, built by rustc).
    Headers,
    /// `.dynsym` only: what the object exports (small beside `.symtab` in
    /// an unstripped library, and enough when what is wanted is exported).
    Dynamic,
    /// `.symtab`, then `.dynsym`.
    All,
}

/// Scans the file of the object loaded at `base` from `path` (both as
/// [`crate::loaded_objects`] gives them: the load address of its lowest
/// segment, and the loader's path, empty for the main program) for function
/// definitions whose name `wanted` accepts, in `tables`. None if the file
/// cannot be opened, mapped or parsed.
pub fn scan_object(
    path: &str,
    base: u64,
    tables: Tables,
    wanted: &dyn Fn(&str) -> bool,
) -> Option<Scan> {
    let map = Mapped::open(crate::symbols::file_of(path))?;
    let file = object::File::parse(map.bytes()).ok()?;
    let bias = load_bias(&file, base);
    let mut scan = Scan {
        symtab: file.symbol_table().is_some(),
        rust: file.section_by_name(".rustc").is_some()
            || file
                .section_by_name(".comment")
                .and_then(|s| s.data().ok())
                .is_some_and(|d| d.windows(5).any(|w| w == b"rustc")),
        ..Scan::default()
    };
    if tables == Tables::Headers {
        return Some(scan);
    }
    let local = (tables == Tables::All).then(|| file.symbols());
    for s in local.into_iter().flatten().chain(file.dynamic_symbols()) {
        if s.kind() != object::SymbolKind::Text || !s.is_definition() {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        if !wanted(name) || scan.functions.iter().any(|f| f.name == name) {
            continue;
        }
        scan.functions.push(Symbol {
            name: name.to_string(),
            addr: s.address().wrapping_add(bias),
            size: (s.size() > 0).then_some(s.size()),
        });
    }
    Some(scan)
}

/// Whether the loaded object at `base` (the load address of its lowest
/// segment, as [`crate::loaded_objects`] gives it) exports any of `names`,
/// asked of its GNU hash table as loaded, without reading its symbol
/// table (a program built with `-rdynamic` exports tens of thousands of
/// names) and without the dynamic loader (a `dlopen` by path allocates in
/// the loader, which LeakSanitizer reports).
pub fn exports_any(base: u64, names: &[&str]) -> bool {
    struct Ask<'a> {
        base: u64,
        names: &'a [&'a str],
        found: bool,
    }
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; data is our Ask.
        let (info, ask) = unsafe { (&*info, &mut *(data as *mut Ask)) };
        if crate::symbols::object_base(info) != ask.base {
            return 0;
        }
        // SAFETY: a loaded object, read only inside this callback.
        let img = unsafe { crate::image::Image::of(info) };
        ask.found = ask
            .names
            .iter()
            .any(|n| crate::image::dynsym_defines(&img, n.as_bytes()));
        1
    }
    let mut ask = Ask {
        base,
        names,
        found: false,
    };
    // SAFETY: the callback only reads the object and writes `ask`.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut ask as *mut Ask as *mut libc::c_void) };
    ask.found
}

/// A file mapped read-only for the length of a scan.
struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    fn open(path: &str) -> Option<Mapped> {
        let c = std::ffi::CString::new(path).ok()?;
        // SAFETY: a NUL-terminated path; the descriptor is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a zeroed stat is a valid out-buffer for fstat.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: fd is open; st is writable.
        let len = if unsafe { libc::fstat(fd, &mut st) } == 0
            && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
        {
            st.st_size as usize
        } else {
            0
        };
        let ptr = if len == 0 {
            libc::MAP_FAILED
        } else {
            // SAFETY: a private read-only mapping of a regular file we opened.
            unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                )
            }
        };
        // SAFETY: our own descriptor; the mapping keeps the file.
        unsafe { libc::close(fd) };
        (ptr != libc::MAP_FAILED).then_some(Mapped { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: a live read-only mapping of `len` bytes, unmapped on drop.
        unsafe { core::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer borrowed (bytes() borrows self).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
