//! The survey over Debian's AArch64 libraries (libc6-dev-arm64-cross and
//! the cross libstdc++): at least 99% of exported functions relocatable and
//! verified, every function the profiler needs relocatable; with the far
//! patch, at least 88% and refused only for being too short or for a
//! branch back into the patched bytes. Reads the ELF files only (runs on
//! any host). Skipped, with a message naming the package to install, when
//! the files are absent.

mod common;

use common::{any, assert_required_relocatable, checked_survey};
use trampoline::aarch64::Aarch64;
use trampoline::arch::Arch;
use trampoline::survey::PatchForm;
use trampoline::Reason;

const LIBS: [&str; 3] = [
    "/usr/aarch64-linux-gnu/lib/libc.so.6",
    "/usr/aarch64-linux-gnu/lib/libm.so.6",
    "/usr/aarch64-linux-gnu/lib/libstdc++.so.6",
];

/// False (after saying what to install) when a library is absent.
fn libs_present() -> bool {
    if let Some(missing) = LIBS.iter().find(|p| !std::path::Path::new(p).exists()) {
        eprintln!(
            "SKIPPED aarch64 survey: {missing} is absent (apt-get install libc6-dev-arm64-cross \
             libstdc++6-arm64-cross, as the README's test command does)"
        );
        return false;
    }
    true
}

#[test]
fn aarch64_libraries_are_relocatable() {
    if !libs_present() {
        return;
    }
    let reports: Vec<_> = LIBS
        .iter()
        .map(|path| checked_survey(path, PatchForm::Near, 500, 99.0, any))
        .collect();
    for r in &reports {
        assert_eq!(r.arch, Aarch64::NAME);
    }
    assert_required_relocatable(&reports);
}

#[test]
fn aarch64_libraries_far_patch() {
    if !libs_present() {
        return;
    }
    for path in LIBS {
        checked_survey(path, PatchForm::Far, 500, 88.0, |r| {
            matches!(
                r,
                Reason::TooShort { .. } | Reason::BranchIntoPatchedBytes { .. }
            )
        });
    }
}
