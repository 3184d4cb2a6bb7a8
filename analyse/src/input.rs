//! Which files a command line names, and opening them: plain, gzip or bzip2
//! (by magic bytes, as IgProf does), with a progress bar on stderr for long
//! reads when stderr is a terminal.
//!
//! Owns: expanding a run directory into the profiles in it, recognising the
//! leftovers of a run that are not profiles (`.tmp` files a process was
//! still writing, 0-byte files), file access errors (named, one line) and
//! decompression.
//! Must never: spawn `gzip`/`bzip2` processes, or print progress to a pipe.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// A progress bar over the bytes of the file on disk.
struct Bar {
    name: String,
    total: u64,
    last: Instant,
    shown: bool,
    enabled: bool,
}

impl Bar {
    fn new(name: &str, total: u64) -> Bar {
        Bar {
            name: name.to_string(),
            total,
            last: Instant::now(),
            shown: false,
            // Only for files that take a while, and only on a terminal.
            enabled: io::stderr().is_terminal() && total > (16 << 20),
        }
    }
    fn update(&mut self, done: u64) {
        if !self.enabled || self.last.elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last = Instant::now();
        let frac = (done as f64 / self.total.max(1) as f64).min(1.0);
        let width = 30;
        let filled = (frac * width as f64) as usize;
        let _ = write!(
            io::stderr(),
            "\r{}: [{}{}] {:3.0}%",
            self.name,
            "#".repeat(filled),
            " ".repeat(width - filled),
            frac * 100.0
        );
        self.shown = true;
    }
    fn finish(&mut self) {
        if self.shown {
            let _ = write!(io::stderr(), "\r{}\r", " ".repeat(self.name.len() + 40));
            self.shown = false;
        }
    }
}

/// Counts the bytes read from the file (compressed input).
struct Counted {
    file: File,
    read: u64,
    bar: Bar,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read += n as u64;
        if n == 0 {
            self.bar.finish();
        } else {
            self.bar.update(self.read);
        }
        Ok(n)
    }
}

/// Decompressed data produced on its own thread (inflating is as costly as
/// parsing, and parsing already has a thread of its own).
struct Threaded {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Threaded {
    fn new(mut input: impl Read + Send + 'static) -> Threaded {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        std::thread::spawn(move || loop {
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0;
            while n < buf.len() {
                match input.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        if n > 0 {
                            buf.truncate(n);
                            let _ = tx.send(Ok(buf));
                        }
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
            if n == 0 {
                return;
            }
            buf.truncate(n);
            // The reader hung up (an error downstream): stop inflating.
            if tx.send(Ok(buf)).is_err() {
                return;
            }
        });
        Threaded {
            rx,
            cur: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for Threaded {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.fill_buf()?.read(out)?;
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Threaded {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos >= self.cur.len() && !self.done {
            match self.rx.recv() {
                Ok(Ok(buf)) => {
                    self.cur = buf;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => self.done = true,
            }
        }
        Ok(&self.cur[self.pos.min(self.cur.len())..])
    }
    fn consume(&mut self, n: usize) {
        self.pos += n;
    }
}

/// A file or directory that could not be used.
#[derive(Debug)]
pub enum OpenError {
    /// open(2) failed.
    Open { path: String, source: io::Error },
    /// The first bytes could not be read.
    Read { path: String, source: io::Error },
    /// A directory given as input could not be listed.
    List { path: String, source: io::Error },
    /// A directory given as input holds no files.
    EmptyDirectory { path: String },
    /// The memory journal beside a snapshot cannot be applied.
    Journal { why: String },
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Open { path, source } => write!(f, "{path}: cannot open: {source}"),
            OpenError::Read { path, source } => write!(f, "{path}: cannot read: {source}"),
            OpenError::List { path, source } => {
                write!(f, "{path}: cannot list the directory: {source}")
            }
            OpenError::EmptyDirectory { path } => {
                write!(f, "{path}: no files in this directory")
            }
            OpenError::Journal { why } => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// One profile to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub path: String,
    /// Found by listing a directory (it may vanish before it is opened, as
    /// a `.tmp` does when its process renames it), not named by the user.
    pub listed: bool,
}

/// The profiles named by the command line's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    pub files: Vec<Source>,
    /// Several profiles, or a directory: a run of several processes, where
    /// leftovers and damaged files are skipped with a warning instead of
    /// ending the run.
    pub several: bool,
}

/// Expands the inputs: a directory stands for every file in it (not its
/// subdirectories), in name order; a file stands for itself.
pub fn expand(inputs: &[String]) -> Result<Sources, OpenError> {
    let mut files = Vec::new();
    let mut directory = false;
    for input in inputs {
        let path = std::path::Path::new(input);
        if !path.is_dir() {
            files.push(Source {
                path: input.clone(),
                listed: false,
            });
            continue;
        }
        directory = true;
        let list = |source| OpenError::List {
            path: input.clone(),
            source,
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).map_err(list)? {
            let entry = entry.map_err(list)?;
            // Follows symbolic links, as opening the file will. A memory
            // journal is read with the profile it follows (one still being
            // made is not a profile either).
            let name = entry.file_name().to_string_lossy().into_owned();
            let journal = name.ends_with(".journal") || name.ends_with(".journal.tmp");
            if entry.path().is_file() && !journal {
                found.push(entry.path().to_string_lossy().into_owned());
            }
        }
        if found.is_empty() {
            return Err(OpenError::EmptyDirectory {
                path: input.clone(),
            });
        }
        found.sort();
        files.extend(found.into_iter().map(|path| Source { path, listed: true }));
    }
    Ok(Sources {
        several: directory || files.len() > 1,
        files,
    })
}

/// Why a file of a multi-process run is not a profile to read, known from
/// its name and size alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// `<profile>.tmp`: a process was writing it (or died while writing).
    Unfinished,
    /// 0 bytes.
    Empty,
}

impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Leftover::Unfinished => write!(
                f,
                "unfinished profile (.tmp: its process was still writing it, or died while writing)"
            ),
            Leftover::Empty => write!(f, "empty file (0 bytes)"),
        }
    }
}

