//! AArch64 instruction classification: which of the PC-relative forms an
//! instruction word is, and where it points.
//!
//! Owns: the mask/prototype matching of the eleven PC-relative classes (ldr
//! literal for w/x/s/d/q, ldrsw literal, prfm literal, adr, adrp, b, bl,
//! b.cond, cbz/cbnz, tbz/tbnz), the cross-check of that matching against the
//! independent yaxpeax-arm decoder, and the question "does this instruction
//! name x16/x17" used to pick a scratch register.
//!
//! Must never: emit code or read process memory. Pure functions of
//! `(word, pc)`.

use yaxpeax_arch::{Decoder, U8Reader};
use yaxpeax_arm::armv8::a64::{InstDecoder, Instruction, Opcode, Operand};

/// Which register file and width an `ldr (literal)` loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LiteralKind {
    /// `ldr wN, label` (4 bytes, zero-extended).
    W,
    /// `ldr xN, label` (8 bytes).
    X,
    /// `ldrsw xN, label` (4 bytes, sign-extended).
    Sw,
    /// `prfm op, label` (a hint: no register written).
    Prfm,
    /// `ldr sN, label` (4 bytes, SIMD&FP).
    S,
    /// `ldr dN, label` (8 bytes, SIMD&FP).
    D,
    /// `ldr qN, label` (16 bytes, SIMD&FP).
    Q,
}

impl LiteralKind {
    /// Bytes read from memory.
    pub fn size(self) -> u64 {
        match self {
            LiteralKind::W | LiteralKind::Sw | LiteralKind::S => 4,
            LiteralKind::X | LiteralKind::D => 8,
            LiteralKind::Q => 16,
            LiteralKind::Prfm => 0,
        }
    }

    /// True when the destination is a general-purpose register (which can
    /// then serve as its own address register when relocated).
    pub fn writes_gpr(self) -> bool {
        matches!(self, LiteralKind::W | LiteralKind::X | LiteralKind::Sw)
    }
}

/// One decoded instruction, with every PC-relative operand turned into an
/// absolute address. Everything that does not depend on the PC is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insn {
    /// `b target`
    B { target: u64 },
    /// `bl target`
    Bl { target: u64 },
    /// `b.cond target` (also `bc.cond`, decoded as `b.cond`); `cond` is 0..=15.
    BCond { cond: u8, target: u64 },
    /// `cbz`/`cbnz` (`nonzero`) on `wN` or `xN` (`sf`).
    Cbz {
        nonzero: bool,
        sf: bool,
        rt: u8,
        target: u64,
    },
    /// `tbz`/`tbnz` (`nonzero`) testing `bit` (0..=63) of `rt`.
    Tbz {
        nonzero: bool,
        bit: u8,
        rt: u8,
        target: u64,
    },
    /// `adr xd, target`
    Adr { rd: u8, target: u64 },
    /// `adrp xd, page`: `target` is the 4 KiB page address written to `xd`.
    Adrp { rd: u8, target: u64 },
    /// `ldr`/`ldrsw`/`prfm` (literal) reading at `target`.
    Literal {
        kind: LiteralKind,
        rt: u8,
        target: u64,
    },
    /// Any other instruction word; position independent.
    Other(u32),
}

fn sext(value: u32, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((value as u64) << shift) as i64 >> shift
}

fn rel(pc: u64, offset: i64) -> u64 {
    pc.wrapping_add(offset as u64)
}

/// Classify one instruction word located at `pc`.
pub fn decode(word: u32, pc: u64) -> Insn {
    let rt = (word & 31) as u8;
    let imm19 = || sext((word >> 5) & 0x7_ffff, 19) * 4;
    if word & 0x7c00_0000 == 0x1400_0000 {
        let target = rel(pc, sext(word & 0x03ff_ffff, 26) * 4);
        return if word >> 31 == 0 {
            Insn::B { target }
        } else {
            Insn::Bl { target }
        };
    }
    if word & 0xff00_0000 == 0x5400_0000 {
        return Insn::BCond {
            cond: (word & 0xf) as u8,
            target: rel(pc, imm19()),
        };
    }
    if word & 0x7e00_0000 == 0x3400_0000 {
        return Insn::Cbz {
            nonzero: word & (1 << 24) != 0,
            sf: word >> 31 != 0,
            rt,
            target: rel(pc, imm19()),
        };
    }
    if word & 0x7e00_0000 == 0x3600_0000 {
        let bit = (((word >> 31) << 5) | ((word >> 19) & 31)) as u8;
        return Insn::Tbz {
            nonzero: word & (1 << 24) != 0,
            bit,
            rt,
            target: rel(pc, sext((word >> 5) & 0x3fff, 14) * 4),
        };
    }
    if word & 0x1f00_0000 == 0x1000_0000 {
        let imm = sext((((word >> 5) & 0x7_ffff) << 2) | ((word >> 29) & 3), 21);
        return if word >> 31 == 0 {
            Insn::Adr {
                rd: rt,
                target: rel(pc, imm),
            }
        } else {
            Insn::Adrp {
                rd: rt,
                target: rel(pc & !0xfff, imm << 12),
            }
        };
    }
    if word & 0x3b00_0000 == 0x1800_0000 {
        let vector = word & (1 << 26) != 0;
        let kind = match (vector, word >> 30) {
            (false, 0) => LiteralKind::W,
            (false, 1) => LiteralKind::X,
            (false, 2) => LiteralKind::Sw,
            (false, _) => LiteralKind::Prfm,
            (true, 0) => LiteralKind::S,
            (true, 1) => LiteralKind::D,
            (true, 2) => LiteralKind::Q,
            (true, _) => return Insn::Other(word), // unallocated
        };
        return Insn::Literal {
            kind,
            rt,
            target: rel(pc, imm19()),
        };
    }
    Insn::Other(word)
}

