//! Opening profiles: plain, gzip or bzip2 (by magic bytes, as IgProf does),
//! with a progress bar on stderr for long reads when stderr is a terminal.
//!
//! Owns: file access errors (named, one line) and decompression.
//! Must never: spawn `gzip`/`bzip2` processes, or print progress to a pipe.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// Counts bytes read from the raw file and draws a progress bar.
struct Progress<R> {
    inner: R,
    read: u64,
    total: u64,
    name: String,
    last: Instant,
    shown: bool,
    enabled: bool,
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.enabled && self.last.elapsed() > Duration::from_millis(200) {
            self.last = Instant::now();
            let frac = if self.total > 0 {
                (self.read as f64 / self.total as f64).min(1.0)
            } else {
                0.0
            };
            let width = 30;
            let done = (frac * width as f64) as usize;
            let _ = write!(
                io::stderr(),
                "\r{}: [{}{}] {:3.0}%",
                self.name,
                "#".repeat(done),
                " ".repeat(width - done),
                frac * 100.0
            );
            self.shown = true;
        }
        if n == 0 && self.shown {
            let _ = write!(io::stderr(), "\r{}\r", " ".repeat(self.name.len() + 40));
            self.shown = false;
        }
        Ok(n)
    }
}

/// Opens `path` for reading, decompressing gzip and bzip2 by content.
pub fn open(path: &str) -> Result<Box<dyn BufRead>, String> {
    let mut f = File::open(path).map_err(|e| format!("{path}: cannot open: {e}"))?;
    let total = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut magic = [0u8; 3];
    let mut got = 0;
    while got < 3 {
        match f.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(format!("{path}: cannot read: {e}")),
        }
    }
    drop(f);
    let f = File::open(path).map_err(|e| format!("{path}: cannot open: {e}"))?;
    let progress = Progress {
        inner: f,
        read: 0,
        total,
        name: path.to_string(),
        last: Instant::now(),
        shown: false,
        enabled: io::stderr().is_terminal() && total > (16 << 20),
    };
    const BUF: usize = 1 << 20;
    Ok(if got >= 2 && magic[..2] == [0x1f, 0x8b] {
        Box::new(BufReader::with_capacity(
            BUF,
            flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUF, progress)),
        ))
    } else if got == 3 && &magic == b"BZh" {
        Box::new(BufReader::with_capacity(
            BUF,
            bzip2::read::MultiBzDecoder::new(BufReader::with_capacity(BUF, progress)),
        ))
    } else {
        Box::new(BufReader::with_capacity(BUF, progress))
    })
}
