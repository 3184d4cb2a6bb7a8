//! Objects whose symbol table an earlier process read and found no
//! allocator entry point in ([`super::fronts`]), kept between processes:
//! a program with a large `.symtab` (a node built with its symbols:
//! 110,000 of them in 10 MB of tables, 12.9 ms of every profiled
//! `node -e 0`) is read once per machine instead of once per process.
//!
//! Owns the table `scans-<build-id of this libigprof.so>` in the
//! descriptor store's directory (`unwind/store.rs`, whose `IGPROF_CACHE_DIR`
//! and `none` it follows): a list of objects' GNU build-ids. It is named
//! by the library's build, since which names are entry points may change
//! from one build to the next; an object without a build-id is always
//! read. Only objects found to hold none are listed: one that holds entry
//! points is read by every process, as it must hook them.
//!
//! Must never: answer for an object it was not told of by its build-id,
//! run in a signal handler (files, allocation), or stop the program when
//! the table cannot be read or written.

use std::sync::Mutex;

use crate::unwind::store;

const MAGIC: &[u8; 8] = b"IGPRSCN1";
/// The most bytes the table is read up to (thousands of objects).
const MAX_TABLE: usize = 64 << 10;

struct Known {
    /// The table was read (or could not be).
    loaded: bool,
    ids: Vec<Vec<u8>>,
    /// Build-ids found by this process, not in the table yet.
    new: Vec<Vec<u8>>,
}

static KNOWN: Mutex<Known> = Mutex::new(Known {
    loaded: false,
    ids: Vec::new(),
    new: Vec::new(),
});

fn known() -> std::sync::MutexGuard<'static, Known> {
    KNOWN.lock().unwrap_or_else(|e| e.into_inner())
}

fn file() -> Option<String> {
    crate::hook::plans::own_file("scans")
}

/// The table's build-ids (a damaged or foreign table: those before the
/// damage, or none).
fn parse(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut ids = Vec::new();
    let Some(mut rest) = bytes.strip_prefix(MAGIC) else {
        return ids;
    };
    while let Some((&len, after)) = rest.split_first() {
        let len = len as usize;
        if len == 0 || after.len() < len {
            break;
        }
        ids.push(after[..len].to_vec());
        rest = &after[len..];
    }
    ids
}

fn encode(ids: &[Vec<u8>]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for id in ids.iter().filter(|id| !id.is_empty() && id.len() <= 255) {
        out.push(id.len() as u8);
        out.extend(id);
    }
    out
}

fn read_table() -> Vec<Vec<u8>> {
    let bytes = file().and_then(|name| {
        let dir = store::open_dir(false)?.ok()?;
        dir.read(&name, MAX_TABLE).ok()
    });
    bytes.map_or_else(Vec::new, |b| parse(&b))
}

/// Whether an earlier process found no allocator entry point in the
/// symbol table of the object with build-id `id` (the table is read on
/// the first question).
pub fn holds_none(id: &[u8]) -> bool {
    let mut k = known();
    if !k.loaded {
        k.loaded = true;
        k.ids = read_table();
    }
    k.ids.iter().chain(&k.new).any(|i| i == id)
}

/// The symbol table of the object with build-id `id` holds no allocator
/// entry point: kept for the next [`save`].
pub fn remember(id: &[u8]) {
    let mut k = known();
    if !id.is_empty() && !k.ids.iter().chain(&k.new).any(|i| i == id) {
        k.new.push(id.to_vec());
    }
}

/// Adds what this process found to the table (read again first: other
/// processes may have added theirs), making the store's directory where
/// it is missing. Returns whether it wrote, or why it could not.
pub fn save() -> Result<bool, String> {
    let mut k = known();
    if k.new.is_empty() {
        return Ok(false);
    }
    let Some(name) = file() else {
        return Ok(false);
    };
    let mut ids = read_table();
    let new = std::mem::take(&mut k.new);
    for id in new {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    // The newest last; a full table drops its oldest.
    while encode(&ids).len() > MAX_TABLE {
        ids.remove(0);
    }
    k.ids.clone_from(&ids);
    let dir = match store::open_dir(true) {
        None => return Ok(false),
        Some(Err(e)) => {
            return Err(format!(
                "{}: {e}",
                store::dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            ))
        }
        Some(Ok(d)) => d,
    };
    dir.write(&name, &encode(&ids))
        .map(|()| true)
        .map_err(|e| format!("{}/{name}: {e}", dir.path().display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_back_what_was_written_and_stops_at_damage() {
        let ids = vec![vec![1u8; 20], vec![2u8; 8], vec![3u8; 20]];
        assert_eq!(parse(&encode(&ids)), ids);
        let mut b = encode(&ids);
        b.truncate(b.len() - 1);
        assert_eq!(parse(&b), ids[..2], "a cut last entry");
        assert!(parse(b"IGPRPLN1\x01\x01").is_empty(), "another table");
        assert!(parse(&[]).is_empty());
        let mut z = encode(&ids[..1]);
        z.push(0);
        z.extend([9; 4]);
        assert_eq!(parse(&z), ids[..1], "a zero length ends it");
    }
}
