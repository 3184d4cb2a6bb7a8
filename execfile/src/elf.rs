//! The program file's ELF headers, read as far as preloading needs them.
//!
//! What it owns: reading the header, program headers (PT_INTERP,
//! PT_DYNAMIC, PT_LOAD) and dynamic section of a file of either class and
//! byte order with a few positioned reads ([`Elf`]), and what they say:
//! whether a loader will run the program ([`linkage`]: a script, a
//! dynamically linked program and the machine of its loader, or a
//! statically linked one) and which machine that is ([`Machine`]).
//!
//! What it must never do: trust the file (every offset and size is checked;
//! a header it cannot read gives `None`, never a panic), read more than
//! the headers need (at most 1 MiB past the first page), or map or run it.

use std::borrow::Cow;
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// The machines whose programs the launcher tells apart (by their loader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    Aarch64,
    X86_64,
}

impl Machine {
    /// The name as in `std::env::consts::ARCH`, bash's HOSTTYPE and triples.
    pub fn name(self) -> &'static [u8] {
        match self {
            Machine::Aarch64 => b"aarch64",
            Machine::X86_64 => b"x86_64",
        }
    }

    pub fn what(self) -> &'static [u8] {
        match self {
            Machine::Aarch64 => b"an AArch64",
            Machine::X86_64 => b"an x86-64",
        }
    }

    /// The variable naming the library built for this machine.
    pub fn lib_var(self) -> &'static str {
        match self {
            Machine::Aarch64 => "IGPROF_LIB_AARCH64",
            Machine::X86_64 => "IGPROF_LIB_X86_64",
        }
    }

    /// The machine whose loader `interp` (PT_INTERP) is, if known.
    pub fn of_loader(interp: &[u8]) -> Option<Machine> {
        if contains(interp, b"ld-linux-aarch64") {
            Some(Machine::Aarch64)
        } else if contains(interp, b"ld-linux-x86-64") {
            Some(Machine::X86_64)
        } else {
            None
        }
    }
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// How the program file is linked, as far as preloading goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Linkage {
    /// Not an ELF file (a script: its interpreter is what gets preloaded),
    /// or one that cannot be read.
    NotElf,
    /// A loader (PT_INTERP), and the machine it is for if known; or no
    /// loader but needed libraries (DT_NEEDED).
    Dynamic(Option<Machine>),
    /// No loader and no needed library, or unreadable program headers: no
    /// loader will put libigprof.so into it.
    Static,
}

/// Reads the ELF program headers of `path`: its loader (PT_INTERP), else
/// whether its dynamic section needs a library (DT_NEEDED).
pub fn linkage(path: &[u8]) -> Linkage {
    with_elf(path, |e| elf_linkage(e).unwrap_or(Linkage::Static)).unwrap_or(Linkage::NotElf)
}

/// [`linkage`] without allocating (for a child that `vfork` made, which
/// shares its parent's memory): None when that cannot tell, because the
/// program headers or the loader's path lie past the file's first page
/// (no linker puts them there) or the file cannot be opened.
pub fn linkage_no_alloc(path: &CStr) -> Option<Linkage> {
    // SAFETY: a NUL-terminated path, only read; the descriptor returned is
    // owned by the File below, which closes it.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened here and nothing else owns it.
    let f = unsafe { File::from_raw_fd(fd) };
    let mut head = [0u8; 4096];
    let n = read_at(&f, 0, &mut head);
    if !head[..n].starts_with(b"\x7fELF") {
        return Some(Linkage::NotElf);
    }
    let mut e = Elf::new(&f, &head[..n])?;
    e.alloc = false;
    elf_linkage(Some(&e))
}

/// The loader (PT_INTERP) the ELF file `path` names, without its NUL;
/// None when it is not an ELF file or names none.
pub fn interpreter(path: &[u8]) -> Option<Vec<u8>> {
    with_elf(path, |e| {
        let e = e?;
        let s = e.segments()?.into_iter().find(|s| s.kind == PT_INTERP)?;
        let interp = e.bytes(s.offset, s.size)?;
        Some(
            interp
                .split(|&b| b == 0)
                .next()
                .unwrap_or_default()
                .to_vec(),
        )
    })?
}

/// `read(elf)` on the ELF file `path`; None when it is not one (or cannot
/// be opened).
pub fn with_elf<R>(path: &[u8], read: impl FnOnce(Option<&Elf>) -> R) -> Option<R> {
    let f = File::open(OsStr::from_bytes(path)).ok()?;
    // The header, program headers, loader path and dynamic section sit in
    // the first pages of any linker's output: usually this one read is all.
    let mut head = [0u8; 4096];
    let n = read_at(&f, 0, &mut head);
    if !head[..n].starts_with(b"\x7fELF") {
        return None;
    }
    Some(read(Elf::new(&f, &head[..n]).as_ref()))
}

/// Reads into `buf` at `off` until it is full or the file ends; the count.
pub fn read_at(f: &File, off: u64, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    n
}

