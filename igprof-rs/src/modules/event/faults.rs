//! `-pf`'s attribution of page faults: a counting group of faults and
//! major faults per thread, read at each fault sample so that faults whose
//! signal merged with another's are charged to the same stack; the late
//! signals of the profiler's own faults told apart by the interrupted
//! registers; with `-mp`, a fault inside a large live block charged to the
//! stack that allocated it (MEM_FAULTS).
//!
//! Must never: allocate, lock or leave errno changed (signal context), or
//! charge a fault the profiler's own code took.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::record::PerThread;
use super::table::Event;
use crate::base::counters;
use crate::base::thread::ThreadState;
use crate::sampler;
use crate::sys::{self, PerfEventKind};

/// PAGE_FAULTS' slot (after the freeze; usize::MAX: not recorded).
static PF_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// MAJOR_FAULTS' slot (after the freeze; usize::MAX: not recorded).
static MAJOR_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// MEM_FAULTS' slot (after the freeze; usize::MAX: not recorded).
static MEM_FAULTS_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Faults whose signal merged with another event's, charged by
/// `charge_faults`; fault signals of faults already counted past.
pub(super) static MERGED: AtomicU64 = AtomicU64::new(0);
pub(super) static STALE: AtomicU64 = AtomicU64::new(0);

/// A fingerprint of the interrupted thread's registers (general-purpose
/// ones, program counter, stack pointer, flags): equal for two signals
/// between which it ran no instruction, different between two faults of
/// a loop (its index register moved).
///
/// # Safety
/// `uc` must be the `ucontext_t` the kernel passed for the signal handled.
pub(super) unsafe fn registers_fingerprint(uc: *const libc::c_void) -> u64 {
    let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(23);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: guaranteed by the caller.
        let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        // R8..R15, RDI, RSI, RBP, RBX, RDX, RAX, RCX, RSP, RIP, EFL (not
        // the trap number, error code or CR2: a fault in the handler
        // changes those).
        g[..=libc::REG_EFL as usize]
            .iter()
            .fold(0, |h, &v| mix(h, v as u64))
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: guaranteed by the caller.
        let m = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext };
        m.regs
            .iter()
            .chain([&m.sp, &m.pc, &m.pstate])
            .fold(0, |h, &v| mix(h, v))
    }
}

/// -pf: the faults and major faults the thread took since the previous
/// read of its counting group (None without one). Signal context.
pub(super) fn faults_since(r: &PerThread) -> Option<(u64, u64)> {
    let fd = r.fault_fd.load(Ordering::Relaxed) - 1;
    let mut now = [0u64; 2];
    if fd < 0 {
        return None;
    }
    sys::perf_read_group(fd, &mut now)?;
    Some((
        now[0].saturating_sub(r.faults.swap(now[0], Ordering::Relaxed)),
        now[1].saturating_sub(r.majors.swap(now[1], Ordering::Relaxed)),
    ))
}

/// -pf: charges the faults a sample's kernel entry took (`faults_since`
/// read at its start) to `node`: PAGE_FAULTS, and MAJOR_FAULTS for the
/// major ones. Each fault raises its own SIGTRAP, but one that shares a
/// kernel entry with another event's (a fault that waited for memory is
/// also a context switch) is merged into it, so the faults counted since
/// the previous read happened in this sample's kernel entry. The faults of
/// the profiler's own code are counted past (`consume_faults`).
pub(super) fn charge_faults((faults, majors): (u64, u64), node: Option<&crate::base::tree::Node>) {
    let (pf, mj) = (
        PF_SLOT.load(Ordering::Relaxed),
        MAJOR_SLOT.load(Ordering::Relaxed),
    );
    let Some(node) = node else { return };
    if faults > 0 && pf != usize::MAX {
        node.counter(pf).add(faults, faults);
        MERGED.fetch_add(faults.saturating_sub(1), Ordering::Relaxed);
    }
    if majors > 0 && mj != usize::MAX {
        node.counter(mj).add(majors, majors);
    }
}

/// -pf: counts past the faults the profiler's own code took (its handler,
/// a hook): they are not the program's.
pub(super) fn consume_faults(r: &PerThread) {
    let _ = faults_since(r);
}

/// -pf -mp: a fault at `addr` inside a large live block is charged to the
/// stack that allocated it (any thread's tree: a shared add).
pub(super) fn charge_owner(addr: usize) {
    let slot = MEM_FAULTS_SLOT.load(Ordering::Relaxed);
    if slot == usize::MAX {
        return;
    }
    if let Some(node) = crate::modules::mem::spans::owner_of(addr) {
        // SAFETY: nodes are never freed; slot < nslots.
        unsafe { &*node }.counter(slot).add_shared(1, 1);
    }
}

