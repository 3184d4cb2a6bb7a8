//! Allocation-free writer of IgProf-format profiles, used by libigprof.so.
//!
//! Owns the byte-exact text of a dump as IgProf's own analyser expects it:
//!
//! ```text
//! P=(HEX ID=<pid> N=(<program>) T=<seconds per tick, %f>)
//! C<depth> FN<id>=(F<fid>=(<object>)+<offset in object> N=(<symbol>))+<offset in symbol> V<cid>=(<COUNTER>):(<ticks>,<value>,<peak>)[;LK=(0x<addr>,<size>)]...
//! ```
//!
//! Integers are lowercase hexadecimal without `0x` (the header says HEX),
//! except inside `LK=(0x..,..)` where IgProf writes the address with `0x`.
//! Function, file and counter ids are defined on first use (`FN7=(...)`,
//! `F2=(...)`, `V0=(NAME):`) and referenced bare afterwards (`FN7`, `F2`,
//! `V0:`); the writer does not track which ids are defined, the caller says
//! so through [`FuncRef`], [`FileRef`] and [`CounterRef`].
//!
//! Must never: allocate, panic on any input, or emit anything IgProf's grammar
//! does not have (no comments, no trailing lines, no extra header fields).
//! Numbers are formatted into stack buffers; all output goes to a caller
//! supplied [`Sink`].

/// Where the bytes of a dump go. Implemented by the caller (a fixed buffer in
/// front of a gzip stream or a file descriptor in libigprof).
pub trait Sink {
    /// Writes all of `bytes` or reports why it could not.
    fn put(&mut self, bytes: &[u8]) -> Result<(), WriteError>;
}

/// Why a dump could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// The caller's fixed buffer is full (SliceSink) after `written` bytes.
    BufferFull { written: usize },
    /// The underlying output failed with this OS error number.
    Io { errno: i32 },
    /// A name contains a byte that would break IgProf's grammar (newline or NUL).
    BadName { byte: u8 },
    /// Depth 0 is not allowed: IgProf's depths start at 1.
    ZeroDepth,
}

impl core::fmt::Display for WriteError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WriteError::BufferFull { written } => {
                write!(f, "dump buffer full after {written} bytes")
            }
            WriteError::Io { errno } => write!(f, "writing the dump failed: errno {errno}"),
            WriteError::BadName { byte } => {
                write!(
                    f,
                    "name contains byte 0x{byte:02x} that IgProf's grammar cannot hold"
                )
            }
            WriteError::ZeroDepth => write!(f, "call-tree depth 0 (IgProf depths start at 1)"),
        }
    }
}

impl std::error::Error for WriteError {}

/// A source file / shared object of a function: defined on first use.
#[derive(Debug, Clone, Copy)]
pub enum FileRef<'a> {
    /// `F<id>` already defined earlier in the dump.
    Known(u32),
    /// `F<id>=(<path>)`: first use.
    New { id: u32, path: &'a [u8] },
}

/// A function (symbol) of a node: defined on first use.
#[derive(Debug, Clone, Copy)]
pub enum FuncRef<'a> {
    /// `FN<id>` already defined earlier in the dump.
    Known(u32),
    /// `FN<id>=(F..+<object offset> N=(<name>))`: first use.
    New {
        id: u32,
        file: FileRef<'a>,
        object_offset: u64,
        name: &'a [u8],
    },
}

/// A counter of a node: defined on first use.
#[derive(Debug, Clone, Copy)]
pub enum CounterRef<'a> {
    /// `V<id>` already defined.
    Known(u32),
    /// `V<id>=(<NAME>)`: first use.
    New { id: u32, name: &'a [u8] },
}

/// The two lower-case hexadecimal digits of every byte value.
const HEX_PAIRS: [u8; 512] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut t = [0u8; 512];
    let mut i = 0;
    while i < 256 {
        t[2 * i] = DIGITS[i >> 4];
        t[2 * i + 1] = DIGITS[i & 15];
        i += 1;
    }
    t
};