/// A leftover of a run, or None for a file to read. A file that cannot be
/// examined is left for [`open`] to report.
pub fn leftover(path: &str) -> Option<Leftover> {
    if path.ends_with(".tmp") {
        return Some(Leftover::Unfinished);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == 0 => Some(Leftover::Empty),
        _ => None,
    }
}

/// Opens `path` for reading, decompressing gzip and bzip2 by content; a
/// snapshot with a memory journal beside it reads as the two merged
/// (`crate::journal`).
pub fn open(path: &str) -> Result<Box<dyn BufRead + Send>, OpenError> {
    let journal = |why| OpenError::Journal { why };
    for j in crate::journal::beside(path).map_err(journal)? {
        // None: it follows another dump of the process.
        if let Some((text, _)) =
            crate::journal::apply(open_file(path)?, path, &j).map_err(journal)?
        {
            return Ok(Box::new(io::Cursor::new(text)));
        }
    }
    open_file(path)
}

/// [`open`] without a journal.
fn open_file(path: &str) -> Result<Box<dyn BufRead + Send>, OpenError> {
    let cannot_open = |source| OpenError::Open {
        path: path.to_string(),
        source,
    };
    let mut file = File::open(path).map_err(cannot_open)?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut magic = [0u8; 3];
    let mut got = 0;
    while got < 3 {
        match file.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(source) => {
                return Err(OpenError::Read {
                    path: path.to_string(),
                    source,
                })
            }
        }
    }
    let file = File::open(path).map_err(cannot_open)?;
    let bar = Bar::new(path, total);
    const BUF: usize = 1 << 20;
    let gzip = got >= 2 && magic[..2] == [0x1f, 0x8b];
    let bzip2 = got == 3 && &magic == b"BZh";
    if gzip || bzip2 {
        let raw = BufReader::with_capacity(BUF, Counted { file, read: 0, bar });
        return Ok(if gzip {
            Box::new(Threaded::new(flate2::read::MultiGzDecoder::new(raw)))
        } else {
            Box::new(Threaded::new(bzip2::read::MultiBzDecoder::new(raw)))
        });
    }
    // Plain text: read(2) on the input thread too, so that the parsing
    // thread only parses. (A memory map was measured: no faster here, and it
    // counts the whole file in the resident set.)
    Ok(Box::new(Threaded::new(Counted { file, read: 0, bar })))
}
