//! A run's dumps over time on a hand-made image: three dumps of one
//! process (pid 7, started at 1000 s) written at 1, 2 and 3 s, where
//! `steady` keeps 100 live bytes throughout and `grow_late` allocates its
//! 5000 bytes only between the second and the third. Checks that dumps of
//! one image are not summed, the exact `--timeline` CSV, that `--between`
//! gives exactly `-b`'s report for the dumps it chooses, and the refusals.

mod common;
use common::Dir;

/// One dump of the image: written at `at_s` seconds, with `grow` live
/// bytes in `grow_late` and the timeline note up to then.
fn dump(d: &Dir, at_s: u32, grow: u64) -> String {
    let points = [
        "0,0,100,0",
        "1000,10,200,100",
        "2000,20,-,100",
        "3000,30,400,5100",
    ];
    let note = points[..=at_s as usize].join(" ");
    let name = format!("prog.snap{}", at_s * 1000);
    let text = format!(
        "P=(ID=7 N=(prog [started 1000.000000; dumped {}.000000; \
         timeline 1000 t_ms,cpu_ms,rss_kib,MEM_LIVE.total {note}]) T=0.000000)\n\
         C1 FN0=(F0=(/nonexistent/prog)+16 N=(main))+0\n\
         C2 FN1=(F0+32 N=(steady))+0 V0=(MEM_LIVE):(1,100,100);LK=(0x10,100)\n\
         C2 FN2=(F0+48 N=(grow_late))+0 V0:({},{grow},{grow})\n",
        1000 + at_s,
        u64::from(grow > 0),
    );
    std::fs::write(d.file(&name), text).unwrap();
    name
}

/// The image's three dumps, oldest first.
fn image(d: &Dir) -> [String; 3] {
    [dump(d, 1, 0), dump(d, 2, 0), dump(d, 3, 5000)]
}

impl Dir {
    /// stdout of a run that must succeed (what `common` expects of a test).
    fn ok(&self, args: &[&str]) -> String {
        ok(self, args).0
    }
}

/// (stdout, stderr) of a run that must succeed.
fn ok(d: &Dir, args: &[&str]) -> (String, String) {
    let (out, err, ok) = d.run(args);
    assert!(ok, "igprof-analyse {args:?} failed: {err}");
    (out, err)
}

fn fails(d: &Dir, args: &[&str]) -> String {
    let (out, err, ok) = d.run(args);
    assert!(!ok, "igprof-analyse {args:?} should fail, printed {out}");
    assert_eq!(err.lines().count(), 1, "one-line error expected: {err}");
    err
}

#[test]
fn dumps_of_one_image_are_not_summed() {
    let d = Dir::new();
    let [a, b, c] = image(&d);
    let (newest, _) = ok(&d, &["-r", "MEM_LIVE", &c]);
    let (all, _) = ok(&d, &["-r", "MEM_LIVE", &a, &b, &c]);
    assert_eq!(all, newest, "the three dumps must read as the newest alone");
    assert!(
        newest.contains("5'100") && !newest.contains("5'300"),
        "{newest}"
    );
    // In any order.
    let (shuffled, _) = ok(&d, &["-r", "MEM_LIVE", &c, &a, &b]);
    assert_eq!(shuffled, newest);
}

#[test]
fn timeline_csv_is_exact() {
    let d = Dir::new();
    let [a, b, c] = image(&d);
    let (csv, _) = ok(&d, &["--timeline", "-", &a, &b, &c]);
    assert_eq!(
        csv,
        "t_s,cpu_s,rss_bytes,MEM_LIVE.total,live:grow_late,live:steady\n\
         0.000,0.000,102400,0,,\n\
         1.000,0.010,204800,100,0,100\n\
         2.000,0.020,,100,0,100\n\
         3.000,0.030,409600,5100,5000,100\n"
    );
    // One dump: the note alone, no live columns.
    let (one, _) = ok(&d, &["--timeline", "-", &c]);
    assert_eq!(
        one,
        "t_s,cpu_s,rss_bytes,MEM_LIVE.total\n\
         0.000,0.000,102400,0\n\
         1.000,0.010,204800,100\n\
         2.000,0.020,,100\n\
         3.000,0.030,409600,5100\n"
    );
}

#[test]
fn between_is_exactly_the_baseline_report_of_the_chosen_dumps() {
    let d = Dir::new();
    let [a, b, c] = image(&d);
    for args in [
        vec!["-r", "MEM_LIVE"],
        vec!["-r", "MEM_LIVE", "--folded", "-"],
    ] {
        // 2.5 s: the dump at 2 s; 3 s: the dump at 3 s (at or before).
        let mut between = args.clone();
        between.extend(["--between", "2.5", "3", &a, &b, &c]);
        let (out, err) = ok(&d, &between);
        let mut baseline = args.clone();
        baseline.extend(["-b", &b, &c]);
        let (expected, _) = ok(&d, &baseline);
        assert_eq!(out, expected, "--between 2.5 3 against -b {b} {c}");
        assert!(out.contains("grow_late"), "{out}");
        assert!(
            err.contains(&b) && err.contains(&c) && !err.contains(&a),
            "{err}"
        );
    }
    // Between the first two dumps nothing grew: grow_late is not in the diff.
    let (early, _) = ok(&d, &["-r", "MEM_LIVE", "--between", "1", "2", &a, &b, &c]);
    let (expected, _) = ok(&d, &["-r", "MEM_LIVE", "-b", &a, &b]);
    assert_eq!(early, expected);
}

#[test]
fn timeline_and_between_refusals_are_one_line() {
    let d = Dir::new();
    let [a, b, c] = image(&d);
    let e = fails(&d, &["--between", "3", "2", &a, &b, &c]);
    assert!(e.contains("before") || e.contains(">="), "{e}");
    let e = fails(&d, &["--between", "0.1", "0.5", &a, &b, &c]);
    assert!(e.contains("0.5"), "{e}");
    let e = fails(&d, &["--between", "1", "2", "-b", &a, &b, &c]);
    assert!(e.contains("-b"), "{e}");
    // A dump of another process is not part of the image.
    let other = std::fs::read_to_string(d.file(&a))
        .unwrap()
        .replace("ID=7", "ID=8");
    std::fs::write(d.file("other"), other).unwrap();
    fails(&d, &["--between", "1", "3", &b, &c, "other"]);
    // No timeline note and a single dump: say how to get one.
    let plain = "P=(ID=9 N=(prog) T=0.000000)\n\
        C1 FN0=(F0=(/nonexistent/prog)+16 N=(main))+0 V0=(MEM_LIVE):(1,1,1)\n";
    std::fs::write(d.file("plain"), plain).unwrap();
    let e = fails(&d, &["--timeline", "-", "plain"]);
    assert!(
        e.contains("--sample-every") && e.contains("--dump-every"),
        "{e}"
    );
}
