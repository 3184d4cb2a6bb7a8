//! AMD Instruction-Based Sampling: what one sample's registers say.
//!
//! An IBS op sample is the op's registers as the hardware latched them
//! (the kernel hands them over raw, `PERF_SAMPLE_RAW`): IbsOpCtl, IbsOpRip,
//! IbsOpData, IbsOpData2, IbsOpData3, IbsDcLinAd, IbsDcPhysAd; a fetch
//! sample: IbsFetchCtl, IbsFetchLinAd, IbsFetchPhysAd, and on newer parts
//! IcIbsExtdCtl. [`decode_op`] and [`decode_fetch`] turn them into what a
//! profile counts, honouring every validity bit: an address or a latency
//! the hardware did not mark valid is None, never a number.
//!
//! Bit layouts: the kernel's `arch/x86/include/asm/amd/ibs.h` (from AMD's
//! PPR Vol 1 for Family 19h Model 01h B1, 55898 Rev 0.35), the same for
//! families 17h, 19h and 1Ah but for IbsOpData2's data source: three bits
//! on families 17h and 19h before Zen 4 ([`DataSource::from_legacy`]), five
//! (`data_src_hi` at bits 6-7 on top) from Zen 4 on
//! ([`DataSource::from_extended`]), with the PPR's values as the kernel's
//! `IBS_DATA_SRC_*` and `IBS_DATA_SRC_EXT_*` name them.
//!
//! Also: the kernel's raw sample layout ([`op_from_raw`],
//! [`fetch_from_raw`]), igprof's `-ibs`/`-ibs-fetch` options
//! ([`parse_request`]) and what the `ibs_op`/`ibs_fetch` PMUs offer
//! ([`discover`]), read from a sysfs tree given as a directory.
//!
//! Owns: the decoding. Must never: guess a field its valid bit denies.

/// Where a load's data came from (IbsOpData2), for a load that missed
/// the data cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// The local L3, or another core's L1/L2 in the same CCX.
    LocalCache,
    /// Another CCX's cache in the same NUMA node (extended only).
    NearCache,
    /// A cache in another node (legacy: "remote cache"; extended: another
    /// CCX's cache in a different node).
    RemoteCache,
    Dram,
    /// Long-latency memory (persistent memory; extended only).
    Pmem,
    /// MMIO, configuration or I/O space.
    Io,
    /// Extension memory (CXL; extended only).
    ExtensionMemory,
    /// Peer agent memory (extended only).
    PeerAgentMemory,
    /// No valid status, or a value the PPR reserves.
    Unknown,
}

impl DataSource {
    /// Families 17h and 19h before Zen 4: IbsOpData2 bits 0-2.
    pub fn from_legacy(data2: u64) -> DataSource {
        match data2 & 7 {
            2 => DataSource::LocalCache,
            3 => DataSource::Dram,
            4 => DataSource::RemoteCache,
            7 => DataSource::Io,
            _ => DataSource::Unknown,
        }
    }

    /// Zen 4 and later (family 19h model 10h+, family 1Ah): bits 0-2 and
    /// 6-7 together.
    pub fn from_extended(data2: u64) -> DataSource {
        match (data2 & 7) | ((data2 >> 6) & 3) << 3 {
            1 => DataSource::LocalCache,
            2 => DataSource::NearCache,
            3 => DataSource::Dram,
            5 => DataSource::RemoteCache,
            6 => DataSource::Pmem,
            7 => DataSource::Io,
            8 => DataSource::ExtensionMemory,
            12 => DataSource::PeerAgentMemory,
            _ => DataSource::Unknown,
        }
    }

    /// Whether the data came from another NUMA node's cache or memory.
    pub fn is_remote(self) -> bool {
        self == DataSource::RemoteCache
    }
}

/// Which IbsOpData2 data-source encoding the CPU uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Families 17h and 19h before Zen 4.
    Legacy,
    /// Zen 4 and later.
    Extended,
}

/// The raw registers of one op sample, in the order the kernel's raw
/// record gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpRegs {
    pub ctl: u64,
    pub rip: u64,
    pub data: u64,
    pub data2: u64,
    pub data3: u64,
    pub dc_lin_ad: u64,
    pub dc_phys_ad: u64,
}

