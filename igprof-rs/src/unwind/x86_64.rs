//! x86-64 specifics of the stack walk: registers from a ucontext or from
//! the current frame, the signal return trampoline and the layout of the
//! signal frame, and framehop's register type.
//!
//! Owns only architecture knowledge; the step logic (`step.rs`), the walk
//! loop, the cache and the module table are shared. Never reads stack
//! memory except through `StackReader`, never allocates.

// Compiled on every host (its pure parts are tested there); only the
// x86-64 host's walk uses it.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::MustNotAllocateDuringUnwind;

use super::cfi::{Regs as CfiRegs, Row, Rule};
use super::descriptor::{Descriptor, Kind};
use super::stack::StackReader;
use super::step::{slot_by_8, Regs};
use super::BrokenFrame;

/// framehop's per-thread scratch space (its rule cache and DWARF row
/// storage), preallocated so that unwinding never allocates.
pub type FramehopCache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// The return address is always on the stack (pushed by `call`).
pub(crate) const RA_IN_LR: bool = false;

/// The end of user space with 5-level paging (56 bits; 47 with 4 levels):
/// no process runs code at or above it.
pub(crate) const USER_END: usize = 1 << 56;

/// DWARF numbers of the return-address column and the frame pointer
/// (rbp) that [`descriptor_of_row`] reads rows for; 0x2d is no opcode of
/// x86-64's.
// A static in the hot code's data (base/code_pages.rs): as a constant,
// the walk copied it from .rodata at every descriptor derived, which kept
// a 64 KiB window of read-only data resident.
#[link_section = ".rodata.igprof_hot_data"]
pub(crate) static DWARF: CfiRegs = CfiRegs {
    ra: 16,
    fp: 6,
    negate_ra_state: false,
    sp: DWARF_RSP,
    pc: Some(16),
};
const DWARF_RSP: u64 = 7;

/// The descriptor `step::describe` gets from framehop for a PC whose CFI
/// row is `row`, for the rows where that is certain; None for the rest
/// (framehop derives those).
///
/// framehop (0.16, `x86_64/dwarf.rs`) turns a row whose return address is
/// at CFA-8 into a rule: CFA = rsp + a multiple of 8 (`OffsetSp`, with rbp
/// restored from CFA + o when the row saves it: `OffsetSpAndRestoreBp`),
/// or CFA = rbp + off with rbp saved at CFA + o (`UseFramePointer` for 16
/// and -16, else the same evaluated directly); a row without a return
/// address rule, or an undefined one, ends the stack. The probes of
/// `step::describe` read these as CFA from SP (offset at least 8) or from
/// FP, the return address in slot -1 and rbp's slot when it is restored
/// (non-zero, a multiple of 8 that fits an i8).
pub(crate) fn descriptor_of_row(row: &Row, first: bool) -> Option<Descriptor> {
    match row.ra {
        Rule::Unset | Rule::Undefined => return Some(Descriptor::of_kind(Kind::Outermost, first)),
        Rule::Offset(-8) => {}
        _ => return None,
    }
    let (reg, off) = row.cfa?;
    match reg {
        DWARF_RSP => {
            if off < 8 || off % 8 != 0 || off / 8 > i64::from(u16::MAX) {
                return None;
            }
            let fp_slot = match row.fp {
                Rule::Unset | Rule::Undefined | Rule::SameValue => 0,
                Rule::Offset(o) => slot_by_8(o)?,
                Rule::Other => return None,
            };
            Some(Descriptor::new(Kind::CfaSp, off as i32, -1, fp_slot, first))
        }
        r if r == DWARF.fp => {
            let Rule::Offset(o) = row.fp else {
                return None;
            };
            Some(Descriptor::new(
                Kind::CfaFp,
                i32::try_from(off).ok()?,
                -1,
                slot_by_8(o)?,
                first,
            ))
        }
        _ => None,
    }
}

