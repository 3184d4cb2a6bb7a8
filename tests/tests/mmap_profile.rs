//! End-to-end checks of the mapping profiler (-mm): exact MMAP_TOTAL and
//! MMAP_LIVE per mapping function of tests/programs/mmap_sites.c (partial
//! unmaps of a head, a tail and a middle, an unmap across two mappings,
//! MAP_FIXED over live mappings, a file mapping, mremap growing, moving
//! and shrinking, threads), the `<allocator mmap>` leaf of malloc's own
//! mapping, the program's output and status, -mp's profile with and
//! without -mm, and the AArch64 build under qemu.

use std::path::{Path, PathBuf};
use std::process::Output;

mod mem_support;
use mem_support::*;

/// The program's unit of mapping: 64 KiB.
const U: u64 = 64 << 10;

/// (calls or ranges, bytes) of a counter at one site.
type Count = (u64, u64);

/// (site, MMAP_TOTAL (calls, bytes), MMAP_LIVE (ranges, bytes) at exit).
const WANT: [(&str, Count, Count); 19] = [
    ("m_keep", (1, 3 * U), (1, 3 * U)),
    ("m_freed", (1, 2 * U), (0, 0)),
    ("m_head", (1, 4 * U), (1, 3 * U)),
    ("m_tail", (1, 4 * U), (1, 3 * U)),
    ("m_hole", (1, 5 * U), (2, 4 * U)),
    ("m_reserve", (1, 6 * U), (0, 0)),
    ("m_span_a", (1, 3 * U), (1, U)),
    ("m_span_b", (1, 3 * U), (1, U)),
    ("m_file", (0, 0), (0, 0)),
    ("m_under_file", (1, 4 * U), (2, 3 * U)),
    ("m_grow", (1, U), (0, 0)),
    ("m_grow_call", (1, 4 * U), (1, 4 * U)),
    ("m_move", (1, 2 * U), (0, 0)),
    ("m_move_call", (1, 2 * U), (1, 2 * U)),
    ("m_target", (1, 4 * U), (2, 2 * U)),
    ("m_shrink", (1, 4 * U), (0, 0)),
    ("m_shrink_call", (1, U), (1, U)),
    ("m_refused", (0, 0), (0, 0)),
    // 4 threads map 8 units each and unmap every other one.
    ("t_map", (32, 32 * U), (16, 16 * U)),
];

