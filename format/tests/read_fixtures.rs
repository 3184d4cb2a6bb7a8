//! The reader against IgProf's real dumps, random corruptions of them, and
//! the writer (round trip).
use flate2::read::GzDecoder;
use igprof_format::read::{ReadError, Reader};
use igprof_format::write::{CounterRef, FileRef, FuncRef, IoSink, Writer};
use std::io::Read;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/igprof-dumps");

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{FIXTURES}/{name}");
    let mut out = Vec::new();
    GzDecoder::new(std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
        .read_to_end(&mut out)
        .unwrap();
    out
}

const DUMPS: [&str; 3] = [
    "igprof-pp-cpu_split.gz",
    "igprof-mp-alloc_churn.gz",
    "igprof-fd-fd_churn.gz",
];

/// Totals per counter name: (sum of ticks, sum of values, number of leaks).
fn totals(text: &[u8]) -> Result<Vec<(String, i64, i64, usize)>, ReadError> {
    let mut r = Reader::new(text, "mem")?;
    let mut sums: Vec<(String, i64, i64, usize)> = Vec::new();
    let mut ids = Vec::new();
    while let Some(n) = r.next_node()? {
        for v in n.counters {
            ids.push((v.counter, v.ticks, v.value, n.leaks(v).len()));
        }
    }
    for (c, t, v, l) in ids {
        let name = r.counter(c).unwrap().to_string();
        match sums.iter_mut().find(|s| s.0 == name) {
            Some(s) => {
                s.1 += t;
                s.2 += v;
                s.3 += l;
            }
            None => sums.push((name, t, v, l)),
        }
    }
    Ok(sums)
}

#[test]
fn reads_every_igprof_fixture_with_exact_totals() {
    // Sums over all nodes, checked against the programs' known behaviour
    // (see the .c files next to the dumps). The memory dump also holds two
    // allocations of 0xfffe0 bytes made by libigprof.so itself during start-up
    // (a second tree rooted in ld.so), which IgProf's analyser filters out.
    let cpu = totals(&fixture("igprof-pp-cpu_split.gz")).unwrap();
    assert_eq!(cpu, vec![("PERF_TICKS".to_string(), 392, 392, 0)]);
    let mem = totals(&fixture("igprof-mp-alloc_churn.gz")).unwrap();
    // 200000 small + 200000 mixed + 20000 calloc + 20000 malloc + 20000 realloc
    // + 1000 leaks + 1 stdio buffer = 461001 allocations.
    let own = 2 * 0xfffe0;
    assert_eq!(
        mem[0],
        ("MEM_TOTAL".to_string(), 461_001 + 2, 431_226_080 + own, 0)
    );
    assert_eq!(mem[2].0, "MEM_LIVE");
    assert_eq!((mem[2].1, mem[2].2), (1_001 + 2, 1_004_096 + own));
    let fd = totals(&fixture("igprof-fd-fd_churn.gz")).unwrap();
    assert_eq!(fd[1], ("FD_LIVE".to_string(), 3, 3, 3));
    let fd_text = fixture("igprof-fd-fd_churn.gz");
    let r = Reader::new(&fd_text[..], "fd").unwrap();
    assert!(r.header().hex);
    assert_eq!(r.header().program, "./fd_churn");
}

/// xorshift64*: deterministic pseudo-random numbers for the corruption test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn drain(text: &[u8]) -> Result<u64, ReadError> {
    let mut r = Reader::new(text, "fuzz")?;
    let mut n = 0;
    while r.next_node()?.is_some() {
        n += 1;
    }
    Ok(n)
}

