//! Live x86-64 tests: hand-written assembly functions, one per instruction
//! class, hooked in this process. Each function's result is checked before
//! hooking, through the hook (the replacement counts calls and chains to the
//! original), and after uninstalling (original bytes restored, no more
//! counting). The functions are found by name through the ELF `.symtab`
//! fallback of `find_function` (the test executable does not export them),
//! which also supplies their sizes for the back-jump check.
#![cfg(target_arch = "x86_64")]

use std::arch::global_asm;
use std::sync::atomic::{AtomicUsize, Ordering};
use trampoline::{find_function, install, prepare_far, probe, Reason};

global_asm!(
    ".pushsection .data",
    ".p2align 3",
    "tr_data: .quad 1000, 2000",
    ".popsection",
    ".text",
    // RIP-relative load as the first instruction: x + 1000.
    ".p2align 4",
    ".globl tr_rip_load",
    ".type tr_rip_load,@function",
    "tr_rip_load:",
    "    mov rax, qword ptr [rip + tr_data]",
    "    add rax, rdi",
    "    ret",
    ".size tr_rip_load, .-tr_rip_load",
    // RIP-relative lea: x + 2000.
    ".p2align 4",
    ".globl tr_rip_lea",
    ".type tr_rip_lea,@function",
    "tr_rip_lea:",
    "    lea rax, [rip + tr_data]",
    "    mov rax, qword ptr [rax + 8]",
    "    add rax, rdi",
    "    ret",
    ".size tr_rip_lea, .-tr_rip_lea",
    // call rel32 as the first instruction: x + 7.
    ".p2align 4",
    ".globl tr_call",
    ".type tr_call,@function",
    "tr_call:",
    "    call tr_seven",
    "    add rax, rdi",
    "    ret",
    ".size tr_call, .-tr_call",
    ".p2align 4",
    "tr_seven:",
    "    mov eax, 7",
    "    ret",
    // jcc rel8 among the taken bytes, target outside them: x == 0 ? 42 : 2x.
    ".p2align 4",
    ".globl tr_jcc",
    ".type tr_jcc,@function",
    "tr_jcc:",
    "    test rdi, rdi",
    "    je 2f",
    "    lea rax, [rdi + rdi]",
    "    ret",
    "2:  mov eax, 42",
    "    ret",
    ".size tr_jcc, .-tr_jcc",
    // jcc rel8 whose target is another taken instruction: x + 5.
    ".p2align 4",
    ".globl tr_jcc_in",
    ".type tr_jcc_in,@function",
    "tr_jcc_in:",
    "    test edi, edi",
    "    .byte 0x74, 0x00", // je to the next instruction
    "    cdq",
    "    lea rax, [rdi + 5]",
    "    ret",
    ".size tr_jcc_in, .-tr_jcc_in",
    // jmp rel8 first: x + 1.
    ".p2align 4",
    ".globl tr_jmp8",
    ".type tr_jmp8,@function",
    "tr_jmp8:",
    "    .byte 0xeb, 0x03", // jmp over three int3
    "    int3",
    "    int3",
    "    int3",
    "    lea rax, [rdi + 1]",
    "    ret",
    ".size tr_jmp8, .-tr_jmp8",
    // endbr64 start: 3x.
    ".p2align 4",
    ".globl tr_endbr",
    ".type tr_endbr,@function",
    "tr_endbr:",
    "    endbr64",
    "    push rbx",
    "    mov rbx, rdi",
    "    lea rax, [rbx + rbx*2]",
    "    pop rbx",
    "    ret",
    ".size tr_endbr, .-tr_endbr",
    // Same shape, for the layout test (tests run in parallel): 4x.
    ".p2align 4",
    ".globl tr_endbr4",
    ".type tr_endbr4,@function",
    "tr_endbr4:",
    "    endbr64",
    "    push rbx",
    "    mov rbx, rdi",
    "    lea rax, [rbx*4]",
    "    pop rbx",
    "    ret",
    ".size tr_endbr4, .-tr_endbr4",
    // Long plain prologue for the far (14-byte) patch form: 5x + 2.
    ".p2align 4",
    ".globl tr_far",
    ".type tr_far,@function",
    "tr_far:",
    "    push rbx",
    "    mov rbx, rdi",
    "    imul rbx, rbx, 5",
    "    mov rax, rbx",
    "    add rax, 2",
    "    pop rbx",
    "    ret",
    ".size tr_far, .-tr_far",
    // Plain prologue for moving a stopped thread out of the patch: 3x.
    ".p2align 4",
    ".globl tr_move",
    ".type tr_move,@function",
    "tr_move:",
    "    push rbx",
    "    mov rbx, rdi",
    "    imul rbx, rbx, 3",
    "    mov rax, rbx",
    "    pop rbx",
    "    ret",
    ".size tr_move, .-tr_move",
    // For stacking two hooks: x + 100.
    ".p2align 4",
    ".globl tr_stack",
    ".type tr_stack,@function",
    "tr_stack:",
    "    lea rax, [rdi + 100]",
    "    nop",
    "    ret",
    ".size tr_stack, .-tr_stack",
    // Shorter than the patch, directly followed by another function.
    ".p2align 4",
    ".globl tr_short",
    ".type tr_short,@function",
    "tr_short:",
    "    mov rax, rdi",
    "    ret",
    ".size tr_short, .-tr_short",
    "tr_after_short:",
    "    lea rax, [rdi + 1]",
    "    ret",
    // Shorter than the patch but followed by alignment padding (nops up to
    // the next 16-byte boundary, where the next function starts): x.
    ".p2align 4",
    ".globl tr_short_padded",
    ".type tr_short_padded,@function",
    "tr_short_padded:",
    "    mov rax, rdi",
    "    ret",
    ".size tr_short_padded, .-tr_short_padded",
    ".p2align 4",
    "tr_after_padded:",
    "    lea rax, [rdi + 1]",
    "    ret",
    // Loop branching back into the prologue: sum 1..=x (x > 0).
    ".p2align 4",
    ".globl tr_backjump",
    ".type tr_backjump,@function",
    "tr_backjump:",
    "    xor eax, eax",
    "2:  add eax, edi",
    "    dec edi",
    "    jnz 2b",
    "    ret",
    ".size tr_backjump, .-tr_backjump",
);

