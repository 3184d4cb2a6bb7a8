//! AArch64 specifics of the stack walk, mirroring `x86_64.rs`: registers
//! (pc, sp, x29 as FP, x30 as LR) from a ucontext or from the current
//! frame, the signal return trampoline and the layout of the signal frame,
//! a CFI row's descriptor, pointer authentication's code stripped from a
//! return address, and framehop's register type. Descriptors may leave the
//! return address in LR (a leaf function, an interrupted prologue).
//!
//! Owns only architecture knowledge; never reads stack memory except
//! through `StackReader`, never allocates.

// Compiled on every host (its pure parts are tested there); only the
// AArch64 host's walk uses it.
#![cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]

use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64};
use framehop::MustNotAllocateDuringUnwind;

use super::cfi::{Regs as CfiRegs, Row, Rule};
use super::descriptor::{Descriptor, Kind};
use super::stack::StackReader;
use super::step::{slot_by_8, Regs};
use super::BrokenFrame;

/// framehop's per-thread scratch space, preallocated.
pub type FramehopCache = CacheAarch64<MustNotAllocateDuringUnwind>;

/// `bl` leaves the return address in x30 until the callee saves it.
pub(crate) const RA_IN_LR: bool = true;

/// The end of user space with 52-bit virtual addresses (the largest
/// Linux configures): no process runs code at or above it.
pub(crate) const USER_END: usize = 1 << 52;

/// DWARF numbers of the return-address column (x30), the frame pointer
/// (x29) and the stack pointer; descriptors are derived from CFI rows
/// directly ([`descriptor_of_row`]), which also follows pointer
/// authentication's `negate_ra_state`: framehop (0.16) reads
/// `.eh_frame` without gimli's AArch64 vendor, so the opcode fails
/// every row of a function built with `-mbranch-protection=pac-ret`, and
/// framehop then takes its fallback rule (LR unchanged for an interrupted
/// PC: a walk that makes no progress).
// A static in the hot code's data (base/code_pages.rs): as a constant,
// the walk copied it from .rodata at every descriptor derived, which kept
// a 64 KiB window of read-only data resident.
#[link_section = ".rodata.igprof_hot_data"]
pub(crate) static DWARF: CfiRegs = CfiRegs {
    ra: 30,
    fp: 29,
    negate_ra_state: true,
    sp: DWARF_SP,
    pc: None,
};
const DWARF_SP: u64 = 31;

/// The descriptor `step::describe` gets from framehop for a PC whose CFI
/// row is `row`, for the rows where that is certain; None for the rest
/// (framehop derives those).
///
/// framehop (0.16, `aarch64/dwarf.rs`) turns a row with CFA = sp + off
/// into SP + 16 * (off / 16) with x29 and x30 restored from their CFA
/// offsets; x30 without a rule or the same value leaves the return
/// address in LR (a first frame only; a caller's is an error), undefined
/// ends the stack in a caller; x29 restored without x30 is an error. A
/// row with CFA = x29 + off needs both saved. Rows whose offsets framehop
/// would round are left to framehop.
pub(crate) fn descriptor_of_row(row: &Row, first: bool) -> Option<Descriptor> {
    let (reg, off) = row.cfa?;
    let saved = |r: Rule| match r {
        Rule::Unset | Rule::Undefined | Rule::SameValue => Some(None),
        Rule::Offset(o) => Some(Some(o)),
        Rule::Other => None,
    };
    let (ra, fp) = (saved(row.ra)?, saved(row.fp)?);
    match reg {
        DWARF_SP => {
            if off < 0 || off % 16 != 0 || off / 16 > i64::from(u16::MAX) {
                return None;
            }
            let fp_slot = match fp {
                Some(o) => slot_by_8(o)?,
                None => 0,
            };
            let ra_slot = match (ra, row.ra) {
                (Some(o), _) => slot_by_8(o)?,
                (None, _) if fp_slot != 0 => return None,
                (None, Rule::Undefined) if !first => {
                    return Some(Descriptor::of_kind(Kind::Outermost, first))
                }
                (None, _) if first => 0,
                (None, _) => return None,
            };
            Some(Descriptor::new(
                Kind::CfaSp,
                off as i32,
                ra_slot,
                fp_slot,
                first,
            ))
        }
        r if r == DWARF.fp => {
            let (Some(ra), Some(fp)) = (ra, fp) else {
                return None;
            };
            if off < 0 || off % 8 != 0 {
                return None;
            }
            Some(Descriptor::new(
                Kind::CfaFp,
                i32::try_from(off).ok()?,
                slot_by_8(ra)?,
                slot_by_8(fp)?,
                first,
            ))
        }
        _ => None,
    }
}

