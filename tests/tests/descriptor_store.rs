//! The descriptor store (igprof-rs/src/unwind/store.rs): frame descriptors
//! one process derived serve the later processes of the same objects, and
//! change none of their stacks.
//!
//! GCC's own compiler (cc1, found through `gcc -print-prog-name`) compiles
//! a generated C file under `-mp`: without a store, then twice with a
//! fresh one. The second run must have found nearly all its descriptors in
//! the store, and every one of them must be what deriving it again gives
//! (`IGPROF_STORE_CHECK=1`: each store answer is derived again and
//! compared). The three memory profiles must agree: the same allocations
//! (MEM_TOTAL calls and bytes) from the same stacks, but for one. cc1's
//! collector allocates a 32 KiB page-table chain from whichever allocation
//! first gets a collector page in a new 4 GiB region of the address space,
//! and where its pages land moves with the profiler's own mappings (those
//! the store's reads add, the libraries loaded): that one allocation may
//! come from another stack, and where the collector's pages straddle such
//! a boundary in one run and not in the other, one run makes one chain
//! more (`setarch -R` keeps the rest of the layout fixed). Those 32 KiB
//! chains are left out of the comparison. A store file that was damaged, or written for another object or
//! by another build of the profiler, must be ignored and replaced. The
//! descriptors a run derives are read from cc1's CFI rows directly
//! (`unwind/cfi.rs`), and `IGPROF_CFI_CHECK=1` derives each through
//! framehop too: none may differ.

use std::path::{Path, PathBuf};
use std::process::Command;

use igprof_tests::*;

fn cc1() -> String {
    let o = Command::new("gcc")
        .arg("-print-prog-name=cc1")
        .output()
        .expect("gcc (scripts/setup installs it)");
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// A C file with enough functions for a few thousand allocation stacks.
fn write_source(d: &Path) {
    // No headers: cc1 run alone has no multiarch include path.
    let mut src = String::from("void *calloc(unsigned long, unsigned long);\nvoid free(void *);\n");
    for i in 0..40 {
        src.push_str(&format!(
            "struct s{i} {{ int a[{n}]; double d; }};\n\
             static int g{i}(struct s{i} *p, int n) {{ int s = 0; for (int k = 0; k < n && k < {n}; k++) s += p->a[k] * {i}; return s; }}\n\
             int f{i}(int n) {{ struct s{i} *p = calloc(1, sizeof *p); int r = g{i}(p, n); if (n > 3) r += f{j}(n - 1); free(p); return r; }}\n",
            n = i + 2,
            j = (i + 1) % 40
        ));
    }
    std::fs::write(d.join("gen.c"), src).unwrap();
    // cc1 allocates differently when its output file does not exist yet:
    // every compared run finds it.
    std::fs::write(d.join("gen.s"), "").unwrap();
}

/// Runs cc1 on gen.c under `-mp -d` with the store in `store` (None: no
/// store); its (stack, MEM_TOTAL calls and bytes) sorted, and the number of
/// descriptor-cache misses and of those the store answered.
fn run(d: &Path, store: Option<&Path>, tag: &str) -> (Stacks, u64, u64) {
    let out = format!("{tag}.gz");
    // Without address-space randomisation: cc1's collector makes one
    // more 32 KiB allocation in about half of the runs otherwise.
    let o = Command::new("setarch")
        .arg("-R")
        .env("IGPROF_STORE_CHECK", "1")
        .env("IGPROF_CFI_CHECK", "1")
        .arg(launcher())
        .args(["-mp", "-d", "-o", &out, &cc1()])
        .args(["-quiet", "gen.c", "-O1", "-o", "gen.s"])
        .current_dir(d)
        .env("IGPROF_LIB", lib())
        .env(
            "IGPROF_CACHE_DIR",
            store.map_or(PathBuf::from("none"), Path::to_path_buf),
        )
        .output()
        .expect("run igprof");
    let err = ok(&o);
    let line = debug_line(&err, "frame descriptors:", tag);
    let (misses, stored) = (
        number_before(line, " misses"),
        number_before(line, " of them found"),
    );
    // With a store: none of its answers differs from a fresh derivation.
    if store.is_some() {
        let check = debug_line(&err, "descriptor store check:", tag);
        assert!(
            check.contains(&format!(": 0 of {stored} stored descriptors differ")),
            "{tag}: {check}"
        );
    }
    // The descriptors derived here were read from cc1's CFI rows
    // directly, nearly all, and each is what framehop derives.
    let cfi = debug_line(&err, "CFI check:", tag);
    let direct = number_before(cfi, " direct derivations");
    assert!(cfi.contains(": 0 of "), "{tag}: {cfi}");
    assert!(
        direct * 10 >= (misses - stored) * 9,
        "{tag}: {direct} of {} derivations read directly",
        misses - stored
    );
    let p = parse_strict(&read_text(&d.join(&out))).unwrap();
    let mut v = path_values(&p, "MEM_TOTAL");
    v.sort();
    assert!(v.len() > 100, "{tag}: only {} stacks", v.len());
    (v, misses, stored)
}

/// The `-d` line of `err` that holds `what` (panics naming `tag` if none).
fn debug_line<'a>(err: &'a str, what: &str, tag: &str) -> &'a str {
    err.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("{tag}: no {what:?} line in\n{err}"))
}