/// How many lower-case hexadecimal digits `v` has (one for 0).
#[inline]
fn hex_len(v: u64) -> usize {
    ((67 - (v | 1).leading_zeros()) / 4) as usize
}

/// The [`hex_len`]`(v)` lower-case hexadecimal digits of `v` into `out`,
/// which is that long (two digits a step: a dump writes several numbers
/// a line).
#[inline]
fn hex_into(v: u64, out: &mut [u8]) {
    let mut i = out.len();
    let mut v = v;
    while i >= 2 {
        let p = (v & 0xff) as usize * 2;
        out[i - 2] = HEX_PAIRS[p];
        out[i - 1] = HEX_PAIRS[p + 1];
        i -= 2;
        v >>= 8;
    }
    if i == 1 {
        out[0] = HEX_PAIRS[(v & 0xf) as usize * 2 + 1];
    }
}

/// Lower-case hexadecimal digits of `v` into `buf`, returning the used tail.
#[inline]
fn hex(v: u64, buf: &mut [u8; 16]) -> &[u8] {
    let at = buf.len() - hex_len(v);
    hex_into(v, &mut buf[at..]);
    &buf[at..]
}

/// Decimal digits of `v` into `buf`, returning the used tail.
fn dec(v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// A short run of a line (numbers and literals) assembled in place and
/// handed to the sink in one `put`: a node's line made of a dozen puts of
/// one to three bytes cost 180 ns (cc1's 19,000-node dump: 3.5 ms).
struct Run {
    buf: [u8; 80],
    len: usize,
}

impl Run {
    fn new() -> Self {
        Run {
            buf: [0; 80],
            len: 0,
        }
    }

    /// Appends `b` (the callers' literals and numbers fit: at most 80
    /// bytes between two puts, checked by the slice bounds).
    #[inline]
    fn lit(&mut self, b: &[u8]) -> &mut Self {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        self
    }

    /// Appends `v` in lower-case hex, written in place: through a buffer
    /// of its own, each number's copy of a length known only at run time
    /// was a call of libc's memcpy (3.4 M instructions of a small cc1's
    /// dump).
    #[inline]
    fn hex(&mut self, v: u64) -> &mut Self {
        let end = self.len + hex_len(v);
        hex_into(v, &mut self.buf[self.len..end]);
        self.len = end;
        self
    }

    /// Hands the run to `sink` and empties it.
    #[inline]
    fn put<S: Sink>(&mut self, sink: &mut S) -> Result<(), WriteError> {
        let r = sink.put(&self.buf[..self.len]);
        self.len = 0;
        r
    }
}

fn check_name(name: &[u8]) -> Result<(), WriteError> {
    match name.iter().find(|&&b| b == b'\n' || b == b'\r' || b == 0) {
        Some(&byte) => Err(WriteError::BadName { byte }),
        None => Ok(()),
    }
}

/// Streams one dump into a [`Sink`]. Call [`Writer::header`] once, then for
/// each node in pre-order [`Writer::node`], its counters, its leaks, and
/// [`Writer::end_node`].
pub struct Writer<S: Sink> {
    sink: S,
    in_node: bool,
}

impl<S: Sink> Writer<S> {
    pub fn new(sink: S) -> Self {
        Writer {
            sink,
            in_node: false,
        }
    }

    /// Gives the sink back (e.g. to flush and close it).
    pub fn into_sink(self) -> S {
        self.sink
    }

    fn put(&mut self, b: &[u8]) -> Result<(), WriteError> {
        self.sink.put(b)
    }

    fn put_hex(&mut self, v: u64) -> Result<(), WriteError> {
        let mut buf = [0u8; 16];
        let s = hex(v, &mut buf);
        self.sink.put(s)
    }

    /// `P=(HEX ID=<pid> N=(<program>) T=<tick_seconds>)`; `tick_seconds` is
    /// printed as C's `%f` (six decimals), as IgProf does.
    pub fn header(
        &mut self,
        pid: u64,
        program: &[u8],
        tick_seconds: f64,
    ) -> Result<(), WriteError> {
        check_name(program)?;
        self.put(b"P=(HEX ID=")?;
        self.put_hex(pid)?;
        self.put(b" N=(")?;
        self.put(program)?;
        self.put(b") T=")?;
        self.put_fixed6(tick_seconds)?;
        self.put(b")\n")
    }

    fn put_fixed6(&mut self, x: f64) -> Result<(), WriteError> {
        let x = if x.is_finite() && x > 0.0 { x } else { 0.0 };
        let micros = (x * 1e6 + 0.5) as u64;
        let mut buf = [0u8; 20];
        let whole = dec(micros / 1_000_000, &mut buf);
        self.sink.put(whole)?;
        self.sink.put(b".")?;
        let frac = micros % 1_000_000;
        let mut digits = [b'0'; 6];
        let mut f = frac;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (f % 10) as u8;
            f /= 10;
        }
        self.sink.put(&digits)
    }

    /// Starts the line of a call-tree node at `depth` (1 = outermost caller):
    /// `C<depth> FN..+<offset_in_symbol>`.
    pub fn node(
        &mut self,
        depth: u32,
        func: FuncRef<'_>,
        offset_in_symbol: u64,
    ) -> Result<(), WriteError> {
        if depth == 0 {
            return Err(WriteError::ZeroDepth);
        }
        let mut run = Run::new();
        if self.in_node {
            run.lit(b"\n");
        }
        self.in_node = true;
        run.lit(b"C").hex(depth as u64).lit(b" FN");
        match func {
            FuncRef::Known(id) => {
                run.hex(id as u64);
            }
            FuncRef::New {
                id,
                file,
                object_offset,
                name,
            } => {
                check_name(name)?;
                run.hex(id as u64).lit(b"=(F");
                match file {
                    FileRef::Known(fid) => {
                        run.hex(fid as u64);
                    }
                    FileRef::New { id: fid, path } => {
                        check_name(path)?;
                        run.hex(fid as u64).lit(b"=(").put(&mut self.sink)?;
                        self.sink.put(path)?;
                        run.lit(b")");
                    }
                }
                run.lit(b"+")
                    .hex(object_offset)
                    .lit(b" N=(")
                    .put(&mut self.sink)?;
                self.sink.put(name)?;
                run.lit(b"))");
            }
        }
        run.lit(b"+").hex(offset_in_symbol).put(&mut self.sink)
    }

    /// ` V<cid>=(<NAME>):(<ticks>,<value>,<peak>)` on the current node.
    pub fn counter(
        &mut self,
        counter: CounterRef<'_>,
        ticks: u64,
        value: u64,
        peak: u64,
    ) -> Result<(), WriteError> {
        let mut run = Run::new();
        run.lit(b" V");
        match counter {
            CounterRef::Known(id) => {
                run.hex(id as u64).lit(b":(");
            }
            CounterRef::New { id, name } => {
                check_name(name)?;
                run.hex(id as u64).lit(b"=(").put(&mut self.sink)?;
                self.sink.put(name)?;
                run.lit(b"):(");
            }
        }
        run.hex(ticks)
            .lit(b",")
            .hex(value)
            .lit(b",")
            .hex(peak)
            .lit(b")")
            .put(&mut self.sink)
    }

    /// `;LK=(0x<address>,<size>)` after the counter it belongs to.
    pub fn leak(&mut self, address: u64, size: u64) -> Result<(), WriteError> {
        Run::new()
            .lit(b";LK=(0x")
            .hex(address)
            .lit(b",")
            .hex(size)
            .lit(b")")
            .put(&mut self.sink)
    }

    /// Ends the current node's line.
    pub fn end_node(&mut self) -> Result<(), WriteError> {
        if self.in_node {
            self.in_node = false;
            self.put(b"\n")?;
        }
        Ok(())
    }
}

