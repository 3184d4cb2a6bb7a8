//! Byte-exact x86-64 relocation tests: input bytes at address X, expected
//! trampoline bytes at address Y, one test per instruction class, plus the
//! refusals. Pure functions only: these run on any host. Expected bytes were
//! computed by hand (displacement = target - end of instruction).

use trampoline::arch::Arch;
use trampoline::x86_64::X86_64;
use trampoline::{Plan, Reason};

const X: u64 = 0x7f00_0000_1000;
/// Trampoline 256 MiB above the function (rel32 reach).
const Y: u64 = 0x7f00_1000_0000;
/// Trampoline 8 GiB above the function (out of rel32 reach).
const FAR: u64 = X + (8 << 30);

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

/// Plan with the symbol size = the given bytes, relocate to `tramp`, check
/// the bytes, and check `verify` agrees and that the plan's record (the
/// plan store's) gives the same trampoline without decoding.
fn reloc(code: &str, tramp: u64) -> (Plan, Vec<u8>) {
    let code = hex(code);
    let plan = X86_64::plan(&code, X, Some(code.len() as u64), 5).expect("plan");
    let out = X86_64::relocate(&code, X, &plan, tramp).expect("relocate");
    X86_64::verify(&code, X, &plan, tramp, &out).expect("verify");
    let record = X86_64::record(&code, X, &plan).expect("x86-64 keeps a record");
    assert_eq!(
        X86_64::relocate_known(&code, X, &plan, tramp, &record).expect("from the record"),
        out
    );
    (plan, out)
}

/// A record that does not fit the code is refused: another target for a
/// RIP-relative operand or a call, another length, a cut record, a record
/// of other code.
#[test]
fn a_record_that_does_not_fit_the_code_is_refused() {
    // push rbp; call rel32 +0x200 / push rbp; mov rax, [rip+0x100]; then ret
    // (code, where the record holds the second instruction's target, a
    // byte of that instruction's displacement in the code)
    for (code, target_at, disp_at) in [
        ("55 e8 00 02 00 00 c3", 13 + 5, 3),
        ("55 48 8b 05 00 01 00 00 c3", 13 + 5, 5),
    ] {
        let code = hex(code);
        let plan = X86_64::plan(&code, X, Some(code.len() as u64), 5).expect("plan");
        assert_eq!(plan.instructions, 2);
        let record = X86_64::record(&code, X, &plan).expect("record");
        assert_eq!(record.len(), 13 * plan.instructions);
        let refused = |r: &[u8], code: &[u8]| X86_64::relocate_known(code, X, &plan, Y, r).is_err();
        assert!(!refused(&record, &code));
        let mut target = record.clone();
        target[target_at] ^= 8; // the second instruction's recorded target
        assert!(refused(&target, &code));
        let mut len = record.clone();
        len[2] += 1; // the first instruction's length
        assert!(refused(&len, &code));
        assert!(refused(&record[..record.len() - 1], &code));
        let mut other = code.clone();
        other[disp_at] ^= 0x10; // another displacement in the code itself
        assert!(refused(&record, &other));
    }
}

fn check(code: &str, tramp: u64, taken: usize, expected: &str) {
    let (plan, out) = reloc(code, tramp);
    assert_eq!(plan.taken, taken, "taken bytes");
    assert_eq!(out, hex(expected), "\n got {:02x?}\nwant {expected}", out);
}

fn refusal(code: &str, size: Option<u64>) -> Reason {
    let code = hex(code);
    let r =
        X86_64::plan(&code, X, size, 5).and_then(|p| X86_64::relocate(&code, X, &p, Y).map(|_| p));
    r.expect_err("must be refused")
}

#[test]
fn rip_relative_load() {
    // mov rax, [rip+0x100]; ret
    check(
        "48 8b 05 00 01 00 00 c3",
        Y,
        7,
        "48 8b 05 00 11 00 f0 e9 fb 0f 00 f0",
    );
}

