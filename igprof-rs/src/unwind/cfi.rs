//! Call-frame information read directly: the CFI row of an address, for
//! the `.eh_frame` programs compilers emit, without framehop.
//!
//! Deriving a descriptor through framehop (gimli underneath) evaluates the
//! function's call-frame program up to the address with a general reader:
//! about 17,000 instructions per descriptor on GCC's cc1, whose functions
//! reach their call sites after 108 rows on average, and a fifth of a small
//! compiler run when no earlier process stored its descriptors. Here the
//! FDE is found through `.eh_frame_hdr`'s search table and its program runs
//! tracking only what a descriptor can hold: the CFA's register and offset,
//! and the rules of the return-address and frame-pointer registers.
//!
//! A CFA given by an expression is followed for an interrupted PC where
//! the expression uses only the stack pointer, the PC, constants and
//! `plus`/`and`/`ge`/`shl` (the one linkers write for PLT entries: CFA =
//! rsp + 8, + 8 more from the 11th byte of each 16-byte entry on, after its
//! `push`): evaluated for that PC, it is a plain offset from the stack
//! pointer, as framehop's evaluation through gimli finds it.
//!
//! Anything this reader does not follow exactly as gimli does (another
//! expression, a pointer encoding or opcode not handled here, a signal
//! frame's CIE, an address outside its FDE, a remembered-state stack deeper
//! than framehop's storage holds) gives None, and the caller asks framehop
//! as before. `IGPROF_CFI_CHECK=1` derives every direct answer through
//! framehop too and counts the differences (`-d`); the unwinder's tests
//! compare both on every FDE of the objects loaded in the test process.
//!
//! Must never: read outside the object's `.eh_frame_hdr` and `.eh_frame`,
//! allocate, lock, or make a system call (it runs in hooks and signal
//! handlers, on a descriptor-cache miss).

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use super::modules::{read_encoded, ModuleEntry};

/// A register's rule in a row, as far as a descriptor needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// No rule in the CIE or FDE (gimli: none).
    Unset,
    Undefined,
    SameValue,
    /// Saved at CFA + offset.
    Offset(i64),
    /// Anything else (another register, a value, an expression).
    Other,
}

/// The CFI row of an address: the CFA rule and the rules of the two
/// registers a descriptor restores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    /// CFA = register `cfa_reg` + `cfa_offset` (None: an expression).
    pub cfa: Option<(u64, i64)>,
    pub ra: Rule,
    pub fp: Rule,
}

/// The DWARF register numbers a row is read for, and whether opcode 0x2d
/// is AArch64's `negate_ra_state` (the return address is signed from here
/// on, or no longer: where registers are saved does not change, and the
/// walk strips the code from every return address).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Regs {
    pub ra: u64,
    pub fp: u64,
    pub negate_ra_state: bool,
    /// The stack pointer's number, and the number that names the program
    /// counter in a CFA expression where framehop gives it one (x86-64's
    /// return-address column, 16: framehop reads it as the frame's PC).
    pub sp: u64,
    pub pc: Option<u64>,
}

/// Rows gimli's storage in framehop holds at once (the current row, the
/// CIE's rules when it sets more than one register, remembered states).
const GIMLI_ROWS: usize = 4;
/// Register numbers gimli's storage can hold rules for in any case.
const MAX_REGISTER: u64 = 128;

/// The row of `lookup` (an address in `m`'s text), when every step to it is
/// one this reader follows exactly; `pc`: the frame's program counter when
/// it is an interrupted one (a CFA expression is evaluated only then).
/// Async-signal-safe.
#[link_section = "igprof_hot"]
pub(crate) fn row_at(m: &ModuleEntry, lookup: usize, regs: &Regs, pc: Option<u64>) -> Option<Row> {
    let regs = *regs;
    if m.eh_frame_hdr.1 == 0 || m.eh_frame.1 == 0 {
        return None;
    }
    // SAFETY: both ranges come from the loaded object's PT_GNU_EH_FRAME
    // header and the segment holding `.eh_frame`, mapped readable while the
    // object is in the module table the caller holds.
    let (hdr, eh) = unsafe {
        (
            core::slice::from_raw_parts(m.eh_frame_hdr.0 as *const u8, m.eh_frame_hdr.1),
            core::slice::from_raw_parts(m.eh_frame.0 as *const u8, m.eh_frame.1),
        )
    };
    let fde = fde_for(hdr, m.eh_frame_hdr.0, lookup)?;
    let fde = fde.checked_sub(m.eh_frame.0).filter(|&o| o < eh.len())?;
    run_fde(eh, m.eh_frame.0, fde, lookup, regs, pc)
}

