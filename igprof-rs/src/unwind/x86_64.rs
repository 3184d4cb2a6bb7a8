//! x86-64 specifics of the stack walk: registers from a ucontext or from
//! the current frame, the signal return trampoline and the layout of the
//! signal frame, and framehop's register type.
//!
//! Owns only architecture knowledge; the step logic (`step.rs`), the walk
//! loop, the cache and the module table are shared. Never reads stack
//! memory except through `StackReader`, never allocates.

use core::mem::offset_of;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::MustNotAllocateDuringUnwind;

use super::stack::StackReader;
use super::step::Regs;
use super::BrokenFrame;

/// framehop's per-thread scratch space (its rule cache and DWARF row
/// storage), preallocated so that unwinding never allocates.
pub type FramehopCache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// The return address is always on the stack (pushed by `call`).
pub(crate) const RA_IN_LR: bool = false;

/// glibc's `__restore_rt`: `mov $15, %rax` (rt_sigreturn); `syscall`. A
/// signal handler returns to its first byte.
pub(crate) const SIGRETURN: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

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

pub(crate) fn framehop_regs(r: &Regs) -> UnwindRegsX86_64 {
    UnwindRegsX86_64::new(r.pc as u64, r.sp as u64, r.fp as u64)
}

/// The caller's (sp, fp) after framehop unwound a frame.
pub(crate) fn framehop_sp_fp(r: &UnwindRegsX86_64) -> (u64, u64) {
    (r.sp(), r.bp())
}
