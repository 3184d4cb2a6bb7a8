//! AArch64 planning and relocation: which instructions the patch takes, and
//! the trampoline that runs them at another address.
//!
//! Owns: the refusal rules (too short, branch or literal into the patched
//! bytes, PC-dependent forms we cannot move, no scratch register) and one
//! rewrite per PC-relative class. Every class reaches any 64-bit target:
//! the short re-encoded form is used when the target is within the
//! instruction's own reach from the trampoline, otherwise the target goes
//! through an 8-byte literal in the pool after the code:
//!
//! | original            | in reach           | out of reach                                  |
//! |---------------------|--------------------|-----------------------------------------------|
//! | `ldr w/x/sw rt, L`  | same, re-encoded   | `ldr xrt, =L; ldr w/x/sw rt, [xrt]`            |
//! | `ldr s/d/q, prfm L` | same, re-encoded   | `ldr xS, =L; ldr s/d/q rt, [xS]`               |
//! | `adr xd, L`         | same, re-encoded   | `ldr xd, =L`                                   |
//! | `adrp xd, P`        | same, re-encoded   | `ldr xd, =P`                                   |
//! | `b L`               | same, re-encoded   | `ldr xS, =L; br xS`                            |
//! | `bl L`              | same, re-encoded   | `ldr x30, =L; blr x30` (returns to the next trampoline instruction) |
//! | `b.c/cbz/tbz L`     | same, re-encoded   | inverted test over `b L`, or over `ldr xS, =L; br xS` |
//!
//! Branches whose target is one of the taken instructions go to its copy.
//! The trampoline ends with a jump back (`b`, or `ldr xS, =ret; br xS`).
//!
//! Registers: the scratch `xS` is x16 or x17 (IP0/IP1), whichever no taken
//! instruction names; it is only written when a target is out of reach of
//! the short form. The far patch and the entry stub clobber x16 before any
//! original instruction runs (at a function's entry x16/x17 are dead under
//! the AAPCS64). Nothing else is clobbered.
//!
//! Must never: read process memory or touch the host; everything is a pure
//! function of (bytes, addresses).

use super::decode::{decode, is_bti, may_use_gpr, pc_dependent_unknown, Insn, LiteralKind};
use super::encode;
use crate::arch::Plan;
use crate::error::Reason;

/// Scratch candidates, in order of preference.
const SCRATCH: [u8; 2] = [16, 17];

