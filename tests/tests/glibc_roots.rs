//! The release binaries run on other Debian releases: a Debian 11
//! (bullseye, glibc 2.31) and a Debian 13 (trixie, glibc 2.41) root, made
//! once by `scripts/debian-root SUITE` (debootstrap, cached outside the
//! repository under /var/cache/igprof-rs/roots), entered with chroot with
//! /proc mounted for the run. The test programs are compiled inside each
//! root by its own gcc; libigprof.so, igprof and igprof-analyse are copied
//! in from target/release. Each root runs: cpu_split under -pp, alloc_churn
//! under -mp, fd_churn under -fd, procs (fork, fork+exec, system()) under
//! -pp, the root's python3 under -pp and its perl under -mp, and
//! igprof-analyse on every profile, inside the root; and what dlerror()
//! says in a program under -pp, -mp and -np.
//!
//! Needs root (debootstrap, chroot, mount): skipped with a printed reason
//! otherwise. What it must never do: leave /proc mounted in a root, or
//! write anywhere in a root but its /igprof-test directory.

use igprof_tests::{analyser, launcher, lib, root};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// /proc mounted in a root for as long as this lives.
struct ProcMount(PathBuf);

impl ProcMount {
    fn new(root: &Path) -> ProcMount {
        let proc_dir = root.join("proc");
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let already = mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(proc_dir.to_str().unwrap()));
        if !already {
            let st = Command::new("mount")
                .args(["-t", "proc", "proc"])
                .arg(&proc_dir)
                .status()
                .unwrap();
            assert!(st.success(), "mount -t proc proc {}", proc_dir.display());
        }
        ProcMount(proc_dir)
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Builds (once) or finds the root of `suite`.
fn debian_root(suite: &str) -> PathBuf {
    let o = Command::new(root().join("scripts/debian-root"))
        .arg(suite)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "scripts/debian-root {suite}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
}

/// Runs `script` with sh inside `root`, in /igprof-test, with a clean
/// environment; panics with its output when it fails.
fn in_root(root: &Path, what: &str, script: &str) -> String {
    let o: Output = Command::new("chroot")
        .arg(root)
        .args(["/usr/bin/env", "-i"])
        .args([
            "PATH=/igprof-test/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME=/igprof-test",
            "TMPDIR=/igprof-test/tmp",
            "IGPROF_CACHE_DIR=/igprof-test/store",
            "LANG=C.UTF-8",
        ])
        .args(["/bin/sh", "-ec", &format!("cd /igprof-test; {script}")])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "{}: {what}: {:?}\n--- stdout\n{out}\n--- stderr\n{err}",
        root.display(),
        o.status
    );
    out
}

