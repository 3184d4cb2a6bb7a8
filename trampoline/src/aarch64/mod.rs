//! AArch64 back end of the trampoline crate: decode, relocate, emit.
//!
//! Owns: everything architecture-specific for 64-bit Arm, behind
//! [`crate::arch::Arch`] ([`Aarch64`]). Compiled and unit-tested on every
//! host; only [`cache::flush_icache`] does anything host-specific, and only
//! on AArch64 hosts.
//!
//! - [`decode`]: mask matching of the PC-relative classes, cross-checked
//!   against yaxpeax-arm.
//! - [`encode`]: instruction encoders with range checks.
//! - [`relocate`]: the plan (what is taken, what is refused) and one rewrite
//!   per class, each reaching any 64-bit target via a literal pool.
//! - [`patch`]: near patch `b` (+-128 MiB), far patch and entry stub
//!   `ldr x16, =to; br x16`.
//! - [`verify`]: independent re-decoding check of a relocation.
//! - [`cache`]: `dc cvau`/`ic ivau`/`dsb ish`/`isb`.
//!
//! Registers clobbered: only x16/x17 (IP0/IP1). The far patch and the entry
//! stub write x16 before any original instruction runs; inside a trampoline
//! a scratch (x16 or x17, whichever the taken instructions do not name) is
//! written only to reach a target beyond a short form's range (and for the
//! jump back when the trampoline is beyond +-128 MiB). A function whose
//! taken instructions name both x16 and x17 and need a scratch is refused.
//! A function with a non-standard convention that expects x16 to survive
//! its entry (none of the hooks the profiler needs) must not get the far
//! patch or an entry stub.
//!
//! Landing pads: a function starting with `bti`/`bti c|j|jc` keeps it in
//! place (`Plan::keep` = 4) and is patched after it; the trampoline starts
//! with the same `bti`.
//!
//! Must never: touch process state other than the cache maintenance.

pub mod cache;
pub mod decode;
pub mod encode;
pub mod patch;
pub mod relocate;
pub mod verify;

use crate::arch::Arch;

/// Length of the near patch (`b`).
pub const NEAR_PATCH_LEN: usize = 4;
/// Longest far patch (20 bytes where the patch site is 4 mod 8, else 16:
/// `plan` reports the length it uses in `Plan::patch_len`).
pub const FAR_PATCH_LEN: usize = 20;

/// The AArch64 implementation of [`Arch`].
pub struct Aarch64;

impl Arch for Aarch64 {
    const NAME: &'static str = "AArch64";
    const ELF_MACHINE: u16 = 183;
    const NEAR_REACH: u64 = 128 << 20;
    const NEAR_PATCH_LEN: usize = NEAR_PATCH_LEN;
    const FAR_PATCH_LEN: usize = FAR_PATCH_LEN;
    const STUB_LEN: usize = 16;
    // bti + 5 taken instructions x (12 code + 8 literal) + jump back
    // (8 + 8) + alignment 4, rounded up.
    const MAX_TRAMPOLINE_LEN: usize = 128;
    const CODE_ALIGN: usize = 16;
    const MAX_READ: usize = 64;
    // `b .`: a far patch (16/20 bytes) cannot be stored at once; this one
    // instruction is, so a thread entering meanwhile spins (patch.rs).
    const SELF_LOOP: &'static [u8] = &[0x00, 0x00, 0x00, 0x14];

    crate::arch::forward_pure!(
        plan: relocate::plan,
        relocate: relocate::relocate,
        verify: verify::verify,
    );

    fn near_patch(from: u64, to: u64) -> Option<Vec<u8>> {
        patch::near_patch(from, to)
    }

    fn far_patch(from: u64, to: u64) -> Vec<u8> {
        patch::far_patch(from, to)
    }

    fn stub(at: u64, to: u64) -> Vec<u8> {
        patch::stub(at, to)
    }

    fn filler(len: usize) -> Vec<u8> {
        patch::filler(len)
    }

    fn flush_icache(addr: u64, len: usize) {
        cache::flush_icache(addr, len)
    }
}
