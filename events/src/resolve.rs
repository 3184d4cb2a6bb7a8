//! From a parsed specification to the `perf_event_attr` fields that open
//! it: the kernel's generic event numbers (include/uapi/linux/perf_event.h:
//! `perf_hw_id`, `perf_sw_ids`, `perf_hw_cache_id` and its op and result
//! ids) under perf's names (tools/perf/util/parse-events.c and evsel.c),
//! and a PMU's own description in sysfs
//! (Documentation/ABI/testing/sysfs-bus-event_source-devices-format and
//! -events): `<pmu>/type` is the attr type, each `<pmu>/format/<field>`
//! says which bits of config, config1 or config2 a term sets
//! (`config:0-7,32-35`), each `<pmu>/events/<name>` is a list of terms.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::spec::{Event, Spec, Term};

/// Where the kernel describes its PMUs.
pub const DEVICES: &str = "/sys/bus/event_source/devices";

const TYPE_HARDWARE: u32 = 0;
const TYPE_SOFTWARE: u32 = 1;
const TYPE_HW_CACHE: u32 = 3;
const TYPE_RAW: u32 = 4;

/// The fields of a `perf_event_attr` that a specification decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attr {
    pub type_: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    /// Skid constraint, 0 to 3 (`p` modifiers).
    pub precise_ip: u8,
    /// Whether modifiers chose the privilege levels; then the three
    /// `exclude_*` below are theirs, otherwise the caller decides.
    pub levels_given: bool,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    pub exclude_hv: bool,
}

impl Attr {
    /// A software event the kernel counts only in kernel mode (the
    /// scheduler's, not a user instruction's): with user-only counting it
    /// never counts anything.
    pub fn counts_in_kernel_only(&self) -> bool {
        // context-switches, cpu-migrations, cgroup-switches.
        self.type_ == TYPE_SOFTWARE && matches!(self.config, 3 | 4 | 11)
    }
}

/// Why a specification cannot be resolved here (one line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// Neither a generic event nor a name any PMU's `events/` has.
    UnknownEvent { name: String, devices: PathBuf },
    /// No such PMU directory.
    UnknownPmu { pmu: String, present: Vec<String> },
    /// A term that is neither a format field nor an event of the PMU.
    UnknownTerm {
        pmu: String,
        term: String,
        fields: Vec<String>,
    },
    /// A value wider than its field's bits.
    TooWide { term: String, value: u64, bits: u32 },
    /// An event alias used with a value, or a raw field without one.
    BadTerm { term: String, why: &'static str },
    /// A sysfs file that could not be read or understood.
    Sysfs { path: PathBuf, why: String },
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::UnknownEvent { name, devices } => write!(
                f,
                "'{name}' is not a generic event (perf list hw sw cache) nor an event of a PMU under {} (ls {}/*/events)",
                devices.display(),
                devices.display()
            ),
            ResolveError::UnknownPmu { pmu, present } => {
                write!(f, "no PMU '{pmu}' on this machine (PMUs here: {})", present.join(", "))
            }
            ResolveError::UnknownTerm { pmu, term, fields } => write!(
                f,
                "'{term}' is not a field of PMU {pmu} (fields: {}) nor one of its events",
                fields.join(", ")
            ),
            ResolveError::TooWide { term, value, bits } => {
                write!(f, "{term}={value:#x} does not fit in its {bits} bits")
            }
            ResolveError::BadTerm { term, why } => write!(f, "'{term}': {why}"),
            ResolveError::Sysfs { path, why } => write!(f, "{}: {why}", path.display()),
        }
    }
}

impl std::error::Error for ResolveError {}

const HARDWARE: &[(&str, u64)] = &[
    ("cpu-cycles", 0),
    ("cycles", 0),
    ("instructions", 1),
    ("cache-references", 2),
    ("cache-misses", 3),
    ("branch-instructions", 4),
    ("branches", 4),
    ("branch-misses", 5),
    ("bus-cycles", 6),
    ("stalled-cycles-frontend", 7),
    ("idle-cycles-frontend", 7),
    ("stalled-cycles-backend", 8),
    ("idle-cycles-backend", 8),
    ("ref-cycles", 9),
];

