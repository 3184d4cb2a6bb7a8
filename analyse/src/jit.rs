//! Names of JIT code from the files runtimes write for perf: the perf map
//! (`perf-PID.map`: one `START SIZE NAME` line per function, hexadecimal,
//! written by node `--perf-basic-prof`, the JVM's `-XX:+DumpPerfMapAtExit`,
//! Python's `-X perf`, .NET's `DOTNET_PerfMapEnabled`) and the jitdump
//! (`jit-PID.dump`, the binary format of the Linux tree's
//! `tools/perf/Documentation/jitdump-specification.txt`: a header, then
//! records; code loads and moves give names, debug-info records source
//! lines).
//!
//! Owns: reading both formats ([`JitMap::perf_map`], [`JitMap::jitdump`]),
//! looking an address up (a later entry wins where entries overlap, as perf
//! lets a newer map replace an older one), and deciding which files belong
//! to a profiled process ([`find`]): searched next to the profile, then in
//! `/tmp`, or given with `--jit-map FILE|DIR`.
//!
//! Must never: give a name from a file it cannot tie to the process. A
//! file that is damaged, cut short, written for another pid, or written
//! outside the process's life (another process with the same pid, before
//! or after it) is left out whole, with one warning saying why; the
//! addresses keep their raw names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Functions of JIT code at their run-time addresses, from one or more
/// files of one process.
#[derive(Debug, Default)]
pub struct JitMap {
    /// start -> (end, index in `names`); ranges never overlap.
    ranges: BTreeMap<u64, (u64, u32)>,
    names: Vec<String>,
    /// The file each name came from (index in `sources`).
    origin: Vec<u32>,
    sources: Vec<String>,
    /// (address, line, index in `files`) from jitdump debug info, sorted.
    lines: Vec<(u64, u32, u32)>,
    files: Vec<String>,
}

/// A name found for an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'a> {
    pub name: &'a str,
    /// The file that named it (shown as the function's object).
    pub source: &'a str,
    /// Source file and line, when a jitdump gave them.
    pub line: Option<(&'a str, u32)>,
}

/// Why a file is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapError {
    Unreadable(String),
    /// Ends part-way through a line or record.
    Truncated,
    /// Not in the format (the reason).
    Malformed(String),
    /// A jitdump whose header names another process.
    OtherPid(u64),
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapError::Unreadable(e) => write!(f, "cannot be read ({e})"),
            MapError::Truncated => write!(f, "is cut short (its writer did not finish it)"),
            MapError::Malformed(why) => write!(f, "is damaged: {why}"),
            MapError::OtherPid(p) => write!(f, "was written by process {p}"),
        }
    }
}

/// The jitdump header's magic, "JiTD" as a little-endian u32 read.
const JITDUMP_MAGIC: u32 = 0x4A69_5444;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
const JIT_CODE_DEBUG_INFO: u32 = 2;
const JIT_CODE_CLOSE: u32 = 3;