/// Fields of an ELF file of either class and byte order.
pub struct Elf<'a> {
    pub f: &'a File,
    pub head: &'a [u8],
    pub wide: bool,
    pub big: bool,
    /// Whether bytes past `head` may be read into memory allocated for
    /// them (else they are not read: [`linkage_no_alloc`]).
    pub alloc: bool,
}

pub const PT_LOAD: u64 = 1;
pub const PT_DYNAMIC: u64 = 2;
const PT_INTERP: u64 = 3;
pub const DT_NEEDED: u64 = 1;

/// One program header: p_type, p_offset, p_vaddr, p_filesz.
pub struct Segment {
    pub kind: u64,
    pub offset: u64,
    pub vaddr: u64,
    pub size: u64,
}

impl<'a> Elf<'a> {
    /// The reader of the ELF file `f` whose first bytes are `head`; None
    /// for an unknown class or byte order.
    pub fn new(f: &'a File, head: &'a [u8]) -> Option<Elf<'a>> {
        let wide = match head.get(4)? {
            1 => false,
            2 => true,
            _ => return None,
        };
        let big = match head.get(5)? {
            1 => false,
            2 => true,
            _ => return None,
        };
        Some(Elf {
            f,
            head,
            wide,
            big,
            alloc: true,
        })
    }

    /// `len` bytes at `off`: from the first read when it holds them.
    pub fn bytes(&self, off: u64, len: u64) -> Option<Cow<'_, [u8]>> {
        let end = off.checked_add(len)?;
        if end <= self.head.len() as u64 {
            return Some(self.head[off as usize..end as usize].into());
        }
        if len > 1 << 20 || !self.alloc {
            return None;
        }
        let mut v = vec![0; len as usize];
        (read_at(self.f, off, &mut v) == v.len()).then_some(v.into())
    }

    pub fn uint(&self, b: &[u8], off: usize, size: usize) -> Option<u64> {
        let b = b.get(off..off + size)?;
        let fold = |n: u64, &d: &u8| n << 8 | u64::from(d);
        Some(match self.big {
            true => b.iter().fold(0, fold),
            false => b.iter().rev().fold(0, fold),
        })
    }

    /// A word: 8 bytes in a 64-bit file, 4 in a 32-bit one.
    pub fn word(&self, b: &[u8], off64: usize, off32: usize) -> Option<u64> {
        match self.wide {
            true => self.uint(b, off64, 8),
            false => self.uint(b, off32, 4),
        }
    }

    /// The program headers; None when they cannot be read (also when
    /// their entry size is too small for one).
    pub fn segments(&self) -> Option<Vec<Segment>> {
        let (table, entsize) = self.segment_table()?;
        table
            .chunks_exact(entsize)
            .map(|ph| self.segment(ph))
            .collect()
    }

    /// The program header table's bytes and the size of an entry.
    fn segment_table(&self) -> Option<(Cow<'_, [u8]>, usize)> {
        let head = self.head;
        let phoff = self.word(head, 32, 28)?;
        let (entsize, count) = match self.wide {
            true => (self.uint(head, 54, 2)?, self.uint(head, 56, 2)?),
            false => (self.uint(head, 42, 2)?, self.uint(head, 44, 2)?),
        };
        if entsize < if self.wide { 56 } else { 32 } {
            return None;
        }
        Some((self.bytes(phoff, entsize * count)?, entsize as usize))
    }

    /// The program header `ph` (one entry of the table).
    fn segment(&self, ph: &[u8]) -> Option<Segment> {
        Some(Segment {
            kind: self.uint(ph, 0, 4)?,
            offset: self.word(ph, 8, 4)?,
            vaddr: self.word(ph, 16, 8)?,
            size: self.word(ph, 32, 16)?,
        })
    }

    /// The entries (tag, value) of the dynamic section `dynamic` before
    /// its DT_NULL.
    pub fn dynamic(&self, dynamic: &Segment) -> Option<Vec<(u64, u64)>> {
        let entries = self.bytes(dynamic.offset, dynamic.size)?;
        let mut v = Vec::new();
        for d in entries.chunks_exact(self.dyn_size()) {
            match self.dyn_entry(d)? {
                (0, _) => break,
                e => v.push(e),
            }
        }
        Some(v)
    }

    fn dyn_size(&self) -> usize {
        if self.wide {
            16
        } else {
            8
        }
    }

    /// One dynamic entry (tag, value).
    fn dyn_entry(&self, d: &[u8]) -> Option<(u64, u64)> {
        Some((self.word(d, 0, 0)?, self.word(d, 8, 4)?))
    }

    /// Whether the dynamic section `dynamic` has an entry tagged `tag`
    /// before its DT_NULL, read through a buffer on the stack (nothing
    /// allocated, wherever the section lies).
    fn dynamic_has(&self, dynamic: &Segment, tag: u64) -> Option<bool> {
        let size = self.dyn_size();
        let mut buf = [0u8; 512];
        let mut at = dynamic.offset;
        let end = dynamic.offset.checked_add(dynamic.size)?;
        while at + size as u64 <= end {
            let want = ((end - at) as usize).min(buf.len()) / size * size;
            let n = read_at(self.f, at, &mut buf[..want]) / size * size;
            if n == 0 {
                return None;
            }
            for d in buf[..n].chunks_exact(size) {
                match self.dyn_entry(d)? {
                    (0, _) => return Some(false),
                    (t, _) if t == tag => return Some(true),
                    _ => {}
                }
            }
            at += n as u64;
        }
        Some(false)
    }
}

