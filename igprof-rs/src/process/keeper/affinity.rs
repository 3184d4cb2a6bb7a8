//! The CPU of the intermediate process, and of the keeper for a short
//! process's life: the one their creator runs on at start-up.
//!
//! The creator blocks until the intermediate has made the keeper and
//! exited. The scheduler places a new process where it sees room: on an
//! idle machine another CPU, woken for it (in a VM, an interrupt to a
//! halted virtual CPU), on a busy one maybe another CPU's queue behind a
//! compiler's time slice while the creator's own CPU goes to someone else.
//! The keeper then sleeps until the program ends, and is woken where it
//! last ran, to exit and free the program's memory there. Made with the
//! creator's CPU as their only one, both run there: the intermediate as
//! soon as the creator blocks, the keeper whenever that CPU is free, and
//! at a short program's end on the CPU the program often ends on. The
//! creator has its own CPU set back before it waits. The keeper takes the
//! program's set back when it wakes to give the library's code pages back
//! (`GIVE_BACK_AFTER_NS` into the run: past the life of a build's short
//! commands, whose cost this is about), so that its watch of a long
//! program's memory limit runs on whichever of the program's CPUs is
//! free; and, if the program died before that, before it writes the
//! dead program's profile.
//!
//! Measured (2 virtual CPUs): a profiled shell running `/bin/true` 100
//! times, the CPU time of every process, keepers included, over 10 runs:
//! each `true` cost 1.60 ms of CPU and 1.44 ms of wall time more than
//! unprofiled with the keeper free to run anywhere, 1.17 and 1.08 ms here,
//! 0.98 and 0.98 ms without a keeper (the whole run kept on one CPU by
//! `taskset`: 1.39 and 1.45 ms with the keeper free, 1.22 and 1.24 without:
//! the keeper's cost was its running on the other CPU); `make -j2` of the
//! benchmark's project under `-mp`: 2.08-2.10x wall against 1.98-2.07x. The
//! creators' waits (`-d`'s "started in") in that make summed to 8.5 ms a
//! run (90th percentile 725 us) idle and 45.8 ms (5.1 ms) beside two CPU
//! hogs, 3.7 ms (174 us) and 24.6 ms (3.2 ms) with the intermediate on the
//! creator's CPU.
//!
//! Owns the saved CPU set between [`pin`] and [`restore`].
//!
//! Must never: leave the program's thread with another CPU set than it
//! had (a set that can no longer be restored as it was, the cpuset having
//! changed meanwhile, becomes every CPU the kernel allows), or touch errno
//! or libc (raw system calls only: [`restore`] also runs in the keeper,
//! which until the program is gone runs on its creator's TLS).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::raw;

/// Words of the largest CPU set handled (1024 CPUs, glibc's `cpu_set_t`).
const WORDS: usize = 16;

/// The creator's CPU set, saved by [`pin`] (the keeper reads it: it
/// shares this memory).
static SAVED: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
/// Its length in bytes as the kernel gave it; 0 when nothing was pinned.
static SAVED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Narrows the calling thread's CPU set to the CPU it runs on, saving the
/// set for [`restore`]. Nothing changes, and nothing is saved, where the
/// set cannot be read or set (more than 1024 CPUs, a seccomp filter).
pub(crate) fn pin() {
    SAVED_BYTES.store(0, Ordering::Relaxed);
    let mut set = [0u64; WORDS];
    // SAFETY: sched_getaffinity writes at most the buffer's size.
    let n = unsafe {
        raw::call(
            libc::SYS_sched_getaffinity,
            [0, WORDS * 8, set.as_mut_ptr() as usize, 0, 0, 0],
        )
    };
    if n <= 0 || n as usize > WORDS * 8 {
        return;
    }
    let mut cpu: u32 = 0;
    // SAFETY: getcpu writes one u32 (the node pointer may be null).
    let r = unsafe {
        raw::call(
            libc::SYS_getcpu,
            [&mut cpu as *mut u32 as usize, 0, 0, 0, 0, 0],
        )
    };
    let (word, bit) = (cpu as usize / 64, cpu % 64);
    if r != 0 || word >= WORDS || set[word] & (1 << bit) == 0 {
        return;
    }
    for (s, w) in SAVED.iter().zip(set) {
        s.store(w, Ordering::Relaxed);
    }
    let mut one = [0u64; WORDS];
    one[word] = 1 << bit;
    // SAFETY: sched_setaffinity reads `n` bytes of `one`.
    let r = unsafe {
        raw::call(
            libc::SYS_sched_setaffinity,
            [0, n as usize, one.as_ptr() as usize, 0, 0, 0],
        )
    };
    if r == 0 {
        SAVED_BYTES.store(n as usize, Ordering::Release);
    }
}

/// Gives the calling thread the CPU set [`pin`] saved (nothing if it
/// saved none): the creator's own, and the keeper's once a short life is
/// past or the program is gone. Raw system calls only.
pub(crate) fn restore() {
    let n = SAVED_BYTES.load(Ordering::Acquire);
    if n == 0 {
        return;
    }
    let mut set = [0u64; WORDS];
    for (w, s) in set.iter_mut().zip(&SAVED) {
        *w = s.load(Ordering::Relaxed);
    }
    // SAFETY: sched_setaffinity reads `n` <= WORDS * 8 bytes of `set`.
    let r = unsafe {
        raw::call(
            libc::SYS_sched_setaffinity,
            [0, n, set.as_ptr() as usize, 0, 0, 0],
        )
    };
    if r != 0 {
        // The cpuset changed since: every CPU it allows now.
        let all = [!0u64; WORDS];
        // SAFETY: as above; the kernel narrows the set to what it allows.
        unsafe {
            raw::call(
                libc::SYS_sched_setaffinity,
                [0, n, all.as_ptr() as usize, 0, 0, 0],
            )
        };
    }
}