type Fn1 = extern "C" fn(u64) -> u64;

unsafe extern "C" {
    safe fn tr_rip_load(x: u64) -> u64;
    safe fn tr_rip_lea(x: u64) -> u64;
    safe fn tr_call(x: u64) -> u64;
    safe fn tr_jcc(x: u64) -> u64;
    safe fn tr_jcc_in(x: u64) -> u64;
    safe fn tr_jmp8(x: u64) -> u64;
    safe fn tr_endbr(x: u64) -> u64;
    safe fn tr_endbr4(x: u64) -> u64;
    safe fn tr_short(x: u64) -> u64;
    safe fn tr_short_padded(x: u64) -> u64;
    safe fn tr_far(x: u64) -> u64;
    safe fn tr_move(x: u64) -> u64;
    safe fn tr_stack(x: u64) -> u64;
    safe fn tr_backjump(x: u64) -> u64;
}

/// Defines a replacement that counts its calls and chains to the original.
macro_rules! counting_replacement {
    ($name:ident, $calls:ident, $chain:ident) => {
        static $calls: AtomicUsize = AtomicUsize::new(0);
        static $chain: AtomicUsize = AtomicUsize::new(0);
        extern "C" fn $name(x: u64) -> u64 {
            $calls.fetch_add(1, Ordering::SeqCst);
            // SAFETY: CHAIN holds the trampoline of a function of type Fn1.
            let original: Fn1 = unsafe { std::mem::transmute($chain.load(Ordering::SeqCst)) };
            original(x)
        }
    };
}

/// Check `f` before, through and after a hook; `cases` are (input, expected).
fn exercise(
    name: &str,
    f: Fn1,
    cases: &[(u64, u64)],
    repl: Fn1,
    calls: &AtomicUsize,
    chain: &AtomicUsize,
) {
    let f = std::hint::black_box(f);
    for &(x, want) in cases {
        assert_eq!(f(x), want, "{name}({x}) before hooking");
    }
    let sym = find_function(name, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sym.addr, f as usize as u64, "{name}: symbol address");
    assert!(sym.size.is_some(), "{name}: size from .symtab");
    // The function, or the bytes the patch covers when it uses padding
    // (other tests hook the neighbouring functions at the same time).
    let plan = probe(&sym).unwrap_or_else(|e| panic!("{e}")).plan;
    let size = (sym.size.unwrap() as usize).max(plan.keep + plan.taken);
    // SAFETY: the function's bytes are mapped (it was just called).
    let before = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, size) }.to_vec();
    let probed = probe(&sym).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: as above.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(sym.addr as *const u8, size) },
        &before[..],
        "probe changed nothing"
    );

    let hook = install(&sym, repl as *const ()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(hook.plan(), probed.plan, "{name}: probe and install agree");
    chain.store(hook.chain() as usize, Ordering::SeqCst);
    calls.store(0, Ordering::SeqCst);
    for &(x, want) in cases {
        assert_eq!(f(x), want, "{name}({x}) through the hook");
    }
    // Also through the trampoline directly.
    // SAFETY: chain runs the original function, same type.
    let original: Fn1 = unsafe { std::mem::transmute(hook.chain()) };
    assert_eq!(original(cases[0].0), cases[0].1, "{name}: chain");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        cases.len(),
        "{name}: calls counted by the replacement"
    );

    hook.uninstall().unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: as above.
    let after = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, size) };
    assert_eq!(after, &before[..], "{name}: original bytes restored");
    for &(x, want) in cases {
        assert_eq!(f(x), want, "{name}({x}) after uninstall");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        cases.len(),
        "{name}: no calls counted after uninstall"
    );
}

