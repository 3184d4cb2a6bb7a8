//! Live AArch64 tests (run under qemu-user on an x86-64 host:
//! `cargo test --target aarch64-unknown-linux-gnu -p trampoline`).
//!
//! Hand-written assembly functions, one per PC-relative class with that
//! form as the FIRST instruction (plus a leaf function, one whose literal
//! pool sits right after the taken bytes, one with branches between the
//! instructions a far patch takes, and one starting with `bti c`, which
//! stays in place). Three ways of running each:
//!
//! 1. `hook_every_class`: the crate's `install` (near `b` patch, trampoline
//!    within +-128 MiB); results checked before, through the hook (an
//!    assembly replacement counts the call and tail-jumps to `chain`, so
//!    flags, x15 and x30 reach the original untouched), through `chain`
//!    directly, and after `uninstall` (bytes restored, nothing counted).
//! 2. `far_trampolines_run_every_class`: the same functions relocated by
//!    `Aarch64::relocate` into pages 64 MiB and >4 GiB away, so every class
//!    runs its out-of-reach form (literal loads, inverted branches over
//!    `ldr x16; br x16`, `ldr x30; blr x30`), called directly.
//! 3. `far_patch_hooks`: the 16/20-byte `ldr x16, =repl; br x16` patch
//!    written by hand with `Aarch64::far_patch`, trampoline >4 GiB away.
//! 4. `hook_with_replacement_out_of_reach_uses_entry_stub`: `install` with a
//!    replacement 8 GiB away goes through an entry stub near the target.
//!
//! Functions are called through `ta_call(f, x, nzcv)`, which sets the
//! condition flags and x15 (= its return label, used by `ta_bl`, whose first
//! instruction `bl` overwrites x30) before branching to `f`.
#![cfg(target_arch = "aarch64")]

use std::arch::global_asm;
use trampoline::aarch64::Aarch64;
use trampoline::arch::Arch;
use trampoline::{find_function, install, probe, Reason};

