//! The import-graph checker (`scripts/import-graph`, run by scripts/test on
//! the injected library) on planted source trees (tests/inputs/import-graph):
//! a circle closed only through `super::super::` written in an inline
//! module, a circle closed only through `use super::{...}` groups, and a
//! tree with the same kinds of path and no circle, whose arrows it must see.
//! Needs python3.

use igprof_tests::root;
use std::process::Command;

/// The checker's exit status and standard output on one planted tree.
fn check(tree: &str) -> (i32, String) {
    let out = Command::new("python3")
        .arg(root().join("scripts/import-graph"))
        .arg(root().join("tests/inputs/import-graph").join(tree))
        .output()
        .expect("python3 runs scripts/import-graph");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.stderr.is_empty(),
        "import-graph {tree}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

#[test]
fn super_super_in_an_inline_module_closes_a_circle() {
    let (code, out) = check("super_super");
    assert!(out.contains("\na::x -> a::y\n"), "{out}");
    assert!(
        out.contains("circle of 2 files (2 arrows): a::x, a::y"),
        "{out}"
    );
    assert_eq!(code, 1, "{out}");
}

#[test]
fn use_super_groups_close_a_circle() {
    let (code, out) = check("use_group");
    assert!(out.contains("\nb::p -> b::q, b::r\n"), "{out}");
    assert!(out.contains("\nb::q -> b::p, b::r\n"), "{out}");
    assert!(
        out.contains("circle of 2 files (2 arrows): b::p, b::q"),
        "{out}"
    );
    assert_eq!(code, 1, "{out}");
}

#[test]
fn the_same_paths_without_arrows_back_are_no_circle() {
    let (code, out) = check("clean");
    // Every arrow, exactly: comments, strings and `#[cfg(test)] mod tests`
    // name nothing.
    let arrows: Vec<&str> = out.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(
        arrows,
        [
            "(lib) -> ",
            "a -> ",
            "a::x -> a::y",
            "a::y -> b::p",
            "b -> ",
            "b::p -> b::q, b::r",
            "b::q -> ",
            "b::r -> ",
        ],
        "{out}"
    );
    assert!(out.ends_with("\nno import circle\n"), "{out}");
    assert_eq!(code, 0, "{out}");
}
