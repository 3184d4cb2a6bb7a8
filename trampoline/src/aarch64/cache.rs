//! Instruction-cache maintenance after writing code on AArch64.
//!
//! Owns: making freshly written instructions visible to instruction fetch
//! on every core: `dc cvau` over the data-cache lines, `dsb ish`, `ic ivau`
//! over the instruction-cache lines, `dsb ish`, `isb` (the sequence of the
//! Arm ARM, "Concurrent modification and execution of instructions"), with
//! line sizes read from `CTR_EL0` (readable from EL0 on Linux).
//!
//! Must never: be compiled into a non-AArch64 host as anything but a no-op.

/// Flush `addr..addr+len` so the instructions just written there execute.
#[cfg(target_arch = "aarch64")]
pub fn flush_icache(addr: u64, len: usize) {
    if len == 0 {
        return;
    }
    let ctr: u64;
    // SAFETY: reading CTR_EL0 has no side effects; Linux allows it from EL0
    // (or traps and emulates it).
    unsafe { core::arch::asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack)) };
    let dline = 4u64 << ((ctr >> 16) & 0xf);
    let iline = 4u64 << (ctr & 0xf);
    let end = addr + len as u64;
    let mut p = addr & !(dline - 1);
    while p < end {
        // SAFETY: `dc cvau` cleans a cache line by virtual address; the
        // caller just wrote this mapped range, so the address is valid.
        unsafe { core::arch::asm!("dc cvau, {}", in(reg) p, options(nostack)) };
        p += dline;
    }
    // SAFETY: barrier, no memory operands.
    unsafe { core::arch::asm!("dsb ish", options(nostack)) };
    let mut p = addr & !(iline - 1);
    while p < end {
        // SAFETY: as above, for the instruction cache.
        unsafe { core::arch::asm!("ic ivau, {}", in(reg) p, options(nostack)) };
        p += iline;
    }
    // SAFETY: barriers, no memory operands.
    unsafe { core::arch::asm!("dsb ish", "isb", options(nostack)) };
}

/// No-op on other hosts: AArch64 code is only planned there, never run.
#[cfg(not(target_arch = "aarch64"))]
pub fn flush_icache(_addr: u64, _len: usize) {}
