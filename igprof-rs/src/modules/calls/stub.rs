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
//! where XSAVEC is missing; components x87, SSE, AVX and AVX-512's
//! opmask, ZMM_Hi256 and Hi16_ZMM as XCR0 enables them: x87, xmm0-15
//! with MXCSR, the upper halves of ymm0-15, k0-7, zmm0-31), or `fxsave`
//! on a CPU without OSXSAVE (no AVX state exists then). When XINUSE says
//! neither AVX nor AVX-512 state is in use, xmm0-15 and MXCSR alone are
//! saved (see `XINUSE` below). Every call-clobbered vector register is
//! kept, not only the argument registers: GCC's interprocedural register
//! allocation lets a caller keep a value in xmm8-15 (or zmm16-31, k1-7)
//! across a call of a function that does not write them, and the
//! counting path (its libc's AVX2 memcpy, say) may. The counting path is
//! ordinary compiled code that may call libc (its memcpy may use AVX and
//! end with `vzeroupper`, which zeroes every ymm upper half), so nothing
//! short of saving the state would keep a `__m256` argument. No register
//! is changed at FUNC's entry (the final `jmp` reads its target from
//! memory); the flags are not kept (no ABI gives them meaning at a call;
//! the direction flag stays clear). `IGPROF_XSAVE_FORM` forces a form
//! for tests, `IGPROF_FP_CLOBBER=1` makes the counting path overwrite
//! every vector register (`init`, `clobber`).
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

    /// State components (XCR0 bits): x87, SSE (xmm0-15, MXCSR), AVX (upper
    /// halves of ymm0-15), and AVX-512's opmask (k0-7), ZMM_Hi256 (upper
    /// halves of zmm0-15) and Hi16_ZMM (zmm16-31).
    const X87: u32 = 1;
    const SSE: u32 = 1 << 1;
    const AVX: u32 = 1 << 2;
    const OPMASK: u32 = 1 << 5;
    const ZMM_HI256: u32 = 1 << 6;
    const HI16_ZMM: u32 = 1 << 7;
    const AVX512: u32 = OPMASK | ZMM_HI256 | HI16_ZMM;

    /// The `xsave` requested-feature bitmap (x87, SSE and whichever of
    /// AVX and the AVX-512 components XCR0 enables); 0: use `fxsave`.
    pub static XSAVE_MASK: AtomicU32 = AtomicU32::new(0);
    /// Non-zero: save with `xsavec` (compacted form; a component in its
    /// initial state, such as the upper halves after `vzeroupper`, is
    /// not written, and `xrstor` initialises it again), else `xsave`.
    /// (`xsaveopt` is not used: its modified optimisation assumes the area
    /// was not written since the last `xrstor` from the same address,
    /// which a stack area does not guarantee.)
    pub static XSAVE_COMPACT: AtomicU32 = AtomicU32::new(0);
    /// Non-zero: the XINUSE shortcut is on, and these are the components
    /// that must be in their initial state for it (AVX, and ZMM_Hi256
    /// when saved: the upper halves of ymm0-15 and zmm0-15). `xgetbv`
    /// with ecx = 1 reads which components are in use; when none of these
    /// is (the upper halves are zero, as after `vzeroupper`: code that
    /// uses no AVX, or that returned from AVX code), xmm0-15 are saved
    /// with `movdqa` and MXCSR with `stmxcsr` (and with AVX-512, zmm16-31
    /// and k0-7: see [`SHORTCUT_AVX512`]), and the restore starts with
    /// `vzeroupper`, which puts the upper halves back to zero whatever
    /// the counting path left there. All sixteen: a caller compiled with
    /// GCC's interprocedural register allocation (-O2) keeps values in
    /// any vector register that FUNC's own code leaves alone across the
    /// call, not only in the argument registers xmm0-7. x87 is left as it
    /// is (the counting path has no x87 instruction).
    pub static XINUSE: AtomicU32 = AtomicU32::new(0);
    /// With AVX-512 state saved, the shortcut also saves zmm16-31
    /// (`vmovdqa64`) and k0-7: 1 with `kmovw` (AVX-512F alone: 16-bit
    /// masks), 2 with `kmovq` (AVX512BW: 64-bit masks); 0 not. glibc's
    /// EVEX string functions write ymm16-31 on the counting path, and
    /// leave Hi16_ZMM in use in nearly every process: a shortcut that
    /// required it initial would almost never be taken, and `xsavec` +
    /// `xrstor` of the whole AVX-512 state costs several times more.
    pub static SHORTCUT_AVX512: AtomicU32 = AtomicU32::new(0);

    /// Bytes of the save area: the standard-format offsets of the
    /// components saved end at 2688 (Hi16_ZMM is at 1664, 1024 bytes);
    /// the compacted form is smaller.
    const AREA: u32 = 2688;

    /// A save form: the instruction and the components.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Form {
        Xsavec,
        Xsave,
        Fxsave,
    }

    /// A form asked for with `IGPROF_XSAVE_FORM` (see [`parse`]).
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub struct Forced {
        pub form: Form,
        /// SSE, AVX and AVX-512 bits; None: what XCR0 enables.
        pub parts: Option<u32>,
        /// The XINUSE shortcut; None: used where the CPU has it.
        pub xinuse: Option<bool>,
    }

    /// Parses `FORM[:PARTS][:xinuse|:noxinuse]`: FORM is `xsavec`,
    /// `xsave` or `fxsave`; PARTS `sse`, `sse+avx` or `sse+avx+zmm`
    /// (x87 is always saved).
    pub fn parse(s: &str) -> Result<Forced, String> {
        let mut words = s.split(':');
        let form = match words.next().unwrap_or("") {
            "xsavec" => Form::Xsavec,
            "xsave" => Form::Xsave,
            "fxsave" => Form::Fxsave,
            w => return Err(format!("unknown form '{w}' (xsavec, xsave or fxsave)")),
        };
        let mut f = Forced {
            form,
            parts: None,
            xinuse: None,
        };
        for w in words {
            match w {
                "sse" if f.parts.is_none() => f.parts = Some(SSE),
                "sse+avx" if f.parts.is_none() => f.parts = Some(SSE | AVX),
                "sse+avx+zmm" if f.parts.is_none() => f.parts = Some(SSE | AVX | AVX512),
                "xinuse" | "noxinuse" if f.xinuse.is_none() => f.xinuse = Some(w == "xinuse"),
                _ => {
                    return Err(format!(
                        "unknown or repeated part '{w}' (sse, sse+avx, sse+avx+zmm; xinuse or noxinuse)"
                    ))
                }
            }
        }
        if form == Form::Fxsave
            && f != (Forced {
                form,
                parts: None,
                xinuse: None,
            })
        {
            return Err(
                "fxsave saves x87 and SSE and has no XINUSE shortcut: give it alone".into(),
            );
        }
        Ok(f)
    }

    /// What the CPU and kernel offer.
    struct Host {
        /// XCR0 (0 without OSXSAVE: no `xsave`, no AVX state).
        xcr0: u32,
        xsavec: bool,
        xgetbv1: bool,
    }

    fn host() -> Host {
        use core::arch::x86_64::__cpuid_count;
        let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
        if !osxsave {
            return Host {
                xcr0: 0,
                xsavec: false,
                xgetbv1: false,
            };
        }
        let lo: u32;
        // SAFETY: OSXSAVE is set, so xgetbv is enabled; it reads XCR0.
        unsafe {
            core::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") _, options(nomem, nostack));
        }
        // Leaf 0xD (it exists when OSXSAVE is set), sub-leaf 1: eax bit 1
        // is XSAVEC, bit 2 xgetbv with ecx = 1 (XINUSE).
        let d1 = __cpuid_count(0xd, 1).eax;
        Host {
            xcr0: lo,
            xsavec: d1 & 0b10 != 0,
            xgetbv1: d1 & 0b100 != 0,
        }
    }

    /// The first component of `mask` that does not fit the stub's area in
    /// the chosen format. Leaf 0xD sub-leaf i: eax = size, ebx = offset in
    /// the standard format, ecx bit 1 = 64-byte aligned in the compacted
    /// form.
    fn misfit(mask: u32, compact: bool) -> Option<u32> {
        use core::arch::x86_64::__cpuid_count;
        let mut end_compact = 576;
        for bit in 2..8 {
            if mask & (1 << bit) == 0 {
                continue;
            }
            let c = __cpuid_count(0xd, bit);
            let start = if c.ecx & 0b10 != 0 {
                (end_compact + 63) & !63
            } else {
                end_compact
            };
            end_compact = start + c.eax;
            let end = if compact { end_compact } else { c.ebx + c.eax };
            if end > AREA {
                return Some(bit);
            }
        }
        None
    }

    /// A chosen form: `mask` 0 is `fxsave`.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    struct Choice {
        mask: u32,
        compact: bool,
        xinuse: bool,
    }

    /// What the stubs use unless told otherwise: everything XCR0 enables
    /// that fits, the compacted form and the shortcut where the CPU has them.
    fn detected(h: &Host) -> Choice {
        let mut mask = h.xcr0 & (X87 | SSE | AVX | AVX512);
        if mask & SSE == 0 {
            return Choice {
                mask: 0,
                compact: false,
                xinuse: false,
            };
        }
        while let Some(bit) = misfit(mask, h.xsavec) {
            crate::igprof_debug!(
                "-fp: xsave component {bit} does not fit the stub's area; not saved"
            );
            // AVX-512's components go together (a zmm is three of them).
            mask &= if 1 << bit & AVX512 != 0 {
                !AVX512
            } else {
                !(1 << bit)
            };
        }
        Choice {
            mask,
            compact: h.xsavec,
            xinuse: h.xgetbv1 && h.xcr0 & AVX != 0,
        }
    }

    /// The forced form, or why this host cannot execute it.
    fn forced(h: &Host, f: Forced) -> Result<Choice, String> {
        if f.form == Form::Fxsave {
            return Ok(Choice {
                mask: 0,
                compact: false,
                xinuse: false,
            });
        }
        if h.xcr0 & SSE == 0 {
            return Err("no xsave here (OSXSAVE is off)".into());
        }
        if f.form == Form::Xsavec && !h.xsavec {
            return Err("this CPU has no xsavec".into());
        }
        let parts = f.parts.unwrap_or(h.xcr0 & (SSE | AVX | AVX512));
        if parts & !h.xcr0 != 0 {
            return Err(format!(
                "XCR0 {:#x} does not enable all of {}",
                h.xcr0,
                names(parts)
            ));
        }
        let mask = X87 | parts;
        if let Some(bit) = misfit(mask, f.form == Form::Xsavec) {
            return Err(format!("component {bit} does not fit the stub's area"));
        }
        let can = h.xgetbv1 && h.xcr0 & AVX != 0;
        if f.xinuse == Some(true) && !can {
            return Err("no XINUSE shortcut here (needs xgetbv with ecx = 1 and AVX)".into());
        }
        Ok(Choice {
            mask,
            compact: f.form == Form::Xsavec,
            xinuse: f.xinuse.unwrap_or(can),
        })
    }

    fn names(mask: u32) -> &'static str {
        match (mask & AVX != 0, mask & AVX512 != 0) {
            (true, true) => "SSE+AVX+AVX-512",
            (true, false) => "SSE+AVX",
            (false, true) => "SSE+AVX-512",
            (false, false) => "SSE",
        }
    }

    fn describe(c: Choice) -> String {
        if c.mask == 0 {
            return "x87 and xmm0-15 (fxsave)".into();
        }
        let regs = match (c.mask & AVX != 0, c.mask & AVX512 == AVX512) {
            (_, true) => "zmm0-31, k0-7",
            (true, false) => "ymm0-15",
            _ => "xmm0-15",
        };
        format!(
            "x87 and {regs} ({} x87+{}{})",
            if c.compact { "xsavec" } else { "xsave" },
            names(c.mask),
            if c.xinuse { ", XINUSE shortcut" } else { "" }
        )
    }

    /// Chooses how the stubs save the vector state (start-up, before any
    /// stub is installed): the detected form, or the one
    /// `IGPROF_XSAVE_FORM` asks for when this host can execute it (else
    /// one line says why and the detected form is used). Returns what is
    /// saved, for messages.
    pub fn init() -> String {
        let h = host();
        let mut c = detected(&h);
        if let Some(v) = std::env::var_os("IGPROF_XSAVE_FORM").filter(|v| !v.is_empty()) {
            let v = v.to_string_lossy();
            match parse(&v).and_then(|f| forced(&h, f)) {
                Ok(f) => {
                    c = f;
                    crate::igprof_log!("IGPROF_XSAVE_FORM={v}: the -fp stubs save {}", describe(c));
                }
                Err(e) => crate::igprof_log!(
                    "IGPROF_XSAVE_FORM={v}: {e}; the -fp stubs save {}",
                    describe(c)
                ),
            }
        }
        XSAVE_MASK.store(c.mask, Ordering::Relaxed);
        XSAVE_COMPACT.store(c.compact as u32, Ordering::Relaxed);
        let test = if c.xinuse {
            (c.mask & ZMM_HI256) | AVX
        } else {
            0
        };
        XINUSE.store(test, Ordering::Relaxed);
        let bw = core::arch::x86_64::__cpuid_count(7, 0).ebx & (1 << 30) != 0;
        let k = match (c.mask & AVX512 == AVX512, bw) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        SHORTCUT_AVX512.store(k, Ordering::Relaxed);
        if std::env::var_os("IGPROF_FP_CLOBBER").is_some_and(|v| v == "1") {
            let mut p = SSE;
            if h.xcr0 & AVX != 0 {
                p |= AVX;
            }
            if h.xcr0 & AVX512 == AVX512 {
                p |= AVX512;
            }
            CLOBBER.store(p, Ordering::Relaxed);
        }
        describe(c)
    }

    /// `IGPROF_FP_CLOBBER=1` (tests): the components whose registers the
    /// counting path overwrites with all-ones at every count, as far as the
    /// CPU has them; 0: off.
    static CLOBBER: AtomicU32 = AtomicU32::new(0);

    /// `insn` (with `\n` the register number) for each of xmm0-15, which
    /// it declares clobbered (with their upper halves).
    macro_rules! all_ones_xmm0_15 {
        ($insn:literal) => {
            core::arch::asm!(
                ".irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
                $insn,
                ".endr",
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
                options(nomem, nostack, preserves_flags)
            )
        };
    }

    /// With `IGPROF_FP_CLOBBER=1`, writes all-ones to every vector register
    /// a callee may change (xmm0-15; with AVX their upper halves; with
    /// AVX-512 zmm0-31 and k1-7), so that a test sees any the stub does not
    /// keep, whatever the counting path's libc happens to use.
    #[inline]
    pub fn clobber() {
        let p = CLOBBER.load(Ordering::Relaxed);
        if p == 0 {
            return;
        }
        if p & AVX512 != 0 {
            // SAFETY: the CPU has AVX-512F and XCR0 enables its state.
            unsafe { clobber_avx512() }
        } else if p & AVX != 0 {
            // SAFETY: vcmptrueps only writes the registers named as
            // clobbered; XCR0 enables AVX.
            unsafe { all_ones_xmm0_15!("vcmptrueps ymm\\n, ymm\\n, ymm\\n") }
        } else {
            // SAFETY: pcmpeqd only writes the registers named as clobbered.
            unsafe { all_ones_xmm0_15!("pcmpeqd xmm\\n, xmm\\n") }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn clobber_avx512() {
        // SAFETY: vpternlogd and kxnorw only write the registers named as
        // clobbered; the caller checked AVX-512F.
        unsafe {
            core::arch::asm!(
                ".irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
                "vpternlogd zmm\\n, zmm\\n, zmm\\n, 0xff",
                ".endr",
                ".irp n, 1,2,3,4,5,6,7",
                "kxnorw k\\n, k\\n, k\\n",
                ".endr",
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
                out("k1") _, out("k2") _, out("k3") _, out("k4") _,
                out("k5") _, out("k6") _, out("k7") _,
                options(nomem, nostack, preserves_flags)
            )
        }
    }

    // The stack at entry: rsp -> return address into FUNC's caller.
    // rbp-8..rbp-72: rdi rsi rdx rcx r8 r9 rax r10 r11; rbp-80: how the
    // vector state was saved (0 xsave/xsavec, 1 the XINUSE shortcut: xmm0-15
    // at 0..255, MXCSR at 256, k0-7 at 320..383, zmm16-31 at 384..1407;
    // 2 fxsave); then the 64-byte aligned save area. The xsave header
    // (bytes 512..575) is zeroed first: xsave writes only XSTATE_BV, and
    // xrstor requires the rest of the header to be zero (xrstor reads
    // which form it restores from the header that xsave or xsavec wrote).
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
        sub rsp, {area} + 64
        and rsp, -64
        mov eax, dword ptr [rip + {mask}]
        test eax, eax
        jz 1f
        cmp dword ptr [rip + {xinuse}], 0
        je 6f
        mov ecx, 1
        xgetbv
        and eax, dword ptr [rip + {xinuse}]
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
        movdqa xmmword ptr [rsp + 128], xmm8
        movdqa xmmword ptr [rsp + 144], xmm9
        movdqa xmmword ptr [rsp + 160], xmm10
        movdqa xmmword ptr [rsp + 176], xmm11
        movdqa xmmword ptr [rsp + 192], xmm12
        movdqa xmmword ptr [rsp + 208], xmm13
        movdqa xmmword ptr [rsp + 224], xmm14
        movdqa xmmword ptr [rsp + 240], xmm15
        stmxcsr dword ptr [rsp + 256]
        mov eax, dword ptr [rip + {k}]
        test eax, eax
        jz 2f
        .irp n, 16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqa64 zmmword ptr [rsp + 384 + 64 * (\n - 16)], zmm\n
        .endr
        cmp eax, 2
        je 9f
        .irp n, 0,1,2,3,4,5,6,7
        kmovw word ptr [rsp + 320 + 8 * \n], k\n
        .endr
        jmp 2f
        9:
        .irp n, 0,1,2,3,4,5,6,7
        kmovq qword ptr [rsp + 320 + 8 * \n], k\n
        .endr
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
        mov eax, dword ptr [rip + {k}]
        test eax, eax
        jz 8f
        .irp n, 16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqa64 zmm\n, zmmword ptr [rsp + 384 + 64 * (\n - 16)]
        .endr
        cmp eax, 2
        je 10f
        .irp n, 0,1,2,3,4,5,6,7
        kmovw k\n, word ptr [rsp + 320 + 8 * \n]
        .endr
        jmp 8f
        10:
        .irp n, 0,1,2,3,4,5,6,7
        kmovq k\n, qword ptr [rsp + 320 + 8 * \n]
        .endr
        8:
        vzeroupper
        movdqa xmm0, xmmword ptr [rsp]
        movdqa xmm1, xmmword ptr [rsp + 16]
        movdqa xmm2, xmmword ptr [rsp + 32]
        movdqa xmm3, xmmword ptr [rsp + 48]
        movdqa xmm4, xmmword ptr [rsp + 64]
        movdqa xmm5, xmmword ptr [rsp + 80]
        movdqa xmm6, xmmword ptr [rsp + 96]
        movdqa xmm7, xmmword ptr [rsp + 112]
        movdqa xmm8, xmmword ptr [rsp + 128]
        movdqa xmm9, xmmword ptr [rsp + 144]
        movdqa xmm10, xmmword ptr [rsp + 160]
        movdqa xmm11, xmmword ptr [rsp + 176]
        movdqa xmm12, xmmword ptr [rsp + 192]
        movdqa xmm13, xmmword ptr [rsp + 208]
        movdqa xmm14, xmmword ptr [rsp + 224]
        movdqa xmm15, xmmword ptr [rsp + 240]
        ldmxcsr dword ptr [rsp + 256]
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
        area = const AREA,
        mask = sym XSAVE_MASK,
        compact = sym XSAVE_COMPACT,
        xinuse = sym XINUSE,
        k = sym SHORTCUT_AVX512,
        count = sym super::super::count_entry,
        chains = sym super::CHAINS,
    );

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn forms_parse_and_bad_ones_are_refused() {
            let f = |form, parts, xinuse| {
                Ok(Forced {
                    form,
                    parts,
                    xinuse,
                })
            };
            assert_eq!(parse("xsavec"), f(Form::Xsavec, None, None));
            assert_eq!(parse("xsave:sse"), f(Form::Xsave, Some(SSE), None));
            assert_eq!(
                parse("xsavec:sse+avx:noxinuse"),
                f(Form::Xsavec, Some(SSE | AVX), Some(false))
            );
            assert_eq!(
                parse("xsave:sse+avx+zmm:xinuse"),
                f(Form::Xsave, Some(SSE | AVX | AVX512), Some(true))
            );
            assert_eq!(parse("fxsave"), f(Form::Fxsave, None, None));
            assert!(parse("fxsave:sse").is_err());
            assert!(parse("xsaves").is_err());
            assert!(parse("xsave:avx").is_err());
            assert!(parse("xsave:sse:sse+avx").is_err());
        }

        #[test]
        fn a_form_the_host_lacks_is_refused() {
            let avx2 = Host {
                xcr0: X87 | SSE | AVX | (1 << 9),
                xsavec: false,
                xgetbv1: true,
            };
            let zmm = parse("xsave:sse+avx+zmm").unwrap();
            assert!(forced(&avx2, zmm).unwrap_err().contains("XCR0"));
            assert!(forced(&avx2, parse("xsavec").unwrap()).is_err());
            let c = forced(&avx2, parse("xsave:sse:noxinuse").unwrap()).unwrap();
            assert_eq!((c.mask, c.compact, c.xinuse), (X87 | SSE, false, false));
            let old = Host {
                xcr0: 0,
                xsavec: false,
                xgetbv1: false,
            };
            assert!(forced(&old, parse("xsave").unwrap()).is_err());
            assert_eq!(forced(&old, parse("fxsave").unwrap()).unwrap().mask, 0);
            assert_eq!(detected(&old).mask, 0);
            let no_avx = Host {
                xcr0: X87 | SSE,
                xsavec: false,
                xgetbv1: true,
            };
            assert!(forced(&no_avx, parse("xsave:sse:xinuse").unwrap()).is_err());
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    /// Nothing to choose: q0-q7 are saved with stp/ldp.
    pub fn init() -> String {
        "q0-q7".into()
    }

    /// `IGPROF_FP_CLOBBER` is an x86-64 switch (its save forms).
    #[inline]
    pub fn clobber() {}

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

#[cfg(target_arch = "x86_64")]
pub use arch::XSAVE_MASK;
pub use arch::{clobber, init};