global_asm!(
    ".pushsection .data",
    ".p2align 4",
    "ta_data: .quad 1000, 2000",
    ".globl ta_calls",
    "ta_calls: .quad 0",
    ".globl ta_chain",
    "ta_chain: .quad 0",
    ".popsection",
    ".text",
    // ta_call(f, x, nzcv): x0 = f(x) with NZCV = nzcv and x15 = return label.
    ".p2align 4",
    ".globl ta_call",
    "ta_call:",
    "    stp x29, x30, [sp, #-16]!",
    "    mov x29, sp",
    "    mov x16, x0",
    "    mov x0, x1",
    "    msr nzcv, x2",
    "    adr x15, 1f",
    "    blr x16",
    "1:  ldp x29, x30, [sp], #16",
    "    ret",
    // The replacement: count, then tail-jump to the chain (x16/x17 only).
    ".p2align 4",
    ".globl ta_repl",
    "ta_repl:",
    "    adrp x16, ta_calls",
    "    add x16, x16, :lo12:ta_calls",
    "    ldr x17, [x16]",
    "    add x17, x17, #1",
    "    str x17, [x16]",
    "    ldr x16, [x16, #8]",
    "    br x16",
    // --- one function per class; literals 32 bytes in so that a far patch
    // (20 bytes) may take the first five instructions.
    ".p2align 6",
    ".globl ta_ldr_x",
    ".type ta_ldr_x,@function",
    "ta_ldr_x: ldr x1, 1f",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .quad 1000",
    ".size ta_ldr_x, .-ta_ldr_x",
    ".p2align 6",
    ".globl ta_ldr_w",
    ".type ta_ldr_w,@function",
    "ta_ldr_w: ldr w1, 1f",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .word 0xfffffff0",
    ".size ta_ldr_w, .-ta_ldr_w",
    ".p2align 6",
    ".globl ta_ldrsw",
    ".type ta_ldrsw,@function",
    "ta_ldrsw: ldrsw x1, 1f",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .word -16",
    ".size ta_ldrsw, .-ta_ldrsw",
    ".p2align 6",
    ".globl ta_ldr_s",
    ".type ta_ldr_s,@function",
    "ta_ldr_s: ldr s0, 1f",
    "    fmov w1, s0",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .word 0x3f800000",
    ".size ta_ldr_s, .-ta_ldr_s",
    ".p2align 6",
    ".globl ta_ldr_d",
    ".type ta_ldr_d,@function",
    "ta_ldr_d: ldr d0, 1f",
    "    fmov x1, d0",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .quad 0x4000000000000000",
    ".size ta_ldr_d, .-ta_ldr_d",
    ".p2align 6",
    ".globl ta_ldr_q",
    ".type ta_ldr_q,@function",
    "ta_ldr_q: ldr q0, 1f",
    "    mov x1, v0.d[1]",
    "    fmov x2, d0",
    "    add x0, x0, x1",
    "    add x0, x0, x2",
    "    ret",
    "    .p2align 5",
    "1:  .quad 3, 0x500",
    ".size ta_ldr_q, .-ta_ldr_q",
    ".p2align 6",
    ".globl ta_prfm",
    ".type ta_prfm,@function",
    "ta_prfm: prfm pldl1keep, 1f",
    "    add x0, x0, #3",
    "    ret",
    "    .p2align 5",
    "1:  .quad 0",
    ".size ta_prfm, .-ta_prfm",
    ".p2align 6",
    ".globl ta_adr",
    ".type ta_adr,@function",
    "ta_adr: adr x1, 1f",
    "    ldr x1, [x1]",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .quad 77",
    ".size ta_adr, .-ta_adr",
    ".p2align 6",
    ".globl ta_adrp",
    ".type ta_adrp,@function",
    "ta_adrp: adrp x1, ta_data",
    "    add x1, x1, :lo12:ta_data",
    "    ldr x1, [x1, #8]",
    "    add x0, x0, x1",
    "    ret",
    ".size ta_adrp, .-ta_adrp",
    ".p2align 6",
    ".globl ta_b",
    ".type ta_b,@function",
    "ta_b: b 1f",
    "    brk #1",
    "1:  add x0, x0, #9",
    "    ret",
    ".size ta_b, .-ta_b",
    ".p2align 6",
    ".globl ta_bl",
    ".type ta_bl,@function",
    "ta_bl: bl ta_bl_helper",
    "    add x0, x0, #100",
    "    nop",
    "    nop",
    "    nop",
    "    br x15",
    ".size ta_bl, .-ta_bl",
    "ta_bl_helper: add x0, x0, #5",
    "    ret",
    ".p2align 6",
    ".globl ta_bcond",
    ".type ta_bcond,@function",
    "ta_bcond: b.eq 1f",
    "    add x0, x0, #1",
    "    ret",
    "1:  add x0, x0, #2",
    "    ret",
    ".size ta_bcond, .-ta_bcond",
    ".p2align 6",
    ".globl ta_cbz",
    ".type ta_cbz,@function",
    "ta_cbz: cbz x0, 1f",
    "    add x0, x0, #10",
    "    ret",
    "1:  mov x0, #99",
    "    ret",
    ".size ta_cbz, .-ta_cbz",
    ".p2align 6",
    ".globl ta_cbnz",
    ".type ta_cbnz,@function",
    "ta_cbnz: cbnz w0, 1f",
    "    mov x0, #7",
    "    ret",
    "1:  add x0, x0, #1",
    "    ret",
    ".size ta_cbnz, .-ta_cbnz",
    ".p2align 6",
    ".globl ta_tbz",
    ".type ta_tbz,@function",
    "ta_tbz: tbz x0, #40, 1f",
    "    mov x0, #1",
    "    ret",
    "1:  mov x0, #2",
    "    ret",
    ".size ta_tbz, .-ta_tbz",
    ".p2align 6",
    ".globl ta_tbnz",
    ".type ta_tbnz,@function",
    "ta_tbnz: tbnz w0, #3, 1f",
    "    mov x0, #1",
    "    ret",
    "1:  mov x0, #2",
    "    ret",
    ".size ta_tbnz, .-ta_tbnz",
    // Literal pool right after the taken bytes (the first instruction).
    ".p2align 6",
    ".globl ta_pool",
    ".type ta_pool,@function",
    "ta_pool: b 2f",
    "1:  .quad 4000",
    "2:  ldr x1, 1b",
    "    add x0, x0, x1",
    "    ret",
    ".size ta_pool, .-ta_pool",
    // Leaf: no frame, no PC-relative instruction.
    ".p2align 6",
    ".globl ta_leaf",
    ".type ta_leaf,@function",
    "ta_leaf: add x0, x0, #1",
    "    ret",
    ".size ta_leaf, .-ta_leaf",
    // A BTI landing pad (`bti c` = `hint #34`) stays in place; the patch follows it.
    ".p2align 6",
    ".globl ta_bti",
    ".type ta_bti,@function",
    "ta_bti: hint #34",
    "    adr x1, 1f",
    "    ldr x1, [x1]",
    "    add x0, x0, x1",
    "    ret",
    "    .p2align 5",
    "1:  .quad 55",
    ".size ta_bti, .-ta_bti",
    // Branches between the instructions a far patch takes.
    ".p2align 6",
    ".globl ta_inner",
    ".type ta_inner,@function",
    "ta_inner: cbz x0, 1f",
    "    add x0, x0, #1",
    "1:  add x0, x0, #2",
    "    tbnz x0, #0, 2f",
    "    add x0, x0, #4",
    "2:  ret",
    ".size ta_inner, .-ta_inner",
);

