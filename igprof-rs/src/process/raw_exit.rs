//! Runtimes that end the process with a raw `exit_group` system call, past
//! every libc exit path: Go's (`runtime.exit`, which `os.Exit` and the end
//! of `main.main` both reach). A cgo program is dynamically linked and
//! preloads the profiler like any other, but no exit handler, destructor
//! or `_exit` runs when it ends, so without this hook it leaves no
//! profile and no word.
//!
//! The hook is installed only in a Go program (one that defines the cgo
//! runtime's `_cgo_topofstack`, a dynamic-symbol look-up at start-up; the
//! symbol table is read only then). Its entry stub runs on a goroutine
//! stack, which may have only a few hundred bytes left: it switches to a
//! stack of the profiler's own (mapped at start-up, its pages touched only
//! when used), writes the final profile there, switches back and jumps to
//! the original, which makes the system call with the program's status.
//!
//! Owns: finding Go's exit function, its entry stub and that stub's stack.
//!
//! Must never: change the stack or any register the original reads (Go's
//! ABI0 passes the status on the stack), run the dump on the goroutine's
//! stack, or run it twice (a second thread exiting meanwhile passes
//! straight through).

use core::sync::atomic::{AtomicUsize, Ordering};

/// The stub's chain pointer (the original `runtime.exit`).
static CHAIN: AtomicUsize = AtomicUsize::new(0);
/// The top of the stub's stack (0: not hooked).
static STACK_TOP: AtomicUsize = AtomicUsize::new(0);
/// Set by the first thread that enters the stub.
static ENTERED: AtomicUsize = AtomicUsize::new(0);

/// The stub's stack: the dump's deepest frames (naming, compression) fit
/// in far less; only the pages used are ever touched.
const STACK_BYTES: usize = 8 << 20;

/// The names Go's linker gives its exit function (the assembly function
/// is `runtime.exit.abi0` since Go 1.17's register ABI).
const NAMES: [&str; 2] = ["runtime.exit.abi0", "runtime.exit"];

/// Hooks Go's exit function when the program is a Go program. Start-up,
/// after the core hooks.
pub fn install() {
    if !crate::base::run::is_go_program() {
        return;
    }
    let Some(sym) = NAMES
        .iter()
        .find_map(|n| trampoline::find_function(n, None).ok())
    else {
        crate::igprof_log!(
            "a Go program without the symbol runtime.exit: its profile is written only by --dump-every snapshots and igprof_dump_now"
        );
        return;
    };
    let stack = crate::sys::mmap_anon(STACK_BYTES);
    if stack.is_null() {
        crate::igprof_log!(
            "no memory for the stack of Go's exit hook: its profile is written only by --dump-every snapshots"
        );
        return;
    }
    STACK_TOP.store((stack as usize + STACK_BYTES) & !15, Ordering::Release);
    match crate::hook::hook_symbol(&sym, entry(), |c| CHAIN.store(c as usize, Ordering::Release))
    {
        Ok(()) => crate::igprof_debug!("hooked Go's exit ({} at {:#x})", sym.name, sym.addr),
        Err(e) => crate::igprof_log!(
            "cannot hook Go's exit function ({e}): its profile is written only by --dump-every snapshots"
        ),
    }
}

/// Called by the stub on its own stack, by the first thread to exit: the
/// final dump, as at `_exit`.
extern "C" fn go_exit_dump() {
    crate::process::hooks::dump_before_end("Go's exit", || true);
}

fn entry() -> *const () {
    extern "C" {
        fn igprof_go_exit_entry();
    }
    igprof_go_exit_entry as *const ()
}

// At entry: rsp -> the return address into Go's caller, the status above
// it. Only the first thread to enter uses the stack (`ENTERED`'s bit 0,
// set atomically here before the switch, so two threads never share it);
// the others jump straight to the original. rbx and r12 are saved on the
// goroutine stack (16 bytes) and keep the goroutine's rsp across the call;
// every other register the original reads is on the stack.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    r#"
    .text
    .p2align 4
    .hidden igprof_go_exit_entry
    .globl igprof_go_exit_entry
    .type igprof_go_exit_entry,@function
    igprof_go_exit_entry:
    .cfi_startproc
    endbr64
    lock bts qword ptr [rip + {entered}], 0
    jc 1f
    push rbx
    .cfi_adjust_cfa_offset 8
    push r12
    .cfi_adjust_cfa_offset 8
    mov r12, rsp
    .cfi_def_cfa_register r12
    mov rsp, qword ptr [rip + {top}]
    call {dump}
    mov rsp, r12
    .cfi_def_cfa_register rsp
    pop r12
    .cfi_adjust_cfa_offset -8
    pop rbx
    .cfi_adjust_cfa_offset -8
    1:
    jmp qword ptr [rip + {chain}]
    .cfi_endproc
    .size igprof_go_exit_entry, . - igprof_go_exit_entry
    "#,
    entered = sym ENTERED,
    top = sym STACK_TOP,
    dump = sym go_exit_dump,
    chain = sym CHAIN,
);

// AArch64: as above; x15-x17 are free at a Go ABI0 call (the status is on
// the stack), x29 and x30 are saved on the goroutine stack (16 bytes) and
// x29 keeps the goroutine's sp across the call. ENTERED's bit is set with
// an exclusive pair (LSE atomics are not in the base architecture).
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    r#"
    .text
    .p2align 2
    .hidden igprof_go_exit_entry
    .globl igprof_go_exit_entry
    .type igprof_go_exit_entry,%function
    igprof_go_exit_entry:
    .cfi_startproc
    hint #34
    adrp x16, {entered}
    add x16, x16, :lo12:{entered}
    1:
    ldaxr x17, [x16]
    cbnz x17, 2f
    mov x17, #1
    stlxr w15, x17, [x16]
    cbnz w15, 1b
    stp x29, x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x29, -16
    .cfi_offset x30, -8
    mov x29, sp
    .cfi_def_cfa x29, 16
    adrp x16, {top}
    ldr x16, [x16, :lo12:{top}]
    mov sp, x16
    bl {dump}
    mov sp, x29
    .cfi_def_cfa sp, 16
    ldp x29, x30, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x29
    .cfi_restore x30
    b 3f
    2:
    clrex
    3:
    adrp x16, {chain}
    ldr x16, [x16, :lo12:{chain}]
    br x16
    .cfi_endproc
    .size igprof_go_exit_entry, . - igprof_go_exit_entry
    "#,
    entered = sym ENTERED,
    top = sym STACK_TOP,
    dump = sym go_exit_dump,
    chain = sym CHAIN,
);