/// The address of the FDE whose start is the last one at or below
/// `lookup`, from `.eh_frame_hdr`'s table (only the `datarel | sdata4`
/// table every linker writes).
#[link_section = "igprof_hot"]
fn fde_for(hdr: &[u8], hdr_addr: usize, lookup: usize) -> Option<usize> {
    let (table, count) = search_table(hdr)?;
    let field = |i: usize, at: usize| table_field(table, hdr_addr, i, at);
    // Entries are sorted by start: the last one starting at or below.
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if field(mid, 0) <= lookup {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Some(field(lo.checked_sub(1)?, 4))
}

/// Field `at` (0: the start, 4: the FDE) of entry `i` of the search table
/// of the header at `hdr_addr`, as an address (`i` below its count).
#[link_section = "igprof_hot"]
fn table_field(table: &[u8], hdr_addr: usize, i: usize, at: usize) -> usize {
    let b = &table[i * 8 + at..i * 8 + at + 4];
    hdr_addr.wrapping_add_signed(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as isize)
}

/// `.eh_frame_hdr`'s search table (pairs of 32-bit start and FDE address,
/// relative to the header) and its number of entries.
#[link_section = "igprof_hot"]
fn search_table(hdr: &[u8]) -> Option<(&[u8], usize)> {
    const DATAREL_SDATA4: u8 = 0x3b;
    if hdr.len() < 4 || hdr[0] != 1 || hdr[3] != DATAREL_SDATA4 || hdr[2] & 0x70 != 0 {
        return None;
    }
    let (_, ptr_len) = read_encoded(hdr.get(4..)?, hdr[1] & 0x0f)?;
    let (count, count_len) = read_encoded(hdr.get(4 + ptr_len..)?, hdr[2] & 0x0f)?;
    let table = hdr.get(4 + ptr_len + count_len..)?;
    let count = usize::try_from(count).ok()?;
    (count > 0 && table.len() / 8 >= count).then_some((table, count))
}

/// The start addresses of `m`'s FDEs, from its `.eh_frame_hdr` table
/// (tests: every FDE is checked against framehop).
#[cfg(test)]
pub(crate) fn fde_starts(m: &ModuleEntry) -> Vec<usize> {
    // SAFETY: as in `row_at`.
    let hdr =
        unsafe { core::slice::from_raw_parts(m.eh_frame_hdr.0 as *const u8, m.eh_frame_hdr.1) };
    let Some((table, count)) = search_table(hdr) else {
        return Vec::new();
    };
    (0..count)
        .map(|i| table_field(table, m.eh_frame_hdr.0, i, 0))
        .collect()
}

/// A bounded little-endian reader of one section.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    #[inline(always)]
    #[link_section = "igprof_hot"]
    fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.at)?;
        self.at += 1;
        Some(v)
    }

    #[link_section = "igprof_hot"]
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v = self
            .b
            .get(self.at..self.at.checked_add(N)?)?
            .try_into()
            .ok()?;
        self.at += N;
        Some(v)
    }

    /// An unsigned LEB128 number (most are one byte: inlined).
    #[inline(always)]
    #[link_section = "igprof_hot"]
    fn uleb(&mut self) -> Option<u64> {
        match self.b.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Some(u64::from(b))
            }
            _ => self.leb().map(|(v, _, _)| v),
        }
    }

    /// A signed LEB128 number.
    #[link_section = "igprof_hot"]
    fn sleb(&mut self) -> Option<i64> {
        let (v, bits, last) = self.leb()?;
        // The same bits, sign-extended from the last byte's bit 6.
        let v = v as i64;
        Some(if bits < 64 && last & 0x40 != 0 {
            v | -1i64 << bits
        } else {
            v
        })
    }

    /// The bits of a LEB128 number, either signedness: (value, how many
    /// bits were read, the last byte).
    #[link_section = "igprof_hot"]
    fn leb(&mut self) -> Option<(u64, u32, u8)> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = self.u8()?;
            if shift >= 64 {
                return None;
            }
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Some((v, shift, b));
            }
        }
    }

    #[link_section = "igprof_hot"]
    fn skip(&mut self, n: u64) -> Option<()> {
        let to = self.at.checked_add(usize::try_from(n).ok()?)?;
        (to <= self.b.len()).then(|| self.at = to)
    }

    /// A pointer with encoding `enc` (absolute or pc-relative only), the
    /// section starting at `base`.
    #[link_section = "igprof_hot"]
    fn pointer(&mut self, enc: u8, base: usize) -> Option<u64> {
        let field = base.wrapping_add(self.at) as u64;
        let (v, len) = read_encoded(self.b.get(self.at..)?, enc & 0x0f)?;
        self.at += len;
        match enc & 0xf0 {
            0x00 => Some(v),
            0x10 => Some(field.wrapping_add(v)),
            _ => None,
        }
    }

    /// The length of a CIE or FDE at the cursor and where it ends (32-bit
    /// lengths only).
    #[link_section = "igprof_hot"]
    fn entry(&mut self) -> Option<usize> {
        let len = u32::from_le_bytes(self.bytes()?);
        if len == 0 || len == u32::MAX {
            return None;
        }
        let end = self.at.checked_add(len as usize)?;
        (end <= self.b.len()).then_some(end)
    }
}

