//! Typed errors of the energy readers and the one-line "no energy source"
//! message the runtime prints when nothing can be read.
//!
//! Owns: the reasons a source is unusable and the advice for each. Start-up
//! errors ([`SourceError`], [`NoSource`]) may allocate; the per-sample error
//! ([`ReadError`]) is `Copy` and carries no heap data, so the sampling path
//! can return it from signal context.

use std::fmt;
use std::path::PathBuf;

/// The three sources, in the order they are tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// perf_event `power` PMU (`/sys/bus/event_source/devices/power`).
    PowerPmu,
    /// powercap tree (`/sys/class/powercap/intel-rapl:*`).
    Powercap,
    /// model-specific registers (`/dev/cpu/N/msr`).
    Msr,
}

impl SourceKind {
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::PowerPmu => "power PMU",
            SourceKind::Powercap => "powercap",
            SourceKind::Msr => "msr",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why one source cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceError {
    /// The directory, file or device does not exist.
    Absent { path: PathBuf },
    /// Opening or reading was refused (`EACCES`/`EPERM`).
    PermissionDenied { path: PathBuf },
    /// `perf_event_open` refused a system-wide counter; `paranoid` is the
    /// level read from `/proc/sys/kernel/perf_event_paranoid` under the root.
    PerfRefused {
        event: String,
        errno: i32,
        paranoid: Option<i32>,
    },
    /// `perf_event_open` failed for another reason (`errno`).
    PerfFailed { event: String, cpu: u32, errno: i32 },
    /// The CPU has no RAPL registers (`vendor` from `/proc/cpuinfo`).
    NotRaplCapable {
        vendor: String,
        reason: &'static str,
    },
    /// The tree exists but none of its zones or events is a known domain.
    NoDomains { path: PathBuf },
    /// A file's content did not parse.
    Malformed {
        path: PathBuf,
        content: String,
        expected: &'static str,
    },
    /// Any other I/O error.
    Io { path: PathBuf, errno: i32 },
}

impl SourceError {
    /// Classify an I/O error on `path`.
    pub fn from_io(path: PathBuf, e: &std::io::Error) -> SourceError {
        match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
                SourceError::Absent { path }
            }
            Some(libc::EACCES) | Some(libc::EPERM) => SourceError::PermissionDenied { path },
            Some(errno) => SourceError::Io { path, errno },
            None => SourceError::Io { path, errno: 0 },
        }
    }

    /// What would make `kind` work, given this failure; `None` when nothing
    /// the user can do helps (no RAPL hardware).
    pub fn advice(&self, kind: SourceKind) -> Option<&'static str> {
        match (kind, self) {
            (_, SourceError::NotRaplCapable { .. }) => None,
            (SourceKind::PowerPmu, SourceError::PerfRefused { .. }) => {
                Some("`sysctl kernel.perf_event_paranoid=0` (or CAP_PERFMON) for the power PMU")
            }
            (SourceKind::PowerPmu, SourceError::Absent { .. } | SourceError::NoDomains { .. }) => {
                Some("a kernel with the RAPL perf driver on RAPL hardware for the power PMU")
            }
            (SourceKind::Powercap, SourceError::Absent { .. } | SourceError::NoDomains { .. }) => {
                Some("`modprobe intel_rapl_msr` for powercap")
            }
            (SourceKind::Powercap, SourceError::PermissionDenied { .. }) => {
                Some("root, or `chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj` (root-only since Linux 5.10)")
            }
            (SourceKind::Msr, SourceError::Absent { .. }) => Some("`modprobe msr` for /dev/cpu/N/msr"),
            (SourceKind::Msr, SourceError::PermissionDenied { .. }) => {
                Some("root with CAP_SYS_RAWIO for /dev/cpu/N/msr")
            }
            _ => None,
        }
    }
}

fn errno_name(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::Absent { path } => write!(f, "{} absent", path.display()),
            SourceError::PermissionDenied { path } => {
                write!(f, "{} permission denied", path.display())
            }
            SourceError::PerfRefused {
                event,
                errno,
                paranoid,
            } => {
                write!(
                    f,
                    "perf_event_open({event}) refused ({})",
                    errno_name(*errno)
                )?;
                match paranoid {
                    Some(level) => write!(
                        f,
                        " at perf_event_paranoid={level}, system-wide counters need <=0 or CAP_PERFMON"
                    ),
                    None => write!(f, ", perf_event_paranoid unreadable"),
                }
            }
            SourceError::PerfFailed { event, cpu, errno } => {
                write!(
                    f,
                    "perf_event_open({event}, cpu {cpu}) failed: {}",
                    errno_name(*errno)
                )
            }
            SourceError::NotRaplCapable { vendor, reason } => {
                write!(f, "CPU ({vendor}) not RAPL-capable: {reason}")
            }
            SourceError::NoDomains { path } => write!(f, "no RAPL domain under {}", path.display()),
            SourceError::Malformed {
                path,
                content,
                expected,
            } => {
                write!(
                    f,
                    "{} holds {content:?}, expected {expected}",
                    path.display()
                )
            }
            SourceError::Io { path, errno } => {
                write!(f, "{}: {}", path.display(), errno_name(*errno))
            }
        }
    }
}

impl std::error::Error for SourceError {}

/// No source could be read: each source tried, in order, with its reason.
/// `Display` gives the single line the runtime prints; the program then runs
/// without energy profiling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoSource {
    pub tried: Vec<(SourceKind, SourceError)>,
}

impl fmt::Display for NoSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("igprof: energy profiling (-np) disabled, no energy source: ")?;
        for (i, (kind, err)) in self.tried.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{kind}: {err}")?;
        }
        let no_rapl = self
            .tried
            .iter()
            .any(|(_, e)| matches!(e, SourceError::NotRaplCapable { .. }));
        let advice: Vec<&str> = self
            .tried
            .iter()
            .filter_map(|(k, e)| e.advice(*k))
            .collect();
        if no_rapl || advice.is_empty() {
            f.write_str("; nothing to enable: this CPU exposes no RAPL energy counters")
        } else {
            write!(f, "; to enable: {}", advice.join(", or "))
        }
    }
}

impl std::error::Error for NoSource {}

/// A per-sample read failed. `Copy`, no heap data: safe to return from a
/// signal handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// `read`/`pread` failed with `errno`.
    Io { errno: i32 },
    /// Fewer bytes than a counter value.
    Short { got: usize },
    /// A text counter (powercap `energy_uj`) was not a decimal number.
    NotANumber,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io { errno } => {
                write!(f, "energy counter read failed: {}", errno_name(*errno))
            }
            ReadError::Short { got } => {
                write!(f, "energy counter read returned {got} bytes, expected 8")
            }
            ReadError::NotANumber => f.write_str("energy counter file is not a decimal number"),
        }
    }
}

impl std::error::Error for ReadError {}
