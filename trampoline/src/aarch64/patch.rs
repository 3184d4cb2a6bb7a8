//! The bytes written at an AArch64 patch site and in entry stubs.
//!
//! Owns: the near patch (`b`, 4 bytes, +-128 MiB), the far patch and entry
//! stub (`ldr x16, =to; br x16` with the 64-bit literal 8-byte aligned), and
//! the trap filler for the rest of the taken bytes.
//!
//! Registers: the far patch and the stub clobber x16 (IP0), which the
//! AAPCS64 lets any call veneer clobber, before any original instruction
//! runs.
//!
//! Must never: write memory; it only produces bytes.

use super::decode::LiteralKind;
use super::encode::{self, UDF};

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `b to` at `from`; `None` beyond +-128 MiB.
pub fn near_patch(from: u64, to: u64) -> Option<Vec<u8>> {
    encode::b(from, to).map(|w| w.to_le_bytes().to_vec())
}

/// Length of the far patch at `from`: 16 bytes when the literal after
/// `ldr x16; br x16` is 8-byte aligned (`from % 8 == 0`), else 20.
pub fn far_patch_len(from: u64) -> usize {
    if from & 7 == 0 {
        16
    } else {
        20
    }
}

/// `ldr x16, L; br x16; L: .quad to`, with the 64-bit literal on an 8-byte
/// boundary: 16 bytes at `from % 8 == 0`; at `from % 8 == 4` a `udf` pads
/// before the literal (20 bytes). [`far_patch_len`] bytes.
pub fn far_patch(from: u64, to: u64) -> Vec<u8> {
    let (lo, hi) = (to as u32, (to >> 32) as u32);
    let ldr = |lit_off: u64| encode::ldr_literal(LiteralKind::X, 16, from, from + lit_off).unwrap();
    if far_patch_len(from) == 16 {
        words(&[ldr(8), encode::br(16), lo, hi])
    } else {
        words(&[ldr(12), encode::br(16), UDF, lo, hi])
    }
}

/// Entry stub (code alignment 16, so the literal is aligned):
/// `ldr x16, L; br x16; L: .quad to`, 16 bytes. At an address that is not
/// 8-byte aligned the literal is unaligned, which Linux user space (SCTLR
/// alignment checking off) still loads correctly.
pub fn stub(at: u64, to: u64) -> Vec<u8> {
    let ldr = encode::ldr_literal(LiteralKind::X, 16, at, at + 8).unwrap();
    words(&[ldr, encode::br(16), to as u32, (to >> 32) as u32])
}

/// `udf #0` words (traps if ever executed); zero bytes for a tail that is
/// not a whole instruction.
pub fn filler(len: usize) -> Vec<u8> {
    vec![0; len]
}
