//! End-to-end checks of the function-call profiler (`-fp:FUNC[:LIB]`,
//! `-fpi`, `-fpf`) on tests/programs/fp_calls.c: exact CALLS_TOTAL per
//! calling function (three call sites, four threads, a function of a
//! library loaded later by dlopen), arguments and results unchanged
//! through the entry stub (integers and doubles on the stack, varargs,
//! structures, a double result, __m256 and __m512 on x86-64) with the
//! output byte-identical to the unprofiled run, `-fp:malloc` with `-mp`
//! and `-pd`, refusals on one line, sqlite3's calls of sqlite3_step
//! against ltrace's count, and the AArch64 stub under qemu-user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use igprof_tests::*;

fn build_calls(name: &str) -> (PathBuf, PathBuf) {
    let d = scratch(name);
    let exe = build(&d, "fp_calls.c", "fp_calls", &[]);
    build(&d, "fp_plug.c", "fp_plug.so", &["-shared", "-fPIC"]);
    (d, exe)
}

/// CALLS_TOTAL per calling function (the leaf of each path: FUNC itself
/// is not on the stack), and the paths' calls summed.
fn by_caller(p: &Profile) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (path, calls, value) in path_values(p, "CALLS_TOTAL") {
        assert_eq!(calls, value, "CALLS_TOTAL's value is its call count");
        *m.entry(path.last().cloned().unwrap_or_default())
            .or_default() += calls;
    }
    m.retain(|_, v| *v > 0);
    m
}

/// Runs `igprof <fp...> -o prof.gz ./fp_calls <mode>` in `d`, which must
/// exit 0: (stdout, stderr, profile).
fn run(d: &Path, fp: &[&str], mode: &str) -> (String, String, Profile) {
    let mut a: Vec<&str> = fp.to_vec();
    a.extend_from_slice(&["-o", "prof.gz", "./fp_calls", mode]);
    let o = igprof(d, &a);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let p = parse_strict(&read_text(&d.join("prof.gz"))).unwrap_or_else(|e| panic!("{e}\n{err}"));
    assert_eq!(o.status.code(), Some(0), "{err}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), err, p)
}

/// The functions of `fp_calls args` on every architecture, each called 50
/// times from call_args.
const ARGS: [&str; 6] = [
    "-fp:many_ints",
    "-fpf:many_doubles",
    "-fpf:mixed",
    "-fpi:fmt",
    "-fp:small_pass",
    "-fp:big_pass",
];

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn every_call_is_counted_at_its_calling_function() {
    let (d, _) = build_calls("fp-sites");
    let (out, err, p) = run(&d, &["-fp:target"], "sites");
    assert_eq!(out, "fp_calls sites done\n", "{err}");
    assert_eq!(
        by_caller(&p),
        counts(&[("site_a", 1000), ("site_b", 300), ("site_c", 7)])
    );
    // The stack is the caller's: main > site_a, nothing of the profiler.
    for (path, calls) in paths(&p, "CALLS_TOTAL") {
        if calls > 0 {
            let n = path.len();
            assert_eq!(path[n - 2], "main", "{path:?}");
            assert!(
                !path.iter().any(|f| f == "target" || f.contains("igprof")),
                "{path:?}"
            );
        }
    }
    // igprof-analyse's flat self column.
    let o = Command::new(analyser())
        .args(["-r", "CALLS_TOTAL", "prof.gz"])
        .current_dir(&d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("Counter: CALLS_TOTAL"), "{text}");
    let flat_self = text.split("Flat profile (self").nth(1).unwrap();
    let self_of = |f: &str| {
        flat_self
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(f))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(|v| v.replace('\'', ""))
    };
    assert_eq!(self_of("site_a").as_deref(), Some("1000"), "{text}");
    assert_eq!(self_of("site_b").as_deref(), Some("300"), "{text}");
    assert_eq!(self_of("site_c").as_deref(), Some("7"), "{text}");
}

/// `fp_calls args` unprofiled in `d` (it must succeed).
fn bare_args(d: &Path, exe: &Path) -> std::process::Output {
    let bare = Command::new(exe)
        .arg("args")
        .current_dir(d)
        .output()
        .unwrap();
    assert!(bare.status.success());
    bare
}