/// The number just before the first `what` in `line` ("(12 of them").
fn number_before(line: &str, what: &str) -> u64 {
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("{what} in {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .unwrap()
        .trim_start_matches('(')
        .parse()
        .unwrap()
}

type Stacks = Vec<(Vec<String>, u64, u64)>;

/// Whether two runs made the same allocations from the same stacks, but
/// for at most one allocation whose stack differs (see the module docs):
/// equal totals, and at most one (stack, calls, bytes) in each run that
/// the other lacks, of the same calls and bytes.
fn same_but_one(a: &Stacks, b: &Stacks) -> bool {
    let (a, b) = (&without_collector_chains(a), &without_collector_chains(b));
    let total = |x: &Stacks| x.iter().fold((0, 0), |(c, v), e| (c + e.1, v + e.2));
    let only = |x: &Stacks, y: &Stacks| -> Vec<(u64, u64)> {
        x.iter()
            .filter(|e| !y.contains(e))
            .map(|e| (e.1, e.2))
            .collect()
    };
    let (oa, ob) = (only(a, b), only(b, a));
    total(a) == total(b) && oa.len() <= 1 && oa == ob
}

/// `stacks` without the allocations of cc1's collector's 32 KiB
/// page-table chains (see the module docs): `xcalloc` called from
/// `ggc_internal_alloc`, 32 KiB a call.
fn without_collector_chains(stacks: &Stacks) -> Stacks {
    stacks
        .iter()
        .filter(|(s, calls, bytes)| {
            !(s.last().is_some_and(|f| f == "xcalloc")
                && s.iter().any(|f| f.contains("ggc_internal_alloc"))
                && *bytes == 32768 * calls)
        })
        .cloned()
        .collect()
}

/// The first few (stack, calls, bytes) of each run that the other lacks.
fn differences(a: &Stacks, b: &Stacks) -> String {
    let only = |x: &Stacks, y: &Stacks| -> Vec<String> {
        x.iter()
            .filter(|e| !y.contains(e))
            .take(3)
            .map(|(s, c, v)| format!("{} calls {c} bytes {v}", s.join(" > ")))
            .collect()
    };
    format!(
        "only in one: {:#?}\nonly in the other: {:#?}",
        only(a, b),
        only(b, a)
    )
}

fn store_file(store: &Path, cc1: &str) -> PathBuf {
    let notes = Command::new("readelf").args(["-n", cc1]).output().unwrap();
    let text = String::from_utf8_lossy(&notes.stdout).into_owned();
    let id = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("cc1 has no build-id:\n{text}"));
    store.join("unwind").join(id.trim())
}

#[test]
fn descriptors_derived_by_one_process_serve_the_next_and_change_no_stack() {
    let d = scratch("store");
    write_source(&d);
    let store = d.join("store");
    let (plain, misses0, stored0) = run(&d, None, "none");
    assert_eq!(stored0, 0, "no store, nothing found in it");
    assert!(!store.exists());

    let (first, misses1, stored1) = run(&d, Some(&store), "first");
    assert_eq!(stored1, 0, "an empty store answers nothing");
    let file = store_file(&store, &cc1());
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    assert!(size > 128 + 16 * 100, "{}: {size} bytes", file.display());

    let (second, misses2, stored2) = run(&d, Some(&store), "second");
    assert!(
        stored2 * 10 >= misses2 * 9 && misses2 > 100,
        "the second run found {stored2} of its {misses2} missing descriptors in the store"
    );
    assert!(misses0 > 100 && misses1 > 100);
    assert!(
        same_but_one(&plain, &first),
        "the first run with a store walked other stacks: {}",
        differences(&plain, &first)
    );
    assert!(
        same_but_one(&plain, &second),
        "descriptors from the store changed stacks: {}",
        differences(&plain, &second)
    );
}

