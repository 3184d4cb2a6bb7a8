//! Whether the C library the program will run with can load libigprof.so.
//!
//! What it owns: reading the glibc symbol versions the library requires
//! (its `.gnu.version_r`), finding the `libc.so.6` the program's loader
//! will use (the one this launcher runs with when the program has the same
//! loader, or none; else the one beside the program's loader), reading the
//! versions that libc and its sibling libraries define (`.gnu.version_d`),
//! and, only when one is missing, the glibc release of that libc (its
//! banner, "release version X.Y") for the refusal line. A library that
//! cannot be loaded would otherwise be skipped by the loader with a message
//! the user may not see, or stop the program inside the loader, after the
//! launcher has gone.
//!
//! What it must never do: refuse a run on a guess. Anything it cannot read
//! (no libc found, an ELF file it does not understand) lets the run go on.
//! It starts no process and reads only the files named above: the
//! launcher's own loader and libc come from the loader's list of objects
//! (`dl_iterate_phdr`), not from `/proc/self/maps`.

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::Endianness;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A glibc version the library needs that the program's libc lacks.
#[derive(Debug, PartialEq, Eq)]
pub struct Missing {
    /// The program's libc.so.6.
    pub libc: PathBuf,
    /// Its glibc release ("2.31"), or the newest GLIBC_ version it defines.
    pub found: String,
    /// The newest missing version's release ("2.34").
    pub needed: String,
}

/// `GLIBC_2.34` -> (2, 34), `GLIBC_2.2.5` -> (2, 2, 5) as a sortable list.
fn glibc_number(name: &[u8]) -> Option<Vec<u32>> {
    let v = name.strip_prefix(b"GLIBC_")?;
    std::str::from_utf8(v)
        .ok()?
        .split('.')
        .map(|p| p.parse().ok())
        .collect()
}

