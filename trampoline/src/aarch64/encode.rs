//! AArch64 instruction encoders used by the relocator and the patch writer.
//!
//! Owns: turning (operation, registers, pc, target) into instruction words,
//! with range checks. Every PC-relative encoder returns `None` when the
//! target is out of its reach (or misaligned), never a truncated offset.
//!
//! Must never: decide policy (which form to use); that is `relocate`'s job.

use super::decode::LiteralKind;

/// `nop`
pub const NOP: u32 = 0xd503_201f;
/// `udf #0`: permanently undefined, traps if ever executed.
pub const UDF: u32 = 0x0000_0000;

fn offset(pc: u64, target: u64, align: u64, bits: u32) -> Option<u32> {
    let d = target.wrapping_sub(pc) as i64;
    if d % align as i64 != 0 {
        return None;
    }
    let v = d / align as i64;
    let half = 1i64 << (bits - 1);
    if v < -half || v >= half {
        return None;
    }
    Some((v as u32) & ((1u32 << bits) - 1))
}

/// `b target` (+-128 MiB).
pub fn b(pc: u64, target: u64) -> Option<u32> {
    Some(0x1400_0000 | offset(pc, target, 4, 26)?)
}

/// `bl target` (+-128 MiB).
pub fn bl(pc: u64, target: u64) -> Option<u32> {
    Some(0x9400_0000 | offset(pc, target, 4, 26)?)
}

/// `b.cond target` (+-1 MiB).
pub fn b_cond(cond: u8, pc: u64, target: u64) -> Option<u32> {
    Some(0x5400_0000 | offset(pc, target, 4, 19)? << 5 | (cond as u32 & 0xf))
}

/// `cbz`/`cbnz` (+-1 MiB).
pub fn cbz(nonzero: bool, sf: bool, rt: u8, pc: u64, target: u64) -> Option<u32> {
    let base = 0x3400_0000 | (sf as u32) << 31 | (nonzero as u32) << 24;
    Some(base | offset(pc, target, 4, 19)? << 5 | rt as u32 & 31)
}

/// `tbz`/`tbnz` (+-32 KiB).
pub fn tbz(nonzero: bool, bit: u8, rt: u8, pc: u64, target: u64) -> Option<u32> {
    let bit = bit as u32 & 63;
    let base = 0x3600_0000 | (bit >> 5) << 31 | (nonzero as u32) << 24 | (bit & 31) << 19;
    Some(base | offset(pc, target, 4, 14)? << 5 | rt as u32 & 31)
}

/// `adr xd, target` (+-1 MiB, any byte).
pub fn adr(rd: u8, pc: u64, target: u64) -> Option<u32> {
    let imm = offset(pc, target, 1, 21)?;
    Some(0x1000_0000 | (imm & 3) << 29 | (imm >> 2) << 5 | rd as u32 & 31)
}

/// `adrp xd, page` (+-4 GiB in pages); `page` must be 4 KiB aligned.
pub fn adrp(rd: u8, pc: u64, page: u64) -> Option<u32> {
    if page & 0xfff != 0 {
        return None;
    }
    let imm = offset(pc & !0xfff, page, 0x1000, 21)?;
    Some(0x9000_0000 | (imm & 3) << 29 | (imm >> 2) << 5 | rd as u32 & 31)
}

/// `ldr`/`ldrsw`/`prfm` (literal) of `kind` into `rt` from `target` (+-1 MiB).
pub fn ldr_literal(kind: LiteralKind, rt: u8, pc: u64, target: u64) -> Option<u32> {
    let base = match kind {
        LiteralKind::W => 0x1800_0000,
        LiteralKind::X => 0x5800_0000,
        LiteralKind::Sw => 0x9800_0000,
        LiteralKind::Prfm => 0xd800_0000,
        LiteralKind::S => 0x1c00_0000,
        LiteralKind::D => 0x5c00_0000,
        LiteralKind::Q => 0x9c00_0000,
    };
    Some(base | offset(pc, target, 4, 19)? << 5 | rt as u32 & 31)
}

/// `ldr`/`ldrsw`/`prfm` of `kind` into `rt` from `[xn]` (unsigned offset 0).
pub fn ldr_base(kind: LiteralKind, rt: u8, xn: u8) -> u32 {
    let base = match kind {
        LiteralKind::W => 0xb940_0000,
        LiteralKind::X => 0xf940_0000,
        LiteralKind::Sw => 0xb980_0000,
        LiteralKind::Prfm => 0xf980_0000,
        LiteralKind::S => 0xbd40_0000,
        LiteralKind::D => 0xfd40_0000,
        LiteralKind::Q => 0x3dc0_0000,
    };
    base | (xn as u32 & 31) << 5 | rt as u32 & 31
}

/// `br xn`
pub fn br(xn: u8) -> u32 {
    0xd61f_0000 | (xn as u32 & 31) << 5
}

/// `blr xn`
pub fn blr(xn: u8) -> u32 {
    0xd63f_0000 | (xn as u32 & 31) << 5
}
