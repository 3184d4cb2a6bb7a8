//! Keeps the README's survey claim honest: run the survey logic over the
//! libc this test process has loaded and require >= 99% relocatable and
//! every function of `survey::REQUIRED` relocatable (all of them live in
//! libc.so.6 with glibc >= 2.34). The far patch form (the fallback when no
//! memory is free in near reach) is held to the README's lower floor.

mod common;

use common::{any, assert_required_relocatable, checked_survey};
use trampoline::survey::PatchForm;
use trampoline::Reason;

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
    let report = checked_survey(&path, PatchForm::Near, 1000, 99.0, any);
    assert_required_relocatable(&[report]);
}

/// Far form, trampoline 8 GiB away: refusals are only functions shorter
/// than the patch, branches back into it, and (x86-64) RIP-relative
/// operands the trampoline cannot reach.
#[test]
fn host_libc_far_patch_is_at_least_75_percent_relocatable() {
    let path = host_libc();
    checked_survey(&path, PatchForm::Far, 1000, 75.0, |r| {
        matches!(
            r,
            Reason::TooShort { .. }
                | Reason::BranchIntoPatchedBytes { .. }
                | Reason::OutOfReach { .. }
        )
    });
}
