//! The generic entry stubs of the function-call profiler: what a hooked
//! function's patched entry jumps to. FUNC's signature is unknown, so a
//! stub keeps every register that may carry an argument (or that the
//! callee may read at entry) exactly as the caller left them, calls
//! [`super::count`] with its own index, restores them, and *jumps* (never
//! calls) to the original through its chain pointer: the stack (stack
//! arguments, the return address) is as the caller left it when FUNC's
//! original code runs, and FUNC returns straight to its caller.
//!
//! x86-64 (SysV): rdi rsi rdx rcx r8 r9 (integer arguments), rax (the
//! vector-register count of a varargs call), r10 (static chain), r11 and
//! rbp are pushed; the vector state is saved with `xsavec` (or `xsave`
//! where XSAVEC is missing; components SSE, AVX and ZMM_Hi256 that XCR0
//! enables: xmm0-15 with MXCSR, the upper halves of ymm0-15 and of
//! zmm0-15), or `fxsave` on a CPU without OSXSAVE (no AVX state exists
//! then). The counting path is ordinary
//! compiled code that may call libc (its memcpy may use AVX and end with
//! `vzeroupper`, which zeroes every ymm upper half), so nothing short of
//! saving the state would keep a `__m256` argument. No register is
//! changed at FUNC's entry (the final `jmp` reads its target from
//! memory); the flags are not kept (no ABI gives them meaning at a call;
//! the direction flag stays clear).
//!
//! AArch64 (AAPCS64): x0-x7 (arguments), x8 (indirect result), x17,
//! x29/x30 (frame pointer, return address) and q0-q7 (vector arguments)
//! are saved on a 240-byte frame; x16 carries the chain address into the
//! original (IP0, free at a call: veneers and PLT stubs use it the same
//! way). SVE state beyond q0-q7 (z0-z7's upper bits, p0-p3) is not saved:
//! a system call made on the counting path discards it on Linux.
//!
//! [`super::count_entry`] gets the stub's index and the program's stack
//! pointer, frame pointer and (AArch64) link register at the call, for
//! the stack memo shared with the memory hooks (`mem::memo`).
//!
//! Both stubs have CFI describing their frame, so a walk that starts
//! inside [`super::count`] goes up through the stub to FUNC's caller (the
//! profiler's own frames, stub included, are skipped by the unwinder):
//! the call is charged to the stack that called FUNC, as IgProf does.
//!
//! Owns: the [`ENTRIES`] stubs, the table of their addresses and the
//! chain pointer each jumps through ([`CHAINS`]).
//!
//! Must never: change the stack pointer seen by the original, any
//! argument register, or call the original (jump only).

use core::sync::atomic::{AtomicUsize, Ordering};

/// How many functions one run can count (one stub each).
pub const ENTRIES: usize = 16;

/// The chain pointer of each stub (0 while unused).
pub static CHAINS: [AtomicUsize; ENTRIES] = [const { AtomicUsize::new(0) }; ENTRIES];

extern "C" {
    /// Addresses of the stubs, index order (defined in the assembly below).
    static igprof_fp_entries: [usize; ENTRIES];
}

/// The address of stub `i` (the replacement to install on FUNC).
pub fn entry(i: usize) -> *const () {
    // SAFETY: a read-only table of ENTRIES addresses written by the
    // assembler and relocated by the loader before any code ran.
    unsafe { igprof_fp_entries[i] as *const () }
}

/// Publishes the chain pointer of stub `i` (before its patch goes live).
pub fn set_chain(i: usize, chain: *const ()) {
    CHAINS[i].store(chain as usize, Ordering::Release);
}

/// The assembly, after an architecture's `igprof_fp_entry i` macro, that
/// makes the [`ENTRIES`] stubs and the table of their addresses.
macro_rules! instantiate {
    () => {
        r#"
        .text
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        igprof_fp_entry \i
        .endr

        .section .data.rel.ro,"aw"
        .p2align 3
        .hidden igprof_fp_entries
        .globl igprof_fp_entries
        igprof_fp_entries:
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        .quad igprof_fp_entry_\i
        .endr
        .text
        "#
    };
}

