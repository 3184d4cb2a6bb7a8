//! Reading the records a perf event wrote to its ring buffer, from the
//! thread's signal handler: the samples that carry more than a signal can
//! (AMD IBS's raw registers).
//!
//! The ring is the kernel's `perf_event_mmap_page` followed by a power of
//! two of data pages. The kernel appends records at `data_head`; the reader
//! consumes from `data_tail` and publishes how far it read by storing
//! `data_tail`, which frees the space. Every record since the previous read
//! is handed over, so samples whose signals merged into one are not lost.
//!
//! Owns: the control page's offsets and the record walk (wrapping records
//! copied whole into a buffer on the stack).
//!
//! Must never: allocate, or read outside the ring it is given.

use core::sync::atomic::{AtomicU64, Ordering};

/// Offsets in `perf_event_mmap_page` (`include/uapi/linux/perf_event.h`).
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;
/// `PERF_RECORD_SAMPLE`, and `PERF_RECORD_LOST` (records the kernel
/// could not write: the ring was full).
pub const RECORD_SAMPLE: u32 = 9;
pub const RECORD_LOST: u32 = 2;
/// Largest record handed over (an IBS sample is 8 + 4 + 4 + 9 * 8 bytes).
const MAX_RECORD: usize = 256;

/// Hands `f` the type and body (after the 8-byte header) of every record
/// written since the previous call, then marks them read. Returns how
/// many records were too large to hand over.
///
/// # Safety
/// `ring` must be a ring of `bytes` bytes mapped writable by
/// [`crate::sys::perf_map_ring`], read by one thread at a time.
pub unsafe fn drain(ring: usize, bytes: usize, mut f: impl FnMut(u32, &[u8])) -> u64 {
    // SAFETY: the control page's fields, 8-byte aligned, in the mapping.
    let field = |off: usize| unsafe { &*((ring + off) as *const AtomicU64) };
    let head = field(DATA_HEAD).load(Ordering::Acquire);
    let tail = field(DATA_TAIL).load(Ordering::Relaxed);
    // Kernels before 4.1 leave data_offset and data_size 0: the data
    // pages follow the control page.
    let (offset, size) = match (
        field(DATA_OFFSET).load(Ordering::Relaxed) as usize,
        field(DATA_SIZE).load(Ordering::Relaxed) as usize,
    ) {
        (o, s) if s != 0 && o + s <= bytes => (o, s),
        _ => (4096, bytes - 4096),
    };
    let data = (ring + offset) as *const u8;
    let mut skipped = 0;
    let mut at = tail;
    let mut buf = [0u8; MAX_RECORD];
    while at + 8 <= head {
        let read = |pos: u64, out: &mut [u8]| {
            for (k, b) in out.iter_mut().enumerate() {
                // SAFETY: (pos + k) mod size is inside the data area.
                *b = unsafe { data.add((pos as usize + k) & (size - 1)).read_volatile() };
            }
        };
        let mut header = [0u8; 8];
        read(at, &mut header);
        let kind = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
        let len = u16::from_ne_bytes([header[6], header[7]]) as usize;
        if len < 8 || at + len as u64 > head {
            // A record the kernel is still writing, or a damaged ring:
            // stop here, and drop what is left.
            at = head;
            break;
        }
        if len <= MAX_RECORD {
            read(at + 8, &mut buf[..len - 8]);
            f(kind, &buf[..len - 8]);
        } else {
            skipped += 1;
        }
        at += len as u64;
    }
    field(DATA_TAIL).store(at, Ordering::Release);
    skipped
}

/// The data of a sample's `PERF_SAMPLE_RAW` field, for a sample whose
/// `sample_type` is `PERF_SAMPLE_RAW` alone: `u32 size`, then the data.
pub fn raw_of_sample(body: &[u8]) -> Option<&[u8]> {
    let size = u32::from_ne_bytes(body.get(..4)?.try_into().ok()?) as usize;
    body.get(4..4 + size)
}