extern "C" {
    fn ta_call(f: usize, x: u64, nzcv: u64) -> u64;
    fn ta_repl();
    static mut ta_calls: u64;
    static mut ta_chain: u64;
    fn ta_ldr_x();
    fn ta_ldr_w();
    fn ta_ldrsw();
    fn ta_ldr_s();
    fn ta_ldr_d();
    fn ta_ldr_q();
    fn ta_prfm();
    fn ta_adr();
    fn ta_adrp();
    fn ta_b();
    fn ta_bl();
    fn ta_bcond();
    fn ta_cbz();
    fn ta_cbnz();
    fn ta_tbz();
    fn ta_tbnz();
    fn ta_pool();
    fn ta_leaf();
    fn ta_inner();
    fn ta_bti();
}

const Z: u64 = 1 << 30;

/// (name, function, [(x, nzcv, expected)]).
type Class = (
    &'static str,
    unsafe extern "C" fn(),
    &'static [(u64, u64, u64)],
);

const CLASSES: &[Class] = &[
    ("ta_ldr_x", ta_ldr_x, &[(0, 0, 1000), (5, 0, 1005)]),
    (
        "ta_ldr_w",
        ta_ldr_w,
        &[(0, 0, 0xffff_fff0), (16, 0, 0x1_0000_0000)],
    ),
    ("ta_ldrsw", ta_ldrsw, &[(16, 0, 0), (100, 0, 84)]),
    (
        "ta_ldr_s",
        ta_ldr_s,
        &[(0, 0, 0x3f80_0000), (1, 0, 0x3f80_0001)],
    ),
    (
        "ta_ldr_d",
        ta_ldr_d,
        &[(0, 0, 1 << 62), (7, 0, (1 << 62) + 7)],
    ),
    ("ta_ldr_q", ta_ldr_q, &[(0, 0, 0x503), (1, 0, 0x504)]),
    ("ta_prfm", ta_prfm, &[(0, 0, 3), (4, 0, 7)]),
    ("ta_adr", ta_adr, &[(0, 0, 77), (3, 0, 80)]),
    ("ta_adrp", ta_adrp, &[(0, 0, 2000), (9, 0, 2009)]),
    ("ta_b", ta_b, &[(0, 0, 9), (1, 0, 10)]),
    ("ta_bl", ta_bl, &[(0, 0, 105), (10, 0, 115)]),
    ("ta_bcond", ta_bcond, &[(10, Z, 12), (10, 0, 11)]),
    ("ta_cbz", ta_cbz, &[(0, 0, 99), (5, 0, 15)]),
    ("ta_cbnz", ta_cbnz, &[(0, 0, 7), (1 << 32, 0, 7), (3, 0, 4)]),
    (
        "ta_tbz",
        ta_tbz,
        &[(1 << 40, 0, 1), (0, 0, 2), ((1 << 40) - 1, 0, 2)],
    ),
    ("ta_tbnz", ta_tbnz, &[(8, 0, 2), (7, 0, 1)]),
    ("ta_pool", ta_pool, &[(0, 0, 4000), (2, 0, 4002)]),
    ("ta_leaf", ta_leaf, &[(0, 0, 1), (41, 0, 42)]),
    ("ta_inner", ta_inner, &[(0, 0, 6), (1, 0, 8), (2, 0, 5)]),
    ("ta_bti", ta_bti, &[(0, 0, 55), (1, 0, 56)]),
];