#[test]
fn a_damaged_or_foreign_store_file_is_ignored_and_replaced() {
    let d = scratch("store-damaged");
    write_source(&d);
    let store = d.join("store");
    let (plain, _, _) = run(&d, None, "none");
    run(&d, Some(&store), "fill");
    let file = store_file(&store, &cc1());
    let good = std::fs::read(&file).unwrap();
    let entries = good.len() - 128;
    // Each damage: one file contents; the run must walk the same stacks
    // as without a store (but for one allocation: module docs) and find
    // nothing of cc1 in the file (what it finds comes from the other
    // objects' files).
    let mut damaged: Vec<(&str, Vec<u8>)> = Vec::new();
    damaged.push(("truncated", good[..good.len() - 5].to_vec()));
    let mut kind = good.clone();
    kind[128 + 16 * (entries / 16 / 2) + 8 + 6] = 0; // an empty descriptor
    damaged.push(("an invalid descriptor", kind));
    let mut order = good.clone();
    order.copy_within(128..144, 144);
    damaged.push(("keys out of order", order));
    let mut producer = good.clone();
    producer[96] ^= 0xff; // the profiler build's id
    damaged.push(("another profiler build", producer));
    let mut layout = good.clone();
    layout[64] ^= 0x10; // the object's text offset
    damaged.push(("another layout", layout));
    damaged.push(("garbage", vec![0x5a; good.len()]));
    let (_, _, found_good) = run(&d, Some(&store), "good");
    for (what, bytes) in damaged {
        std::fs::write(&file, &bytes).unwrap();
        let (stacks, _, found) = run(&d, Some(&store), "damaged");
        assert!(
            same_but_one(&plain, &stacks),
            "{what}: other stacks: {}",
            differences(&plain, &stacks)
        );
        assert!(
            found * 4 < found_good,
            "{what}: {found} descriptors found, with the good file {found_good}"
        );
        let replaced = std::fs::read(&file).unwrap();
        assert_eq!(
            replaced.len(),
            good.len(),
            "{what}: the file was not rewritten whole"
        );
        assert_eq!(replaced[..16], good[..16], "{what}");
        assert_eq!(replaced[32..128], good[32..128], "{what}");
    }
}

/// The hooked functions' plans (`trampoline/src/known.rs`,
/// `igprof-rs/src/hook/plans.rs`): a process plans its hooks and keeps the
/// plans in the store's directory, which it makes if need be (/bin/true
/// saves no descriptor, yet the next /bin/true must find its plans); the
/// next process plans nothing (on x86-64 it never decodes: no decoder
/// tables); a damaged file is ignored and replaced. Every other test of the
/// suite hooks from the plans its predecessors kept.
#[test]
fn hook_plans_made_by_one_process_serve_the_next() {
    let d = scratch("plans");
    let store = d.join("store");
    let plans_line = |tag: &str| -> (u64, u64, bool) {
        let o = Command::new(launcher())
            .args(["-mp", "-d", "-o", &format!("{tag}.gz"), "/bin/true"])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", &store)
            .output()
            .expect("run igprof");
        let err = ok(&o);
        let line = debug_line(&err, "hook plans:", tag);
        (
            number_before(line, " known"),
            number_before(line, " in all"),
            line.ends_with(", saved"),
        )
    };
    // The first process, which derives no descriptor, makes the directory
    // (mode 0700) and keeps its plans there.
    let (known, all, saved) = plans_line("first");
    assert!(
        known == 0 && all >= 20 && saved,
        "first: {known} {all} {saved}"
    );
    let dir = store.join("unwind");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&dir)
            .expect("the store's directory")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o700, "the store's directory is private");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1, "one file, named by the library's build-id");
    let file = files[0].as_ref().unwrap().path();
    let (known2, all2, saved2) = plans_line("second");
    assert!(
        known2 == all && all2 == all && !saved2,
        "second: {known2} {all2} {saved2}"
    );
    // Damaged: one byte of the first plan's record.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[12 + 21 + 5] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let (known3, all3, saved3) = plans_line("damaged");
    assert!(
        known3 < all && all3 == all && saved3,
        "damaged: {known3} {all3} {saved3}"
    );
    let (known4, _, _) = plans_line("after");
    assert_eq!(known4, all, "the damaged file was replaced");
}

