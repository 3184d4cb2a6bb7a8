//! AArch64 specifics of the stack walk, mirroring `x86_64.rs`: registers
//! (pc, sp, x29 as FP, x30 as LR) from a ucontext or from the current
//! frame, the signal return trampoline and the layout of the signal frame,
//! and framehop's register type. Descriptors may leave the return address
//! in LR (a leaf function, an interrupted prologue).
//!
//! Owns only architecture knowledge; never reads stack memory except
//! through `StackReader`, never allocates.

use core::mem::offset_of;

use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64};
use framehop::MustNotAllocateDuringUnwind;

use super::stack::StackReader;
use super::step::Regs;
use super::BrokenFrame;

/// framehop's per-thread scratch space, preallocated.
pub type FramehopCache = CacheAarch64<MustNotAllocateDuringUnwind>;

/// `bl` leaves the return address in x30 until the callee saves it.
pub(crate) const RA_IN_LR: bool = true;

/// `__kernel_rt_sigreturn` (vDSO): `mov x8, #139` (rt_sigreturn); `svc #0`.
pub(crate) const SIGRETURN: &[u8] = &[0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

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

pub(crate) fn framehop_regs(r: &Regs) -> UnwindRegsAarch64 {
    UnwindRegsAarch64::new(r.lr as u64, r.sp as u64, r.fp as u64)
}

/// The caller's (sp, fp) after framehop unwound a frame.
pub(crate) fn framehop_sp_fp(r: &UnwindRegsAarch64) -> (u64, u64) {
    (r.sp(), r.fp())
}