#[test]
fn never_panics_on_truncated_or_mutated_fixtures() {
    let alphabet = b"C FN=()+V:;LK0x19af,-\n\rPHEXIDT.@?";
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for name in DUMPS {
        let good = fixture(name);
        assert!(drain(&good).is_ok());
        // Every truncation point: either a clean prefix (ends at a line) or a
        // Truncated error naming the line; never a panic.
        for cut in 0..good.len() {
            let res = drain(&good[..cut]);
            if cut > 0 && good[cut - 1] != b'\n' {
                let err = res.expect_err("a cut inside a line must be an error");
                assert!(err.to_string().starts_with("fuzz:"), "{err}");
            }
        }
        for _ in 0..3000 {
            let mut bad = good.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(bad.len());
                match rng.below(3) {
                    0 => bad[at] = alphabet[rng.below(alphabet.len())],
                    1 => {
                        bad.remove(at);
                    }
                    _ => bad.insert(at, alphabet[rng.below(alphabet.len())]),
                }
            }
            if let Err(e) = drain(&bad) {
                let msg = e.to_string();
                assert!(msg.starts_with("fuzz"), "{msg}");
            }
        }
    }
}

#[test]
fn round_trip_with_the_writer() {
    let mut w = Writer::new(IoSink::new(Vec::new()));
    w.header(0x1234, b"./prog", 0.005).unwrap();
    let f0 = FileRef::New {
        id: 0,
        path: b"./prog",
    };
    w.node(
        1,
        FuncRef::New {
            id: 0,
            file: f0,
            object_offset: 0x10d1,
            name: b"@?0x10d1",
        },
        0,
    )
    .unwrap();
    w.end_node().unwrap();
    let f1 = FileRef::New {
        id: 1,
        path: b"/lib/libc.so.6",
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
    w.counter(
        CounterRef::New {
            id: 0,
            name: b"MEM_LIVE",
        },
        3,
        0x300,
        0x300,
    )
    .unwrap();
    w.leak(0x55d9c37151d0, 0x100).unwrap();
    w.leak(0x55d9c3714de0, 0x200).unwrap();
    w.counter(
        CounterRef::New {
            id: 1,
            name: b"MEM_TOTAL",
        },
        4,
        0x400,
        0x380,
    )
    .unwrap();
    w.end_node().unwrap();
    w.node(1, FuncRef::Known(0), 0).unwrap();
    w.counter(CounterRef::Known(1), 1, 1, 1).unwrap();
    w.end_node().unwrap();
    let bytes = w.into_sink().finish().unwrap();

    let mut r = Reader::new(&bytes[..], "rt").unwrap();
    assert!(r.header().hex);
    assert_eq!(
        (
            r.header().pid,
            r.header().program.as_str(),
            r.header().tick_period
        ),
        (0x1234, "./prog", 0.005)
    );
    let n = r.next_node().unwrap().unwrap();
    assert_eq!(
        (n.depth, n.function, n.defines_function, n.counters.len()),
        (1, 0, true, 0)
    );
    let n = r.next_node().unwrap().unwrap();
    assert_eq!((n.depth, n.function), (2, 1));
    let live = n.counters[0];
    assert_eq!(
        (live.counter, live.ticks, live.value, live.peak),
        (0, 3, 0x300, 0x300)
    );
    let leaks: Vec<_> = n.leaks(&live).iter().map(|l| (l.address, l.size)).collect();
    assert_eq!(
        leaks,
        vec![(0x55d9c37151d0, 0x100), (0x55d9c3714de0, 0x200)]
    );
    assert_eq!(
        (n.counters[1].ticks, n.counters[1].value, n.counters[1].peak),
        (4, 0x400, 0x380)
    );
    let n = r.next_node().unwrap().unwrap();
    assert_eq!((n.depth, n.function, n.defines_function), (1, 0, false));
    assert_eq!(n.counters[0].counter, 1);
    assert!(r.next_node().unwrap().is_none());
    let f = r.function(1).unwrap();
    assert_eq!(
        (f.name.as_str(), f.file_offset, r.file(f.file)),
        ("__libc_start_main", 0x27305, Some("/lib/libc.so.6"))
    );
    assert_eq!(r.counter(0), Some("MEM_LIVE"));
}