fn hex(s: &str) -> Option<u64> {
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if s.is_empty() {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// Little- or big-endian fields of a jitdump.
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
    big: bool,
}

impl Bytes<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], MapError> {
        let end = self.pos.checked_add(n).ok_or(MapError::Truncated)?;
        let s = self.data.get(self.pos..end).ok_or(MapError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, MapError> {
        let b: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
        Ok(if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }
    fn u64(&mut self) -> Result<u64, MapError> {
        let b: [u8; 8] = self.take(8)?.try_into().expect("8 bytes");
        Ok(if self.big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }
    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String, MapError> {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| MapError::Malformed("a name without its NUL".into()))?;
        let s = String::from_utf8_lossy(&rest[..nul]).into_owned();
        self.pos += nul + 1;
        Ok(s)
    }
}

impl JitMap {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Adds a function; where it overlaps earlier ones, it replaces them.
    fn insert(&mut self, start: u64, size: u64, name: String, source: u32) {
        let end = start.saturating_add(size.max(1));
        let mut cut: Vec<(u64, u64, u32)> = Vec::new();
        for (&s, &(e, n)) in self.ranges.range(..end).rev() {
            if e <= start {
                break;
            }
            cut.push((s, e, n));
        }
        for (s, e, n) in cut {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start, n));
            }
            if e > end {
                self.ranges.insert(end, (e, n));
            }
        }
        let id = self.names.len() as u32;
        self.names.push(name);
        self.origin.push(source);
        self.ranges.insert(start, (end, id));
    }

    fn source(&mut self, path: &Path) -> u32 {
        self.sources.push(path.to_string_lossy().into_owned());
        self.sources.len() as u32 - 1
    }

    /// Reads a perf map's lines `START SIZE NAME` (hexadecimal, with or
    /// without `0x`) into the map.
    pub fn perf_map(&mut self, data: &[u8], path: &Path) -> Result<(), MapError> {
        if data.last().is_some_and(|&b| b != b'\n') {
            return Err(MapError::Truncated);
        }
        let text = String::from_utf8_lossy(data);
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.is_empty() {
                continue;
            }
            let mut parts = line.splitn(3, ' ');
            let (start, size, name) = (parts.next(), parts.next(), parts.next());
            match (start.and_then(hex), size.and_then(hex), name) {
                (Some(s), Some(z), Some(n)) if !n.is_empty() => entries.push((s, z, n.to_string())),
                _ => {
                    return Err(MapError::Malformed(format!(
                        "line {} is not 'START SIZE NAME'",
                        i + 1
                    )))
                }
            }
        }
        let src = self.source(path);
        for (s, z, n) in entries {
            self.insert(s, z, n, src);
        }
        Ok(())
    }

    /// Reads a jitdump written by process `pid` into the map.
    pub fn jitdump(&mut self, data: &[u8], pid: u64, path: &Path) -> Result<(), MapError> {
        let magic = data
            .get(..4)
            .map(|m| u32::from_le_bytes(m.try_into().expect("4 bytes")))
            .ok_or(MapError::Truncated)?;
        let big = if magic == JITDUMP_MAGIC {
            false
        } else if magic.swap_bytes() == JITDUMP_MAGIC {
            true
        } else {
            return Err(MapError::Malformed("no JiTD magic".into()));
        };
        let mut b = Bytes { data, pos: 4, big };
        let version = b.u32()?;
        let header_size = b.u32()? as usize;
        let _elf_mach = b.u32()?;
        let _pad = b.u32()?;
        let file_pid = b.u32()? as u64;
        if version != 1 {
            return Err(MapError::Malformed(format!("version {version}")));
        }
        if header_size < 40 {
            return Err(MapError::Malformed(format!(
                "header of {header_size} bytes"
            )));
        }
        if file_pid != pid {
            return Err(MapError::OtherPid(file_pid));
        }
        b.pos = header_size;
        if b.pos > data.len() {
            return Err(MapError::Truncated);
        }
        // code index -> (address, size, name) of loaded code, for moves.
        let mut loaded: std::collections::HashMap<u64, (u64, u64, String)> = Default::default();
        let mut functions: Vec<(u64, u64, String)> = Vec::new();
        let mut lines: Vec<(u64, u32, String)> = Vec::new();
        while b.pos < data.len() {
            let start = b.pos;
            let id = b.u32()?;
            let size = b.u32()? as usize;
            let _timestamp = b.u64()?;
            if size < 16 {
                return Err(MapError::Malformed(format!(
                    "a record of {size} bytes at offset {start}"
                )));
            }
            let end = start.checked_add(size).ok_or(MapError::Truncated)?;
            if end > data.len() {
                return Err(MapError::Truncated);
            }
            let mut r = Bytes {
                data: &data[..end],
                pos: b.pos,
                big,
            };
            match id {
                JIT_CODE_LOAD => {
                    let _pid = r.u32()?;
                    let _tid = r.u32()?;
                    let _vma = r.u64()?;
                    let addr = r.u64()?;
                    let code_size = r.u64()?;
                    let index = r.u64()?;
                    let name = r.string()?;
                    loaded.insert(index, (addr, code_size, name.clone()));
                    functions.push((addr, code_size, name));
                }
                JIT_CODE_MOVE => {
                    let _pid = r.u32()?;
                    let _tid = r.u32()?;
                    let _vma = r.u64()?;
                    let _old = r.u64()?;
                    let new = r.u64()?;
                    let code_size = r.u64()?;
                    let index = r.u64()?;
                    if let Some((_, _, name)) = loaded.get(&index) {
                        functions.push((new, code_size, name.clone()));
                    }
                }
                JIT_CODE_DEBUG_INFO => {
                    let _code = r.u64()?;
                    let n = r.u64()?;
                    for _ in 0..n {
                        let addr = r.u64()?;
                        let line = r.u32()?;
                        let _discriminator = r.u32()?;
                        lines.push((addr, line, r.string()?));
                    }
                }
                JIT_CODE_CLOSE => break,
                // Unwinding information and records of later versions.
                _ => {}
            }
            b.pos = end;
        }
        let src = self.source(path);
        for (a, z, n) in functions {
            self.insert(a, z, n, src);
        }
        for (addr, line, file) in lines {
            let f = match self.files.iter().position(|x| *x == file) {
                Some(f) => f,
                None => {
                    self.files.push(file);
                    self.files.len() - 1
                }
            };
            self.lines.push((addr, line, f as u32));
        }
        self.lines.sort_unstable();
        Ok(())
    }

    /// The function at `addr`, if a file named one there.
    pub fn lookup(&self, addr: u64) -> Option<Found<'_>> {
        let (&start, &(end, n)) = self.ranges.range(..=addr).next_back()?;
        if addr >= end {
            return None;
        }
        let i = self.lines.partition_point(|l| l.0 <= addr);
        let line = i
            .checked_sub(1)
            .map(|i| self.lines[i])
            .filter(|l| l.0 >= start)
            .map(|(_, line, f)| (self.files[f as usize].as_str(), line));
        Some(Found {
            name: &self.names[n as usize],
            source: &self.sources[self.origin[n as usize] as usize],
            line,
        })
    }
}