/// What an op sample says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// The op's instruction (None: IbsOpRip marked invalid).
    pub rip: Option<u64>,
    /// Cycles from the op's tag to its retirement, and from completion to
    /// retirement.
    pub tag_to_retire: u16,
    pub completion_to_retire: u16,
    pub load: bool,
    pub store: bool,
    /// Bytes the load or store accessed (IbsOpData3 op_mem_width), if said.
    pub width: Option<u8>,
    pub dc_miss: bool,
    pub l2_miss: bool,
    pub dtlb_l1_miss: bool,
    pub dtlb_l2_miss: bool,
    pub locked: bool,
    pub uncacheable: bool,
    pub misaligned: bool,
    pub software_prefetch: bool,
    /// The data's linear and physical addresses, where marked valid.
    pub data_address: Option<u64>,
    pub physical_address: Option<u64>,
    /// Cycles a load that missed the data cache waited (valid only then).
    pub miss_latency: Option<u16>,
    /// Cycles of the L1 TLB refill, for an op that missed the L1 DTLB.
    pub tlb_refill_latency: Option<u16>,
    /// Where a load that missed the data cache got its data.
    pub source: Option<DataSource>,
    /// The data came from another NUMA node (IbsOpData2 `rmt_node`, bit
    /// 4), for a load that missed the data cache.
    pub remote_node: bool,
    /// The line was found modified in another core's cache (a cache hit
    /// state of M for a load served by a cache): the false-sharing hint.
    pub hitm: bool,
    pub branch: Branch,
}

/// What IbsOpData says of a branch op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Branch {
    pub retired: bool,
    pub taken: bool,
    pub mispredicted: bool,
    pub returned: bool,
}

fn bit(v: u64, n: u32) -> bool {
    v >> n & 1 == 1
}

fn field(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1 << width) - 1)
}

/// Decodes an op sample; None when IbsOpCtl does not mark it valid
/// (`op_val`, bit 18).
pub fn decode_op(r: &OpRegs, encoding: Encoding) -> Option<Op> {
    if !bit(r.ctl, 18) {
        return None;
    }
    let (d1, d2, d3) = (r.data, r.data2, r.data3);
    let load = bit(d3, 0);
    let dc_miss = bit(d3, 7);
    let dtlb_l1_miss = bit(d3, 2);
    let width = field(d3, 22, 4) as u8;
    let missed_load = load && dc_miss;
    let source = missed_load.then(|| match encoding {
        Encoding::Legacy => DataSource::from_legacy(d2),
        Encoding::Extended => DataSource::from_extended(d2),
    });
    let from_cache = matches!(
        source,
        Some(DataSource::LocalCache | DataSource::NearCache | DataSource::RemoteCache)
    );
    Some(Op {
        rip: (!bit(d1, 38)).then_some(r.rip),
        tag_to_retire: field(d1, 16, 16) as u16,
        completion_to_retire: field(d1, 0, 16) as u16,
        load,
        store: bit(d3, 1),
        width: (width != 0).then_some(width),
        dc_miss,
        l2_miss: bit(d3, 20),
        dtlb_l1_miss,
        dtlb_l2_miss: bit(d3, 3),
        locked: bit(d3, 15),
        uncacheable: bit(d3, 14),
        misaligned: bit(d3, 8),
        software_prefetch: bit(d3, 21),
        data_address: bit(d3, 17).then_some(r.dc_lin_ad),
        physical_address: bit(d3, 18).then_some(r.dc_phys_ad),
        miss_latency: missed_load.then_some(field(d3, 32, 16) as u16),
        tlb_refill_latency: dtlb_l1_miss.then_some(field(d3, 48, 16) as u16),
        source,
        remote_node: missed_load && bit(d2, 4),
        // cache_hit_st (bit 5): 0 means the line was in state M.
        hitm: from_cache && !bit(d2, 5),
        branch: Branch {
            retired: bit(d1, 37),
            taken: bit(d1, 35),
            mispredicted: bit(d1, 36),
            returned: bit(d1, 34),
        },
    })
}

/// The raw registers of one fetch sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchRegs {
    pub ctl: u64,
    pub lin_ad: u64,
    pub phys_ad: u64,
    /// IcIbsExtdCtl (0 where the part has none).
    pub extd_ctl: u64,
}

