//! End-to-end check of -np: a fake powercap source whose counter advances
//! with wall time (rewritten in place by a test thread, as the kernel's
//! counter would move), read through the same code as real RAPL files.

use igprof_tests::*;
use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn two_threads_burning_3_to_1_get_energy_3_to_1_with_pp_and_mp() {
    let d = scratch("energy");
    build(&d, "energy2.c", "energy2", &[]);
    energy_3_to_1(&d, || {
        let mut c = std::process::Command::new(launcher());
        c.current_dir(&d).env("IGPROF_LIB", lib());
        c
    });
}

/// The same run for the program built for the other architecture, under
/// qemu-user with the library built for it.
#[test]
fn energy_of_a_program_of_another_architecture() {
    let d = scratch("energy_foreign");
    cross_build(&d, "energy2.c", "energy2", &[]);
    energy_3_to_1(&d, || foreign_igprof_command(&d, &[]));
}

/// Runs `energy2 200` in `d` through the launcher command `igprof()` makes, under
/// -np -pp -mp with a fake powercap counter of 20 W, and checks that the
/// thread burning three times as much gets three times the energy.
///
/// The check holds only while the fake counter moves with wall time, as a
/// hardware counter does. Its writer runs at a real-time priority (root
/// only) on tmpfs, so that neither the scheduler nor a disk flush stops it;
/// it measures its own largest pause. A run in which that pause exceeded
/// 5 ms did not test the profiler (the energy of the pause lands in one
/// interval, on whichever thread ran in it) and is made again, four times
/// at most, half a second apart (a CI run met three such pauses of
/// 16-22 ms in a row: hypervisor steal, which stops a real-time thread
/// too, comes in bursts); the assertion names the pause.
fn energy_3_to_1(d: &std::path::Path, igprof: impl Fn() -> std::process::Command) {
    const STALL: std::time::Duration = std::time::Duration::from_millis(5);
    const ATTEMPTS: u32 = 5;
    let name = format!(
        "igprof-tests-{}-{}-fakeroot",
        std::process::id(),
        d.file_name().unwrap().to_string_lossy()
    );
    // The scratch directory where /dev/shm cannot be written.
    let shm = std::path::Path::new("/dev/shm").join(&name);
    let root = if std::fs::create_dir_all(&shm).is_ok() {
        shm
    } else {
        d.join(&name)
    };
    for attempt in 1..=ATTEMPTS {
        let (o, pause) = run_with_fake_counter(&root, igprof());
        let err = ok(&o);
        assert!(err.contains("energy"), "the start-up line names -np: {err}");
        let text = read_text(&d.join("nrg.gz"));
        // -np, -pp and -mp together: each module's counters in the one
        // profile (printf's stdout buffer is at least one malloc).
        for counter in ["(NRG_PKG)", "(PERF_TICKS)", "(MEM_TOTAL)", "(MEM_LIVE)"] {
            assert!(text.contains(counter), "{counter} missing from the profile");
        }
        let p = parse_strict(&text).unwrap();
        let big = under(&p, "NRG_PKG", "big_burner").1 as f64;
        let small = under(&p, "NRG_PKG", "small_burner").1 as f64;
        assert!(
            small > 0.0 && big > 0.0,
            "both threads charged: big {big} small {small}"
        );
        // The energy nobody is charged with is in the profile too.
        assert!(p.funcs.values().any(|f| f.name == "<unattributed>"));
        let ratio = big / small;
        if (ratio / 3.0 - 1.0).abs() <= 0.05 {
            break;
        }
        assert!(
            pause > STALL && attempt < ATTEMPTS,
            "energy ratio {ratio:.3} (want 3 +-5%); the fake counter's longest pause \
             was {pause:?}, attempt {attempt}"
        );
        eprintln!("energy ratio {ratio:.3} after a {pause:?} pause of the fake counter: again");
        // A pause that long is the hypervisor's (a real-time thread):
        // its steal comes in bursts, which a moment's wait may leave.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Lays out a fake powercap zone under `root`, runs `igprof` on `energy2`
/// while a thread advances the zone's counter by 20 uJ per microsecond of
/// wall time, and returns the run's output and the writer's longest pause
/// between two writes.
fn run_with_fake_counter(
    root: &std::path::Path,
    mut igprof: std::process::Command,
) -> (std::process::Output, std::time::Duration) {
    let _ = std::fs::remove_dir_all(root);
    let zone = root.join("sys/class/powercap/intel-rapl:0");
    std::fs::create_dir_all(&zone).unwrap();
    std::fs::create_dir_all(root.join("sys/devices/system/cpu")).unwrap();
    std::fs::write(root.join("sys/devices/system/cpu/online"), "0-1\n").unwrap();
    std::fs::write(zone.join("name"), "package-0\n").unwrap();
    std::fs::write(zone.join("max_energy_range_uj"), "262143328850\n").unwrap();
    std::fs::write(zone.join("energy_uj"), format!("{:020}\n", 0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let path = zone.join("energy_uj");
        std::thread::spawn(move || {
            let param = libc::sched_param { sched_priority: 10 };
            // SAFETY: plain call on the calling thread.
            unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
            let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            let t0 = std::time::Instant::now();
            let mut last = t0;
            let mut pause = std::time::Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let now = std::time::Instant::now();
                pause = pause.max(now - last);
                last = now;
                let uj = (now - t0).as_micros() as u64 * 20;
                f.seek(SeekFrom::Start(0)).unwrap();
                f.write_all(format!("{uj:020}\n").as_bytes()).unwrap();
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            pause
        })
    };
    let o = igprof
        .args([
            "-np",
            "-pp",
            "-mp",
            "-i",
            "1ms",
            "-o",
            "nrg.gz",
            "./energy2",
            "200",
        ])
        .env("IGPROF_ENERGY_ROOT", root)
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    (o, writer.join().unwrap())
}
