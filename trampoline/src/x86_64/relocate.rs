//! The trampoline bytes: taken instructions moved to another address.
//!
//! Owns: one rewrite per class (see [`Class`]):
//!
//! | original           | target in rel32 reach   | out of reach                                        |
//! |--------------------|-------------------------|-----------------------------------------------------|
//! | plain              | copied                  | copied                                              |
//! | RIP-relative op    | disp32 recomputed       | refused (`OutOfReach`)                              |
//! | `jmp rel8/rel32`   | `jmp rel32`             | `jmp [rip+0]; .quad T`                              |
//! | `jcc rel8/rel32`   | `jcc rel32`             | `j!cc +14; jmp [rip+0]; .quad T`                    |
//! | `call rel32`       | `call rel32`            | `call [rip+2]; jmp +8; .quad T`                     |
//! | `loop`/`jrcxz`...  | only to a taken insn    | refused (`Unrelocatable`)                           |
//!
//! Branches to a taken instruction go to its copy (always rel32). The
//! trampoline starts with the kept `endbr64` (if any) and ends with a jump
//! back to the first byte after the taken ones.
//!
//! Must never: touch process memory.

use super::class::Class;
use super::plan::taken;
use super::{abs_jmp, rel32};
use crate::arch::Plan;
use crate::error::Reason;

/// Append a jump from `out`'s end (at `tramp + out.len()`) to `to`.
pub(crate) fn emit_jmp(out: &mut Vec<u8>, tramp: u64, to: u64) {
    let here = tramp.wrapping_add(out.len() as u64);
    match rel32(here.wrapping_add(5), to) {
        Some(r) => {
            out.push(0xe9);
            out.extend(r.to_le_bytes());
        }
        None => out.extend(abs_jmp(to)),
    }
}

/// A rel32/rel8 field to fill once every copy's position is known.
struct Fixup {
    /// Position of the field in `out`.
    at: usize,
    /// Width of the field (1 or 4).
    width: usize,
    /// End of the instruction in `out` (the base of the displacement).
    next: usize,
    /// Original address of the taken instruction branched to.
    target: u64,
    /// Original address of the branch (for errors).
    from: u64,
}

/// Append `opcode` + a rel32 to the copy of the taken instruction at
/// `target` (filled in once every copy's position is known).
fn to_copy_rel32(
    out: &mut Vec<u8>,
    fixups: &mut Vec<Fixup>,
    opcode: &[u8],
    target: u64,
    from: u64,
) {
    out.extend_from_slice(opcode);
    fixups.push(Fixup {
        at: out.len(),
        width: 4,
        next: out.len() + 4,
        target,
        from,
    });
    out.extend([0; 4]);
}

/// One taken instruction as relocation needs it: where it is in `code`,
/// how long, and its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub off: usize,
    pub len: usize,
    pub class: Class,
}

/// The taken instructions of `plan`, decoded. A `loop`-like branch out of
/// the taken bytes is refused here, where its mnemonic is known.
fn decoded(code: &[u8], addr: u64, plan: &Plan) -> Result<Vec<Taken>, Reason> {
    let start = addr.wrapping_add(plan.keep as u64);
    let inside = |t: u64| t.wrapping_sub(start) < plan.taken as u64;
    taken(code, addr, plan)?
        .iter()
        .map(|insn| {
            let class = insn.class.clone()?;
            if let Class::Rel8Only { target } = class {
                if !inside(target) {
                    let m = super::class::branch_name(insn.ins.mnemonic());
                    return Err(Reason::Unrelocatable {
                        at: insn.ip(),
                        what: format!("{m} to outside the taken bytes"),
                    });
                }
            }
            Ok(Taken {
                off: insn.off,
                len: insn.len(),
                class,
            })
        })
        .collect()
}

pub(crate) fn relocate(code: &[u8], addr: u64, plan: &Plan, tramp: u64) -> Result<Vec<u8>, Reason> {
    emit(code, addr, plan, tramp, &decoded(code, addr, plan)?)
}

/// Bytes of one recorded instruction: offset (2), length, class tag,
/// displacement offset or condition (1 each), target - addr (8).
const RECORD_INSN: usize = 13;

/// The taken instructions of `plan` as [`relocate_known`] reads them.
pub(crate) fn record(code: &[u8], addr: u64, plan: &Plan) -> Option<Vec<u8>> {
    let insns = decoded(code, addr, plan).ok()?;
    let mut out = Vec::with_capacity(insns.len() * RECORD_INSN);
    for t in insns {
        let (tag, a, target) = match t.class {
            Class::Plain => (0u8, 0u8, addr),
            Class::RipRel { disp_off, target } => (1, u8::try_from(disp_off).ok()?, target),
            Class::Jmp { target } => (2, 0, target),
            Class::Jcc { cc, target } => (3, cc, target),
            Class::Call { target } => (4, 0, target),
            Class::Rel8Only { target } => (5, 0, target),
        };
        out.extend(u16::try_from(t.off).ok()?.to_le_bytes());
        out.push(u8::try_from(t.len).ok()?);
        out.push(tag);
        out.push(a);
        out.extend(target.wrapping_sub(addr).to_le_bytes());
    }
    Some(out)
}

