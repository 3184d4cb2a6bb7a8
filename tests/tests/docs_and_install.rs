//! The documentation and the install script, end to end.
//!
//! - `scripts/install --prefix P` into a fresh temporary prefix, then the
//!   installed `P/bin/igprof` and `P/bin/igprof-analyse` profile a program
//!   from a directory outside the build tree, with `IGPROF_LIB` and
//!   `CARGO_TARGET_DIR` removed from the environment.
//! - Every command the documentation shows runs as written. The convention
//!   (README.md "Examples", docs/user-guide.md's introduction): a fenced
//!   block whose line before is `<!-- run -->` (or `<!-- run: status N -->`
//!   for another expected exit status) is run, one command per line
//!   (a line ending in `\` goes on), with `bash -c`, in the order of the
//!   file, in one scratch directory per file that holds a copy of
//!   `tests/programs/` and `include/`, with the build tree's `target/release` first on
//!   `PATH`. In README.md and docs/user-guide.md every other command (a
//!   `sh` block, or an indented code line) must be in [`EXCLUDED`] with the
//!   reason; `text` blocks are outputs. Other docs/ files are run where they
//!   mark a block.
//! - Every relative link between README.md and docs/ names a file that
//!   exists and, with `#anchor`, one of its headings.
//!
//! Needs the release build (`cargo build --release --workspace`; the
//! user guide's AArch64 example and the install also need `cargo build
//! --release --target aarch64-unknown-linux-gnu -p igprof-rs`, which
//! scripts/test builds, and the install test too when it is missing).