/// What a fetch sample says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch {
    /// The fetched address (IbsFetchLinAd).
    pub address: u64,
    pub physical_address: Option<u64>,
    /// Whether the fetch completed (the latency and misses below are
    /// those of a completed fetch).
    pub completed: bool,
    pub latency: u16,
    pub ic_miss: bool,
    pub itlb_l1_miss: bool,
    pub itlb_l2_miss: bool,
    /// Page size of the L1 ITLB entry: 4 KiB, 2 MiB, 1 GiB (None: 3).
    pub page_size: Option<u64>,
    pub l2_miss: bool,
    pub l3_miss: bool,
    /// Cycles of the ITLB refill (IcIbsExtdCtl), for an L1 ITLB miss.
    pub itlb_refill_latency: Option<u16>,
}

/// Decodes a fetch sample; None when IbsFetchCtl does not mark it valid
/// (`fetch_val`, bit 49).
pub fn decode_fetch(r: &FetchRegs) -> Option<Fetch> {
    let c = r.ctl;
    if !bit(c, 49) {
        return None;
    }
    let itlb_l1_miss = bit(c, 55);
    Some(Fetch {
        address: r.lin_ad,
        physical_address: bit(c, 52).then_some(r.phys_ad),
        completed: bit(c, 50),
        latency: field(c, 32, 16) as u16,
        ic_miss: bit(c, 51),
        itlb_l1_miss,
        itlb_l2_miss: bit(c, 56),
        page_size: match field(c, 53, 2) {
            0 => Some(4 << 10),
            1 => Some(2 << 20),
            2 => Some(1 << 30),
            _ => None,
        },
        // fetch_l2_miss and fetch_l3_miss are meaningful for a completed fetch.
        l2_miss: bit(c, 50) && bit(c, 58),
        l3_miss: bit(c, 50) && bit(c, 61),
        itlb_refill_latency: (itlb_l1_miss && r.extd_ctl != 0)
            .then_some(field(r.extd_ctl, 0, 16) as u16),
    })
}

/// `ibs_caps` bits the kernel puts first in the raw sample
/// (`arch/x86/include/asm/amd/ibs.h`, `IBS_CAPS_*`): with these, more
/// registers follow the fixed ones.
const CAPS_BRNTRGT: u32 = 1 << 5;
const CAPS_FETCHCTLEXTD: u32 = 1 << 9;
const CAPS_OPDATA4: u32 = 1 << 10;

/// The u32 `ibs_caps` and the u64 registers after it.
fn raw_regs(raw: &[u8]) -> Option<(u32, impl Iterator<Item = u64> + '_)> {
    let caps = u32::from_ne_bytes(raw.get(..4)?.try_into().ok()?);
    let regs = raw[4..]
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])));
    Some((caps, regs))
}

/// An op sample's registers from the data of its `PERF_SAMPLE_RAW` field,
/// as `perf_ibs_handle_irq()` (`arch/x86/events/amd/ibs.c`) lays it out:
/// the u32 `ibs_caps`, then IbsOpCtl, IbsOpRip, IbsOpData, IbsOpData2,
/// IbsOpData3, IbsDcLinAd, IbsDcPhysAd (then IbsBrTarget and IbsOpData4
/// where the caps say, not used here). None if shorter.
pub fn op_from_raw(raw: &[u8]) -> Option<OpRegs> {
    let (caps, mut r) = raw_regs(raw)?;
    let extra = (caps & CAPS_BRNTRGT != 0) as usize + (caps & CAPS_OPDATA4 != 0) as usize;
    if raw.len() < 4 + 8 * (7 + extra) {
        return None;
    }
    Some(OpRegs {
        ctl: r.next()?,
        rip: r.next()?,
        data: r.next()?,
        data2: r.next()?,
        data3: r.next()?,
        dc_lin_ad: r.next()?,
        dc_phys_ad: r.next()?,
    })
}

/// A fetch sample's registers from its raw data: `ibs_caps`, IbsFetchCtl,
/// IbsFetchLinAd, IbsFetchPhysAd, and IcIbsExtdCtl where the caps have
/// `IBS_CAPS_FETCHCTLEXTD`. None if shorter.
pub fn fetch_from_raw(raw: &[u8]) -> Option<FetchRegs> {
    let (caps, mut r) = raw_regs(raw)?;
    let extd = caps & CAPS_FETCHCTLEXTD != 0;
    if raw.len() < 4 + 8 * (3 + extd as usize) {
        return None;
    }
    Some(FetchRegs {
        ctl: r.next()?,
        lin_ad: r.next()?,
        phys_ad: r.next()?,
        extd_ctl: if extd { r.next()? } else { 0 },
    })
}

