//! One frame step, for every architecture: executing a compact descriptor,
//! deriving a descriptor from framehop's rule for a PC, and unwinding a
//! frame with framehop itself when no descriptor can express its rule.
//!
//! Owns the architecture-neutral half of unwinding; `x86_64.rs` and
//! `aarch64.rs` supply registers, the signal frame layout, the trampoline's
//! code and framehop's register type. Never reads stack memory except
//! through `StackReader`, never allocates.

use framehop::{FrameAddress, UnwindRegsNative, Unwinder};

use super::arch::{self, FramehopCache};
use super::cfi;
use super::descriptor::{Descriptor, Kind};
use super::modules::ModuleTable;
use super::stack::StackReader;
use super::BrokenFrame;

/// The registers a walk needs. `lr` is AArch64's x30 (the return address
/// while a function has not saved it); x86-64 leaves it 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Regs {
    pub pc: usize,
    pub sp: usize,
    pub fp: usize,
    pub lr: usize,
}

/// What one frame step found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `regs` now describe the caller; `first` says whether its PC is an
    /// interrupted PC (after a signal frame) rather than a return address.
    Caller { first: bool },
    /// There is no caller.
    Outermost,
}

/// Whether a step from `sp` to `new_sp` moves outward. A first frame may
/// keep its SP where the return address can still be in LR (a leaf, or an
/// interrupted prologue on AArch64).
#[inline(always)]
fn progresses(sp: usize, new_sp: usize, first: bool) -> Result<(), BrokenFrame> {
    if new_sp > sp || (new_sp == sp && first && arch::RA_IN_LR) {
        Ok(())
    } else {
        Err(BrokenFrame::NoProgress { sp, new_sp })
    }
}

/// Unwind one frame with a descriptor (not `Empty`/`Framehop`).
#[inline(always)]
#[link_section = "igprof_hot"]
pub(crate) fn apply(
    d: Descriptor,
    regs: &mut Regs,
    first: bool,
    reader: &StackReader,
) -> Result<Step, BrokenFrame> {
    let base = match d.kind {
        Kind::CfaSp => regs.sp,
        Kind::CfaFp => {
            reader.fp_used();
            // A zero frame pointer is the ABI's end-of-chain marker.
            if regs.fp == 0 {
                return Ok(Step::Outermost);
            }
            regs.fp
        }
        Kind::Outermost => return Ok(Step::Outermost),
        Kind::SignalFrame => {
            // The handler returned here, its SP at the kernel's frame.
            *regs = arch::signal_frame_regs(regs.sp, reader)?;
            return Ok(Step::Caller { first: true });
        }
        Kind::Empty | Kind::Framehop => unreachable!("apply() is only given compact descriptors"),
    };
    let cfa = base.wrapping_add_signed(d.cfa_offset as isize);
    progresses(regs.sp, cfa, first)?;
    let ra = if d.ra_slot_by_8 == 0 {
        // Still in LR (only ever derived for first frames on AArch64).
        let lr = arch::strip_return_address(regs.lr);
        if cfa == regs.sp && lr == regs.pc {
            return Err(BrokenFrame::NoProgress {
                sp: regs.sp,
                new_sp: cfa,
            });
        }
        lr
    } else {
        arch::strip_return_address(
            reader.read(cfa.wrapping_add_signed(d.ra_slot_by_8 as isize * 8))?,
        )
    };
    if d.fp_slot_by_8 != 0 {
        regs.fp = reader.read_fp(cfa.wrapping_add_signed(d.fp_slot_by_8 as isize * 8))?;
    }
    *regs = Regs {
        pc: ra,
        sp: cfa,
        fp: regs.fp,
        lr: ra,
    };
    Ok(if ra == 0 {
        Step::Outermost
    } else {
        Step::Caller { first: false }
    })
}

fn frame_address(pc: usize, first: bool) -> Option<FrameAddress> {
    if first {
        Some(FrameAddress::from_instruction_pointer(pc as u64))
    } else {
        FrameAddress::from_return_address(pc as u64)
    }
}

/// Unwind one frame with framehop itself (rules a descriptor cannot hold).
pub(crate) fn framehop_step(
    table: &ModuleTable,
    fh: &mut FramehopCache,
    regs: &mut Regs,
    first: bool,
    reader: &StackReader,
) -> Result<Step, BrokenFrame> {
    let pc = regs.pc;
    let Some(addr) = frame_address(pc, first) else {
        return Ok(Step::Outermost);
    };
    // framehop's rule may use the frame pointer.
    reader.fp_used();
    let mut fregs = arch::framehop_regs(regs);
    let mut refused = None;
    let mut read = |a: u64| match reader.read(a as usize) {
        Ok(v) => Ok(v as u64),
        Err(e) => {
            refused = Some(e);
            Err(())
        }
    };
    match table.framehop.unwind_frame(addr, &mut fregs, fh, &mut read) {
        Ok(None) => Ok(Step::Outermost),
        Ok(Some(ra)) => {
            let (sp, fp) = arch::framehop_sp_fp(&fregs);
            progresses(regs.sp, sp as usize, first)?;
            let ra = arch::strip_return_address(ra as usize);
            *regs = Regs {
                pc: ra,
                sp: sp as usize,
                fp: fp as usize,
                lr: ra,
            };
            Ok(Step::Caller { first: false })
        }
        Err(_) => Err(refused.unwrap_or(BrokenFrame::Unwinder { pc })),
    }
}