#[test]
fn arguments_and_results_pass_through_unchanged() {
    let (d, exe) = build_calls("fp-args");
    let bare = bare_args(&d, &exe);
    let mut funcs = ARGS.to_vec();
    funcs.extend(["-fp:vec256", "-fp:vec512", "-fpf:tiny512"]);
    let (out, err, p) = run(&d, &funcs, "args");
    assert_eq!(out.as_bytes(), &bare.stdout[..], "{err}");
    let avx = out.contains("vec256");
    let avx512 = out.contains("vec512");
    let mut want = counts(&[("call_args", 6 * 50)]);
    if avx {
        want.insert("check_avx".into(), 50);
    }
    if avx512 {
        want.insert("check_avx512".into(), 50);
        want.insert("keep512".into(), 50);
    }
    assert_eq!(by_caller(&p), want, "{err}");
    // Each function alone: 50 calls.
    for f in ARGS {
        let (_, err, p) = run(&d, &[f], "args");
        assert_eq!(by_caller(&p), counts(&[("call_args", 50)]), "{f}: {err}");
    }
}

#[test]
fn a_function_of_a_library_loaded_later_is_counted() {
    let (d, _) = build_calls("fp-plugin");
    for spec in ["-fp:plug_fn:fp_plug.so", "-fp:plug_fn"] {
        let (out, err, p) = run(&d, &[spec, "-d"], "plugin");
        assert_eq!(out, "plugin 155625\nfp_calls plugin done\n");
        assert_eq!(
            by_caller(&p),
            counts(&[("call_plug", 250)]),
            "{spec}: {err}"
        );
        assert!(!err.contains("no call counted"), "{err}");
    }
    // Unloaded and loaded again: hooked again, every call counted.
    let (out, err, p) = run(&d, &["-fp:plug_fn:fp_plug.so"], "replug");
    assert_eq!(
        out, "plugin 155625\nplugin 24750\nfp_calls replug done\n",
        "{err}"
    );
    assert_eq!(by_caller(&p), counts(&[("call_plug", 350)]), "{err}");
    assert!(!err.contains("no call counted"), "{err}");
    // A library never loaded: said once, the program runs on.
    let (out, err, p) = run(&d, &["-fp:plug_fn:libnever.so.9"], "plugin");
    assert_eq!(out, "plugin 155625\nfp_calls plugin done\n");
    assert_eq!(
        err.matches(
            "-fp:plug_fn:libnever.so.9: libnever.so.9 was not loaded (yet); no call counted"
        )
        .count(),
        1,
        "{err}"
    );
    assert!(by_caller(&p).is_empty());
}

#[test]
fn four_threads_calls_add_up_exactly() {
    let (d, _) = build_calls("fp-threads");
    let (out, err, p) = run(&d, &["-fp:target"], "threads");
    assert_eq!(out, "fp_calls threads done\n", "{err}");
    assert_eq!(by_caller(&p), counts(&[("thread_site", 4 * 20000)]));
}

