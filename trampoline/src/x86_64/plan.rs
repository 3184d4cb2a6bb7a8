//! Which instructions the patch takes, and every reason to refuse.
//!
//! Owns: the x86-64 planning rules. Must never: emit code.
//!
//! Limits of the back-jump check: it is a linear sweep of the function's
//! bytes (to its symbol size; nothing when the size is unknown), so it sees
//! direct branches and RIP-relative operands only. An indirect branch into
//! the taken bytes (a jump table, a computed goto) cannot be seen; compilers
//! do not target a function's first instructions that way in practice.

use super::class::{class_target, decode_at, ends_flow, sweep, Class, Insn};
use super::{ENDBR64, MAX_INSN};
use crate::arch::Plan;
use crate::error::Reason;

/// The taken instructions of `plan` (re-decoded; `plan` must come from
/// [`plan`] for the same code and address).
pub(crate) fn taken(code: &[u8], addr: u64, plan: &Plan) -> Result<Vec<Insn>, Reason> {
    let mut out = Vec::with_capacity(plan.instructions);
    let mut off = plan.keep;
    let end = plan.keep + plan.taken;
    let code = code.get(..end).ok_or(Reason::TooShort {
        need: end,
        have: code.len(),
    })?;
    while off < end {
        let insn = decode_at(code, addr, off).ok_or(Reason::Undecodable {
            at: addr.wrapping_add(off as u64),
        })?;
        off += insn.len();
        out.push(insn);
    }
    Ok(out)
}

pub(crate) fn plan(
    full: &[u8],
    addr: u64,
    func_size: Option<u64>,
    patch_len: usize,
) -> Result<Plan, Reason> {
    let limit = match func_size {
        Some(s) => full.len().min(usize::try_from(s).unwrap_or(usize::MAX)),
        None => full.len(),
    };
    // Alignment padding after a function of known size (nops or int3 up to
    // the next 16-byte boundary) may be taken when the function itself is
    // too short, provided its last instruction ends the flow: those bytes
    // are never executed and belong to no function.
    let pad_end = match func_size {
        Some(_) => {
            let end = addr.wrapping_add(limit as u64);
            let boundary = (end.wrapping_add(15) & !15).wrapping_sub(addr) as usize;
            boundary.min(full.len())
        }
        None => limit,
    };
    let code = &full[..limit];
    let keep = if code.starts_with(&ENDBR64) {
        ENDBR64.len()
    } else {
        0
    };
    let start = addr.wrapping_add(keep as u64);
    let mut insns: Vec<Insn> = Vec::new();
    let mut off = keep;
    while off - keep < patch_len {
        let have = off - keep;
        if off >= code.len() {
            let flow_ended = insns.last().is_some_and(|i| ends_flow(&i.ins));
            match decode_at(&full[..pad_end], addr, off) {
                Some(pad) if flow_ended && is_padding(&pad.ins) => {
                    off += pad.len();
                    insns.push(pad);
                    continue;
                }
                _ => {
                    return Err(Reason::TooShort {
                        need: patch_len,
                        have,
                    })
                }
            }
        }
        let Some(insn) = decode_at(code, addr, off) else {
            // Cut short by the end of the function/readable bytes, or garbage.
            return Err(if decode_at_padded(code, addr, off) {
                Reason::TooShort {
                    need: patch_len,
                    have,
                }
            } else {
                Reason::Undecodable {
                    at: addr.wrapping_add(off as u64),
                }
            });
        };
        if let Err(r) = &insn.class {
            return Err(r.clone());
        }
        off += insn.len();
        let stop = ends_flow(&insn.ins);
        insns.push(insn);
        // Past an unconditional end of flow the next bytes may belong to
        // another function unless the symbol size says they are ours.
        if stop && off - keep < patch_len && func_size.is_none() {
            return Err(Reason::TooShort {
                need: patch_len,
                have: off - keep,
            });
        }
    }
    let taken = off - keep;
    let end = start.wrapping_add(taken as u64);
    let inside = |t: u64| t.wrapping_sub(start) < taken as u64;
    let boundary = |t: u64| insns.iter().any(|i| i.ip() == t);
    // Branches among the taken instructions must land on one of them.
    for i in &insns {
        let Ok(class) = &i.class else { continue };
        let Some(t) = class_target(class) else {
            continue;
        };
        match class {
            Class::RipRel { .. } => {
                if inside(t) && t != start {
                    return Err(Reason::Unrelocatable {
                        at: i.ip(),
                        what: "operand addresses the patched bytes".into(),
                    });
                }
            }
            _ => {
                if inside(t) && !boundary(t) {
                    return Err(Reason::Unrelocatable {
                        at: i.ip(),
                        what: "branch into the middle of a taken instruction".into(),
                    });
                }
            }
        }
    }
    // Code later in the function must not branch into (or address) the
    // patched bytes; the function start itself is fine (a jump there is a
    // tail call into the hook).
    if func_size.is_some() {
        back_jump_scan(code, addr, off, start, end)?;
    }
    Ok(Plan {
        keep,
        taken,
        instructions: insns.len(),
        patch_len,
    })
}

/// A filler instruction compilers put between functions.
fn is_padding(ins: &iced_x86::Instruction) -> bool {
    ins.mnemonic() == iced_x86::Mnemonic::Nop || ins.code() == iced_x86::Code::Int3
}

/// True when the bytes at `off` are a valid instruction prefix that was only
/// cut by the end of `code` (so the function is too short, not garbage).
fn decode_at_padded(code: &[u8], addr: u64, off: usize) -> bool {
    let mut padded = code[off..].to_vec();
    padded.resize(MAX_INSN + padded.len(), 0x90);
    decode_at(&padded, addr.wrapping_add(off as u64), 0).is_some_and(|i| i.len() > code.len() - off)
}

/// Linear sweep of `code[from..]`: refuse a branch or RIP-relative operand
/// whose target is in `(start, end)`.
fn back_jump_scan(code: &[u8], addr: u64, from: usize, start: u64, end: u64) -> Result<(), Reason> {
    for insn in sweep(code, addr, from) {
        // No instruction: data or padding, resynchronised at the next byte.
        let Some(insn) = insn else { continue };
        let target = match &insn.class {
            Ok(c) => class_target(c),
            // Unmovable instructions later in the function still have targets.
            Err(_) => Some(insn.ins.near_branch_target()).filter(|&t| t != 0),
        };
        if let Some(t) = target {
            if t > start && t < end {
                return Err(Reason::BranchIntoPatchedBytes {
                    at: insn.ip(),
                    target: t,
                });
            }
        }
    }
    Ok(())
}
