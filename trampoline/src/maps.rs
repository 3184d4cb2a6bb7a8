//! The process memory map: parsing `/proc/self/maps` and answering "which
//! mapping holds this address" and "where is a free range within reach".
//!
//! Owns: the parser (pure, tested on recorded text) and the free-gap search
//! (pure). Must never: map or protect memory (that is `nearmem`/`patch`).

/// One line of `/proc/self/maps`.
use std::sync::Arc;
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub path: String,
}

/// Parse the text of `/proc/<pid>/maps`. Lines that do not parse are skipped.
///
/// Byte by byte: a profiled process parses its maps at start-up, and a
/// parser built on `split_whitespace` and `from_str_radix` took about
/// 2,700 instructions a line.
pub fn parse(text: &str) -> Vec<Mapping> {
    let mut out = Vec::with_capacity(text.len() / 64);
    for line in text.as_bytes().split(|&b| b == b'\n') {
        if let Some(m) = parse_line(line) {
            out.push(m);
        }
    }
    // The kernel lists mappings in address order; sort only if not.
    if !out.is_sorted_by_key(|m| m.start) {
        out.sort_by_key(|m| m.start);
    }
    out
}

/// One line: `start-end perms offset dev inode [path]`.
fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut at = 0;
    let start = hex(line, &mut at)?;
    if line.get(at) != Some(&b'-') {
        return None;
    }
    at += 1;
    let end = hex(line, &mut at)?;
    let mut fields = fields_from(line, at).into_iter();
    let perms = fields.next().flatten()?;
    if perms.len() < 3 {
        return None;
    }
    // Fields 3..5 are offset, dev, inode; the rest of the line (which may
    // contain spaces) is the path.
    let rest = fields.nth(3).flatten().unwrap_or(&[]);
    let path = core::str::from_utf8(rest.trim_ascii()).ok()?.to_string();
    Some(Mapping {
        start,
        end,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        path,
    })
}

/// A hexadecimal number at `line[*at..]` (at least one digit), `*at` moved
/// past it.
fn hex(line: &[u8], at: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    let first = *at;
    while let Some(&c) = line.get(*at) {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => break,
        };
        v = v.checked_mul(16)?.checked_add(d as u64)?;
        *at += 1;
    }
    (*at > first).then_some(v)
}

/// After the range at `line[at..]`: the permissions, offset, dev and inode
/// fields, then the rest of the line, which is the path with its leading
/// blanks (None from where the line ends).
fn fields_from(line: &[u8], mut at: usize) -> [Option<&[u8]>; 5] {
    let mut out = [None; 5];
    for slot in out.iter_mut().take(4) {
        while line.get(at).is_some_and(|c| c.is_ascii_whitespace()) {
            at += 1;
        }
        let begin = at;
        while line.get(at).is_some_and(|c| !c.is_ascii_whitespace()) {
            at += 1;
        }
        if at == begin {
            return out;
        }
        *slot = Some(&line[begin..at]);
    }
    out[4] = Some(&line[at..]);
    out
}

/// Read and parse `/proc/self/maps`.
///
/// Inside [`batch`] the first read is kept and served again (shared, not
/// copied: a copy of a process's mappings with their paths was a third of
/// every profiled process's start-up allocations) until [`invalidate`]
/// (the trampoline calls it whenever it maps memory itself).
pub fn read_self() -> std::io::Result<Arc<Vec<Mapping>>> {
    let mut b = BATCH.lock().unwrap_or_else(|e| e.into_inner());
    if b.depth > 0 {
        if let Some(m) = &b.snapshot {
            return Ok(m.clone());
        }
    }
    let m = Arc::new(parse(&read_proc_text("/proc/self/maps")?));
    if b.depth > 0 {
        b.snapshot = Some(m.clone());
    }
    Ok(m)
}