#[cfg(target_arch = "x86_64")]
mod arch {
    use core::sync::atomic::{AtomicU32, Ordering};

    /// The `xsave` requested-feature bitmap (components 1 SSE, 2 AVX, 6
    /// ZMM_Hi256, as XCR0 enables them); 0: use `fxsave`.
    pub static XSAVE_MASK: AtomicU32 = AtomicU32::new(0);
    /// Non-zero: save with `xsavec` (compacted form; a component in its
    /// initial state, such as the upper halves after `vzeroupper`, is
    /// not written, and `xrstor` initialises it again), else `xsave`.
    /// (`xsaveopt` is not used: its modified optimisation assumes the area
    /// was not written since the last `xrstor` from the same address,
    /// which a stack area does not guarantee.)
    pub static XSAVE_COMPACT: AtomicU32 = AtomicU32::new(0);
    /// Non-zero: `xgetbv` with ecx = 1 reads which state components are
    /// in use (XINUSE); when neither AVX nor ZMM_Hi256 is (the upper
    /// halves are zero, as after `vzeroupper`: code that uses no AVX, or
    /// that returned from AVX code), only xmm0-7 are saved with `movdqa`
    /// and the restore starts with `vzeroupper`, which puts the upper
    /// halves back to zero whatever the counting path left there. About
    /// 95 ns per call less than `xsavec` + `xrstor` on this project's VM.
    pub static XINUSE: AtomicU32 = AtomicU32::new(0);

    /// Bytes of the save area: the standard-format offsets of the
    /// components saved end at 1664 (ZMM_Hi256 is at 1152, 512 bytes);
    /// the compacted form is smaller.
    const AREA: u32 = 1664;