use igprof_tests::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Commands the docs show that this test does not run: (file, command as
/// written, reason).
const EXCLUDED: &[(&str, &str, &str)] = &[
    (
        "docs/user-guide.md",
        "igprof --attach 4242 -pp -mp -o leak.gz   # returns at once",
        "4242 stands for a running service's pid: the README runs the same commands on a python3 server, tests/tests/attach.rs every one",
    ),
    (
        "docs/user-guide.md",
        "igprof --dump 4242 snap.gz                # a snapshot while attached",
        "4242 stands for a running service's pid: the README runs the same commands on a python3 server, tests/tests/attach.rs every one",
    ),
    (
        "docs/user-guide.md",
        "igprof --detach 4242                      # writes leak.gz, restores the process",
        "4242 stands for a running service's pid: the README runs the same commands on a python3 server, tests/tests/attach.rs every one",
    ),
    (
        "docs/user-guide.md",
        "igprof --attach 4242 -pp --for 30s        # attach, wait 30 s (Ctrl-C: sooner), detach",
        "4242 stands for a running service's pid: the README runs the same commands on a python3 server, tests/tests/attach.rs every one",
    ),
    (
        "docs/user-guide.md",
        "igprof-analyse -r MEM_LIVE leak.gz",
        "4242 stands for a running service's pid: the README runs the same commands on a python3 server, tests/tests/attach.rs every one",
    ),
    (
        "README.md",
        "scripts/demo     # installs what it needs, builds, profiles a demo program, prints a report",
        "installs Debian packages (scripts/setup) and runs cargo build: the same steps as this test's own set-up",
    ),
    (
        "README.md",
        "scripts/test     # installs what it needs, runs every test (host + AArch64 under qemu-user)",
        "runs the whole test suite, this test included (about 6 minutes)",
    ),
    (
        "README.md",
        "scripts/install --prefix ~/.local",
        "writes into the user's home: the install test below runs it with a temporary prefix",
    ),
    (
        "docs/user-guide.md",
        "cargo test -p igprof-analyse -p igprof-format --release",
        "the analyser's own test suite: minutes",
    ),
    (
        "docs/user-guide.md",
        "perf stat -a -e power/energy-pkg/ -- igprof -np -o app.gz ./app",
        "needs RAPL energy counters, which this VM lacks",
    ),
    (
        "docs/user-guide.md",
        "igprof-analyse -r NRG_PKG app.gz     # total, <unattributed> included",
        "reads the profile of the RAPL command above",
    ),
    (
        "docs/user-guide.md",
        "kcachegrind callgrind.out.app",
        "a graphical program (the run block reads the same file with callgrind_annotate)",
    ),
    (
        "docs/user-guide.md",
        "igprof -mp -ibs -o zen.gz ./app",
        "needs AMD IBS, which this VM lacks (the run blocks above use the test seam)",
    ),
    (
        "docs/user-guide.md",
        "igprof-analyse -r IBS_LOAD_LAT zen.gz",
        "reads the profile of the IBS command above",
    ),
    (
        "docs/user-guide.md",
        "perf mem record -- ./app",
        "perf's IBS memory sampling: needs AMD IBS",
    ),
    (
        "docs/user-guide.md",
        "perf report --mem-mode --sort=sym,mem",
        "reads the perf mem recording above",
    ),
];

/// The files whose every command must be run or excluded.
const STRICT: &[&str] = &["README.md", "docs/user-guide.md"];

/// The documentation files: README.md and docs/*.md.
fn doc_files() -> Vec<String> {
    let mut v = vec!["README.md".to_string()];
    let mut d: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    d.sort();
    v.extend(d);
    v
}

/// A code block of a markdown file.
#[derive(Debug)]
struct Block {
    /// 1-based line of its first command.
    line: usize,
    /// `sh`, `text`, ... for fenced blocks, `indented` for indented code.
    info: String,
    /// `Some(status)` when marked `<!-- run -->`.
    run: Option<i32>,
    /// Its commands, continuation lines joined.
    commands: Vec<String>,
}

/// The run marker on `line`: `<!-- run -->` is status 0.
fn marker(line: &str) -> Option<i32> {
    let l = line.trim();
    let inner = l.strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    if inner == "run" {
        return Some(0);
    }
    let n = inner.strip_prefix("run: status")?.trim();
    Some(n.parse().expect("<!-- run: status N --> takes a number"))
}

/// Joins lines ending in `\` with the next one; drops blank lines.
fn commands(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in lines {
        let l = l.trim_end();
        if let Some(head) = l.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(l);
        let c = std::mem::take(&mut cur);
        if !c.trim().is_empty() {
            out.push(c.trim().to_string());
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The code blocks of a markdown text: fenced blocks, and runs of lines
/// indented by 4 spaces after a blank line outside them.
fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if let Some(info) = l.trim_start().strip_prefix("```") {
            let prev = lines[..i].iter().rev().find(|p| !p.trim().is_empty());
            let run = prev.and_then(|p| marker(p));
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && !lines[end].trim_start().starts_with("```") {
                end += 1;
            }
            out.push(Block {
                line: start + 1,
                info: info.trim().to_string(),
                run,
                commands: commands(&lines[start..end]),
            });
            i = end + 1;
            continue;
        }
        if l.starts_with("    ")
            && !l.trim().is_empty()
            && (i == 0 || lines[i - 1].trim().is_empty())
        {
            let start = i;
            while i < lines.len() && (lines[i].starts_with("    ") || lines[i].trim().is_empty()) {
                i += 1;
            }
            let body: Vec<&str> = lines[start..i].iter().map(|l| l.trim_start()).collect();
            out.push(Block {
                line: start + 1,
                info: "indented".to_string(),
                run: None,
                commands: commands(&body),
            });
            continue;
        }
        i += 1;
    }
    out
}

fn read_doc(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Copies tests/programs and include (igprof.h) into `dir`, as the docs'
/// commands compile them from the checkout.
fn copy_programs(dir: &Path) {
    for sub in ["tests/programs", "include"] {
        let to = dir.join(sub);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(root().join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
}

/// `PATH` with the build tree's launcher (the static build) and
/// target/release first.
fn path_with_build_tree() -> std::ffi::OsString {
    let mut parts = vec![
        launcher().parent().unwrap().to_path_buf(),
        target_dir().join("release"),
    ];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).unwrap()
}

/// Runs the marked blocks of `file` in a scratch directory; returns how
/// many commands ran.
fn run_file(file: &str) -> usize {
    assert!(
        launcher().exists() && analyser().exists() && lib().exists(),
        "release build missing"
    );
    let text = read_doc(file);
    let dir = scratch(&format!("docs-{}", file.replace('/', "-")));
    copy_programs(&dir);
    let path = path_with_build_tree();
    let mut ran = 0;
    for b in blocks(&text).iter().filter(|b| b.run.is_some()) {
        let want = b.run.unwrap();
        for c in &b.commands {
            let t = std::time::Instant::now();
            let o = Command::new("bash")
                .arg("-c")
                .arg(c)
                .current_dir(&dir)
                .env("PATH", &path)
                .env_remove("IGPROF")
                .env_remove("IGPROF_LIB")
                .output()
                .expect("run bash");
            let status = o.status.code().unwrap_or(-1);
            assert_eq!(
                status,
                want,
                "{file}:{}: `{c}` exited with {:?} (expected {want})\nstdout: {}\nstderr: {}",
                b.line,
                o.status,
                tail(&o.stdout),
                tail(&o.stderr)
            );
            eprintln!("{file}: ok in {:.1} s: {c}", t.elapsed().as_secs_f64());
            ran += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    ran
}

/// The last 2000 bytes of an output, as text.
fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let n = s.len().saturating_sub(2000);
    let n = (n..=s.len()).find(|&i| s.is_char_boundary(i)).unwrap();
    s[n..].to_string()
}

/// In a strict file every command is run or excluded, and every exclusion
/// of the list is still in its file.
#[test]
fn every_command_of_readme_and_user_guide_is_run_or_excluded_with_a_reason() {
    let mut unlisted = Vec::new();
    for file in STRICT {
        let text = read_doc(file);
        let bs = blocks(&text);
        assert!(
            bs.iter().any(|b| b.run.is_some()),
            "{file}: no <!-- run --> block"
        );
        for b in &bs {
            if b.run.is_some() || !(b.info == "sh" || b.info == "indented" || b.info.is_empty()) {
                continue;
            }
            for c in &b.commands {
                if !EXCLUDED.iter().any(|(f, e, _)| f == file && e == c) {
                    unlisted.push(format!("{file}:{}: {c}", b.line));
                }
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "commands neither marked <!-- run --> nor in EXCLUDED:\n{}",
        unlisted.join("\n")
    );
    for (file, c, why) in EXCLUDED {
        assert!(!why.is_empty());
        let found = blocks(&read_doc(file))
            .iter()
            .any(|b| b.commands.iter().any(|x| x == c));
        assert!(found, "EXCLUDED names `{c}`, which {file} no longer shows");
    }
}

#[test]
fn readme_commands_run() {
    let n = run_file("README.md");
    assert!(n >= 10, "README.md: only {n} commands ran");
}

#[test]
fn user_guide_commands_run() {
    let n = run_file("docs/user-guide.md");
    assert!(n >= 20, "docs/user-guide.md: only {n} commands ran");
}

#[test]
fn other_docs_marked_commands_run() {
    for f in doc_files() {
        if !STRICT.contains(&f.as_str()) {
            run_file(&f);
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown text's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.insert(slug(l.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn links_between_the_docs_resolve() {
    let mut bad = Vec::new();
    for file in doc_files() {
        let text = read_doc(&file);
        let base = root().join(&file).parent().unwrap().to_path_buf();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.contains("://") || target.contains(' ') {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target, None),
            };
            let p: PathBuf = if path.is_empty() {
                root().join(&file)
            } else {
                base.join(path)
            };
            if !p.exists() {
                bad.push(format!("{file}: {target}: no such file"));
                continue;
            }
            if let Some(a) = anchor {
                let t = std::fs::read_to_string(&p).unwrap();
                if !anchors(&t).contains(a) {
                    bad.push(format!("{file}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// Runs `cmd` and returns its output (panics when it cannot start).
fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

#[test]
fn install_into_a_fresh_prefix_then_profile_outside_the_build_tree() {
    let d = scratch("install");
    let prefix = d.join("prefix");
    let install = root().join("scripts/install");

    // Help and one-line errors.
    let o = run(Command::new(&install).arg("--help"));
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--prefix DIR"));
    let o = run(Command::new(&install).arg("--bogus"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unknown option '--bogus'") && err.lines().count() == 1,
        "{err}"
    );
    let o = run(Command::new(&install).args(["--prefix", "/proc/igprof-no-such-prefix"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not writable") && err.lines().count() == 1,
        "{err}"
    );

    // The other architecture's library is built first (foreign_lib builds
    // it if needed): the install copies what is built, and this test must
    // not build it between an install and the check of what it copied.
    let foreign = foreign_arch().0;
    let _ = foreign_lib();

    // Twice: the second run replaces the same files.
    let mut listing = Vec::new();
    for _ in 0..2 {
        let o = run(Command::new(&install).arg("--prefix").arg(&prefix));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for f in ["bin/igprof", "bin/igprof-analyse", "lib/libigprof.so"] {
            assert!(prefix.join(f).is_file(), "{f} not installed");
        }
        assert!(prefix.join(format!("lib/{foreign}/libigprof.so")).is_file());
        // Where the launcher looks for it: <arch>/ next to itself.
        assert!(prefix.join(format!("bin/{foreign}/libigprof.so")).is_file());
        listing.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    assert_eq!(listing[0], listing[1]);

    // The build tree out of reach: another directory, no variable naming it.
    let work = d.join("work");
    std::fs::create_dir_all(&work).unwrap();
    build(&work, "cpu_split.c", "cpu_split", &[]);
    let clean = |c: &mut Command| {
        c.current_dir(&work)
            .env_remove("IGPROF_LIB")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("IGPROF")
            .env_remove("LD_PRELOAD");
    };
    let mut c = Command::new(prefix.join("bin/igprof"));
    // About 250 samples: with about 50 at 5 ms, a run missed one of the
    // three functions in 3 of 240 runs on this VM (its 5.2 ms cycle of
    // work and the sampling period in step; 0 of 60 at 1 ms).
    c.args(["-pp", "-i", "1ms", "-o", "p.gz", "./cpu_split", "50"]);
    clean(&mut c);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut c = Command::new(prefix.join("bin/igprof-analyse"));
    c.arg("p.gz");
    clean(&mut c);
    let o = run(&mut c);
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The installed analyser names what the profile holds: main, work and
    // spin are on every sample's stack; each of hot_a, hot_b and hot_c
    // that the profile itself has samples under (nearly always all three;
    // a run whose work cycle falls in step with the sampling can miss
    // one, whatever the load) is named too.
    let p = parse_strict(&read_text(&work.join("p.gz"))).unwrap();
    let sampled: Vec<&str> = ["hot_a", "hot_b", "hot_c"]
        .into_iter()
        .filter(|f| under(&p, "PERF_TICKS", f).0 > 0)
        .collect();
    assert!(!sampled.is_empty(), "no hot function sampled:\n{report}");
    for f in ["main", "work", "spin"].iter().chain(&sampled) {
        assert!(report.contains(f), "{f} not in the report:\n{report}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The options named at the start of a help text's lines (`  -pp, --perf-profile ...`).
fn options_of(help: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in help.lines() {
        let l = l.trim_start();
        if !l.starts_with('-') {
            continue;
        }
        for w in l.split([' ', ',', '/']) {
            let w = w.trim();
            if w.len() > 1
                && w.starts_with('-')
                && w[1..]
                    .trim_start_matches('-')
                    .starts_with(|c: char| c.is_ascii_lowercase())
            {
                out.insert(w.to_string());
            } else if !w.is_empty() {
                break;
            }
        }
    }
    out
}

/// The user guide's copy of `igprof -h` names only options the launcher
/// has (options added since may be missing from it, never the reverse).
#[test]
fn the_user_guides_option_list_names_only_real_options() {
    let text = read_doc("docs/user-guide.md");
    let bs = blocks(&text);
    let i = bs
        .iter()
        .position(|b| b.run.is_some() && b.commands == ["igprof -h"])
        .expect("docs/user-guide.md shows `igprof -h` in a run block");
    let shown = bs[i + 1..]
        .iter()
        .find(|b| b.info == "text")
        .expect("the output of igprof -h after it");
    let doc = options_of(&shown.commands.join("\n"));
    let o = run(Command::new(launcher()).arg("-h"));
    assert!(o.status.success());
    let real = options_of(&String::from_utf8_lossy(&o.stdout));
    assert!(doc.len() >= 20, "{doc:?}");
    let unknown: Vec<_> = doc.difference(&real).collect();
    assert!(
        unknown.is_empty(),
        "the user guide lists options igprof -h does not: {unknown:?}"
    );
}
