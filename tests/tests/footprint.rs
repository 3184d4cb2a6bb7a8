//! What the profiler leaves resident in the process it profiles: once
//! start-up is over, the library's code and read-only data pages are
//! unmapped (base/code_pages.rs), and only the pages the running program
//! uses fault back in. Checked on an installed program, `sleep`, through
//! its /proc/PID/smaps while it runs.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use igprof_tests::*;

/// Resident and mapped KiB of the library's mappings whose permissions
/// pass `which` (`r-xp`, `r--p`...) in process `pid`.
fn library_kib(pid: u32, which: impl Fn(&str) -> bool) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut ours, mut rss, mut size) = (false, 0, 0);
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first()
            .is_some_and(|a| a.contains('-') && !a.ends_with(':'))
        {
            ours = f.len() > 5 && f[5].ends_with("/libigprof.so") && which(f[1]);
        } else if ours && f[0] == "Size:" {
            size += f[1].parse::<u64>().unwrap();
        } else if ours && f[0] == "Rss:" {
            rss += f[1].parse::<u64>().unwrap();
        }
    }
    (rss, size)
}

/// Resident and mapped KiB of the library's mappings that are not
/// writable (text, read-only data) in process `pid`.
fn library_read_only_kib(pid: u32) -> (u64, u64) {
    library_kib(pid, |perms| !perms.contains('w'))
}

/// Reads `child`'s stderr up to `-d`'s "start-up over:" line, which it
/// returns.
fn start_up_line(err: &mut impl BufRead) -> String {
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 {
        if line.contains("start-up over:") {
            return line;
        }
        line.clear();
    }
    panic!("no start-up line")
}