/// Which IBS unit samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Op sampling (`-ibs`, PMU `ibs_op`).
    Op,
    /// Fetch sampling (`-ibs-fetch`, PMU `ibs_fetch`).
    Fetch,
}

impl Unit {
    /// The PMU's name in sysfs.
    pub fn pmu(self) -> &'static str {
        match self {
            Unit::Op => "ibs_op",
            Unit::Fetch => "ibs_fetch",
        }
    }

    /// igprof's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Unit::Op => "-ibs",
            Unit::Fetch => "-ibs-fetch",
        }
    }

    /// The filters and controls a user may ask for, as the kernel's
    /// format files name them.
    fn terms(self) -> &'static [&'static str] {
        match self {
            Unit::Op => &["cnt_ctl", "l3missonly", "ldlat"],
            Unit::Fetch => &["rand_en", "l3missonly"],
        }
    }
}

/// Samples per period when none is given: one in 1,000,000 cycles (or
/// dispatched ops with `cnt_ctl`; fetches for `-ibs-fetch`).
pub const DEFAULT_PERIOD: u64 = 1_000_000;
/// The smallest period taken: shorter ones flood the handler.
pub const MIN_PERIOD: u64 = 4096;

/// An `-ibs[:TERMS][/PERIOD]` or `-ibs-fetch[:TERMS][/PERIOD]` option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub unit: Unit,
    /// `name` or `name=value` terms, as given.
    pub terms: Vec<(String, Option<u64>)>,
    pub period: u64,
}

impl Request {
    /// The event specification that [`crate::resolve`] turns into the
    /// attr, with `swfilt=1` (user-mode samples only) where asked.
    pub fn spec(&self, swfilt: bool) -> String {
        let mut t: Vec<String> = self
            .terms
            .iter()
            .map(|(n, v)| format!("{n}={}", v.unwrap_or(1)))
            .collect();
        if swfilt {
            t.push("swfilt=1".into());
        }
        format!("{}/{}/", self.unit.pmu(), t.join(","))
    }
}

/// Parses an `-ibs` or `-ibs-fetch` option word; Err says what is wrong
/// and what is accepted.
pub fn parse_request(word: &str) -> Result<Request, String> {
    let (unit, rest) = if let Some(r) = word.strip_prefix("-ibs-fetch") {
        (Unit::Fetch, r)
    } else if let Some(r) = word.strip_prefix("-ibs") {
        (Unit::Op, r)
    } else {
        return Err(format!("'{word}' is not an -ibs or -ibs-fetch option"));
    };
    let (rest, period) = match rest.split_once('/') {
        Some((r, p)) => {
            let p = parse_number(p)
                .filter(|&p| p >= MIN_PERIOD && p % 16 == 0)
                .ok_or_else(|| {
                    format!(
                        "{}: period '{p}' must be a multiple of 16 (the IBS counter's low 4 bits are not programmable) of at least {MIN_PERIOD}",
                        unit.flag()
                    )
                })?;
            (r, p)
        }
        None => (rest, DEFAULT_PERIOD),
    };
    let mut terms = Vec::new();
    if !rest.is_empty() {
        let Some(list) = rest.strip_prefix(':') else {
            return Err(format!(
                "'{word}': expected {}[:TERM,...][/PERIOD]",
                unit.flag()
            ));
        };
        for t in list.split(',') {
            let (name, value) = match t.split_once('=') {
                Some((n, v)) => (
                    n,
                    Some(parse_number(v).ok_or_else(|| {
                        format!("{}: term '{t}': '{v}' is not a number", unit.flag())
                    })?),
                ),
                None => (t, None),
            };
            if !unit.terms().contains(&name) {
                return Err(format!(
                    "{}: unknown term '{name}' (it takes {}; user-mode filtering, swfilt, is set by igprof where the kernel has it)",
                    unit.flag(),
                    unit.terms().join(", ")
                ));
            }
            if name == "ldlat" {
                // The kernel's rule (perf_ibs_init): 128 to 2048 cycles, by 128.
                match value {
                    Some(v) if (128..=2048).contains(&v) && v % 128 == 0 => {}
                    _ => {
                        return Err(format!(
                        "{}: ldlat=N takes a load latency of 128 to 2048 cycles, a multiple of 128",
                        unit.flag()
                    ))
                    }
                }
            } else if value.is_some_and(|v| v > 1) {
                return Err(format!("{}: '{name}' is a flag (0 or 1)", unit.flag()));
            }
            terms.push((name.to_string(), value));
        }
    }
    Ok(Request {
        unit,
        terms,
        period,
    })
}