/// The text of a /proc file, read in a few large reads: a /proc file says
/// its size is 0, so `fs::read_to_string` starts with a 32-byte read and
/// doubles (9 system calls for a small process's maps, each making the
/// kernel walk the mappings again).
fn read_proc_text(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(32 * 1024);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// [`read_self`] after [`invalidate`]: for a caller that did not find what
/// it looked for in a batch's snapshot (something was mapped since).
pub fn read_self_fresh() -> std::io::Result<Arc<Vec<Mapping>>> {
    invalidate();
    read_self()
}

struct Batch {
    depth: u32,
    snapshot: Option<Arc<Vec<Mapping>>>,
}

static BATCH: std::sync::Mutex<Batch> = std::sync::Mutex::new(Batch {
    depth: 0,
    snapshot: None,
});

/// Runs `f` (a series of hook installations) reading `/proc/self/maps` at
/// most once, instead of three times per hook: a process's maps are
/// hundreds of lines, and start-up cost counts in every profiled process.
/// Code mappings do not move while `f` runs; what the trampoline maps
/// itself invalidates the snapshot, and a look-up that misses in it reads
/// the maps again.
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    let _held = hold();
    f()
}

/// [`batch`] as a guard: reads of the maps share one snapshot until it is
/// dropped (for a caller whose series of look-ups does not fit one
/// closure).
pub fn hold() -> Held {
    BATCH.lock().unwrap_or_else(|e| e.into_inner()).depth += 1;
    Held(())
}

/// A [`batch`] under way; see [`hold`].
pub struct Held(());

impl Drop for Held {
    fn drop(&mut self) {
        let mut b = BATCH.lock().unwrap_or_else(|e| e.into_inner());
        b.depth -= 1;
        if b.depth == 0 {
            b.snapshot = None;
        }
    }
}

/// The trampoline mapped `start..end` itself (with these permissions):
/// a batch's snapshot gains it instead of being read again (a profiled
/// process maps a few trampoline pages at start-up, and each fresh read of
/// the maps cost it more than the page did).
pub fn note_mapped(start: u64, end: u64, read: bool, write: bool, exec: bool) {
    let mut b = BATCH.lock().unwrap_or_else(|e| e.into_inner());
    let Some(old) = &b.snapshot else { return };
    let at = old.partition_point(|m| m.start < start);
    let overlaps =
        old.get(at).is_some_and(|m| m.start < end) || (at > 0 && old[at - 1].end > start);
    if overlaps {
        b.snapshot = None;
        return;
    }
    let mut v = Vec::with_capacity(old.len() + 1);
    v.extend_from_slice(&old[..at]);
    v.push(Mapping {
        start,
        end,
        read,
        write,
        exec,
        path: String::new(),
    });
    v.extend_from_slice(&old[at..]);
    b.snapshot = Some(Arc::new(v));
}

/// Drops the snapshot of the current [`batch`], if any.
pub fn invalidate() {
    BATCH.lock().unwrap_or_else(|e| e.into_inner()).snapshot = None;
}

/// The mapping containing `addr`.
pub fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    maps.iter().find(|m| m.start <= addr && addr < m.end)
}

