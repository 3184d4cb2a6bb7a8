//! Byte-exact AArch64 relocation tests, refusals, and a property test of
//! plan/relocate/verify. Pure functions only: they run on every host.
//!
//! The expected bytes (`aarch64_data/relocate_cases.rs`) were produced by
//! GNU as + ld linking the expected instruction sequence at the trampoline
//! address (`aarch64_relocate_gen.py`), so the offsets are the linker's, not
//! our encoder's.

use trampoline::aarch64::decode::{decode, yaxpeax_target, Insn};
use trampoline::aarch64::{patch, Aarch64};
use trampoline::arch::Arch;
use trampoline::Reason;

pub struct Case {
    name: &'static str,
    src: u64,
    size: u64,
    patch_len: usize,
    tramp: u64,
    orig: &'static [u32],
    expect: &'static [u32],
}

include!("aarch64_data/relocate_cases.rs");

const NOP: u32 = 0xd503_201f;

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `words` followed by nops up to `size` bytes.
fn function(words: &[u32], size: u64) -> Vec<u8> {
    let mut w = words.to_vec();
    w.resize(size as usize / 4, NOP);
    bytes(&w)
}

fn hook_words(c: &Case) -> Result<Vec<u8>, Reason> {
    let code = function(c.orig, c.size);
    let plan = Aarch64::plan(&code, c.src, Some(c.size), c.patch_len)?;
    Aarch64::relocate(&code, c.src, &plan, c.tramp)
}

#[test]
fn every_class_relocates_byte_exact() {
    let mut failures = Vec::new();
    for c in CASES {
        let code = function(c.orig, c.size);
        let plan = Aarch64::plan(&code, c.src, Some(c.size), c.patch_len).unwrap();
        let out = Aarch64::relocate(&code, c.src, &plan, c.tramp).unwrap();
        if out != bytes(c.expect) {
            let got: Vec<String> = out
                .chunks(4)
                .map(|w| format!("{:08x}", u32::from_le_bytes(w.try_into().unwrap())))
                .collect();
            failures.push(format!("{}: got [{}]", c.name, got.join(", ")));
            continue;
        }
        assert!(
            out.len() <= Aarch64::MAX_TRAMPOLINE_LEN,
            "{}: {} bytes",
            c.name,
            out.len()
        );
        Aarch64::verify(&code, c.src, &plan, c.tramp, &out)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    }
    assert!(
        failures.is_empty(),
        "byte mismatches:\n{}",
        failures.join("\n")
    );
    assert!(CASES.len() >= 50);
}

#[test]
fn classes_are_tested_beyond_their_own_reach() {
    // The case table covers each class at a distance its own encoding cannot reach.
    for (name, reach) in [
        ("tbz_x11_40_beyond_own_reach", 32 << 10),
        ("b_ne_beyond_own_reach", 1 << 20),
        ("adrp_beyond_4gib", 4u64 << 30),
        ("b_beyond_128mib", 128 << 20),
        ("ldr_q6_64gib", 1 << 20),
    ] {
        let c = CASES.iter().find(|c| c.name == name).unwrap();
        let target = decode(c.orig[0], c.src).target().unwrap();
        assert!(c.tramp.abs_diff(target) > reach, "{name}");
        hook_words(c).unwrap();
    }
}

#[test]
fn verify_rejects_a_wrong_literal_or_branch() {
    for c in CASES {
        let code = function(c.orig, c.size);
        let plan = Aarch64::plan(&code, c.src, Some(c.size), c.patch_len).unwrap();
        let out = Aarch64::relocate(&code, c.src, &plan, c.tramp).unwrap();
        // Corrupt the last 8 bytes: either the jump-back literal or (no pool) the
        // jump back and the instruction before it.
        let mut bad = out.clone();
        let n = bad.len();
        bad[n - 8] ^= 0x20; // an offset/immediate/register bit of a word, or a literal bit
        assert!(
            Aarch64::verify(&code, c.src, &plan, c.tramp, &bad).is_err(),
            "{}: corrupted output verified",
            c.name
        );
        // Re-encoded short forms are only right at their own address.
        if c.name.ends_with("_in_reach") {
            let moved = Aarch64::verify(&code, c.src, &plan, c.tramp + 0x1000, &out);
            assert!(moved.is_err(), "{}: moved output verified", c.name);
        }
    }
}