/// glibc's `__restore_rt`: `mov $15, %rax` (rt_sigreturn); `syscall`. A
/// signal handler returns to its first byte.
pub(crate) const SIGRETURN: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Offset of `gregs` in the kernel's x86-64 `ucontext` (uc_flags, uc_link,
/// uc_stack: 40 bytes), and of the registers in it (REG_RBP 10, REG_RSP 15,
/// REG_RIP 16), as numbers: the same on every host that reads such a frame.
const UC_GREGS: usize = 40;
const GREG_RIP: usize = UC_GREGS + 8 * 16;
const GREG_RSP: usize = UC_GREGS + 8 * 15;
const GREG_RBP: usize = UC_GREGS + 8 * 10;

/// Registers of the interrupted code from a signal handler's ucontext.
///
/// # Safety
/// `uc` must point to a valid `ucontext_t` (the third argument of an
/// `SA_SIGINFO` handler).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn regs_from_ucontext(uc: *const libc::c_void) -> Regs {
    // SAFETY: guaranteed by the caller.
    let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    Regs {
        pc: g[libc::REG_RIP as usize] as usize,
        sp: g[libc::REG_RSP as usize] as usize,
        fp: g[libc::REG_RBP as usize] as usize,
        lr: 0,
    }
}

/// Registers saved in the signal frame a handler returned into: `sp` is
/// the handler's CFA, where the kernel put the `ucontext_t` (right after
/// the return address `pretcode`).
pub(crate) fn signal_frame_regs(sp: usize, reader: &StackReader) -> Result<Regs, BrokenFrame> {
    Ok(Regs {
        pc: reader.read(sp + GREG_RIP)?,
        sp: reader.read(sp + GREG_RSP)?,
        fp: reader.read_fp(sp + GREG_RBP)?,
        lr: 0,
    })
}

/// The registers at this point of the function it is inlined into: the PC
/// is the address of the next instruction, whose CFI row describes SP.
#[cfg(target_arch = "x86_64")]
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
    Regs { pc, sp, fp, lr: 0 }
}

/// Return addresses are not signed on x86-64.
#[inline(always)]
pub(crate) fn strip_return_address(ra: usize) -> usize {
    ra
}

pub(crate) fn framehop_regs(r: &Regs) -> UnwindRegsX86_64 {
    UnwindRegsX86_64::new(r.pc as u64, r.sp as u64, r.fp as u64)
}

/// The caller's (sp, fp) after framehop unwound a frame.
pub(crate) fn framehop_sp_fp(r: &UnwindRegsX86_64) -> (u64, u64) {
    (r.sp(), r.bp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::stack::with_fake_stack;

    #[test]
    fn a_signal_frame_gives_the_interrupted_registers() {
        // A fake signal frame: the handler's CFA at the stack's start.
        let set = [
            (GREG_RIP, 0x40_1000),
            (GREG_RSP, 0x7ffc_0000),
            (GREG_RBP, 0x7ffc_0040),
        ];
        let (whole, cut) = with_fake_stack(64, &set, |lo, rd| {
            (
                signal_frame_regs(lo, rd),
                signal_frame_regs(lo + 8 * 60, rd),
            )
        });
        let r = whole.unwrap();
        assert_eq!(
            (r.pc, r.sp, r.fp, r.lr),
            (0x40_1000, 0x7ffc_0000, 0x7ffc_0040, 0)
        );
        // A frame cut short by the stack's end is a broken frame.
        assert!(cut.is_err());
    }

    #[test]
    fn framehop_gets_and_gives_back_sp_and_fp() {
        let r = Regs {
            pc: 1,
            sp: 0x1000,
            fp: 0x1010,
            lr: 0,
        };
        assert_eq!(framehop_sp_fp(&framehop_regs(&r)), (0x1000, 0x1010));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_frame_layout_is_this_hosts_ucontext() {
        use core::mem::offset_of;
        let gregs = offset_of!(libc::ucontext_t, uc_mcontext) + offset_of!(libc::mcontext_t, gregs);
        assert_eq!(UC_GREGS, gregs);
        assert_eq!(GREG_RIP, gregs + 8 * libc::REG_RIP as usize);
        assert_eq!(GREG_RSP, gregs + 8 * libc::REG_RSP as usize);
        assert_eq!(GREG_RBP, gregs + 8 * libc::REG_RBP as usize);
    }
}