/// A store that cannot be used (here a path under a regular file, refused
/// at start-up; or one that cannot be made, as under a daemon user's home
/// `/nonexistent`) is said once for a run, by the process the user
/// started, with what it costs and what to set; not with
/// `IGPROF_CACHE_DIR=none`, nor where the store can be written.
#[test]
fn a_store_that_cannot_be_kept_is_said_once() {
    let d = scratch("plans_unkept");
    std::fs::write(d.join("file"), b"").unwrap();
    // Root without its capabilities (setpriv) is refused a directory of
    // mode 0500, as a user is.
    let ro = d.join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o500)).unwrap();
    let run = |store: &Path| {
        let o = igprof_without_caps(
            &d,
            &["-mp", "-o", "p.gz", "/bin/sh", "-c", "/bin/true; /bin/true"],
        )
        .env("IGPROF_CACHE_DIR", store)
        .output()
        .expect("run igprof");
        ok(&o)
    };
    let line = "the store of hook plans and unwind descriptors cannot be kept (";
    for store in [d.join("file/store"), ro.join("store")] {
        let err = run(&store);
        assert_eq!(err.matches(line).count(), 1, "{}: {err}", store.display());
        assert!(
            err.contains("IGPROF_CACHE_DIR names a writable directory"),
            "{err}"
        );
    }
    for store in [Path::new("none"), &d.join("store")] {
        let err = run(store);
        assert!(!err.contains(line), "{}: {err}", store.display());
    }
}

/// A first run's hooks whose plans no earlier run kept are planned by a
/// planner process (process/planner.rs), so that the instruction
/// decoder's tables (about 360 KiB on x86-64) never take the program's
/// memory: `-d` says so and has no "instruction decoder" line; the plans
/// it keeps are byte for byte those the program makes itself
/// (`IGPROF_PLANNER=0`, where the tables are built); and the program finds
/// no child of any kind at `main` (the planner was reaped, it sent no
/// SIGCHLD) and the CPU set it was started with (the program's thread
/// keeps one CPU while the planner lives).
#[test]
fn a_first_runs_hooks_are_planned_in_a_process_of_their_own() {
    let d = scratch("planner");
    build(&d, "no_children.c", "no_children", &[]);
    let bare = Command::new(d.join("no_children")).output().unwrap();
    let expected = String::from_utf8_lossy(&bare.stdout).to_string();
    assert!(expected.starts_with("children: none\ncpus: "), "{expected}");
    let first_run = |tag: &str, planner: &str| -> (String, Vec<u8>) {
        let store = d.join(format!("store-{tag}"));
        let o = Command::new(launcher())
            .args(["-mp", "-d", "-o", &format!("{tag}.gz"), "./no_children"])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", &store)
            .env("IGPROF_PLANNER", planner)
            .output()
            .expect("run igprof");
        let err = ok(&o).to_string();
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out, expected, "{tag}: {err}");
        let dir = store.join("unwind");
        let plans = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("plans-")
            })
            .unwrap_or_else(|| panic!("{tag}: no plans kept in {}", dir.display()));
        (err, std::fs::read(plans).unwrap())
    };
    let (err, plans) = first_run("planner", "1");
    let (err_here, plans_here) = first_run("here", "0");
    let decoder = |e: &str| {
        e.lines()
            .any(|l| l.starts_with("igprof: instruction decoder:"))
    };
    assert!(decoder(&err_here), "planned here: {err_here}");
    assert!(!err_here.contains("hook planner:"), "{err_here}");
    if cfg!(target_arch = "x86_64") {
        let line = debug_line(&err, "hook planner:", "planner");
        assert!(line.contains("plans made in a process of its own"), "{err}");
        assert!(!decoder(&err), "tables built in the program: {err}");
    }
    assert_eq!(plans, plans_here, "the planner's plans differ");
}