/// Tag put on every value a probe "reads", so that the probe can tell
/// where framehop's rule loaded each register from.
const PROBE_TAG: u64 = 0x4000_0000_0000_0000;

/// (sp, fp, lr) for the two probes: far apart, so that SP- and FP-based
/// CFAs cannot be confused, and different, so that a rule that is not an
/// offset from SP or FP (a DWARF expression that computes the CFA some
/// other way) gives two different answers.
const PROBES: [(u64, u64, u64); 2] = [
    (0x1000_0000_0000, 0x2000_0000_0000, 0x3000_0000_0000),
    (0x1800_0040_0000, 0x2c00_1230_0000, 0x3400_0560_0000),
];

/// Compute the descriptor for the frame at `pc` (an interrupted PC when
/// `first`, else a return address) by running framehop's rule for that PC
/// on symbolic registers, twice. `Kind::Framehop` when the rule is not
/// expressible as a descriptor.
#[link_section = "igprof_hot"]
pub(crate) fn describe(
    table: &ModuleTable,
    fh: &mut FramehopCache,
    pc: usize,
    first: bool,
) -> Descriptor {
    if table.code_at(pc, arch::SIGRETURN) {
        return Descriptor::of_kind(Kind::SignalFrame, first);
    }
    if let Some(d) = direct(table, pc, first) {
        let differs = cfi::checking() && describe_by_framehop(table, fh, pc, first) != d;
        cfi::answered(differs);
        return d;
    }
    describe_by_framehop(table, fh, pc, first)
}

/// The descriptor of the frame at `pc` read from its CFI row directly
/// (`cfi.rs`), where the architecture's mapping of the row is certain to
/// give what framehop would.
#[link_section = "igprof_hot"]
pub(crate) fn direct(table: &ModuleTable, pc: usize, first: bool) -> Option<Descriptor> {
    // framehop looks a return address up at the call instruction.
    let lookup = if first { pc } else { pc.checked_sub(1)? };
    let m = table.find(lookup)?;
    let row = cfi::row_at(m, lookup, &arch::DWARF, first.then_some(pc as u64))?;
    arch::descriptor_of_row(&row, first)
}

/// [`describe`] by running framehop's rule for `pc` on two sets of
/// symbolic registers (not for signal frames).
pub(crate) fn describe_by_framehop(
    table: &ModuleTable,
    fh: &mut FramehopCache,
    pc: usize,
    first: bool,
) -> Descriptor {
    let fallback = Descriptor::of_kind(Kind::Framehop, first);
    let mut found = None;
    for start in PROBES {
        let Some(d) = probe(table, fh, pc, first, start) else {
            return fallback;
        };
        if found.is_some_and(|f| f != d) {
            return fallback;
        }
        found = Some(d);
    }
    found.unwrap_or(fallback)
}

fn probe(
    table: &ModuleTable,
    fh: &mut FramehopCache,
    pc: usize,
    first: bool,
    (sp, fp, lr): (u64, u64, u64),
) -> Option<Descriptor> {
    let start = Regs {
        pc,
        sp: sp as usize,
        fp: fp as usize,
        lr: lr as usize,
    };
    let mut regs: UnwindRegsNative = arch::framehop_regs(&start);
    let mut read = |addr: u64| Ok(addr | PROBE_TAG);
    let ra = match table
        .framehop
        .unwind_frame(frame_address(pc, first)?, &mut regs, fh, &mut read)
    {
        Ok(None) => return Some(Descriptor::of_kind(Kind::Outermost, first)),
        Ok(Some(ra)) => ra,
        Err(_) => return None,
    };
    let (cfa, new_fp) = arch::framehop_sp_fp(&regs);
    let min_sp_offset = if arch::RA_IN_LR { 0 } else { 1 };
    let (kind, cfa_offset) = match (offset_from(cfa, sp), offset_from(cfa, fp)) {
        (Some(o), _) if o >= min_sp_offset => (Kind::CfaSp, o),
        (_, Some(o)) => (Kind::CfaFp, o),
        _ => return None,
    };
    let slot = |stored: u64| -> Option<i8> {
        if stored & PROBE_TAG == 0 {
            return None;
        }
        slot_by_8(offset_from(stored & !PROBE_TAG, cfa)?.into())
    };
    let ra_slot_by_8 = if arch::RA_IN_LR && first && ra == lr {
        0
    } else {
        slot(ra)?
    };
    let fp_slot_by_8 = if new_fp == fp { 0 } else { slot(new_fp)? };
    Some(Descriptor::new(
        kind,
        cfa_offset,
        ra_slot_by_8,
        fp_slot_by_8,
        first,
    ))
}

/// A descriptor's slot for a register saved `off` bytes from the CFA: a
/// non-zero multiple of 8 whose count of words fits an i8.
pub(crate) fn slot_by_8(off: i64) -> Option<i8> {
    if off % 8 != 0 || off == 0 {
        return None;
    }
    i8::try_from(off / 8).ok()
}

/// `a - b` if it fits an i32.
fn offset_from(a: u64, b: u64) -> Option<i32> {
    i32::try_from(a.wrapping_sub(b) as i64).ok()
}
