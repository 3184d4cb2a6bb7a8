//! Independent check of a trampoline: decode the output again and compare
//! every absolute branch and memory target with the original instructions.
//!
//! Owns: recognising the output forms of `relocate` from their decoded
//! instructions (not from the emitter's state). Must never: emit code.

use super::class::{decode_at, Class, Insn};
use super::plan::taken;
use crate::arch::Plan;
use iced_x86::Code;

fn u64_at(out: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(out.get(o..o + 8)?.try_into().ok()?))
}

/// `jmp qword [rip+0]; .quad T` at `o`: returns T.
fn abs_jump_at(out: &[u8], tramp: u64, o: usize) -> Option<u64> {
    let j = decode_at(out, tramp, o)?;
    let here = tramp.wrapping_add(o as u64);
    (j.ins.code() == Code::Jmp_rm64
        && j.ins.is_ip_rel_memory_operand()
        && j.ins.ip_rel_memory_address() == here.wrapping_add(6))
    .then(|| u64_at(out, o + 6))
    .flatten()
}

/// An unconditional jump at `o` in either output form: (target, length).
fn jump_at(out: &[u8], tramp: u64, o: usize) -> Option<(u64, usize)> {
    if let Some(t) = abs_jump_at(out, tramp, o) {
        return Some((t, 14));
    }
    let j = decode_at(out, tramp, o)?;
    j.ins
        .is_jmp_short_or_near()
        .then(|| (j.ins.near_branch_target(), j.len()))
}

pub(crate) fn verify(
    code: &[u8],
    addr: u64,
    plan: &Plan,
    tramp: u64,
    out: &[u8],
) -> Result<(), String> {
    let orig = taken(code, addr, plan).map_err(|e| e.to_string())?;
    let start = addr.wrapping_add(plan.keep as u64);
    let end = start.wrapping_add(plan.taken as u64);
    let inside = |t: u64| t.wrapping_sub(start) < plan.taken as u64;
    if out.get(..plan.keep) != Some(&code[..plan.keep]) {
        return Err("kept landing pad not copied to the trampoline start".into());
    }
    let mut o = plan.keep;
    let mut copy_at: Vec<(u64, u64)> = Vec::new();
    // (original branch address, original target, target in the output)
    let mut internal: Vec<(u64, u64, u64)> = Vec::new();
    for i in &orig {
        let here = tramp.wrapping_add(o as u64);
        copy_at.push((i.ip(), here));
        let bad = |what: &str| format!("{what}: original at {:#x}, copy at {here:#x}", i.ip());
        let j = decode_at(out, tramp, o).ok_or_else(|| bad("undecodable copy"))?;
        let class = i.class.clone().map_err(|e| e.to_string())?;
        let (dest, used) = match class {
            Class::Plain => {
                if out.get(o..o + i.len()) != Some(&code[i.off..i.off + i.len()]) {
                    return Err(bad("plain instruction changed"));
                }
                (None, i.len())
            }
            Class::RipRel { target, disp_off } => {
                same_except_disp(i, &j, code, out, disp_off)
                    .then_some(())
                    .ok_or_else(|| bad("rip-relative copy differs"))?;
                if j.ins.ip_rel_memory_address() != target {
                    return Err(bad(&format!(
                        "rip-relative operand addresses {:#x} instead of {target:#x}",
                        j.ins.ip_rel_memory_address()
                    )));
                }
                (None, j.len())
            }
            Class::Jmp { target } => {
                let (t, n) =
                    jump_at(out, tramp, o).ok_or_else(|| bad("jmp not copied as a jump"))?;
                (Some((target, t)), n)
            }
            Class::Jcc { cc, target } => {
                let jcc = super::class::cc_nibble(j.ins.condition_code());
                if j.ins.is_jcc_short_or_near() && jcc == Some(cc) {
                    (Some((target, j.ins.near_branch_target())), j.len())
                } else if j.ins.is_jcc_short_or_near()
                    && jcc == Some(cc ^ 1)
                    && j.ins.near_branch_target() == here.wrapping_add((j.len() + 14) as u64)
                {
                    let t = abs_jump_at(out, tramp, o + j.len())
                        .ok_or_else(|| bad("inverted jcc not over an absolute jump"))?;
                    (Some((target, t)), j.len() + 14)
                } else {
                    return Err(bad("jcc not copied as the same condition"));
                }
            }
            Class::Call { target } => {
                if j.ins.is_call_near() {
                    (Some((target, j.ins.near_branch_target())), j.len())
                } else if j.ins.code() == Code::Call_rm64
                    && j.ins.is_ip_rel_memory_operand()
                    && j.ins.ip_rel_memory_address() == here.wrapping_add(8)
                    && jump_at(out, tramp, o + 6) == Some((here.wrapping_add(16), 2))
                {
                    let t = u64_at(out, o + 8).ok_or_else(|| bad("call literal cut"))?;
                    (Some((target, t)), 16)
                } else {
                    return Err(bad("call not copied as a call"));
                }
            }
            Class::Rel8Only { target } => {
                if j.ins.code() != i.ins.code() {
                    return Err(bad("loop/jrcxz copy differs"));
                }
                (Some((target, j.ins.near_branch_target())), j.len())
            }
        };
        if let Some((orig_target, new_target)) = dest {
            if inside(orig_target) {
                internal.push((i.ip(), orig_target, new_target));
            } else if orig_target != new_target {
                return Err(bad(&format!(
                    "branch goes to {new_target:#x} instead of {orig_target:#x}"
                )));
            }
        }
        o += used;
    }
    for (from, t, new_t) in internal {
        let copy = copy_at.iter().find(|c| c.0 == t).map(|c| c.1);
        if copy != Some(new_t) {
            return Err(format!(
                "branch at {from:#x} to taken {t:#x} goes to {new_t:#x}, copy is at {copy:x?}"
            ));
        }
    }
    let (back, n) = jump_at(out, tramp, o).ok_or("no jump back at the end")?;
    if back != end {
        return Err(format!("jump back goes to {back:#x} instead of {end:#x}"));
    }
    if o + n != out.len() {
        return Err(format!(
            "{} trailing bytes after the jump back",
            out.len() - o - n
        ));
    }
    Ok(())
}

/// Copy identical to the original except for the 4 displacement bytes.
fn same_except_disp(i: &Insn, j: &Insn, code: &[u8], out: &[u8], disp_off: usize) -> bool {
    if j.ins.code() != i.ins.code() || j.len() != i.len() {
        return false;
    }
    let a = &code[i.off..i.off + i.len()];
    let b = &out[j.off..j.off + j.len()];
    (0..a.len()).all(|k| (disp_off..disp_off + 4).contains(&k) || a[k] == b[k])
}