#[test]
fn functions_that_cannot_be_counted_are_named_on_one_line() {
    let (d, exe) = build_calls("fp-refused");
    let bare = Command::new(&exe).arg("sites").output().unwrap();
    let (out, err, p) = run(
        &d,
        &[
            "-fp:no_such_function",
            "-fp:__tls_get_addr",
            "-fp:target:libc.so.6",
            "-fp:target",
        ],
        "sites",
    );
    assert_eq!(out.as_bytes(), &bare.stdout[..], "{err}");
    let lines = |s: &str| err.lines().filter(|l| l.contains(s)).count();
    assert_eq!(
        lines("-fp:no_such_function: symbol no_such_function not found"),
        1,
        "{err}"
    );
    assert_eq!(
        lines("-fp:__tls_get_addr: the profiler calls __tls_get_addr"),
        1,
        "{err}"
    );
    assert_eq!(
        lines("-fp:target:libc.so.6: symbol target not found in libc.so.6; not profiled"),
        1,
        "{err}"
    );
    // The one that could be hooked is counted.
    assert_eq!(
        by_caller(&p),
        counts(&[("site_a", 1000), ("site_b", 300), ("site_c", 7)])
    );
    // glibc's memcpy is memmove's code, which mempcpy enters 3 bytes in
    // with a short jump: refused on one line rather than patched under
    // that jump (where it is not so, it is counted); either way the
    // program runs unchanged.
    let (out, err, _) = run(&d, &["-fp:memcpy", "-fp:memmove"], "sites");
    assert_eq!(out.as_bytes(), &bare.stdout[..], "{err}");
    for f in ["memcpy", "memmove"] {
        assert!(
            err.lines()
                .filter(|l| l.contains(&format!("-fp:{f}:")))
                .count()
                <= 1,
            "{err}"
        );
    }
    // Nothing could be hooked: the program runs unprofiled.
    let o = igprof(
        &d,
        &["-fp:no_such_function:libc.so.6", "./fp_calls", "sites"],
    );
    let err = ok(&o);
    assert_eq!(o.stdout, bare.stdout);
    assert!(err.contains("nothing left to profile"), "{err}");
}

/// libc functions the profiler calls itself (Rust's memset, errno's
/// slot, write, mmap for its memory) counted together with the program's
/// function, under -pp -mp: the profiler's own calls pass uncounted and
/// never recurse; the program's calls of target are exact.
#[test]
fn functions_the_profiler_calls_too_are_counted_without_recursion() {
    let (d, exe) = build_calls("fp-own");
    let bare = Command::new(&exe).arg("threads").output().unwrap();
    let (out, err, p) = run(
        &d,
        &[
            "-fp:memset",
            "-fp:__errno_location",
            "-fp:write",
            "-fp:mmap",
            "-fp:target",
            "-pp",
            "-mp",
        ],
        "threads",
    );
    assert_eq!(out.as_bytes(), &bare.stdout[..], "{err}");
    assert_eq!(by_caller(&p)["thread_site"], 4 * 20000, "{err}");
}

/// -fp:malloc with -mp: both count every malloc of the enabled phase
/// (phases.c: 50 in during(), recording off before and after).
#[test]
fn malloc_is_counted_with_the_memory_profiler_and_pd() {
    let d = scratch("fp-malloc");
    build(&d, "phases.c", "phases", &["-ldl"]);
    let o = igprof(
        &d,
        &["-pd", "-fp:malloc", "-mp", "-o", "m.gz", "./phases", "api"],
    );
    ok(&o);
    let p = parse_strict(&read_text(&d.join("m.gz"))).unwrap();
    assert_eq!(under(&p, "CALLS_TOTAL", "during").0, 50);
    assert_eq!(under(&p, "MEM_TOTAL", "during").0, 50);
    for f in ["before", "after"] {
        assert_eq!(under(&p, "CALLS_TOTAL", f).0, 0, "{f}");
        assert_eq!(under(&p, "MEM_TOTAL", f).0, 0, "{f}");
    }
}