/// Where the maps of a process are looked for.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// `--jit-map`: files (used for every process, as they are) and
    /// directories (searched for each process's files, checked); when
    /// empty, the profile's directory and then `/tmp` are searched.
    pub given: Vec<PathBuf>,
}

/// The process a profile was taken of, as its header tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Process {
    pub pid: u64,
    /// When it started and when the profile was written (header notes).
    pub started: Option<Duration>,
    pub dumped: Option<Duration>,
    /// The directory the profile is in.
    pub dir: PathBuf,
}

/// How far a file's time may fall outside the process's life and still
/// be its (file times are kept by a coarse clock).
const SLACK: Duration = Duration::from_millis(100);
/// After the profile: a runtime still writing its map while the profile
/// was being written.
const SLACK_AFTER: Duration = Duration::from_secs(2);

/// The system-wide directory runtimes write their maps into.
const SYSTEM_DIR: &str = "/tmp";

/// Why a file found for the process is not its own, if it is not.
fn foreign(file: &Path, p: &Process, system_dir: bool) -> Option<String> {
    let Some(started) = p.started else {
        return Some(format!(
            "the profile does not say when process {} started (an older profile), so it may \
             be another process's with the same pid; pass it with --jit-map to use it",
            p.pid
        ));
    };
    let mtime = std::fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?;
    if mtime + SLACK < started {
        return Some(format!(
            "it was last written before process {} started: another process with the same \
             pid left it",
            p.pid
        ));
    }
    if let (true, Some(dumped)) = (system_dir, p.dumped) {
        if mtime > dumped + SLACK_AFTER {
            return Some(format!(
                "it was written after the profile was, maybe by another process with the same \
                 pid; if it is process {}'s, pass it with --jit-map",
                p.pid
            ));
        }
    }
    None
}

/// The perf map and jitdump of process `p`, each with the checks that
/// apply to it (`true`: found by search, must belong to the process's
/// life; `false`: given as a file, used as it is), and whether it was
/// found in the system directory.
fn candidates(search: &Search, p: &Process) -> Vec<(PathBuf, bool, bool)> {
    let names = [format!("perf-{}.map", p.pid), format!("jit-{}.dump", p.pid)];
    let mut out = Vec::new();
    if search.given.is_empty() {
        for name in &names {
            let found = [(p.dir.clone(), false), (PathBuf::from(SYSTEM_DIR), true)]
                .into_iter()
                .map(|(d, sys)| (d.join(name), sys))
                .find(|(f, _)| f.is_file());
            if let Some((f, sys)) = found {
                out.push((f, true, sys));
            }
        }
        return out;
    }
    for g in &search.given {
        if g.is_dir() {
            for name in &names {
                let f = g.join(name);
                if f.is_file() {
                    out.push((f, true, false));
                }
            }
        } else if !for_other_pid(g, p.pid) {
            out.push((g.clone(), false, false));
        }
    }
    out
}

