//! igprof-analyse --sysroot: a profile taken on another machine (here an
//! AArch64 program under qemu-user, whose libraries live under a root
//! directory) is named from the objects under that root.
//! Needs the release analyser and the AArch64 libigprof.so (scripts/test
//! builds both). On an AArch64 host the roles are swapped.

use std::path::Path;
use std::process::Command;

use igprof_tests::*;

/// The other architecture, its cross compiler and its Debian cross root.
fn foreign() -> (&'static str, &'static str, &'static str) {
    if cfg!(target_arch = "x86_64") {
        ("aarch64", "aarch64-linux-gnu-gcc", "/usr/aarch64-linux-gnu")
    } else {
        ("x86_64", "x86_64-linux-gnu-gcc", "/usr/x86_64-linux-gnu")
    }
}

/// The report of a successful igprof-analyse run in `dir`.
fn analyse(dir: &Path, args: &[&str]) -> String {
    let o = Command::new(analyser())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "igprof-analyse {args:?}: {err}");
    String::from_utf8(o.stdout).unwrap()
}

fn cc(cc: &str, dir: &Path, args: &[&str]) {
    let st = Command::new(cc)
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (scripts/setup installs the cross compiler)"));
    assert!(st.success(), "{cc} {args:?} failed");
}

const LIBRARY: &str = r#"
static volatile unsigned long sr_sink;
__attribute__((noinline)) static unsigned long sr_spin(unsigned long n) {
  unsigned long x = 0x9e3779b97f4a7c15ul;
  for (unsigned long i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; __asm__ volatile("" : "+r"(x)); }
  return x;
}
__attribute__((noinline)) static void sr_step(unsigned long n) { sr_sink += sr_spin(n); }
void sr_burn(int units) { for (int u = 0; u < units; u++) sr_step(1000000); }
"#;

const PROGRAM: &str = r#"
void sr_burn(int units);
int main(void) { sr_burn(40); return 0; }
"#;

/// The flat-profile line of the entry whose name starts with `prefix`.
fn entry<'a>(report: &'a str, prefix: &str) -> Option<&'a str> {
    report.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|n| n.starts_with(prefix))
    })
}

/// The offset in the first `@{libc.so.6+N}` entry of a report.
fn libc_offset(report: &str) -> u64 {
    let at = report.find("@{libc.so.6+").expect(report) + "@{libc.so.6+".len();
    let end = at + report[at..].find('}').unwrap();
    report[at..end].parse().unwrap()
}

#[test]
fn a_foreign_profile_is_named_from_the_objects_under_its_sysroot() {
    let (arch, compiler, cross_root) = foreign();
    let xlib = foreign_lib();
    let d = scratch("analyse_sysroot");
    // The machine's root: merged /usr (lib -> usr/lib), its C library and
    // what libigprof.so needs, copied from the cross root, and a library
    // with debug information that exists nowhere else.
    let sysroot = d.join("root");
    std::fs::create_dir_all(sysroot.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("usr/lib", sysroot.join("lib")).unwrap();
    for entry in std::fs::read_dir(Path::new(cross_root).join("lib")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with("ld-linux")
            || [
                "libc.so.6",
                "libm.so.6",
                "libgcc_s.so.1",
                "libpthread.so.0",
                "libdl.so.2",
            ]
            .contains(&name.as_str())
        {
            std::fs::copy(
                Path::new(cross_root).join("lib").join(&name),
                sysroot.join("usr/lib").join(&name),
            )
            .unwrap();
        }
    }
    std::fs::write(d.join("srdemo.c"), LIBRARY).unwrap();
    std::fs::write(d.join("main.c"), PROGRAM).unwrap();
    cc(
        compiler,
        &d,
        &[
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-o",
            "root/usr/lib/libsrdemo.so",
            "srdemo.c",
        ],
    );
    cc(
        compiler,
        &d,
        &[
            "-O2",
            "-g",
            "-o",
            "prog",
            "main.c",
            "-Lroot/usr/lib",
            "-lsrdemo",
        ],
    );
    let o = Command::new(launcher())
        .args(["-pp", "-i", "1ms", "-o", "prof.gz", "./prog"])
        .current_dir(&d)
        .env("IGPROF_LIB", lib())
        .env(format!("IGPROF_LIB_{}", arch.to_uppercase()), &xlib)
        .env("QEMU_LD_PREFIX", &sysroot)
        .output()
        .unwrap();
    let err = ok(&o);
    assert!(err.contains("profiling"), "{err}");
    let text = read_text(&d.join("prof.gz"));
    assert!(
        text.contains("=(/lib/libsrdemo.so)"),
        "the machine's path is recorded:\n{text}"
    );
    assert!(!Path::new("/lib/libsrdemo.so").exists());

    // The library's source lines come from its DWARF: only with --sysroot.
    let without = analyse(&d, &["--lines", "prof.gz"]);
    let with = analyse(&d, &["--lines", "-l", "--sysroot", "root", "prof.gz"]);
    let spin = entry(&with, "sr_spin").expect(&with);
    assert!(
        spin.contains("sr_spin (srdemo.c:") && spin.ends_with("/usr/lib/libsrdemo.so"),
        "{with}"
    );
    assert!(!without.contains("srdemo.c:"), "{without}");
    // Recorded names where the objects cannot be read.
    assert!(entry(&without, "sr_spin").is_some(), "{without}");

    // The stripped C library of the root: the frames of a function that no
    // symbol names are one entry at its start (from .eh_frame), not one per
    // return address as recorded.
    let recorded = libc_offset(&without);
    let start = libc_offset(&with);
    assert!(
        start < recorded && recorded - start < 4096,
        "{start} {recorded}\n{with}"
    );

    // A profile whose libc frames carry no recorded names (as a profiler
    // that records none writes it) is named from the root's libc; the
    // Debian cross root also serves the multiarch path of a native machine.
    let unnamed = text.replace("N=(__libc_start_main)", "N=(@?0x1)");
    assert_ne!(unnamed, text);
    std::fs::write(d.join("unnamed.txt"), &unnamed).unwrap();
    let multiarch = unnamed.replace(
        "=(/lib/libc.so.6)",
        &format!("=(/lib/{arch}-linux-gnu/libc.so.6)"),
    );
    std::fs::write(d.join("multiarch.txt"), &multiarch).unwrap();
    let no_root = analyse(&d, &["unnamed.txt"]);
    assert!(!no_root.contains("__libc_start_main"), "{no_root}");
    for (file, root) in [
        ("unnamed.txt", "root"),
        ("unnamed.txt", cross_root),
        ("multiarch.txt", cross_root),
    ] {
        let r = analyse(&d, &["--sysroot", root, file]);
        assert!(
            entry(&r, "__libc_start_main").is_some(),
            "{file} --sysroot {root}:\n{r}"
        );
        // libsrdemo.so is not in the cross root: its recorded names stay.
        assert!(
            entry(&r, "sr_spin").is_some(),
            "{file} --sysroot {root}:\n{r}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}