fn parse_number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// What an IBS PMU of this machine offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pmu {
    /// `format/swfilt`: the kernel filters samples by privilege level in
    /// software (Linux 6.14+), so user-mode-only sampling is allowed at
    /// `perf_event_paranoid` 2.
    pub swfilt: bool,
    /// Which IbsOpData2 data-source encoding (`caps/zen4_ibs_extensions`).
    pub encoding: Encoding,
}

/// Why an IBS PMU is not there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// No `DEVICES/ibs_op` (or `ibs_fetch`): not an AMD CPU with IBS, or
    /// a virtual machine that does not pass it through.
    NoPmu,
    /// The PMU is there but a term asked for is not in its `format/`.
    NoTerm(String),
}

/// Reads what the PMU of `unit` offers under `devices` (sysfs's
/// `/sys/bus/event_source/devices`, or a fake tree), and checks that it
/// has every term `req` uses.
pub fn discover(devices: &std::path::Path, req: &Request) -> Result<Pmu, Missing> {
    let dir = devices.join(req.unit.pmu());
    if !dir.join("type").is_file() {
        return Err(Missing::NoPmu);
    }
    let format = dir.join("format");
    if let Some((n, _)) = req.terms.iter().find(|(n, _)| !format.join(n).is_file()) {
        return Err(Missing::NoTerm(n.clone()));
    }
    let zen4 = std::fs::read_to_string(dir.join("caps/zen4_ibs_extensions"))
        .is_ok_and(|v| v.trim() == "1");
    Ok(Pmu {
        swfilt: format.join("swfilt").is_file(),
        encoding: if zen4 {
            Encoding::Extended
        } else {
            Encoding::Legacy
        },
    })
}

#[cfg(test)]
mod tests {
    //! Raw values built bit by bit from the layouts of
    //! `arch/x86/include/asm/amd/ibs.h` (each field named at its bit), and
    //! the data-source values of the PPR as that header names them.
    use super::*;

    const OP_VAL: u64 = 1 << 18;

    fn op(data: u64, data2: u64, data3: u64) -> OpRegs {
        OpRegs {
            ctl: OP_VAL,
            rip: 0x5555_0000_1234,
            data,
            data2,
            data3,
            dc_lin_ad: 0x7f00_dead_beef,
            dc_phys_ad: 0x1_2345_6780,
        }
    }

    #[test]
    fn an_op_not_marked_valid_says_nothing() {
        let mut r = op(0, 0, 0);
        r.ctl = 0;
        assert_eq!(decode_op(&r, Encoding::Legacy), None);
    }

    #[test]
    fn a_load_that_missed_to_dram() {
        // IbsOpData: tag_to_ret_ctr (16-31) 300, comp_to_ret_ctr (0-15) 12.
        let d1 = 300 << 16 | 12;
        // IbsOpData2: data_src_lo 3 (DRAM).
        let d2 = 3;
        // IbsOpData3: ld_op (0), dc_miss (7), dc_lin_addr_valid (17),
        // dc_phy_addr_valid (18), l2_miss (20), op_mem_width (22-25) 8,
        // dc_miss_lat (32-47) 250.
        let d3 = 1 | 1 << 7 | 1 << 17 | 1 << 18 | 1 << 20 | 8 << 22 | 250 << 32;
        let o = decode_op(&op(d1, d2, d3), Encoding::Legacy).unwrap();
        assert_eq!(o.rip, Some(0x5555_0000_1234));
        assert_eq!((o.tag_to_retire, o.completion_to_retire), (300, 12));
        assert!(o.load && !o.store && o.dc_miss && o.l2_miss);
        assert_eq!(o.width, Some(8));
        assert_eq!(o.data_address, Some(0x7f00_dead_beef));
        assert_eq!(o.physical_address, Some(0x1_2345_6780));
        assert_eq!(o.miss_latency, Some(250));
        assert_eq!(o.source, Some(DataSource::Dram));
        assert!(!o.hitm && o.tlb_refill_latency.is_none());
    }

