//! Source 1: the perf_event `power` PMU (RAPL through the kernel's perf driver).
//!
//! Owns: parsing `/sys/bus/event_source/devices/power/` under the root (PMU
//! `type`, `cpumask`, `events/energy-*` with their `.scale` and `.unit`), and
//! opening one counter per event per package CPU through [`PerfOpener`].
//! Never called from signal context (it allocates and opens descriptors).
//!
//! What the tests here cannot reach: [`SyscallPerf`] opening a real `power`
//! event, since the development machines have no RAPL. Its syscall path is
//! exercised with a software event where permitted; the parsing, the units
//! and the read path are exercised through [`FilePerf`], which serves
//! counter values from files under the root with the same 8-byte layout a
//! perf descriptor returns.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::counter::{Access, RawCounter, Wrap};
use super::error::SourceError;
use super::root::{parse_cpu_list, read_text, Fs, Root};
use super::Domain;
use crate::sys;

pub const PMU_DIR: &str = "/sys/bus/event_source/devices/power";
/// Linux 6.13+ on AMD: per-core energy in its own PMU (one CPU per core in
/// its `cpumask`); read for PP0 when the `power` PMU has no `energy-cores`.
pub const PMU_CORE_DIR: &str = "/sys/bus/event_source/devices/power_core";
pub const CORE_EVENTS: [(&str, Option<Domain>); 1] = [("energy-core", Some(Domain::Pp0))];
pub const PARANOID_PATH: &str = "/proc/sys/kernel/perf_event_paranoid";

/// The RAPL events the PMU may expose and the counter each feeds.
/// `energy-psys` (whole platform, not a package domain) is recognised but
/// not reported: no NRG_ counter stands for it.
pub const EVENTS: [(&str, Option<Domain>); 5] = [
    ("energy-pkg", Some(Domain::Pkg)),
    ("energy-cores", Some(Domain::Pp0)),
    ("energy-gpu", Some(Domain::Pp1)),
    ("energy-ram", Some(Domain::Dram)),
    ("energy-psys", None),
];

/// One event as sysfs describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct PmuEvent {
    pub name: &'static str,
    pub domain: Domain,
    /// `attr.config` (the `event=` term).
    pub config: u64,
    /// Joules per count (the `.scale` file).
    pub scale: f64,
}

/// The `power` PMU as sysfs describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct PmuInfo {
    /// `attr.type`.
    pub pmu_type: u32,
    /// One CPU per package (`cpumask`).
    pub cpus: Vec<u32>,
    pub events: Vec<PmuEvent>,
}

/// What to open: one event on one CPU, system-wide.
#[derive(Clone, Copy, Debug)]
pub struct PerfSpec<'a> {
    pub event: &'a str,
    pub pmu_type: u32,
    pub config: u64,
    pub cpu: u32,
}

/// Opens a counter for a [`PerfSpec`]; returns the descriptor and how to read it.
pub trait PerfOpener {
    fn open(&self, spec: &PerfSpec<'_>) -> io::Result<(OwnedFd, Access)>;
}

/// The real thing: `perf_event_open(attr, pid = -1, cpu, -1, FD_CLOEXEC)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallPerf;

impl PerfOpener for SyscallPerf {
    fn open(&self, spec: &PerfSpec<'_>) -> io::Result<(OwnedFd, Access)> {
        // Up to `config1` (the first layout) is all a counting RAPL event needs.
        let attr = sys::PerfEventAttr {
            type_: spec.pmu_type,
            size: sys::PERF_ATTR_SIZE_VER0,
            config: spec.config,
            ..Default::default()
        };
        let fd = sys::perf_event_open(&attr, -1, spec.cpu as libc::c_int)
            .map_err(|e| io::Error::from_raw_os_error(e.0))?;
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, Access::Read))
    }
}

/// File-backed stand-in for `perf_event_open`, used whenever the root is
/// not `/`: the count of event `E` on CPU `N` is the 8 native-endian bytes
/// of `<root>/perf-fake/E/cpuN`. Opening goes through the same [`Fs`], so a
/// test can inject `EACCES` and see the paranoid-level message.
///
/// A counter that advances with wall time, for end-to-end tests: when that
/// file holds the text `cpu-clock`, the real system-wide `cpu-clock`
/// software event of CPU `N` is opened instead (nanoseconds, read with
/// `read(2)` exactly as a power PMU counter is; needs
/// `perf_event_paranoid <= 0` or root). With `.scale` = `W x 1e-9` the fake
/// package draws `W` watts, sampled at the instant it is read.
pub struct FilePerf<'a> {
    pub root: &'a Root,
    pub fs: &'a dyn Fs,
}