#[test]
fn patches_and_stub_byte_exact() {
    let s = 0x5555_0000_1000u64;
    // b +0x1000 / b -0x8000000 (limit) / out of reach
    assert_eq!(
        patch::near_patch(s, s + 0x1000),
        Some(bytes(&[0x1400_0400]))
    );
    assert_eq!(
        patch::near_patch(s, s - (128 << 20)),
        Some(bytes(&[0x1600_0000]))
    );
    assert_eq!(patch::near_patch(s, s + (128 << 20)), None);
    // ldr x16, #8; br x16; .quad (16 bytes) | ldr x16, #12; br x16; udf; .quad (20 bytes)
    let to = 0x0123_4567_89ab_cdefu64;
    assert_eq!(
        patch::far_patch(s, to),
        bytes(&[0x5800_0050, 0xd61f_0200, 0x89ab_cdef, 0x0123_4567])
    );
    assert_eq!(
        patch::far_patch(s + 4, to),
        bytes(&[0x5800_0070, 0xd61f_0200, 0, 0x89ab_cdef, 0x0123_4567])
    );
    assert_eq!(patch::far_patch(s + 4, to).len(), Aarch64::FAR_PATCH_LEN);
    // plan() takes exactly what far_patch() writes at that address.
    for at in [s, s + 4] {
        let code = function(&[NOP], 0x40);
        let plan = Aarch64::plan(&code, at, Some(0x40), Aarch64::FAR_PATCH_LEN).unwrap();
        assert_eq!(
            (plan.patch_len, plan.taken),
            (patch::far_patch(at, to).len(), patch::far_patch_len(at))
        );
    }
    assert_eq!(
        patch::stub(s, to),
        bytes(&[0x5800_0050, 0xd61f_0200, 0x89ab_cdef, 0x0123_4567])
    );
    assert_eq!(Aarch64::filler(8), vec![0; 8]);
}

fn refusal(words: &[u32], size: Option<u64>, patch_len: usize) -> Reason {
    let code = function(words, size.unwrap_or(4 * words.len() as u64));
    Aarch64::plan(&code, 0x10_0000, size, patch_len).unwrap_err()
}

#[test]
fn refusals_are_typed() {
    // b.ne from +24 back to +8, inside the 16 bytes a far patch takes.
    let b_ne_back = 0x5400_0000 | ((((8i32 - 24) / 4) as u32 & 0x7ffff) << 5) | 1;
    assert_eq!(
        refusal(&[NOP, NOP, NOP, NOP, NOP, NOP, b_ne_back], Some(0x40), 20),
        Reason::BranchIntoPatchedBytes {
            at: 0x10_0018,
            target: 0x10_0008
        }
    );
    // A branch back to the very first byte is fine (it re-enters through the patch).
    let b_start = 0x1400_0000 | ((-6i32) as u32 & 0x03ff_ffff);
    let code = function(&[NOP, NOP, NOP, NOP, NOP, NOP, b_start], 0x40);
    assert!(Aarch64::plan(&code, 0x10_0000, Some(0x40), 20).is_ok());
    // With `bti c` kept, a branch to the patch site (just after it) is refused.
    let b_to_4 = 0x1400_0000 | ((-2i32) as u32 & 0x03ff_ffff);
    assert_eq!(
        refusal(&[0xd503_245f, NOP, NOP, b_to_4], Some(0x40), 4),
        Reason::BranchIntoPatchedBytes {
            at: 0x10_000c,
            target: 0x10_0004
        }
    );
    // ldr x0, #8 reads bytes a far patch overwrites.
    assert!(matches!(
        refusal(&[0x5800_0040, NOP, NOP, NOP, NOP, NOP], Some(0x40), 20),
        Reason::Unrelocatable { at: 0x10_0000, .. }
    ));
    // A later literal load into the patched bytes.
    let ldr_back = 0x5800_0000 | ((((4i32 - 16) / 4) as u32 & 0x7ffff) << 5);
    let code = function(&[NOP, NOP, NOP, NOP, ldr_back], 0x40); // reads +4: outside a near patch
    assert!(Aarch64::plan(&code, 0x10_0000, Some(0x40), 4).is_ok());
    assert!(matches!(
        refusal(
            &[NOP, NOP, NOP, NOP, NOP, NOP, ldr_back - (2 << 5)],
            Some(0x40),
            20
        ),
        Reason::Unrelocatable { at: 0x10_0018, .. }
    ));
    // Too short: by symbol size, and (size unknown) a `ret` before the patch end.
    assert_eq!(
        refusal(&[NOP, NOP], Some(8), 20),
        Reason::TooShort { need: 16, have: 8 }
    );
    assert_eq!(
        refusal(&[NOP, 0xd65f_03c0, NOP, NOP, NOP, NOP], None, 20),
        Reason::TooShort { need: 16, have: 8 }
    );
    // Taken instructions name x16 and x17 and a far patch needs a scratch.
    assert!(matches!(
        refusal(&[0xaa00_03f0, 0xaa01_03f1, NOP, NOP, NOP], Some(0x40), 20),
        Reason::Unrelocatable { .. }
    ));
    // ... but a near patch of an instruction that needs no scratch is fine.
    let code = function(&[0x8b11_0210], 0x40); // add x16, x16, x17
    assert!(Aarch64::plan(&code, 0x10_0000, Some(0x40), 4).is_ok());
    // FEAT_PAuth_LR: PC used as signing modifier / PC-relative authenticate.
    assert!(matches!(
        refusal(&[0xdac1_a3fe], Some(0x40), 4),
        Reason::Unrelocatable { .. }
    ));
    assert!(matches!(
        refusal(&[0xf380_001f], Some(0x40), 4),
        Reason::Unrelocatable { .. }
    ));
    // Unaligned function address.
    assert!(matches!(
        Aarch64::plan(&function(&[NOP], 0x40), 0x10_0002, None, 4),
        Err(Reason::Unrelocatable { .. })
    ));
}

