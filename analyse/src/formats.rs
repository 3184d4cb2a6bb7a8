//! Machine-readable outputs in IgProf's schemas: JSON (`-js`), SQL text for
//! sqlite3 (`-s`, what igprof-navigator's database is built from), and an
//! SQLite database file written directly (`--db FILE`).
//!
//! Owns: table layout and number formats of those outputs. Unlike IgProf,
//! strings are escaped (a `"` in a name would break IgProf's JSON and SQL),
//! and symbol/file ids are small integers instead of pointer values.
//! Must never: compute values (they come from `flat::rows`).

use crate::flat::MainRow;
use crate::profile::Profile;
use crate::text::Names;
use rustc_hash::FxHashMap;
use std::io::{self, Write};

fn pct(v: f32) -> String {
    if v == f32::MAX {
        "-101".to_string()
    } else {
        format!("{:7.2}", v as f64)
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn sql_str(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `-js`: IgProf's JSON layout.
pub fn json(
    out: &mut dyn Write,
    key: &str,
    totals: [i64; 2],
    tick: f32,
    rows: &[MainRow],
    p: &Profile,
    names: &dyn Names,
) -> io::Result<()> {
    writeln!(out, "{{")?;
    write!(
        out,
        "\"summary\": {{\n   \"counter\": {},\n   \"total_counts\": {},\n   \"total_freq\": {},\n   \"tick_period\": {:.6}\n}},\n",
        json_str(key),
        totals[0],
        totals[1],
        tick as f64
    )?;
    writeln!(out, "\"mainrows\": [")?;
    let mut sym_index: FxHashMap<u32, usize> = FxHashMap::default();
    let mut file_index: FxHashMap<u32, usize> = FxHashMap::default();
    let mut syms = Vec::new();
    let mut files = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let s = *sym_index.entry(r.sym).or_insert_with(|| {
            syms.push(r.sym);
            syms.len() - 1
        });
        let file = p.symbols.file(r.sym);
        let f = *file_index.entry(file).or_insert_with(|| {
            files.push(r.sym);
            files.len() - 1
        });
        if i > 0 {
            writeln!(out, ",")?;
        }
        write!(
            out,
            "[{}, {s}, {f}, {}, {}, {}, {}, {}, {}, {}, {}]",
            r.rank,
            r.self_,
            r.cum,
            r.kids,
            r.self_all[1],
            r.cum_all[1],
            r.self_all[2],
            r.cum_all[2],
            pct(r.pct)
        )?;
    }
    writeln!(out, "],\n\"files\": [")?;
    for (i, &s) in files.iter().enumerate() {
        if i > 0 {
            writeln!(out, ",")?;
        }
        write!(out, "{}", json_str(names.file(s)))?;
    }
    writeln!(out, "],\n \"symbols\": [")?;
    for (i, &s) in syms.iter().enumerate() {
        if i > 0 {
            writeln!(out, ",")?;
        }
        write!(out, "{}", json_str(names.name(s)))?;
    }
    for (title, callers) in [("callers", true), ("callees", false)] {
        writeln!(out, "],\n\"{title}\": [")?;
        let mut first = true;
        for r in rows {
            for e in if callers { &r.callers } else { &r.calls } {
                if !first {
                    writeln!(out, ",")?;
                }
                first = false;
                write!(
                    out,
                    "[{}, {}, {}, {}, {}, {}]",
                    r.rank,
                    e.rank,
                    e.self_counts,
                    e.self_calls,
                    e.self_paths,
                    pct(e.pct)
                )?;
            }
        }
    }
    writeln!(out, "]\n}}")
}

const SQL_SCHEMA: &str = "PRAGMA journal_mode=OFF;
PRAGMA count_changes=OFF;
DROP TABLE IF EXISTS files;
DROP TABLE IF EXISTS symbols;
DROP TABLE IF EXISTS mainrows;
DROP TABLE IF EXISTS children;
DROP TABLE IF EXISTS parents;
DROP TABLE IF EXISTS summary;

CREATE TABLE summary (
counter TEXT,
total_count INTEGER,
total_freq INTEGER,
tick_period REAL
);

CREATE TABLE files (
id,
name TEXT
);

CREATE TABLE symbols (
id,
name TEXT,
filename_id INTEGER CONSTRAINT file_id_exists REFERENCES files(id)
);

CREATE TABLE mainrows (
id INTEGER PRIMARY KEY,
symbol_id INTEGER CONSTRAINT symbol_id_exists REFERENCES symbols(id),
self_count INTEGER,
cumulative_count INTEGER,
kids INTEGER,
self_calls INTEGER,
total_calls INTEGER,
self_paths INTEGER,
total_paths INTEGER,
pct REAL
);

CREATE TABLE children (
self_id INTEGER CONSTRAINT self_exists REFERENCES mainrows(id),
parent_id INTEGER CONSTRAINT parent_exists REFERENCES mainrows(id),
from_parent_count INTEGER,
from_parent_calls INTEGER,
from_parent_paths INTEGER,
pct REAL
);

CREATE TABLE parents (
self_id INTEGER CONSTRAINT self_exists REFERENCES mainrows(id),
child_id INTEGER CONSTRAINT child_exists REFERENCES mainrows(id),
to_child_count INTEGER,
to_child_calls INTEGER,
to_child_paths INTEGER,
pct REAL
);
PRAGMA synchronous=OFF;

BEGIN TRANSACTION;
";

/// `-s`: the SQL text IgProf prints for `sqlite3` (igprof-navigator's schema).
pub fn sql(
    out: &mut dyn Write,
    key: &str,
    totals: [i64; 2],
    tick: f32,
    rows: &[MainRow],
    p: &Profile,
    names: &dyn Names,
) -> io::Result<()> {
    out.write_all(SQL_SCHEMA.as_bytes())?;
    writeln!(
        out,
        "INSERT INTO summary (counter, total_count, total_freq, tick_period) VALUES({}, {}, {}, {});\n",
        sql_str(key),
        totals[0],
        totals[1],
        tick
    )?;
    let mut files_done = rustc_hash::FxHashSet::default();
    let mut syms_done = rustc_hash::FxHashSet::default();
    // IgProf commits every 100000 inserts.
    let mut until_commit = 100_000u32;
    let mut bump = |out: &mut dyn Write| -> io::Result<()> {
        until_commit -= 1;
        if until_commit == 0 {
            until_commit = 100_000;
            write!(out, "END TRANSACTION;\nBEGIN TRANSACTION;\n")?;
        }
        Ok(())
    };
    for r in rows {
        let file = p.symbols.file(r.sym) + 1;
        if files_done.insert(file) {
            writeln!(
                out,
                "INSERT INTO files VALUES ({file}, {});",
                sql_str(names.file(r.sym))
            )?;
        }
        let sym = r.sym + 1;
        if syms_done.insert(sym) {
            writeln!(
                out,
                "INSERT INTO symbols VALUES ({sym}, {}, {file});",
                sql_str(names.name(r.sym))
            )?;
        }
        writeln!(
            out,
            "INSERT INTO mainrows VALUES ({}, {sym}, {}, {}, {}, {}, {}, {}, {}, {});",
            r.rank,
            r.self_,
            r.cum,
            r.kids,
            r.self_all[1],
            r.cum_all[1],
            r.self_all[2],
            r.cum_all[2],
            pct(r.pct)
        )?;
        bump(out)?;
        for e in &r.callers {
            writeln!(
                out,
                "INSERT INTO parents VALUES ({}, {}, {}, {}, {}, {});",
                e.rank,
                r.rank,
                e.self_counts,
                e.self_calls,
                e.self_paths,
                pct(e.pct)
            )?;
            bump(out)?;
        }
        for e in &r.calls {
            writeln!(
                out,
                "INSERT INTO children VALUES({}, {}, {}, {}, {}, {});",
                e.rank,
                r.rank,
                e.self_counts,
                e.self_calls,
                e.self_paths,
                pct(e.pct)
            )?;
            bump(out)?;
        }
    }
    write!(
        out,
        "END TRANSACTION;\nCREATE UNIQUE INDEX fileIndex ON files (id);\nCREATE UNIQUE INDEX symbolsIndex ON symbols (id);\nCREATE INDEX selfCountIndex ON mainrows(self_count);\nCREATE INDEX totalCountIndex ON mainrows(cumulative_count);\n\n"
    )
}

/// `--db FILE`: the same database, written with the bundled SQLite.
pub fn sqlite_db(
    path: &str,
    key: &str,
    totals: [i64; 2],
    tick: f32,
    rows: &[MainRow],
    p: &Profile,
    names: &dyn Names,
) -> Result<(), String> {
    let mut text = Vec::new();
    sql(&mut text, key, totals, tick, rows, p, names).map_err(|e| e.to_string())?;
    let text = String::from_utf8(text).map_err(|e| e.to_string())?;
    // A new database under an unpredictable name created exclusively,
    // renamed over `path` when complete: a link planted at `path` is
    // replaced, never written through (see `safefs`).
    let dest = std::path::Path::new(path);
    let tmp = safefs::Temp::beside(dest, 0o666)
        .map_err(|e| format!("cannot create the database: {e}"))?;
    let written = fill_db(tmp.path(), &text);
    match written {
        Ok(()) => tmp
            .commit(dest)
            .map_err(|e| format!("cannot write the database: {e}")),
        Err(e) => {
            tmp.discard();
            Err(e)
        }
    }
}

/// Writes the statements `text` into the new, empty database file `path`.
fn fill_db(path: &std::path::Path, text: &str) -> Result<(), String> {
    use rusqlite::OpenFlags;
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )
    .map_err(|e| format!("cannot create the database: {e}"))?;
    // IgProf's schema declares references to columns that only get their
    // unique index at the end; sqlite3's shell does not enforce them either.
    conn.execute_batch("PRAGMA foreign_keys=OFF;")
        .map_err(|e| format!("cannot configure the database: {e}"))?;
    conn.execute_batch(text)
        .map_err(|e| format!("cannot write the database: {e}"))?;
    conn.close()
        .map_err(|(_, e)| format!("cannot write the database: {e}"))
}
