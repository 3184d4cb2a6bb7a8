//! What moving one decoded instruction to another address requires.
//!
//! Owns: decoding a byte range into instructions (iced-x86, 64-bit mode) and
//! sorting each into a relocation class. Must never: emit code.

use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

use crate::error::Reason;
use iced_x86::{
    Code, ConditionCode, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind,
    Register,
};

/// How an instruction is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Position-independent: copied byte for byte.
    Plain,
    /// A RIP-relative memory operand: copied with the 32-bit displacement at
    /// byte `disp_off` recomputed so it still addresses `target`.
    RipRel { disp_off: usize, target: u64 },
    /// `jmp rel8/rel32`.
    Jmp { target: u64 },
    /// `jcc rel8/rel32`; `cc` is the condition nibble (0 = o ... 15 = g).
    Jcc { cc: u8, target: u64 },
    /// `call rel32`.
    Call { target: u64 },
    /// `loop`/`loope`/`loopne`/`jrcxz`/`jecxz`: rel8 only, movable only when
    /// the target is another taken instruction.
    Rel8Only { target: u64 },
}

/// One decoded instruction with its bytes and class.
#[derive(Debug, Clone)]
pub(crate) struct Insn {
    pub ins: Instruction,
    pub class: Result<Class, Reason>,
    /// Offset of the instruction in the decoded slice.
    pub off: usize,
}

impl Insn {
    pub fn ip(&self) -> u64 {
        self.ins.ip()
    }
    pub fn len(&self) -> usize {
        self.ins.len()
    }
}

/// Condition nibble of a jcc (0 = o ... 15 = g).
pub(crate) fn cc_nibble(cc: ConditionCode) -> Option<u8> {
    (cc as u8).checked_sub(1)
}

/// The caller's wrapper around the moment iced-x86 builds its decoder
/// tables ([`on_first_decoder`]), as a `fn(&mut dyn FnMut())`; 0: none.
static FIRST_DECODER: AtomicUsize = AtomicUsize::new(0);

/// Has `wrap` run the first decoding of this process (which builds
/// iced-x86's decoder tables, once: about 8,000 small blocks from the
/// global allocator, never freed) so that the caller can serve those
/// blocks from memory of its own. Takes effect if called before anything
/// is decoded.
pub fn on_first_decoder(wrap: fn(&mut dyn FnMut())) {
    FIRST_DECODER.store(wrap as usize, Ordering::Release);
}

/// Builds the decoder's tables (through the caller's wrapper) before the
/// first decoder of the process is made.
pub(crate) fn tables_built() {
    static BUILT: Once = Once::new();
    BUILT.call_once(|| {
        let mut build = || {
            let _ = Decoder::with_ip(64, &[0x90], 0, DecoderOptions::NONE).decode();
        };
        match FIRST_DECODER.load(Ordering::Acquire) {
            0 => build(),
            w => {
                // SAFETY: only `fn(&mut dyn FnMut())` values are stored.
                let wrap = unsafe { core::mem::transmute::<usize, fn(&mut dyn FnMut())>(w) };
                wrap(&mut build)
            }
        }
    });
}

/// Decode one instruction of `code` at offset `off` (code[0] is at `base`).
/// `None` when the bytes are not a valid instruction or are cut short.
pub(crate) fn decode_at(code: &[u8], base: u64, off: usize) -> Option<Insn> {
    tables_built();
    let bytes = code.get(off..)?;
    let mut dec = Decoder::with_ip(
        64,
        bytes,
        base.wrapping_add(off as u64),
        DecoderOptions::NONE,
    );
    let ins = dec.decode();
    if ins.is_invalid() {
        return None;
    }
    let class = classify(&ins, &dec);
    Some(Insn { ins, class, off })
}

