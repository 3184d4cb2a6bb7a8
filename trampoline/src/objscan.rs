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
    /// The file's GNU build-id (its `.note.gnu.build-id`), if it has one.
    pub build_id: Option<Vec<u8>>,
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

/// A function's name as a scan meets it: where it starts in its string
/// table, its end not yet found. A large program's names are mostly ones
/// no caller wants (node's 184,000 symbols: 12.8 MB of C++ names), so a
/// caller tells most of them apart by their first bytes, and only a name
/// that passes is measured (its NUL found) and checked as UTF-8.
#[derive(Clone, Copy)]
pub struct Name<'a> {
    /// The string table from the name's first byte on.
    tail: &'a [u8],
}

impl<'a> Name<'a> {
    pub fn new(tail: &'a [u8]) -> Self {
        Name { tail }
    }

    /// Whether the name starts with `prefix` (which holds no NUL), read
    /// without finding the name's end.
    #[inline]
    pub fn starts_with(&self, prefix: &[u8]) -> bool {
        self.tail.starts_with(prefix)
    }

    /// Whether the name is `name` (which holds no NUL).
    #[inline]
    pub fn is(&self, name: &str) -> bool {
        self.tail.starts_with(name.as_bytes()) && self.tail.get(name.len()) == Some(&0)
    }

    /// Its first byte (None for an empty name).
    #[inline]
    pub fn first(&self) -> Option<u8> {
        self.tail.first().copied().filter(|&b| b != 0)
    }

    /// The whole name, if it is NUL-terminated inside its table and UTF-8.
    pub fn get(&self) -> Option<&'a str> {
        let end = nul_at(self.tail)?;
        core::str::from_utf8(&self.tail[..end]).ok()
    }
}

/// The position of the first NUL byte of `s`, eight bytes at a time (the
/// bytes of a table of long names; not memchr: see `scan_object`).
fn nul_at(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut chunks = s.chunks_exact(8);
    let mut at = 0;
    for c in chunks.by_ref() {
        let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // The lowest byte set in `zero` is the first zero byte of `v`
        // (a borrow only carries into bytes above a zero one).
        let zero = v.wrapping_sub(ONES) & !v & HIGHS;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == 0)
        .map(|p| at + p)
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
    wanted: &dyn Fn(Name<'_>) -> bool,
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
        build_id: section(b".note.gnu.build-id").and_then(|h| {
            let notes = h.data(endian, data).ok()?;
            crate::image::build_id_in_notes(notes, h.sh_addralign(endian) as usize)
                .filter(|id| !id.is_empty())
                .map(<[u8]>::to_vec)
        }),
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
            let Some(tail) = strings.get(s.st_name(endian) as usize..) else {
                continue;
            };
            let name = Name::new(tail);
            if !wanted(name) {
                continue;
            }
            let Some(name) = name.get() else {
                continue;
            };
            if scan.functions.iter().any(|f| f.name == name) {
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
    Some(&rest[..nul_at(rest)?])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_at_finds_the_first_nul_as_a_byte_search_does() {
        // Every length up to 40 and every NUL position (or none), with
        // bytes around NUL (0x01, 0x80, 0xff) that a word-at-a-time test
        // could mistake for it.
        for len in 0..40 {
            for nul in (0..=len).chain([usize::MAX]) {
                for fill in [0x01u8, 0x80, 0xff, b'a'] {
                    let mut s = vec![fill; len];
                    if nul < len {
                        s[nul] = 0;
                        if nul + 1 < len {
                            s[nul + 1] = 0;
                        }
                    }
                    assert_eq!(
                        nul_at(&s),
                        s.iter().position(|&b| b == 0),
                        "{len} {nul} {fill}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_name_is_read_up_to_its_nul() {
        let table = b"mi_malloc\0_Z3foov\0broken";
        let n = Name::new(&table[..]);
        assert!(n.starts_with(b"mi_"));
        assert!(n.is("mi_malloc"));
        assert!(!n.is("mi_mall"));
        assert_eq!(n.get(), Some("mi_malloc"));
        assert_eq!(Name::new(&table[10..]).get(), Some("_Z3foov"));
        assert_eq!(Name::new(&table[18..]).get(), None);
        assert_eq!(Name::new(&table[9..]).first(), None);
    }
}