/// Runs mmap_sites (built for the host, or for the other architecture)
/// under igprof with `opts` into `prof.gz`, and unprofiled; checks that
/// the program's output and status are its own.
fn run_sites(name: &str, foreign: bool, opts: &[&str]) -> (PathBuf, Profile) {
    let d = scratch(name);
    if foreign {
        cross_build(&d, "mmap_sites.c", "mmap_sites", &[]);
    } else {
        build(&d, "mmap_sites.c", "mmap_sites", &[]);
    }
    let mut a: Vec<&str> = opts.to_vec();
    a.extend(["-o", "prof.gz", "./mmap_sites"]);
    let (plain, o): (Output, Output) = if foreign {
        (
            foreign_igprof(&d, &["-o", "none.gz", "./mmap_sites"]),
            foreign_igprof(&d, &a),
        )
    } else {
        (
            std::process::Command::new(d.join("mmap_sites"))
                .output()
                .unwrap(),
            igprof(&d, &a),
        )
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(plain.status.code(), Some(3), "unprofiled: {plain:?}");
    assert_eq!(o.status.code(), Some(3), "the program's status: {err}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "the program's output"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("touched 7 units"),
        "{err}"
    );
    let p = load(&d.join("prof.gz"));
    if opts.contains(&"-mm") {
        check_dontunmap(&String::from_utf8_lossy(&o.stdout), &p);
    }
    (d, p)
}

/// MREMAP_DONTUNMAP: the new range is the caller's, the old one stays
/// where it was (when the kernel or emulator did it).
fn check_dontunmap(out: &str, p: &Profile) {
    let total = sites(p, "MMAP_TOTAL");
    let live = sites(p, "MMAP_LIVE");
    let kept = site(&live, "m_kept");
    assert_eq!(site(&total, "m_kept").bytes, 2 * U);
    assert_eq!((kept.calls, kept.bytes), (1, 2 * U), "m_kept stays mapped");
    let call = (
        site(&live, "m_dontunmap_call").calls,
        site(&live, "m_dontunmap_call").bytes,
    );
    if out.contains("dontunmap yes") {
        assert_eq!(call, (1, 2 * U), "the moved pages");
    } else {
        assert!(out.contains("dontunmap no"), "{out}");
        assert_eq!(call, (0, 0), "refused: nothing moved");
    }
}

/// Checks every site of [`WANT`], the LK records, and malloc's mapping.
fn check_sites(p: &Profile) {
    let total = sites(p, "MMAP_TOTAL");
    let live = sites(p, "MMAP_LIVE");
    for (f, (calls, bytes), (ranges, left)) in WANT {
        let t = site(&total, f);
        assert_eq!((t.calls, t.bytes), (calls, bytes), "{f} MMAP_TOTAL");
        let l = site(&live, f);
        assert_eq!((l.calls, l.bytes), (ranges, left), "{f} MMAP_LIVE at exit");
        assert_eq!(l.leaks.len() as u64, ranges, "{f}: one LK per live range");
        assert_eq!(
            l.leaks.iter().map(|k| k.1).sum::<u64>(),
            left,
            "{f}: LK sizes add up to MMAP_LIVE"
        );
    }
    // The one-unit PROT_NONE block main maps in the way of m_refused's
    // growth, then unmaps.
    let m = site(&total, "main");
    assert_eq!((m.calls, m.bytes), (1, U), "main MMAP_TOTAL");
    assert_eq!(site(&live, "main").bytes, 0);

    // malloc(1 MiB) is mmapped by glibc: charged below the allocating
    // stack, as the allocator's, and unmapped by free.
    let a = site(&total, "<allocator mmap>");
    assert_eq!(a.calls, 1, "{total:?}");
    assert!(
        a.bytes > 1 << 20 && a.bytes <= (1 << 20) + U,
        "1 MiB and its header, rounded to the page: {}",
        a.bytes
    );
    assert_eq!(site(&live, "<allocator mmap>").bytes, 0, "freed");
    let mut namer = Namer::new();
    let leaf = (0..p.nodes.len())
        .find(|&i| namer.name(p, i) == "<allocator mmap>")
        .unwrap();
    let mut up = Vec::new();
    let mut i = p.nodes[leaf].parent;
    while let Some(n) = i {
        up.push(namer.name(p, n));
        i = p.nodes[n].parent;
    }
    assert!(
        up.iter().any(|n| n == "m_malloc"),
        "under the allocating stack: {up:?}"
    );
}

/// igprof-analyse's flat profile of `counter`: self value per function.
fn flat(d: &Path, counter: &str) -> Vec<(String, u64)> {
    let o = std::process::Command::new(analyser())
        .args(["-r", counter, "prof.gz"])
        .current_dir(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{text}");
    let start = text.find("Flat profile (self").expect("a flat profile");
    text[start..]
        .lines()
        .skip(3)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let _pct = w.next()?;
            let v = w.next()?.replace('\'', "").parse().ok()?;
            let name: Vec<&str> = w.collect();
            let name = name.join(" ");
            let name = name.rsplit_once(" [").map_or(name.as_str(), |x| x.0);
            Some((name.to_string(), v))
        })
        .collect()
}

