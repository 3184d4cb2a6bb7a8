//! The release binaries load on glibc 2.28 and newer: libigprof.so and
//! igprof-analyse as `cargo build --release` makes them (linked by
//! scripts/zig-linker against glibc 2.28) require no symbol version newer
//! than GLIBC_2.28, read from their dynamic symbol tables with `object`.
//! The AArch64 library is checked too (built first if needed). The
//! launcher users install is static (musl): it needs no C library at all.
//!
//! The check is shown to catch what it looks for on a program linked the
//! ordinary way against this machine's newer glibc.
//!
//! What it must never do: accept a binary whose version table it cannot read.

use igprof_tests::{analyser, foreign_lib, launcher, lib, scratch};
use object::elf::{FileHeader64, STB_WEAK};
use object::read::elf::{Dyn, FileHeader, ProgramHeader, Sym};
use object::Endianness;
use std::path::Path;
use std::process::Command;

/// The newest glibc the release binaries may require.
const OLDEST_GLIBC: (u32, u32) = (2, 28);

/// `GLIBC_2.34` -> (2, 34); None for other version names.
fn glibc_version(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.strip_prefix("GLIBC_")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The undefined dynamic symbols of the ELF file `path` bound to a glibc
/// version newer than `oldest`, as `name@GLIBC_x.y`.
fn newer_than(path: &Path, oldest: (u32, u32)) -> Vec<String> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let elf = FileHeader64::<Endianness>::parse(&*data)
        .unwrap_or_else(|e| panic!("{}: not a 64-bit ELF file: {e}", path.display()));
    let endian = elf.endian().unwrap();
    let sections = elf.sections(endian, &*data).unwrap();
    let symbols = sections
        .symbols(endian, &*data, object::elf::SHT_DYNSYM)
        .unwrap();
    let versions = sections
        .versions(endian, &*data)
        .unwrap()
        .unwrap_or_else(|| panic!("{}: no symbol version table", path.display()));
    let mut newer = Vec::new();
    for (index, sym) in symbols.enumerate() {
        if !sym.is_undefined(endian) {
            continue;
        }
        let Some(version) = versions
            .version(versions.version_index(endian, index))
            .unwrap()
        else {
            continue;
        };
        let vname = String::from_utf8_lossy(version.name()).into_owned();
        if glibc_version(&vname).is_some_and(|v| v > oldest) {
            let name = String::from_utf8_lossy(symbols.symbol_name(endian, sym).unwrap());
            let weak = if sym.st_bind() == STB_WEAK {
                " (weak)"
            } else {
                ""
            };
            newer.push(format!("{name}@{vname}{weak}"));
        }
    }
    newer
}

#[test]
fn release_binaries_need_no_glibc_newer_than_2_28() {
    let checked = [lib(), analyser(), foreign_lib()];
    let mut bad = Vec::new();
    for p in &checked {
        let newer = newer_than(p, OLDEST_GLIBC);
        if !newer.is_empty() {
            bad.push(format!("{}: {}", p.display(), newer.join(" ")));
        }
    }
    assert!(
        bad.is_empty(),
        "symbols newer than GLIBC_2.28 (link with scripts/zig-linker, see .cargo/config.toml):\n{}",
        bad.join("\n")
    );
}

/// The launcher has no loader (PT_INTERP) and needs no shared library
/// (DT_NEEDED): it runs on any Linux of its architecture, and a profiled
/// run pays no loader's and no glibc's start-up for it.
#[test]
fn the_launcher_needs_no_c_library() {
    let path = launcher();
    let data = std::fs::read(&path).unwrap();
    let elf = FileHeader64::<Endianness>::parse(&*data).unwrap();
    let endian = elf.endian().unwrap();
    let mut needed = 0;
    for ph in elf.program_headers(endian, &*data).unwrap() {
        assert!(
            ph.p_type(endian) != object::elf::PT_INTERP,
            "{} has a loader: not the static build",
            path.display()
        );
        let dynamic: &[object::elf::Dyn64<Endianness>] =
            ph.dynamic(endian, &*data).unwrap().unwrap_or_default();
        needed += dynamic
            .iter()
            .filter(|d| d.tag32(endian) == Some(object::elf::DT_NEEDED))
            .count();
    }
    assert_eq!(needed, 0, "{} needs shared libraries", path.display());
}

/// The check finds what it looks for: a program linked by this machine's
/// cc against its own glibc needs `pthread_create@GLIBC_2.34` when that glibc
/// is 2.34 or newer.
#[test]
fn the_check_sees_newer_symbols_in_an_ordinary_link() {
    let d = scratch("glibc-symbols");
    let src = d.join("t.c");
    std::fs::write(
        &src,
        "#include <pthread.h>\nstatic void *f(void *a) { return a; }\n\
         int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); return pthread_join(t, 0); }\n",
    )
    .unwrap();
    let exe = d.join("t");
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-pthread")
        .status()
        .unwrap();
    assert!(st.success(), "cc failed");
    let libc_version = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .unwrap();
    let libc_version = String::from_utf8_lossy(&libc_version.stdout);
    let v = libc_version
        .trim()
        .strip_prefix("glibc ")
        .and_then(|v| glibc_version(&format!("GLIBC_{v}")))
        .unwrap_or_else(|| panic!("getconf GNU_LIBC_VERSION: {libc_version}"));
    let newer = newer_than(&exe, OLDEST_GLIBC);
    if v >= (2, 34) {
        assert!(
            newer.iter().any(|s| s == "pthread_create@GLIBC_2.34"),
            "{newer:?}"
        );
    } else {
        eprintln!("this machine's glibc is {v:?}: pthread_create is older than 2.34 here");
    }
    assert_eq!(glibc_version("GLIBC_2.2.5"), Some((2, 2)));
}

/// A library that needs a newer glibc than the program's is refused before
/// the program runs, with one line naming both glibc releases. The library
/// is the release libigprof.so with its GLIBC_2.28 requirement renamed
/// GLIBC_9.28 (in .dynstr), which no C library defines.
#[test]
fn a_library_needing_a_newer_glibc_is_refused_with_one_line() {
    use object::{Object, ObjectSection};
    let d = scratch("glibc-newer");
    let real = std::fs::read(lib()).unwrap();
    let file = object::File::parse(&*real).unwrap();
    let (start, size) = file
        .section_by_name(".dynstr")
        .and_then(|s| s.file_range())
        .expect(".dynstr");
    let mut fake = real.clone();
    let dynstr = &mut fake[start as usize..(start + size) as usize];
    let at = dynstr
        .windows(11)
        .position(|w| w == b"GLIBC_2.28\0")
        .expect("libigprof.so needs GLIBC_2.28");
    dynstr[at + 6] = b'9';
    let lib = d.join("libigprof.so");
    std::fs::write(&lib, &fake).unwrap();
    let prog = igprof_tests::build(&d, "cpu_split.c", "cpu_split", &[]);
    let o = Command::new(igprof_tests::launcher())
        .env("IGPROF_LIB", &lib)
        .args(["-pp", "-o"])
        .arg(d.join("p.gz"))
        .arg(&prog)
        .arg("5")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(o.stdout.is_empty(), "the program ran: {:?}", o.stdout);
    let getconf = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .unwrap();
    let ours = String::from_utf8_lossy(&getconf.stdout).trim().to_string();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let want = format!(
        "igprof: {} needs glibc 9.28 or newer (symbol version GLIBC_9.28), but the program would run with {ours} (",
        lib.display()
    );
    assert!(lines[0].starts_with(&want), "{}\nwanted: {want}", lines[0]);
    assert!(!d.join("p.gz").exists());
}