/// What an FDE takes from its CIE.
struct Cie {
    code_align: u64,
    data_align: i64,
    fde_encoding: u8,
    augmented: bool,
    /// The initial instructions.
    program: (usize, usize),
}

#[link_section = "igprof_hot"]
fn parse_cie(eh: &[u8], at: usize, regs: Regs) -> Option<Cie> {
    let mut c = Cursor { b: eh, at };
    let end = c.entry()?;
    if c.bytes::<4>()? != [0; 4] {
        return None;
    }
    let version = c.u8()?;
    if version != 1 && version != 3 {
        return None;
    }
    let aug_start = c.at;
    while c.u8()? != 0 {}
    let aug = &eh[aug_start..c.at - 1];
    let code_align = c.uleb()?;
    let data_align = c.sleb()?;
    let ra = if version == 1 {
        u64::from(c.u8()?)
    } else {
        c.uleb()?
    };
    // Bounded so that an advance (at most 32 bits) times it cannot
    // overflow.
    if ra != regs.ra || code_align > u64::from(u32::MAX) {
        return None;
    }
    let mut fde_encoding = 0;
    let augmented = aug.first() == Some(&b'z');
    if augmented {
        let len = c.uleb()?;
        let data_end = c.at.checked_add(usize::try_from(len).ok()?)?;
        for &ch in &aug[1..] {
            match ch {
                b'R' => fde_encoding = c.u8()?,
                b'L' => {
                    c.u8()?;
                }
                b'P' => {
                    let enc = c.u8()?;
                    // An aligned pointer would move what follows ('R').
                    if enc & 0x70 == 0x50 {
                        return None;
                    }
                    match enc & 0x0f {
                        0x01 => {
                            c.uleb()?;
                        }
                        0x09 => {
                            c.sleb()?;
                        }
                        f => {
                            read_encoded(eh.get(c.at..)?, f).map(|(_, len)| c.at += len)?;
                        }
                    }
                }
                // 'S' (a signal frame) and anything unknown: framehop's.
                _ => return None,
            }
        }
        if c.at > data_end {
            return None;
        }
        c.at = data_end;
    } else if !aug.is_empty() {
        return None;
    }
    (c.at <= end).then_some(Cie {
        code_align,
        data_align,
        fde_encoding,
        augmented,
        program: (c.at, end),
    })
}