fn call(f: usize, x: u64, nzcv: u64) -> u64 {
    // SAFETY: f is one of the functions above (or a copy of one) with the
    // calling convention ta_call expects.
    unsafe { ta_call(f, x, nzcv) }
}

fn calls() -> u64 {
    // SAFETY: plain read of an asm-defined counter; tests that hook run
    // their functions from one thread at a time (HOOK_LOCK).
    unsafe { std::ptr::addr_of!(ta_calls).read_volatile() }
}

fn set_chain(chain: u64) {
    // SAFETY: as above.
    unsafe {
        std::ptr::addr_of_mut!(ta_chain).write_volatile(chain);
        std::ptr::addr_of_mut!(ta_calls).write_volatile(0);
    }
}

/// The replacement and its counter are shared, and a hooked function's
/// bytes are patched: every test that hooks, reads or relocates the
/// functions holds this lock.
static HOOK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check_all(name: &str, f: usize, cases: &[(u64, u64, u64)], how: &str) {
    for &(x, nzcv, want) in cases {
        assert_eq!(
            call(f, x, nzcv),
            want,
            "{name}({x:#x}, nzcv {nzcv:#x}) {how}"
        );
    }
}

fn bytes_at(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: callers pass the range of a function of this executable.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

#[test]
fn hook_every_class() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for &(name, f, cases) in CLASSES {
        let addr = f as usize;
        check_all(name, addr, cases, "before hooking");
        let sym = find_function(name, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sym.addr, addr as u64, "{name}: symbol address");
        let size = sym
            .size
            .unwrap_or_else(|| panic!("{name}: no size from .symtab")) as usize;
        let before = bytes_at(sym.addr, size);
        let probed = probe(&sym).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            bytes_at(sym.addr, size),
            before,
            "{name}: probe changed nothing"
        );

        let hook = install(&sym, ta_repl as *const ()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(hook.plan(), probed.plan, "{name}: probe and install agree");
        let keep = if name == "ta_bti" { 4 } else { 0 };
        assert_eq!(
            (hook.plan().keep, hook.plan().taken),
            (keep, 4),
            "{name}: landing pad kept, one instruction taken"
        );
        // The patch is one `b` to the replacement (same executable: in reach),
        // after the kept landing pad.
        let patch_at = sym.addr + keep as u64;
        let want = Aarch64::near_patch(patch_at, ta_repl as *const () as u64).unwrap();
        assert_eq!(bytes_at(patch_at, 4), want, "{name}: patched with b");
        assert_eq!(
            bytes_at(sym.addr, keep),
            before[..keep],
            "{name}: landing pad in place"
        );
        // The trampoline is what relocate() makes at its address, and verifies.
        let chain = hook.chain() as u64;
        let out = Aarch64::relocate(&before, sym.addr, &hook.plan(), chain).unwrap();
        assert_eq!(bytes_at(chain, out.len()), out, "{name}: trampoline bytes");
        Aarch64::verify(&before, sym.addr, &hook.plan(), chain, &out).unwrap();

        set_chain(chain);
        check_all(name, addr, cases, "through the hook");
        assert_eq!(
            calls(),
            cases.len() as u64,
            "{name}: calls counted by the replacement"
        );
        check_all(name, chain as usize, cases, "through chain");
        assert_eq!(calls(), cases.len() as u64, "{name}: chain does not count");

        hook.uninstall().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            bytes_at(sym.addr, size),
            before,
            "{name}: original bytes restored"
        );
        check_all(name, addr, cases, "after uninstall");
        assert_eq!(
            calls(),
            cases.len() as u64,
            "{name}: nothing counted after uninstall"
        );
    }
}