macro_rules! live_test {
    ($test:ident, $func:ident, $cases:expr) => {
        #[test]
        fn $test() {
            counting_replacement!(repl, CALLS, CHAIN);
            exercise(
                stringify!($func),
                $func as Fn1,
                &$cases,
                repl,
                &CALLS,
                &CHAIN,
            );
        }
    };
}

live_test!(rip_relative_load, tr_rip_load, [(0, 1000), (5, 1005)]);
live_test!(rip_relative_lea, tr_rip_lea, [(0, 2000), (7, 2007)]);
live_test!(call_rel32_in_prologue, tr_call, [(0, 7), (10, 17)]);
live_test!(jcc_rel8_in_taken_bytes, tr_jcc, [(0, 42), (3, 6), (21, 42)]);
live_test!(jcc_rel8_to_taken_instruction, tr_jcc_in, [(0, 5), (1, 6)]);
live_test!(jmp_rel8_first, tr_jmp8, [(0, 1), (41, 42)]);
live_test!(endbr64_start, tr_endbr, [(1, 3), (5, 15)]);
live_test!(
    short_function_with_padding,
    tr_short_padded,
    [(4, 4), (9, 9)]
);

#[test]
fn endbr64_is_kept_at_the_target() {
    let sym = find_function("tr_endbr4", None).unwrap();
    let p = probe(&sym).unwrap();
    // push rbx (1) + mov rbx, rdi (3) + lea rax, [rbx*4] (8) after the endbr64.
    assert_eq!((p.plan.keep, p.plan.taken, p.plan.instructions), (4, 12, 3));
    extern "C" fn times4_plus_one(x: u64) -> u64 {
        4 * x + 1
    }
    let hook = install(&sym, times4_plus_one as *const ()).unwrap();
    // SAFETY: the first 5 bytes are mapped code.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 5) },
        &[0xf3, 0x0f, 0x1e, 0xfa, 0xe9]
    );
    let f: Fn1 = std::hint::black_box(tr_endbr4 as Fn1);
    assert_eq!(f(2), 9);
    // SAFETY: the trampoline's first 4 bytes are mapped code.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(hook.chain() as *const u8, 4) },
        &[0xf3, 0x0f, 0x1e, 0xfa]
    );
    // SAFETY: chain runs the original function, same type.
    let original: Fn1 = unsafe { std::mem::transmute(hook.chain()) };
    assert_eq!(original(2), 8);
    hook.uninstall().unwrap();
    assert_eq!(f(2), 8);
}

#[test]
fn shorter_than_patch_is_refused() {
    assert_eq!(std::hint::black_box(tr_short as Fn1)(9), 9);
    let sym = find_function("tr_short", None).unwrap();
    assert_eq!(sym.size, Some(4));
    let e = install(&sym, tr_short as *const ()).unwrap_err();
    assert_eq!(e.reason, Reason::TooShort { need: 5, have: 4 });
    assert_eq!(e.function, "tr_short");
    assert!(
        e.to_string().starts_with("cannot hook tr_short at 0x"),
        "{e}"
    );
    assert_eq!(probe(&sym).unwrap_err(), e);
}

#[test]
fn back_jump_into_prologue_is_refused() {
    assert_eq!(std::hint::black_box(tr_backjump as Fn1)(4), 10);
    let sym = find_function("tr_backjump", None).unwrap();
    let e = install(&sym, tr_backjump as *const ()).unwrap_err();
    // xor eax,eax (2) | add eax,edi (2) at +2 | dec edi (2) | jnz +2 at +6
    assert_eq!(
        e.reason,
        Reason::BranchIntoPatchedBytes {
            at: sym.addr + 6,
            target: sym.addr + 2
        }
    );
    assert_eq!(
        std::hint::black_box(tr_backjump as Fn1)(4),
        10,
        "nothing changed"
    );
}

#[test]
fn far_patch_form() {
    counting_replacement!(repl, CALLS, CHAIN);
    let f: Fn1 = std::hint::black_box(tr_far as Fn1);
    assert_eq!(f(3), 17);
    let sym = find_function("tr_far", None).unwrap();
    // SAFETY: the function's 17 bytes are mapped code.
    let before = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 17) }.to_vec();
    let prepared = prepare_far(&sym, repl as *const ()).unwrap();
    // push rbx (1) + mov (3) + imul (4) + mov (3) + add (4) = 15 >= 14.
    assert_eq!((prepared.plan().taken, prepared.plan().patch_len), (15, 14));
    CHAIN.store(prepared.chain() as usize, Ordering::SeqCst);
    let hook = prepared.enable().unwrap();
    // SAFETY: as above.
    let now = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 6) };
    assert_eq!(now, &[0xff, 0x25, 0, 0, 0, 0], "jmp qword [rip+0]");
    assert_eq!(f(3), 17);
    assert_eq!(f(0), 2);
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    hook.uninstall().unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 17) },
        &before[..]
    );
    assert_eq!(f(3), 17);
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);
}

