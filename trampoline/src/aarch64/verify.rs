//! Independent check of an AArch64 relocation, used by the survey and the
//! property tests.
//!
//! Owns: turning both the original taken instructions and the trampoline
//! into a list of `Effect`s (copy this word, jump/call/branch-if to an
//! absolute address, set a register to an address, load from an absolute
//! address) and comparing the two lists. Both sides are decoded with
//! yaxpeax-arm, not with the mask decoder the relocator uses, and the
//! trampoline's literal pool is read back from the output bytes, so a wrong
//! encoding or a wrong literal shows up as a mismatch.
//!
//! Must never: execute anything or read process memory.

use super::decode::{may_use_gpr, yaxpeax};
use crate::arch::Plan;
use yaxpeax_arm::armv8::a64::{Opcode, Operand, SizeCode};

/// Where a branch goes: an absolute address outside the taken bytes, or the
/// copy of the n-th instruction of the trampoline's effect list.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Abs(u64),
    Copy(usize),
}

/// A conditional test: opcode and its non-PC operands.
type Test = (Opcode, [Operand; 4]);

#[derive(Debug, Clone, PartialEq)]
enum Effect {
    Copy(u32),
    Jump(Target),
    Call(Target),
    BranchIf(Test, Target),
    SetReg(u16, u64),
    Load {
        opcode: Opcode,
        dest: Operand,
        addr: u64,
    },
    /// A PC-relative form this checker does not model; a relocation
    /// containing one fails verification.
    Unknown(u32),
}