    /// Chooses how the stubs save the vector state (start-up, before any
    /// stub is installed). Returns the components saved, for messages.
    pub fn init() -> &'static str {
        use core::arch::x86_64::__cpuid_count;
        let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
        if !osxsave {
            XSAVE_MASK.store(0, Ordering::Relaxed);
            return "xmm0-15 (fxsave: no AVX)";
        }
        let xcr0: u64;
        // SAFETY: OSXSAVE is set, so xgetbv is enabled; it reads XCR0.
        unsafe {
            let (lo, hi): (u32, u32);
            core::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack));
            xcr0 = (hi as u64) << 32 | lo as u64;
        }
        let mut mask = (xcr0 as u32) & (0b10 | 0b100 | 0b100_0000);
        // Leaf 0xD (it exists when OSXSAVE is set), sub-leaf 1: eax bit 1
        // is XSAVEC; sub-leaf i: eax = size, ebx = offset in the standard
        // format, ecx bit 1 = 64-byte aligned in the compacted form.
        let compact = __cpuid_count(0xd, 1).eax & 0b10 != 0;
        let mut end_compact = 576;
        for bit in [2u32, 6] {
            if mask & (1 << bit) != 0 {
                let c = __cpuid_count(0xd, bit);
                let start = if c.ecx & 0b10 != 0 {
                    (end_compact + 63) & !63
                } else {
                    end_compact
                };
                let end = if compact {
                    start + c.eax
                } else {
                    c.ebx + c.eax
                };
                if end > AREA {
                    crate::igprof_debug!(
                        "-fp: xsave component {bit} at {}+{} does not fit the stub's area; not saved",
                        c.ebx,
                        c.eax
                    );
                    mask &= !(1 << bit);
                } else {
                    end_compact = start + c.eax;
                }
            }
        }
        if mask & 0b10 == 0 {
            XSAVE_MASK.store(0, Ordering::Relaxed);
            return "xmm0-15 (fxsave)";
        }
        XSAVE_MASK.store(mask, Ordering::Relaxed);
        XSAVE_COMPACT.store(compact as u32, Ordering::Relaxed);
        // Sub-leaf 1, eax bit 2: xgetbv with ecx = 1 (XINUSE); only with
        // AVX enabled (the fast path ends with vzeroupper).
        let xinuse = __cpuid_count(0xd, 1).eax & 0b100 != 0 && mask & 0b100 != 0;
        XINUSE.store(xinuse as u32, Ordering::Relaxed);
        match (mask & 0b100 != 0, mask & 0b100_0000 != 0, compact) {
            (true, true, true) => "zmm0-15 (xsavec SSE+AVX+ZMM_Hi256)",
            (true, true, false) => "zmm0-15 (xsave SSE+AVX+ZMM_Hi256)",
            (true, false, true) => "ymm0-15 (xsavec SSE+AVX)",
            (true, false, false) => "ymm0-15 (xsave SSE+AVX)",
            _ => "xmm0-15 (xsave SSE)",
        }
    }

    // The stack at entry: rsp -> return address into FUNC's caller.
    // rbp-8..rbp-72: rdi rsi rdx rcx r8 r9 rax r10 r11; rbp-80: how the
    // vector state was saved (0 xsave/xsavec, 1 xmm0-7 only, 2 fxsave);
    // then the 64-byte aligned save area. The xsave header (bytes 512..575) is zeroed
    // first: xsave writes only XSTATE_BV, and xrstor requires the rest of
    // the header to be zero (xrstor reads which form it restores from the
    // header that xsave or xsavec wrote).
    core::arch::global_asm!(
        r#"
        .macro igprof_fp_entry i
        .p2align 4
        .hidden igprof_fp_entry_\i
        .type igprof_fp_entry_\i,@function
        igprof_fp_entry_\i:
        .cfi_startproc
        endbr64
        push rbp
        .cfi_def_cfa_offset 16
        .cfi_offset rbp, -16
        mov rbp, rsp
        .cfi_def_cfa_register rbp
        push rdi
        push rsi
        push rdx
        push rcx
        push r8
        push r9
        push rax
        push r10
        push r11
        push r11
        sub rsp, 1728
        and rsp, -64
        mov eax, dword ptr [rip + {mask}]
        test eax, eax
        jz 1f
        cmp dword ptr [rip + {xinuse}], 0
        je 6f
        mov ecx, 1
        xgetbv
        test eax, 0x44
        jnz 6f
        mov qword ptr [rbp - 80], 1
        movdqa xmmword ptr [rsp], xmm0
        movdqa xmmword ptr [rsp + 16], xmm1
        movdqa xmmword ptr [rsp + 32], xmm2
        movdqa xmmword ptr [rsp + 48], xmm3
        movdqa xmmword ptr [rsp + 64], xmm4
        movdqa xmmword ptr [rsp + 80], xmm5
        movdqa xmmword ptr [rsp + 96], xmm6
        movdqa xmmword ptr [rsp + 112], xmm7
        jmp 2f
        6:
        mov qword ptr [rbp - 80], 0
        mov eax, dword ptr [rip + {mask}]
        xor edx, edx
        mov qword ptr [rsp + 512], 0
        mov qword ptr [rsp + 520], 0
        mov qword ptr [rsp + 528], 0
        mov qword ptr [rsp + 536], 0
        mov qword ptr [rsp + 544], 0
        mov qword ptr [rsp + 552], 0
        mov qword ptr [rsp + 560], 0
        mov qword ptr [rsp + 568], 0
        cmp dword ptr [rip + {compact}], 0
        je 5f
        xsavec [rsp]
        jmp 2f
        5:
        xsave [rsp]
        jmp 2f
        1:
        mov qword ptr [rbp - 80], 2
        fxsave [rsp]
        2:
        mov edi, \i
        lea rsi, [rbp + 8]
        mov rdx, qword ptr [rbp]
        xor ecx, ecx
        call {count}
        mov rax, qword ptr [rbp - 80]
        cmp eax, 1
        je 7f
        cmp eax, 2
        je 3f
        mov eax, dword ptr [rip + {mask}]
        xor edx, edx
        xrstor [rsp]
        jmp 4f
        7:
        vzeroupper
        movdqa xmm0, xmmword ptr [rsp]
        movdqa xmm1, xmmword ptr [rsp + 16]
        movdqa xmm2, xmmword ptr [rsp + 32]
        movdqa xmm3, xmmword ptr [rsp + 48]
        movdqa xmm4, xmmword ptr [rsp + 64]
        movdqa xmm5, xmmword ptr [rsp + 80]
        movdqa xmm6, xmmword ptr [rsp + 96]
        movdqa xmm7, xmmword ptr [rsp + 112]
        jmp 4f
        3:
        fxrstor [rsp]
        4:
        lea rsp, [rbp - 72]
        pop r11
        pop r10
        pop rax
        pop r9
        pop r8
        pop rcx
        pop rdx
        pop rsi
        pop rdi
        pop rbp
        .cfi_def_cfa rsp, 8
        .cfi_restore rbp
        jmp qword ptr [rip + {chains} + 8 * \i]
        .cfi_endproc
        .size igprof_fp_entry_\i, . - igprof_fp_entry_\i
        .endm

        "#,
        instantiate!(),
        mask = sym XSAVE_MASK,
        compact = sym XSAVE_COMPACT,
        xinuse = sym XINUSE,
        count = sym super::super::count_entry,
        chains = sym super::CHAINS,
    );
}

