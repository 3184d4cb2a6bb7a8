//! One raw energy counter behind a descriptor opened at start-up, and how to
//! turn two readings into Joules.
//!
//! Owns: the per-sample read (`read(2)` for perf counters, `pread(2)` for
//! sysfs text files and MSRs), the wrap-around arithmetic and the unit.
//! Runs in signal context: no allocation, no locks, no stdio, no panics on
//! bad data (a bad read is a [`ReadError`]). It must never open or close
//! files; that happens outside signal context.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::error::ReadError;
use super::Domain;

/// How a counter's value is fetched from its descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `read(2)` of 8 native-endian bytes: a perf_event descriptor (which
    /// does not support `pread`).
    Read,
    /// `pread(2)` of 8 native-endian bytes at `offset`: an MSR (the offset
    /// is the register number) or the file-backed fake perf counter.
    PreadBinary { offset: u64 },
    /// `pread(2)` at 0 of a decimal text number: powercap `energy_uj`.
    PreadDecimal,
}

/// Where the hardware counter wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrap {
    /// 64-bit (the kernel's perf RAPL driver accumulates into 64 bits).
    Bits64,
    /// 32-bit, as the RAPL status MSRs are; the upper half is ignored.
    Bits32,
    /// powercap: the value runs from 0 to `max_energy_range_uj` and restarts.
    /// A reading below the previous one adds `max - previous + current`.
    Range { max: u64 },
}

impl Wrap {
    /// Counts elapsed from `prev` to `cur`, assuming at most one wrap.
    pub fn delta(self, prev: u64, cur: u64) -> u64 {
        match self {
            Wrap::Bits64 => cur.wrapping_sub(prev),
            Wrap::Bits32 => u64::from((cur as u32).wrapping_sub(prev as u32)),
            Wrap::Range { max } => {
                if cur >= prev {
                    cur - prev
                } else {
                    max.saturating_sub(prev).saturating_add(cur)
                }
            }
        }
    }
}

/// A raw counter: descriptor, access, wrap, unit and the last reading.
#[derive(Debug)]
pub struct RawCounter {
    fd: OwnedFd,
    access: Access,
    wrap: Wrap,
    joules_per_count: f64,
    domain: Domain,
    last: u64,
}

impl RawCounter {
    /// Wrap an open descriptor and take the first reading (so the first
    /// delta covers the time since start-up). Fails as the read would.
    pub fn new(
        fd: OwnedFd,
        access: Access,
        wrap: Wrap,
        joules_per_count: f64,
        domain: Domain,
    ) -> Result<RawCounter, ReadError> {
        let mut c = RawCounter {
            fd,
            access,
            wrap,
            joules_per_count,
            domain,
            last: 0,
        };
        c.last = c.read_raw()?;
        Ok(c)
    }

    pub fn domain(&self) -> Domain {
        self.domain
    }

    pub fn joules_per_count(&self) -> f64 {
        self.joules_per_count
    }

    /// Move the descriptor to the lowest free number >= `min_fd` (close-on-
    /// exec), so the profiler does not hold the low numbers a program may
    /// expect to be free. Start-up only.
    pub fn relocate(&mut self, min_fd: i32) -> std::io::Result<()> {
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; no memory involved.
        let fd = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min_fd) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fcntl just created this descriptor and nothing else owns it;
        // the old one is closed when the replaced OwnedFd drops.
        self.fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(())
    }

    /// Read the current raw value. Async-signal-safe; clobbers errno on error.
    pub fn read_raw(&self) -> Result<u64, ReadError> {
        let fd = self.fd.as_raw_fd();
        match self.access {
            Access::Read => {
                let mut buf = [0u8; 8];
                // SAFETY: buf is a valid writable 8-byte buffer for the whole call.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                finish_binary(n, buf)
            }
            Access::PreadBinary { offset } => {
                let mut buf = [0u8; 8];
                // SAFETY: as above; the offset (an MSR number) fits off_t on 64-bit Linux.
                let n = unsafe {
                    libc::pread(
                        fd,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        offset as libc::off_t,
                    )
                };
                finish_binary(n, buf)
            }
            Access::PreadDecimal => {
                let mut buf = [0u8; 32];
                // SAFETY: buf is a valid writable 32-byte buffer for the whole call.
                let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 0 {
                    return Err(ReadError::Io {
                        errno: last_errno(),
                    });
                }
                parse_decimal(&buf[..n as usize])
            }
        }
    }

    /// Read, and return the Joules consumed since the previous reading.
    /// On error the previous reading is kept, so the next successful delta
    /// covers the gap.
    pub fn delta_joules(&mut self) -> Result<f64, ReadError> {
        let cur = self.read_raw()?;
        let counts = self.wrap.delta(self.last, cur);
        self.last = cur;
        Ok(counts as f64 * self.joules_per_count)
    }
}