#[test]
fn rip_relative_lea_negative_disp() {
    // lea rdi, [rip-0x20]; ret
    check(
        "48 8d 3d e0 ff ff ff c3",
        Y,
        7,
        "48 8d 3d e0 0f 00 f0 e9 fb 0f 00 f0",
    );
}

#[test]
fn rip_relative_with_immediate_after_disp() {
    // cmp dword [rip+0x10], 5; ret  (imm8 follows the displacement)
    check(
        "83 3d 10 00 00 00 05 c3",
        Y,
        7,
        "83 3d 10 10 00 f0 05 e9 fb 0f 00 f0",
    );
}

#[test]
fn rip_relative_out_of_reach_refused() {
    let code = hex("48 8b 05 00 01 00 00 c3");
    let plan = X86_64::plan(&code, X, Some(8), 5).unwrap();
    assert_eq!(
        X86_64::relocate(&code, X, &plan, FAR),
        Err(Reason::OutOfReach {
            at: X,
            target: X + 0x107
        })
    );
}

#[test]
fn call_rel32_in_prologue() {
    // push rbx; call X+0x1001; pop rbx; ret
    check(
        "53 e8 fb 0f 00 00 5b c3",
        Y,
        6,
        "53 e8 fb 1f 00 f0 e9 fb 0f 00 f0",
    );
}

#[test]
fn call_rel32_far_uses_literal() {
    // call [rip+2]; jmp +8; .quad X+0x1001; then jmp [rip+0] back to X+6.
    check(
        "53 e8 fb 0f 00 00 5b c3",
        FAR,
        6,
        "53 ff 15 02 00 00 00 eb 08 01 20 00 00 00 7f 00 00 ff 25 00 00 00 00 06 10 00 00 00 7f 00 00",
    );
}

#[test]
fn jmp_rel8_widened() {
    // jmp X+0x12; mov rax, rdi; nops; ret at X+0x12
    check(
        "eb 10 48 89 f8 90 90 90 90 90 90 90 90 90 90 90 90 90 c3",
        Y,
        5,
        "e9 0d 10 00 f0 48 89 f8 e9 f8 0f 00 f0",
    );
}

#[test]
fn jcc_rel8_inside_taken_bytes() {
    // test edi, edi; je X+4 (the next, taken, instruction); xor eax, eax; ret
    check(
        "85 ff 74 00 31 c0 c3",
        Y,
        6,
        "85 ff 0f 84 00 00 00 00 31 c0 e9 f7 0f 00 f0",
    );
}

#[test]
fn jcc_rel8_outside_widened() {
    // test edi, edi; je X+0x14; xor eax, eax; ... ret
    let code = "85 ff 74 10 31 c0 c3 90 90 90 90 90 90 90 90 90 90 90 90 90 c3";
    check(code, Y, 6, "85 ff 0f 84 0c 10 00 f0 31 c0 e9 f7 0f 00 f0");
    // Far: inverted condition over an absolute jump.
    check(
        code,
        FAR,
        6,
        "85 ff 75 0e ff 25 00 00 00 00 14 10 00 00 00 7f 00 00 31 c0 ff 25 00 00 00 00 06 10 00 00 00 7f 00 00",
    );
}

#[test]
fn endbr64_is_kept_and_copied() {
    // endbr64; push rbp; mov rbp, rsp; sub rsp, 16; ...
    let (plan, _) = reloc("f3 0f 1e fa 55 48 89 e5 48 83 ec 10 c9 c3", Y);
    assert_eq!(
        plan,
        Plan {
            keep: 4,
            taken: 8,
            instructions: 3,
            patch_len: 5
        }
    );
    check(
        "f3 0f 1e fa 55 48 89 e5 48 83 ec 10 c9 c3",
        Y,
        8,
        "f3 0f 1e fa 55 48 89 e5 48 83 ec 10 e9 fb 0f 00 f0",
    );
}