/// A second hook on an already hooked function relocates the first hook's
/// `jmp rel32` into its trampoline, so calls run both replacements; removing
/// the lower hook first is refused (its bytes are no longer at the target).
#[test]
fn hooks_stack_and_unstack_in_order() {
    counting_replacement!(first, FIRST_CALLS, FIRST_CHAIN);
    counting_replacement!(second, SECOND_CALLS, SECOND_CHAIN);
    let counts = || {
        (
            FIRST_CALLS.load(Ordering::SeqCst),
            SECOND_CALLS.load(Ordering::SeqCst),
        )
    };
    let f: Fn1 = std::hint::black_box(tr_stack as Fn1);
    let sym = find_function("tr_stack", None).unwrap();
    // SAFETY: the function's bytes are mapped code.
    let before = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 6) }.to_vec();
    let p1 = trampoline::prepare(&sym, first as *const ()).unwrap();
    FIRST_CHAIN.store(p1.chain() as usize, Ordering::SeqCst);
    let h1 = p1.enable().unwrap();
    let p2 = trampoline::prepare(&sym, second as *const ()).unwrap();
    assert_eq!(p2.plan().taken, 5, "the first hook's jmp rel32 is taken");
    SECOND_CHAIN.store(p2.chain() as usize, Ordering::SeqCst);
    let h2 = p2.enable().unwrap();
    assert_eq!(f(1), 101);
    assert_eq!(counts(), (1, 1));
    let e = h1.uninstall().unwrap_err();
    assert_eq!(e.reason, Reason::PatchChanged { at: sym.addr });
    assert_eq!(f(2), 102, "still hooked twice after the refused uninstall");
    assert_eq!(counts(), (2, 2));
    assert!(h1.is_installed());
    h2.uninstall().unwrap();
    assert!(!h2.is_installed());
    assert_eq!(f(3), 103);
    assert_eq!(counts(), (3, 2));
    h1.uninstall().unwrap();
    // Second time: no-op.
    h1.uninstall().unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 6) },
        &before[..]
    );
    assert_eq!(f(4), 104);
    assert_eq!(counts(), (3, 2));
}

#[test]
fn a_thread_inside_the_patched_bytes_moves_to_the_trampoline() {
    let sym = find_function("tr_move", None).unwrap();
    // SAFETY: the function's 8 first bytes are mapped code.
    let before = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, 8) }.to_vec();
    extern "C" fn times3_plus_one(x: u64) -> u64 {
        3 * x + 1
    }
    let hook = install(&sym, times3_plus_one as *const ()).unwrap();
    let (start, end) = hook.patched_range();
    assert_eq!(
        (start, end),
        (sym.addr, sym.addr + 8),
        "push, mov, imul taken"
    );
    // After `push rbx` and after `mov rbx, rdi`: the same instructions
    // in the trampoline, byte for byte.
    for off in [1u64, 4] {
        let to = hook.moved_pc(sym.addr + off).unwrap();
        let n = (8 - off) as usize;
        // SAFETY: the trampoline holds the taken bytes.
        let there = unsafe { std::slice::from_raw_parts(to as *const u8, n) };
        assert_eq!(there, &before[off as usize..], "at +{off}");
    }
    // At the patch's first byte or past it, a thread needs no move.
    assert_eq!(hook.moved_pc(start), None);
    assert_eq!(hook.moved_pc(end), None);
    let f: Fn1 = std::hint::black_box(tr_move as Fn1);
    assert_eq!(f(2), 7);
    hook.uninstall().unwrap();
    assert_eq!(f(2), 6);
    // Written again, with the same trampoline.
    hook.reinstall().unwrap();
    assert_eq!(f(2), 7);
    hook.uninstall().unwrap();
    assert_eq!(f(2), 6);
}

#[test]
fn a_relocated_prologue_moves_no_thread() {
    let sym = find_function("tr_rip_lea", None).unwrap();
    let p = trampoline::prepare(&sym, std::ptr::null()).unwrap();
    let (start, end) = p.patched_range();
    assert!(end > start + 1);
    // `lea rax, [rip + tr_data]` is rewritten in the trampoline: a thread
    // after it has no exact place there.
    assert_eq!(p.moved_pc(start + 7), None);
}
