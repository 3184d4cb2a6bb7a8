//! AArch64 specifics of the stack walk, mirroring `x86_64.rs`: registers
//! (pc, sp, x29 as FP, x30 as LR) from a ucontext or from the current
//! frame, the signal return trampoline and its frame, turning a framehop
//! rule into a compact descriptor (where the return address may still be in
//! LR: a leaf function, an interrupted prologue), and one frame step.
//!
//! Owns only architecture knowledge; never reads stack memory except
//! through `StackReader`, never allocates.

use core::mem::offset_of;

use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::descriptor::{Descriptor, Kind};
use super::modules::ModuleTable;
use super::stack::StackReader;
use super::BrokenFrame;

/// framehop's per-thread scratch space, preallocated.
pub type FramehopCache = CacheAarch64<MustNotAllocateDuringUnwind>;

/// The registers a walk needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Regs {
    pub pc: usize,
    pub sp: usize,
    /// x29.
    pub fp: usize,
    /// x30: the return address while a function has not saved it.
    pub lr: usize,
}

/// `struct rt_sigframe { siginfo_t info; ucontext_t uc; }`: the kernel
/// puts the ucontext after the 128-byte siginfo, at the handler's SP.
const UC: usize = core::mem::size_of::<libc::siginfo_t>();
const MC: usize = UC + offset_of!(libc::ucontext_t, uc_mcontext);
const MC_X29: usize = MC + offset_of!(libc::mcontext_t, regs) + 8 * 29;
const MC_X30: usize = MC_X29 + 8;
const MC_SP: usize = MC + offset_of!(libc::mcontext_t, sp);
const MC_PC: usize = MC + offset_of!(libc::mcontext_t, pc);

/// Registers of the interrupted code from a signal handler's ucontext.
///
/// # Safety
/// `uc` must point to a valid `ucontext_t`.
pub(crate) unsafe fn regs_from_ucontext(uc: *const libc::c_void) -> Regs {
    // SAFETY: guaranteed by the caller.
    let m = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext };
    Regs {
        pc: m.pc as usize,
        sp: m.sp as usize,
        fp: m.regs[29] as usize,
        lr: m.regs[30] as usize,
    }
}

/// The registers at this point of the function it is inlined into.
#[inline(always)]
pub(crate) fn capture() -> Regs {
    let (pc, sp, fp, lr): (usize, usize, usize, usize);
    // SAFETY: reads pc (adr), sp, x29 and x30 into registers; no memory
    // access, the stack and flags are untouched.
    unsafe {
        core::arch::asm!(
            "adr {pc}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            "mov {lr}, x30",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags),
        );
    }
    Regs { pc, sp, fp, lr }
}