/// A [`Sink`] over a caller-provided byte slice.
pub struct SliceSink<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> SliceSink<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceSink { buf, len: 0 }
    }
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Sink for SliceSink<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        let end = self.len + bytes.len();
        if end > self.buf.len() {
            return Err(WriteError::BufferFull { written: self.len });
        }
        self.buf[self.len..end].copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

/// A [`Sink`] that batches into a fixed in-struct buffer and hands full
/// batches to any `std::io::Write` (a gzip encoder or a file).
pub struct IoSink<W: std::io::Write> {
    out: W,
    buf: [u8; 8192],
    len: usize,
}

impl<W: std::io::Write> IoSink<W> {
    pub fn new(out: W) -> Self {
        IoSink {
            out,
            buf: [0; 8192],
            len: 0,
        }
    }

    fn drain(&mut self) -> Result<(), WriteError> {
        if self.len > 0 {
            let r = self.out.write_all(&self.buf[..self.len]);
            self.len = 0;
            r.map_err(|e| WriteError::Io {
                errno: e.raw_os_error().unwrap_or(0),
            })?;
        }
        Ok(())
    }

    /// Writes out what is buffered and returns the inner writer.
    pub fn finish(mut self) -> Result<W, WriteError> {
        self.drain()?;
        self.out.flush().map_err(|e| WriteError::Io {
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        Ok(self.out)
    }
}

impl<W: std::io::Write> Sink for IoSink<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        if self.len + bytes.len() > self.buf.len() {
            self.drain()?;
        }
        if bytes.len() > self.buf.len() {
            return self.out.write_all(bytes).map_err(|e| WriteError::Io {
                errno: e.raw_os_error().unwrap_or(0),
            });
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_match_std_formatting() {
        let mut v: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values = vec![
            0,
            1,
            0xf,
            0x10,
            0xff,
            0x100,
            0xfff,
            0x1000,
            u64::MAX,
            1 << 63,
        ];
        for _ in 0..10_000 {
            v ^= v << 13;
            v ^= v >> 7;
            v ^= v << 17;
            values.push(v >> (v % 64));
        }
        for &x in &values {
            let mut buf = [0u8; 16];
            assert_eq!(hex(x, &mut buf), format!("{x:x}").as_bytes(), "{x:#x}");
        }
        // In place in a run, between literals, three numbers at a time.
        for w in values.windows(3) {
            let mut run = Run::new();
            run.lit(b"<")
                .hex(w[0])
                .lit(b",")
                .hex(w[1])
                .hex(w[2])
                .lit(b">");
            let text = format!("<{:x},{:x}{:x}>", w[0], w[1], w[2]);
            assert_eq!(&run.buf[..run.len], text.as_bytes());
        }
    }

    /// Rewrites the first lines of the real IgProf fixture
    /// igprof-pp-cpu_split.gz and compares byte for byte.
    #[test]
    fn reproduces_igprof_cpu_split_lines_exactly() {
        let mut mem = [0u8; 4096];
        let mut w = Writer::new(SliceSink::new(&mut mem));
        w.header(0x7f68, b"./cpu_split", 0.005).unwrap();
        let f0 = FileRef::New {
            id: 0,
            path: b"./cpu_split",
        };
        w.node(
            1,
            FuncRef::New {
                id: 0,
                file: f0,
                object_offset: 0x10d1,
                name: b"@?0x562a646c50d1",
            },
            0,
        )
        .unwrap();
        w.end_node().unwrap();
        let f1 = FileRef::New {
            id: 1,
            path: b"/lib/x86_64-linux-gnu/libc.so.6",
        };
        w.node(
            2,
            FuncRef::New {
                id: 1,
                file: f1,
                object_offset: 0x27305,
                name: b"__libc_start_main",
            },
            0x85,
        )
        .unwrap();
        w.end_node().unwrap();
        w.node(
            7,
            FuncRef::New {
                id: 6,
                file: FileRef::Known(0),
                object_offset: 0x11bf,
                name: b"@?0x562a646c51bf",
            },
            0,
        )
        .unwrap();
        w.counter(
            CounterRef::New {
                id: 0,
                name: b"PERF_TICKS",
            },
            0x54,
            0x54,
            0x54,
        )
        .unwrap();
        w.node(7, FuncRef::Known(7), 0).unwrap();
        w.counter(CounterRef::Known(0), 0x38, 0x38, 0x38).unwrap();
        w.end_node().unwrap();
        let sink = w.into_sink();
        let expected = "P=(HEX ID=7f68 N=(./cpu_split) T=0.005000)\n\
C1 FN0=(F0=(./cpu_split)+10d1 N=(@?0x562a646c50d1))+0\n\
C2 FN1=(F1=(/lib/x86_64-linux-gnu/libc.so.6)+27305 N=(__libc_start_main))+85\n\
C7 FN6=(F0+11bf N=(@?0x562a646c51bf))+0 V0=(PERF_TICKS):(54,54,54)\n\
C7 FN7+0 V0:(38,38,38)\n";
        assert_eq!(std::str::from_utf8(sink.written()).unwrap(), expected);
    }

    #[test]
    fn leak_records_follow_their_counter() {
        let mut mem = [0u8; 512];
        let mut w = Writer::new(SliceSink::new(&mut mem));
        w.node(0x1a, FuncRef::Known(0x11), 0).unwrap();
        w.counter(
            CounterRef::New {
                id: 2,
                name: b"MEM_LIVE",
            },
            0x3e8,
            0xf4240,
            0xf4240,
        )
        .unwrap();
        w.leak(0x55d9c37151d0, 0x3e8).unwrap();
        w.leak(0x55d9c3714de0, 0x3e8).unwrap();
        w.end_node().unwrap();
        let s = w.into_sink();
        assert_eq!(
            std::str::from_utf8(s.written()).unwrap(),
            "C1a FN11+0 V2=(MEM_LIVE):(3e8,f4240,f4240);LK=(0x55d9c37151d0,3e8);LK=(0x55d9c3714de0,3e8)\n"
        );
    }

    #[test]
    fn tick_period_is_printed_like_printf_f() {
        for (x, s) in [
            (0.005, "0.005000"),
            (0.0001, "0.000100"),
            (0.0, "0.000000"),
            (2.5, "2.500000"),
            (f64::NAN, "0.000000"),
        ] {
            let mut mem = [0u8; 64];
            let mut w = Writer::new(SliceSink::new(&mut mem));
            w.put_fixed6(x).unwrap();
            assert_eq!(std::str::from_utf8(w.into_sink().written()).unwrap(), s);
        }
    }

    #[test]
    fn rejects_bad_input_with_typed_errors() {
        let mut mem = [0u8; 64];
        let mut w = Writer::new(SliceSink::new(&mut mem));
        assert_eq!(w.node(0, FuncRef::Known(1), 0), Err(WriteError::ZeroDepth));
        assert_eq!(
            w.header(1, b"a\nb", 0.0),
            Err(WriteError::BadName { byte: b'\n' })
        );
        let mut small = [0u8; 12];
        let mut w = Writer::new(SliceSink::new(&mut small));
        assert_eq!(
            w.header(1, b"prog", 0.0),
            Err(WriteError::BufferFull { written: 11 })
        );
    }

    #[test]
    fn io_sink_batches_and_flushes_everything() {
        let mut w = Writer::new(IoSink::new(Vec::new()));
        w.header(1, b"p", 0.001).unwrap();
        for i in 0..2000u32 {
            w.node(1 + (i % 5), FuncRef::Known(i), i as u64).unwrap();
            w.counter(CounterRef::Known(0), 1, 1, 1).unwrap();
        }
        w.end_node().unwrap();
        let out = w.into_sink().finish().unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2001);
        assert!(text.ends_with("C5 FN7cf+7cf V0:(1,1,1)\n"));
    }
}
