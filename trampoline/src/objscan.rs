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
use object::read::elf::{FileHeader, SectionHeader, Sym};

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
/// cannot be opened, mapped or parsed, or is not ELF64 (no object a 64-bit
/// process loads is anything else).
pub fn scan_object(
    path: &str,
    base: u64,
    tables: Tables,
    wanted: &dyn Fn(&str) -> bool,
) -> Option<Scan> {
    let map = crate::image::MappedFile::open(crate::symbols::file_of(path)).ok()?;
    let file = object::File::parse(&*map).ok()?;
    let bias = load_bias(&file, base);
    // Names are read from the string tables' bytes, not through object's
    // `StringTable`, whose search for a name's end goes through memchr:
    // its first call runs the standard library's CPU feature detection
    // (CPUID instructions, each a trap to the hypervisor in a VM: about 2%
    // of a profiled no-op's time there), which no profiled process needs.
    let object::File::Elf64(elf) = &file else {
        return None;
    };
    let (endian, data) = (elf.endian(), elf.data());
    let sections = elf.elf_section_table();
    let bytes_of = |index: object::SectionIndex| {
        let header = sections.section(index).ok()?;
        header.data(endian, data).ok()
    };
    let names = elf
        .elf_header()
        .shstrndx(endian, data)
        .ok()
        .and_then(|i| bytes_of(object::SectionIndex(i as usize)))
        .unwrap_or_default();
    let section = |wanted: &[u8]| {
        sections
            .iter()
            .find(|h| string_at(names, h.sh_name(endian)) == Some(wanted))
    };
    let mut scan = Scan {
        symtab: !elf.elf_symbol_table().is_empty(),
        rust: section(b".rustc").is_some()
            || section(b".comment")
                .and_then(|h| h.data(endian, data).ok())
                .is_some_and(|d| d.windows(5).any(|w| w == b"rustc")),
        ..Scan::default()
    };
    if tables == Tables::Headers {
        return Some(scan);
    }
    let local = (tables == Tables::All).then(|| elf.elf_symbol_table());
    for table in local.into_iter().chain([elf.elf_dynamic_symbol_table()]) {
        let Some(strings) = bytes_of(table.string_section()) else {
            continue;
        };
        for s in table.symbols() {
            // object's `SymbolKind::Text` and `is_definition` together.
            let shndx = s.st_shndx(endian);
            if s.st_type() != object::elf::STT_FUNC
                || shndx == object::elf::SHN_UNDEF
                || (shndx >= object::elf::SHN_LORESERVE && shndx != object::elf::SHN_XINDEX)
            {
                continue;
            }
            let Some(name) =
                string_at(strings, s.st_name(endian)).and_then(|n| core::str::from_utf8(n).ok())
            else {
                continue;
            };
            if !wanted(name) || scan.functions.iter().any(|f| f.name == name) {
                continue;
            }
            let size = s.st_size(endian);
            scan.functions.push(Symbol {
                name: name.to_string(),
                addr: s.st_value(endian).wrapping_add(bias),
                size: (size > 0).then_some(size),
            });
        }
    }
    Some(scan)
}

/// The NUL-terminated string at `offset` of string table `table`.
fn string_at(table: &[u8], offset: u32) -> Option<&[u8]> {
    let rest = table.get(offset as usize..)?;
    Some(&rest[..rest.iter().position(|&b| b == 0)?])
}

/// Whether the loaded object at `base` (the load address of its lowest
/// segment, as [`crate::loaded_objects`] gives it) exports any of `names`,
/// asked of its GNU hash table as loaded, without reading its symbol
/// table (a program built with `-rdynamic` exports tens of thousands of
/// names) and without the dynamic loader (a `dlopen` by path allocates in
/// the loader, which LeakSanitizer reports).
pub fn exports_any(base: u64, names: &[&str]) -> bool {
    crate::image::first_object(|info| {
        if crate::symbols::object_base(info) != base {
            return None;
        }
        // SAFETY: a loaded object, read only inside first_object's callback.
        let img = unsafe { crate::image::Image::of(info) };
        Some(
            names
                .iter()
                .any(|n| crate::image::dynsym_defines(&img, n.as_bytes())),
        )
    })
    .unwrap_or(false)
}
