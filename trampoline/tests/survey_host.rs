//! Keeps the README's survey claim honest: run the survey logic over the
//! libc this test process has loaded and require >= 99% relocatable and
//! every function of `survey::REQUIRED` relocatable (all of them live in
//! libc.so.6 with glibc >= 2.34).

use trampoline::survey::{survey_file, Outcome, REQUIRED};

fn host_libc() -> String {
    trampoline::loaded_objects()
        .into_iter()
        .map(|(path, _)| path)
        .find(|p| p.rsplit('/').next() == Some("libc.so.6"))
        .expect("libc.so.6 is loaded in the test process")
}

#[test]
fn host_libc_is_at_least_99_percent_relocatable() {
    let path = host_libc();
    let report = survey_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    println!("{}", report.summary_line());
    println!("{:?}", report.by_outcome());
    assert!(
        report.functions.len() > 1000,
        "{path}: only {} functions",
        report.functions.len()
    );
    let verify_failures: Vec<_> = report
        .functions
        .iter()
        .filter(|f| matches!(f.outcome, Outcome::VerifyFailed(_)))
        .collect();
    assert!(
        verify_failures.is_empty(),
        "relocations that do not verify: {verify_failures:#?}"
    );
    assert!(report.percent() >= 99.0, "{}", report.summary_line());
    for name in REQUIRED {
        let found: Vec<_> = report.named(name).collect();
        assert!(!found.is_empty(), "{name} not exported by {path}");
        for f in found {
            assert!(
                matches!(f.outcome, Outcome::Relocatable { .. }),
                "{name}: {:?}",
                f.outcome
            );
        }
    }
}