/// The number of samples a `PERF_RECORD_LOST` record says were lost.
pub fn lost_of(body: &[u8]) -> u64 {
    // struct { u64 id; u64 lost; }
    body.get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of one control page and one data page, 8-byte aligned, as
    /// the kernel fills it.
    struct Fake {
        mem: Vec<u64>,
    }

    const BYTES: usize = 2 * 4096;

    impl Fake {
        fn new() -> Fake {
            let mut f = Fake {
                mem: vec![0; BYTES / 8],
            };
            f.mem[DATA_OFFSET / 8] = 4096;
            f.mem[DATA_SIZE / 8] = 4096;
            f
        }
        fn base(&mut self) -> usize {
            self.mem.as_mut_ptr() as usize
        }
        /// Writes a record at `data_head` (wrapping) and moves the head.
        fn push(&mut self, kind: u32, body: &[u8]) {
            let len = 8 + body.len();
            let mut rec = kind.to_ne_bytes().to_vec();
            rec.extend(0u16.to_ne_bytes());
            rec.extend((len as u16).to_ne_bytes());
            rec.extend(body);
            let head = self.mem[DATA_HEAD / 8] as usize;
            let bytes: &mut [u8] = bytemuck(&mut self.mem);
            for (k, b) in rec.iter().enumerate() {
                bytes[4096 + ((head + k) & 4095)] = *b;
            }
            self.mem[DATA_HEAD / 8] = (head + len) as u64;
        }
    }

    fn bytemuck(v: &mut [u64]) -> &mut [u8] {
        // SAFETY: u64s viewed as their bytes.
        unsafe { core::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 8) }
    }

    fn sample(raw: &[u8]) -> Vec<u8> {
        let mut v = (raw.len() as u32).to_ne_bytes().to_vec();
        v.extend(raw);
        v
    }

    fn drained(f: &mut Fake) -> Vec<(u32, Vec<u8>)> {
        let mut got = Vec::new();
        // SAFETY: the fake ring of BYTES bytes, this thread only.
        unsafe { drain(f.base(), BYTES, |k, b| got.push((k, b.to_vec()))) };
        got
    }

    #[test]
    fn every_record_once_even_across_the_end() {
        let mut f = Fake::new();
        assert!(drained(&mut f).is_empty());
        // 68 bytes of raw data (an IBS op sample: caps + 8 registers).
        let raw: Vec<u8> = (0..68).collect();
        let mut count = 0;
        // Enough rounds to wrap the 4096-byte data page several times,
        // records straddling its end included.
        for round in 0..100 {
            for _ in 0..(round % 3) + 1 {
                f.push(RECORD_SAMPLE, &sample(&raw));
            }
            let got = drained(&mut f);
            assert_eq!(got.len(), (round % 3) + 1);
            for (k, body) in got {
                assert_eq!(k, RECORD_SAMPLE);
                assert_eq!(raw_of_sample(&body), Some(&raw[..]));
                count += 1;
            }
            assert_eq!(f.mem[DATA_TAIL / 8], f.mem[DATA_HEAD / 8]);
        }
        assert!(f.mem[DATA_HEAD / 8] > 3 * 4096);
        assert_eq!(count, 34 + 33 * 2 + 33 * 3);
    }

    #[test]
    fn lost_records_and_unfinished_ones() {
        let mut f = Fake::new();
        let lost: Vec<u8> = [7u64.to_ne_bytes(), 12u64.to_ne_bytes()].concat();
        f.push(RECORD_LOST, &lost);
        let got = drained(&mut f);
        assert_eq!(got[0].0, RECORD_LOST);
        assert_eq!(lost_of(&got[0].1), 12);
        // A header whose size runs past the head: not handed over.
        f.push(RECORD_SAMPLE, &sample(&[1, 2, 3, 4]));
        f.mem[DATA_HEAD / 8] -= 2;
        assert!(drained(&mut f).is_empty());
        assert_eq!(f.mem[DATA_TAIL / 8], f.mem[DATA_HEAD / 8]);
        assert_eq!(raw_of_sample(&[9, 0, 0, 0, 1]), None);
    }
}