/// Each instruction of `code[from..]` in turn (code[0] is at `base`), with
/// one decoder for the whole sweep: `None` at an offset whose bytes are no
/// valid instruction (the sweep goes on at the next byte; the instruction's
/// offset is [`Insn::off`]). The same
/// results as [`decode_at`] at each offset, without building a decoder per
/// instruction (a function's sweep decodes hundreds).
pub(crate) fn sweep(
    code: &[u8],
    base: u64,
    from: usize,
) -> impl Iterator<Item = Option<Insn>> + '_ {
    tables_built();
    let mut dec = Decoder::with_ip(64, code, base, DecoderOptions::NONE);
    let mut off = from;
    core::iter::from_fn(move || {
        if off >= code.len() {
            return None;
        }
        let at = off;
        dec.set_position(at).ok()?;
        dec.set_ip(base.wrapping_add(at as u64));
        let ins = dec.decode();
        if ins.is_invalid() {
            off += 1;
            return Some(None);
        }
        off += ins.len();
        let class = classify(&ins, &dec);
        Some(Some(Insn {
            ins,
            class,
            off: at,
        }))
    })
}

fn unrelocatable(ins: &Instruction, what: impl Into<String>) -> Reason {
    Reason::Unrelocatable {
        at: ins.ip(),
        what: what.into(),
    }
}

/// The name of a branch instruction in a refusal's reason. iced-x86's
/// `Debug` for `Mnemonic` would name any instruction, but its table of
/// 1,900 names is relocated data: 30 KiB written at load in every
/// profiled process, for messages about a handful of branches.
pub(crate) fn branch_name(m: Mnemonic) -> &'static str {
    match m {
        Mnemonic::Loop => "loop",
        Mnemonic::Loope => "loope",
        Mnemonic::Loopne => "loopne",
        Mnemonic::Jrcxz => "jrcxz",
        Mnemonic::Jecxz => "jecxz",
        Mnemonic::Jcxz => "jcxz",
        Mnemonic::Jmp => "jmp",
        Mnemonic::Call => "call",
        Mnemonic::Jmpe => "jmpe",
        Mnemonic::Xbegin => "xbegin",
        _ => "other",
    }
}

/// The relocation class of `ins` (just decoded by `dec`).
fn classify(ins: &Instruction, dec: &Decoder) -> Result<Class, Reason> {
    let target = ins.near_branch_target();
    if ins.is_jmp_short_or_near() {
        return Ok(Class::Jmp { target });
    }
    if ins.is_jcc_short_or_near() {
        let cc = cc_nibble(ins.condition_code())
            .ok_or_else(|| unrelocatable(ins, "jcc without condition"))?;
        return Ok(Class::Jcc { cc, target });
    }
    if ins.is_call_near() {
        return Ok(Class::Call { target });
    }
    if ins.is_loop() || ins.is_loopcc() || ins.is_jcx_short() {
        return Ok(Class::Rel8Only { target });
    }
    if matches!(ins.code(), Code::Xbegin_rel16 | Code::Xbegin_rel32) {
        return Err(unrelocatable(ins, "xbegin"));
    }
    let has_branch_operand = (0..ins.op_count()).any(|i| {
        matches!(
            ins.op_kind(i),
            OpKind::NearBranch16
                | OpKind::NearBranch32
                | OpKind::NearBranch64
                | OpKind::FarBranch16
                | OpKind::FarBranch32
        )
    });
    if has_branch_operand {
        return Err(unrelocatable(
            ins,
            format!("{} branch", branch_name(ins.mnemonic())),
        ));
    }
    if ins.is_ip_rel_memory_operand() {
        if ins.memory_base() == Register::EIP {
            return Err(unrelocatable(ins, "eip-relative operand"));
        }
        let offs = dec.get_constant_offsets(ins);
        if offs.displacement_size() != 4 {
            return Err(unrelocatable(ins, "rip-relative operand without disp32"));
        }
        return Ok(Class::RipRel {
            disp_off: offs.displacement_offset(),
            target: ins.ip_rel_memory_address(),
        });
    }
    Ok(Class::Plain)
}

/// Control does not continue to the next instruction.
pub(crate) fn ends_flow(ins: &Instruction) -> bool {
    matches!(
        ins.flow_control(),
        FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Exception
    ) || matches!(ins.code(), Code::Hlt | Code::Int3)
}

/// The address a branch or RIP-relative operand of `class` refers to.
pub(crate) fn class_target(class: &Class) -> Option<u64> {
    match *class {
        Class::Plain => None,
        Class::RipRel { target, .. }
        | Class::Jmp { target }
        | Class::Jcc { target, .. }
        | Class::Call { target }
        | Class::Rel8Only { target } => Some(target),
    }
}
