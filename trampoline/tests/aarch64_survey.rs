//! The survey over Debian's AArch64 libraries (libc6-dev-arm64-cross and
//! the cross libstdc++): at least 99% of exported functions relocatable and
//! verified, every function the profiler needs relocatable. Reads the ELF
//! files only (runs on any host). Skipped, with a message naming the
//! package to install, when the files are absent.

use trampoline::aarch64::Aarch64;
use trampoline::arch::Arch;
use trampoline::survey::{survey_file, Outcome, REQUIRED};

const LIBS: [&str; 3] = [
    "/usr/aarch64-linux-gnu/lib/libc.so.6",
    "/usr/aarch64-linux-gnu/lib/libm.so.6",
    "/usr/aarch64-linux-gnu/lib/libstdc++.so.6",
];

#[test]
fn aarch64_libraries_are_relocatable() {
    if let Some(missing) = LIBS.iter().find(|p| !std::path::Path::new(p).exists()) {
        eprintln!(
            "SKIPPED aarch64 survey: {missing} is absent (apt-get install libc6-dev-arm64-cross \
             libstdc++6-arm64-cross, as the README's test command does)"
        );
        return;
    }
    let mut reports = Vec::new();
    for path in LIBS {
        let r = survey_file(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r.arch, Aarch64::NAME);
        println!("{}", r.summary_line());
        assert!(
            r.functions.len() > 500,
            "{path}: only {} functions found",
            r.functions.len()
        );
        let failed: Vec<_> = r
            .functions
            .iter()
            .filter(|f| matches!(f.outcome, Outcome::VerifyFailed(_)))
            .collect();
        assert!(
            failed.is_empty(),
            "{path}: verification failed for {:?}",
            &failed[..failed.len().min(5)]
        );
        assert!(r.percent() >= 99.0, "{}", r.summary_line());
        reports.push(r);
    }
    for name in REQUIRED {
        let found: Vec<_> = reports.iter().flat_map(|r| r.named(name)).collect();
        assert!(
            !found.is_empty(),
            "{name} not exported by the AArch64 libraries"
        );
        for f in found {
            assert!(
                matches!(f.outcome, Outcome::Relocatable { .. }),
                "{name}: {:?}",
                f.outcome
            );
        }
    }
}
