//! Local stand-ins for the C unwinder's entry points that Rust's standard
//! library refers to, so that the library does not need `libgcc_s.so.1`.
//!
//! The library is built with `panic = "abort"`: nothing in it ever unwinds.
//! Yet the standard library's code (its landing pads, its personality
//! routine, its backtrace printer) names a dozen `_Unwind_*` functions, and a
//! reference that the link cannot satisfy locally makes `libgcc_s.so.1` a
//! needed library of `libigprof.so`: every profiled process that would not
//! load it by itself (a C program, `make`, `as`, the `gcc` driver) then
//! opens, maps and relocates it and runs its constructor (CPU-feature
//! probing with `cpuid`, which traps to the hypervisor in a VM), a cost
//! paid by every process.
//!
//! Each stand-in is *hidden*: it satisfies the library's own references at
//! link time and is never exported, so a profiled C++ program keeps
//! throwing its exceptions through the real unwinder. What each does if it
//! is ever called: `_Unwind_Backtrace` reports the end of the stack at
//! once (a panic message printed with `RUST_BACKTRACE` set shows no
//! frames); the accessors used only while unwinding a frame return 0 or do
//! nothing; `_Unwind_Resume`, which only a landing pad reaches after a
//! frame was unwound, traps.
//!
//! Must never: be exported (a program would throw through it), or be given
//! work to do (the library must keep `panic = "abort"`).

// `_URC_END_OF_STACK`, the value `_Unwind_Backtrace` returns when the walk
// reached the outermost frame.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.igprof_nounwind,\"ax\",@progbits",
    ".macro igprof_nounwind name, body:vararg",
    ".globl \\name",
    ".hidden \\name",
    ".type \\name, @function",
    "\\name:",
    "\\body",
    ".size \\name, . - \\name",
    ".endm",
    "igprof_nounwind _Unwind_Backtrace, mov eax, 5; ret",
    "igprof_nounwind _Unwind_GetIP, xor eax, eax; ret",
    "igprof_nounwind _Unwind_GetIPInfo, mov dword ptr [rsi], 0; xor eax, eax; ret",
    "igprof_nounwind _Unwind_GetLanguageSpecificData, xor eax, eax; ret",
    "igprof_nounwind _Unwind_GetRegionStart, xor eax, eax; ret",
    "igprof_nounwind _Unwind_GetTextRelBase, xor eax, eax; ret",
    "igprof_nounwind _Unwind_GetDataRelBase, xor eax, eax; ret",
    "igprof_nounwind _Unwind_FindEnclosingFunction, xor eax, eax; ret",
    "igprof_nounwind _Unwind_GetCFA, xor eax, eax; ret",
    "igprof_nounwind _Unwind_SetGR, ret",
    "igprof_nounwind _Unwind_SetIP, ret",
    "igprof_nounwind _Unwind_Resume, ud2",
    ".purgem igprof_nounwind",
    ".popsection",
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .text.igprof_nounwind,\"ax\",%progbits",
    ".macro igprof_nounwind name, body:vararg",
    ".globl \\name",
    ".hidden \\name",
    ".type \\name, %function",
    "\\name:",
    "\\body",
    ".size \\name, . - \\name",
    ".endm",
    "igprof_nounwind _Unwind_Backtrace, mov w0, #5; ret",
    "igprof_nounwind _Unwind_GetIP, mov x0, #0; ret",
    "igprof_nounwind _Unwind_GetIPInfo, str wzr, [x1]; mov x0, #0; ret",
    "igprof_nounwind _Unwind_GetLanguageSpecificData, mov x0, #0; ret",
    "igprof_nounwind _Unwind_GetRegionStart, mov x0, #0; ret",
    "igprof_nounwind _Unwind_GetTextRelBase, mov x0, #0; ret",
    "igprof_nounwind _Unwind_GetDataRelBase, mov x0, #0; ret",
    "igprof_nounwind _Unwind_FindEnclosingFunction, mov x0, #0; ret",
    "igprof_nounwind _Unwind_GetCFA, mov x0, #0; ret",
    "igprof_nounwind _Unwind_SetGR, ret",
    "igprof_nounwind _Unwind_SetIP, ret",
    "igprof_nounwind _Unwind_Resume, brk #0",
    ".purgem igprof_nounwind",
    ".popsection",
);