/// A file mapped read-only into memory: the loader's own way of reading
/// these files, and only the pages looked at are read (the library carries
/// its debug information).
struct Mapped {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `addr` is a live read-only mapping of `len` bytes, kept
        // until drop.
        unsafe { std::slice::from_raw_parts(self.addr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in open_elf, unmapped once.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// `path` mapped, if it is a non-empty file that can be read.
fn open_elf(path: &Path) -> Option<Mapped> {
    let f = File::open(path).ok()?;
    let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
    if len == 0 {
        return None;
    }
    // SAFETY: a fresh private read-only mapping of an open file; no Rust
    // reference exists to the memory yet.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    (addr != libc::MAP_FAILED).then_some(Mapped { addr, len })
}

/// The (file, version) pairs of `path`'s version requirements.
fn needed_versions(path: &Path) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let map = open_elf(path)?;
    let data = map.bytes();
    let elf = FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian().ok()?;
    let sections = elf.sections(endian, data).ok()?;
    let Some((mut needs, strings_index)) = sections.gnu_verneed(endian, data).ok()? else {
        return Some(Vec::new());
    };
    // `strings_index`: the string table the section links to.
    let strings = sections
        .section(strings_index)
        .ok()?
        .data(endian, data)
        .ok()?;
    let mut out = Vec::new();
    while let Some((need, mut auxs)) = needs.next().ok()? {
        let file = string_at(strings, need.vn_file.get(endian))?.to_vec();
        while let Some(aux) = auxs.next().ok()? {
            out.push((
                file.clone(),
                string_at(strings, aux.vna_name.get(endian))?.to_vec(),
            ));
        }
    }
    Some(out)
}

/// Version names (`GLIBC_2.28`...).
type Versions = Vec<Vec<u8>>;

/// The version names `path` defines.
fn defined_versions(path: &Path) -> Option<Versions> {
    let map = open_elf(path)?;
    let data = map.bytes();
    let elf = FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian().ok()?;
    let sections = elf.sections(endian, data).ok()?;
    let (mut defs, strings_index) = sections.gnu_verdef(endian, data).ok()??;
    // `strings_index`: the string table the section links to.
    let strings = sections
        .section(strings_index)
        .ok()?
        .data(endian, data)
        .ok()?;
    let mut out = Vec::new();
    while let Some((_, mut auxs)) = defs.next().ok()? {
        // The first auxiliary entry is the version's own name; the others
        // name its parents.
        if let Some(aux) = auxs.next().ok()? {
            out.push(string_at(strings, aux.vda_name.get(endian))?.to_vec());
        }
    }
    Some(out)
}

/// The NUL-terminated string at `offset` of string table `table`. Not
/// `object`'s `StringTable`, whose search goes through `memchr`: its first
/// call runs the CPU feature detection of the standard library (a few
/// CPUID instructions, each a trap to the hypervisor in a VM), a cost the
/// launcher adds to every profiled process for a search over a few bytes.
fn string_at(table: &[u8], offset: u32) -> Option<&[u8]> {
    let rest = table.get(offset as usize..)?;
    Some(&rest[..rest.iter().position(|&b| b == 0)?])
}

/// The loader (PT_INTERP) of the ELF file `path`, if it has one.
fn interpreter(path: &Path) -> Option<PathBuf> {
    let map = open_elf(path)?;
    let data = map.bytes();
    let elf = FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian().ok()?;
    for ph in elf.program_headers(endian, data).ok()? {
        if let Some(interp) = ph.interpreter(endian, data).ok()? {
            return Some(PathBuf::from(std::ffi::OsStr::from_bytes(interp)));
        }
    }
    None
}

/// What the loader says of this process's own objects: the loader the
/// launcher runs with (its PT_INTERP, read from the program headers in
/// memory) and the libc.so.6 it loaded, as the loader named them. No file
/// is read: `dl_iterate_phdr` walks the loader's own list.
#[derive(Default)]
struct Own {
    interpreter: Option<PathBuf>,
    libc: Option<PathBuf>,
}

fn own() -> Own {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the Own passed below and `info` is valid for
        // the call (dl_iterate_phdr's contract).
        let (own, info) = unsafe { (&mut *data.cast::<Own>(), &*info) };
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: the loader's NUL-terminated name of the object.
            unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        if name.is_empty() && own.interpreter.is_none() {
            // The program itself (always first): its PT_INTERP, in memory.
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
            let phdrs =
                unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
            if let Some(ph) = phdrs.iter().find(|ph| ph.p_type == libc::PT_INTERP) {
                let at = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                // SAFETY: PT_INTERP lies in a loaded segment of the program
                // and holds a NUL-terminated path.
                let path = unsafe { std::ffi::CStr::from_ptr(at as *const libc::c_char) };
                own.interpreter = Some(PathBuf::from(std::ffi::OsStr::from_bytes(path.to_bytes())));
            }
        }
        let file = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
        if own.libc.is_none()
            && (file == b"libc.so.6" || (file.starts_with(b"libc-") && file.ends_with(b".so")))
        {
            own.libc = Some(PathBuf::from(std::ffi::OsStr::from_bytes(name)));
        }
        0
    }
    let mut o = Own::default();
    // SAFETY: the callback writes only `o`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut o as *mut Own).cast()) };
    o
}

/// Whether two paths name one file (links followed), else whether they
/// are the same text.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => a == b,
    }
}

/// The libc.so.6 that `program` will run with: this launcher's own when
/// the program is not an ELF file with a loader (a script: its interpreter
/// is looked up on this system) or has the launcher's loader; else the one
/// in the directory of the program's loader, if there is one.
pub fn program_libc(program: &Path) -> Option<PathBuf> {
    let own = own();
    match (interpreter(program), own.interpreter) {
        (Some(t), Some(o)) if !same_file(&t, &o) => {
            let dir = t.canonicalize().ok()?.parent()?.to_path_buf();
            Some(dir.join("libc.so.6")).filter(|p| p.exists())
        }
        _ => own.libc,
    }
}

/// The glibc release of `libc` from its banner ("... release version
/// 2.31."), else the newest GLIBC_ version in `defined`.
fn release_of(libc: &Path, defined: &[Vec<u8>]) -> String {
    let banner = std::fs::read(libc).ok().and_then(|b| {
        let key = b"release version ";
        let at = b.windows(key.len()).position(|w| w == key)? + key.len();
        let v: Vec<u8> = b[at..]
            .iter()
            .take(16)
            .copied()
            .take_while(|c| c.is_ascii_digit() || *c == b'.')
            .collect();
        let v = String::from_utf8(v).ok()?;
        let v = v.trim_end_matches('.');
        (!v.is_empty()).then(|| v.to_string())
    });
    banner.unwrap_or_else(|| {
        let newest = defined
            .iter()
            .filter_map(|d| glibc_number(d).map(|n| (n, d)))
            .max()
            .map_or("none".into(), |(_, d)| {
                String::from_utf8_lossy(&d[6..]).into_owned()
            });
        format!("{newest} (its newest symbol version)")
    })
}