/// sqlite3 (libsqlite3 linked dynamically): every call of sqlite3_step,
/// the shell's and libsqlite3's own (sqlite3_exec), as ltrace counts
/// them; the output unchanged.
#[test]
fn sqlite3_step_calls_match_ltrace() {
    let d = scratch("fp-sqlite3");
    std::fs::write(
        d.join("q.sql"),
        "CREATE TABLE t(x);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<1000) INSERT INTO t SELECT x FROM c;\n\
         SELECT count(*) FROM t;\n\
         SELECT x FROM t WHERE x % 100 = 0;\n",
    )
    .unwrap();
    let args = ["sqlite3", ":memory:", ".read q.sql"];
    let bare = Command::new(args[0])
        .args(&args[1..])
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(bare.status.success());
    let lt = Command::new("ltrace")
        .args(["-c", "-e", "sqlite3_step", "-o", "lt.txt"])
        .args(args)
        .current_dir(&d)
        .output()
        .expect("ltrace (scripts/setup installs it)");
    assert!(lt.status.success());
    let lt_text = std::fs::read_to_string(d.join("lt.txt")).unwrap();
    let want: u64 = lt_text
        .lines()
        .find(|l| l.trim_end().ends_with(" sqlite3_step"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("ltrace's count: {lt_text}"));
    assert!(want > 10, "{lt_text}");
    let mut a = vec!["-fp:sqlite3_step:libsqlite3.so.0", "-o", "s.gz"];
    a.extend_from_slice(&args);
    let o = igprof(&d, &a);
    ok(&o);
    assert_eq!(o.stdout, bare.stdout);
    let p = parse_strict(&read_text(&d.join("s.gz"))).unwrap();
    assert_eq!(total(&p, "CALLS_TOTAL"), want, "ltrace: {lt_text}");
}

/// The AArch64 stub (or x86-64's on an AArch64 host) under qemu-user:
/// arguments and results unchanged, exact counts.
#[test]
fn the_other_architectures_stub_keeps_arguments_and_counts_exactly() {
    let d = scratch("fp-foreign");
    let exe = cross_build(&d, "fp_calls.c", "fp_calls", &[]);
    let mut a: Vec<&str> = ARGS.to_vec();
    a.extend_from_slice(&["-o", "args.gz", "./fp_calls", "args"]);
    let o = foreign_igprof(&d, &a);
    let err = ok(&o);
    assert!(err.contains("profiling"), "{err}");
    // The unprofiled run's output, under the same emulator.
    let bare = foreign_igprof_command(
        &d,
        &["-fp:no_such_function:libc.so.6", "./fp_calls", "args"],
    )
    .output()
    .unwrap();
    assert!(
        bare.status.success(),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    assert!(!bare.stdout.is_empty());
    assert_eq!(o.stdout, bare.stdout);
    let p = parse_strict(&read_text(&d.join("args.gz"))).unwrap();
    assert_eq!(by_caller(&p), counts(&[("call_args", 6 * 50)]), "{err}");
    let o = foreign_igprof(&d, &["-fp:target", "-o", "s.gz", "./fp_calls", "sites"]);
    ok(&o);
    let p = parse_strict(&read_text(&d.join("s.gz"))).unwrap();
    assert_eq!(
        by_caller(&p),
        counts(&[("site_a", 1000), ("site_b", 300), ("site_c", 7)])
    );
    let _ = exe;
}

/// What /proc/cpuinfo says this x86-64 host (and its kernel) offers the
/// stub: xsave (OSXSAVE), xsavec, AVX and AVX-512 state, xgetbv with
/// ecx = 1 (the XINUSE shortcut).
#[cfg(target_arch = "x86_64")]
fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let line = info.lines().find(|l| l.starts_with("flags")).unwrap();
    line.split_whitespace().map(str::to_string).collect()
}

/// Every `IGPROF_XSAVE_FORM` this host can execute: fxsave; xsave and
/// (where the CPU has it) xsavec with the components SSE, SSE+AVX and
/// SSE+AVX+AVX-512 as XCR0 enables them, the XINUSE shortcut off and on.
#[cfg(target_arch = "x86_64")]
fn host_forms() -> Vec<String> {
    let f = cpu_flags();
    let has = |x: &str| f.iter().any(|g| g == x);
    let mut v = vec!["fxsave".to_string()];
    if !has("xsave") {
        return v;
    }
    let mut parts = vec!["sse"];
    if has("avx") {
        parts.push("sse+avx");
    }
    if has("avx512f") {
        parts.push("sse+avx+zmm");
    }
    let mut shortcut = vec!["noxinuse"];
    if has("avx") && has("xgetbv1") {
        shortcut.push("xinuse");
    }
    for form in ["xsave", "xsavec"] {
        if form == "xsavec" && !has("xsavec") {
            continue;
        }
        for p in &parts {
            for s in &shortcut {
                v.push(format!("{form}:{p}:{s}"));
            }
        }
    }
    v
}

/// The functions to hook under `form`: those of [`ARGS`], and vec256, and
/// vec512 and tiny512 (whose caller keeps values in xmm16-31) when the
/// form keeps their registers (a narrower form is a
/// test of the smaller save, not of vectors it does not keep).
#[cfg(target_arch = "x86_64")]
fn hooked_under(form: &str) -> Vec<&'static str> {
    let mut v = ARGS.to_vec();
    if form.contains("avx") {
        v.push("-fp:vec256");
    }
    if form.contains("zmm") {
        v.extend(["-fp:vec512", "-fpf:tiny512"]);
    }
    v
}