fn finish_binary(n: isize, buf: [u8; 8]) -> Result<u64, ReadError> {
    if n < 0 {
        Err(ReadError::Io {
            errno: last_errno(),
        })
    } else if n != 8 {
        Err(ReadError::Short { got: n as usize })
    } else {
        Ok(u64::from_ne_bytes(buf))
    }
}

fn last_errno() -> i32 {
    // No allocation: an OS error is stored inline.
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Parse leading decimal digits (then optional whitespace). Allocation-free.
pub fn parse_decimal(bytes: &[u8]) -> Result<u64, ReadError> {
    let mut value: u64 = 0;
    let mut digits = 0;
    for &b in bytes {
        match b {
            b'0'..=b'9' => {
                value = value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or(ReadError::NotANumber)?;
                digits += 1;
            }
            b'\n' | b' ' | b'\t' | 0 if digits > 0 => break,
            _ => return Err(ReadError::NotANumber),
        }
    }
    if digits == 0 {
        Err(ReadError::NotANumber)
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{File, OpenOptions};
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn wrap_arithmetic() {
        assert_eq!(Wrap::Bits64.delta(10, 15), 5);
        assert_eq!(Wrap::Bits64.delta(u64::MAX - 1, 3), 5);
        assert_eq!(Wrap::Bits32.delta(0xFFFF_FFF0, 0x10), 0x20);
        // Upper half of an MSR is reserved: ignored.
        assert_eq!(Wrap::Bits32.delta(0xAB_0000_0001, 0xCD_0000_0003), 2);
        assert_eq!(Wrap::Range { max: 1000 }.delta(990, 10), 20);
        assert_eq!(Wrap::Range { max: 1000 }.delta(10, 990), 980);
    }

    #[test]
    fn decimal_parsing() {
        assert_eq!(parse_decimal(b"123456\n"), Ok(123456));
        assert_eq!(parse_decimal(b"0"), Ok(0));
        assert_eq!(parse_decimal(b"\n"), Err(ReadError::NotANumber));
        assert_eq!(parse_decimal(b"12a"), Err(ReadError::NotANumber));
        assert_eq!(
            parse_decimal(b"99999999999999999999999"),
            Err(ReadError::NotANumber)
        );
    }

    fn tmpfile(name: &str) -> (std::path::PathBuf, File) {
        let dir = std::env::temp_dir().join(format!(
            "igprof-energy-counter-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c");
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        (p, f)
    }

    #[test]
    fn decimal_file_rereads_at_offset_zero() {
        let (p, mut w) = tmpfile("dec");
        writeln!(w, "1000").unwrap();
        let fd = OwnedFd::from(File::open(&p).unwrap());
        let mut c = RawCounter::new(
            fd,
            Access::PreadDecimal,
            Wrap::Range { max: 5000 },
            1e-6,
            Domain::Pkg,
        )
        .unwrap();
        w.set_len(0).unwrap();
        w.seek(SeekFrom::Start(0)).unwrap();
        writeln!(w, "4000").unwrap();
        assert!((c.delta_joules().unwrap() - 3000e-6).abs() < 1e-12);
        w.set_len(0).unwrap();
        w.seek(SeekFrom::Start(0)).unwrap();
        writeln!(w, "500").unwrap();
        // 4000 -> 5000 (max) -> 500: 1500 uJ.
        assert!((c.delta_joules().unwrap() - 1500e-6).abs() < 1e-12);
    }

    #[test]
    fn binary_pread_at_msr_offset() {
        let (p, w) = tmpfile("msr");
        use std::os::unix::fs::FileExt;
        w.write_all_at(&0xFFFF_FFF0u64.to_ne_bytes(), 0x611)
            .unwrap();
        let fd = OwnedFd::from(File::open(&p).unwrap());
        let mut c = RawCounter::new(
            fd,
            Access::PreadBinary { offset: 0x611 },
            Wrap::Bits32,
            0.5,
            Domain::Pkg,
        )
        .unwrap();
        w.write_all_at(&0x10u64.to_ne_bytes(), 0x611).unwrap();
        assert_eq!(c.delta_joules().unwrap(), 16.0);
        // Moved to a high descriptor, it reads the same register.
        c.relocate(900).unwrap();
        assert!(c.fd.as_raw_fd() >= 900);
        w.write_all_at(&0x20u64.to_ne_bytes(), 0x611).unwrap();
        assert_eq!(c.delta_joules().unwrap(), 8.0);
        // Reading beyond the end of file: short read, typed error, last kept.
        let fd = OwnedFd::from(File::open(&p).unwrap());
        let e = RawCounter::new(
            fd,
            Access::PreadBinary { offset: 0x2000 },
            Wrap::Bits32,
            1.0,
            Domain::Pkg,
        )
        .unwrap_err();
        assert_eq!(e, ReadError::Short { got: 0 });
    }
}
