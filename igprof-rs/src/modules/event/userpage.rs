//! Reading a perf event's count from user space: the event's first mapped
//! page (`struct perf_event_mmap_page`, include/uapi/linux/perf_event.h)
//! and the `rdpmc` instruction, where the page says `cap_user_rdpmc` (a
//! hardware counter the kernel lets user space read): a few instructions
//! where `read(2)` costs a system call (docs/benchmarks.md has both).
//!
//! The protocol is the header's: under the page's sequence lock, the count
//! is `offset` plus the counter (`rdpmc(index - 1)`, sign-extended from
//! `pmc_width` bits), and the times enabled and running are the page's plus
//! the time since the kernel last wrote them, from the time stamp counter
//! (`cap_user_time`: `time_offset + tsc * time_mult >> time_shift`).
//!
//! Owns: that arithmetic ([`read`], testable on any page bytes with any
//! counter and clock) and the x86-64 instructions ([`read_now`]).
//! Elsewhere (no user-readable counters, a software event, AArch64 here)
//! the caller reads with `read(2)`.
//!
//! Must never: write the page, or loop forever on a page being rewritten.

// AArch64: the arithmetic is built and tested there too; its counters are
// not read from user space (read_now says None).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// Byte offsets of the fields used (the uapi layout, stable since 3.12).
const LOCK: usize = 8;
const INDEX: usize = 12;
const OFFSET: usize = 16;
const TIME_ENABLED: usize = 24;
const TIME_RUNNING: usize = 32;
const CAPABILITIES: usize = 40;
const PMC_WIDTH: usize = 48;
const TIME_SHIFT: usize = 50;
const TIME_MULT: usize = 52;
const TIME_OFFSET: usize = 56;

const CAP_USER_RDPMC: u64 = 1 << 2;
const CAP_USER_TIME: u64 = 1 << 3;

/// What one read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub count: u64,
    pub enabled: u64,
    pub running: u64,
}

/// Reads the event whose user page is `page` with `rdpmc(counter)` and
/// `tsc()`: None when the page does not allow it (no `cap_user_rdpmc`, or
/// the event is not on a counter now: `index` 0) or keeps changing.
///
/// # Safety
/// `page` must point to a readable perf_event_mmap_page (a perf event's
/// first mapped page) for the duration of the call.
pub unsafe fn read(
    page: *const u8,
    rdpmc: impl Fn(u32) -> u64,
    tsc: impl Fn() -> u64,
) -> Option<Reading> {
    let field = |at: usize| {
        // SAFETY: a u64 field of the page (caller), aligned as the uapi
        // struct is.
        unsafe { volatile::<u64>(page, at) }
    };
    let word = |at: usize| {
        // SAFETY: as above, a u32 field.
        unsafe { volatile::<u32>(page, at) }
    };
    let half = |at: usize| {
        // SAFETY: as above, a u16 field.
        unsafe { volatile::<u16>(page, at) }
    };
    for _ in 0..8 {
        let seq = word(LOCK);
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        let caps = field(CAPABILITIES);
        let index = word(INDEX);
        if caps & CAP_USER_RDPMC == 0 || index == 0 {
            return None;
        }
        let mut enabled = field(TIME_ENABLED);
        let mut running = field(TIME_RUNNING);
        if caps & CAP_USER_TIME != 0 && enabled != running {
            // Time since the kernel last updated the page.
            let (shift, mult, offset) = (
                half(TIME_SHIFT) as u32,
                word(TIME_MULT) as u64,
                field(TIME_OFFSET),
            );
            let cyc = tsc();
            let quot = cyc >> shift;
            let rem = cyc & ((1u64 << shift) - 1);
            let delta = offset
                .wrapping_add(quot.wrapping_mul(mult))
                .wrapping_add(rem.wrapping_mul(mult) >> shift);
            enabled = enabled.wrapping_add(delta);
            running = running.wrapping_add(delta);
        }
        let width = half(PMC_WIDTH) as u32;
        let pmc = rdpmc(index - 1);
        let count = field(OFFSET);
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        if word(LOCK) != seq {
            continue;
        }
        // The counter's value, sign-extended from its width.
        let shift = 64 - width.clamp(1, 64);
        let pmc = (((pmc << shift) as i64) >> shift) as u64;
        return Some(Reading {
            count: count.wrapping_add(pmc),
            enabled,
            running,
        });
    }
    None
}

/// A field of the page, read as the kernel may be rewriting it.
///
/// # Safety
/// `page` must be readable for `at + size_of::<T>()` bytes, and `page + at`
/// aligned for `T`.
unsafe fn volatile<T: Copy>(page: *const u8, at: usize) -> T {
    // SAFETY: guaranteed by the caller.
    unsafe { core::ptr::read_volatile(page.add(at) as *const T) }
}

