//! IgProf's profile dump format, owned in one place for the writer (in the
//! injected library, [`write`](mod@write)) and the reader (in igprof-analyse, [`read`]).
//!
//! # Grammar
//!
//! This is the one written statement of the format. It is IgProf's (upstream
//! `src/profile.cc` writes it, `src/analyse.cc` reads it), as the real dumps in
//! `fixtures/igprof-dumps/` show. A dump is text, one record per line, every
//! line ending in `\n` (including the last):
//!
//! ```text
//! dump     = header "\n" { node "\n" }
//! header   = "P=(" [ "HEX " ] "ID=" int " N=(" program ") T=" period ")"
//! node     = "C" int " " func "+" sint { " " counter { leak } }
//! func     = "FN" int                                    (reference)
//!          | "FN" int "=(" file "+" sint " N=(" name "))"  (definition)
//! file     = "F" int                                     (reference)
//!          | "F" int "=(" path ")"                        (definition)
//! counter  = "V" int [ "=(" cname ")" ] ":(" sint "," sint "," sint ")"
//! leak     = ";LK=(0x" hexint "," sint ")"
//! int      = digits in the dump's base;  sint = [ "-" ] int
//! ```
//!
//! * Base: when the header has `HEX`, every `int` in the dump is lowercase
//!   hexadecimal without `0x` (depths, ids, offsets, counter values, leak
//!   sizes, the pid); otherwise decimal. The leak address is always
//!   hexadecimal with `0x`. `period` is a decimal fraction printed with `%f`
//!   (`0.005000`): seconds per `PERF_TICKS` tick, `0.000000` for other profiles.
//! * `C<depth>`: the node's depth in its call tree, 1 for a root. Nodes come
//!   in pre-order: a line at depth `d` is a child of the nearest earlier line
//!   at depth `d-1`, so a depth may be at most one more than the previous
//!   line's. Every line at depth 1 starts another tree (IgProf writes one per
//!   thread); readers merge trees, and nodes, by symbol.
//! * A node line is one stack frame: the function that contains the return
//!   address (the innermost frame is the deepest line). `FN<id>=(...)` defines
//!   function `id` the first time it appears: its object file, the offset of
//!   the return address inside that object, and the symbol name the profiler
//!   found (`@?0x<address>` when `dladdr` found none — program-local functions
//!   in IgProf's own dumps). Later lines refer to it as `FN<id>`. The same
//!   holds for files (`F<id>=(<path>)`, then `F<id>`) and counters
//!   (`V<id>=(<NAME>)`, then `V<id>`). The `+<offset>` after the function is
//!   the offset inside the symbol: one function id stands for every
//!   address in it, and the node's address is the definition's object
//!   offset minus the definition's `+<offset>` plus the node's. IgProf's
//!   analyser ignores it; igprof-analyse's `--inline` needs it (inlined
//!   code differs between addresses of one function).
//! * `path` is the object as the dynamic loader named it; the main program is
//!   recorded as launched (`./cpu_split`), so it is relative to the directory
//!   the program was started in. `path` ends at the first `)+`; `name` ends at
//!   the first `))+` (names like `@?(nil)` or `operator()` contain `)`).
//! * Counter values are `(ticks, value, peak)`: number of events (samples,
//!   calls), accumulated amount (ticks, bytes, descriptors) and peak amount.
//!   Counter names: `PERF_TICKS`; `MEM_TOTAL`, `MEM_MAX`, `MEM_LIVE`;
//!   `FD_USED`, `FD_LIVE`; `MMAP_TOTAL`, `MMAP_LIVE`; `NRG_*`; `IBS_*`. A
//!   `MEM_LIVE`/`FD_LIVE`/`MMAP_LIVE` counter is followed by one
//!   `;LK=(0x<address or fd>,<size>)` per resource still live
//!   when the dump was written. A node may have no counter at all (an inner
//!   frame).
//!
//! * Notes: `program` may end with ` [note; note...]`, facts IgProf's header
//!   has no field for (its analyser rejects an extra field, and both readers
//!   take the name as it is); a note never holds `)`, `[`, `]` or `;`. See
//!   [`notes`].
//!
//! IgProf's analyser is strict: a comment, an empty line, an extra header
//! field or a missing final newline is a syntax error there. The writer never
//! produces them; the reader reports them with file and line.
#![forbid(unsafe_code)]
pub mod journal;
pub mod notes;
pub mod read;
pub mod write;
