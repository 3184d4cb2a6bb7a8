//! x86-64 specifics of the stack walk: registers from a ucontext or from
//! the current frame, the signal return trampoline and its frame, turning a
//! framehop rule into a compact descriptor, and executing one frame step.
//!
//! Owns only architecture knowledge; the walk loop, the cache and the
//! module table are shared (`walk.rs`, `descriptor.rs`, `modules.rs`).
//! Never reads stack memory except through `StackReader`, never allocates.

use core::mem::offset_of;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::descriptor::{Descriptor, Kind};
use super::modules::ModuleTable;
use super::stack::StackReader;
use super::BrokenFrame;

/// framehop's per-thread scratch space (its rule cache and DWARF row
/// storage), preallocated so that unwinding never allocates.
pub type FramehopCache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// The registers a walk needs: PC (rip), SP (rsp), FP (rbp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Regs {
    pub pc: usize,
    pub sp: usize,
    pub fp: usize,
}

/// Offset of `gregs` in `ucontext_t`.
const UC_GREGS: usize =
    offset_of!(libc::ucontext_t, uc_mcontext) + offset_of!(libc::mcontext_t, gregs);
const GREG_RIP: usize = UC_GREGS + 8 * libc::REG_RIP as usize;
const GREG_RSP: usize = UC_GREGS + 8 * libc::REG_RSP as usize;
const GREG_RBP: usize = UC_GREGS + 8 * libc::REG_RBP as usize;

/// Registers of the interrupted code from a signal handler's ucontext.
///
/// # Safety
/// `uc` must point to a valid `ucontext_t` (the third argument of an
/// `SA_SIGINFO` handler).
pub(crate) unsafe fn regs_from_ucontext(uc: *const libc::c_void) -> Regs {
    // SAFETY: guaranteed by the caller.
    let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    Regs {
        pc: g[libc::REG_RIP as usize] as usize,
        sp: g[libc::REG_RSP as usize] as usize,
        fp: g[libc::REG_RBP as usize] as usize,
    }
}

/// The registers at this point of the function it is inlined into: the PC
/// is the address of the next instruction, whose CFI row describes SP.
#[inline(always)]
pub(crate) fn capture() -> Regs {
    let (pc, sp, fp): (usize, usize, usize);
    // SAFETY: reads rip, rsp and rbp into registers; no memory access, the
    // stack and flags are untouched.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags),
        );
    }
    Regs { pc, sp, fp }
}

/// glibc's `__restore_rt`: `mov $15, %rax` (rt_sigreturn); `syscall`. A
/// signal handler returns to its first byte.
const SIGRETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// True if the code at `pc` is the signal return trampoline. Reads code only
/// inside a known object's executable range.
pub(crate) fn is_sigreturn(table: &ModuleTable, pc: usize) -> bool {
    match table.find(pc) {
        Some(m)
            if pc
                .checked_add(SIGRETURN.len())
                .is_some_and(|e| e <= m.text.1) =>
        {
            // SAFETY: pc..pc+9 lies in an executable PT_LOAD segment of a
            // loaded object, which is mapped readable.
            let code = unsafe { core::slice::from_raw_parts(pc as *const u8, SIGRETURN.len()) };
            code == SIGRETURN
        }
        _ => false,
    }
}

/// Tag put on every value a probe "reads", so that the probe can tell
/// where framehop's rule loaded each register from.
const PROBE_TAG: u64 = 0x4000_0000_0000_0000;
/// (sp, bp) pairs for the two probes: far apart, so that SP- and FP-based
/// CFAs cannot be confused, and different, so that a rule that is not an
/// offset from SP or FP (a DWARF expression that loads the CFA, say) gives
/// two different answers.
const PROBES: [(u64, u64); 2] = [
    (0x1000_0000_0000, 0x2000_0000_0000),
    (0x1800_0040_0000, 0x2c00_1230_0000),
];

/// Compute the descriptor for the frame at `pc` (an interrupted PC when
/// `first`, else a return address) by running framehop's rule for that PC
/// on symbolic registers. Returns `Kind::Framehop` when the rule is not
/// expressible as a descriptor.
pub(crate) fn describe(
    table: &ModuleTable,
    fh: &mut FramehopCache,
    pc: usize,
    first: bool,
) -> Descriptor {
    if is_sigreturn(table, pc) {
        return Descriptor::of_kind(Kind::SignalFrame, first);
    }
    let fallback = Descriptor::of_kind(Kind::Framehop, first);
    let mut found = None;
    for (sp, bp) in PROBES {
        let Some(d) = probe(table, fh, pc, first, sp, bp) else {
            return fallback;
        };
        if found.is_some_and(|f| f != d) {
            return fallback;
        }
        found = Some(d);
    }
    found.unwrap_or(fallback)
}

