//! x86-64: decode (iced-x86), plan, relocate, verify and emit. All pure.
//!
//! Owns: the x86-64 implementation of [`Arch`]. The patch is a 5-byte
//! `jmp rel32` (far form: `jmp qword [rip+0]; .quad target`, 14 bytes). A
//! function starting with `endbr64` keeps it in place and is patched right
//! after it (`Plan::keep` = 4), so indirect calls still land on an
//! `endbr64`; the trampoline starts with its own `endbr64` for the same
//! reason.
//!
//! Files: `class` (what each instruction needs to be moved), `plan` (which
//! instructions are taken, refusals, back-jump scan), `relocate` (the
//! trampoline bytes, from decoded instructions or from a record of them),
//! `verify` (independent re-decode check).
//!
//! Must never: touch process memory or depend on the host architecture.

mod class;
mod plan;
mod relocate;
mod verify;

use crate::arch::{within, Arch};

pub use class::on_first_decoder;
pub(crate) use class::tables_built;

/// The x86-64 architecture (unit type implementing [`Arch`]).
#[derive(Debug, Clone, Copy)]
pub struct X86_64;

/// `endbr64`.
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Longest x86 instruction.
pub(crate) const MAX_INSN: usize = 15;

/// Absolute jump: `jmp qword [rip+0]; .quad to` (14 bytes).
pub(crate) fn abs_jmp(to: u64) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    b[6..].copy_from_slice(&to.to_le_bytes());
    b
}

/// `rel32` for an instruction ending at `next` to reach `to`, if it fits.
pub(crate) fn rel32(next: u64, to: u64) -> Option<i32> {
    i32::try_from(to.wrapping_sub(next) as i64).ok()
}

impl Arch for X86_64 {
    const NAME: &'static str = "x86-64";
    const ELF_MACHINE: u16 = 62;
    const NEAR_REACH: u64 = 1 << 31;
    const NEAR_PATCH_LEN: usize = 5;
    const FAR_PATCH_LEN: usize = 14;
    const STUB_LEN: usize = 14;
    // endbr64 + at most (14 + 14) taken bytes, each 2-byte branch growing to
    // 16 bytes, + 14-byte jump back: 4 + 14 * 16 + 14 = 242.
    const MAX_TRAMPOLINE_LEN: usize = 256;
    const CODE_ALIGN: usize = 16;
    const MAX_READ: usize = 64;
    const SELF_LOOP: &'static [u8] = &[0xeb, 0xfe];

    crate::arch::forward_pure!(
        plan: plan::plan,
        relocate: relocate::relocate,
        verify: verify::verify,
    );

    fn record(code: &[u8], addr: u64, plan: &crate::arch::Plan) -> Option<Vec<u8>> {
        relocate::record(code, addr, plan)
    }

    fn relocate_known(
        code: &[u8],
        addr: u64,
        plan: &crate::arch::Plan,
        tramp: u64,
        record: &[u8],
    ) -> Result<Vec<u8>, crate::error::Reason> {
        relocate::relocate_known(code, addr, plan, tramp, record)
    }

    fn near_patch(from: u64, to: u64) -> Option<Vec<u8>> {
        if !within(from + 5, to, Self::NEAR_REACH) {
            return None;
        }
        let mut b = vec![0xe9];
        b.extend(rel32(from + 5, to)?.to_le_bytes());
        Some(b)
    }

    fn far_patch(_from: u64, to: u64) -> Vec<u8> {
        abs_jmp(to).to_vec()
    }

    fn stub(_at: u64, to: u64) -> Vec<u8> {
        abs_jmp(to).to_vec()
    }

    fn filler(len: usize) -> Vec<u8> {
        vec![0xcc; len] // int3
    }

    fn flush_icache(_addr: u64, _len: usize) {
        // x86 keeps instruction fetch coherent with stores.
    }
}