/// A file named `perf-N.map` or `jit-N.dump` for a pid N other than `pid`.
fn for_other_pid(file: &Path, pid: u64) -> bool {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let n = name
        .strip_prefix("perf-")
        .and_then(|r| r.strip_suffix(".map"))
        .or_else(|| {
            name.strip_prefix("jit-")
                .and_then(|r| r.strip_suffix(".dump"))
        });
    n.and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n != pid)
}

/// True for a jitdump (by its magic), else a perf map.
fn is_jitdump(data: &[u8]) -> bool {
    data.get(..4).is_some_and(|m| {
        let m = u32::from_le_bytes(m.try_into().expect("4 bytes"));
        m == JITDUMP_MAGIC || m.swap_bytes() == JITDUMP_MAGIC
    })
}

/// The JIT map of process `p` (None when no file could be used), and one
/// warning per file left out or, when none was found, one saying so.
pub fn find(search: &Search, p: &Process) -> (Option<JitMap>, Vec<String>) {
    let mut map = JitMap::default();
    let mut warnings = Vec::new();
    let mut used = 0;
    let found = candidates(search, p);
    for (file, checked, system_dir) in &found {
        let shown = file.display();
        if *checked {
            if let Some(why) = foreign(file, p, *system_dir) {
                warnings.push(format!("{shown} is not used: {why}"));
                continue;
            }
        }
        let data = match std::fs::read(file) {
            Ok(d) => d,
            Err(e) => {
                warnings.push(format!(
                    "{shown} is not used: {}",
                    MapError::Unreadable(e.to_string())
                ));
                continue;
            }
        };
        let read = if is_jitdump(&data) {
            map.jitdump(&data, p.pid, file)
        } else {
            map.perf_map(&data, file)
        };
        match read {
            Ok(()) => used += 1,
            Err(e) => warnings.push(format!("{shown} is not used: it {e}")),
        }
    }
    if found.is_empty() {
        let wher = if search.given.is_empty() {
            format!("{} or {SYSTEM_DIR}", p.dir.display())
        } else {
            "the --jit-map paths".to_string()
        };
        warnings.push(format!(
            "process {}: code outside any object (JIT code) keeps its addresses: no \
             perf-{0}.map or jit-{0}.dump in {wher} (run the program with its runtime's perf \
             map option, or give the map with --jit-map FILE|DIR)",
            p.pid
        ));
    }
    ((used > 0).then_some(map), warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jitdump(pid: u32, records: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut d = Vec::new();
        for v in [JITDUMP_MAGIC, 1, 40, 62, 0, pid] {
            d.extend(v.to_le_bytes());
        }
        d.extend(0u64.to_le_bytes());
        d.extend(0u64.to_le_bytes());
        for (id, body) in records {
            d.extend(id.to_le_bytes());
            d.extend((16 + body.len() as u32).to_le_bytes());
            d.extend(0u64.to_le_bytes());
            d.extend(body);
        }
        d
    }

    fn load(addr: u64, size: u64, index: u64, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(7u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        for v in [addr, addr, size, index] {
            b.extend(v.to_le_bytes());
        }
        b.extend(name.as_bytes());
        b.push(0);
        b.extend([0xc3u8; 4]);
        b
    }

    #[test]
    fn perf_maps_name_ranges_and_later_entries_win() {
        let mut m = JitMap::default();
        let text = b"1000 100 LazyCompile:*hot /x.js:3\n0x1080 0x10 Interpreted f\n2000 10 g\n";
        m.perf_map(text, Path::new("/tmp/perf-1.map")).unwrap();
        let name = |a| m.lookup(a).map(|f| f.name.to_string());
        assert_eq!(name(0x1000).as_deref(), Some("LazyCompile:*hot /x.js:3"));
        assert_eq!(name(0x107f).as_deref(), Some("LazyCompile:*hot /x.js:3"));
        assert_eq!(name(0x1080).as_deref(), Some("Interpreted f"));
        assert_eq!(name(0x1090).as_deref(), Some("LazyCompile:*hot /x.js:3"));
        assert_eq!(name(0x10ff).as_deref(), Some("LazyCompile:*hot /x.js:3"));
        assert_eq!(name(0x1100), None);
        assert_eq!(name(0x2009).as_deref(), Some("g"));
        assert_eq!(name(0xfff), None);
        assert_eq!(m.lookup(0x2000).unwrap().source, "/tmp/perf-1.map");
        let mut bad = JitMap::default();
        assert_eq!(
            bad.perf_map(b"1000 100 f\n2000", Path::new("m")),
            Err(MapError::Truncated)
        );
        assert!(matches!(
            bad.perf_map(b"1000 f\n", Path::new("m")),
            Err(MapError::Malformed(_))
        ));
        assert!(bad.is_empty());
    }

    #[test]
    fn jitdumps_give_loads_moves_and_lines() {
        let mut debug = Vec::new();
        debug.extend(0x5000u64.to_le_bytes());
        debug.extend(2u64.to_le_bytes());
        for (a, l, f) in [(0x5000u64, 10u32, "a.js"), (0x5010, 12, "a.js")] {
            debug.extend(a.to_le_bytes());
            debug.extend(l.to_le_bytes());
            debug.extend(0u32.to_le_bytes());
            debug.extend(f.as_bytes());
            debug.push(0);
        }
        let mut mv = Vec::new();
        mv.extend(7u32.to_le_bytes());
        mv.extend(7u32.to_le_bytes());
        for v in [0x6000u64, 0x6000, 0x7000, 0x20, 2] {
            mv.extend(v.to_le_bytes());
        }
        let d = jitdump(
            7,
            &[
                (JIT_CODE_DEBUG_INFO, debug),
                (JIT_CODE_LOAD, load(0x5000, 0x40, 1, "hot")),
                (JIT_CODE_LOAD, load(0x6000, 0x20, 2, "moved")),
                (JIT_CODE_MOVE, mv),
                (4, vec![0; 8]),
            ],
        );
        let mut m = JitMap::default();
        m.jitdump(&d, 7, Path::new("jit-7.dump")).unwrap();
        let f = m.lookup(0x5014).unwrap();
        assert_eq!((f.name, f.line), ("hot", Some(("a.js", 12))));
        assert_eq!(m.lookup(0x5004).unwrap().line, Some(("a.js", 10)));
        assert_eq!(m.lookup(0x7010).unwrap().name, "moved");
        assert_eq!(m.lookup(0x7010).unwrap().line, None);
        assert_eq!(m.lookup(0x5040), None);
        // Another pid, a record cut short, a damaged header.
        let mut other = JitMap::default();
        assert_eq!(
            other.jitdump(&d, 8, Path::new("x")),
            Err(MapError::OtherPid(7))
        );
        assert_eq!(
            other.jitdump(&d[..d.len() - 3], 7, Path::new("x")),
            Err(MapError::Truncated)
        );
        assert_eq!(
            other.jitdump(&d[..20], 7, Path::new("x")),
            Err(MapError::Truncated)
        );
        assert!(matches!(
            other.jitdump(b"JUNKJUNKJUNK", 7, Path::new("x")),
            Err(MapError::Malformed(_))
        ));
        assert!(is_jitdump(&d) && !is_jitdump(b"1000 10 f\n"));
    }

    #[test]
    fn given_files_named_for_another_pid_are_not_used() {
        assert!(for_other_pid(Path::new("/x/perf-12.map"), 13));
        assert!(!for_other_pid(Path::new("/x/perf-12.map"), 12));
        assert!(for_other_pid(Path::new("jit-12.dump"), 1));
        assert!(!for_other_pid(Path::new("saved.map"), 1));
    }

    #[test]
    fn files_outside_the_process_life_are_foreign() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("perf-5.map");
        std::fs::write(&f, b"10 10 f\n").unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let p = |started: Option<Duration>, dumped: Option<Duration>| Process {
            pid: 5,
            started,
            dumped,
            dir: dir.path().to_path_buf(),
        };
        let hour = Duration::from_secs(3600);
        assert_eq!(foreign(&f, &p(Some(now - hour), Some(now)), true), None);
        // Started after the file was written: another process's.
        assert!(foreign(&f, &p(Some(now + hour), None), false).is_some());
        // Written after the profile, in /tmp: maybe a later process's; next
        // to the profile (a copy), fine.
        let before = p(Some(now - 2 * hour), Some(now - hour));
        assert!(foreign(&f, &before, true).is_some());
        assert_eq!(foreign(&f, &before, false), None);
        // No start time: not checkable.
        assert!(foreign(&f, &p(None, None), false).is_some());
        let (map, warnings) = find(&Search::default(), &p(Some(now - hour), Some(now)));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(map.unwrap().lookup(0x12).unwrap().name, "f");
        let (map, warnings) = find(&Search::default(), &p(Some(now + hour), None));
        assert!(map.is_none());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }
}