/// The FDE at offset `at` of `.eh_frame` (mapped at `base`): its program
/// run to the row of `lookup`, a CFA expression evaluated for `pc`.
#[link_section = "igprof_hot"]
fn run_fde(
    eh: &[u8],
    base: usize,
    at: usize,
    lookup: usize,
    regs: Regs,
    pc: Option<u64>,
) -> Option<Row> {
    let mut c = Cursor { b: eh, at };
    let end = c.entry()?;
    let id_at = c.at;
    let cie_ptr = u32::from_le_bytes(c.bytes()?) as usize;
    let cie = parse_cie(eh, id_at.checked_sub(cie_ptr)?, regs)?;
    let start = c.pointer(cie.fde_encoding, base)?;
    let range = c.pointer(cie.fde_encoding & 0x0f, base)?;
    let lookup = lookup as u64;
    if lookup < start || lookup - start >= range {
        return None;
    }
    if cie.augmented {
        let len = c.uleb()?;
        c.skip(len)?;
    }
    if c.at > end {
        return None;
    }
    let mut m = Machine::new(regs, cie.code_align, cie.data_align);
    m.run(eh, cie.program, None)?;
    m.initial = Some((m.row.ra, m.row.fp));
    // gimli keeps the CIE's rules in a row of its own when it sets more
    // than one register, which leaves one row less for remembered states.
    m.capacity = if m.cie_registers > 1 {
        GIMLI_ROWS - 2
    } else {
        GIMLI_ROWS - 1
    };
    m.run(eh, (c.at, end), Some((start, lookup)))?;
    if let (None, Some(expr), Some(pc)) = (m.row.cfa, m.expr, pc) {
        m.row.cfa = cfa_of_expression(eh.get(expr.0..expr.1)?, pc, regs);
    }
    Some(m.row)
}

/// A value of [`cfa_of_expression`]'s stack: a constant, or the stack
/// pointer plus a constant.
#[derive(Clone, Copy)]
enum Value {
    Const(u64),
    Sp(u64),
}

/// The CFA an expression gives at `pc`, as (the stack pointer's number,
/// offset), where it is the stack pointer plus a constant computed only
/// from the stack pointer, the PC, literals and `plus`, `plus_uconst`,
/// `and`, `ge`, `shl` (gimli's arithmetic: 64-bit, wrapping; `ge` signed;
/// a shift of 64 or more gives 0); None for anything else.
#[link_section = "igprof_hot"]
fn cfa_of_expression(expr: &[u8], pc: u64, regs: Regs) -> Option<(u64, i64)> {
    let mut stack = [Value::Const(0); 8];
    let mut n: usize = 0;
    let mut c = Cursor { b: expr, at: 0 };
    while c.at < expr.len() {
        let op = c.u8()?;
        let v = match op {
            0x30..=0x4f => Value::Const(u64::from(op - 0x30)), // lit0..lit31
            0x70..=0x8f => {
                // breg0..breg31: register + offset
                let reg = u64::from(op - 0x70);
                let off = c.sleb()? as u64;
                if reg == regs.sp {
                    Value::Sp(off)
                } else if Some(reg) == regs.pc {
                    Value::Const(pc.wrapping_add(off))
                } else {
                    return None;
                }
            }
            0x23 => {
                // plus_uconst
                let k = c.uleb()?;
                n = n.checked_sub(1)?;
                match stack[n] {
                    Value::Const(a) => Value::Const(a.wrapping_add(k)),
                    Value::Sp(a) => Value::Sp(a.wrapping_add(k)),
                }
            }
            0x1a | 0x22 | 0x24 | 0x2a => {
                // and, plus, shl, ge
                n = n.checked_sub(2)?;
                match (op, stack[n], stack[n + 1]) {
                    (0x22, Value::Sp(a), Value::Const(b))
                    | (0x22, Value::Const(a), Value::Sp(b)) => Value::Sp(a.wrapping_add(b)),
                    (_, Value::Const(a), Value::Const(b)) => Value::Const(match op {
                        0x1a => a & b,
                        0x22 => a.wrapping_add(b),
                        0x24 => a.checked_shl(u32::try_from(b).ok()?).unwrap_or(0),
                        _ => u64::from(a as i64 >= b as i64),
                    }),
                    _ => return None,
                }
            }
            _ => return None,
        };
        *stack.get_mut(n)? = v;
        n += 1;
    }
    match stack[..n] {
        [.., Value::Sp(off)] => Some((regs.sp, off as i64)),
        _ => None,
    }
}