#[test]
fn mapping_sites_are_exact() {
    let (d, p) = run_sites("mmapsites", false, &["-mm"]);
    check_sites(&p);
    // The analyser reads the new counters as any other.
    let live = flat(&d, "MMAP_LIVE");
    for (f, _, (_, left)) in WANT.iter().filter(|w| w.2 .1 > 0) {
        assert!(
            live.contains(&(f.to_string(), *left)),
            "{f}: {left} in igprof-analyse -r MMAP_LIVE: {live:?}"
        );
    }
    let total = flat(&d, "MMAP_TOTAL");
    assert!(
        total
            .iter()
            .any(|(f, v)| f == "<allocator mmap>" && *v > 1 << 20),
        "{total:?}"
    );
}

/// -mm beside -pp, -mp and -fd: its counts are the same, and -mp's
/// profile is the one -mp writes alone.
#[test]
fn beside_the_other_profilers() {
    let (_d, alone) = run_sites("mmapmp", false, &["-mp"]);
    let (_d2, both) = run_sites("mmapall", false, &["-pp", "-mp", "-fd", "-mm"]);
    check_sites(&both);
    // Addresses differ from run to run; the rest is the same.
    type Counts = Vec<(String, u64, u64, u64, Vec<u64>)>;
    let counts = |p: &Profile, c: &str| -> Counts {
        sites(p, c)
            .into_iter()
            .map(|(f, s)| {
                let mut sizes: Vec<u64> = s.leaks.iter().map(|l| l.1).collect();
                sizes.sort_unstable();
                (f, s.calls, s.bytes, s.peak, sizes)
            })
            .collect()
    };
    for c in ["MEM_TOTAL", "MEM_LIVE"] {
        assert_eq!(
            counts(&both, c),
            counts(&alone, c),
            "{c} with and without -mm"
        );
    }
    assert!(
        sites(&alone, "MMAP_TOTAL").is_empty(),
        "-mm only when asked"
    );
}

/// Signal handlers that map and unmap while the interrupted thread is
/// inside the profiler's hooks: their events are recorded late, and none
/// is lost.
#[test]
fn mappings_from_signal_handlers() {
    let d = scratch("mmapsignal");
    build(&d, "mmap_sites.c", "mmap_sites", &[]);
    let o = igprof(
        &d,
        &["-mm", "-o", "prof.gz", "./mmap_sites", "signal", "2000"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{out} {err}");
    let mut w = out.split_whitespace();
    let (h, n): (u64, u64) = match (w.next(), w.next(), w.next(), w.next()) {
        (Some("signals"), Some(h), Some("loops"), Some(n)) => {
            (h.parse().unwrap(), n.parse().unwrap())
        }
        _ => panic!("{out}"),
    };
    assert_eq!(h, 2000, "{out}");
    let p = load(&d.join("prof.gz"));
    let total = sites(&p, "MMAP_TOTAL");
    let live = sites(&p, "MMAP_LIVE");
    // A handler that ran while its thread walked its stack (on the
    // profiler's walk stack) is deferred with the stack walked from the
    // walk stack back to the program's: rarely, one that cannot be walked
    // is counted under the truncation marker. None is lost.
    let t = site(&total, "h_sig");
    let cut = site(&total, "@igprof_stack_truncated");
    assert_eq!(
        (t.calls + cut.calls, t.bytes + cut.bytes),
        (h, h * U),
        "every handler mapping in MMAP_TOTAL"
    );
    assert!(t.calls > h / 2, "most with their stack: {t:?}");
    let l = site(&live, "h_sig");
    let lcut = site(&live, "@igprof_stack_truncated");
    assert_eq!(
        (l.calls + lcut.calls, l.bytes + lcut.bytes),
        (1, U),
        "the last handler's unit is live"
    );
    let t = site(&total, "s_loop");
    assert_eq!((t.calls, t.bytes), (n, n * U), "s_loop MMAP_TOTAL");
    let l = site(&live, "s_loop");
    assert_eq!((l.calls, l.bytes), (0, 0), "s_loop MMAP_LIVE");
}

#[test]
fn the_other_architecture_under_qemu() {
    let (_d, p) = run_sites("mmapforeign", true, &["-mm"]);
    check_sites(&p);
}