const SOFTWARE: &[(&str, u64)] = &[
    ("cpu-clock", 0),
    ("task-clock", 1),
    ("page-faults", 2),
    ("faults", 2),
    ("context-switches", 3),
    ("cs", 3),
    ("cpu-migrations", 4),
    ("migrations", 4),
    ("minor-faults", 5),
    ("major-faults", 6),
    ("alignment-faults", 7),
    ("emulation-faults", 8),
    ("dummy", 9),
    ("bpf-output", 10),
    ("cgroup-switches", 11),
];

/// perf's names of the hardware caches, operations and results, by id.
const CACHES: &[&[&str]] = &[
    &["L1-dcache", "l1-d", "l1d", "L1-data"],
    &["L1-icache", "l1-i", "l1i", "L1-instruction"],
    &["LLC", "L2"],
    &["dTLB", "d-tlb", "Data-TLB"],
    &["iTLB", "i-tlb", "Instruction-TLB"],
    &["branch", "branches", "bpu", "btb", "bpc"],
    &["node"],
];
const OPS: &[&[&str]] = &[
    &["load", "loads", "read"],
    &["store", "stores", "write"],
    &[
        "prefetch",
        "prefetches",
        "speculative-read",
        "speculative-load",
    ],
];
const RESULTS: &[&[&str]] = &[&["refs", "Reference", "ops", "access"], &["misses", "miss"]];

fn id_in(table: &[&[&str]], word: &str) -> Option<u64> {
    table
        .iter()
        .position(|names| names.iter().any(|n| n.eq_ignore_ascii_case(word)))
        .map(|i| i as u64)
}

/// A hardware cache event name (`L1-dcache-load-misses`, `LLC-loads`,
/// `dTLB-misses`): config = cache | op << 8 | result << 16, the op read and
/// the result access when not named (perf's rule).
fn cache_event(name: &str) -> Option<u64> {
    let (cache, rest) = CACHES
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (i, n)))
        .filter(|(_, n)| name.len() >= n.len() && name[..n.len()].eq_ignore_ascii_case(n))
        .filter_map(|(i, n)| {
            let rest = &name[n.len()..];
            (rest.is_empty() || rest.starts_with('-')).then_some((i as u64, rest))
        })
        .max_by_key(|(_, rest)| core::cmp::Reverse(rest.len()))?;
    let (mut op, mut result) = (None, None);
    for word in rest.split('-').filter(|w| !w.is_empty()) {
        match (id_in(OPS, word), id_in(RESULTS, word)) {
            (Some(o), _) if op.is_none() => op = Some(o),
            (None, Some(r)) if result.is_none() => result = Some(r),
            _ => return None,
        }
    }
    Some(cache | op.unwrap_or(0) << 8 | result.unwrap_or(0) << 16)
}

/// The attr fields of `spec`, PMUs read from `devices` (normally [`DEVICES`]).
pub fn resolve(spec: &Spec, devices: &Path) -> Result<Attr, ResolveError> {
    let mut attr = match &spec.event {
        Event::Raw(config) => Attr {
            type_: TYPE_RAW,
            config: *config,
            ..Attr::default()
        },
        Event::Named(name) => named(name, devices)?,
        Event::Pmu { pmu, terms } => pmu_attr(devices, pmu, terms)?,
    };
    attr.precise_ip = spec.precise;
    if spec.user || spec.kernel || spec.hv {
        attr.levels_given = true;
        attr.exclude_user = !spec.user;
        attr.exclude_kernel = !spec.kernel;
        attr.exclude_hv = !spec.hv;
    }
    Ok(attr)
}

fn named(name: &str, devices: &Path) -> Result<Attr, ResolveError> {
    let find = |table: &[(&str, u64)]| {
        table
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, c)| c)
    };
    if let Some(config) = find(HARDWARE) {
        return Ok(Attr {
            type_: TYPE_HARDWARE,
            config,
            ..Attr::default()
        });
    }
    if let Some(config) = find(SOFTWARE) {
        return Ok(Attr {
            type_: TYPE_SOFTWARE,
            config,
            ..Attr::default()
        });
    }
    if let Some(config) = cache_event(name) {
        return Ok(Attr {
            type_: TYPE_HW_CACHE,
            config,
            ..Attr::default()
        });
    }
    // An event a PMU names: the CPU's first, then the others by name.
    let mut pmus = pmu_names(devices);
    pmus.sort_by_key(|p| (p != "cpu", p.clone()));
    for pmu in pmus {
        if devices.join(&pmu).join("events").join(name).is_file() {
            let alias = [Term {
                name: name.to_string(),
                value: None,
            }];
            return pmu_attr(devices, &pmu, &alias);
        }
    }
    Err(ResolveError::UnknownEvent {
        name: name.to_string(),
        devices: devices.to_path_buf(),
    })
}