/// Opens thread `t`'s counting group of faults and major faults beside
/// the sampled faults of `pf` (the -pf event), and puts it in `r`; the
/// thread goes without it if it does not open.
pub(super) fn open_group(t: &ThreadState, r: &PerThread, pf: &Event) {
    // -pf's faults and major faults, counted beside the sampled faults.
    let count = |config, leader| {
        let kind = PerfEventKind {
            config,
            sample_addr: false,
            ..pf.kind
        };
        sys::perf_counter_open(&kind, t.tid(), leader)
            .map(|fd| sys::move_fd_up(fd, sampler::high_fd_base()))
    };
    if let Ok(leader) = count(2, -1) {
        let member = count(6, leader).unwrap_or(-1);
        if member >= 0 && sys::perf_enable_group(leader) {
            r.faults.store(0, Ordering::Relaxed);
            r.majors.store(0, Ordering::Relaxed);
            r.major_fd.store(member + 1, Ordering::Release);
            r.fault_fd.store(leader + 1, Ordering::Release);
        } else {
            for fd in [member, leader] {
                if fd >= 0 {
                    sys::close(fd);
                }
            }
        }
    }
}

/// Closes the thread's counting group of faults (none: nothing to do).
pub(super) fn close_group(r: &PerThread) {
    for fd in [
        r.fault_fd.swap(0, Ordering::AcqRel) - 1,
        r.major_fd.swap(0, Ordering::AcqRel) - 1,
    ] {
        if fd >= 0 {
            sys::close(fd);
        }
    }
}

/// Finds the fault counters' slots (at start, after the counters freeze).
pub(super) fn init_slots() {
    if let Some(s) = counters::slot(counters::CounterId::MemFaults) {
        MEM_FAULTS_SLOT.store(s, Ordering::Relaxed);
    }
    if let Some(s) = counters::slot(counters::CounterId::MajorFaults) {
        MAJOR_SLOT.store(s, Ordering::Relaxed);
    }
    if let Some(s) = counters::slot(counters::CounterId::PageFaults) {
        PF_SLOT.store(s, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint of a context whose registers are zero but those
    /// `set` changes.
    fn fingerprint(set: impl FnOnce(&mut libc::ucontext_t)) -> u64 {
        // SAFETY: ucontext_t is plain data; all zero is a valid value.
        let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
        set(&mut uc);
        // SAFETY: a ucontext_t of ours.
        unsafe { registers_fingerprint((&uc as *const libc::ucontext_t).cast()) }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fingerprint_sees_the_registers_a_fault_leaves_alone() {
        let base = fingerprint(|_| {});
        assert_eq!(base, fingerprint(|_| {}));
        // Each general register, the PC, the stack pointer, the flags.
        for r in 0..=libc::REG_EFL as usize {
            assert_ne!(
                base,
                fingerprint(|uc| uc.uc_mcontext.gregs[r] = 8),
                "register {r}"
            );
        }
        // Two loop iterations: the index register moved by one.
        let at = |i| {
            fingerprint(|uc| {
                uc.uc_mcontext.gregs[libc::REG_RIP as usize] = 0x40_1000;
                uc.uc_mcontext.gregs[libc::REG_RCX as usize] = i;
            })
        };
        assert_ne!(at(7), at(8));
        // The trap number, error code and fault address: a fault in the
        // handler changes them, not the interrupted thread.
        for r in [libc::REG_TRAPNO, libc::REG_ERR, libc::REG_CR2] {
            assert_eq!(
                base,
                fingerprint(|uc| uc.uc_mcontext.gregs[r as usize] = 14),
                "register {r}"
            );
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn fingerprint_sees_the_registers_a_fault_leaves_alone() {
        let base = fingerprint(|_| {});
        assert_eq!(base, fingerprint(|_| {}));
        for r in 0..31 {
            assert_ne!(base, fingerprint(|uc| uc.uc_mcontext.regs[r] = 8), "x{r}");
        }
        assert_ne!(base, fingerprint(|uc| uc.uc_mcontext.sp = 8));
        assert_ne!(base, fingerprint(|uc| uc.uc_mcontext.pc = 8));
        assert_ne!(base, fingerprint(|uc| uc.uc_mcontext.pstate = 8));
        // The fault address: a fault in the handler changes it.
        assert_eq!(base, fingerprint(|uc| uc.uc_mcontext.fault_address = 8));
    }
}