/// The state of a call-frame program being run.
struct Machine {
    regs: Regs,
    code_align: u64,
    data_align: i64,
    row: Row,
    /// The rules after the CIE's instructions (`DW_CFA_restore`); None
    /// while those run.
    initial: Option<(Rule, Rule)>,
    /// Registers (below `MAX_REGISTER`) the CIE gave a rule.
    cie_seen: u128,
    cie_registers: u32,
    /// Where in `.eh_frame` the CFA's expression is, while the row's CFA
    /// is one (`row.cfa` None).
    expr: Option<(usize, usize)>,
    /// Remembered rows (`DW_CFA_remember_state`), at most `capacity`, and
    /// their CFA expressions.
    saved: [(Row, Option<(usize, usize)>); GIMLI_ROWS],
    depth: usize,
    capacity: usize,
}

impl Machine {
    #[link_section = "igprof_hot"]
    fn new(regs: Regs, code_align: u64, data_align: i64) -> Self {
        let row = Row {
            cfa: Some((0, 0)),
            ra: Rule::Unset,
            fp: Rule::Unset,
        };
        Machine {
            regs,
            code_align,
            data_align,
            row,
            initial: None,
            cie_seen: 0,
            cie_registers: 0,
            expr: None,
            saved: [(row, None); GIMLI_ROWS],
            depth: 0,
            capacity: 0,
        }
    }

    #[link_section = "igprof_hot"]
    fn set(&mut self, reg: u64, rule: Rule) -> Option<()> {
        if reg >= MAX_REGISTER {
            return None;
        }
        if self.initial.is_none() && self.cie_seen & (1 << reg) == 0 {
            self.cie_seen |= 1 << reg;
            self.cie_registers += 1;
        }
        if reg == self.regs.ra {
            self.row.ra = rule;
        } else if reg == self.regs.fp {
            self.row.fp = rule;
        }
        Some(())
    }

    #[link_section = "igprof_hot"]
    fn restore(&mut self, reg: u64) -> Option<()> {
        let (ra, fp) = self.initial?;
        if reg >= MAX_REGISTER {
            return None;
        }
        if reg == self.regs.ra {
            self.row.ra = ra;
        } else if reg == self.regs.fp {
            self.row.fp = fp;
        }
        Some(())
    }

    /// Runs the instructions in `span` of `eh`. With `to` = (start,
    /// lookup) (an FDE), stops at the first advance past `lookup`; without
    /// (a CIE), an advance is not followed.
    #[link_section = "igprof_hot"]
    fn run(&mut self, eh: &[u8], span: (usize, usize), to: Option<(u64, u64)>) -> Option<()> {
        let mut c = Cursor {
            b: eh.get(..span.1)?,
            at: span.0,
        };
        let mut loc = to.map_or(0, |(start, _)| start);
        while c.at < span.1 {
            let op = c.u8()?;
            let delta = match op >> 6 {
                1 => Some(u64::from(op & 0x3f)),
                2 => {
                    let off = self.factored(c.uleb()?)?;
                    self.set(u64::from(op & 0x3f), Rule::Offset(off))?;
                    None
                }
                3 => {
                    self.restore(u64::from(op & 0x3f))?;
                    None
                }
                _ => self.extended(op, &mut c)?,
            };
            if let Some(delta) = delta {
                let (_, lookup) = to?;
                // delta and code_align are below 2^32 (see `parse_cie`).
                let next = loc.checked_add(delta * self.code_align)?;
                if next > lookup {
                    return Some(());
                }
                loc = next;
            }
        }
        Some(())
    }

    /// `n * data_align`.
    #[link_section = "igprof_hot"]
    fn factored(&self, n: u64) -> Option<i64> {
        i64::try_from(n).ok()?.checked_mul(self.data_align)
    }

