//! Source 3: the RAPL model-specific registers through `/dev/cpu/N/msr`.
//!
//! Owns: recognising the CPU (`/proc/cpuinfo` under the root), choosing one
//! CPU per package (and, on AMD, one per core for the per-core PP0
//! register) from `/sys/devices/system/cpu/`, reading the energy unit and
//! opening one descriptor per register. The registers are 32-bit counters
//! read with `pread` at the register number; a register the CPU lacks
//! fails its first read and its domain is left out. Never called from
//! signal context.
//!
//! Registers (Intel SDM vol. 4; AMD PPR for family 17h+):
//!   Intel: unit 0x606 (energy status unit, bits 12:8), package 0x611,
//!          PP0 0x639, PP1 0x641, DRAM 0x619.
//!   AMD:   unit 0xC0010299 (same layout), per-core 0xC001029A, package
//!          0xC001029B.
//! Intel server parts count DRAM in fixed 2^-16 J units whatever the unit
//! register says (the kernel's perf RAPL driver applies the same quirk).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use super::counter::{Access, RawCounter, Wrap};
use super::error::{ReadError, SourceError};
use super::root::{parse_cpu_list, read_text, Fs, Root};
use super::Domain;

pub const INTEL_UNIT: u64 = 0x606;
pub const INTEL_PKG: u64 = 0x611;
pub const INTEL_PP0: u64 = 0x639;
pub const INTEL_PP1: u64 = 0x641;
pub const INTEL_DRAM: u64 = 0x619;
pub const AMD_UNIT: u64 = 0xC001_0299;
pub const AMD_CORE: u64 = 0xC001_029A;
pub const AMD_PKG: u64 = 0xC001_029B;

/// Family-6 Intel models whose DRAM domain counts in 2^-16 J (Haswell-X,
/// Broadwell-X/D, Skylake-X, Ice Lake-X/D, Sapphire/Emerald Rapids, Xeon Phi).
const INTEL_DRAM_FIXED_UNIT_MODELS: [u32; 10] =
    [0x3F, 0x4F, 0x56, 0x55, 0x6A, 0x6C, 0x8F, 0xCF, 0x57, 0x85];
const DRAM_FIXED_JOULES: f64 = 1.0 / 65536.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Intel,
    Amd,
}

/// What `/proc/cpuinfo` says about CPU 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuId {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    pub rapl_flag: bool,
}

pub fn parse_cpuinfo(text: &str) -> CpuId {
    let mut id = CpuId {
        vendor: String::new(),
        family: 0,
        model: 0,
        rapl_flag: false,
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            break; // first processor only
        }
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "vendor_id" => id.vendor = v.to_string(),
            "cpu family" => id.family = v.parse().unwrap_or(0),
            "model" => id.model = v.parse().unwrap_or(0),
            "flags" => id.rapl_flag = v.split_whitespace().any(|f| f == "rapl"),
            _ => {}
        }
    }
    id
}

/// Which register set this CPU has, or why it has none.
pub fn classify(id: &CpuId) -> Result<Vendor, SourceError> {
    match id.vendor.as_str() {
        "GenuineIntel" => Ok(Vendor::Intel),
        "AuthenticAMD" | "HygonGenuine" if id.rapl_flag => Ok(Vendor::Amd),
        "AuthenticAMD" | "HygonGenuine" => Err(SourceError::NotRaplCapable {
            vendor: id.vendor.clone(),
            reason:
                "no `rapl` flag in /proc/cpuinfo (RAPL needs family 17h or later, and a hypervisor that exposes it)",
        }),
        _ => Err(SourceError::NotRaplCapable {
            vendor: if id.vendor.is_empty() {
                "unknown vendor".into()
            } else {
                id.vendor.clone()
            },
            reason: "RAPL registers exist only on Intel and AMD/Hygon x86 CPUs",
        }),
    }
}

/// One CPU per package, and on AMD one per core, from sysfs topology
/// (absent topology files: package 0, core = CPU number).
struct Topology {
    /// package id -> first CPU
    packages: BTreeMap<u32, u32>,
    /// (package, core) -> first CPU
    cores: BTreeMap<(u32, u32), u32>,
}

fn topology(root: &Root, fs: &dyn Fs) -> Result<Topology, SourceError> {
    let online_path = root.join("/sys/devices/system/cpu/online");
    let online =
        read_text(fs, &online_path).map_err(|e| SourceError::from_io(online_path.clone(), &e))?;
    let cpus = parse_cpu_list(&online)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| SourceError::Malformed {
            path: online_path,
            content: online.clone(),
            expected: "a CPU list",
        })?;
    let mut t = Topology {
        packages: BTreeMap::new(),
        cores: BTreeMap::new(),
    };
    for cpu in cpus {
        let topo = |f: &str| -> Option<u32> {
            read_text(
                fs,
                &root.join(&format!("/sys/devices/system/cpu/cpu{cpu}/topology/{f}")),
            )
            .ok()?
            .parse()
            .ok()
        };
        let pkg = topo("physical_package_id").unwrap_or(0);
        let core = topo("core_id").unwrap_or(cpu);
        t.packages.entry(pkg).or_insert(cpu);
        t.cores.entry((pkg, core)).or_insert(cpu);
    }
    Ok(t)
}

fn msr_path(root: &Root, cpu: u32) -> PathBuf {
    root.join(&format!("/dev/cpu/{cpu}/msr"))
}

