//! Heap against RSS: how much of the process's memory the memory profile
//! explains, said in the profile header's notes and, with -d, on stderr.
//!
//! Owns the note `peak RSS A, peak live heap explained B = C% of it` (A
//! and B in KiB below 1 MiB, else MiB with one decimal): A is the
//! process's peak resident set (getrusage `ru_maxrss`, which includes the
//! profiler's own memory and the program's code), B the highest the process's live bytes recorded by -mp ever were (see
//! `account::process_live`: blocks of the hooked allocators and of the
//! client API's pools; in a sampled profile the bytes the recorded blocks
//! stand for). A small C says most of the memory is somewhere the profiler
//! does not see (mmap, a pool not reported, stacks); above 100% the heap
//! holds blocks never touched, so never resident.
//!
//! Called only by the dump writer (the module's `header_note`), where the
//! library's allocator may be used; the peak RSS is a raw system call.
//!
//! Must never: call libc, or be called from a hook or a sampling handler
//! (it formats a String).

use super::account;

/// The note, or None when the kernel does not give the peak RSS.
pub fn note() -> Option<String> {
    let rss = crate::sys::peak_rss_bytes()?;
    let (_, heap) = account::process_live();
    let pct = if rss == 0 {
        0.0
    } else {
        heap as f64 * 100.0 / rss as f64
    };
    let note = format!(
        "peak RSS {}, peak live heap explained {} = {}% of it",
        size(rss),
        size(heap),
        percent(pct)
    );
    if crate::base::options::debug() {
        crate::igprof_log!("memory: {note}");
    }
    Some(note)
}

/// `bytes` in KiB below 1 MiB, else in MiB with one decimal.
fn size(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes < MIB {
        format!("{} KiB", bytes.div_ceil(1024))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// A share with one decimal, two below 1%.
fn percent(p: f64) -> String {
    if p < 1.0 {
        format!("{p:.2}")
    } else {
        format!("{p:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shares_read_as_documented() {
        assert_eq!(size(0), "0 KiB");
        assert_eq!(size(1500), "2 KiB");
        assert_eq!(size(5 << 20), "5.0 MiB");
        assert_eq!(size(812 * (1 << 20) + (1 << 19)), "812.5 MiB");
        assert_eq!(percent(11.84), "11.8");
        assert_eq!(percent(0.123), "0.12");
    }
}