fn frame_address(pc: usize, first: bool) -> Option<FrameAddress> {
    if first {
        Some(FrameAddress::from_instruction_pointer(pc as u64))
    } else {
        FrameAddress::from_return_address(pc as u64)
    }
}

fn probe(
    table: &ModuleTable,
    fh: &mut FramehopCache,
    pc: usize,
    first: bool,
    sp: u64,
    bp: u64,
) -> Option<Descriptor> {
    let mut regs = UnwindRegsX86_64::new(pc as u64, sp, bp);
    let mut read = |addr: u64| Ok(addr | PROBE_TAG);
    let ra = match table
        .framehop
        .unwind_frame(frame_address(pc, first)?, &mut regs, fh, &mut read)
    {
        Ok(None) => return Some(Descriptor::of_kind(Kind::Outermost, first)),
        Ok(Some(ra)) => ra,
        Err(_) => return None,
    };
    let cfa = regs.sp();
    let (kind, cfa_offset) = match (offset_from(cfa, sp), offset_from(cfa, bp)) {
        (Some(o), _) if o > 0 => (Kind::CfaSp, o),
        (_, Some(o)) => (Kind::CfaFp, o),
        _ => return None,
    };
    let slot = |stored: u64| -> Option<i8> {
        if stored & PROBE_TAG == 0 {
            return None;
        }
        let off = offset_from(stored & !PROBE_TAG, cfa)?;
        if off % 8 != 0 || off == 0 {
            return None;
        }
        i8::try_from(off / 8).ok()
    };
    let ra_slot_by_8 = slot(ra)?;
    let fp_slot_by_8 = if regs.bp() == bp { 0 } else { slot(regs.bp())? };
    Some(Descriptor {
        cfa_offset,
        ra_slot_by_8,
        fp_slot_by_8,
        kind,
        first,
    })
}

/// `a - b` if it fits an i32.
fn offset_from(a: u64, b: u64) -> Option<i32> {
    i32::try_from(a.wrapping_sub(b) as i64).ok()
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

/// Unwind one frame with a descriptor (not `Empty`/`Framehop`).
#[inline(always)]
pub(crate) fn apply(
    d: Descriptor,
    regs: &mut Regs,
    _first: bool,
    reader: &StackReader,
) -> Result<Step, BrokenFrame> {
    let base = match d.kind {
        Kind::CfaSp => regs.sp,
        Kind::CfaFp if regs.fp == 0 => return Ok(Step::Outermost), // ABI end-of-chain marker
        Kind::CfaFp => regs.fp,
        Kind::Outermost => return Ok(Step::Outermost),
        Kind::SignalFrame => {
            // The handler returned here with SP at the kernel's ucontext.
            let uc = regs.sp;
            *regs = Regs {
                pc: reader.read(uc + GREG_RIP)?,
                sp: reader.read(uc + GREG_RSP)?,
                fp: reader.read(uc + GREG_RBP)?,
            };
            return Ok(Step::Caller { first: true });
        }
        Kind::Empty | Kind::Framehop => unreachable!("apply() is only given compact descriptors"),
    };
    let cfa = base.wrapping_add_signed(d.cfa_offset as isize);
    if cfa <= regs.sp {
        return Err(BrokenFrame::NoProgress {
            sp: regs.sp,
            new_sp: cfa,
        });
    }
    let ra = reader.read(cfa.wrapping_add_signed(d.ra_slot_by_8 as isize * 8))?;
    if d.fp_slot_by_8 != 0 {
        regs.fp = reader.read(cfa.wrapping_add_signed(d.fp_slot_by_8 as isize * 8))?;
    }
    regs.sp = cfa;
    regs.pc = ra;
    Ok(if ra == 0 {
        Step::Outermost
    } else {
        Step::Caller { first: false }
    })
}

/// Unwind one frame with framehop itself (rules the descriptor cannot hold).
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
    let mut fregs = UnwindRegsX86_64::new(pc as u64, regs.sp as u64, regs.fp as u64);
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
            let new_sp = fregs.sp() as usize;
            if new_sp <= regs.sp {
                return Err(BrokenFrame::NoProgress {
                    sp: regs.sp,
                    new_sp,
                });
            }
            *regs = Regs {
                pc: ra as usize,
                sp: new_sp,
                fp: fregs.bp() as usize,
            };
            Ok(Step::Caller { first: false })
        }
        Err(_) => Err(refused.unwrap_or(BrokenFrame::Unwinder { pc })),
    }
}