    /// The opcodes whose high two bits are 0: an advance (its delta in
    /// code units), or a change of the row (None inside Some).
    #[inline(always)]
    #[link_section = "igprof_hot"]
    fn extended(&mut self, op: u8, c: &mut Cursor) -> Option<Option<u64>> {
        match op {
            0x00 => {}                                                            // nop
            0x02 => return Some(Some(u64::from(c.u8()?))),                        // advance_loc1
            0x03 => return Some(Some(u64::from(u16::from_le_bytes(c.bytes()?)))), // advance_loc2
            0x04 => return Some(Some(u64::from(u32::from_le_bytes(c.bytes()?)))), // advance_loc4
            0x05 => {
                // offset_extended
                let reg = c.uleb()?;
                let off = self.factored(c.uleb()?)?;
                self.set(reg, Rule::Offset(off))?;
            }
            0x06 => {
                let reg = c.uleb()?; // restore_extended
                self.restore(reg)?;
            }
            0x07 => {
                let reg = c.uleb()?; // undefined
                self.set(reg, Rule::Undefined)?;
            }
            0x08 => {
                let reg = c.uleb()?; // same_value
                self.set(reg, Rule::SameValue)?;
            }
            0x09 => {
                let reg = c.uleb()?; // register
                c.uleb()?;
                self.set(reg, Rule::Other)?;
            }
            0x0a => {
                // remember_state
                if self.initial.is_none() || self.depth >= self.capacity {
                    return None;
                }
                self.saved[self.depth] = (self.row, self.expr);
                self.depth += 1;
            }
            0x0b => {
                // restore_state
                if self.depth == 0 {
                    return None;
                }
                self.depth -= 1;
                (self.row, self.expr) = self.saved[self.depth];
            }
            0x0c => {
                // def_cfa
                let reg = c.uleb()?;
                let off = i64::try_from(c.uleb()?).ok()?;
                self.row.cfa = Some((reg, off));
                self.expr = None;
            }
            0x0d => {
                // def_cfa_register
                let reg = c.uleb()?;
                let (_, off) = self.row.cfa?;
                self.row.cfa = Some((reg, off));
            }
            0x0e => {
                // def_cfa_offset
                let off = i64::try_from(c.uleb()?).ok()?;
                let (reg, _) = self.row.cfa?;
                self.row.cfa = Some((reg, off));
            }
            0x0f => {
                // def_cfa_expression
                let len = c.uleb()?;
                let at = c.at;
                c.skip(len)?;
                self.row.cfa = None;
                self.expr = Some((at, c.at));
            }
            0x10 | 0x16 => {
                // expression, val_expression
                let reg = c.uleb()?;
                let len = c.uleb()?;
                c.skip(len)?;
                self.set(reg, Rule::Other)?;
            }
            0x11 => {
                // offset_extended_sf
                let reg = c.uleb()?;
                let off = c.sleb()?.checked_mul(self.data_align)?;
                self.set(reg, Rule::Offset(off))?;
            }
            0x12 => {
                // def_cfa_sf
                let reg = c.uleb()?;
                let off = c.sleb()?.checked_mul(self.data_align)?;
                self.row.cfa = Some((reg, off));
                self.expr = None;
            }
            0x13 => {
                // def_cfa_offset_sf
                let off = c.sleb()?.checked_mul(self.data_align)?;
                let (reg, _) = self.row.cfa?;
                self.row.cfa = Some((reg, off));
            }
            0x14 => {
                // val_offset
                let reg = c.uleb()?;
                c.uleb()?;
                self.set(reg, Rule::Other)?;
            }
            0x15 => {
                // val_offset_sf
                let reg = c.uleb()?;
                c.sleb()?;
                self.set(reg, Rule::Other)?;
            }
            0x2e => {
                c.uleb()?; // GNU_args_size
            }
            0x2d if self.regs.negate_ra_state => {}
            // set_loc, GNU_window_save, GNU_negative_offset_extended and
            // the rest: framehop's.
            _ => return None,
        }
        Some(None)
    }
}

/// `IGPROF_CFI_CHECK=1`: every direct answer is derived through framehop
/// too and compared (`-d` says how many differed; tests require none).
static CHECK: AtomicU8 = AtomicU8::new(CHECK_UNKNOWN);
const CHECK_UNKNOWN: u8 = 2;
static DIRECT: AtomicU64 = AtomicU64::new(0);
static DIFFER: AtomicU64 = AtomicU64::new(0);

