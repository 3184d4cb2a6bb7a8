//! Sanitizer runtimes among the program's needed libraries, preloaded
//! ahead of libigprof.so.
//!
//! What it owns: finding, in the program's dynamic section (DT_NEEDED),
//! the shared runtime of a sanitizer (GCC's libasan, libhwasan, liblsan,
//! libtsan, libubsan; clang's libclang_rt.asan..., ...ubsan_standalone...),
//! and the LD_PRELOAD that puts those runtimes first, then libigprof.so,
//! then what the user preloaded.
//!
//! Why first: ASan (and HWASan) abort at start-up, exit status 1, unless
//! their runtime is the first object of the initial library list ("ASan
//! runtime does not come first in initial library list"), and every
//! sanitizer runtime replaces libc functions (malloc, free, ...) for the
//! whole process, which only works when it comes before every object that
//! defines or calls them. Linked into the program, the runtime is the
//! first of the program's needed libraries; preloading it ahead of
//! libigprof.so gives it the same place.
//!
//! How it is found: the LD_PRELOAD entry is the name the program needs,
//! unchanged. The loader looks a preloaded name without '/' up as it looks
//! up the program's own needed libraries (the program's RPATH,
//! LD_LIBRARY_PATH, its RUNPATH, /etc/ld.so.cache, the default
//! directories), so the file preloaded is the one the program would load,
//! and the program's DT_NEEDED entry then finds it loaded already. A name
//! with '/' is a path and is used as it is, as the loader does.
//!
//! Must never: change the preload of a program that needs no sanitizer
//! runtime, or change any environment variable (ASAN_OPTIONS included).

use crate::elf::{read_at, with_elf, Elf, Segment, DT_NEEDED, PT_DYNAMIC, PT_LOAD};

const DT_STRTAB: u64 = 5;

/// The sanitizer runtimes the ELF file `path` needs (DT_NEEDED), in the
/// order it names them; empty when it needs none or is not ELF.
pub fn runtimes(path: &[u8]) -> Vec<Vec<u8>> {
    with_elf(path, needed)
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| is_runtime(n))
        .collect()
}

/// Whether the needed library `name` is a sanitizer's runtime.
pub fn is_runtime(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    const GCC: [&[u8]; 5] = [
        b"libasan.so",
        b"libhwasan.so",
        b"liblsan.so",
        b"libtsan.so",
        b"libubsan.so",
    ];
    // clang: libclang_rt.asan-x86_64.so, libclang_rt.asan.so (per-target
    // runtime directories), libclang_rt.ubsan_standalone-x86_64.so, ...
    const CLANG: [&[u8]; 5] = [b"asan", b"hwasan", b"lsan", b"tsan", b"ubsan"];
    GCC.iter().any(|g| base.starts_with(g))
        || base
            .strip_prefix(b"libclang_rt.")
            .is_some_and(|rest| CLANG.iter().any(|c| rest.starts_with(c)))
}

/// LD_PRELOAD's value: `runtimes`, then `lib` (libigprof.so), then the
/// user's `preload` if any.
pub fn preload(runtimes: &[Vec<u8>], lib: &[u8], user: Option<&[u8]>) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = runtimes.iter().map(Vec::as_slice).collect();
    parts.push(lib);
    parts.extend(user);
    parts.join(&b':')
}

/// The names of the libraries the ELF file `e` needs (DT_NEEDED); None
/// when its dynamic section or string table cannot be read.
fn needed(e: Option<&Elf>) -> Option<Vec<Vec<u8>>> {
    let e = e?;
    let segments = e.segments()?;
    let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) else {
        return Some(Vec::new());
    };
    let entries = e.dynamic(dynamic)?;
    let Some(&(_, strtab)) = entries.iter().find(|d| d.0 == DT_STRTAB) else {
        return Some(Vec::new());
    };
    let strtab = file_offset(&segments, strtab)?;
    entries
        .iter()
        .filter(|d| d.0 == DT_NEEDED)
        .map(|&(_, name)| c_string_at(e, strtab.checked_add(name)?))
        .collect()
}

/// The file offset of virtual address `vaddr` (DT_STRTAB is an address):
/// through the PT_LOAD segment that maps it.
fn file_offset(segments: &[Segment], vaddr: u64) -> Option<u64> {
    segments
        .iter()
        .find(|s| s.kind == PT_LOAD && vaddr >= s.vaddr && vaddr - s.vaddr < s.size)
        .map(|s| s.offset + (vaddr - s.vaddr))
}

/// The NUL-terminated string at file offset `off` (at most PATH_MAX bytes).
fn c_string_at(e: &Elf, off: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    let n = read_at(e.f, off, &mut buf);
    let end = buf[..n].iter().position(|&b| b == 0)?;
    buf.truncate(end);
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_names() {
        for n in [
            "libasan.so.8",
            "libubsan.so.1",
            "libtsan.so.2",
            "liblsan.so.0",
            "libhwasan.so.0",
            "/opt/gcc/lib64/libasan.so.6",
            "libclang_rt.asan-x86_64.so",
            "libclang_rt.asan.so",
            "libclang_rt.ubsan_standalone-aarch64.so",
            "libclang_rt.hwasan-aarch64.so",
        ] {
            assert!(is_runtime(n.as_bytes()), "{n}");
        }
        for n in [
            "libc.so.6",
            "libasan_helper.so",
            "libmyasan.so",
            "libclang_rt.profile-x86_64.so",
            "libclang-cpp.so.15",
        ] {
            assert!(!is_runtime(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn preload_order() {
        let rt = vec![b"libasan.so.8".to_vec()];
        assert_eq!(
            preload(&rt, b"/x/libigprof.so", Some(b"/u/a.so:/u/b.so")),
            b"libasan.so.8:/x/libigprof.so:/u/a.so:/u/b.so"
        );
        assert_eq!(preload(&[], b"/x/libigprof.so", None), b"/x/libigprof.so");
    }

    #[test]
    fn needed_runtimes_of_built_programs() {
        use std::os::unix::ffi::OsStringExt;
        let d = std::env::temp_dir().join(format!("igprof-launcher-san-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("main.c"), "int main(void) { return 0; }\n").unwrap();
        let p = |n: &str| d.join(n).into_os_string().into_vec();
        let cc = |flag: &str, out: &str| {
            std::process::Command::new("cc")
                .args([flag, "-o"])
                .arg(d.join(out))
                .arg(d.join("main.c"))
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(cc("-O0", "plain"), "cc");
        assert!(runtimes(&p("plain")).is_empty());
        assert!(runtimes(&p("missing")).is_empty());
        assert!(runtimes(b"/bin/sh").is_empty());
        // scripts/setup installs GCC's sanitizer runtimes.
        for (flag, prefix) in [
            ("-fsanitize=address", "libasan.so."),
            ("-fsanitize=undefined", "libubsan.so."),
            ("-fsanitize=thread", "libtsan.so."),
        ] {
            assert!(cc(flag, "san"), "cc {flag}");
            let r = runtimes(&p("san"));
            assert_eq!(r.len(), 1, "{flag}: {r:?}");
            assert!(r[0].starts_with(prefix.as_bytes()), "{flag}: {r:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