/// Open `/dev/cpu/<cpu>/msr` for one register.
fn open_reg(
    root: &Root,
    fs: &dyn Fs,
    cpu: u32,
    reg: u64,
    joules: f64,
    domain: Domain,
) -> Result<Result<RawCounter, ReadError>, SourceError> {
    let path = msr_path(root, cpu);
    let fd = fs.open(&path).map_err(|e| SourceError::from_io(path, &e))?;
    let offset = register_offset(&fd, reg);
    Ok(RawCounter::new(
        fd,
        Access::PreadBinary { offset },
        Wrap::Bits32,
        joules,
        domain,
    ))
}

/// Where register `reg` is read: the msr character device takes the
/// register number as the file offset. A regular file (a test's fake
/// device) cannot hold registers one byte apart (AMD's 0xC001029A and
/// 0xC001029B), so there register R sits at byte `8 * R`.
pub fn register_offset(fd: &OwnedFd, reg: u64) -> u64 {
    // SAFETY: st is plain old data the kernel fills; fd is open for the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    if r == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFREG {
        reg * 8
    } else {
        reg
    }
}

/// Joules per count from a unit register value (bits 12:8).
pub fn energy_unit(unit_reg: u64) -> f64 {
    let esu = (unit_reg >> 8) & 0x1f;
    1.0 / (1u64 << esu) as f64
}

fn read_unit(root: &Root, fs: &dyn Fs, cpu: u32, reg: u64, id: &CpuId) -> Result<f64, SourceError> {
    match open_reg(root, fs, cpu, reg, 1.0, Domain::Pkg)? {
        Ok(c) => Ok(energy_unit(c.read_raw().map_err(|_| not_capable(id, reg))?)),
        Err(_) => Err(not_capable(id, reg)),
    }
}

fn not_capable(id: &CpuId, reg: u64) -> SourceError {
    SourceError::NotRaplCapable {
        vendor: id.vendor.clone(),
        reason: if reg == INTEL_UNIT {
            "MSR 0x606 (RAPL power unit) cannot be read"
        } else {
            "MSR 0xC0010299 (RAPL power unit) cannot be read"
        },
    }
}

/// Recognise the CPU and open every RAPL register it has.
pub fn open(root: &Root, fs: &dyn Fs) -> Result<Vec<RawCounter>, SourceError> {
    let cpuinfo_path = root.join("/proc/cpuinfo");
    let cpuinfo =
        read_text(fs, &cpuinfo_path).map_err(|e| SourceError::from_io(cpuinfo_path, &e))?;
    let id = parse_cpuinfo(&cpuinfo);
    let vendor = classify(&id)?;
    let topo = topology(root, fs)?;
    let mut counters = Vec::new();
    for (&pkg, &cpu) in &topo.packages {
        match vendor {
            Vendor::Intel => {
                let unit = read_unit(root, fs, cpu, INTEL_UNIT, &id)?;
                let dram_unit =
                    if id.family == 6 && INTEL_DRAM_FIXED_UNIT_MODELS.contains(&id.model) {
                        DRAM_FIXED_JOULES
                    } else {
                        unit
                    };
                for (reg, domain, joules) in [
                    (INTEL_PKG, Domain::Pkg, unit),
                    (INTEL_PP0, Domain::Pp0, unit),
                    (INTEL_PP1, Domain::Pp1, unit),
                    (INTEL_DRAM, Domain::Dram, dram_unit),
                ] {
                    // A register this model lacks fails its first read: leave it out.
                    if let Ok(c) = open_reg(root, fs, cpu, reg, joules, domain)? {
                        counters.push(c);
                    }
                }
            }
            Vendor::Amd => {
                let unit = read_unit(root, fs, cpu, AMD_UNIT, &id)?;
                if let Ok(c) = open_reg(root, fs, cpu, AMD_PKG, unit, Domain::Pkg)? {
                    counters.push(c);
                }
                // PP0 on AMD is per core: the package's PP0 is their sum.
                for (_, &core_cpu) in topo.cores.range((pkg, 0)..=(pkg, u32::MAX)) {
                    if let Ok(c) = open_reg(root, fs, core_cpu, AMD_CORE, unit, Domain::Pp0)? {
                        counters.push(c);
                    }
                }
            }
        }
    }
    if counters.is_empty() {
        return Err(SourceError::NoDomains {
            path: msr_path(root, 0),
        });
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_field() {
        // Typical Intel value 0xA0E03: ESU = 0xE -> 2^-14 J = 61.035 uJ.
        assert_eq!(energy_unit(0xA0E03), 1.0 / 16384.0);
        // AMD family 17h: 0xA1003 -> ESU 0x10 -> 15.26 uJ.
        assert_eq!(energy_unit(0xA1003), 1.0 / 65536.0);
    }

    #[test]
    fn cpu_classification() {
        let amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nflags\t\t: fpu rapl sse\n\nprocessor : 1\nvendor_id : GenuineIntel\n";
        let id = parse_cpuinfo(amd);
        assert_eq!(
            id,
            CpuId {
                vendor: "AuthenticAMD".into(),
                family: 25,
                model: 1,
                rapl_flag: true
            }
        );
        assert_eq!(classify(&id), Ok(Vendor::Amd));
        let no_flag = CpuId {
            rapl_flag: false,
            ..id
        };
        assert!(matches!(
            classify(&no_flag),
            Err(SourceError::NotRaplCapable { .. })
        ));
        let arm = parse_cpuinfo("processor\t: 0\nBogoMIPS\t: 48.00\n");
        assert!(matches!(
            classify(&arm),
            Err(SourceError::NotRaplCapable { .. })
        ));
        let intel =
            parse_cpuinfo("vendor_id : GenuineIntel\ncpu family : 6\nmodel : 85\nflags : fpu\n");
        assert_eq!(classify(&intel), Ok(Vendor::Intel));
    }
}