/// The linkage of ELF file `e` (None: an unknown class or byte order);
/// None when its headers cannot be read (readelf would fail: the shell
/// launcher then called the program statically linked).
/// Nothing is allocated unless the program headers or the loader's path
/// lie past `e.head` (and `e.alloc` allows it).
fn elf_linkage(e: Option<&Elf>) -> Option<Linkage> {
    let e = e?;
    let (table, entsize) = e.segment_table()?;
    let find = |kind: u64| -> Option<Option<Segment>> {
        for ph in table.chunks_exact(entsize) {
            let s = e.segment(ph)?;
            if s.kind == kind {
                return Some(Some(s));
            }
        }
        Some(None)
    };
    if let Some(s) = find(PT_INTERP)? {
        let interp = e.bytes(s.offset, s.size)?;
        return Some(Linkage::Dynamic(Machine::of_loader(&interp)));
    }
    let Some(dynamic) = find(PT_DYNAMIC)? else {
        return Some(Linkage::Static);
    };
    Some(match e.dynamic_has(&dynamic, DT_NEEDED)? {
        true => Linkage::Dynamic(None),
        false => Linkage::Static,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;
    use std::process::Command;

    #[test]
    fn elf_linkage_static_dynamic_and_scripts() {
        let host = Machine::of_loader(match std::env::consts::ARCH {
            "aarch64" => b"/lib/ld-linux-aarch64.so.1",
            _ => b"/lib64/ld-linux-x86-64.so.2",
        });
        assert_eq!(linkage(b"/bin/true"), Linkage::Dynamic(host));
        let loader = interpreter(b"/bin/true").expect("/bin/true's loader");
        assert!(
            loader.starts_with(b"/") && !loader.contains(&0),
            "{loader:?}"
        );
        let d = std::env::temp_dir().join(format!("igprof-execfile-elf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = |n: &str| d.join(n).into_os_string().into_vec();
        // The same answer without allocating, where it can tell.
        let no_alloc = |n: &str| linkage_no_alloc(&std::ffi::CString::new(p(n)).unwrap());
        std::fs::write(
            d.join("script"),
            "#!/bin/sh\nexec /lib/ld-linux-aarch64.so.1\n",
        )
        .unwrap();
        assert_eq!(linkage(&p("script")), Linkage::NotElf);
        assert_eq!(no_alloc("script"), Some(Linkage::NotElf));
        assert_eq!(linkage(&p("missing")), Linkage::NotElf);
        assert_eq!(no_alloc("missing"), None);
        // An ELF whose headers cannot be read: readelf failed on it, and
        // the shell launcher refused it as statically linked.
        let t = std::fs::read("/bin/true").unwrap();
        std::fs::write(d.join("cut"), &t[..40]).unwrap();
        assert_eq!(linkage(&p("cut")), Linkage::Static);
        assert_eq!(no_alloc("cut"), None);
        std::fs::write(
            d.join("main.c"),
            "#include <stdio.h>\nint main(void) { return puts(\"x\") < 0; }\n",
        )
        .unwrap();
        let cc = |flags: &[&str], out: &str| {
            Command::new("cc")
                .args(flags)
                .arg("-o")
                .arg(d.join(out))
                .arg(d.join("main.c"))
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(cc(&[], "dynamic"), "cc");
        assert_eq!(linkage(&p("dynamic")), Linkage::Dynamic(host));
        assert_eq!(no_alloc("dynamic"), Some(Linkage::Dynamic(host)));
        // Without a static libc (no libc.a) there is nothing to check.
        if cc(&["-static"], "static") {
            assert_eq!(linkage(&p("static")), Linkage::Static);
            assert_eq!(no_alloc("static"), Some(Linkage::Static));
        }
        if cc(&["-static-pie"], "static-pie") {
            assert_eq!(linkage(&p("static-pie")), Linkage::Static);
            assert_eq!(no_alloc("static-pie"), Some(Linkage::Static));
        }
        // A shared library has no loader but needs libc (puts): not refused.
        if cc(&["-shared", "-fPIC"], "lib.so") {
            assert_eq!(linkage(&p("lib.so")), Linkage::Dynamic(None));
            assert_eq!(no_alloc("lib.so"), Some(Linkage::Dynamic(None)));
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