/// An anonymous read+write page at or near `hint` (never over an existing mapping).
fn page_near(hint: u64, len: usize) -> u64 {
    for i in 0..64u64 {
        let want = (hint & !0xffff) + i * 0x10_0000;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                want as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED && p as u64 == want {
            return want;
        }
        if p != libc::MAP_FAILED {
            // SAFETY: unmapping what we just mapped.
            unsafe { libc::munmap(p, len) };
        }
    }
    panic!("no free page near {hint:#x}");
}

/// Write `code` at `at` in our own RW page, make it RX and flush.
fn write_page(page: u64, len: usize, at: u64, code: &[u8]) {
    // SAFETY: [page, page+len) is our anonymous mapping; make it writable,
    // copy, then read+execute.
    unsafe {
        assert_eq!(
            libc::mprotect(page as *mut _, len, libc::PROT_READ | libc::PROT_WRITE),
            0
        );
        std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len());
        assert_eq!(
            libc::mprotect(page as *mut _, len, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
    }
    Aarch64::flush_icache(at, code.len());
}

#[test]
fn far_trampolines_run_every_class() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let text = ta_ldr_x as *const () as u64;
    let len = 0x4000;
    // 64 MiB below (tbz/b.cond/cbz/ldr/adr beyond their reach, b within it)
    // and 8 GiB above (everything, adrp included, beyond reach).
    for (label, hint) in [
        ("64 MiB", text.wrapping_sub(64 << 20)),
        ("8 GiB", text + (8 << 30)),
    ] {
        let page = page_near(hint, len);
        // Beyond every short form but b (64 MiB), or beyond all of them (8 GiB).
        let (min, max) = if label == "64 MiB" {
            (1 << 20, 128 << 20)
        } else {
            (4 << 30, u64::MAX)
        };
        assert!(
            page.abs_diff(text) > min && page.abs_diff(text) < max,
            "{label}: page at {page:#x}"
        );
        for (i, &(name, f, cases)) in CLASSES.iter().enumerate() {
            let addr = f as usize as u64;
            let size = find_function(name, None).unwrap().size.unwrap();
            let code = bytes_at(addr, size as usize);
            let plan = Aarch64::plan(&code, addr, Some(size), Aarch64::NEAR_PATCH_LEN).unwrap();
            let tramp = page + 128 * i as u64;
            let out = Aarch64::relocate(&code, addr, &plan, tramp).unwrap();
            Aarch64::verify(&code, addr, &plan, tramp, &out).unwrap();
            write_page(page, len, tramp, &out);
            check_all(
                name,
                tramp as usize,
                cases,
                &format!("through a trampoline {label} away"),
            );
        }
        // SAFETY: our page, no longer used.
        unsafe { libc::munmap(page as *mut _, len) };
    }
}

