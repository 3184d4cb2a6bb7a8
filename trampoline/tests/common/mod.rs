//! Checks shared by the survey tests (`aarch64_survey`, `survey_host`): they
//! keep the README's survey figures honest.
//!
//! Must never: hold figures of its own; each test passes its floors.

use trampoline::survey::{survey_file, Outcome, PatchForm, Report, REQUIRED};
use trampoline::Reason;

/// Survey `path` with `form` and require: more than `min_functions`
/// functions, no relocation that fails verification, at least
/// `min_percent` relocatable, and every refusal accepted by `allowed`.
pub fn checked_survey(
    path: &str,
    form: PatchForm,
    min_functions: usize,
    min_percent: f64,
    allowed: fn(&Reason) -> bool,
) -> Report {
    let r = survey_file(path, form).unwrap_or_else(|e| panic!("{path}: {e}"));
    println!("{}", r.summary_line());
    println!("{:?}", r.by_outcome());
    assert!(
        r.functions.len() > min_functions,
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
        "{path}: verification failed for {:#?}",
        &failed[..failed.len().min(5)]
    );
    let unexpected: Vec<_> = r
        .functions
        .iter()
        .filter(|f| matches!(&f.outcome, Outcome::Refused(reason) if !allowed(reason)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{path}: unexpected refusals {:#?}",
        &unexpected[..unexpected.len().min(5)]
    );
    assert!(r.percent() >= min_percent, "{}", r.summary_line());
    r
}

/// Any refusal.
pub fn any(_: &Reason) -> bool {
    true
}

/// Every function of [`REQUIRED`] is exported by `reports` and relocatable
/// in each of them.
pub fn assert_required_relocatable(reports: &[Report]) {
    for name in REQUIRED {
        let found: Vec<_> = reports.iter().flat_map(|r| r.named(name)).collect();
        assert!(
            !found.is_empty(),
            "{name} not exported by {:?}",
            reports.iter().map(|r| &r.path).collect::<Vec<_>>()
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