impl Insn {
    /// Where control may go (branches) or which address is computed or read
    /// (adr/adrp/literal); `None` for position-independent instructions.
    pub fn target(&self) -> Option<u64> {
        match *self {
            Insn::B { target }
            | Insn::Bl { target }
            | Insn::BCond { target, .. }
            | Insn::Cbz { target, .. }
            | Insn::Tbz { target, .. }
            | Insn::Adr { target, .. }
            | Insn::Adrp { target, .. }
            | Insn::Literal { target, .. } => Some(target),
            Insn::Other(_) => None,
        }
    }

    /// True for instructions that transfer control to their target.
    pub fn is_branch(&self) -> bool {
        matches!(
            self,
            Insn::B { .. }
                | Insn::Bl { .. }
                | Insn::BCond { .. }
                | Insn::Cbz { .. }
                | Insn::Tbz { .. }
        )
    }
}

/// `bti`, `bti c`, `bti j`, `bti jc`: the landing pads an indirect branch
/// must hit on a BTI-guarded page. Kept in place at the function start.
pub fn is_bti(word: u32) -> bool {
    word & 0xffff_ff3f == 0xd503_241f
}

/// Decode with yaxpeax-arm (the independent decoder).
pub fn yaxpeax(word: u32) -> Option<Instruction> {
    let bytes = word.to_le_bytes();
    let mut reader = U8Reader::new(&bytes);
    InstDecoder::default().decode(&mut reader).ok()
}

/// Absolute address yaxpeax-arm sees in `word` at `pc` (its `PCOffset`
/// operand, page-relative for `adrp`), or `None` if it reports none or
/// cannot decode the word.
pub fn yaxpeax_target(word: u32, pc: u64) -> Option<u64> {
    let inst = yaxpeax(word)?;
    inst.operands.iter().find_map(|op| match *op {
        Operand::PCOffset(off) if inst.opcode == Opcode::ADRP => Some(rel(pc & !0xfff, off)),
        Operand::PCOffset(off) => Some(rel(pc, off)),
        _ => None,
    })
}

/// Instructions that depend on the PC without a PC-relative operand our
/// classes cover (FEAT_PAuth_LR signs/authenticates with the PC as
/// modifier). Moving them would change their result: refuse.
pub fn pc_dependent_unknown(word: u32) -> Option<&'static str> {
    if !matches!(decode(word, 0), Insn::Other(_)) {
        return None;
    }
    let inst = yaxpeax(word)?;
    if matches!(
        inst.opcode,
        Opcode::PACIASPPC | Opcode::PACIBSPPC | Opcode::PACNBIASPPC | Opcode::PACNBIBSPPC
    ) {
        return Some("signs with the PC as modifier (FEAT_PAuth_LR)");
    }
    if inst
        .operands
        .iter()
        .any(|op| matches!(op, Operand::PCOffset(_)))
    {
        return Some("PC-relative form not supported");
    }
    None
}

/// Whether `word` may read or write general-purpose register `reg`
/// (0..=30). Exact when yaxpeax-arm decodes the word; otherwise
/// conservative: any 5-bit register field (Rt, Rn, Rt2/Ra, Rm) equal to
/// `reg` counts.
pub fn may_use_gpr(word: u32, reg: u8) -> bool {
    let reg = reg as u16;
    let Some(inst) = yaxpeax(word) else {
        return [0, 5, 10, 16]
            .iter()
            .any(|shift| (word >> shift) & 31 == reg as u32);
    };
    inst.operands.iter().any(|op| match *op {
        Operand::Register(_, r) | Operand::RegisterOrSP(_, r) => r == reg,
        Operand::RegisterPair(_, r) => r == reg || r + 1 == reg,
        Operand::RegShift(_, _, _, r) => r == reg,
        Operand::RegRegOffset(a, b, ..) | Operand::RegPostIndexReg(a, b) => a == reg || b == reg,
        Operand::RegPreIndex(r, ..) | Operand::RegPostIndex(r, _) => r == reg,
        _ => false,
    })
}
