//! `scripts/hw-check --quick --json`, run for real on this machine: exit
//! status 0, one JSON record per feature, every hardware feature this
//! machine lacks reported absent with what would enable it, the software
//! events (page faults, task-clock) checked against perf and passing; and a
//! mismatch forced through `--skew-reference` makes it exit non-zero.
//! Never judges the hardware checks themselves: they run only where the
//! hardware is (see docs/hardware.md).

use std::path::Path;
use std::process::{Command, Output};

use igprof_tests::*;

/// One record of the JSON file: the fields the test reads.
#[derive(Debug)]
struct Record {
    feature: String,
    present: bool,
    verdict: String,
    note: String,
}

/// The string value of `"key": "..."` in one JSON line (escapes kept as
/// written but for `\"`).
fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\": \""))? + key.len() + 5;
    let mut out = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    None
}

/// The records of a `--json` file: one per line, as the script writes them.
fn records(json: &str) -> Vec<Record> {
    json.lines()
        .filter(|l| l.trim_start().starts_with("{\"feature\""))
        .map(|l| Record {
            feature: field(l, "feature").expect("feature"),
            present: l.contains("\"present\": true"),
            verdict: field(l, "verdict").expect("verdict"),
            note: field(l, "note").expect("note"),
        })
        .collect()
}

fn hw_check(d: &Path, args: &[&str]) -> Output {
    Command::new(root().join("scripts/hw-check"))
        .args(args)
        .current_dir(d)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("TMPDIR", d)
        .output()
        .expect("scripts/hw-check (python3)")
}

fn has_pmu(name: &str) -> bool {
    Path::new("/sys/bus/event_source/devices")
        .join(name)
        .exists()
}

#[test]
fn reports_this_machine_and_passes_its_software_checks() {
    let d = scratch("hw-check");
    let json = d.join("hw.json");
    let o = hw_check(&d, &["--quick", "--json", json.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "hw-check exit {:?}:\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let recs = records(&read_text(&json));
    let get = |f: &str| {
        recs.iter()
            .find(|r| r.feature == f)
            .unwrap_or_else(|| panic!("no record {f:?} in {recs:#?}"))
    };
    // Every record has a verdict; no mismatch in a run that exits 0.
    for r in &recs {
        assert!(
            ["pass", "absent", "reported"].contains(&r.verdict.as_str()),
            "{r:?}"
        );
        assert_eq!(r.present, r.verdict != "absent", "{r:?}");
    }
    // The hardware this machine lacks: absent, each with its reason and
    // what would enable it (also on the table printed).
    let lacking: Vec<&str> = [
        (!has_pmu("cpu") && !has_pmu("cpu_core")).then_some(
            [
                "cycles (-e cycles:u/100000)",
                "instructions (-e instructions:u/100000)",
                "multiplexing (-c)",
                "rdpmc (-c, -d)",
            ]
            .as_slice(),
        ),
        (!has_pmu("power") && !Path::new("/sys/class/powercap/intel-rapl:0").exists())
            .then_some(["energy NRG_PKG (-np)", "energy split big:small (-np)"].as_slice()),
        (!has_pmu("ibs_op"))
            .then_some(["ibs op loads/stores (-ibs)", "ibs data objects (-ibs -mp)"].as_slice()),
        (!has_pmu("ibs_fetch")).then_some(["ibs fetch shares (-ibs-fetch)"].as_slice()),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .copied()
    .collect();
    for f in &lacking {
        let r = get(f);
        assert!(!r.present, "{r:?}");
        assert!(r.note.contains("needs"), "{r:?}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("absent: ") && l.contains(f)),
            "no absent line for {f}:\n{out}"
        );
    }
    // The software events, compared with perf for real.
    for f in [
        "page-faults (-e page-faults/100)",
        "page-faults (-pf)",
        "page-faults (-pf) in touch_pages",
        "page-faults (-c page-faults)",
        "task-clock (-e task-clock/F1000)",
        "task-clock shares (-e task-clock/250000)",
    ] {
        let r = get(f);
        assert!(r.present && r.verdict == "pass", "{r:?}");
    }
    assert_eq!(get("context-switches").verdict, "reported");
    assert!(out.contains("hw-check: 0 mismatch"), "{out}");
}

#[test]
fn a_reference_skewed_on_purpose_is_a_mismatch_and_exit_1() {
    let d = scratch("hw-check-skew");
    let json = d.join("hw.json");
    let o = hw_check(
        &d,
        &[
            "--quick",
            "--json",
            json.to_str().unwrap(),
            "--skew-reference",
            "page-faults (-pf)=1.5",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let recs = records(&read_text(&json));
    let bad: Vec<&str> = recs
        .iter()
        .filter(|r| r.verdict == "FAIL")
        .map(|r| r.feature.as_str())
        .collect();
    assert_eq!(bad, ["page-faults (-pf)"], "{recs:#?}");
    assert!(out.contains("1 mismatch(es): page-faults (-pf)"), "{out}");

    // A malformed skew is a one-line error naming it, before any run.
    let o = hw_check(&d, &["--quick", "--skew-reference", "page-faults"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("expected FEATURE=FACTOR") && err.lines().count() == 1,
        "{err}"
    );
}