/// The Self and Calls columns of `function`'s line in a flat profile
/// printed by `igprof-analyse -r COUNTER` (Calls absent for FD_USED).
fn flat_self(report: &str, function: &str) -> Vec<u64> {
    let line = report
        .lines()
        .skip_while(|l| !l.starts_with("Flat profile (self"))
        .find(|l| l.split_whitespace().nth_back(1) == Some(function))
        .unwrap_or_else(|| panic!("no {function} in the flat self profile:\n{report}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    words[1..words.len() - 2]
        .iter()
        .map(|w| w.replace('\'', "").parse().unwrap())
        .collect()
}

fn run_suite(suite: &str, glibc: &str) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root (debootstrap, chroot and mounting /proc need root)");
        return;
    }
    let root_dir = debian_root(suite);
    let work = root_dir.join("igprof-test");
    let _ = std::fs::remove_dir_all(&work);
    for d in ["bin", "tmp", "store", "src"] {
        std::fs::create_dir_all(work.join(d)).unwrap();
    }
    for (b, from) in [
        ("libigprof.so", lib()),
        ("igprof", launcher()),
        ("igprof-analyse", analyser()),
    ] {
        std::fs::copy(&from, work.join("bin").join(b)).unwrap();
    }
    for p in [
        "cpu_split",
        "alloc_churn",
        "fd_churn",
        "procs",
        "dlerror_state",
    ] {
        let src = root().join(format!("tests/programs/{p}.c"));
        std::fs::copy(&src, work.join(format!("src/{p}.c"))).unwrap();
    }
    let _proc = ProcMount::new(&root_dir);

    let version = in_root(&root_dir, "glibc version", "getconf GNU_LIBC_VERSION");
    assert_eq!(version.trim(), format!("glibc {glibc}"), "{suite}'s glibc");
    in_root(
        &root_dir,
        "compile the test programs with the root's gcc",
        "for p in cpu_split alloc_churn fd_churn procs; do gcc -O2 -g -o $p src/$p.c; done && \
         gcc -O2 -o dlerror_state src/dlerror_state.c -ldl",
    );

    // The profiler's own failed lookups stay out of the program's
    // dlerror(): glibc 2.31 has no __libc_single_threaded, whose failed
    // dlsym the program's first dlerror() reported under -pp and -mp.
    for mode in ["-pp", "-mp", "-np"] {
        let plain = in_root(&root_dir, "dlerror_state", "./dlerror_state");
        let out = in_root(
            &root_dir,
            "dlerror_state under the profiler",
            &format!("igprof {mode} -o dl.gz ./dlerror_state 2>/dev/null"),
        );
        assert_eq!(out, plain, "{suite}: dlerror() under {mode}");
    }

    // CPU time: the three hot functions.
    let out = in_root(
        &root_dir,
        "cpu_split -pp",
        "igprof -pp -i 1ms -o cpu.gz ./cpu_split 40 && igprof-analyse -d cpu.gz",
    );
    for f in ["hot_a", "hot_b", "hot_c"] {
        assert!(out.contains(f), "{suite}: cpu_split: no {f}:\n{out}");
    }

    // Memory: site_leak's exact live bytes and calls.
    let out = in_root(
        &root_dir,
        "alloc_churn -mp",
        "igprof -mp -o mem.gz ./alloc_churn 20000 1 && igprof-analyse -r MEM_LIVE mem.gz",
    );
    assert!(
        out.contains("done 20000"),
        "{suite}: alloc_churn output:\n{out}"
    );
    assert_eq!(
        flat_self(&out, "site_leak"),
        [1_000_000, 1_000],
        "{suite}: MEM_LIVE"
    );

    // Descriptors: exact counts.
    let out = in_root(
        &root_dir,
        "fd_churn -fd",
        "igprof -fd -o fd.gz ./fd_churn 2000 && igprof-analyse -r FD_USED fd.gz",
    );
    assert!(
        out.contains("fd done 2000"),
        "{suite}: fd_churn output:\n{out}"
    );
    for (f, n) in [
        ("fd_pipe", 4000),
        ("fd_dup", 2001),
        ("fd_socket", 2000),
        ("fd_leak", 2),
    ] {
        assert_eq!(flat_self(&out, f), [n], "{suite}: FD_USED of {f}");
    }

    // fork, fork+exec and system(): a profile per process, each with its work.
    let out = in_root(
        &root_dir,
        "procs -pp",
        "mkdir forks && cd forks && igprof -pp -i 1ms ../procs && \
         for f in igprof.procs.*.gz; do echo \"== $f\"; igprof-analyse -d \"$f\"; done && ls",
    );
    assert!(out.starts_with("0 0 0\n"), "{suite}: procs' output:\n{out}");
    for f in ["parent_work", "forked_child_work", "exec_child_work"] {
        assert!(
            out.contains(f),
            "{suite}: procs: no profile has {f}:\n{out}"
        );
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("igprof.sh.") || l.starts_with("igprof.dash.")),
        "{suite}: system()'s shell wrote no profile:\n{out}"
    );

    // The root's own interpreters.
    let out = in_root(
        &root_dir,
        "python3 -pp",
        "igprof -pp -i 1ms -o py.gz python3 -c 'print(sum(i * i for i in range(3000000)))' && \
         igprof-analyse -d py.gz",
    );
    assert!(
        out.starts_with("8999995500000500000\n"),
        "{suite}: python3:\n{out}"
    );
    assert!(
        out.contains("Flat profile"),
        "{suite}: python3 profile:\n{out}"
    );
    let out = in_root(
        &root_dir,
        "perl -mp",
        "igprof -mp -o pl.gz perl -e 'my %h; $h{$_} = \"x\" x 100 for 1..20000; print scalar(keys %h), \"\\n\"' && \
         igprof-analyse -r MEM_TOTAL pl.gz",
    );
    assert!(out.starts_with("20000\n"), "{suite}: perl:\n{out}");
    assert!(
        out.contains("Perl_"),
        "{suite}: perl's own functions in its profile:\n{out}"
    );
    if suite == "trixie" {
        // Python 3.13 writes a perf map under --jit (PYTHONPERFSUPPORT):
        // copied beside the profile, it names the Python function once the
        // one in /tmp is gone.
        std::fs::write(
            work.join("hot.py"),
            "def hot_function(n):\n    return sum(i * i for i in range(n))\n\nprint(hot_function(3000000))\n",
        )
        .unwrap();
        let out = in_root(
            &root_dir,
            "python3 --jit",
            "igprof --jit -pp -i 1ms -o pyjit.gz python3 hot.py && \
             ls perf-*.map && rm -f /tmp/perf-*.map && igprof-analyse pyjit.gz",
        );
        assert!(
            out.starts_with("8999995500000500000\n"),
            "{suite}: python3 --jit:\n{out}"
        );
        assert!(
            out.contains("py::hot_function"),
            "{suite}: the Python function named from the copied map:\n{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn debian_11_bullseye_glibc_2_31() {
    run_suite("bullseye", "2.31");
}

#[test]
fn debian_13_trixie_glibc_2_41() {
    run_suite("trixie", "2.41");
}