/// A program that loads and unloads a library thousands of times, with an
/// empty store: each dlopen and dlclose empties the threads' descriptor
/// caches, so the same descriptors are derived again after each; they are
/// logged for the store once (the previous library logged each
/// derivation: 1.5 MiB of repeats, its whole log, which then had no room
/// for new descriptors), and the library's path is kept once (it was kept
/// again at each load). The program measures its own anonymous resident
/// set after 100 rounds and at the end: under `-mp` (3,000 rounds) it may
/// grow by the stack memo's pool (384 KiB) more than unprofiled (previous
/// library: 1.9 MB more), under `-pp` (10,000 rounds) by little (previous
/// library: 0.4 MB more, without end).
#[test]
fn a_library_loaded_again_and_again_costs_no_memory_each_time() {
    let d = scratch("store_dlopen");
    build(&d, "dlopen_rss.c", "dlopen_rss", &[]);
    let growth = |out: &[u8]| -> i64 {
        let [early, end, _] = dlopen_rss_kb(out);
        end - early
    };
    for (mode, rounds, more) in [("-mp", "3000", 768), ("-pp", "10000", 160)] {
        let plain = Command::new(d.join("dlopen_rss"))
            .arg(rounds)
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(plain.status.success());
        let store = d.join(format!("store{mode}"));
        let out = igprof_command(&d, &["-d", mode, "-o", "p.gz", "./dlopen_rss", rounds])
            .env("IGPROF_CACHE_DIR", &store)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let (bare, profiled) = (growth(&plain.stdout), growth(&out.stdout));
        eprintln!("{mode}, {rounds} rounds: anonymous memory grew {bare} kB unprofiled, {profiled} kB profiled");
        assert!(
            profiled < bare + more,
            "{mode}: {profiled} kB against {bare}: {err}"
        );
        if mode == "-mp" {
            let again = debug_line(&err, "frame descriptors derived again", mode);
            assert!(number_before(again, ", kept once") > 10_000, "{again}");
        }
    }
}

/// The allocator scan's symbol table reads kept between processes
/// (igprof-rs/src/modules/mem/scanned.rs): a program built with its
/// symbols and no allocator of its own has its `.symtab` read by the first
/// process only (`-d`: "1 symbol table(s) known to hold none" after), with
/// the same profile; one with a statically linked allocator (jemalloc,
/// x86-64) is read and hooked by every process, never listed.
#[test]
fn a_symbol_table_without_allocators_is_read_by_the_first_process_only() {
    let d = scratch("scans");
    build(&d, "mem_family.c", "mem_family", &["-fno-builtin"]);
    let store = d.join("store");
    let run = |exe: &str, tag: &str| -> (u64, u64, (u64, u64)) {
        let o = Command::new(launcher())
            .args(["-mp", "-d", "-o", &format!("{tag}.gz"), exe])
            .current_dir(&d)
            .env("IGPROF_LIB", lib())
            .env("IGPROF_CACHE_DIR", &store)
            .output()
            .expect("run igprof");
        let err = ok(&o).to_string();
        let line = debug_line(&err, "allocator entry points:", tag);
        let p = parse_strict(&read_text(&d.join(format!("{tag}.gz")))).unwrap();
        let calls = p
            .nodes
            .iter()
            .flat_map(|n| n.values.iter())
            .filter(|v| v.counter == "MEM_TOTAL")
            .fold((0, 0), |t, v| (t.0 + v.ticks, t.1 + v.value));
        (
            number_before(line, " symbol table(s) known"),
            number_before(line, " hooked in all"),
            calls,
        )
    };
    let (known, hooked, first) = run("./mem_family", "first");
    assert_eq!((known, hooked), (0, 0), "first");
    assert!(first.0 > 0, "first: no allocation seen");
    let listed = std::fs::read_dir(store.join("unwind")).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("scans-")
    });
    assert!(listed, "the program's build-id kept");
    let (known, hooked, second) = run("./mem_family", "second");
    assert_eq!((known, hooked), (1, 0), "second");
    assert_eq!(second, first, "the same allocations, calls and bytes");

    if !cfg!(target_arch = "x86_64") {
        return;
    }
    build_jemalloc_static(&d);
    for tag in ["jemalloc-first", "jemalloc-second"] {
        let (known, hooked, calls) = run("./jemalloc_static", tag);
        assert!(
            known == 0 && hooked > 0 && calls.0 > 0,
            "{tag}: {known} known, {hooked} hooked, {calls:?}"
        );
    }
}
