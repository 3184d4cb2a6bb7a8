//! Stack switching: runs a function on a stack the caller gives, or on a
//! fresh large mapping, for work whose frames do not fit a thread's own
//! small or alternate signal stack.
//!
//! Must never: let the function unwind or longjmp across the switch, or
//! free a stack still in use.

use super::mem::{mmap_anon, munmap};

/// Runs `f` on the stack `[lo, lo + len)` instead of the calling thread's
/// (which may be a 16 KiB thread stack or a small alternate signal stack),
/// and returns its result. `f` must not unwind (the library aborts on
/// panic) and must not longjmp out.
///
/// # Safety
/// `[lo, lo + len)` is mapped read/write, belongs to the caller, and is not
/// in use by anything else until this returns.
#[link_section = "igprof_hot"]
pub unsafe fn run_on_stack<F: FnOnce() -> R, R>(lo: usize, len: usize, f: F) -> R {
    struct Call<F, R> {
        f: Option<F>,
        r: Option<R>,
    }
    #[link_section = "igprof_hot"]
    extern "C" fn tramp<F: FnOnce() -> R, R>(call: *mut u8) {
        // SAFETY: `call` is the Call passed below, alive for the whole switch.
        let c = unsafe { &mut *(call as *mut Call<F, R>) };
        if let Some(f) = c.f.take() {
            c.r = Some(f());
        }
    }
    let mut call = Call {
        f: Some(f),
        r: None,
    };
    let top = (lo + len) & !15;
    let data = &mut call as *mut Call<F, R> as *mut u8;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: switches rsp to the caller's stack (16-aligned top), calls
    // tramp (C ABI, data in rdi) and restores rsp from a callee-saved
    // register; every register the C ABI lets tramp clobber is declared.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {f}",
            "mov rsp, r12",
            top = in(reg) top,
            f = sym tramp::<F, R>,
            in("rdi") data,
            out("r12") _,
            clobber_abi("C"),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above for AArch64: sp switched through x20 (callee-saved),
    // tramp called with data in x0.
    unsafe {
        core::arch::asm!(
            "mov x20, sp",
            "mov sp, {top}",
            "blr {f}",
            "mov sp, x20",
            top = in(reg) top,
            f = in(reg) tramp::<F, R> as *const () as usize,
            in("x0") data,
            out("x20") _,
            clobber_abi("C"),
        );
    }
    call.r.expect("run_on_stack: the function ran")
}

/// Runs `f` on a fresh 256 KiB stack of its own (mapped for the call):
/// set-up work whose frames are large (framehop's rule cache is built by
/// value) must not run on a thread's small stack. Not signal context.
pub fn with_big_stack<R>(f: impl FnOnce() -> R) -> R {
    const LEN: usize = 256 * 1024;
    let lo = mmap_anon(LEN);
    if lo.is_null() {
        return f();
    }
    // SAFETY: a fresh mapping of LEN bytes, ours alone until unmapped.
    let r = unsafe { run_on_stack(lo as usize, LEN, f) };
    // SAFETY: the mapping made above, no longer in use.
    unsafe { munmap(lo, LEN) };
    r
}