/// xorshift64*: deterministic pseudo-random numbers without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A random word, half of the time forced into one of the PC-relative classes.
fn random_word(r: &mut Rng) -> u32 {
    let w = r.next() as u32;
    const CLASSES: [(u32, u32); 8] = [
        (0x7c00_0000, 0x1400_0000), // b, bl
        (0xff00_0000, 0x5400_0000), // b.cond
        (0x7e00_0000, 0x3400_0000), // cbz, cbnz
        (0x7e00_0000, 0x3600_0000), // tbz, tbnz
        (0x1f00_0000, 0x1000_0000), // adr, adrp
        (0x3b00_0000, 0x1800_0000), // ldr literal
        (0xffe0_001f, 0xf380_001f), // autiasppc family
        (0xffff_fc1f, 0xd61f_0000), // br
    ];
    match r.next() % 16 {
        k if k < 8 => {
            let (mask, value) = CLASSES[k as usize];
            (w & !mask) | value
        }
        k if k < 12 => NOP,
        _ => w,
    }
}

#[test]
fn mask_decoder_agrees_with_yaxpeax() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut compared = 0;
    for _ in 0..200_000 {
        let w = random_word(&mut r);
        let pc = r.next() & !3;
        let mine = decode(w, pc);
        match yaxpeax_target(w, pc) {
            Some(t) if !matches!(mine, Insn::Other(_)) => {
                assert_eq!(mine.target(), Some(t), "{w:08x} at {pc:#x}: {mine:?}");
                compared += 1;
            }
            // yaxpeax rejects some encodings we treat as PC-relative (e.g.
            // bc.cond, prfm with reserved ops); it must never see a PC-relative
            // operand in a word we call position independent, except the
            // FEAT_PAuth_LR forms plan() refuses.
            Some(_) => assert!(
                trampoline::aarch64::decode::pc_dependent_unknown(w).is_some(),
                "{w:08x}"
            ),
            None => {}
        }
    }
    assert!(compared > 50_000, "{compared}");
}

#[test]
fn random_code_never_panics_and_every_success_verifies() {
    let mut r = Rng(0x0123_4567_89ab_cdef);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..30_000 {
        let n = 12;
        let words: Vec<u32> = (0..n).map(|_| random_word(&mut r)).collect();
        let addr = (r.next() & 0x0000_ffff_ffff_fffc).max(0x1000);
        let size = if i % 3 == 0 { None } else { Some(4 * n as u64) };
        let patch_len = if i % 2 == 0 { 4 } else { 20 };
        // Trampoline near (as the allocator would place it) or anywhere.
        let tramp = if i % 4 < 2 {
            addr.wrapping_add((r.next() % (256 << 20)) & !15)
                .wrapping_sub(128 << 20)
        } else {
            r.next() & 0x0000_ffff_ffff_fff0
        };
        let code = bytes(&words);
        match Aarch64::plan(&code, addr, size, patch_len) {
            Ok(plan) => {
                let out = match Aarch64::relocate(&code, addr, &plan, tramp) {
                    Ok(out) => out,
                    // A near patch is only planned with a trampoline in
                    // near reach; beyond it, the jump back needs a scratch
                    // register the taken instruction may not leave free.
                    Err(Reason::Unrelocatable { .. })
                        if patch_len == 4 && tramp.abs_diff(addr) >= Aarch64::NEAR_REACH - 8 =>
                    {
                        refused += 1;
                        continue;
                    }
                    Err(e) => panic!("{words:08x?} at {addr:#x} -> {tramp:#x}: {e}"),
                };
                assert!(out.len() <= Aarch64::MAX_TRAMPOLINE_LEN);
                Aarch64::verify(&code, addr, &plan, tramp, &out)
                    .unwrap_or_else(|e| panic!("{words:08x?} at {addr:#x} -> {tramp:#x}: {e}"));
                ok += 1;
            }
            Err(_) => refused += 1,
        }
    }
    assert!(ok > 10_000 && refused > 1_000, "ok {ok} refused {refused}");
}
