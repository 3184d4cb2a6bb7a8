//! Where the energy readers find their files: a root directory and the one
//! trait through which every file is opened.
//!
//! Owns: joining kernel paths (`/sys/...`, `/proc/...`, `/dev/cpu/...`) onto
//! the root, opening them, and reading small text files at start-up.
//! Never used from signal context: everything here may allocate. The
//! per-sample reads use descriptors opened here, through `counter`.
//!
//! The root is `/` unless [`ROOT_ENV`] names another directory; tests build
//! fake sysfs, powercap and msr trees under a temporary directory and read
//! them through exactly the same functions. Opening goes through [`Fs`] so a
//! test can inject an open error (`EACCES` cannot be provoked with `chmod`
//! when the tests run as root).

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Environment variable naming the directory that stands in for `/` when the
/// energy sources are looked up (`IGPROF_ENERGY_ROOT=/tmp/fake igprof -np ...`).
/// Unset or empty means `/`. When it is set to anything but `/`, the power
/// PMU's counters are read from files too (see `pmu::FilePerf`).
pub const ROOT_ENV: &str = "IGPROF_ENERGY_ROOT";

/// The directory that stands in for `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    dir: PathBuf,
}

impl Root {
    /// The real root, `/`.
    pub fn system() -> Root {
        Root {
            dir: PathBuf::from("/"),
        }
    }

    /// A root at `dir` (tests, or the value of [`ROOT_ENV`]).
    pub fn at(dir: impl Into<PathBuf>) -> Root {
        Root { dir: dir.into() }
    }

    /// The root named by the value of [`ROOT_ENV`]: `None` or empty gives `/`.
    pub fn from_env_value(value: Option<&OsStr>) -> Root {
        match value {
            Some(v) if !v.is_empty() => Root::at(v),
            _ => Root::system(),
        }
    }

    /// True for `/`: real devices, real `perf_event_open`.
    pub fn is_system(&self) -> bool {
        self.dir == Path::new("/")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `kernel_path` (absolute, as the kernel names it) under this root.
    pub fn join(&self, kernel_path: &str) -> PathBuf {
        self.dir.join(kernel_path.trim_start_matches('/'))
    }
}

/// Opens files for the energy readers. The real implementation is [`RealFs`];
/// tests wrap it to inject errors.
pub trait Fs {
    /// Open `path` read-only.
    fn open(&self, path: &Path) -> io::Result<OwnedFd>;
}

/// Opens files with `open(2)`, read-only, close-on-exec.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

impl Fs for RealFs {
    fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        // std opens with O_CLOEXEC.
        let f: File = OpenOptions::new().read(true).open(path)?;
        Ok(OwnedFd::from(f))
    }
}

/// Read a whole small text file, trimmed, through `fs`.
pub fn read_text(fs: &dyn Fs, path: &Path) -> io::Result<String> {
    let mut f = File::from(fs.open(path)?);
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    Ok(s.trim().to_string())
}

/// Parse a kernel CPU list such as `0`, `0,36` or `0-3,8-11` (cpumask,
/// `online`). `None` when malformed.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_joins_kernel_paths() {
        let r = Root::at("/tmp/x");
        assert_eq!(
            r.join("/sys/class/powercap"),
            PathBuf::from("/tmp/x/sys/class/powercap")
        );
        assert!(!r.is_system());
        assert!(Root::from_env_value(None).is_system());
        assert!(Root::from_env_value(Some(OsStr::new(""))).is_system());
        assert_eq!(Root::from_env_value(Some(OsStr::new("/a"))), Root::at("/a"));
        assert_eq!(
            Root::system().join("/proc/cpuinfo"),
            PathBuf::from("/proc/cpuinfo")
        );
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0,36\n"), Some(vec![0, 36]));
        assert_eq!(parse_cpu_list("0-3,8-9"), Some(vec![0, 1, 2, 3, 8, 9]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list(""), Some(vec![]));
    }
}