    #[test]
    fn invalid_addresses_and_latencies_are_none() {
        // A store that hit: no data source, no miss latency even though
        // bits 32-47 hold something; addresses not marked valid.
        let d3 = 1 << 1 | 77 << 32;
        let o = decode_op(&op(0, 3, d3), Encoding::Legacy).unwrap();
        assert!(o.store && !o.load);
        assert_eq!((o.data_address, o.physical_address), (None, None));
        assert_eq!((o.miss_latency, o.source), (None, None));
        assert_eq!(o.width, None);
        // op_rip_invalid (IbsOpData bit 38).
        let o = decode_op(&op(1 << 38, 0, 0), Encoding::Legacy).unwrap();
        assert_eq!(o.rip, None);
    }

    #[test]
    fn every_op_data3_flag() {
        let d3 = 1 << 2 | 1 << 3 | 1 << 8 | 1 << 14 | 1 << 15 | 1 << 21 | 40 << 48;
        let o = decode_op(&op(0, 0, d3), Encoding::Legacy).unwrap();
        assert!(o.dtlb_l1_miss && o.dtlb_l2_miss && o.misaligned);
        assert!(o.uncacheable && o.locked && o.software_prefetch);
        assert_eq!(o.tlb_refill_latency, Some(40));
        assert!(!o.load && !o.store && !o.dc_miss && !o.l2_miss);
    }

    #[test]
    fn branch_bits() {
        // op_return (34), op_brn_taken (35), op_brn_misp (36), op_brn_ret (37).
        let o = decode_op(&op(1 << 34 | 1 << 35 | 1 << 37, 0, 0), Encoding::Legacy).unwrap();
        assert_eq!(
            o.branch,
            Branch {
                retired: true,
                taken: true,
                mispredicted: false,
                returned: true
            }
        );
        let o = decode_op(&op(1 << 36 | 1 << 37, 0, 0), Encoding::Legacy).unwrap();
        assert!(o.branch.mispredicted && !o.branch.taken);
    }

    #[test]
    fn data_sources_by_family() {
        // Families 17h/19h before Zen 4: IBS_DATA_SRC_LOC_CACHE 2, DRAM 3,
        // REM_CACHE 4, IO 7; 0, 1, 5, 6 carry no valid status.
        let legacy: Vec<DataSource> = (0..8).map(DataSource::from_legacy).collect();
        use DataSource::*;
        assert_eq!(
            legacy,
            [
                Unknown,
                Unknown,
                LocalCache,
                Dram,
                RemoteCache,
                Unknown,
                Unknown,
                Io
            ]
        );
        // Zen 4 on: IBS_DATA_SRC_EXT_LOC_CACHE 1, NEAR_CCX_CACHE 2, DRAM 3,
        // FAR_CCX_CACHE 5, PMEM 6, IO 7, EXT_MEM 8, PEER_AGENT_MEM 12,
        // data_src_hi being bits 6-7 of IbsOpData2.
        let ext = |v: u64| DataSource::from_extended((v & 7) | (v >> 3) << 6);
        let got: Vec<DataSource> = [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13]
            .into_iter()
            .map(ext)
            .collect();
        assert_eq!(
            got,
            [
                Unknown,
                LocalCache,
                NearCache,
                Dram,
                Unknown,
                RemoteCache,
                Pmem,
                Io,
                ExtensionMemory,
                PeerAgentMemory,
                Unknown
            ]
        );
        // The same register read with the other family's encoding differs:
        // 5 is a far cache on Zen 4, nothing before.
        assert_eq!(DataSource::from_legacy(5), Unknown);
        assert!(DataSource::from_extended(5).is_remote());
        // Bits 3 (reserved) and 4-5 (rmt_node, cache_hit_st) are not data source.
        assert_eq!(DataSource::from_extended(0b11_1000 | 3), Dram);
    }