/// [`relocate`] from a [`record`] of the same code: every instruction must
/// follow the previous one from `plan.keep` to the end of the taken bytes,
/// and each branch's or RIP-relative operand's displacement in `code` must
/// say the recorded target.
pub(crate) fn relocate_known(
    code: &[u8],
    addr: u64,
    plan: &Plan,
    tramp: u64,
    record: &[u8],
) -> Result<Vec<u8>, Reason> {
    let bad = || Reason::Unrelocatable {
        at: addr,
        what: "plan record does not fit the code".into(),
    };
    if !record.len().is_multiple_of(RECORD_INSN) || record.len() / RECORD_INSN != plan.instructions
    {
        return Err(bad());
    }
    let mut insns = Vec::with_capacity(plan.instructions);
    let mut next = plan.keep;
    for r in record.chunks_exact(RECORD_INSN) {
        let off = u16::from_le_bytes([r[0], r[1]]) as usize;
        let len = r[2] as usize;
        let target = addr.wrapping_add(u64::from_le_bytes(r[5..13].try_into().unwrap()));
        if off != next || len == 0 || len > super::MAX_INSN || off + len > code.len() {
            return Err(bad());
        }
        next = off + len;
        let ip_end = addr.wrapping_add(next as u64);
        // Whether the `width`-byte displacement ending at byte `field_end` of
        // the instruction says the recorded target.
        let says = |field_end: usize, width: usize| -> bool {
            let f = &code[off..off + len];
            let Some(start) = field_end.checked_sub(width) else {
                return false;
            };
            let rel = match (width, f.get(start..field_end)) {
                (4, Some(b)) => i32::from_le_bytes(b.try_into().unwrap()) as i64,
                (1, Some(b)) => b[0] as i8 as i64,
                _ => return false,
            };
            ip_end.wrapping_add(rel as u64) == target
        };
        let width = if len == 2 { 1 } else { 4 };
        let class = match r[3] {
            0 => Class::Plain,
            1 => {
                let disp_off = r[4] as usize;
                if !says(disp_off + 4, 4) {
                    return Err(bad());
                }
                Class::RipRel { disp_off, target }
            }
            2..=4 if !says(len, width) => return Err(bad()),
            2 => Class::Jmp { target },
            3 if r[4] < 16 => Class::Jcc { cc: r[4], target },
            4 => Class::Call { target },
            5 if says(len, 1) => Class::Rel8Only { target },
            _ => return Err(bad()),
        };
        insns.push(Taken { off, len, class });
    }
    if next != plan.keep + plan.taken {
        return Err(bad());
    }
    emit(code, addr, plan, tramp, &insns)
}

/// The trampoline for `plan` at `tramp` from its taken instructions.
fn emit(
    code: &[u8],
    addr: u64,
    plan: &Plan,
    tramp: u64,
    insns: &[Taken],
) -> Result<Vec<u8>, Reason> {
    let start = addr.wrapping_add(plan.keep as u64);
    let inside = |t: u64| t.wrapping_sub(start) < plan.taken as u64;
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&code[..plan.keep]);
    let mut copies: Vec<(u64, usize)> = Vec::with_capacity(insns.len());
    let mut fixups: Vec<Fixup> = Vec::new();
    for insn in insns {
        let bytes = &code[insn.off..insn.off + insn.len];
        let here = tramp.wrapping_add(out.len() as u64);
        let from = addr.wrapping_add(insn.off as u64);
        copies.push((from, out.len()));
        match insn.class {
            Class::Plain => out.extend_from_slice(bytes),
            Class::RipRel { disp_off, target } => {
                let next = here.wrapping_add(bytes.len() as u64);
                let disp = rel32(next, target).ok_or(Reason::OutOfReach { at: from, target })?;
                let at = out.len() + disp_off;
                out.extend_from_slice(bytes);
                out[at..at + 4].copy_from_slice(&disp.to_le_bytes());
            }
            Class::Jmp { target } if inside(target) => {
                to_copy_rel32(&mut out, &mut fixups, &[0xe9], target, from)
            }
            Class::Jmp { target } => emit_jmp(&mut out, tramp, target),
            Class::Jcc { cc, target } => {
                if inside(target) {
                    to_copy_rel32(&mut out, &mut fixups, &[0x0f, 0x80 | cc], target, from);
                } else if let Some(r) = rel32(here.wrapping_add(6), target) {
                    out.extend([0x0f, 0x80 | cc]);
                    out.extend(r.to_le_bytes());
                } else {
                    // Inverted condition skips the 14-byte absolute jump.
                    out.extend([0x70 | (cc ^ 1), 14]);
                    out.extend(abs_jmp(target));
                }
            }
            Class::Call { target } => {
                if inside(target) {
                    to_copy_rel32(&mut out, &mut fixups, &[0xe8], target, from);
                } else if let Some(r) = rel32(here.wrapping_add(5), target) {
                    out.push(0xe8);
                    out.extend(r.to_le_bytes());
                } else {
                    // call [rip+2]; jmp +8; .quad target
                    out.extend([0xff, 0x15, 2, 0, 0, 0, 0xeb, 8]);
                    out.extend(target.to_le_bytes());
                }
            }
            Class::Rel8Only { target } => {
                if !inside(target) {
                    return Err(Reason::Unrelocatable {
                        at: from,
                        what: "loop or jrcxz to outside the taken bytes".into(),
                    });
                }
                out.extend_from_slice(bytes);
                let at = out.len() - 1;
                fixups.push(Fixup {
                    at,
                    width: 1,
                    next: out.len(),
                    target,
                    from,
                });
            }
        }
    }
    emit_jmp(&mut out, tramp, start.wrapping_add(plan.taken as u64));
    for f in fixups {
        let to =
            copies
                .iter()
                .find(|c| c.0 == f.target)
                .map(|c| c.1)
                .ok_or(Reason::Unrelocatable {
                    at: f.from,
                    what: "branch into the middle of a taken instruction".into(),
                })?;
        let rel = to as i64 - f.next as i64;
        if f.width == 4 {
            out[f.at..f.at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        } else {
            let r = i8::try_from(rel).map_err(|_| Reason::Unrelocatable {
                at: f.from,
                what: "rel8 branch between taken instructions out of reach after widening".into(),
            })?;
            out[f.at] = r as u8;
        }
    }
    Ok(out)
}
