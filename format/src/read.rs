//! Streaming reader of IgProf-format profiles (grammar: see the crate docs).
//!
//! Owns: turning the text of one dump, read line by line from any
//! [`std::io::BufRead`], into a [`Header`] and a sequence of [`Node`]s in
//! pre-order, together with the tables of files, functions and counters that
//! the dump defines on first use. Decompression, symbol resolution and the
//! merging of trees belong to the caller (igprof-analyse).
//!
//! Must never: panic on any input, keep more than the current line plus the
//! definition tables in memory (memory grows with distinct functions, not
//! with the file), or accept something IgProf's own grammar rejects without
//! saying so. Every error names the file and the line ([`ReadError`]).

use std::fmt;
use std::io::BufRead;

/// Largest id (function, file or counter) the reader accepts. Ids index dense
/// tables, so a corrupt id like `FNffffffffff` must not allocate terabytes.
pub const MAX_ID: u64 = 1 << 28;

/// The first line of a dump: `P=(HEX ID=<pid> N=(<program>) T=<period>)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Integers in the body are hexadecimal (`HEX` present) or decimal.
    pub hex: bool,
    /// Process id of the profiled program.
    pub pid: u64,
    /// Program name as launched (e.g. `./cpu_split`).
    pub program: String,
    /// Seconds per PERF_TICKS tick (0 when the dump has no time counter).
    pub tick_period: f64,
}

/// A function defined by `FN<id>=(F<fid>...+<offset> N=(<name>))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionDef {
    /// File id (`F<fid>`), index for [`Reader::file`].
    pub file: u32,
    /// Offset of the return address inside the object file.
    pub file_offset: i64,
    /// The symbol name the profiler recorded (`@?0x...` when it had none).
    pub name: String,
}

/// One counter value of a node: `V<id>:(<ticks>,<value>,<peak>)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterValue {
    /// Counter id, index for [`Reader::counter`].
    pub counter: u32,
    /// Number of events (calls, samples).
    pub ticks: i64,
    /// Accumulated amount (bytes, ticks, descriptors).
    pub value: i64,
    /// Peak amount.
    pub peak: i64,
    leaks_start: u32,
    leaks_end: u32,
}

/// A leaked resource recorded after its counter: `;LK=(0x<address>,<size>)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leak {
    pub address: u64,
    pub size: i64,
}

/// One call-tree node line, borrowed from the reader until the next call.
#[derive(Debug, Clone, Copy)]
pub struct Node<'r> {
    /// Depth in the tree, 1 for a root (a new tree starts at every depth 1).
    pub depth: u32,
    /// Function id, index for [`Reader::function`].
    pub function: u32,
    /// True when this line defined the function (first use).
    pub defines_function: bool,
    /// The offset of the node's address in the function's symbol (`+<n>`
    /// after the function): with the definition's, it gives the address
    /// of a node whose function was defined at another address.
    pub symbol_offset: i64,
    /// The node's counters in file order.
    pub counters: &'r [CounterValue],
    leaks: &'r [Leak],
}

impl<'r> Node<'r> {
    /// Leak records that followed counter `value` on this line.
    pub fn leaks(&self, value: &CounterValue) -> &'r [Leak] {
        self.leaks
            .get(value.leaks_start as usize..value.leaks_end as usize)
            .unwrap_or(&[])
    }
}

/// Where in which file a problem was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: String,
    /// 1-based line number.
    pub line: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Which kind of id a definition or reference error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Function,
    File,
    Counter,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            IdKind::Function => "FN",
            IdKind::File => "F",
            IdKind::Counter => "V",
        }
    }
}