/// `fp_calls args` output and profile under the hooks of `fp`: the output
/// must be `bare`'s and each function counted 50 times at its caller.
#[cfg(target_arch = "x86_64")]
fn check_args_run(what: &str, o: &std::process::Output, bare: &[u8], fp: &[&str], prof: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{what}: {err}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(bare),
        "{what}: {err}"
    );
    let mut want = counts(&[("call_args", 50 * ARGS.len() as u64)]);
    if fp.contains(&"-fp:vec256") {
        want.insert("check_avx".into(), 50);
    }
    if fp.contains(&"-fp:vec512") {
        want.insert("check_avx512".into(), 50);
        want.insert("keep512".into(), 50);
    }
    let p = parse_strict(&read_text(prof)).unwrap_or_else(|e| panic!("{what}: {e}\n{err}"));
    assert_eq!(by_caller(&p), want, "{what}: {err}");
}

/// Every save form of the x86-64 stub this host can execute, forced with
/// `IGPROF_XSAVE_FORM`, keeps every argument and result, with the counting
/// path overwriting every vector register a callee may change
/// (`IGPROF_FP_CLOBBER=1`): GCC's caller keeps values in xmm8-15 across a
/// call of a function that leaves them alone, so a stub that kept only
/// the argument registers changes the caller's result. Then the AVX2-only
/// host's case without the clobber: glibc's AVX2 string functions (what
/// it picks without AVX-512) on the counting path and the XINUSE shortcut.
#[cfg(target_arch = "x86_64")]
#[test]
fn every_save_form_keeps_arguments_and_the_callers_registers() {
    let (d, exe) = build_calls("fp-forms");
    let bare = bare_args(&d, &exe);
    let forms = host_forms();
    for form in &forms {
        let fp = hooked_under(form);
        let mut a = fp.clone();
        a.extend_from_slice(&["-o", "prof.gz", "./fp_calls", "args"]);
        let o = igprof_command(&d, &a)
            .env("IGPROF_XSAVE_FORM", form)
            .env("IGPROF_FP_CLOBBER", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("IGPROF_XSAVE_FORM={form}: the -fp stubs save")),
            "{form} not used: {err}"
        );
        check_args_run(form, &o, &bare.stdout, &fp, &d.join("prof.gz"));
    }
    let shortcut = forms
        .iter()
        .rev()
        .find(|f| f.ends_with("sse+avx:xinuse"))
        .cloned();
    if let Some(form) = shortcut {
        let mut a = hooked_under(&form);
        a.extend_from_slice(&["-o", "prof.gz", "./fp_calls", "args"]);
        let o = igprof_command(&d, &a)
            .env("IGPROF_XSAVE_FORM", &form)
            .env(
                "GLIBC_TUNABLES",
                "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD",
            )
            .output()
            .unwrap();
        check_args_run(
            &format!("{form}, AVX2 string functions"),
            &o,
            &bare.stdout,
            &hooked_under(&form),
            &d.join("prof.gz"),
        );
    }
    // A form that is no form: one line, and the detected form is used.
    let o = igprof_command(
        &d,
        &["-fp:many_doubles", "-o", "prof.gz", "./fp_calls", "args"],
    )
    .env("IGPROF_XSAVE_FORM", "xsaves")
    .output()
    .unwrap();
    let err = ok(&o);
    let line: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("IGPROF_XSAVE_FORM"))
        .collect();
    assert_eq!(line.len(), 1, "{err}");
    assert!(line[0].contains("unknown form 'xsaves'"), "{err}");
}