/// [`read`] with this machine's instructions (x86-64: `rdpmc`, `rdtsc`);
/// None elsewhere.
///
/// # Safety
/// As for [`read`]; and the page must be the calling thread's own event's
/// (the counter index is only meaningful on the thread it counts).
pub unsafe fn read_now(page: *const u8) -> Option<Reading> {
    #[cfg(target_arch = "x86_64")]
    {
        let rdpmc = |c: u32| {
            let (lo, hi): (u32, u32);
            // SAFETY: the page said cap_user_rdpmc for counter c: the
            // kernel enabled user-mode rdpmc (CR4.PCE) for this thread.
            unsafe {
                core::arch::asm!("rdpmc", in("ecx") c, out("eax") lo, out("edx") hi, options(nomem, nostack))
            };
            (hi as u64) << 32 | lo as u64
        };
        // SAFETY: rdtsc has no preconditions.
        let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
        // SAFETY: guaranteed by the caller.
        unsafe { read(page, rdpmc, tsc) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = page;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page as the kernel writes it, field by field.
    #[repr(C, align(8))]
    struct Page([u8; 4096]);

    impl Page {
        fn new() -> Box<Page> {
            Box::new(Page([0; 4096]))
        }
        fn put(&mut self, at: usize, bytes: &[u8]) -> &mut Self {
            self.0[at..at + bytes.len()].copy_from_slice(bytes);
            self
        }
    }

    #[test]
    fn a_software_events_page_is_read_with_read2() {
        // This machine's page of a user-mode page-faults event, recorded
        // with perf_event_open and mmap: version 0, lock 2, index 0,
        // offset 0, 7281 ns enabled and running, capabilities 0x2
        // (cap_bit0_is_deprecated only), pmc_width 0.
        let mut p = Page::new();
        p.put(LOCK, &2u32.to_le_bytes())
            .put(TIME_ENABLED, &7281u64.to_le_bytes())
            .put(TIME_RUNNING, &7281u64.to_le_bytes())
            .put(CAPABILITIES, &2u64.to_le_bytes());
        // SAFETY: a whole page.
        assert_eq!(
            unsafe { read(p.0.as_ptr(), |_| unreachable!(), || 0) },
            None
        );
        let mut p = Page::new();
        p.put(40, &CAP_USER_RDPMC.to_le_bytes()); // index 0: not on a counter
        assert_eq!(
            unsafe { read(p.0.as_ptr(), |_| unreachable!(), || 0) },
            None
        );
    }

    #[test]
    fn a_hardware_counter_is_offset_plus_the_sign_extended_pmc() {
        let mut p = Page::new();
        p.put(INDEX, &3u32.to_le_bytes())
            .put(OFFSET, &(-1000i64).to_le_bytes())
            .put(TIME_ENABLED, &5_000u64.to_le_bytes())
            .put(TIME_RUNNING, &5_000u64.to_le_bytes())
            .put(
                CAPABILITIES,
                &(CAP_USER_RDPMC | CAP_USER_TIME).to_le_bytes(),
            )
            .put(PMC_WIDTH, &48u16.to_le_bytes());
        // rdpmc of counter 2 gives 48 meaningful bits; bits above are noise.
        let r = unsafe {
            read(
                p.0.as_ptr(),
                |c| {
                    assert_eq!(c, 2);
                    0xabcd_0000_0000_1f40
                },
                || 0,
            )
        };
        assert_eq!(
            r,
            Some(Reading {
                count: 7000,
                enabled: 5000,
                running: 5000
            })
        );
        // A counter that wrapped negative within its width (a period being
        // counted down): sign-extended.
        let r = unsafe { read(p.0.as_ptr(), |_| 0x0000_ffff_ffff_fc18, || 0) };
        assert_eq!(r.unwrap().count, (-2000i64) as u64);
    }

    #[test]
    fn times_advance_by_the_clock_since_the_page_was_written() {
        let mut p = Page::new();
        p.put(INDEX, &1u32.to_le_bytes())
            .put(TIME_ENABLED, &10_000u64.to_le_bytes())
            .put(TIME_RUNNING, &4_000u64.to_le_bytes())
            .put(
                CAPABILITIES,
                &(CAP_USER_RDPMC | CAP_USER_TIME).to_le_bytes(),
            )
            .put(PMC_WIDTH, &48u16.to_le_bytes())
            .put(TIME_SHIFT, &10u16.to_le_bytes())
            .put(TIME_MULT, &512u32.to_le_bytes()) // half a ns per tick
            .put(TIME_OFFSET, &(-100i64).to_le_bytes());
        let r = unsafe { read(p.0.as_ptr(), |_| 0, || 3000) }.unwrap();
        // 3000 ticks: 1500 ns, less the offset's 100.
        assert_eq!((r.enabled, r.running), (11_400, 5_400));
    }
}