fn word(bytes: &[u8], off: usize) -> Option<u32> {
    let b = bytes.get(off..off + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The PC-relative operand's absolute value, and the remaining operands.
fn split(op: Opcode, ops: &[Operand; 4], pc: u64) -> Option<(u64, [Operand; 4])> {
    let mut rest = *ops;
    let mut target = None;
    for o in rest.iter_mut() {
        if let Operand::PCOffset(off) = *o {
            target = Some(if op == Opcode::ADRP {
                (pc & !0xfff).wrapping_add(off as u64)
            } else {
                pc.wrapping_add(off as u64)
            });
            *o = Operand::Nothing;
        }
    }
    Some((target?, rest))
}

fn invert(test: Test) -> Option<Test> {
    let op = match test.0 {
        Opcode::Bcc(c) => Opcode::Bcc(c ^ 1),
        Opcode::CBZ => Opcode::CBNZ,
        Opcode::CBNZ => Opcode::CBZ,
        Opcode::TBZ => Opcode::TBNZ,
        Opcode::TBNZ => Opcode::TBZ,
        _ => return None,
    };
    Some((op, test.1))
}

fn is_conditional(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Bcc(_) | Opcode::CBZ | Opcode::CBNZ | Opcode::TBZ | Opcode::TBNZ
    )
}

/// Effect of one instruction on its own (no idioms); branch targets absolute.
fn single(w: u32, pc: u64) -> Effect {
    let Some(inst) = yaxpeax(w) else {
        return Effect::Copy(w);
    };
    let Some((t, rest)) = split(inst.opcode, &inst.operands, pc) else {
        return Effect::Copy(w);
    };
    // `bc.cond` (FEAT_HBC) is `b.cond` plus a hint.
    let opcode = match inst.opcode {
        Opcode::BCcc(c) => Opcode::Bcc(c),
        op => op,
    };
    match opcode {
        Opcode::B => Effect::Jump(Target::Abs(t)),
        Opcode::Bcc(c) if c >= 14 => Effect::Jump(Target::Abs(t)),
        Opcode::BL => Effect::Call(Target::Abs(t)),
        op if is_conditional(op) => Effect::BranchIf((op, rest), Target::Abs(t)),
        Opcode::ADR | Opcode::ADRP => match inst.operands[0] {
            Operand::Register(SizeCode::X, r) => Effect::SetReg(r, t),
            _ => Effect::Copy(w),
        },
        Opcode::LDR | Opcode::LDRSW | Opcode::PRFM => Effect::Load {
            opcode,
            dest: inst.operands[0],
            addr: t,
        },
        _ => Effect::Unknown(w),
    }
}

/// Effects of the original kept and taken instructions, followed by the
/// jump back; branches into the taken bytes become `Target::Copy`.
fn original_effects(code: &[u8], addr: u64, plan: &Plan) -> Result<Vec<Effect>, String> {
    let start = addr + plan.keep as u64;
    let end = start + plan.taken as u64;
    let kept = plan.keep / 4;
    let mut out = Vec::new();
    for i in 0..kept + plan.instructions {
        let pc = addr + 4 * i as u64;
        let w = word(code, 4 * i).ok_or("code shorter than the plan")?;
        let mut e = single(w, pc);
        let map = |t: Target| match t {
            Target::Abs(a) if a >= start && a < end => {
                Target::Copy(kept + ((a - start) / 4) as usize)
            }
            t => t,
        };
        match &mut e {
            Effect::Jump(t) | Effect::Call(t) | Effect::BranchIf(_, t) => *t = map(*t),
            _ => {}
        }
        out.push(e);
    }
    out.push(Effect::Jump(Target::Abs(end)));
    Ok(out)
}

/// Base register of a `[xN]` operand, if that is what `op` is.
fn base_of(op: &Operand) -> Option<u16> {
    match *op {
        Operand::RegPreIndex(n, 0, false) => Some(n),
        _ => None,
    }
}

/// Effects of the trampoline `out` at `tramp`, recognising the idioms the
/// relocator uses (literal + load/br/blr, inverted test over a jump) where
/// the expected effect at that position is of that kind (so an original
/// `adrp x16, P; ldr d0, [x16]` is not mistaken for a rewritten `ldr d0, L`).
/// Also returns the registers written as a side effect (scratch).
fn trampoline_effects(
    out: &[u8],
    tramp: u64,
    want: &[Effect],
) -> Result<(Vec<Effect>, Vec<u16>), String> {
    let count = want.len();
    let lit = |pc: u64, w: u32| -> Option<(u16, u64)> {
        let inst = yaxpeax(w)?;
        if inst.opcode != Opcode::LDR {
            return None;
        }
        let Operand::Register(SizeCode::X, r) = inst.operands[0] else {
            return None;
        };
        let (a, _) = split(inst.opcode, &inst.operands, pc)?;
        let off = a.checked_sub(tramp)? as usize;
        let b = out.get(off..off + 8)?;
        Some((r, u64::from_le_bytes(b.try_into().unwrap())))
    };
    let mut effects = Vec::new();
    let mut starts = Vec::new();
    let mut clobbered = Vec::new();
    let mut off = 0usize;
    while effects.len() < count {
        let pc = tramp + off as u64;
        let w = word(out, off)
            .ok_or_else(|| format!("trampoline ends at +{off:#x} before all effects"))?;
        starts.push(off);
        let expect = &want[effects.len()];
        if let Some((r, value)) = lit(pc, w) {
            // `ldr xR, =value` followed by a use of xR, or alone.
            let combine = matches!(
                expect,
                Effect::Jump(Target::Abs(_)) | Effect::Call(Target::Abs(_)) | Effect::Load { .. }
            );
            let next = if combine {
                word(out, off + 4).and_then(yaxpeax)
            } else {
                None
            };
            let e = match next {
                Some(n)
                    if n.opcode == Opcode::BR
                        && n.operands[0] == Operand::Register(SizeCode::X, r) =>
                {
                    clobbered.push(r);
                    Some(Effect::Jump(Target::Abs(value)))
                }
                Some(n)
                    if n.opcode == Opcode::BLR
                        && n.operands[0] == Operand::Register(SizeCode::X, r) =>
                {
                    if r != 30 {
                        clobbered.push(r);
                    }
                    Some(Effect::Call(Target::Abs(value)))
                }
                Some(n)
                    if base_of(&n.operands[1]) == Some(r)
                        && matches!(n.opcode, Opcode::LDR | Opcode::LDRSW | Opcode::PRFM) =>
                {
                    if n.operands[0] != Operand::Register(SizeCode::X, r)
                        && n.operands[0] != Operand::Register(SizeCode::W, r)
                    {
                        clobbered.push(r);
                    }
                    Some(Effect::Load {
                        opcode: n.opcode,
                        dest: n.operands[0],
                        addr: value,
                    })
                }
                _ => None,
            };
            match e {
                Some(e) => {
                    effects.push(e);
                    off += 8;
                }
                None => {
                    effects.push(Effect::SetReg(r, value));
                    off += 4;
                }
            }
            continue;
        }
        let e = single(w, pc);
        if let (Effect::BranchIf(test, Target::Abs(t)), Effect::BranchIf(_, Target::Abs(_))) =
            (&e, expect)
        {
            // (only for targets outside the taken bytes: inside ones are never rewritten)
            // Inverted test jumping over `b T` or over `ldr xS, =T; br xS`.
            let over = match t.wrapping_sub(pc) {
                8 => word(out, off + 4).map(|n| single(n, pc + 4)),
                12 => word(out, off + 4)
                    .and_then(|n| lit(pc + 4, n))
                    .and_then(|(r, v)| {
                        let n = word(out, off + 8).and_then(yaxpeax)?;
                        (n.opcode == Opcode::BR
                            && n.operands[0] == Operand::Register(SizeCode::X, r))
                        .then(|| {
                            clobbered.push(r);
                            Effect::Jump(Target::Abs(v))
                        })
                    }),
                _ => None,
            };
            if let Some(Effect::Jump(j)) = over {
                effects.push(Effect::BranchIf(invert(*test).ok_or("not invertible")?, j));
                off = (t - tramp) as usize;
                continue;
            }
        }
        effects.push(e);
        off += 4;
    }
    // Branches into the trampoline's own code become references to copies.
    let code_end = off as u64;
    for e in effects.iter_mut() {
        if let Effect::Jump(t) | Effect::Call(t) | Effect::BranchIf(_, t) = e {
            if let Target::Abs(a) = *t {
                if a >= tramp && a < tramp + code_end {
                    let idx = starts
                        .iter()
                        .position(|&s| s as u64 == a - tramp)
                        .ok_or_else(|| {
                            format!("branch to {a:#x} into the middle of a rewritten sequence")
                        })?;
                    *t = Target::Copy(idx);
                }
            }
        }
    }
    Ok((effects, clobbered))
}

/// See [`crate::arch::Arch::verify`].
pub fn verify(code: &[u8], addr: u64, plan: &Plan, tramp: u64, out: &[u8]) -> Result<(), String> {
    let want = original_effects(code, addr, plan)?;
    let (got, clobbered) = trampoline_effects(out, tramp, &want)?;
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        if let Effect::Unknown(x) = w {
            return Err(format!(
                "effect {i}: unmodelled PC-relative instruction {x:08x}"
            ));
        }
        if w != g {
            return Err(format!("effect {i}: original {w:x?}, trampoline {g:x?}"));
        }
    }
    let taken: Vec<u32> = (0..plan.instructions)
        .filter_map(|i| word(code, plan.keep + 4 * i))
        .collect();
    for r in clobbered {
        if !(r == 16 || r == 17) || taken.iter().any(|&w| may_use_gpr(w, r as u8)) {
            return Err(format!(
                "trampoline clobbers x{r}, which is not a free scratch register"
            ));
        }
    }
    Ok(())
}