/// A profiled `sleep` (-pp -mp), looked at once start-up is over: `-d`
/// says how much was unmapped (at least the library's text), and less than
/// 80% of the read-only mappings are resident (all of them were before:
/// start-up touches code across the whole library, and the kernel maps
/// file pages around each fault).
#[test]
fn start_up_code_leaves_the_resident_set() {
    let d = scratch("footprint");
    let mut child = igprof_command(&d, &["-d", "-pp", "-mp", "sleep", "3"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let said = start_up_line(&mut err);
    // What runs after start-up has faulted its pages back in by now.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The program's pid is the launcher's (it execs the program).
    let (rss, size) = library_read_only_kib(child.id());
    let (text_rss, _) = library_kib(child.id(), |perms| perms.contains('x'));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    let unmapped: u64 = said
        .split("start-up over: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no start-up line: {said:?}"));
    let text_kib = library_text_kib();
    assert!(
        unmapped >= text_kib,
        "{unmapped} KiB unmapped, text {text_kib} KiB"
    );
    eprintln!(
        "{rss} of {size} KiB of the library's read-only mappings resident, {text_rss} of its code"
    );
    assert!(size >= text_kib, "{size}");
    assert!(rss * 100 < size * 80, "{rss} of {size} KiB resident");
    // The keeper's watch is all that runs: its code is in the library's
    // `igprof_hot` section (base/code_pages.rs), two 64 KiB windows at
    // most (84 KiB measured; 264 KiB before the section).
    assert!(
        text_rss <= 192,
        "{text_rss} KiB of the library's code resident"
    );
}

/// sqlite3 inserting rows under `-mp`, then under `-pp` at 1 ms, looked
/// at once start-up is over: what its allocations run (hooks, stack memo,
/// walks, live table, the keeper's watch) and what each sample runs
/// (handler, ticks, re-arming, walk, tree) lies in the library's
/// `igprof_hot` section, so little of the library's code is resident while
/// it runs (92 KiB measured for each: the section's two 64 KiB windows,
/// and of its read-only data only what the loader relocated;
/// `-mp` 452 KiB before the section, `-pp` 356 KiB while the sampler's
/// re-arming and late off-CPU check were outside it, the kernel mapping
/// 64 KiB around each fault in code spread over 1.4 MB).
#[test]
fn a_running_programs_hooks_keep_little_code_resident() {
    let d = scratch("footprint-run");
    let mut sql = String::from("create table t(a integer, b text);\nbegin;\n");
    for i in 0..400_000 {
        sql.push_str(&format!(
            "insert into t values({i}, 'row {}');\n",
            i * 7919 % 400_000
        ));
    }
    sql.push_str("commit;\nselect count(*) from t;\n");
    std::fs::write(d.join("rows.sql"), sql).unwrap();
    for mode in [&["-mp"][..], &["-pp", "-i", "1ms"]] {
        let mut args = vec!["-d"];
        args.extend_from_slice(mode);
        args.extend_from_slice(&["-o", "rows.gz", "sqlite3", ":memory:", ".read rows.sql"]);
        let mut child = igprof_command(&d, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        start_up_line(&mut err);
        std::thread::sleep(std::time::Duration::from_millis(400));
        let (text_rss, text_size) = library_kib(child.id(), |perms| perms.contains('x'));
        // Read-only data: the relocated part (RELRO, ~56 KiB, written by
        // the loader, always resident) and the rest, of which nothing.
        let (data_rss, _) = library_kib(child.id(), |perms| perms == "r--p");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        assert!(child.wait().unwrap().success(), "{mode:?}: {rest}");
        assert!(
            text_size > 0,
            "{mode:?}: the run ended before it was looked at: {rest}"
        );
        eprintln!(
            "{mode:?}: {text_rss} KiB of the library's code resident, {data_rss} KiB of its read-only data"
        );
        // The hot section's two windows and half of one more.
        assert!(
            text_rss <= 160,
            "{mode:?}: {text_rss} KiB of the library's code resident"
        );
        // RELRO and less than a 64 KiB window more (previous library: 120).
        assert!(
            data_rss < 100,
            "{mode:?}: {data_rss} KiB of the library's read-only data resident"
        );
    }
}

/// The library's `igprof_hot` section (base/code_pages.rs) holds what a
/// long process keeps running, and must stay under the kernel's 64 KiB
/// fault-around window so that it costs two windows at most.
#[test]
fn the_hot_section_fits_a_window() {
    let text = readelf_of_lib("-SW");
    let line = text
        .lines()
        .find(|l| l.contains(" igprof_hot "))
        .expect("an igprof_hot section");
    let f: Vec<&str> = line.split_whitespace().collect();
    let at = f.iter().position(|w| *w == "igprof_hot").unwrap();
    // Name, type, address, offset, size.
    let size = u64::from_str_radix(f[at + 4], 16).unwrap();
    eprintln!("igprof_hot: {size} bytes");
    assert!(size > 4096 && size < 64 << 10, "igprof_hot: {size} bytes");
}

/// What `readelf FLAG` prints of the library.
fn readelf_of_lib(flag: &str) -> String {
    let out = std::process::Command::new("readelf")
        .arg(flag)
        .arg(lib())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The size of the library's executable segment in KiB, from its file.
fn library_text_kib() -> u64 {
    let text = readelf_of_lib("-lW");
    let load = text
        .lines()
        .find(|l| l.trim_start().starts_with("LOAD") && l.contains("R E"))
        .expect("an executable segment");
    let memsz = load.split_whitespace().nth(5).unwrap();
    u64::from_str_radix(memsz.trim_start_matches("0x"), 16).unwrap() >> 10
}

/// The numbers `-d` gives on the first line that starts with `prefix` and
/// holds `word`, in order (`final dump: RSS 35.9 -> 39.5 MiB, peak RSS
/// 35.9 -> 39.7 MiB`: 35.9, 39.5, 35.9, 39.7).
fn numbers_after(log: &str, prefix: &str, word: &str) -> Vec<f64> {
    let line = log
        .lines()
        .filter_map(|l| l.strip_prefix("igprof: ")?.strip_prefix(prefix))
        .find(|l| l.contains(word))
        .unwrap_or_else(|| panic!("no line {prefix:?} with {word:?} in\n{log}"));
    line.split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The final dump of a small compiler (GCC's cc1 on a short C file, about
/// 27,000 call-tree nodes under `-mp`) comes at its peak memory: what the
/// dump adds to the peak RSS must stay about what it needs (its region
/// faulted in before it starts: 256 KiB and 128 bytes a node, measured
/// 3.3-3.9 MiB here), not the 6.7-7 MiB it added when the region was
/// faulted in at 256 bytes a node and nothing in it was reused. And the
/// pages of cc1's symbol tables the dump read are given back.
#[test]
fn a_small_compilers_dump_adds_little_to_its_peak() {
    let d = scratch("footprint-dump");
    let cc1 = std::process::Command::new("gcc")
        .arg("-print-prog-name=cc1")
        .output()
        .unwrap();
    let cc1 = String::from_utf8(cc1.stdout).unwrap().trim().to_string();
    std::fs::write(
        d.join("small.c"),
        "typedef unsigned long size_t; void *malloc(size_t); void free(void *);\n\
         int printf(const char *, ...);\n\
         void qsort(void *, size_t, size_t, int (*)(const void *, const void *));\n\
         static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }\n\
         int main(int argc, char **argv) { int n = argc * 1000, *v = malloc(n * sizeof *v), s = 0;\n\
         for (int k = 0; k < n; k++) v[k] = (k * 7919) % 1000;\n\
         qsort(v, n, sizeof *v, cmp); for (int k = 0; k < n; k += 7) s += v[k];\n\
         printf(\"%d\\n\", s); free(v); return 0; }\n",
    )
    .unwrap();
    let out = igprof_command(
        &d,
        &[
            "-d", "-mp", "-o", "cc1.gz", &cc1, "-quiet", "-O2", "small.c", "-o", "small.s",
        ],
    )
    .output()
    .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let nodes = numbers_after(&log, "dump: ", "nodes merged")[0];
    let rss = numbers_after(&log, "final dump: ", "peak RSS");
    let added_mib = rss[3] - rss[2];
    let allowed_mib = 1.5 + nodes * 128.0 / (1 << 20) as f64;
    eprintln!("{nodes} nodes: the dump added {added_mib:.1} MiB to the peak RSS (allowed {allowed_mib:.1})");
    assert!(
        (1_000.0..=50_000.0).contains(&nodes),
        "{nodes} nodes: not a dump from the region"
    );
    assert!(
        added_mib <= allowed_mib,
        "{added_mib} MiB added, {nodes} nodes"
    );
    // cc1 exports its symbols (29,000 in .dynsym): the pages of its
    // tables that the naming read (about 700 KiB) leave the resident set
    // again, found from the tables' spans (output/names.rs).
    let given = numbers_after(&log, "dump: ", "symbol tables read")[0];
    assert!(
        given >= 256.0,
        "{given} KiB of cc1's symbol tables given back"
    );
}

/// A fork child holds its parent's call trees but writes only its own:
/// its dump's memory is sized by its own nodes. Python builds a tree of a
/// few thousand nodes, forks, and the child leaves at once (32 nodes of
/// its own). While the size counted the parent's trees too, the child's
/// dump faulted in a region of 730 KiB ahead ("its region gave 104 KiB
/// for 4758 nodes"); with fewer than 1,000 nodes a dump takes no region.
#[test]
fn a_fork_childs_dump_is_sized_by_its_own_tree() {
    let d = scratch("footprint-fork-child");
    let script = "import os, json\n\
                  data = json.dumps([{'k': i, 'v': [i] * 3} for i in range(20000)])\n\
                  pid = os.fork()\n\
                  if pid == 0:\n    os._exit(0)\n\
                  os.waitpid(pid, 0)\n\
                  print(len(data))\n";
    let out = igprof_command(
        &d,
        &["-d", "-mp", "-o", "py.gz", "/usr/bin/python3", "-c", script],
    )
    .output()
    .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    // Each process logs its region's line (if it took one) before its
    // "nodes merged" line; the child ends before the parent.
    let mut region_nodes = None;
    let mut dumps = Vec::new();
    for line in log.lines().filter_map(|l| l.strip_prefix("igprof: ")) {
        let num = |w: &str| w.parse::<usize>().ok();
        if let Some(rest) = line.strip_prefix("final dump: its region gave ") {
            region_nodes = rest.split_whitespace().nth(3).and_then(num);
            assert!(region_nodes.is_some(), "{line}");
        } else if let Some(rest) = line.strip_prefix("dump: ") {
            if rest.contains("nodes merged") {
                let merged = rest.split_whitespace().next().and_then(num).unwrap();
                dumps.push((merged, region_nodes.take()));
            }
        }
    }
    eprintln!("(nodes merged, nodes the region was sized for) per dump: {dumps:?}");
    assert_eq!(dumps.len(), 2, "{log}");
    let (child, parent) = (dumps[0], dumps[1]);
    assert!(child.0 < 1_000 && parent.0 >= 1_000, "{dumps:?}");
    assert_eq!(child.1, None, "the child's dump took a region: {dumps:?}");
    assert!(parent.1.is_some_and(|n| n >= parent.0), "{dumps:?}");
}

/// The final dump's code is gathered in one section after `.text`
/// (`igprof_dump`: igprof-rs/dump-code.ld, written by
/// scripts/dump-code-order), so that each of the dump's steps faults a few
/// of the kernel's 64 KiB windows of the library back in, not most of its
/// text: `-d` says how much of the library's code and read-only data each
/// step left resident (the pages are given back between the steps).
/// sqlite3 inserting 100,000 rows, the most of the three steps: without
/// the section 1,316-1,380 KiB under `-pp` and 1,380-1,572 under `-mp`,
/// with it 604-732 and 796, the descriptor store empty or kept. When this
/// fails after a change of the dump's code, run scripts/dump-code-order
/// again. And the loaded objects' unwind tables that the run read leave
/// the resident set as the dump starts (it unwinds nothing).
#[test]
fn the_final_dumps_steps_keep_little_code_resident() {
    let d = scratch("footprint-dump-steps");
    let mut sql =
        String::from("create table t(id integer primary key, name text, v real);\nbegin;\n");
    for i in 0..100_000u64 {
        sql.push_str(&format!(
            "insert into t(name, v) values('name {:07}', {i}.5);\n",
            i * 7919 % 100_000
        ));
    }
    sql.push_str("commit;\ncreate index i1 on t(name);\nselect count(*), sum(v) from t;\n");
    std::fs::write(d.join("rows.sql"), sql).unwrap();
    for mode in ["-pp", "-mp"] {
        let out = igprof_command(
            &d,
            &[
                "-d",
                mode,
                "-o",
                "steps.gz",
                "sqlite3",
                ":memory:",
                ".read rows.sql",
            ],
        )
        .output()
        .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        let kib = numbers_after(&log, "final dump: ", "at the end of each step");
        eprintln!("{mode}: the library's pages resident at the end of each step: {kib:?} KiB");
        assert_eq!(kib.len(), 3, "naming, writing, saving descriptors: {kib:?}");
        assert!(
            kib.iter().all(|&k| k <= 1_100.0),
            "{mode}: {kib:?} KiB resident after the dump's steps (at most 1,100)"
        );
        // The unwind tables of libsqlite3 and libc, read while the program
        // ran (about 300 KiB), leave before the dump's memory comes.
        let tables = numbers_after(&log, "final dump: ", "of the loaded objects' unwind tables");
        assert!(
            tables.len() == 1 && tables[0] >= 64.0,
            "{mode}: unwind tables given back: {tables:?} KiB"
        );
    }
}

/// A library the program links but never runs (libm) keeps none of its
/// unwind tables resident under the profiler: the module table reads each
/// new object's `.eh_frame_hdr` header and gives back the pages of its
/// file that read mapped (the kernel maps 64 KiB around a fault), so the
/// program's own check of that page (`/proc/self/pagemap`) at its end says
/// what it says unprofiled. Where the object keeps its unwind tables in an
/// executable segment (Debian's AArch64 libraries), nothing there is given
/// back and only the program's own line is checked.
#[test]
fn a_library_never_unwound_keeps_its_unwind_tables_out() {
    let d = scratch("footprint-unwound");
    let exe = build(
        &d,
        "unwound_objects.c",
        "unwound_objects",
        &["-Wl,--no-as-needed", "-lm"],
    );
    let exe = exe.to_str().unwrap();
    let stdout = |o: std::process::Output| {
        ok(&o);
        String::from_utf8(o.stdout).unwrap()
    };
    let bare = stdout(std::process::Command::new(exe).arg("100").output().unwrap());
    assert!(bare.starts_with("libm eh_frame_hdr: absent"), "{bare}");
    for mode in [&["-pp"][..], &["-mp"], &["-pp", "-mp", "-fd"]] {
        let mut args = mode.to_vec();
        args.extend(["-o", "u.gz", exe, "100"]);
        let out = stdout(igprof(&d, &args));
        if bare.contains("read-only segment") {
            assert_eq!(out, bare, "{mode:?}");
        } else {
            assert!(out.starts_with("libm eh_frame_hdr: "), "{mode:?}: {out}");
        }
    }
}
