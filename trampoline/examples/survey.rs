//! Survey: how many exported functions of each library could be hooked.
//!
//!     cargo run --release -p trampoline --example survey -- [--far] LIB...
//!
//! Reads each ELF file (x86-64 or AArch64), plans and relocates every
//! exported STT_FUNC of size >= 5 without executing anything, verifies each
//! trampoline by re-decoding it, and prints counts by outcome and refusal
//! reason, the status of the functions the profiler needs, and one line per
//! library: `relocatable: N/M (P%) PATH`. Options: `-v` lists every refused
//! function; `--far` plans the far patch form (`Arch::FAR_PATCH_LEN` bytes,
//! trampoline 8 GiB away) instead of the near one.

use std::process::ExitCode;
use trampoline::survey::{survey_file, Outcome, PatchForm, Report, REQUIRED};

fn main() -> ExitCode {
    let mut verbose = false;
    let mut form = PatchForm::Near;
    let mut paths = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "-v" | "--verbose" => verbose = true,
            "--far" => form = PatchForm::Far,
            "-h" | "--help" => {
                println!(
                    "usage: survey [-v] [--far] LIB...   (ELF shared libraries, x86-64 or AArch64)"
                );
                return ExitCode::SUCCESS;
            }
            o if o.starts_with('-') => {
                eprintln!("survey: unknown option {o}; usage: survey [-v] [--far] LIB...");
                return ExitCode::from(2);
            }
            _ => paths.push(a),
        }
    }
    if paths.is_empty() {
        eprintln!(
            "survey: no library given; usage: survey [-v] [--far] /lib/x86_64-linux-gnu/libc.so.6 ..."
        );
        return ExitCode::from(2);
    }
    let mut reports: Vec<Report> = Vec::new();
    let mut failed = false;
    for p in &paths {
        match survey_file(p, form) {
            Ok(r) => {
                print_details(&r, verbose);
                reports.push(r);
            }
            Err(e) => {
                eprintln!("survey: {p}: {e}");
                failed = true;
            }
        }
    }
    print_required(&reports);
    for r in &reports {
        println!("{}", r.summary_line());
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_details(r: &Report, verbose: bool) {
    println!(
        "== {} ({}, {:?} patch, {} exported functions of size >= 5)",
        r.path,
        r.arch,
        r.form,
        r.functions.len()
    );
    for (k, n) in r.by_outcome() {
        println!("  {n:6}  {k}");
    }
    println!("          (of the relocatable: {} patch into alignment padding after a too-short function)", r.using_padding());
    for f in &r.functions {
        let why = match &f.outcome {
            Outcome::Relocatable { .. } => continue,
            Outcome::Refused(reason) => reason.to_string(),
            Outcome::VerifyFailed(e) => format!("VERIFY FAILED: {e}"),
        };
        if verbose || matches!(f.outcome, Outcome::VerifyFailed(_)) {
            println!("    {} @ {:#x} (size {}): {why}", f.name, f.addr, f.size);
        }
    }
}

fn print_required(reports: &[Report]) {
    let mut ok = 0;
    let mut lines = Vec::new();
    for name in REQUIRED {
        let found: Vec<_> = reports
            .iter()
            .flat_map(|r| r.named(name).map(move |f| (r, f)))
            .collect();
        if found.is_empty() {
            lines.push(format!("  {name}: not exported by the given libraries"));
            continue;
        }
        let bad: Vec<String> = found
            .iter()
            .filter_map(|(r, f)| match &f.outcome {
                Outcome::Relocatable { .. } => None,
                Outcome::Refused(reason) => Some(format!("{} in {}: {reason}", f.name, r.path)),
                Outcome::VerifyFailed(e) => {
                    Some(format!("{} in {}: verify failed: {e}", f.name, r.path))
                }
            })
            .collect();
        if bad.is_empty() {
            ok += 1;
        } else {
            lines.push(format!("  {name}: NOT relocatable: {}", bad.join("; ")));
        }
    }
    println!("required functions relocatable: {ok}/{}", REQUIRED.len());
    for l in lines {
        println!("{l}");
    }
}