/// The names in directory `dir`, sorted (none if it cannot be read).
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn pmu_names(devices: &Path) -> Vec<String> {
    names_in(devices)
}

fn read(path: &Path) -> Result<String, ResolveError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| ResolveError::Sysfs {
            path: path.to_path_buf(),
            why: e.to_string(),
        })
}

fn pmu_attr(devices: &Path, pmu: &str, terms: &[Term]) -> Result<Attr, ResolveError> {
    let dir = devices.join(pmu);
    if !dir.is_dir() {
        return Err(ResolveError::UnknownPmu {
            pmu: pmu.to_string(),
            present: pmu_names(devices),
        });
    }
    let type_path = dir.join("type");
    let type_ = read(&type_path)?.parse().map_err(|_| ResolveError::Sysfs {
        path: type_path.clone(),
        why: "not a PMU type number".into(),
    })?;
    let mut attr = Attr {
        type_,
        ..Attr::default()
    };
    for t in terms {
        apply(&dir, pmu, t, &mut attr, true)?;
    }
    Ok(attr)
}

/// Sets the bits term `t` stands for; `aliases`: whether it may be one of
/// the PMU's events (whose own terms may not be events again).
fn apply(
    dir: &Path,
    pmu: &str,
    t: &Term,
    attr: &mut Attr,
    aliases: bool,
) -> Result<(), ResolveError> {
    let raw = match t.name.as_str() {
        "config" => Some(&mut attr.config),
        "config1" => Some(&mut attr.config1),
        "config2" => Some(&mut attr.config2),
        _ => None,
    };
    if let Some(field) = raw {
        *field = t.value.ok_or(ResolveError::BadTerm {
            term: t.name.clone(),
            why: "needs a value (config=0x...)",
        })?;
        return Ok(());
    }
    let format = dir.join("format").join(&t.name);
    if format.is_file() {
        let ranges = format_ranges(&format)?;
        return pack(attr, &ranges, t.value.unwrap_or(1), &t.name);
    }
    let event = dir.join("events").join(&t.name);
    if aliases && event.is_file() {
        if t.value.is_some() {
            return Err(ResolveError::BadTerm {
                term: t.name.clone(),
                why: "an event of the PMU takes no value",
            });
        }
        let text = read(&event)?;
        let spec =
            crate::spec::parse(&format!("{pmu}/{text}/")).map_err(|e| ResolveError::Sysfs {
                path: event.clone(),
                why: e.why,
            })?;
        let Event::Pmu { terms, .. } = spec.event else {
            unreachable!("a pmu/terms/ text parses as a PMU event")
        };
        for inner in &terms {
            apply(dir, pmu, inner, attr, false)?;
        }
        return Ok(());
    }
    Err(ResolveError::UnknownTerm {
        pmu: pmu.to_string(),
        term: t.name.clone(),
        fields: names_in(&dir.join("format")),
    })
}

/// Which attr word a format field writes, and its bit ranges (inclusive).
#[derive(Debug, PartialEq, Eq)]
struct Ranges {
    word: u8,
    bits: Vec<(u32, u32)>,
}

/// Parses a format file: `config:0-7,32-35`, `config1:0-63`, `config:21`.
fn format_ranges(path: &Path) -> Result<Ranges, ResolveError> {
    let text = read(path)?;
    parse_format(&text).ok_or_else(|| ResolveError::Sysfs {
        path: path.to_path_buf(),
        why: format!("'{text}' is not a format (config:LO-HI,...)"),
    })
}

