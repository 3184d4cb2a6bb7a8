//! Whether the C library the program will run with can load libigprof.so.
//!
//! What it owns: reading the glibc symbol versions the library requires
//! (its `.gnu.version_r`), finding the `libc.so.6` the program's loader
//! will use (in `LD_LIBRARY_PATH`, else beside the program's loader: the
//! launcher asks no loader, having none when it is built static), reading
//! the versions that libc and its sibling libraries define
//! (`.gnu.version_d`), and, only when one is missing, the glibc release of
//! that libc (its banner, "release version X.Y") for the refusal line. A
//! library that cannot be loaded would otherwise be skipped by the loader
//! with a message the user may not see, or stop the program inside the
//! loader, after the launcher has gone.
//!
//! What it must never do: refuse a run on a guess. Anything it cannot read
//! (no libc found, an ELF file it does not understand) lets the run go on.
//! It starts no process and reads only the files named above (and a
//! script's `#!` line).

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::Endianness;
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
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
    let interp = crate::elf::interpreter(path.as_os_str().as_bytes())?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(interp)))
}

/// The loader this system's programs of the launcher's architecture name
/// (their PT_INTERP), for a program that names none it can read.
#[cfg(target_arch = "x86_64")]
const DEFAULT_LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
const DEFAULT_LOADER: &str = "/lib/ld-linux-aarch64.so.1";

/// The loader `program` runs with: its PT_INTERP; for a script, that of
/// the interpreter its `#!` line names (one level: `#!/usr/bin/env python3`
/// gives env's, the loader python3 also has on any usual system); else the
/// system's default loader.
fn loader_of(program: &Path) -> PathBuf {
    if let Some(interp) = interpreter(program) {
        return interp;
    }
    let shebang = std::fs::File::open(program).ok().and_then(|f| {
        use std::io::Read;
        let mut head = Vec::with_capacity(256);
        f.take(256).read_to_end(&mut head).ok()?;
        let line = head.strip_prefix(b"#!")?;
        let line = &line[..line.iter().position(|&b| b == b'\n')?];
        let first = line
            .split(|b| *b == b' ' || *b == b'\t')
            .find(|w| !w.is_empty())?;
        interpreter(Path::new(std::ffi::OsStr::from_bytes(first)))
    });
    shebang.unwrap_or_else(|| PathBuf::from(DEFAULT_LOADER))
}

/// The libc.so.6 that `program` will run with, found as its loader would
/// without a cache: the first directory of `ld_library_path` that holds
/// one, else the one in the directory of the program's loader (links
/// followed: `/lib64/ld-linux-x86-64.so.2` is Debian's
/// `/usr/lib/x86_64-linux-gnu/` one, Fedora's `/usr/lib64/` one). The
/// launcher has no loader of its own to ask (its release build is static).
fn libc_for(program: &Path, ld_library_path: Option<&[u8]>) -> Option<PathBuf> {
    let in_path = ld_library_path.and_then(|dirs| {
        dirs.split(|b| *b == b':' || *b == b';')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(std::ffi::OsStr::from_bytes(d)).join("libc.so.6"))
            .find(|p| p.is_file())
    });
    in_path.or_else(|| {
        let dir = loader_of(program)
            .canonicalize()
            .ok()?
            .parent()?
            .to_path_buf();
        Some(dir.join("libc.so.6")).filter(|p| p.is_file())
    })
}

/// The libc.so.6 that `program` will run with (`LD_LIBRARY_PATH` of this
/// process, which the exec passes on).
pub fn program_libc(program: &Path) -> Option<PathBuf> {
    let ld_library_path = crate::sys::env_set("LD_LIBRARY_PATH");
    libc_for(program, ld_library_path.as_deref())
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

    /// Whether two paths name one file.
    fn same_file(a: &Path, b: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
        (a.dev(), a.ino()) == (b.dev(), b.ino())
    }

    /// The libc a program of this machine runs with (this test's, as its
    /// maps show) is found beside its loader, for a script through its `#!`
    /// interpreter or the default loader, and first in LD_LIBRARY_PATH;
    /// its versions and banner are read.
    #[test]
    fn the_running_libc_is_found_and_read() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let running = maps
            .lines()
            .filter_map(crate::sys::maps_line_path)
            .find(|p| p.rsplit('/').next() == Some("libc.so.6"))
            .expect("this test runs with a libc.so.6");
        let exe = std::env::current_exe().unwrap();
        let libc = libc_for(&exe, None).expect("the libc beside the loader");
        assert!(same_file(&libc, Path::new(running)), "{libc:?} {running}");
        let defined = defined_versions(&libc).unwrap();
        assert!(defined.iter().any(|d| d == b"GLIBC_2.28"), "{defined:?}");
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

        let d = std::env::temp_dir().join(format!("igprof-launcher-libc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("lib")).unwrap();
        std::fs::write(d.join("script"), "#!/bin/sh -e\necho\n").unwrap();
        std::fs::write(d.join("plain"), "echo\n").unwrap();
        std::fs::write(d.join("lib/libc.so.6"), "").unwrap();
        for f in ["script", "plain"] {
            let found = libc_for(&d.join(f), None).unwrap();
            assert!(same_file(&found, &libc), "{f}: {found:?}");
        }
        let path = [
            b"/nowhere:".as_slice(),
            d.join("lib").as_os_str().as_bytes(),
        ]
        .concat();
        assert_eq!(libc_for(&exe, Some(&path)), Some(d.join("lib/libc.so.6")));
        let _ = std::fs::remove_dir_all(&d);
    }
}