impl Missing {
    /// The refusal line's text after `igprof: `, naming the library.
    pub fn message(&self, lib: &[u8]) -> Vec<u8> {
        [
            lib,
            format!(
                " needs glibc {0} or newer (symbol version GLIBC_{0}), but the program would run with glibc {1} ({2}): \
                 use a libigprof.so built by this project's `cargo build --release` (linked for glibc 2.28, see README), or run on glibc {0} or newer",
                self.needed,
                self.found,
                self.libc.display()
            )
            .as_bytes(),
        ]
        .concat()
    }
}

/// Whether every glibc version `lib` requires is defined by `libc` (or by
/// the library of the same name beside it: libdl.so.2, libpthread.so.0,
/// ld-linux...). None when it cannot tell.
pub fn missing(lib: &Path, libc: &Path) -> Option<Missing> {
    let needed = needed_versions(lib)?;
    let dir = libc.parent()?;
    let libc_defined = defined_versions(libc)?;
    // Each sibling's versions, read once however many it is asked for.
    let mut siblings: Vec<(&[u8], Option<Versions>)> = Vec::new();
    let mut newest: Option<(Vec<u32>, Vec<u8>)> = None;
    for (file, version) in &needed {
        let Some(number) = glibc_number(version) else {
            continue;
        };
        let sibling = if file.as_slice() == b"libc.so.6" {
            None
        } else {
            let i = match siblings.iter().position(|(f, _)| *f == file.as_slice()) {
                Some(i) => i,
                None => {
                    let path = dir.join(std::ffi::OsStr::from_bytes(file));
                    siblings.push((file.as_slice(), defined_versions(&path)));
                    siblings.len() - 1
                }
            };
            siblings[i].1.as_ref()
        };
        let defined = sibling.unwrap_or(&libc_defined);
        if !defined.contains(version) && newest.as_ref().is_none_or(|(n, _)| number > *n) {
            newest = Some((number, version.clone()));
        }
    }
    let (_, version) = newest?;
    Some(Missing {
        libc: libc.to_path_buf(),
        found: release_of(libc, &libc_defined),
        needed: String::from_utf8_lossy(&version[6..]).into_owned(),
    })
}

/// The check the launcher makes before the exec: Some when `lib` cannot be
/// loaded into `program` by the C library it will run with.
pub fn check(lib: &[u8], program: &[u8]) -> Option<Missing> {
    let libc = program_libc(Path::new(std::ffi::OsStr::from_bytes(program)))?;
    missing(Path::new(std::ffi::OsStr::from_bytes(lib)), &libc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_numbers_sort_as_releases() {
        assert_eq!(glibc_number(b"GLIBC_2.2.5"), Some(vec![2, 2, 5]));
        assert!(glibc_number(b"GLIBC_2.34") > glibc_number(b"GLIBC_2.4"));
        assert_eq!(glibc_number(b"GLIBC_PRIVATE"), None);
        assert_eq!(glibc_number(b"GCC_3.0"), None);
    }

    /// This process's own libc defines what the launcher needs from it, and
    /// its banner names the release getconf reports.
    #[test]
    fn the_running_libc_is_found_and_read() {
        let libc = own().libc.expect("libc.so.6 among the loader's objects");
        let defined = defined_versions(&libc).unwrap();
        assert!(defined.iter().any(|d| d == b"GLIBC_2.28"), "{defined:?}");
        let exe = std::env::current_exe().unwrap();
        assert_eq!(missing(&exe, &libc), None);
        let getconf = std::process::Command::new("getconf")
            .arg("GNU_LIBC_VERSION")
            .output()
            .unwrap();
        let want = String::from_utf8(getconf.stdout).unwrap();
        assert_eq!(
            format!("glibc {}", release_of(&libc, &defined)),
            want.trim()
        );
        assert_eq!(program_libc(&exe), Some(libc));
    }
}