/// Reads `IGPROF_CFI_CHECK` (outside signal context, before the first walk).
pub(crate) fn init_check() {
    if CHECK.load(Ordering::Relaxed) == CHECK_UNKNOWN {
        let on = std::env::var_os("IGPROF_CFI_CHECK").is_some_and(|v| v == "1");
        CHECK.store(on as u8, Ordering::Relaxed);
    }
}

/// Whether direct answers are checked against framehop.
#[inline]
#[link_section = "igprof_hot"]
pub fn checking() -> bool {
    CHECK.load(Ordering::Relaxed) == 1
}

/// Counts a direct answer, and whether framehop's differed (when checked).
#[link_section = "igprof_hot"]
pub(crate) fn answered(differs: bool) {
    DIRECT.fetch_add(1, Ordering::Relaxed);
    if differs {
        DIFFER.fetch_add(1, Ordering::Relaxed);
    }
}

/// Descriptors derived directly from CFI so far, and of those how many
/// framehop derived otherwise (counted only with `IGPROF_CFI_CHECK=1`).
pub fn stats() -> (u64, u64) {
    (
        DIRECT.load(Ordering::Relaxed),
        DIFFER.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86: Regs = Regs {
        ra: 16,
        fp: 6,
        negate_ra_state: false,
        sp: 7,
        pc: Some(16),
    };

    /// A CIE (absolute pointers, CFA = rsp + 8, return address at CFA-8)
    /// and one FDE for 0x1000..0x1100 with `program`.
    fn section(program: &[u8]) -> Vec<u8> {
        let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x00];
        cie.extend([0x0c, 7, 8, 0x90, 1]);
        while (cie.len() + 4) % 8 != 0 {
            cie.push(0);
        }
        let mut eh = (cie.len() as u32).to_le_bytes().to_vec();
        eh.extend(&cie);
        let fde_at = eh.len();
        let mut fde = ((fde_at + 4) as u32).to_le_bytes().to_vec();
        fde.extend(0x1000u64.to_le_bytes());
        fde.extend(0x100u64.to_le_bytes());
        fde.push(0);
        fde.extend(program);
        eh.extend((fde.len() as u32).to_le_bytes());
        eh.extend(fde);
        eh
    }

    fn row(eh: &[u8], lookup: usize) -> Option<Row> {
        let fde_at = 4 + u32::from_le_bytes(eh[..4].try_into().unwrap()) as usize;
        run_fde(eh, eh.as_ptr() as usize, fde_at, lookup, X86, None)
    }

    #[test]
    fn rows_follow_advances_and_remembered_states() {
        let eh = section(&[
            0x41, 0x0e, 16, 0x86, 2, // +1: CFA rsp+16, rbp at CFA-16
            0x43, 0x0a, 0x0e, 8, // +3: remember; CFA rsp+8
            0x42, 0x0b, // +2: restore (CFA rsp+16 again)
            0x44, 0x0f, 1, 0x77, // +4: CFA an expression
        ]);
        let r = |cfa, fp| Row {
            cfa,
            ra: Rule::Offset(-8),
            fp,
        };
        let saved = Rule::Offset(-16);
        assert_eq!(row(&eh, 0x1000), Some(r(Some((7, 8)), Rule::Unset)));
        assert_eq!(row(&eh, 0x1003), Some(r(Some((7, 16)), saved)));
        assert_eq!(row(&eh, 0x1004), Some(r(Some((7, 8)), saved)));
        assert_eq!(row(&eh, 0x1009), Some(r(Some((7, 16)), saved)));
        assert_eq!(row(&eh, 0x10ff), Some(r(None, saved)));
        assert_eq!(row(&eh, 0x1100), None, "outside the FDE");
        assert_eq!(row(&eh, 0xfff), None, "outside the FDE");
    }

    #[test]
    fn what_gimli_would_refuse_or_this_reader_does_not_follow_is_none() {
        // Four remembered states: more than framehop's storage holds.
        let deep = section(&[0x0a, 0x0a, 0x0a, 0x0a]);
        assert_eq!(row(&deep, 0x1000), None);
        assert!(row(&section(&[0x0a, 0x0a, 0x0a]), 0x1000).is_some());
        // A restored state with nothing remembered; set_loc; an unknown
        // opcode; a CFA offset change of an expression CFA.
        for program in [
            &[0x0b][..],
            &[0x01, 0, 0x10, 0, 0, 0, 0, 0, 0],
            &[0x3f],
            &[0x0f, 0, 0x0e, 8],
        ] {
            assert_eq!(row(&section(program), 0x1000), None, "{program:x?}");
        }
        // An advance past the address stops before what follows it.
        assert!(row(&section(&[0x42, 0x3f]), 0x1001).is_some());
    }

    /// The CFA expression linkers write for PLT entries (CFA = rsp + 8, + 8
    /// from the 11th byte of each 16-byte entry on), evaluated for an
    /// interrupted PC; not for a return address, nor an expression with
    /// anything else in it.
    #[test]
    fn the_plt_entries_cfa_expression_is_read_for_an_interrupted_pc() {
        // breg7 8; breg16 0; lit15; and; lit11; ge; lit3; shl; plus
        let plt = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        let mut program = vec![0x0f, plt.len() as u8];
        program.extend(plt);
        let eh = section(&program);
        let fde_at = 4 + u32::from_le_bytes(eh[..4].try_into().unwrap()) as usize;
        let at = |pc: usize, first: bool| {
            let lookup = if first { pc } else { pc - 1 };
            run_fde(
                &eh,
                eh.as_ptr() as usize,
                fde_at,
                lookup,
                X86,
                first.then_some(pc as u64),
            )
            .map(|r| r.cfa)
        };
        for pc in 0x1000..0x1020 {
            let off = if pc % 16 >= 11 { 16 } else { 8 };
            assert_eq!(at(pc, true), Some(Some((7, off))), "{pc:#x}");
        }
        assert_eq!(at(0x1005, false), Some(None));
        // rbp instead of rsp; an unknown opcode (deref); one value too few.
        for bad in [&[0x76, 8][..], &[0x77, 8, 0x06], &[0x77, 8, 0x22]] {
            let mut program = vec![0x0f, bad.len() as u8];
            program.extend(bad);
            let eh = section(&program);
            let r = run_fde(&eh, eh.as_ptr() as usize, fde_at, 0x1000, X86, Some(0x1000));
            assert_eq!(r.map(|r| r.cfa), Some(None), "{bad:x?}");
        }
    }

    /// Damaged sections (bytes of a valid one changed at random, or cut
    /// short) give an answer or None, never a panic or a read outside them.
    #[test]
    fn damaged_sections_are_refused_without_panicking() {
        let good = section(&[0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0a, 0x0e, 8, 0x42, 0x0b]);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Where the FDE starts in the undamaged section.
        let fde_at = 4 + u32::from_le_bytes(good[..4].try_into().unwrap()) as usize;
        let mut answered = 0;
        for round in 0..20_000 {
            let mut eh = good.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() % eh.len() as u64) as usize;
                eh[i] = next() as u8;
            }
            if round % 8 == 0 {
                eh.truncate((next() % eh.len() as u64) as usize + 1);
            }
            for lookup in [0x1000, 0x1005, 0x10ff] {
                answered += run_fde(
                    &eh,
                    eh.as_ptr() as usize,
                    fde_at,
                    lookup,
                    X86,
                    Some(lookup as u64),
                )
                .is_some() as u32;
            }
        }
        assert!(answered > 0, "some damage leaves a readable program");
    }

    #[test]
    fn leb128_numbers() {
        let mut c = Cursor {
            b: &[0xe5, 0x8e, 0x26, 0x7f, 0x80, 0x7f, 0x02],
            at: 0,
        };
        assert_eq!(c.uleb(), Some(624_485));
        assert_eq!(c.sleb(), Some(-1));
        assert_eq!(c.sleb(), Some(-128));
        assert_eq!(c.uleb(), Some(2));
        assert_eq!(c.uleb(), None, "past the end");
    }
}