    #[test]
    fn a_modified_line_in_another_cache_is_hitm() {
        let missed_load = 1 | 1 << 7;
        // Local cache, cache_hit_st 0 (M): HitM.
        let o = decode_op(&op(0, 2, missed_load), Encoding::Legacy).unwrap();
        assert!(o.hitm);
        // cache_hit_st 1 (O): not.
        let o = decode_op(&op(0, 2 | 1 << 5, missed_load), Encoding::Legacy).unwrap();
        assert!(!o.hitm);
        // From DRAM: never.
        let o = decode_op(&op(0, 3, missed_load), Encoding::Legacy).unwrap();
        assert!(!o.hitm);
    }

    #[test]
    fn fetch_samples() {
        // fetch_val (49), fetch_comp (50), ic_miss (51), phy_addr_valid
        // (52), l1tlb_pgsz (53-54) 1 (2M), l1tlb_miss (55), fetch_l2_miss
        // (58), fetch_lat (32-47) 90.
        let ctl = 1 << 49 | 1 << 50 | 1 << 51 | 1 << 52 | 1 << 53 | 1 << 55 | 1 << 58 | 90 << 32;
        let f = decode_fetch(&FetchRegs {
            ctl,
            lin_ad: 0x40_1000,
            phys_ad: 0x9_9000,
            extd_ctl: 33,
        })
        .unwrap();
        assert_eq!(f.address, 0x40_1000);
        assert_eq!(f.physical_address, Some(0x9_9000));
        assert!(f.completed && f.ic_miss && f.itlb_l1_miss && !f.itlb_l2_miss);
        assert_eq!((f.latency, f.page_size), (90, Some(2 << 20)));
        assert!(f.l2_miss && !f.l3_miss);
        assert_eq!(f.itlb_refill_latency, Some(33));
        // Not valid: nothing; not completed: no cache misses claimed.
        assert_eq!(
            decode_fetch(&FetchRegs {
                ctl: 1 << 50,
                ..Default::default()
            }),
            None
        );
        let f = decode_fetch(&FetchRegs {
            ctl: 1 << 49 | 1 << 58 | 1 << 61 | 3 << 53,
            ..Default::default()
        })
        .unwrap();
        assert!(!f.completed && !f.l2_miss && !f.l3_miss);
        assert_eq!(
            (f.physical_address, f.page_size, f.itlb_refill_latency),
            (None, None, None)
        );
    }

    /// The raw data `perf_ibs_handle_irq()` hands over: the u32 caps, then
    /// the registers.
    fn raw(caps: u32, regs: &[u64]) -> Vec<u8> {
        let mut v = caps.to_ne_bytes().to_vec();
        for r in regs {
            v.extend(r.to_ne_bytes());
        }
        v
    }

    #[test]
    fn raw_samples_as_the_kernel_lays_them_out() {
        let regs = [OP_VAL, 0x40_1234, 3, 2, 1 | 1 << 17, 0x7f00_0010, 0x9000];
        // IBS_CAPS_AVAIL | FETCHSAM | OPSAM | RDWROPCNT | OPCNT.
        let r = op_from_raw(&raw(0x1f, &regs)).unwrap();
        assert_eq!(
            (
                r.ctl,
                r.rip,
                r.data,
                r.data2,
                r.data3,
                r.dc_lin_ad,
                r.dc_phys_ad
            ),
            (regs[0], regs[1], regs[2], regs[3], regs[4], regs[5], regs[6])
        );
        // With IBS_CAPS_BRNTRGT and OPDATA4 two more registers follow.
        let mut more = regs.to_vec();
        more.extend([0x40_2000, 0]);
        assert_eq!(op_from_raw(&raw(0x1f | 1 << 5 | 1 << 10, &more)), Some(r));
        assert_eq!(op_from_raw(&raw(0x1f | 1 << 5 | 1 << 10, &regs)), None);
        assert_eq!(op_from_raw(&raw(0x1f, &regs[..6])), None);
        assert_eq!(op_from_raw(&[1, 2]), None);
        // Fetch: ctl, lin_ad, phys_ad, and IcIbsExtdCtl with FETCHCTLEXTD.
        let f = fetch_from_raw(&raw(0x1f, &[1 << 49, 0x40_1000, 0x9000])).unwrap();
        assert_eq!(
            (f.ctl, f.lin_ad, f.phys_ad, f.extd_ctl),
            (1 << 49, 0x40_1000, 0x9000, 0)
        );
        let f = fetch_from_raw(&raw(1 << 9, &[1 << 49, 0x40_1000, 0x9000, 33])).unwrap();
        assert_eq!(f.extd_ctl, 33);
        assert_eq!(
            fetch_from_raw(&raw(1 << 9, &[1 << 49, 0x40_1000, 0x9000])),
            None
        );
    }