fn word_at(code: &[u8], off: usize) -> Option<u32> {
    let b = code.get(off..off + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// True when `insn` at some PC could need the scratch register in the
/// trampoline (only when its target is out of the short form's reach).
fn may_need_scratch(insn: &Insn) -> bool {
    match *insn {
        Insn::B { .. } | Insn::BCond { .. } | Insn::Cbz { .. } | Insn::Tbz { .. } => true,
        Insn::Literal { kind, rt, .. } => !kind.writes_gpr() || rt == 31,
        _ => false,
    }
}

/// The first scratch register no taken instruction names.
fn scratch_for(words: &[u32]) -> Option<u8> {
    SCRATCH
        .into_iter()
        .find(|&r| !words.iter().any(|&w| may_use_gpr(w, r)))
}

/// `b`, `br`, `ret` (and the authenticated forms): control never falls
/// through to the next instruction.
fn ends_flow(word: u32) -> bool {
    matches!(decode(word, 0), Insn::B { .. })
        || word & 0xffff_fc1f == 0xd61f_0000 // br
        || word & 0xffff_fc1f == 0xd65f_0000 // ret
        || word & 0xffff_fbff == 0xd65f_0bff // retaa, retab
        || word & 0xfeff_f800 == 0xd61f_0800 // braa(z), brab(z)
}

fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a < b.wrapping_add(b_len) && b < a.wrapping_add(a_len.max(1))
}

/// See [`crate::arch::Arch::plan`].
pub fn plan(
    code: &[u8],
    addr: u64,
    func_size: Option<u64>,
    patch_len: usize,
) -> Result<Plan, Reason> {
    if addr & 3 != 0 {
        return Err(Reason::Unrelocatable {
            at: addr,
            what: "address not 4-byte aligned".into(),
        });
    }
    let keep = match word_at(code, 0) {
        Some(w) if is_bti(w) => 4,
        _ => 0,
    };
    // The far patch is 16 bytes where its literal falls on an 8-byte
    // boundary (see `patch::far_patch_len`); only then are 4 instructions
    // enough.
    let patch_len = if patch_len == super::FAR_PATCH_LEN {
        super::patch::far_patch_len(addr + keep as u64)
    } else {
        patch_len
    };
    let taken = patch_len.div_ceil(4) * 4;
    let instructions = taken / 4;
    let avail = match func_size {
        Some(size) => (size as usize).min(code.len()),
        None => code.len(),
    };
    let have = avail.saturating_sub(keep);
    if have < taken {
        return Err(Reason::TooShort { need: taken, have });
    }
    let start = addr + keep as u64;
    let end = start + taken as u64;
    let words: Vec<u32> = (0..instructions)
        .map(|i| word_at(code, keep + 4 * i).unwrap())
        .collect();
    for (i, &w) in words.iter().enumerate() {
        let pc = start + 4 * i as u64;
        if func_size.is_none() && i + 1 < instructions && ends_flow(w) {
            // Without a symbol size, what follows may be another function.
            return Err(Reason::TooShort {
                need: taken,
                have: 4 * (i + 1),
            });
        }
        if let Some(what) = pc_dependent_unknown(w) {
            return Err(Reason::Unrelocatable {
                at: pc,
                what: what.into(),
            });
        }
    }
    let needs_scratch = patch_len > super::NEAR_PATCH_LEN
        || words
            .iter()
            .enumerate()
            .any(|(i, &w)| may_need_scratch(&decode(w, start + 4 * i as u64)));
    if needs_scratch && scratch_for(&words).is_none() {
        return Err(Reason::Unrelocatable {
            at: start,
            what: "uses both x16 and x17, no scratch register".into(),
        });
    }
    // Every instruction of the function (taken or not) that reads from, or
    // branches or points into, the overwritten bytes.
    let scan_end = if func_size.is_some() {
        avail
    } else {
        keep + taken
    };
    let mut off = 0;
    while off + 4 <= scan_end {
        let pc = addr + off as u64;
        let insn = decode(word_at(code, off).unwrap(), pc);
        let taken_insn = pc >= start && pc < end;
        match insn {
            Insn::Literal { kind, target, .. }
                if overlaps(target, kind.size(), start, taken as u64) =>
            {
                return Err(Reason::Unrelocatable {
                    at: pc,
                    what: "literal load from the patched bytes".into(),
                });
            }
            Insn::Adr { target, .. }
                if !taken_insn && target != addr && target >= start && target < end =>
            {
                return Err(Reason::BranchIntoPatchedBytes { at: pc, target });
            }
            _ if insn.is_branch() && !taken_insn => {
                let target = insn.target().unwrap();
                if target != addr && target >= start && target < end {
                    return Err(Reason::BranchIntoPatchedBytes { at: pc, target });
                }
            }
            _ => {}
        }
        off += 4;
    }
    Ok(Plan {
        keep,
        taken,
        instructions,
        patch_len,
    })
}

/// Code being laid out: words, literal pool and pending fix-ups.
struct Emitter {
    tramp: u64,
    words: Vec<u32>,
    literals: Vec<u64>,
    /// (word index, register): `ldr xR, =literals[i]`.
    literal_fix: Vec<(usize, u8, usize)>,
    /// (word index, instruction with its target = index of a taken instruction).
    internal_fix: Vec<(usize, Insn, usize)>,
    scratch: Option<u8>,
    at: u64,
}

impl Emitter {
    fn pc(&self) -> u64 {
        self.tramp + 4 * self.words.len() as u64
    }

    fn scratch(&self) -> Result<u8, Reason> {
        self.scratch.ok_or(Reason::Unrelocatable {
            at: self.at,
            what: "uses both x16 and x17, no scratch register".into(),
        })
    }

    /// `ldr xreg, =value`
    fn load_literal(&mut self, reg: u8, value: u64) {
        self.literal_fix
            .push((self.words.len(), reg, self.literals.len()));
        self.literals.push(value);
        self.words.push(encode::NOP);
    }

    /// Unconditional jump to `target` from the current position.
    fn jump(&mut self, target: u64) -> Result<(), Reason> {
        match encode::b(self.pc(), target) {
            Some(w) => self.words.push(w),
            None => {
                let s = self.scratch()?;
                self.load_literal(s, target);
                self.words.push(encode::br(s));
            }
        }
        Ok(())
    }

    /// A conditional branch (`short` re-encodes it for a pc and target, `invert`
    /// gives the opposite test) to an external `target`.
    fn conditional(
        &mut self,
        target: u64,
        short: impl Fn(u64, u64) -> Option<u32>,
        inverted: impl Fn(u64, u64) -> Option<u32>,
    ) -> Result<(), Reason> {
        let pc = self.pc();
        if let Some(w) = short(pc, target) {
            self.words.push(w);
            return Ok(());
        }
        let skip = if encode::b(pc + 4, target).is_some() {
            8
        } else {
            12
        };
        self.words
            .push(inverted(pc, pc + skip).expect("skip over the jump is in reach"));
        self.jump(target)
    }
}

/// Copy `insn` with its target replaced, for a branch between taken instructions.
fn retarget(insn: Insn, pc: u64, target: u64) -> Option<u32> {
    match insn {
        Insn::B { .. } => encode::b(pc, target),
        Insn::Bl { .. } => encode::bl(pc, target),
        Insn::BCond { cond, .. } => encode::b_cond(cond, pc, target),
        Insn::Cbz {
            nonzero, sf, rt, ..
        } => encode::cbz(nonzero, sf, rt, pc, target),
        Insn::Tbz {
            nonzero, bit, rt, ..
        } => encode::tbz(nonzero, bit, rt, pc, target),
        _ => None,
    }
}

/// See [`crate::arch::Arch::relocate`].
pub fn relocate(code: &[u8], addr: u64, plan: &Plan, tramp: u64) -> Result<Vec<u8>, Reason> {
    if tramp & 3 != 0 {
        return Err(Reason::Unrelocatable {
            at: addr,
            what: "trampoline not 4-byte aligned".into(),
        });
    }
    let start = addr + plan.keep as u64;
    let end = start + plan.taken as u64;
    let words: Vec<u32> = (0..plan.instructions)
        .map(|i| {
            word_at(code, plan.keep + 4 * i).ok_or(Reason::TooShort {
                need: plan.taken,
                have: code.len(),
            })
        })
        .collect::<Result<_, _>>()?;
    let mut e = Emitter {
        tramp,
        words: Vec::new(),
        literals: Vec::new(),
        literal_fix: Vec::new(),
        internal_fix: Vec::new(),
        scratch: scratch_for(&words),
        at: start,
    };
    for k in 0..plan.keep / 4 {
        e.words.push(word_at(code, 4 * k).unwrap());
    }
    let mut copies = Vec::with_capacity(plan.instructions);
    for (i, &w) in words.iter().enumerate() {
        let pc = start + 4 * i as u64;
        e.at = pc;
        copies.push(e.words.len());
        let insn = decode(w, pc);
        // A branch to one of the taken instructions goes to its copy.
        if insn.is_branch() {
            let t = insn.target().unwrap();
            if t >= start && t < end {
                e.internal_fix
                    .push((e.words.len(), insn, ((t - start) / 4) as usize));
                e.words.push(encode::NOP);
                continue;
            }
        }
        let pc_new = e.pc();
        match insn {
            Insn::Other(w) => e.words.push(w),
            Insn::B { target } => e.jump(target)?,
            Insn::BCond { cond, target } if cond >= 14 => e.jump(target)?,
            Insn::Bl { target } => match encode::bl(pc_new, target) {
                Some(w) => e.words.push(w),
                None => {
                    e.load_literal(30, target);
                    e.words.push(encode::blr(30));
                }
            },
            Insn::BCond { cond, target } => e.conditional(
                target,
                |p, t| encode::b_cond(cond, p, t),
                |p, t| encode::b_cond(cond ^ 1, p, t),
            )?,
            Insn::Cbz {
                nonzero,
                sf,
                rt,
                target,
            } => e.conditional(
                target,
                |p, t| encode::cbz(nonzero, sf, rt, p, t),
                |p, t| encode::cbz(!nonzero, sf, rt, p, t),
            )?,
            Insn::Tbz {
                nonzero,
                bit,
                rt,
                target,
            } => e.conditional(
                target,
                |p, t| encode::tbz(nonzero, bit, rt, p, t),
                |p, t| encode::tbz(!nonzero, bit, rt, p, t),
            )?,
            Insn::Adr { rd, target } => match encode::adr(rd, pc_new, target) {
                Some(w) => e.words.push(w),
                None => e.load_literal(rd, target),
            },
            Insn::Adrp { rd, target } => match encode::adrp(rd, pc_new, target) {
                Some(w) => e.words.push(w),
                None => e.load_literal(rd, target),
            },
            Insn::Literal { kind, rt, target } => {
                match encode::ldr_literal(kind, rt, pc_new, target) {
                    Some(w) => e.words.push(w),
                    None => {
                        let base = if kind.writes_gpr() && rt != 31 {
                            rt
                        } else {
                            e.scratch()?
                        };
                        e.load_literal(base, target);
                        e.words.push(encode::ldr_base(kind, rt, base));
                    }
                }
            }
        }
    }
    e.at = end;
    e.jump(end)?;
    for &(at, insn, index) in &e.internal_fix {
        let pc = tramp + 4 * at as u64;
        let target = tramp + 4 * copies[index] as u64;
        e.words[at] = retarget(insn, pc, target).expect("branch inside the trampoline is in reach");
    }
    if !e.literals.is_empty() && e.pc() & 7 != 0 {
        e.words.push(encode::UDF);
    }
    let pool = e.pc();
    for &(at, reg, index) in &e.literal_fix {
        let pc = tramp + 4 * at as u64;
        e.words[at] = encode::ldr_literal(LiteralKind::X, reg, pc, pool + 8 * index as u64)
            .expect("literal pool is in reach");
    }
    let mut out: Vec<u8> = e.words.iter().flat_map(|w| w.to_le_bytes()).collect();
    for lit in &e.literals {
        out.extend_from_slice(&lit.to_le_bytes());
    }
    Ok(out)
}
