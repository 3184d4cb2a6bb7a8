//! Property test: planning and relocating arbitrary x86-64 bytes at
//! arbitrary addresses never panics, and every success re-decodes (verify)
//! to the same absolute branch and memory targets. Seeded generator, so a
//! failure reproduces; the seed and input are printed on failure.

use trampoline::arch::Arch;
use trampoline::x86_64::X86_64;

/// splitmix64: small, seeded, good enough to spread inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// A displacement: often small (targets inside the function), sometimes huge.
fn disp32(r: &mut Rng) -> [u8; 4] {
    let d: i32 = match r.below(3) {
        0 => r.below(40) as i32 - 20,
        1 => r.next() as i32,
        _ => (r.below(0x1000) as i32) - 0x800,
    };
    d.to_le_bytes()
}

/// Append one instruction-shaped fragment (or garbage) to `code`.
fn fragment(r: &mut Rng, code: &mut Vec<u8>) {
    let rel8 = |r: &mut Rng| (r.below(32) as i8 - 16) as u8;
    match r.below(20) {
        0 => code.extend([0xe8].iter().chain(&disp32(r))),
        1 => code.extend([0xe9].iter().chain(&disp32(r))),
        2 => code.extend([0xeb, rel8(r)]),
        3 => code.extend([0x70 | (r.byte() & 15), rel8(r)]),
        4 => code.extend([0x0f, 0x80 | (r.byte() & 15)].iter().chain(&disp32(r))),
        5 => code.extend([[0xe0, 0xe1, 0xe2, 0xe3][r.below(4) as usize], rel8(r)]),
        6 => code.extend([0x48, 0x8b, 0x05].iter().chain(&disp32(r))),
        7 => code.extend([0x48, 0x8d, 0x3d].iter().chain(&disp32(r))),
        8 => code.extend([0xf3, 0x0f, 0x1e, 0xfa]),
        9 => code.push([0xc3, 0x90, 0xcc, 0x55, 0x53][r.below(5) as usize]),
        10 => code.extend(
            [0xff, [0x25, 0x15][r.below(2) as usize]]
                .iter()
                .chain(&disp32(r)),
        ),
        11 => {
            code.extend([0xc7, 0x05].iter().chain(&disp32(r)));
            code.extend(disp32(r));
        }
        12 => code.extend([0x67, 0x8b, 0x05].iter().chain(&disp32(r))),
        13 => code.extend([0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]),
        14 => code.extend([0x48, 0x89, 0xe5]),
        15 => code.extend([0xc7, 0xf8].iter().chain(&disp32(r))), // xbegin
        _ => {
            let n = 1 + r.below(8) as usize;
            code.extend((0..n).map(|_| r.byte()));
        }
    }
}

fn address(r: &mut Rng) -> u64 {
    match r.below(4) {
        0 => r.next(),                                    // anywhere, including wrap-around
        1 => u64::MAX - r.below(64),                      // right at the top
        2 => r.below(64),                                 // right at the bottom
        _ => 0x7f00_0000_0000 + (r.below(1 << 32) & !15), // typical shared-library range
    }
}

#[test]
fn relocation_never_panics_and_verifies() {
    let seed = 0x7472_616d_706f_6c69;
    let mut r = Rng(seed);
    let (mut ok, mut refused) = (0usize, 0usize);
    for case in 0..40_000 {
        let mut code = Vec::new();
        while code.len() < 8 + r.below(40) as usize {
            fragment(&mut r, &mut code);
        }
        let addr = address(&mut r);
        let size = match r.below(3) {
            0 => None,
            _ => Some(r.below(code.len() as u64 + 1)),
        };
        let patch_len = if r.below(4) == 0 {
            X86_64::FAR_PATCH_LEN
        } else {
            X86_64::NEAR_PATCH_LEN
        };
        let tramp = match r.below(3) {
            0 => r.next(),
            _ => addr.wrapping_add(r.below(1 << 31)).wrapping_sub(1 << 30) & !15,
        };
        let ctx = || {
            format!("case {case} seed {seed:#x}: addr {addr:#x} size {size:?} tramp {tramp:#x} code {code:02x?}")
        };
        let Ok(plan) = X86_64::plan(&code, addr, size, patch_len) else {
            refused += 1;
            continue;
        };
        assert!(
            plan.taken >= patch_len && plan.keep + plan.taken <= code.len(),
            "{}: {plan:?}",
            ctx()
        );
        match X86_64::relocate(&code, addr, &plan, tramp) {
            Ok(out) => {
                if let Err(e) = X86_64::verify(&code, addr, &plan, tramp, &out) {
                    panic!("{}: verify failed: {e}\n out {out:02x?}", ctx());
                }
                assert!(
                    out.len() <= X86_64::MAX_TRAMPOLINE_LEN,
                    "{}: {} bytes",
                    ctx(),
                    out.len()
                );
                ok += 1;
            }
            Err(_) => refused += 1,
        }
    }
    // The generator must exercise both outcomes substantially.
    assert!(ok > 5_000 && refused > 5_000, "ok {ok} refused {refused}");
}