/// The x86-64 stub on CPUs this host is not, under qemu-user: Nehalem (no
/// AVX, no xsave: fxsave) and Haswell (AVX2, xsave without xsavec; qemu
/// 7.2 has no XINUSE). Each form the model can execute keeps every
/// argument with the clobber on; one it cannot is refused on one line and
/// the detected form is used. The program runs as `qemu-x86_64 -cpu M`
/// with the library preloaded in the guest (`-E LD_PRELOAD`) and the
/// launcher's variables: the launcher runs qemu only for another
/// architecture's program. It is linked with its code in the first
/// segment: qemu 7.2 shows a same-architecture guest's maps with the
/// flags of each host mapping's first page, so a text segment after a
/// read-only one would look not executable and nothing could be hooked.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_stub_keeps_arguments_on_cpus_without_avx_or_xsavec_under_qemu() {
    let d = scratch("fp-qemu-x86");
    build(&d, "fp_calls.c", "fp_calls", &["-Wl,-z,noseparate-code"]);
    let qemu = |cpu: &str, form: &str, fp: &[&str]| {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "cpu=$1; shift; exec qemu-x86_64 -cpu $cpu -E IGPROF_ROOT_PID=$$ \"$@\"",
            "sh",
            cpu,
        ]);
        if !fp.is_empty() {
            c.args(["-E", &format!("LD_PRELOAD={}", lib().display())])
                .env("IGPROF", format!("{} -o q.gz", fp.join(" ")))
                .env("IGPROF_QEMU_USER", "1")
                .env("IGPROF_CACHE_DIR", test_store())
                .env("IGPROF_FP_CLOBBER", "1")
                .env("IGPROF_XSAVE_FORM", form);
        }
        c.args(["./fp_calls", "args"])
            .current_dir(&d)
            .output()
            .unwrap()
    };
    for (cpu, forms, refused) in [
        ("Nehalem", &["fxsave"][..], "xsave:sse"),
        (
            "Haswell",
            &["fxsave", "xsave:sse:noxinuse", "xsave:sse+avx:noxinuse", ""][..],
            "xsavec:sse+avx",
        ),
    ] {
        let bare = qemu(cpu, "", &[]);
        assert!(bare.status.success(), "{cpu}");
        for form in forms.iter().chain([&refused]) {
            let fp = hooked_under(if form.is_empty() {
                cpu_default(cpu)
            } else {
                form
            });
            let _ = std::fs::remove_file(d.join("q.gz"));
            let o = qemu(cpu, form, &fp);
            let err = String::from_utf8_lossy(&o.stderr);
            let said: Vec<&str> = err
                .lines()
                .filter(|l| l.contains("IGPROF_XSAVE_FORM"))
                .collect();
            if form.is_empty() {
                assert!(said.is_empty(), "{err}");
            } else if *form == refused {
                assert_eq!(said.len(), 1, "{cpu} {form}: {err}");
                assert!(said[0].contains("; the -fp stubs save"), "{err}");
                assert!(!said[0].contains(&format!("{form}: the -fp")), "{err}");
            } else {
                assert_eq!(said.len(), 1, "{cpu} {form}: {err}");
                assert!(
                    said[0].contains(&format!("{form}: the -fp stubs save")),
                    "{err}"
                );
            }
            check_args_run(
                &format!("{cpu} {form}"),
                &o,
                &bare.stdout,
                &fp,
                &d.join("q.gz"),
            );
        }
    }
}

/// The form the stub detects on a qemu CPU model, as [`hooked_under`]
/// spells it.
#[cfg(target_arch = "x86_64")]
fn cpu_default(cpu: &str) -> &'static str {
    if cpu == "Haswell" {
        "xsave:sse+avx"
    } else {
        "fxsave"
    }
}