/// `__kernel_rt_sigreturn` (vDSO): `mov x8, #139` (rt_sigreturn); `svc #0`.
pub(crate) const SIGRETURN: &[u8] = &[0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

/// `struct rt_sigframe { siginfo_t info; ucontext_t uc; }`: the kernel
/// puts the ucontext after the 128-byte siginfo, at the handler's SP. In
/// the AArch64 ucontext, `uc_mcontext` (a 16-byte aligned `sigcontext`:
/// fault_address, regs[31], sp, pc, pstate) follows uc_flags, uc_link,
/// uc_stack and a 128-byte signal mask, at 176. As numbers, the same on
/// every host that reads such a frame.
const UC: usize = 128;
const MC: usize = UC + 176;
const MC_X29: usize = MC + 8 + 8 * 29;
const MC_X30: usize = MC_X29 + 8;
const MC_SP: usize = MC + 8 + 8 * 31;
const MC_PC: usize = MC_SP + 8;

/// Registers of the interrupted code from a signal handler's ucontext.
///
/// # Safety
/// `uc` must point to a valid `ucontext_t`.
#[cfg(target_arch = "aarch64")]
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

/// Registers saved in the signal frame a handler returned into (`sp` is
/// the handler's CFA, the start of `rt_sigframe`).
pub(crate) fn signal_frame_regs(sp: usize, reader: &StackReader) -> Result<Regs, BrokenFrame> {
    Ok(Regs {
        pc: reader.read(sp + MC_PC)?,
        sp: reader.read(sp + MC_SP)?,
        fp: reader.read_fp(sp + MC_X29)?,
        lr: reader.read(sp + MC_X30)?,
    })
}

/// The registers at this point of the function it is inlined into.
#[cfg(target_arch = "aarch64")]
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

/// A return address without its pointer authentication code. Code built
/// with `-mbranch-protection=pac-ret` (the AArch64 libraries of most
/// distributions since 2022) signs the return address before it saves it,
/// in the bits above the virtual address size, and authenticates it
/// before it returns; a walk reading it from the stack (or from x30 after
/// the signing) must strip the code to get the address. `xpaclri` is a
/// hint (`hint #7`): a no-op on CPUs without pointer authentication,
/// where no address is signed.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn strip_return_address(ra: usize) -> usize {
    let mut x30 = ra;
    // SAFETY: xpaclri rewrites x30 only; no memory, stack or flags.
    unsafe {
        core::arch::asm!(
            "hint #7",
            inout("x30") x30,
            options(nomem, nostack, preserves_flags, pure)
        )
    };
    x30
}

pub(crate) fn framehop_regs(r: &Regs) -> UnwindRegsAarch64 {
    UnwindRegsAarch64::new(r.lr as u64, r.sp as u64, r.fp as u64)
}

/// The caller's (sp, fp) after framehop unwound a frame.
pub(crate) fn framehop_sp_fp(r: &UnwindRegsAarch64) -> (u64, u64) {
    (r.sp(), r.fp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::stack::with_fake_stack;

    #[test]
    fn a_signal_frame_gives_the_interrupted_registers_and_lr() {
        // A fake signal frame: the handler's CFA at the stack's start.
        let set = [
            (MC_PC, 0x40_1000),
            (MC_SP, 0x7ffc_0000),
            (MC_X29, 0x7ffc_0040),
            (MC_X30, 0x40_2000),
        ];
        let (whole, cut) = with_fake_stack(96, &set, |lo, rd| {
            (
                signal_frame_regs(lo, rd),
                signal_frame_regs(lo + 8 * 40, rd),
            )
        });
        let r = whole.unwrap();
        assert_eq!(
            (r.pc, r.sp, r.fp, r.lr),
            (0x40_1000, 0x7ffc_0000, 0x7ffc_0040, 0x40_2000)
        );
        // A frame cut short by the stack's end is a broken frame.
        assert!(cut.is_err());
    }

    #[test]
    fn framehop_starts_from_lr_and_gives_back_sp_and_fp() {
        let r = Regs {
            pc: 1,
            sp: 0x1000,
            fp: 0x1010,
            lr: 0x2000,
        };
        let f = framehop_regs(&r);
        assert_eq!(f.lr(), 0x2000);
        assert_eq!(framehop_sp_fp(&f), (0x1000, 0x1010));
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn the_frame_layout_is_this_hosts_ucontext() {
        use core::mem::offset_of;
        let mc =
            core::mem::size_of::<libc::siginfo_t>() + offset_of!(libc::ucontext_t, uc_mcontext);
        assert_eq!(MC, mc);
        assert_eq!(MC_X29, mc + offset_of!(libc::mcontext_t, regs) + 8 * 29);
        assert_eq!(MC_SP, mc + offset_of!(libc::mcontext_t, sp));
        assert_eq!(MC_PC, mc + offset_of!(libc::mcontext_t, pc));
    }
}
