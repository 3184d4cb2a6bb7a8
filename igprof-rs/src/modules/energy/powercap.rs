//! Source 2: the powercap tree (`/sys/class/powercap/intel-rapl:N[:M]`).
//!
//! Owns: finding the RAPL zones under the root, mapping their `name` to a
//! domain (`package-N` -> PKG, `core` -> PP0, `uncore` -> PP1, `dram` ->
//! DRAM; `psys` and unknown names skipped), opening each `energy_uj` and
//! reading `max_energy_range_uj` for wrap-around. AMD packages appear under
//! the same `intel-rapl` names on recent kernels. `intel-rapl-mmio:*` zones
//! (an MMIO view of the same package counter on some Intel clients) are not
//! read. Never called from signal context; the counters it returns are read
//! there with `pread`.

use std::path::PathBuf;

use super::counter::{Access, RawCounter, Wrap};
use super::error::{ReadError, SourceError};
use super::root::{read_text, Fs, Root};
use super::Domain;

pub const POWERCAP_DIR: &str = "/sys/class/powercap";

/// The domain a zone's `name` stands for.
pub fn zone_domain(name: &str) -> Option<Domain> {
    match name {
        "core" => Some(Domain::Pp0),
        "uncore" => Some(Domain::Pp1),
        "dram" => Some(Domain::Dram),
        n if n.starts_with("package-") => Some(Domain::Pkg),
        _ => None,
    }
}

/// `intel-rapl:0`, `intel-rapl:0:1` (not the control type `intel-rapl`),
/// returned with their numbers for ordering.
fn zone_key(entry: &str) -> Option<Vec<u32>> {
    let rest = entry.strip_prefix("intel-rapl:")?;
    rest.split(':').map(|n| n.parse().ok()).collect()
}

/// Open every known RAPL zone's `energy_uj`.
pub fn open(root: &Root, fs: &dyn Fs) -> Result<Vec<RawCounter>, SourceError> {
    let dir = root.join(POWERCAP_DIR);
    let listing = std::fs::read_dir(&dir).map_err(|e| SourceError::from_io(dir.clone(), &e))?;
    let mut zones: Vec<(Vec<u32>, PathBuf)> = listing
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((zone_key(e.file_name().to_str()?)?, e.path())))
        .collect();
    zones.sort();
    let mut counters = Vec::new();
    let mut first_error = None;
    for (_, zone) in zones {
        let name_path = zone.join("name");
        let Ok(name) = read_text(fs, &name_path) else {
            continue;
        };
        let Some(domain) = zone_domain(&name) else {
            continue;
        };
        match open_zone(fs, &zone, domain) {
            Ok(c) => counters.push(c),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match (counters.is_empty(), first_error) {
        (false, _) => Ok(counters),
        (true, Some(e)) => Err(e),
        (true, None) => Err(SourceError::NoDomains { path: dir }),
    }
}

fn open_zone(
    fs: &dyn Fs,
    zone: &std::path::Path,
    domain: Domain,
) -> Result<RawCounter, SourceError> {
    let range_path = zone.join("max_energy_range_uj");
    let range_text =
        read_text(fs, &range_path).map_err(|e| SourceError::from_io(range_path.clone(), &e))?;
    let max = range_text
        .parse::<u64>()
        .ok()
        .filter(|&m| m > 0)
        .ok_or_else(|| SourceError::Malformed {
            path: range_path,
            content: range_text.clone(),
            expected: "a positive number of microjoules",
        })?;
    let energy_path = zone.join("energy_uj");
    let fd = fs
        .open(&energy_path)
        .map_err(|e| SourceError::from_io(energy_path.clone(), &e))?;
    RawCounter::new(fd, Access::PreadDecimal, Wrap::Range { max }, 1e-6, domain).map_err(
        |e| match e {
            ReadError::Io {
                errno: libc::EACCES | libc::EPERM,
            } => SourceError::PermissionDenied { path: energy_path },
            ReadError::Io { errno } => SourceError::Io {
                path: energy_path,
                errno,
            },
            ReadError::Short { .. } | ReadError::NotANumber => SourceError::Malformed {
                path: energy_path,
                content: String::new(),
                expected: "a decimal number of microjoules",
            },
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_names_and_keys() {
        assert_eq!(zone_domain("package-0"), Some(Domain::Pkg));
        assert_eq!(zone_domain("package-1"), Some(Domain::Pkg));
        assert_eq!(zone_domain("core"), Some(Domain::Pp0));
        assert_eq!(zone_domain("uncore"), Some(Domain::Pp1));
        assert_eq!(zone_domain("dram"), Some(Domain::Dram));
        assert_eq!(zone_domain("psys"), None);
        assert_eq!(zone_key("intel-rapl"), None);
        assert_eq!(zone_key("intel-rapl:1"), Some(vec![1]));
        assert_eq!(zone_key("intel-rapl:0:2"), Some(vec![0, 2]));
        assert_eq!(zone_key("intel-rapl-mmio:0"), None);
    }
}