/// `__kernel_rt_sigreturn` (vDSO) and glibc's restorer: `mov x8, #139`
/// (rt_sigreturn); `svc #0`.
const SIGRETURN: [u8; 8] = [0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

/// True if the code at `pc` is the signal return trampoline.
pub(crate) fn is_sigreturn(table: &ModuleTable, pc: usize) -> bool {
    match table.find(pc) {
        Some(m)
            if pc
                .checked_add(SIGRETURN.len())
                .is_some_and(|e| e <= m.text.1) =>
        {
            // SAFETY: inside an executable PT_LOAD segment of a loaded object.
            let code = unsafe { core::slice::from_raw_parts(pc as *const u8, SIGRETURN.len()) };
            code == SIGRETURN
        }
        _ => false,
    }
}

/// See `x86_64.rs`: values "read" by a probe carry this tag.
const PROBE_TAG: u64 = 0x4000_0000_0000_0000;
/// (sp, fp, lr) for the two probes.
const PROBES: [(u64, u64, u64); 2] = [
    (0x1000_0000_0000, 0x2000_0000_0000, 0x3000_0000_0000),
    (0x1800_0040_0000, 0x2c00_1230_0000, 0x3400_0560_0000),
];

/// The descriptor for the frame at `pc`; `ra_slot_by_8 == 0` means the
/// return address is still in LR (first frames only).
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
    for (sp, fp, lr) in PROBES {
        let Some(d) = probe(table, fh, pc, first, sp, fp, lr) else {
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
    fp: u64,
    lr: u64,
) -> Option<Descriptor> {
    let mut regs = UnwindRegsAarch64::new(lr, sp, fp);
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
    let (kind, cfa_offset) = match (offset_from(cfa, sp), offset_from(cfa, fp)) {
        (Some(o), _) if o >= 0 => (Kind::CfaSp, o),
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
    let ra_slot_by_8 = if ra == lr && first { 0 } else { slot(ra)? };
    let fp_slot_by_8 = if regs.fp() == fp { 0 } else { slot(regs.fp())? };
    Some(Descriptor {
        cfa_offset,
        ra_slot_by_8,
        fp_slot_by_8,
        kind,
        first,
    })
}

fn offset_from(a: u64, b: u64) -> Option<i32> {
    i32::try_from(a.wrapping_sub(b) as i64).ok()
}

/// What one frame step found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Caller { first: bool },
    Outermost,
}

/// Unwind one frame with a descriptor (not `Empty`/`Framehop`).
#[inline(always)]
pub(crate) fn apply(
    d: Descriptor,
    regs: &mut Regs,
    first: bool,
    reader: &StackReader,
) -> Result<Step, BrokenFrame> {
    let base = match d.kind {
        Kind::CfaSp => regs.sp,
        Kind::CfaFp if regs.fp == 0 => return Ok(Step::Outermost),
        Kind::CfaFp => regs.fp,
        Kind::Outermost => return Ok(Step::Outermost),
        Kind::SignalFrame => {
            let f = regs.sp;
            *regs = Regs {
                pc: reader.read(f + MC_PC)?,
                sp: reader.read(f + MC_SP)?,
                fp: reader.read(f + MC_X29)?,
                lr: reader.read(f + MC_X30)?,
            };
            return Ok(Step::Caller { first: true });
        }
        Kind::Empty | Kind::Framehop => unreachable!("apply() is only given compact descriptors"),
    };
    let cfa = base.wrapping_add_signed(d.cfa_offset as isize);
    // A leaf (or an interrupted prologue) may not have moved SP at all.
    if cfa < regs.sp || (cfa == regs.sp && !first) {
        return Err(BrokenFrame::NoProgress {
            sp: regs.sp,
            new_sp: cfa,
        });
    }
    let ra = if d.ra_slot_by_8 == 0 {
        if cfa == regs.sp && regs.lr == regs.pc {
            return Err(BrokenFrame::NoProgress {
                sp: regs.sp,
                new_sp: cfa,
            });
        }
        regs.lr
    } else {
        reader.read(cfa.wrapping_add_signed(d.ra_slot_by_8 as isize * 8))?
    };
    if d.fp_slot_by_8 != 0 {
        regs.fp = reader.read(cfa.wrapping_add_signed(d.fp_slot_by_8 as isize * 8))?;
    }
    regs.sp = cfa;
    regs.pc = ra;
    regs.lr = ra;
    Ok(if ra == 0 {
        Step::Outermost
    } else {
        Step::Caller { first: false }
    })
}

/// Unwind one frame with framehop itself.
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
    let mut fregs = UnwindRegsAarch64::new(regs.lr as u64, regs.sp as u64, regs.fp as u64);
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
            if new_sp < regs.sp || (new_sp == regs.sp && !first) {
                return Err(BrokenFrame::NoProgress {
                    sp: regs.sp,
                    new_sp,
                });
            }
            *regs = Regs {
                pc: ra as usize,
                sp: new_sp,
                fp: fregs.fp() as usize,
                lr: ra as usize,
            };
            Ok(Step::Caller { first: false })
        }
        Err(_) => Err(refused.unwrap_or(BrokenFrame::Unwinder { pc })),
    }
}