/// Why a dump could not be read. Every variant says where.
#[derive(Debug)]
pub enum ReadError {
    /// Reading the underlying stream failed (e.g. a corrupt gzip member).
    Io {
        at: Location,
        source: std::io::Error,
    },
    /// The file is empty: not even a header line.
    Empty { file: String },
    /// The text does not follow the grammar: `expected` is what the grammar
    /// wants at byte `column` (1-based), `found` is the text there.
    Syntax {
        at: Location,
        column: usize,
        expected: &'static str,
        found: String,
    },
    /// The file ends in the middle of a line (a truncated dump).
    Truncated { at: Location },
    /// `FN7`, `F2` or `V1` used before any `...=(...)` defined it.
    Undefined { at: Location, kind: IdKind, id: u64 },
    /// An id defined a second time.
    Redefined { at: Location, kind: IdKind, id: u64 },
    /// An id beyond [`MAX_ID`].
    IdTooLarge { at: Location, kind: IdKind, id: u64 },
    /// A node deeper than one below the previous node (`C5` after `C3`), or depth 0.
    BadDepth {
        at: Location,
        depth: u64,
        deepest_allowed: u64,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io { at, source } => write!(f, "{at}: read error: {source}"),
            ReadError::Empty { file } => {
                write!(
                    f,
                    "{file}: empty file, expected an IgProf profile starting with 'P=('"
                )
            }
            ReadError::Syntax {
                at,
                column,
                expected,
                found,
            } => write!(
                f,
                "{at}:{column}: syntax error: expected {expected}, found {}",
                if found.is_empty() {
                    "end of line".to_string()
                } else {
                    format!("'{found}'")
                }
            ),
            ReadError::Truncated { at } => {
                write!(
                    f,
                    "{at}: file ends in the middle of a line (truncated profile?)"
                )
            }
            ReadError::Undefined { at, kind, id } => write!(
                f,
                "{at}: {}{id:x} is used before it is defined",
                kind.prefix()
            ),
            ReadError::Redefined { at, kind, id } => {
                write!(f, "{at}: {}{id:x} is defined twice", kind.prefix())
            }
            ReadError::IdTooLarge { at, kind, id } => write!(
                f,
                "{at}: {}{id:x} exceeds the largest supported id {MAX_ID:#x}",
                kind.prefix()
            ),
            ReadError::BadDepth {
                at,
                depth,
                deepest_allowed,
            } => write!(
                f,
                "{at}: node depth {depth} is not allowed here (1..={deepest_allowed})"
            ),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Streams the nodes of one dump. See the crate docs for the grammar.
pub struct Reader<R> {
    input: R,
    name: String,
    line: u64,
    /// The current line when it had to be assembled (or for error messages).
    buf: Vec<u8>,
    header: Header,
    base: u32,
    t: Tables,
}

/// Definitions and the current node's values, filled by [`parse_node`].
struct Tables {
    depth: u64,
    files: Vec<Option<String>>,
    functions: Vec<Option<FunctionDef>>,
    /// `functions[i].is_some()`, kept compact: every line checks it.
    function_defined: Vec<bool>,
    counters: Vec<Option<String>>,
    values: Vec<CounterValue>,
    leaks: Vec<Leak>,
}

/// Value of each byte as a digit (0..=15), or 0xff.
const DIGIT: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Position of the first `\n` in `s`, eight bytes at a time.
fn find_newline(s: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const NL: u64 = LO * b'\n' as u64;
    let mut i = 0;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w) ^ NL;
        // The lowest set bit marks the first zero byte exactly.
        let z = w.wrapping_sub(LO) & !w & HI;
        if z != 0 {
            return Some(i + (z.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s.get(i..)?.iter().position(|&b| b == b'\n').map(|p| i + p)
}

/// Byte cursor over one line; every step is bounds-checked.
struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

/// Parse failure inside a line, turned into a [`ReadError`] by the reader.
enum LineError {
    Syntax { pos: usize, expected: &'static str },
    Undefined(IdKind, u64),
    Redefined(IdKind, u64),
    TooLarge(IdKind, u64),
    Depth(u64, u64),
}

type LineResult<T> = Result<T, LineError>;

impl<'a> Cursor<'a> {
    fn new(s: &'a [u8]) -> Self {
        Cursor { s, pos: 0 }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }
    fn err<T>(&self, expected: &'static str) -> LineResult<T> {
        Err(LineError::Syntax {
            pos: self.pos,
            expected,
        })
    }
    fn eat(&mut self, lit: &'static [u8], expected: &'static str) -> LineResult<()> {
        if self.s.get(self.pos..self.pos + lit.len()) == Some(lit) {
            self.pos += lit.len();
            Ok(())
        } else {
            self.err(expected)
        }
    }
    fn try_eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    /// An unsigned integer in `base` (at least one digit).
    fn unsigned(&mut self, base: u32, expected: &'static str) -> LineResult<u64> {
        let start = self.pos;
        let mut v: u64 = 0;
        let mut overflow = false;
        let rest = self.s.get(self.pos..).unwrap_or(&[]);
        let mut n = 0;
        if base == 16 {
            // Hexadecimal (the common case): shifts instead of multiplies.
            for &c in rest {
                let d = DIGIT[c as usize];
                if d >= 16 {
                    break;
                }
                overflow |= v >> 60 != 0;
                v = (v << 4) | d as u64;
                n += 1;
            }
        } else {
            for &c in rest {
                let d = DIGIT[c as usize] as u32;
                if d >= base {
                    break;
                }
                match v
                    .checked_mul(base as u64)
                    .and_then(|v| v.checked_add(d as u64))
                {
                    Some(x) => v = x,
                    None => overflow = true,
                }
                n += 1;
            }
        }
        self.pos += n;
        if overflow {
            return Err(LineError::Syntax {
                pos: start,
                expected: "a number that fits in 64 bits",
            });
        }
        if n == 0 {
            return self.err(expected);
        }
        Ok(v)
    }
    /// A possibly negative integer in `base`, as IgProf's strtoll accepts.
    fn signed(&mut self, base: u32, expected: &'static str) -> LineResult<i64> {
        let neg = self.try_eat(b'-');
        let start = self.pos;
        let v = self.unsigned(base, expected)?;
        if neg {
            if v > 1u64 << 63 {
                return Err(LineError::Syntax {
                    pos: start,
                    expected: "a number that fits in 64 bits",
                });
            }
            Ok((v as i64).wrapping_neg())
        } else {
            i64::try_from(v).map_err(|_| LineError::Syntax {
                pos: start,
                expected: "a number that fits in 64 bits",
            })
        }
    }
    /// An object offset: a possibly negative integer (IgProf's) or any
    /// unsigned 64-bit one, kept as its two's complement: an address in no
    /// object is written as its own offset, and earlier profilers wrote
    /// corrupt return addresses above 2^63 too.
    fn offset(&mut self, base: u32, expected: &'static str) -> LineResult<i64> {
        if self.s.get(self.pos) == Some(&b'-') {
            self.signed(base, expected)
        } else {
            self.unsigned(base, expected).map(|v| v as i64)
        }
    }
    /// Text up to the first occurrence of `end` (not included); the cursor
    /// moves past `end`.
    fn until(&mut self, end: &'static [u8], expected: &'static str) -> LineResult<&'a [u8]> {
        let rest = self.s.get(self.pos..).unwrap_or(&[]);
        match rest.windows(end.len()).position(|w| w == end) {
            Some(i) => {
                let text = &rest[..i];
                self.pos += i + end.len();
                Ok(text)
            }
            None => self.err(expected),
        }
    }
}

fn id_index(kind: IdKind, id: u64) -> LineResult<usize> {
    if id > MAX_ID {
        Err(LineError::TooLarge(kind, id))
    } else {
        Ok(id as usize)
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn define<T>(table: &mut Vec<Option<T>>, kind: IdKind, id: u64, value: T) -> LineResult<u32> {
    let i = id_index(kind, id)?;
    if table.len() <= i {
        table.resize_with(i + 1, || None);
    }
    if table[i].is_some() {
        return Err(LineError::Redefined(kind, id));
    }
    table[i] = Some(value);
    Ok(i as u32)
}

fn lookup<T>(table: &[Option<T>], kind: IdKind, id: u64) -> LineResult<u32> {
    match table.get(id_index(kind, id)?) {
        Some(Some(_)) => Ok(id as u32),
        _ => Err(LineError::Undefined(kind, id)),
    }
}

impl<R: BufRead> Reader<R> {
    /// Reads the header line of `input`; `name` is used in error messages.
    pub fn new(input: R, name: impl Into<String>) -> Result<Self, ReadError> {
        let mut r = Reader {
            input,
            name: name.into(),
            line: 0,
            buf: Vec::with_capacity(256),
            header: Header {
                hex: false,
                pid: 0,
                program: String::new(),
                tick_period: 0.0,
            },
            base: 10,
            t: Tables {
                depth: 0,
                files: Vec::new(),
                functions: Vec::new(),
                function_defined: Vec::new(),
                counters: Vec::new(),
                values: Vec::new(),
                leaks: Vec::new(),
            },
        };
        if !r.read_line()? {
            return Err(ReadError::Empty {
                file: r.name.clone(),
            });
        }
        let line = std::mem::take(&mut r.buf);
        let parsed = parse_header(&line);
        r.buf = line;
        match parsed {
            Ok(h) => {
                r.base = if h.hex { 16 } else { 10 };
                r.header = h;
                Ok(r)
            }
            Err(e) => Err(r.line_error(e)),
        }
    }

    /// The header line.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The number of lines read so far.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// File path of file id `id`, if defined.
    pub fn file(&self, id: u32) -> Option<&str> {
        self.t.files.get(id as usize).and_then(|f| f.as_deref())
    }

    /// Function `id`, if defined.
    pub fn function(&self, id: u32) -> Option<&FunctionDef> {
        self.t.functions.get(id as usize).and_then(|f| f.as_ref())
    }

    /// Counter name of counter id `id` (e.g. `MEM_LIVE`), if defined.
    pub fn counter(&self, id: u32) -> Option<&str> {
        self.t.counters.get(id as usize).and_then(|c| c.as_deref())
    }

    /// All counter names defined so far, by id.
    pub fn counters(&self) -> impl Iterator<Item = (u32, &str)> {
        self.t
            .counters
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_deref().map(|c| (i as u32, c)))
    }

    /// Reads one line into `buf` without its newline; false at end of file.
    fn read_line(&mut self) -> Result<bool, ReadError> {
        self.buf.clear();
        let n = self
            .input
            .read_until(b'\n', &mut self.buf)
            .map_err(|source| ReadError::Io {
                at: Location {
                    file: self.name.clone(),
                    line: self.line + 1,
                },
                source,
            })?;
        if n == 0 {
            return Ok(false);
        }
        self.line += 1;
        if self.buf.last() != Some(&b'\n') {
            return Err(ReadError::Truncated {
                at: self.location(),
            });
        }
        self.buf.pop();
        Ok(true)
    }

    fn location(&self) -> Location {
        Location {
            file: self.name.clone(),
            line: self.line,
        }
    }

    fn line_error(&self, e: LineError) -> ReadError {
        let at = self.location();
        match e {
            LineError::Syntax { pos, expected } => {
                let found = self.buf.get(pos..).unwrap_or(&[]);
                let found = &found[..found.len().min(40)];
                ReadError::Syntax {
                    at,
                    column: pos + 1,
                    expected,
                    found: lossy(found),
                }
            }
            LineError::Undefined(kind, id) => ReadError::Undefined { at, kind, id },
            LineError::Redefined(kind, id) => ReadError::Redefined { at, kind, id },
            LineError::TooLarge(kind, id) => ReadError::IdTooLarge { at, kind, id },
            LineError::Depth(depth, deepest_allowed) => ReadError::BadDepth {
                at,
                depth,
                deepest_allowed,
            },
        }
    }

    /// The next node in pre-order, or `None` at the end of the dump.
    pub fn next_node(&mut self) -> Result<Option<Node<'_>>, ReadError> {
        let avail = self.input.fill_buf().map_err(|source| ReadError::Io {
            at: Location {
                file: self.name.clone(),
                line: self.line + 1,
            },
            source,
        })?;
        let parsed = if let Some(nl) = find_newline(avail) {
            // Fast path: the whole line is in the input's buffer.
            self.line += 1;
            let parsed = parse_node(&mut self.t, self.base, &avail[..nl]);
            if parsed.is_err() {
                self.buf.clear();
                self.buf.extend_from_slice(&avail[..nl]);
            }
            self.input.consume(nl + 1);
            parsed
        } else {
            if !self.read_line()? {
                return Ok(None);
            }
            parse_node(&mut self.t, self.base, &self.buf)
        };
        match parsed {
            Ok((depth, function, defines_function, symbol_offset)) => Ok(Some(Node {
                depth,
                function,
                defines_function,
                symbol_offset,
                counters: &self.t.values,
                leaks: &self.t.leaks,
            })),
            Err(e) => Err(self.line_error(e)),
        }
    }
}

/// Parses one node line into `t` (grammar: see the crate docs).
fn parse_node(t: &mut Tables, base: u32, line: &[u8]) -> LineResult<(u32, u32, bool, i64)> {
    {
        let mut c = Cursor::new(line);
        c.eat(b"C", "'C<depth>' at the start of a node line")?;
        let depth = c.unsigned(base, "a node depth after 'C'")?;
        if depth == 0 || depth > t.depth + 1 {
            return Err(LineError::Depth(depth, t.depth + 1));
        }
        c.eat(b" FN", "' FN<id>' after the depth")?;
        let fid = c.unsigned(base, "a function id after 'FN'")?;
        let (function, defines) = if c.try_eat(b'=') {
            c.eat(b"(F", "'(F<file id>' in a function definition")?;
            let file_id = c.unsigned(base, "a file id after 'F'")?;
            let file = if c.try_eat(b'=') {
                c.eat(b"(", "'(' before the file path")?;
                let path = c.until(b")+", "')+<offset>' after the file path")?;
                c.pos -= 1; // leave '+' for the offset below
                define(&mut t.files, IdKind::File, file_id, lossy(path))?
            } else {
                lookup(&t.files, IdKind::File, file_id)?
            };
            c.eat(b"+", "'+<offset in object>' after the file")?;
            let file_offset = c.offset(base, "the offset in the object file")?;
            c.eat(b" N=(", "' N=(<symbol>)' after the object offset")?;
            let name = c.until(b"))+", "'))+<offset>' after the symbol name")?;
            c.pos -= 1;
            let def = FunctionDef {
                file,
                file_offset,
                name: lossy(name),
            };
            let f = define(&mut t.functions, IdKind::Function, fid, def)?;
            if t.function_defined.len() <= f as usize {
                t.function_defined.resize(f as usize + 1, false);
            }
            t.function_defined[f as usize] = true;
            (f, true)
        } else {
            match t.function_defined.get(id_index(IdKind::Function, fid)?) {
                Some(true) => (fid as u32, false),
                _ => return Err(LineError::Undefined(IdKind::Function, fid)),
            }
        };
        c.eat(b"+", "'+<offset in symbol>' after the function")?;
        let symbol_offset = c.signed(base, "the offset in the symbol")?;

        t.values.clear();
        t.leaks.clear();
        while !c.at_end() {
            c.eat(b" V", "' V<counter id>' or end of line")?;
            let cid = c.unsigned(base, "a counter id after 'V'")?;
            let counter = if c.try_eat(b'=') {
                c.eat(b"(", "'(' before the counter name")?;
                let name = c.until(b")", "')' after the counter name")?;
                define(&mut t.counters, IdKind::Counter, cid, lossy(name))?
            } else {
                lookup(&t.counters, IdKind::Counter, cid)?
            };
            c.eat(b":(", "':(<ticks>,<value>,<peak>)' after the counter")?;
            let ticks = c.signed(base, "the counter's ticks")?;
            c.eat(b",", "',' after the ticks")?;
            let value = c.signed(base, "the counter's value")?;
            c.eat(b",", "',' after the value")?;
            let peak = c.signed(base, "the counter's peak")?;
            c.eat(b")", "')' after the peak")?;
            let leaks_start = t.leaks.len() as u32;
            while c.peek() == Some(b';') {
                c.eat(b";LK=(0x", "';LK=(0x<address>,<size>)'")?;
                let address = c.unsigned(16, "a hexadecimal leak address")?;
                c.eat(b",", "',' after the leak address")?;
                let size = c.signed(base, "the leak size")?;
                c.eat(b")", "')' after the leak size")?;
                t.leaks.push(Leak { address, size });
            }
            let leaks_end = t.leaks.len() as u32;
            t.values.push(CounterValue {
                counter,
                ticks,
                value,
                peak,
                leaks_start,
                leaks_end,
            });
        }
        t.depth = depth;
        Ok((depth as u32, function, defines, symbol_offset))
    }
}

fn parse_header(line: &[u8]) -> LineResult<Header> {
    let mut c = Cursor::new(line);
    c.eat(b"P=(", "'P=(' at the start of an IgProf profile")?;
    let hex = c.s.get(c.pos..c.pos + 4) == Some(b"HEX ");
    if hex {
        c.pos += 4;
    }
    c.eat(b"ID=", "'ID=<pid>' in the header")?;
    let pid = c.unsigned(if hex { 16 } else { 10 }, "the process id")?;
    c.eat(b" N=(", "' N=(<program>)' in the header")?;
    // The program name may contain anything; the header ends with ") T=<period>)".
    let rest = c.s.get(c.pos..).unwrap_or(&[]);
    let end = match rest.windows(4).rposition(|w| w == b") T=") {
        Some(e) => e,
        None => return c.err("') T=<tick period>)' at the end of the header"),
    };
    let program = lossy(&rest[..end]);
    c.pos += end + 4;
    let period_start = c.pos;
    let period_text = c.until(b")", "')' after the tick period")?;
    if !c.at_end() {
        return c.err("end of line after the header");
    }
    let tick_period = std::str::from_utf8(period_text)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|t| t.is_finite())
        .ok_or(LineError::Syntax {
            pos: period_start,
            expected: "a decimal tick period",
        })?;
    Ok(Header {
        hex,
        pid,
        program,
        tick_period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (depth, function, [(counter, ticks, value, peak, leaks)]) per node.
    type Nodes = Vec<(u32, u32, Vec<(u32, i64, i64, i64, Vec<Leak>)>)>;

    fn read_all(text: &str) -> Result<Nodes, ReadError> {
        let mut r = Reader::new(text.as_bytes(), "t")?;
        let mut out = Vec::new();
        while let Some(n) = r.next_node()? {
            let vals = n
                .counters
                .iter()
                .map(|v| (v.counter, v.ticks, v.value, v.peak, n.leaks(v).to_vec()))
                .collect();
            out.push((n.depth, n.function, vals));
        }
        Ok(out)
    }

    #[test]
    fn decimal_profile_with_definitions_references_and_leaks() {
        let text = "P=(ID=12 N=(a b) T=0.010000)\n\
                    C1 FN0=(F0=(/bin/a)+10 N=(main))+0\n\
                    C2 FN1=(F0+20 N=(@?(nil)))+3 V0=(MEM_LIVE):(2,30,40);LK=(0x1f,10);LK=(0x2f,20) V1=(MEM_TOTAL):(1,-5,6)\n\
                    C1 FN0+0 V1:(1,1,1)\n";
        let mut r = Reader::new(text.as_bytes(), "t").unwrap();
        assert_eq!(
            r.header(),
            &Header {
                hex: false,
                pid: 12,
                program: "a b".into(),
                tick_period: 0.01
            }
        );
        let n = r.next_node().unwrap().unwrap();
        assert_eq!(
            (n.depth, n.function, n.defines_function, n.counters.len()),
            (1, 0, true, 0)
        );
        let n = r.next_node().unwrap().unwrap();
        assert_eq!((n.depth, n.function), (2, 1));
        assert_eq!(n.counters[0].value, 30);
        assert_eq!(
            n.leaks(&n.counters[0]),
            &[
                Leak {
                    address: 0x1f,
                    size: 10
                },
                Leak {
                    address: 0x2f,
                    size: 20
                }
            ]
        );
        assert_eq!(n.counters[1].value, -5);
        assert!(n.leaks(&n.counters[1]).is_empty());
        let n = r.next_node().unwrap().unwrap();
        assert_eq!((n.depth, n.function, n.defines_function), (1, 0, false));
        assert!(r.next_node().unwrap().is_none());
        assert_eq!(r.function(1).unwrap().name, "@?(nil)");
        assert_eq!(r.function(1).unwrap().file_offset, 20);
        assert_eq!(r.file(0), Some("/bin/a"));
        assert_eq!(r.counter(1), Some("MEM_TOTAL"));
    }

    #[test]
    fn hex_numbers_and_names_with_parentheses() {
        let text = "P=(HEX ID=1f N=(./x) T=0.005000)\nC1 FNa=(F1=(/lib/a (1).so)+ff N=(operator()))+1f V2=(PERF_TICKS):(a,b,c)\n";
        let v = read_all(text).unwrap();
        assert_eq!(v, vec![(1, 10, vec![(2, 10, 11, 12, vec![])])]);
        let mut r = Reader::new(text.as_bytes(), "t").unwrap();
        r.next_node().unwrap();
        assert_eq!(r.function(10).unwrap().name, "operator()");
        assert_eq!(r.file(1), Some("/lib/a (1).so"));
    }

    #[test]
    fn an_address_in_no_object_reads_whatever_its_offset() {
        // The writer gives an address in no object as its own offset.
        let text = "P=(HEX ID=1f N=(./x) T=0.005000)\n\
                    C1 FN0=(F0=(<unknown>)+ffffffffffffffff N=(@?0xffffffffffffffff))+0\n\
                    C1 FN1=(F0+-10 N=(b))+0\n\
                    C1 FN2=(F0+7fffffffffffffff N=(c))+0\n";
        let mut r = Reader::new(text.as_bytes(), "t").unwrap();
        while r.next_node().unwrap().is_some() {}
        let offsets: Vec<i64> = (0..3).map(|f| r.function(f).unwrap().file_offset).collect();
        assert_eq!(offsets, [-1, -16, i64::MAX]);
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases: &[(&str, &str)] = &[
            ("", "t: empty file"),
            ("X\n", "t:1:1: syntax error: expected 'P=('"),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN0+0\n",
                "t:2: FN0 is used before it is defined",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC2 FN0=(F0=(a)+0 N=(b))+0\n",
                "t:2: node depth 2 is not allowed",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0",
                "t:2: file ends in the middle",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0 V0:(1,2,3)\n",
                "t:2: V0 is used before",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0\nC1 FN0=(F0+0 N=(b))+0\n",
                "t:3: FN0 is defined twice",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN99999999999=(F0=(a)+0 N=(b))+0\n",
                "t:2: FN174876e7ff exceeds",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+0 N=(b))+0 V0=(X):(1,2)\n",
                "t:2:38: syntax error: expected ','",
            ),
            (
                "P=(HEX ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+10000000000000000 N=(b))+0\n",
                "t:2:16: syntax error: expected a number that fits in 64 bits",
            ),
            (
                "P=(ID=1 N=(a) T=0.0)\nC1 FN0=(F0=(a)+99999999999999999999 N=(b))+0\n",
                "fits in 64 bits",
            ),
        ];
        for (text, want) in cases {
            let got = read_all(text).expect_err(text).to_string();
            assert!(got.contains(want), "{text:?}: got {got:?}, want {want:?}");
        }
    }
}

#[cfg(test)]
mod newline_tests {
    use super::find_newline;

    #[test]
    fn finds_the_first_newline_at_every_position() {
        for len in 0..40 {
            for at in 0..=len {
                let mut v = vec![b'x'; len];
                if at < len {
                    v[at] = b'\n';
                    if at + 3 < len {
                        v[at + 3] = b'\n';
                    }
                }
                let want = if at < len { Some(at) } else { None };
                assert_eq!(find_newline(&v), want, "len {len} at {at}");
            }
        }
        assert_eq!(find_newline(b"\x8a\x0b\n"), Some(2));
    }
}