/// Content of a fake counter file that selects the wall-time counter.
pub const WALL_CLOCK_FAKE: &[u8] = b"cpu-clock";

impl FilePerf<'_> {
    pub fn path(root: &Root, event: &str, cpu: u32) -> PathBuf {
        root.join(&format!("/perf-fake/{event}/cpu{cpu}"))
    }
}

impl PerfOpener for FilePerf<'_> {
    fn open(&self, spec: &PerfSpec<'_>) -> io::Result<(OwnedFd, Access)> {
        let fd = self
            .fs
            .open(&FilePerf::path(self.root, spec.event, spec.cpu))?;
        let mut head = [0u8; WALL_CLOCK_FAKE.len()];
        let n = std::fs::File::from(fd.try_clone()?).read_at(&mut head, 0)?;
        if n == head.len() && head == WALL_CLOCK_FAKE {
            let clock = PerfSpec {
                pmu_type: sys::PERF_TYPE_SOFTWARE,
                config: sys::PERF_COUNT_SW_CPU_CLOCK,
                ..*spec
            };
            return SyscallPerf.open(&clock);
        }
        Ok((fd, Access::PreadBinary { offset: 0 }))
    }
}

/// Parse the `power` PMU's sysfs description under `root`.
pub fn parse(root: &Root, fs: &dyn Fs) -> Result<PmuInfo, SourceError> {
    parse_pmu(root, fs, PMU_DIR, &EVENTS)
}