#[test]
fn loop_and_jrcxz_to_outside_refused() {
    for (code, what) in [
        ("e2 10 48 89 f8 c3", "loop to outside the taken bytes"),
        ("e3 10 48 89 f8 c3", "jrcxz to outside the taken bytes"),
        ("67 e3 10 48 89 f8 c3", "jecxz to outside the taken bytes"),
        ("e1 10 48 89 f8 c3", "loope to outside the taken bytes"),
    ] {
        let n = hex(code).len() as u64;
        assert_eq!(
            refusal(code, Some(n + 0x20)),
            Reason::Unrelocatable {
                at: X,
                what: what.into()
            },
            "{code}"
        );
    }
}

#[test]
fn loop_inside_taken_bytes_is_moved() {
    // L: dec eax (ff c8); loop L (e2 fc); mov rax, rdi; ret
    check(
        "ff c8 e2 fc 48 89 f8 c3",
        Y,
        7,
        "ff c8 e2 fc 48 89 f8 e9 fb 0f 00 f0",
    );
}

#[test]
fn shorter_than_patch_refused() {
    // xor eax, eax; ret (3 bytes, no padding after it)
    assert_eq!(
        refusal("31 c0 c3", Some(3)),
        Reason::TooShort { need: 5, have: 3 }
    );
    // Size unknown: the ret ends the function.
    assert_eq!(
        refusal("31 c0 c3 55 48 89 e5", None),
        Reason::TooShort { need: 5, have: 3 }
    );
}

#[test]
fn alignment_padding_after_short_function_is_used() {
    // xor eax, eax; ret (size 3) followed by a 6-byte nop and int3 padding.
    let code = hex("31 c0 c3 66 0f 1f 44 00 00 cc cc cc cc cc cc cc");
    let plan = X86_64::plan(&code, X, Some(3), 5).unwrap();
    assert_eq!(
        plan,
        Plan {
            keep: 0,
            taken: 9,
            instructions: 3,
            patch_len: 5
        }
    );
    // Padding that is not a nop (another function's code) is not used.
    let code = hex("31 c0 c3 55 48 89 e5 c3");
    assert_eq!(
        X86_64::plan(&code, X, Some(3), 5),
        Err(Reason::TooShort { need: 5, have: 3 })
    );
}

#[test]
fn back_jump_into_prologue_refused() {
    // mov rax, rdi; L: inc rax; cmp rax, rsi; jne L; ret
    assert_eq!(
        refusal("48 89 f8 48 ff c0 48 39 f0 75 f8 c3", Some(12)),
        Reason::BranchIntoPatchedBytes {
            at: X + 9,
            target: X + 3
        }
    );
    // A jump back to the very first byte (a tail call to itself) is accepted.
    let code = hex("48 89 f8 48 ff c0 48 39 f0 75 f5 c3");
    assert!(X86_64::plan(&code, X, Some(12), 5).is_ok());
}

#[test]
fn branch_into_middle_of_taken_instruction_refused() {
    // jmp X+1 (inside itself); nop...
    let r = refusal("eb ff c0 48 89 f8 c3", Some(7));
    assert_eq!(
        r,
        Reason::Unrelocatable {
            at: X,
            what: "branch into the middle of a taken instruction".into()
        }
    );
}

#[test]
fn undecodable_refused() {
    assert_eq!(
        refusal("06 06 06 06 06 06", Some(6)),
        Reason::Undecodable { at: X }
    );
}

#[test]
fn patch_forms() {
    assert_eq!(X86_64::near_patch(X, Y), Some(hex("e9 fb ef ff 0f")));
    assert_eq!(X86_64::near_patch(X, FAR), None);
    let abs = hex("ff 25 00 00 00 00 00 10 00 00 02 7f 00 00");
    assert_eq!(X86_64::far_patch(X, FAR), abs);
    assert_eq!(X86_64::stub(Y, FAR), abs);
    assert_eq!(X86_64::filler(3), hex("cc cc cc"));
}