    #[test]
    fn a_load_from_another_node() {
        // IbsOpData2: data_src_lo 3 (DRAM), rmt_node (bit 4).
        let o = decode_op(&op(0, 3 | 1 << 4, 1 | 1 << 7), Encoding::Legacy).unwrap();
        assert!(o.remote_node && o.source == Some(DataSource::Dram));
        // A hit says nothing of the node, whatever the bit.
        let o = decode_op(&op(0, 3 | 1 << 4, 1), Encoding::Legacy).unwrap();
        assert!(!o.remote_node);
    }

    #[test]
    fn ibs_options() {
        let r = parse_request("-ibs").unwrap();
        assert_eq!(
            (r.unit, r.period, r.terms.len()),
            (Unit::Op, DEFAULT_PERIOD, 0)
        );
        assert_eq!(r.spec(true), "ibs_op/swfilt=1/");
        let r = parse_request("-ibs:cnt_ctl,ldlat=256/0x10000").unwrap();
        assert_eq!(r.period, 0x10000);
        assert_eq!(r.spec(false), "ibs_op/cnt_ctl=1,ldlat=256/");
        let r = parse_request("-ibs-fetch:rand_en/200000").unwrap();
        assert_eq!((r.unit, r.period), (Unit::Fetch, 200_000));
        assert_eq!(r.spec(true), "ibs_fetch/rand_en=1,swfilt=1/");
        for (bad, says) in [
            ("-ibs/100", "multiple of 16"),
            ("-ibs/100001", "multiple of 16"),
            (
                "-ibs:rand_en",
                "unknown term 'rand_en' (it takes cnt_ctl, l3missonly, ldlat",
            ),
            ("-ibs-fetch:cnt_ctl", "it takes rand_en, l3missonly"),
            ("-ibs:swfilt", "set by igprof"),
            ("-ibs:ldlat=100", "128 to 2048"),
            ("-ibs:ldlat", "128 to 2048"),
            ("-ibs:cnt_ctl=2", "a flag"),
            ("-ibsx", "expected -ibs[:TERM,...][/PERIOD]"),
        ] {
            let e = parse_request(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    fn tree(machine: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/sysfs")
            .join(machine)
    }

    #[test]
    fn what_each_machine_offers() {
        let op = parse_request("-ibs").unwrap();
        let fetch = parse_request("-ibs-fetch:l3missonly").unwrap();
        // No IBS PMU (an Intel machine, or a VM).
        assert_eq!(discover(&tree("intel"), &op), Err(Missing::NoPmu));
        // Zen 3, a kernel before 6.14: no software filter, legacy encoding.
        let zen3 = discover(&tree("amd"), &op).unwrap();
        assert_eq!((zen3.swfilt, zen3.encoding), (false, Encoding::Legacy));
        assert!(discover(&tree("amd"), &fetch).is_ok());
        let ldlat = parse_request("-ibs:ldlat=128").unwrap();
        assert_eq!(
            discover(&tree("amd"), &ldlat),
            Err(Missing::NoTerm("ldlat".into()))
        );
        // Zen 5, Linux 6.14+.
        let zen5 = discover(&tree("amd-zen5"), &ldlat).unwrap();
        assert_eq!((zen5.swfilt, zen5.encoding), (true, Encoding::Extended));
        // The attr, through the same resolver as -e: the PMU's type and
        // the format's bits.
        let spec = crate::parse(&ldlat.spec(true)).unwrap();
        let a = crate::resolve(&spec, &tree("amd-zen5")).unwrap();
        assert_eq!((a.type_, a.config, a.config1, a.config2), (11, 0, 128, 1));
        let spec = crate::parse(
            &parse_request("-ibs:cnt_ctl,l3missonly")
                .unwrap()
                .spec(false),
        )
        .unwrap();
        let a = crate::resolve(&spec, &tree("amd")).unwrap();
        assert_eq!((a.type_, a.config), (11, 1 << 19 | 1 << 16));
        let spec = crate::parse(&fetch.spec(false)).unwrap();
        assert_eq!(crate::resolve(&spec, &tree("amd")).unwrap().config, 1 << 59);
    }
}