/// A free, page-aligned range of `len` bytes whose every byte lies within
/// `reach` of `near` (signed distance in `[-reach, reach)`), as close to
/// `near` as possible. `low` is the lowest address to consider (e.g.
/// `vm.mmap_min_addr`). `maps` must be sorted (as [`parse`] returns it).
pub fn free_near(
    maps: &[Mapping],
    near: u64,
    reach: u64,
    len: u64,
    page: u64,
    low: u64,
) -> Option<u64> {
    let lo_bound = near.saturating_sub(reach).max(low);
    let lo_bound = (lo_bound + page - 1) & !(page - 1);
    // Highest usable end: the last byte must satisfy addr - near < reach.
    let hi_bound = near.saturating_add(reach - 1).min(0x7fff_ffff_f000);
    let mut best: Option<u64> = None;
    let mut consider = |gap_start: u64, gap_end: u64| {
        let s = gap_start.max(lo_bound);
        let e = gap_end.min(hi_bound & !(page - 1));
        if e <= s || e - s < len {
            return;
        }
        // Closest candidate in [s, e - len] to `near`.
        let cand = if near <= s {
            s
        } else if near >= e - len {
            (e - len) & !(page - 1)
        } else {
            near & !(page - 1)
        };
        let dist = |x: u64| x.abs_diff(near);
        if best.is_none_or(|b| dist(cand) < dist(b)) {
            best = Some(cand);
        }
    };
    let mut prev_end = 0u64;
    for m in maps {
        if m.start > prev_end {
            consider(prev_end, m.start);
        }
        prev_end = prev_end.max(m.end);
    }
    consider(prev_end, u64::MAX);
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
555555554000-555555556000 r--p 00000000 08:01 131 /usr/bin/cat
555555556000-55555555a000 r-xp 00002000 08:01 131 /usr/bin/cat
7ffff7dd3000-7ffff7df9000 r--p 00000000 08:01 200 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffff7df9000-7ffff7f4e000 r-xp 00026000 08:01 200 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffff7ffd000-7ffff7fff000 rw-p 00000000 00:00 0 
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn a_page_mapped_in_a_batch_joins_its_snapshot() {
        batch(|| {
            let before = read_self().unwrap();
            // A range no mapping holds: below the lowest one.
            let lo = before[0].start;
            assert!(lo > 0x20000);
            note_mapped(lo - 0x2000, lo - 0x1000, true, false, true);
            let after = read_self().unwrap();
            assert_eq!(after.len(), before.len() + 1);
            let m = find(&after, lo - 0x1800).unwrap();
            assert!(m.read && m.exec && !m.write);
            assert!(!Arc::ptr_eq(&before, &after));
            // One that overlaps what is known drops the snapshot.
            note_mapped(lo - 0x1800, lo + 0x1000, true, false, true);
            let fresh = read_self().unwrap();
            assert!(
                find(&fresh, lo - 0x1800).is_none(),
                "read again from the kernel"
            );
        });
    }

    #[test]
    fn parses_lines() {
        let m = parse(SAMPLE);
        assert_eq!(m.len(), 6);
        assert_eq!(m[1].start, 0x555555556000);
        assert!(m[1].exec && !m[1].write && m[1].read);
        assert_eq!(m[2].path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(m[4].path, "");
        assert_eq!(m[5].path, "[stack]");
        assert_eq!(find(&m, 0x7ffff7e00000).unwrap().start, 0x7ffff7df9000);
        assert!(find(&m, 0x1000).is_none());
    }

    #[test]
    fn odd_lines_are_skipped_and_paths_keep_their_spaces() {
        let text = "garbage\n\
            1000-2000 r-xp 00000000 08:01 1 /opt/my app/lib x.so\n\
            3000-4000\n\
            5000-6000 rw\n\
            7000-8000 rw-p 00000000 00:00 0\n\
            zz-9000 r--p 0 0 0 /x\n\
            a000-b000 ---p 00000000 00:00 0 \n";
        let m = parse(text);
        let got: Vec<_> = m
            .iter()
            .map(|m| (m.start, m.end, m.path.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x2000, "/opt/my app/lib x.so"),
                (0x7000, 0x8000, ""),
                (0xa000, 0xb000, ""),
            ]
        );
        assert!(m[0].exec && !m[0].write);
        assert!(!m[2].read && !m[2].write && !m[2].exec);
    }

    #[test]
    fn this_process_maps_parse_as_before() {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let m = parse(&text);
        assert_eq!(m.len(), text.lines().count());
        for (m, line) in m.iter().zip(text.lines()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (a, b) = f[0].split_once('-').unwrap();
            assert_eq!(m.start, u64::from_str_radix(a, 16).unwrap());
            assert_eq!(m.end, u64::from_str_radix(b, 16).unwrap());
            assert_eq!(m.path, f[5..].join(" "), "{line}");
            assert_eq!(m.exec, f[1].as_bytes()[2] == b'x');
        }
    }

    #[test]
    fn free_gap_within_reach() {
        let m = parse(SAMPLE);
        let page = 0x1000;
        // Right below libc's first page is free.
        let near = 0x7ffff7df9000;
        let got = free_near(&m, near, 1 << 31, page, page, 0x10000).unwrap();
        assert_eq!(got, 0x7ffff7dd2000);
        // Tiny reach: only the 0x2000 bytes between libc and the rw mapping qualify.
        let near = 0x7ffff7f4e000;
        let got = free_near(&m, near, 0x10000, page, page, 0x10000).unwrap();
        assert_eq!(got, 0x7ffff7f4e000);
        // Reach too small to leave the mapped block at all.
        let near = 0x7ffff7e80000;
        assert_eq!(free_near(&m, near, 0x1000, page, page, 0x10000), None);
        // Every byte of the result is within reach.
        let near = 0x555555558000;
        let reach = 0x100000;
        let got = free_near(&m, near, reach, page, page, 0x10000).unwrap();
        assert!(got.abs_diff(near) <= reach && (got + page - 1).abs_diff(near) <= reach);
    }
}