fn parse_format(text: &str) -> Option<Ranges> {
    let (word, list) = text.split_once(':')?;
    let word = match word {
        "config" => 0,
        "config1" => 1,
        "config2" => 2,
        _ => return None,
    };
    let bits = list
        .split(',')
        .map(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            let (lo, hi): (u32, u32) = (lo.parse().ok()?, hi.parse().ok()?);
            (lo <= hi && hi < 64).then_some((lo, hi))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Ranges { word, bits })
}

/// Puts `value` into the ranges, its low bits into the first range.
fn pack(attr: &mut Attr, r: &Ranges, value: u64, term: &str) -> Result<(), ResolveError> {
    let width: u32 = r.bits.iter().map(|(lo, hi)| hi - lo + 1).sum();
    if width < 64 && value >> width != 0 {
        return Err(ResolveError::TooWide {
            term: term.to_string(),
            value,
            bits: width,
        });
    }
    let word = match r.word {
        0 => &mut attr.config,
        1 => &mut attr.config1,
        _ => &mut attr.config2,
    };
    let mut v = value;
    for &(lo, hi) in &r.bits {
        let n = hi - lo + 1;
        let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        *word = (*word & !(mask << lo)) | ((v & mask) << lo);
        v = if n == 64 { 0 } else { v >> n };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    fn fixtures(machine: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/sysfs")
            .join(machine)
    }

    fn attr(spec: &str, machine: &str) -> Result<Attr, ResolveError> {
        resolve(&parse(spec).unwrap(), &fixtures(machine))
    }

    fn tc(type_: u32, config: u64) -> (u32, u64) {
        (type_, config)
    }

    #[test]
    fn generic_events_have_the_kernels_numbers() {
        let a = |s| attr(s, "intel").map(|a| (a.type_, a.config)).unwrap();
        assert_eq!(a("cycles"), tc(0, 0));
        assert_eq!(a("instructions"), tc(0, 1));
        assert_eq!(a("branch-misses"), tc(0, 5));
        assert_eq!(a("stalled-cycles-backend"), tc(0, 8));
        assert_eq!(a("ref-cycles"), tc(0, 9));
        assert_eq!(a("task-clock"), tc(1, 1));
        assert_eq!(a("page-faults"), tc(1, 2));
        assert_eq!(a("cs"), tc(1, 3));
        assert_eq!(a("minor-faults"), tc(1, 5));
        assert_eq!(a("major-faults"), tc(1, 6));
        assert_eq!(a("r01c2"), tc(4, 0x1c2));
    }

    #[test]
    fn cache_events_follow_perfs_rule() {
        let a = |s| attr(s, "intel").map(|a| (a.type_, a.config)).unwrap();
        // cache | op << 8 | result << 16
        assert_eq!(a("L1-dcache-loads"), tc(3, 0));
        assert_eq!(a("L1-dcache-load-misses"), tc(3, 0x10000));
        assert_eq!(a("L1-dcache-stores"), tc(3, 0x100));
        assert_eq!(a("L1-icache-load-misses"), tc(3, 0x10001));
        assert_eq!(a("LLC-load-misses"), tc(3, 0x10002));
        assert_eq!(a("LLC-store-misses"), tc(3, 0x10102));
        assert_eq!(a("dTLB-load-misses"), tc(3, 0x10003));
        assert_eq!(a("iTLB-load-misses"), tc(3, 0x10004));
        assert_eq!(a("branch-load-misses"), tc(3, 0x10005));
        assert_eq!(a("node-loads"), tc(3, 0x6));
        assert_eq!(a("L1-dcache-prefetch-misses"), tc(3, 0x10200));
        // No op: read; no result: access.
        assert_eq!(a("dTLB-misses"), tc(3, 0x10003));
        assert_eq!(a("LLC"), tc(3, 2));
        assert!(attr("L1-dcache-load-load", "intel").is_err());
    }

    #[test]
    fn intel_pmu_terms_and_aliases() {
        // tests/sysfs/intel: arch/x86/events/intel/core.c's formats, and the
        // events x86_event_sysfs_show prints from intel_perfmon_event_map.
        let a = attr("cpu/event=0xc0,umask=0x01/", "intel").unwrap();
        assert_eq!((a.type_, a.config), (4, 0x01c0));
        let a = attr("cpu/event=0x3c,edge,inv,cmask=2/", "intel").unwrap();
        assert_eq!(a.config, 0x3c | 1 << 18 | 1 << 23 | 2 << 24);
        let a = attr("cpu/cache-misses/", "intel").unwrap();
        assert_eq!(a.config, 0x412e);
        let a = attr("cpu/event=0xb7,umask=0x1,offcore_rsp=0x10001/", "intel").unwrap();
        assert_eq!((a.config, a.config1), (0x01b7, 0x10001));
        let a = attr("cpu/mem-loads/pp", "intel").unwrap();
        assert_eq!((a.config, a.config1, a.precise_ip), (0x01cd, 3, 2));
        let a = attr("cpu/config=0x1234,config1=5/u", "intel").unwrap();
        assert_eq!(
            (a.config, a.config1, a.exclude_kernel, a.exclude_user),
            (0x1234, 5, true, false)
        );
        // A bare name that only a PMU knows.
        let a = attr("mem-stores", "intel").unwrap();
        assert_eq!((a.type_, a.config), (4, 0x82d0));
    }

    #[test]
    fn amd_event_field_is_split() {
        // tests/sysfs/amd: arch/x86/events/amd/core.c's formats
        // ("config:0-7,32-35"), events from amd_zen2_perfmon_event_map.
        let a = attr("cpu/event=0x1c0/", "amd").unwrap();
        assert_eq!(a.config, 0xc0 | 1 << 32);
        let a = attr("cpu/event=0xfff,umask=0xff/", "amd").unwrap();
        assert_eq!(a.config, 0xff | 0xff << 8 | 0xf << 32);
        assert_eq!(
            attr("cpu/event=0x1000/", "amd").unwrap_err(),
            ResolveError::TooWide {
                term: "event".into(),
                value: 0x1000,
                bits: 12
            }
        );
        assert_eq!(attr("cpu/cache-misses/", "amd").unwrap().config, 0x0964);
        assert_eq!(attr("cpu/cpu-cycles/", "amd").unwrap().config, 0x76);
    }

    #[test]
    fn mistakes_name_what_is_there() {
        let e = attr("cpu/evnt=1/", "intel").unwrap_err().to_string();
        assert!(
            e.contains("'evnt' is not a field of PMU cpu (fields: any, cmask, edge"),
            "{e}"
        );
        let e = attr("gpu/event=1/", "intel").unwrap_err().to_string();
        assert!(
            e.contains("no PMU 'gpu' on this machine (PMUs here: cpu, msr, software"),
            "{e}"
        );
        let e = attr("cache-misss", "intel").unwrap_err().to_string();
        assert!(e.contains("'cache-misss' is not a generic event"), "{e}");
        let e = attr("cpu/cache-misses=3/", "intel")
            .unwrap_err()
            .to_string();
        assert!(e.contains("takes no value"), "{e}");
        let e = attr("cpu/config/", "intel").unwrap_err().to_string();
        assert!(e.contains("needs a value"), "{e}");
    }

    #[test]
    fn levels_follow_the_modifiers() {
        let a = attr("cycles", "intel").unwrap();
        assert!(!a.levels_given);
        let a = attr("cycles:u", "intel").unwrap();
        assert!(a.levels_given && !a.exclude_user && a.exclude_kernel && a.exclude_hv);
        let a = attr("cycles:uk", "intel").unwrap();
        assert!(!a.exclude_user && !a.exclude_kernel && a.exclude_hv);
        assert!(attr("context-switches", "intel")
            .unwrap()
            .counts_in_kernel_only());
        assert!(!attr("page-faults", "intel")
            .unwrap()
            .counts_in_kernel_only());
    }

    #[test]
    fn formats_parse() {
        assert_eq!(
            parse_format("config:0-7,32-35"),
            Some(Ranges {
                word: 0,
                bits: vec![(0, 7), (32, 35)]
            })
        );
        assert_eq!(
            parse_format("config1:0-63"),
            Some(Ranges {
                word: 1,
                bits: vec![(0, 63)]
            })
        );
        assert_eq!(
            parse_format("config:21"),
            Some(Ranges {
                word: 0,
                bits: vec![(21, 21)]
            })
        );
        assert_eq!(parse_format("config3:1"), None);
        assert_eq!(parse_format("config:7-0"), None);
        assert_eq!(parse_format("config:0-64"), None);
    }
}