#[test]
fn far_patch_hooks() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let text = ta_ldr_x as *const () as u64;
    let len = 0x4000;
    let page = page_near(text + (8 << 30), len);
    let mut hooked = 0;
    for (i, &(name, f, cases)) in CLASSES.iter().enumerate() {
        let addr = f as usize as u64;
        let size = find_function(name, None).unwrap().size.unwrap();
        let code = bytes_at(addr, size as usize);
        let plan = match Aarch64::plan(&code, addr, Some(size), Aarch64::FAR_PATCH_LEN) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("far patch refused: {name}: {e}");
                // Only the functions built to be refused may be refused.
                match name {
                    "ta_leaf" => {
                        assert!(matches!(e, Reason::TooShort { .. }), "{name}: {e}")
                    }
                    // its literal lies inside the 20 bytes
                    "ta_pool" => assert!(matches!(e, Reason::Unrelocatable { .. }), "{name}: {e}"),
                    _ => panic!("{name}: {e}"),
                }
                continue;
            }
        };
        let tramp = page + 128 * i as u64;
        let out = Aarch64::relocate(&code, addr, &plan, tramp).unwrap();
        write_page(page, len, tramp, &out);
        let patch_at = addr + plan.keep as u64;
        let mut patch = Aarch64::far_patch(patch_at, ta_repl as *const () as u64);
        patch.extend(Aarch64::filler(plan.taken - patch.len()));
        assert_eq!(patch.len(), plan.taken);
        let text_page = addr & !0xfff;
        let span = ((patch_at + patch.len() as u64 + 0xfff) & !0xfff) - text_page;
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        let rx = libc::PROT_READ | libc::PROT_EXEC;
        let write_text = |bytes: &[u8]| {
            // SAFETY: the function's own pages; no other thread runs these
            // test functions (HOOK_LOCK); protection restored to r-x after.
            unsafe {
                assert_eq!(libc::mprotect(text_page as *mut _, span as usize, rwx), 0);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), patch_at as *mut u8, bytes.len());
                assert_eq!(libc::mprotect(text_page as *mut _, span as usize, rx), 0);
            }
            Aarch64::flush_icache(patch_at, bytes.len());
        };
        write_text(&patch);
        set_chain(tramp);
        check_all(name, addr as usize, cases, "through a far patch");
        assert_eq!(
            calls(),
            cases.len() as u64,
            "{name}: calls counted through the far patch"
        );
        write_text(&code[plan.keep..plan.keep + plan.taken]);
        check_all(name, addr as usize, cases, "after removing the far patch");
        hooked += 1;
    }
    // All but ta_leaf (8 bytes long) and ta_pool; ta_b (16 bytes, 8-aligned) fits the 16-byte form.
    assert_eq!(hooked, CLASSES.len() - 2);
    // SAFETY: our page, no longer used.
    unsafe { libc::munmap(page as *mut _, len) };
}

#[test]
fn hook_with_replacement_out_of_reach_uses_entry_stub() {
    let _g = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let repl = ta_repl as *const () as u64;
    // A replacement 8 GiB away: a jump to ta_repl placed there.
    let len = 0x4000;
    let page = page_near(repl + (8 << 30), len);
    write_page(page, len, page, &Aarch64::stub(page, repl));
    for &(name, f, cases) in CLASSES
        .iter()
        .filter(|c| ["ta_cbz", "ta_bl", "ta_ldr_q"].contains(&c.0))
    {
        let sym = find_function(name, None).unwrap();
        let hook = install(&sym, page as *const ()).unwrap_or_else(|e| panic!("{e}"));
        // The patch is a `b` to an entry stub within +-128 MiB that jumps to `page`.
        let word = u32::from_le_bytes(bytes_at(sym.addr, 4).try_into().unwrap());
        let trampoline::aarch64::decode::Insn::B { target: stub } =
            trampoline::aarch64::decode::decode(word, sym.addr)
        else {
            panic!("{name}: patch {word:08x} is not a b");
        };
        assert_ne!(stub, page, "{name}: the replacement is out of reach");
        assert_eq!(
            bytes_at(stub, Aarch64::STUB_LEN),
            Aarch64::stub(stub, page),
            "{name}: entry stub"
        );
        set_chain(hook.chain() as u64);
        check_all(name, f as usize, cases, "through an entry stub");
        assert_eq!(calls(), cases.len() as u64, "{name}: calls counted");
        hook.uninstall().unwrap_or_else(|e| panic!("{e}"));
        check_all(name, f as usize, cases, "after uninstall");
    }
    // SAFETY: our page, no longer used.
    unsafe { libc::munmap(page as *mut _, len) };
}
