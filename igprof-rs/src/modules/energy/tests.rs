//! Detection and reading through fake power PMU, powercap and msr trees
//! built under a temporary root, with scripted counter progressions.

use super::pmu::FilePerf;
use super::*;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A fake root directory, removed on drop.
struct Tree {
    dir: PathBuf,
}

impl Tree {
    fn new(name: &str) -> Tree {
        let dir = std::env::temp_dir().join(format!("igprof-energy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Tree { dir }
    }
    fn root(&self) -> Root {
        Root::at(&self.dir)
    }
    fn path(&self, kernel_path: &str) -> PathBuf {
        self.root().join(kernel_path)
    }
    fn write(&self, kernel_path: &str, content: &str) {
        let p = self.path(kernel_path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    /// 8 native-endian bytes at `offset` (a fake perf count at 0).
    fn write_u64_at(&self, kernel_path: &str, offset: u64, v: u64) {
        let p = self.path(kernel_path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(p)
            .unwrap();
        f.write_all_at(&v.to_ne_bytes(), offset).unwrap();
    }
    /// MSR `reg` of a fake msr device (a regular file: register R at 8 x R).
    fn msr(&self, cpu: u32, reg: u64, v: u64) {
        self.write_u64_at(&format!("/dev/cpu/{cpu}/msr"), reg * 8, v);
    }
    fn perf_count(&self, event: &str, cpu: u32, v: u64) {
        let p = FilePerf::path(&self.root(), event, cpu);
        let rel = p
            .strip_prefix(&self.dir)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        self.write_u64_at(&format!("/{rel}"), 0, v);
    }

    fn power_pmu(&self, cpumask: &str, events: &[(&str, &str, &str)]) {
        let d = "/sys/bus/event_source/devices/power";
        self.write(&format!("{d}/type"), "23\n");
        self.write(&format!("{d}/cpumask"), &format!("{cpumask}\n"));
        for (name, config, scale) in events {
            self.write(&format!("{d}/events/{name}"), &format!("{config}\n"));
            self.write(&format!("{d}/events/{name}.scale"), &format!("{scale}\n"));
            self.write(&format!("{d}/events/{name}.unit"), "Joules\n");
        }
    }

    fn zone(&self, zone: &str, name: &str, energy_uj: u64, max: u64) {
        let d = format!("/sys/class/powercap/{zone}");
        self.write(&format!("{d}/name"), &format!("{name}\n"));
        self.write(&format!("{d}/energy_uj"), &format!("{energy_uj}\n"));
        self.write(&format!("{d}/max_energy_range_uj"), &format!("{max}\n"));
    }
    fn energy_uj(&self, zone: &str, v: u64) {
        self.write(
            &format!("/sys/class/powercap/{zone}/energy_uj"),
            &format!("{v}\n"),
        );
    }

    fn cpus(&self, topology: &[(u32, u32, u32)]) {
        let online: Vec<String> = topology.iter().map(|t| t.0.to_string()).collect();
        self.write("/sys/devices/system/cpu/online", &online.join(","));
        for &(cpu, pkg, core) in topology {
            let d = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            self.write(&format!("{d}/physical_package_id"), &pkg.to_string());
            self.write(&format!("{d}/core_id"), &core.to_string());
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Real opens, except paths containing one of `deny` fail with `errno`
/// (tests run as root, where chmod 000 does not stop anything).
struct DenyFs {
    deny: &'static [&'static str],
    errno: i32,
}

impl Fs for DenyFs {
    fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        if self.deny.iter().any(|d| path.to_str().unwrap().contains(d)) {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        RealFs.open(path)
    }
}

/// [`detect_with`] opening files and fake perf counters through `fs`.
fn detect_through(root: &Root, fs: &dyn Fs) -> Result<EnergyMeter, NoSource> {
    detect_with(root, fs, &FilePerf { root, fs })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-6)
}

const SCALE_2_32: &str = "2.3283064365386962890625e-10";

#[test]
fn power_pmu_wins_and_scales_counts_to_joules() {
    let t = Tree::new("pmu");
    t.power_pmu(
        "0,2",
        &[
            ("energy-pkg", "event=0x02", SCALE_2_32),
            ("energy-ram", "event=0x03", SCALE_2_32),
        ],
    );
    // energy-psys exists but feeds no counter.
    t.write(
        "/sys/bus/event_source/devices/power/events/energy-psys",
        "event=0x05",
    );
    // powercap also present: the PMU must still be chosen.
    t.zone("intel-rapl:0", "package-0", 0, 1 << 40);
    for cpu in [0, 2] {
        t.perf_count("energy-pkg", cpu, 1000);
        t.perf_count("energy-ram", cpu, 0);
    }
    let mut m = detect(&t.root()).unwrap();
    assert_eq!(m.source(), SourceKind::PowerPmu);
    assert_eq!(
        m.domains().collect::<Vec<_>>(),
        vec![Domain::Pkg, Domain::Dram]
    );
    assert_eq!(m.counter_count(), 4);
    // Package 0 advances 2^32 counts (1 J), package 1 (cpu 2) 3 x 2^32.
    t.perf_count("energy-pkg", 0, 1000 + (1 << 32));
    t.perf_count("energy-pkg", 2, 1000 + 3 * (1 << 32));
    t.perf_count("energy-ram", 0, 1 << 31);
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    assert_eq!(e, [4.0, 0.0, 0.0, 0.5]);
    m.read_deltas(&mut e).unwrap();
    assert_eq!(e, [0.0; DOMAINS]);
}

#[test]
fn amd_power_core_pmu_adds_per_core_pp0() {
    let t = Tree::new("pmu-amd");
    t.power_pmu("0", &[("energy-pkg", "event=0x02", SCALE_2_32)]);
    let d = "/sys/bus/event_source/devices/power_core";
    t.write(&format!("{d}/type"), "24\n");
    t.write(&format!("{d}/cpumask"), "0-1\n");
    t.write(&format!("{d}/events/energy-core"), "event=0x01\n");
    t.write(
        &format!("{d}/events/energy-core.scale"),
        &format!("{SCALE_2_32}\n"),
    );
    t.write(&format!("{d}/events/energy-core.unit"), "Joules\n");
    t.perf_count("energy-pkg", 0, 0);
    t.perf_count("energy-core", 0, 0);
    t.perf_count("energy-core", 1, 0);
    let mut m = detect(&t.root()).unwrap();
    assert_eq!(
        m.domains().collect::<Vec<_>>(),
        vec![Domain::Pkg, Domain::Pp0]
    );
    assert_eq!(m.counter_count(), 3);
    t.perf_count("energy-pkg", 0, 5 << 32);
    t.perf_count("energy-core", 0, 1 << 32);
    t.perf_count("energy-core", 1, 2 << 32);
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    assert_eq!(e, [5.0, 3.0, 0.0, 0.0]);
    // An unopenable power_core is skipped: the package alone still works.
    std::fs::remove_file(t.path("/perf-fake/energy-core/cpu1")).unwrap();
    let m = detect(&t.root()).unwrap();
    assert_eq!(m.domains().collect::<Vec<_>>(), vec![Domain::Pkg]);
}

#[test]
fn power_pmu_units_and_bad_files() {
    let t = Tree::new("pmu-units");
    t.power_pmu("0", &[("energy-cores", "event=0x01", "6.103515625e-5")]);
    let info = pmu::parse(&t.root(), &RealFs).unwrap();
    assert_eq!(info.pmu_type, 23);
    assert_eq!(info.cpus, vec![0]);
    assert_eq!(info.events.len(), 1);
    assert_eq!(info.events[0].domain, Domain::Pp0);
    assert_eq!(info.events[0].config, 1);
    assert_eq!(info.events[0].scale, 1.0 / 16384.0);
    // Wrong unit, bad scale, no events: typed errors naming the file.
    t.write(
        "/sys/bus/event_source/devices/power/events/energy-cores.unit",
        "Watts",
    );
    let e = pmu::parse(&t.root(), &RealFs).unwrap_err();
    assert!(
        matches!(
            &e,
            SourceError::Malformed {
                expected: "Joules",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("energy-cores.unit"));
    t.write(
        "/sys/bus/event_source/devices/power/events/energy-cores.unit",
        "Joules",
    );
    t.write(
        "/sys/bus/event_source/devices/power/events/energy-cores.scale",
        "-1",
    );
    assert!(matches!(
        pmu::parse(&t.root(), &RealFs),
        Err(SourceError::Malformed { .. })
    ));
    std::fs::remove_dir_all(t.path("/sys/bus/event_source/devices/power/events")).unwrap();
    std::fs::create_dir_all(t.path("/sys/bus/event_source/devices/power/events")).unwrap();
    assert!(matches!(
        pmu::parse(&t.root(), &RealFs),
        Err(SourceError::NoDomains { .. })
    ));
}

#[test]
fn perf_refusal_names_the_paranoid_level_and_falls_through_to_powercap() {
    let t = Tree::new("paranoid");
    t.power_pmu("0", &[("energy-pkg", "event=0x02", SCALE_2_32)]);
    t.perf_count("energy-pkg", 0, 0);
    t.write("/proc/sys/kernel/perf_event_paranoid", "2\n");
    t.zone("intel-rapl:0", "package-0", 5_000_000, 262_143_328_850);
    let root = t.root();
    let fs = DenyFs {
        deny: &["perf-fake"],
        errno: libc::EACCES,
    };
    let m = detect_through(&root, &fs).unwrap();
    assert_eq!(m.source(), SourceKind::Powercap);
    // With powercap gone too, the whole message shows the refusal.
    std::fs::remove_dir_all(t.path("/sys/class/powercap")).unwrap();
    let err = detect_through(&root, &fs).unwrap_err();
    assert!(matches!(
        err.tried[0],
        (
            SourceKind::PowerPmu,
            SourceError::PerfRefused {
                paranoid: Some(2),
                ..
            }
        )
    ));
    let line = err.to_string();
    assert!(
        line.contains("power PMU: perf_event_open(power/energy-pkg/) refused"),
        "{line}"
    );
    assert!(line.contains("perf_event_paranoid=2"), "{line}");
    assert!(
        line.contains("sysctl kernel.perf_event_paranoid=0"),
        "{line}"
    );
    assert!(!line.contains('\n'));
}

#[test]
fn powercap_zones_domains_and_wrap_around() {
    let t = Tree::new("powercap");
    let max = 262_143_328_850;
    t.zone("intel-rapl:0", "package-0", max - 1_000_000, max);
    t.zone("intel-rapl:0:0", "core", 100, max);
    t.zone("intel-rapl:0:1", "uncore", 100, max);
    t.zone("intel-rapl:0:2", "dram", 100, max);
    t.zone("intel-rapl:1", "package-1", 0, max);
    t.zone("intel-rapl:2", "psys", 0, max); // platform: skipped
    t.write("/sys/class/powercap/intel-rapl/enabled", "1"); // control type: skipped
                                                            // A readable msr device too: powercap comes first and must win.
    t.write("/proc/cpuinfo", &intel_cpuinfo(0x9E));
    t.cpus(&[(0, 0, 0)]);
    t.msr(0, msr::INTEL_UNIT, 0xA0E03);
    t.msr(0, msr::INTEL_PKG, 0);
    assert_eq!(msr::open(&t.root(), &RealFs).map(|c| c.len()), Ok(1));
    let mut m = detect(&t.root()).unwrap();
    assert_eq!(m.source(), SourceKind::Powercap);
    assert_eq!(m.counter_count(), 5);
    assert!(Domain::ALL.iter().all(|&d| m.has(d)));
    // Package 0 wraps: max-1 J -> max -> 2 J: 3 J. Package 1: 1.5 J.
    t.energy_uj("intel-rapl:0", 2_000_000);
    t.energy_uj("intel-rapl:1", 1_500_000);
    t.energy_uj("intel-rapl:0:0", 600_100);
    t.energy_uj("intel-rapl:0:2", 250_100);
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    assert!(close(e[0], 4.5), "{e:?}");
    assert!(close(e[1], 0.6));
    assert_eq!(e[2], 0.0);
    assert!(close(e[3], 0.25));
}

#[test]
fn powercap_amd_package_only_and_bad_read_keeps_energy() {
    let t = Tree::new("powercap-amd");
    t.zone("intel-rapl:0", "package-0", 1000, 65_532_610_987);
    let mut m = detect(&t.root()).unwrap();
    assert_eq!(m.domains().collect::<Vec<_>>(), vec![Domain::Pkg]);
    t.write("/sys/class/powercap/intel-rapl:0/energy_uj", "garbage\n");
    let mut e = [0.0; DOMAINS];
    assert_eq!(m.read_deltas(&mut e), Err(ReadError::NotANumber));
    assert_eq!(e, [0.0; DOMAINS]);
    t.energy_uj("intel-rapl:0", 3000);
    m.read_deltas(&mut e).unwrap();
    assert!(
        close(e[0], 2000e-6),
        "energy across the failed read must not be lost: {e:?}"
    );
}

#[test]
fn powercap_permission_denied_is_reported_with_advice() {
    let t = Tree::new("powercap-perm");
    t.zone("intel-rapl:0", "package-0", 1000, 1 << 30);
    t.zone("intel-rapl:0:0", "core", 1000, 1 << 30);
    let root = t.root();
    let fs = DenyFs {
        deny: &["energy_uj"],
        errno: libc::EACCES,
    };
    let err = detect_through(&root, &fs).unwrap_err();
    let kinds: Vec<SourceKind> = err.tried.iter().map(|t| t.0).collect();
    assert_eq!(
        kinds,
        vec![SourceKind::PowerPmu, SourceKind::Powercap, SourceKind::Msr]
    );
    assert!(
        matches!(&err.tried[1].1, SourceError::PermissionDenied { path } if path.ends_with("intel-rapl:0/energy_uj"))
    );
    let line = err.to_string();
    assert!(
        line.contains("powercap: ") && line.contains("energy_uj permission denied"),
        "{line}"
    );
    assert!(line.contains("root-only since Linux 5.10"), "{line}");
}

fn intel_cpuinfo(model: u32) -> String {
    format!("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: {model}\nflags\t\t: fpu msr\n\n")
}

#[test]
fn msr_intel_server_two_packages_32bit_wrap_and_dram_quirk() {
    let t = Tree::new("msr-intel");
    t.write("/proc/cpuinfo", &intel_cpuinfo(0x55)); // Skylake-X
    t.cpus(&[(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
    for cpu in [0, 2] {
        t.msr(cpu, msr::INTEL_UNIT, 0xA0E03); // 2^-14 J
        t.msr(cpu, msr::INTEL_PKG, 0xFFFF_F000);
        t.msr(cpu, msr::INTEL_DRAM, 0);
        t.msr(cpu, msr::INTEL_PP0, 0);
        // PP1 (0x641) lies beyond the end of the file: absent, as on servers.
    }
    let mut m = detect(&t.root()).unwrap();
    assert_eq!(m.source(), SourceKind::Msr);
    assert_eq!(
        m.domains().collect::<Vec<_>>(),
        vec![Domain::Pkg, Domain::Pp0, Domain::Dram]
    );
    assert_eq!(m.counter_count(), 6);
    // Package counter wraps at 32 bits: 0xFFFFF000 -> 0x1000 is 0x2000 counts.
    t.msr(0, msr::INTEL_PKG, 0x1000);
    t.msr(2, msr::INTEL_PKG, 0x1_FFFF_F000 + 16384); // upper bits ignored
    t.msr(0, msr::INTEL_DRAM, 65536);
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    assert!(close(e[0], 0x2000 as f64 / 16384.0 + 1.0), "{e:?}");
    // DRAM in fixed 2^-16 J units on this model, not the 2^-14 of 0x606.
    assert!(close(e[3], 1.0), "{e:?}");
}

#[test]
fn msr_intel_client_uses_unit_register_for_dram() {
    let t = Tree::new("msr-client");
    t.write("/proc/cpuinfo", &intel_cpuinfo(0x9E)); // Kaby Lake client
    t.cpus(&[(0, 0, 0)]);
    t.msr(0, msr::INTEL_UNIT, 0xA1003); // 2^-16 J
    for reg in [
        msr::INTEL_PKG,
        msr::INTEL_PP0,
        msr::INTEL_PP1,
        msr::INTEL_DRAM,
    ] {
        t.msr(0, reg, 0);
    }
    let mut m = detect(&t.root()).unwrap();
    assert!(Domain::ALL.iter().all(|&d| m.has(d)));
    t.msr(0, msr::INTEL_PP1, 1 << 15);
    t.msr(0, msr::INTEL_DRAM, 1 << 16);
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    assert_eq!(e, [0.0, 0.0, 0.5, 1.0]);
}

#[test]
fn msr_amd_sums_per_core_pp0() {
    let t = Tree::new("msr-amd");
    t.write(
        "/proc/cpuinfo",
        "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nflags\t\t: fpu rapl\n\n",
    );
    // One package, two cores with two threads each.
    t.cpus(&[(0, 0, 0), (1, 0, 1), (2, 0, 0), (3, 0, 1)]);
    for cpu in [0, 1] {
        t.msr(cpu, msr::AMD_UNIT, 0xA1003); // 2^-16 J
        t.msr(cpu, msr::AMD_CORE, 0);
        t.msr(cpu, msr::AMD_PKG, 0xFFFF_0000);
    }
    let mut m = detect(&t.root()).unwrap();
    assert_eq!(
        m.domains().collect::<Vec<_>>(),
        vec![Domain::Pkg, Domain::Pp0]
    );
    assert_eq!(m.counter_count(), 3); // package + 2 cores
    t.msr(0, msr::AMD_CORE, 65536);
    t.msr(1, msr::AMD_CORE, 3 * 65536);
    t.msr(0, msr::AMD_PKG, 0x0004_0000); // wrapped
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    assert_eq!(e, [5.0, 4.0, 0.0, 0.0]);
}

#[test]
fn msr_errors_absent_permission_not_capable() {
    let t = Tree::new("msr-errors");
    t.write("/proc/cpuinfo", &intel_cpuinfo(0x55));
    t.cpus(&[(0, 0, 0)]);
    // No /dev/cpu/0/msr: the module is not loaded.
    let err = detect(&t.root()).unwrap_err();
    assert!(
        matches!(&err.tried[2].1, SourceError::Absent { path } if path.ends_with("dev/cpu/0/msr"))
    );
    assert!(err.to_string().contains("modprobe msr"), "{err}");
    // Present but refused.
    t.msr(0, msr::INTEL_UNIT, 0xA0E03);
    let root = t.root();
    let fs = DenyFs {
        deny: &["/msr"],
        errno: libc::EPERM,
    };
    let err = msr::open(&root, &fs).unwrap_err();
    assert!(matches!(err, SourceError::PermissionDenied { .. }));
    assert_eq!(
        err.advice(SourceKind::Msr),
        Some("root with CAP_SYS_RAWIO for /dev/cpu/N/msr")
    );
    // Unit register unreadable (file too short): not RAPL-capable.
    std::fs::write(t.path("/dev/cpu/0/msr"), [0u8; 16]).unwrap();
    let err = msr::open(&root, &RealFs).unwrap_err();
    assert!(matches!(err, SourceError::NotRaplCapable { .. }), "{err}");
    // AMD without the rapl flag.
    t.write(
        "/proc/cpuinfo",
        "vendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\nflags\t\t: fpu\n",
    );
    let err = msr::open(&root, &RealFs).unwrap_err();
    assert!(
        err.to_string().contains("not RAPL-capable: no `rapl` flag"),
        "{err}"
    );
}

#[test]
fn nothing_works_in_an_empty_root() {
    let t = Tree::new("empty");
    let err = detect(&t.root()).unwrap_err();
    let line = err.to_string();
    assert!(!line.contains('\n'));
    let pmu = line.find("power PMU: ").unwrap();
    let pc = line.find("powercap: ").unwrap();
    let msr = line.find("msr: ").unwrap();
    assert!(pmu < pc && pc < msr, "{line}");
    assert!(line.contains("devices/power/type absent"), "{line}");
    assert!(line.contains("sys/class/powercap absent"), "{line}");
    assert!(line.contains("proc/cpuinfo absent"), "{line}");
    assert!(
        line.contains("to enable: a kernel with the RAPL perf driver"),
        "{line}"
    );
    assert!(
        line.contains("`modprobe intel_rapl_msr` for powercap"),
        "{line}"
    );
}

/// The development machine has no RAPL: detection must say so in one line
/// naming all three sources. On a machine with RAPL and permission, the
/// meter must read.
#[test]
fn real_machine_detection() {
    match detect(&Root::system()) {
        Ok(mut m) => {
            assert!(m.domains().count() > 0);
            let mut e = [0.0; DOMAINS];
            m.read_deltas(&mut e).unwrap();
            eprintln!("energy source on this machine: {}", m.describe());
        }
        Err(err) => {
            let line = err.to_string();
            eprintln!("{line}");
            assert_eq!(err.tried.len(), 3);
            assert!(!line.contains('\n'));
            for name in ["power PMU: ", "powercap: ", "msr: "] {
                assert!(line.contains(name), "{line}");
            }
        }
    }
}

/// A fake power PMU whose package counter advances at `watts` with wall
/// time (the `cpu-clock` fake of `FilePerf`), or `None` when this process
/// may not open system-wide perf events (then the refusal must be typed).
fn wall_clock_pmu(t: &Tree, watts: f64) -> Option<EnergyMeter> {
    t.power_pmu(
        "0",
        &[("energy-pkg", "event=0x02", &format!("{:e}", watts * 1e-9))],
    );
    t.write("/perf-fake/energy-pkg/cpu0", "cpu-clock");
    match detect(&t.root()) {
        Ok(m) => Some(m),
        Err(e) => {
            // Refused, or no perf_event_open at all (qemu-user: ENOSYS).
            assert!(
                matches!(
                    e.tried[0].1,
                    SourceError::PerfRefused { .. }
                        | SourceError::PerfFailed {
                            errno: libc::ENOSYS,
                            ..
                        }
                ),
                "{e}"
            );
            eprintln!("skipping the wall-clock part: {e}");
            None
        }
    }
}

#[test]
fn wall_clock_fake_advances_with_time() {
    let t = Tree::new("wall");
    let Some(mut m) = wall_clock_pmu(&t, 20.0) else {
        return;
    };
    assert_eq!(m.source(), SourceKind::PowerPmu);
    let mut e = [0.0; DOMAINS];
    m.read_deltas(&mut e).unwrap();
    let s = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(50));
    m.read_deltas(&mut e).unwrap();
    let expect = 20.0 * s.elapsed().as_secs_f64();
    assert!(
        (e[0] / expect - 1.0).abs() < 0.05,
        "{} J read, {expect} J expected",
        e[0]
    );
}

/// The whole chain without LD_PRELOAD: a fake package drawing 20 W read
/// through the power PMU path, the ledger closing intervals on real thread
/// CPU clocks, two threads burning CPU 3:1 and taking their shares.
#[test]
fn two_threads_burning_3_to_1_get_energy_3_to_1() {
    use ledger::{CpuClock, KernelCpuClock, Ledger};
    use std::sync::{Arc, Barrier};
    let t = Tree::new("advancing");
    let Some(meter) = wall_clock_pmu(&t, 20.0) else {
        return;
    };
    let mut probe = wall_clock_pmu(&t, 20.0).unwrap();
    let ledger = Arc::new(Ledger::new(
        Some(meter),
        SharePolicy::CpuCapacity { cpus: 2 },
        8,
        JOULES_PER_VALUE,
        1_000_000,
    ));
    let done = Arc::new(Barrier::new(3));
    let closed = Arc::new(Barrier::new(3));
    let worker = |cpu_ms: u64| {
        let (ledger, done, closed) = (ledger.clone(), done.clone(), closed.clone());
        std::thread::spawn(move || {
            let tid = crate::sys::gettid();
            let slot = ledger.register(tid).unwrap();
            let start = KernelCpuClock.thread_cpu_ns(tid).unwrap();
            let mut uj = 0u64;
            while KernelCpuClock.thread_cpu_ns(tid).unwrap() - start < cpu_ms * 1_000_000 {
                for _ in 0..1000 {
                    std::hint::black_box(0u64);
                }
                let _ = ledger.close_interval();
                uj += ledger.take(slot)[0];
            }
            let cpu = KernelCpuClock.thread_cpu_ns(tid).unwrap() - start;
            done.wait();
            closed.wait();
            uj += ledger.take(slot)[0];
            ledger.unregister(slot);
            (uj, cpu)
        })
    };
    let (a, b) = (worker(240), worker(80));
    done.wait();
    std::thread::sleep(std::time::Duration::from_millis(2));
    while !ledger.close_interval().unwrap() {}
    let mut total = [0.0; DOMAINS];
    probe.read_deltas(&mut total).unwrap();
    closed.wait();
    let ((ua, ca), (ub, cb)) = (a.join().unwrap(), b.join().unwrap());
    let ratio = ua as f64 / ub as f64;
    let cpu_ratio = ca as f64 / cb as f64;
    eprintln!("A {ua} uJ / {ca} ns CPU, B {ub} uJ / {cb} ns CPU: energy ratio {ratio:.3}, CPU ratio {cpu_ratio:.3}");
    // Each thread burns to a target on its own CPU clock, so the CPU split
    // is near 3:1 however loaded the machine is (preemption stops that
    // clock); a thread overshoots its target by its last loop turn, which a
    // page fault or a slow interval close can stretch to a millisecond or
    // two. Energy must follow the CPU time each thread really used.
    assert!((cpu_ratio / 3.0 - 1.0).abs() < 0.1, "CPU ratio {cpu_ratio}");
    assert!(
        (ratio / cpu_ratio - 1.0).abs() < 0.05,
        "energy ratio {ratio}, CPU ratio {cpu_ratio}"
    );
    // At 20 W over 2 CPUs a CPU-second costs 10 J: A ~2.4 J, B ~0.8 J.
    for (name, uj, cpu_ns) in [("A", ua, ca), ("B", ub, cb)] {
        assert!(
            (uj as f64 / (cpu_ns as f64 * 1e-3 * 10.0) - 1.0).abs() < 0.05,
            "{name} got {uj} uJ for {cpu_ns} ns"
        );
    }
    // Nothing lost: shares + unattributed + after-exit = energy drawn over
    // the run (the probe meter was opened just after the ledger's).
    let r = ledger.residual();
    let accounted = (ua + ub + r.unattributed[0] + r.after_exit[0]) as f64 * 1e-6;
    assert!(
        (accounted / total[0] - 1.0).abs() < 0.02,
        "{accounted} J accounted, {} J drawn",
        total[0]
    );
}

/// A closer stalled just after sampling the meter (preempted, its virtual
/// CPU stolen) while the other thread runs on: the energy of the stall
/// belongs to the interval that ends after it, shared by the CPU time
/// used in it, and each thread's energy still follows its own CPU time.
#[test]
fn a_close_stalled_after_its_meter_read_reads_again() {
    use ledger::{CpuClock, Ledger};
    use std::cell::Cell;
    struct Clocks(Cell<u64>, Cell<u64>);
    impl CpuClock for Clocks {
        fn thread_cpu_ns(&self, tid: i32) -> Option<u64> {
            Some(if tid == 1 { self.0.get() } else { self.1.get() })
        }
    }
    const MS: u64 = 1_000_000;
    let t = Tree::new("stalled-read");
    t.zone("intel-rapl:0", "package-0", 0, 262_143_328_850);
    let meter = detect(&t.root()).unwrap();
    // The package draws 20 W: 20 uJ per microsecond... of fake wall time.
    let wall = Cell::new(0u64);
    let advance = |ns: u64| {
        wall.set(wall.get() + ns);
        t.energy_uj("intel-rapl:0", 20 * wall.get() / 1000);
    };
    let ledger = Ledger::new(
        Some(meter),
        SharePolicy::CpuCapacity { cpus: 2 },
        2,
        1e-6,
        0,
    );
    let clocks = Clocks(Cell::new(0), Cell::new(0));
    let (a, b) = (
        ledger.register_at(1, 0).unwrap(),
        ledger.register_at(2, 0).unwrap(),
    );
    // Align the ledger's wall clock with the fake one.
    ledger.close_now_timed(&|| wall.get(), &clocks).unwrap();
    let (mut ua, mut ub) = (ledger.take(a)[0], ledger.take(b)[0]);
    for interval in 0..10 {
        // Both threads run for 1 ms.
        advance(MS);
        clocks.0.set(clocks.0.get() + MS);
        clocks.1.set(clocks.1.get() + MS);
        let calls = Cell::new(0);
        let mono = || {
            calls.set(calls.get() + 1);
            // In the 5th close, A stalls 16 ms just after the meter's
            // first read (the close's third clock reading): B runs on.
            if interval == 4 && calls.get() == 3 {
                advance(16 * MS);
                clocks.1.set(clocks.1.get() + 16 * MS);
            }
            wall.get()
        };
        assert!(ledger.close_now_timed(&mono, &clocks).unwrap());
        ua += ledger.take(a)[0];
        ub += ledger.take(b)[0];
    }
    // 2 CPUs at 20 W: a CPU-millisecond is worth 10 mJ. A used 10 ms, B 26.
    // Read once, A got 250 mJ (the stall's energy shared in the next close).
    assert!((ua as f64 / 100_000.0 - 1.0).abs() < 0.01, "A got {ua} uJ");
    assert!((ub as f64 / 260_000.0 - 1.0).abs() < 0.01, "B got {ub} uJ");
    assert_eq!(ledger.stalled_reads(), 1);
}

#[test]
fn online_cpus_from_the_root() {
    let t = Tree::new("online");
    t.write("/sys/devices/system/cpu/online", "0-5,8\n");
    assert_eq!(online_cpus(&t.root()), 7);
    assert_eq!(
        default_policy(&t.root()),
        SharePolicy::CpuCapacity { cpus: 7 }
    );
    // Absent: falls back to sysconf, at least 1.
    assert!(online_cpus(&Tree::new("online-absent").root()) >= 1);
}

/// Cost of the per-sample calls (run by `bench/energy-read-cost`, not by
/// `cargo test`): nanoseconds per `read_deltas` on fake files, per `read`
/// of a real perf counter (software event: the syscall a power PMU read
/// makes), and per `close_interval` with threads registered.
#[test]
#[ignore]
fn bench_energy_read_cost() {
    use ledger::{KernelCpuClock, Ledger};
    use std::time::Instant;
    const N: u32 = 20_000;
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / f64::from(N);

    let t = Tree::new("bench");
    let max = 262_143_328_850;
    t.zone("intel-rapl:0", "package-0", 1, max);
    t.zone("intel-rapl:0:0", "core", 1, max);
    t.zone("intel-rapl:0:2", "dram", 1, max);
    let mut m = detect(&t.root()).unwrap();
    let mut e = [0.0; DOMAINS];
    let s = Instant::now();
    for _ in 0..N {
        m.read_deltas(&mut e).unwrap();
    }
    println!(
        "powercap fake, {} counters: {:.0} ns per read_deltas",
        m.counter_count(),
        per(s)
    );

    let t2 = Tree::new("bench-msr");
    t2.write("/proc/cpuinfo", &intel_cpuinfo(0x9E));
    t2.cpus(&[(0, 0, 0)]);
    t2.msr(0, msr::INTEL_UNIT, 0xA0E03);
    for reg in [
        msr::INTEL_PKG,
        msr::INTEL_PP0,
        msr::INTEL_PP1,
        msr::INTEL_DRAM,
    ] {
        t2.msr(0, reg, 1);
    }
    let mut m = detect(&t2.root()).unwrap();
    let s = Instant::now();
    for _ in 0..N {
        m.read_deltas(&mut e).unwrap();
    }
    println!(
        "msr fake, {} counters: {:.0} ns per read_deltas",
        m.counter_count(),
        per(s)
    );

    let spec = pmu::PerfSpec {
        event: "cpu-clock",
        pmu_type: 1,
        config: 0,
        cpu: 0,
    };
    match pmu::PerfOpener::open(&pmu::SyscallPerf, &spec) {
        Ok((fd, access)) => {
            let c = counter::RawCounter::new(fd, access, counter::Wrap::Bits64, 1e-9, Domain::Pkg)
                .unwrap();
            let s = Instant::now();
            for _ in 0..N {
                std::hint::black_box(c.read_raw().unwrap());
            }
            println!(
                "perf counter read(2), software cpu-clock on CPU 0: {:.0} ns per read",
                per(s)
            );
        }
        Err(e) => println!("perf counter read: not measured ({e})"),
    }

    for threads in [1usize, 16] {
        let meter = detect(&t.root()).unwrap();
        let l = Ledger::new(
            Some(meter),
            SharePolicy::CpuCapacity { cpus: 2 },
            64,
            JOULES_PER_VALUE,
            0,
        );
        let tid = crate::sys::gettid();
        let slots: Vec<_> = (0..threads).map(|_| l.register(tid).unwrap()).collect();
        let s = Instant::now();
        for _ in 0..N {
            l.close_interval().unwrap();
            std::hint::black_box(l.take(slots[0]));
        }
        println!(
            "close_interval + take, {threads} threads registered, 3 powercap counters: {:.0} ns",
            per(s)
        );
        let _ = KernelCpuClock;
    }
}