/// `-fp` of a function of a library the program loads and unloads in a
/// loop (tests/programs/dlopen_rss.c, libz's `compress2`): each load hooks
/// it again, and the registry of hooks kept every earlier load's record,
/// about 200 bytes a round of anonymous memory (3,000 rounds: 596 kB more
/// than at round 100); records whose code is unmapped are now dropped
/// after each dlclose (52 kB).
#[test]
fn a_hooked_library_loaded_again_and_again_keeps_no_record_of_each_load() {
    let d = scratch("fp_reload");
    build(&d, "dlopen_rss.c", "dlopen_rss", &[]);
    let growth = |out: &[u8]| -> i64 {
        let [early, end, _] = dlopen_rss_kb(out);
        end - early
    };
    let plain = Command::new(d.join("dlopen_rss"))
        .arg("3000")
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let out = igprof_command(
        &d,
        &["-d", "-fp:compress2", "-o", "p.gz", "./dlopen_rss", "3000"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.matches("counting the calls of compress2").count() > 1000,
        "not hooked at each load: {err}"
    );
    let (bare, profiled) = (growth(&plain.stdout), growth(&out.stdout));
    eprintln!("3,000 rounds: anonymous memory grew {bare} kB unprofiled, {profiled} kB under -fp:compress2");
    assert!(profiled < bare + 256, "{profiled} kB against {bare}");
}

/// `-fp` of a function of a loaded library: the lookup read the library's
/// file whole into memory (for symbol sizes), and the check for branches
/// into the patched bytes read every page of it through its mapping; the
/// program's peak resident set grew by about twice the file's size
/// (libLLVM, 110 MB: 49 -> 165 MB). Now the file is mapped and only its
/// symbol tables are read there, and the scan reads the file.
#[test]
fn hooking_a_function_of_a_big_library_does_not_make_it_resident() {
    let lib = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";
    if !cfg!(target_arch = "x86_64") || !Path::new(lib).exists() {
        eprintln!("skipped: no {lib}");
        return;
    }
    let size_kb = std::fs::metadata(lib).unwrap().len() as i64 >> 10;
    let d = scratch("fp_big_lib");
    build(&d, "dlopen_peak.c", "dlopen_peak", &[]);
    let peak = |args: &[&str]| -> (i64, String) {
        let out = igprof_command(&d, args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        let kb = text
            .trim()
            .strip_prefix("peak ")
            .and_then(|k| k.parse().ok())
            .unwrap_or_else(|| panic!("not dlopen_peak's line: {text:?}"));
        (kb, err)
    };
    // The same library and start-up, no symbol lookup.
    let (unhooked, _) = peak(&["-pp", "-o", "a.gz", "./dlopen_peak", lib]);
    let (hooked, err) = peak(&[
        "-d",
        "-fp:EVP_MD_CTX_new",
        "-o",
        "b.gz",
        "./dlopen_peak",
        lib,
    ]);
    assert!(
        err.contains("counting the calls of EVP_MD_CTX_new"),
        "not hooked: {err}"
    );
    eprintln!(
        "peak: {unhooked} kB under -pp, {hooked} kB hooking a function of {lib} ({size_kb} kB)"
    );
    assert!(
        hooked < unhooked + size_kb / 2,
        "{hooked} kB against {unhooked} kB: the library ({size_kb} kB) was made resident"
    );
}

/// `-fp` of a name no loaded object exports: the lookup reads the symbol
/// tables of the loaded objects' files, and read the profiler's own too,
/// whole into memory (15 MB with its debug information) at start-up and at
/// each dlopen: the profiled program's peak resident set was 16 MB above
/// its unprofiled one (tests/programs/dlopen_rss.c reports its peak).
/// The profiler's own library is never searched now.
#[test]
fn a_name_no_object_exports_costs_no_memory_to_look_for() {
    let d = scratch("fp_peak");
    build(&d, "dlopen_rss.c", "dlopen_rss", &[]);
    let peak = |out: &std::process::Output| -> i64 { dlopen_rss_kb(&out.stdout)[2] };
    let plain = Command::new(d.join("dlopen_rss"))
        .arg("20")
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let out = igprof_command(&d, &["-fp:no_such_fn", "-o", "p.gz", "./dlopen_rss", "20"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let (bare, profiled) = (peak(&plain), peak(&out));
    eprintln!("peak resident set: {bare} kB unprofiled, {profiled} kB under -fp:no_such_fn");
    // The library's code and tables at start-up: about 2 MB.
    assert!(
        profiled < bare + (6 << 10),
        "{profiled} kB against {bare}: {err}"
    );
}