/// Parse the PMU at `pmu_dir` (a kernel path), looking for `events`.
fn parse_pmu(
    root: &Root,
    fs: &dyn Fs,
    pmu_dir: &str,
    events_wanted: &[(&'static str, Option<Domain>)],
) -> Result<PmuInfo, SourceError> {
    let dir = root.join(pmu_dir);
    let type_path = dir.join("type");
    let type_text =
        read_text(fs, &type_path).map_err(|e| SourceError::from_io(type_path.clone(), &e))?;
    let pmu_type = type_text.parse().map_err(|_| SourceError::Malformed {
        path: type_path,
        content: type_text.clone(),
        expected: "a PMU type number",
    })?;
    let mask_path = dir.join("cpumask");
    let mask =
        read_text(fs, &mask_path).map_err(|e| SourceError::from_io(mask_path.clone(), &e))?;
    let cpus = match parse_cpu_list(&mask) {
        Some(c) if !c.is_empty() => c,
        _ => {
            return Err(SourceError::Malformed {
                path: mask_path,
                content: mask,
                expected: "a CPU list",
            })
        }
    };
    let mut events = Vec::new();
    for &(name, domain) in events_wanted {
        let Some(domain) = domain else { continue };
        let ev_path = dir.join("events").join(name);
        let ev_text = match read_text(fs, &ev_path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // domain not on this CPU
            Err(e) => return Err(SourceError::from_io(ev_path, &e)),
        };
        let config = parse_event_config(&ev_text).ok_or_else(|| SourceError::Malformed {
            path: ev_path.clone(),
            content: ev_text.clone(),
            expected: "event=0x<hex>",
        })?;
        let scale_path = dir.join("events").join(format!("{name}.scale"));
        let scale_text =
            read_text(fs, &scale_path).map_err(|e| SourceError::from_io(scale_path.clone(), &e))?;
        let scale: f64 = match scale_text.parse() {
            Ok(s) if s > 0.0 && f64::is_finite(s) => s,
            _ => {
                return Err(SourceError::Malformed {
                    path: scale_path,
                    content: scale_text,
                    expected: "a positive scale such as 2.3283064365386962890625e-10",
                })
            }
        };
        let unit_path = dir.join("events").join(format!("{name}.unit"));
        let unit =
            read_text(fs, &unit_path).map_err(|e| SourceError::from_io(unit_path.clone(), &e))?;
        if unit != "Joules" {
            return Err(SourceError::Malformed {
                path: unit_path,
                content: unit,
                expected: "Joules",
            });
        }
        events.push(PmuEvent {
            name,
            domain,
            config,
            scale,
        });
    }
    if events.is_empty() {
        return Err(SourceError::NoDomains {
            path: dir.join("events"),
        });
    }
    Ok(PmuInfo {
        pmu_type,
        cpus,
        events,
    })
}

/// `event=0x02` (terms other than `event` are not used by RAPL).
fn parse_event_config(text: &str) -> Option<u64> {
    let mut config = None;
    for term in text.split(',') {
        let (k, v) = term.trim().split_once('=')?;
        if k != "event" {
            return None;
        }
        let v = v.trim();
        config = Some(match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok()?,
            None => v.parse().ok()?,
        });
    }
    config
}

/// The paranoid level under `root`, if readable.
pub fn paranoid_level(root: &Root, fs: &dyn Fs) -> Option<i32> {
    read_text(fs, &root.join(PARANOID_PATH)).ok()?.parse().ok()
}

/// Parse and open every event on every package CPU (plus the per-core
/// `power_core` PMU for PP0 where the `power` PMU lacks `energy-cores`; that
/// one is optional and skipped if it cannot be opened).
pub fn open(
    root: &Root,
    fs: &dyn Fs,
    perf: &dyn PerfOpener,
) -> Result<Vec<RawCounter>, SourceError> {
    let info = parse(root, fs)?;
    let mut counters = open_events(root, fs, perf, "power", &info)?;
    if !info.events.iter().any(|e| e.domain == Domain::Pp0) {
        if let Ok(core) = parse_pmu(root, fs, PMU_CORE_DIR, &CORE_EVENTS) {
            if let Ok(mut c) = open_events(root, fs, perf, "power_core", &core) {
                counters.append(&mut c);
            }
        }
    }
    Ok(counters)
}

/// Open every event of `info` on each of its CPUs.
fn open_events(
    root: &Root,
    fs: &dyn Fs,
    perf: &dyn PerfOpener,
    pmu_name: &str,
    info: &PmuInfo,
) -> Result<Vec<RawCounter>, SourceError> {
    let mut counters = Vec::with_capacity(info.events.len() * info.cpus.len());
    for ev in &info.events {
        for &cpu in &info.cpus {
            let spec = PerfSpec {
                event: ev.name,
                pmu_type: info.pmu_type,
                config: ev.config,
                cpu,
            };
            let (fd, access) = perf.open(&spec).map_err(|e| match e.raw_os_error() {
                Some(errno @ (libc::EACCES | libc::EPERM)) => SourceError::PerfRefused {
                    event: format!("{pmu_name}/{}/", ev.name),
                    errno,
                    paranoid: paranoid_level(root, fs),
                },
                errno => SourceError::PerfFailed {
                    event: format!("{pmu_name}/{}/", ev.name),
                    cpu,
                    errno: errno.unwrap_or(0),
                },
            })?;
            let counter =
                RawCounter::new(fd, access, Wrap::Bits64, ev.scale, ev.domain).map_err(|e| {
                    SourceError::Io {
                        path: PathBuf::from(format!(
                            "perf_event {pmu_name}/{}/ cpu {cpu}",
                            ev.name
                        )),
                        errno: match e {
                            super::error::ReadError::Io { errno } => errno,
                            _ => libc::EIO,
                        },
                    }
                })?;
            counters.push(counter);
        }
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_terms() {
        assert_eq!(parse_event_config("event=0x02"), Some(2));
        assert_eq!(parse_event_config("event=0x1b"), Some(0x1b));
        assert_eq!(parse_event_config("event=5"), Some(5));
        assert_eq!(parse_event_config("event=0x02,umask=0x1"), None);
        assert_eq!(parse_event_config("garbage"), None);
    }

    /// The real syscall path: a software event (cpu-clock, system-wide on
    /// CPU 0) where this process may open one, else the refusal must be the
    /// typed permission error. The power PMU itself is absent here.
    #[test]
    fn syscall_opener_reads_a_software_counter_or_is_refused() {
        const PERF_TYPE_SOFTWARE: u32 = 1;
        const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
        let spec = PerfSpec {
            event: "cpu-clock",
            pmu_type: PERF_TYPE_SOFTWARE,
            config: PERF_COUNT_SW_CPU_CLOCK,
            cpu: 0,
        };
        match SyscallPerf.open(&spec) {
            Ok((fd, access)) => {
                assert_eq!(access, Access::Read);
                let c = RawCounter::new(fd, access, Wrap::Bits64, 1e-9, Domain::Pkg).unwrap();
                let a = c.read_raw().unwrap();
                let t = std::time::Instant::now();
                while t.elapsed().as_millis() < 5 {}
                assert!(
                    c.read_raw().unwrap() > a,
                    "cpu-clock counter did not advance"
                );
            }
            // ENOSYS: no perf_event_open at all (qemu-user).
            Err(e) => assert!(
                matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::ENOSYS)
                ),
                "{e}"
            ),
        }
        // A PMU type that does not exist: ENOENT from the kernel, not a crash.
        let bogus = PerfSpec {
            event: "bogus",
            pmu_type: 0x7fff_fff0,
            config: 0,
            cpu: 0,
        };
        assert!(SyscallPerf.open(&bogus).is_err());
    }
}