#[cfg(target_arch = "aarch64")]
mod arch {
    /// Nothing to choose: q0-q7 are saved with stp/ldp.
    pub fn init() -> &'static str {
        "q0-q7"
    }

    // Frame (240 bytes, sp 16-aligned): x29 x30 | x0 x1 | x2 x3 | x4 x5 |
    // x6 x7 | x8 x16 | x17 (pad) | q0 q1 | q2 q3 | q4 q5 | q6 q7.
    core::arch::global_asm!(
        r#"
        .macro igprof_fp_entry i
        .p2align 2
        .hidden igprof_fp_entry_\i
        .type igprof_fp_entry_\i,%function
        igprof_fp_entry_\i:
        .cfi_startproc
        hint #34
        stp x29, x30, [sp, #-240]!
        .cfi_def_cfa_offset 240
        .cfi_offset x29, -240
        .cfi_offset x30, -232
        mov x29, sp
        stp x0, x1, [sp, #16]
        stp x2, x3, [sp, #32]
        stp x4, x5, [sp, #48]
        stp x6, x7, [sp, #64]
        stp x8, x16, [sp, #80]
        str x17, [sp, #96]
        stp q0, q1, [sp, #112]
        stp q2, q3, [sp, #144]
        stp q4, q5, [sp, #176]
        stp q6, q7, [sp, #208]
        mov x0, #\i
        add x1, x29, #240
        ldp x2, x3, [x29]
        bl {count}
        ldp q6, q7, [sp, #208]
        ldp q4, q5, [sp, #176]
        ldp q2, q3, [sp, #144]
        ldp q0, q1, [sp, #112]
        ldr x17, [sp, #96]
        ldp x8, x16, [sp, #80]
        ldp x6, x7, [sp, #64]
        ldp x4, x5, [sp, #48]
        ldp x2, x3, [sp, #32]
        ldp x0, x1, [sp, #16]
        ldp x29, x30, [sp], #240
        .cfi_def_cfa_offset 0
        .cfi_restore x29
        .cfi_restore x30
        adrp x16, {chains}
        add x16, x16, :lo12:{chains}
        ldr x16, [x16, #(8 * \i)]
        br x16
        .cfi_endproc
        .size igprof_fp_entry_\i, . - igprof_fp_entry_\i
        .endm

        "#,
        instantiate!(),
        count = sym super::super::count_entry,
        chains = sym super::CHAINS,
    );
}

pub use arch::init;
#[cfg(target_arch = "x86_64")]
pub use arch::XSAVE_MASK;
