//! A bump arena reporting its blocks through the igprof-client crate.
//!
//! Usage: pool_arena_rs NODES NAMES
//!   make_nodes carves NODES blocks of 40 bytes and gives back every third
//!   (i % 3 == 0); make_names carves NAMES blocks of 8 + (i * 13) % 100
//!   bytes and keeps them all. The arena's chunk is one Vec made in main,
//!   its first 64 bytes a header no block starts at. Prints what it
//!   reported, and on stderr what igprof_client::enable() said (-1
//!   unprofiled).

struct Arena {
    chunk: Vec<u8>,
    used: usize,
}

const HEADER: usize = 64;

impl Arena {
    #[inline(never)]
    fn alloc(&mut self, n: usize) -> *mut u8 {
        let at = (self.used + 15) & !15;
        assert!(at + n <= self.chunk.len(), "arena full");
        self.used = at + n;
        let p = self.chunk[at..].as_mut_ptr();
        igprof_client::alloc_event(p, n);
        p
    }

    #[inline(never)]
    fn release(&mut self, p: *mut u8) {
        igprof_client::free_event(p);
    }
}

#[derive(Default)]
struct Tally {
    calls: u64,
    bytes: u64,
    live_blocks: u64,
    live_bytes: u64,
}

#[inline(never)]
fn make_nodes(a: &mut Arena, n: usize, t: &mut Tally) {
    for i in 0..n {
        let p = a.alloc(40);
        t.calls += 1;
        t.bytes += 40;
        if i % 3 == 0 {
            a.release(p);
        } else {
            t.live_blocks += 1;
            t.live_bytes += 40;
        }
    }
}

#[inline(never)]
fn make_names(a: &mut Arena, n: usize, t: &mut Tally) {
    for i in 0..n {
        let sz = 8 + (i * 13) % 100;
        a.alloc(sz);
        t.calls += 1;
        t.bytes += sz as u64;
        t.live_blocks += 1;
        t.live_bytes += sz as u64;
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: pool_arena_rs NODES NAMES"))
        .collect();
    let (nodes, names) = (args[0], args[1]);
    let mut a = Arena {
        chunk: vec![0u8; HEADER + nodes * 48 + names * 112],
        used: HEADER,
    };
    let (mut tn, mut tm) = (Tally::default(), Tally::default());
    make_nodes(&mut a, nodes, &mut tn);
    make_names(&mut a, names, &mut tm);
    for (what, t) in [("nodes", &tn), ("names", &tm)] {
        println!(
            "{what} {} calls {} bytes, {} live {} bytes",
            t.calls, t.bytes, t.live_blocks, t.live_bytes
        );
    }
    eprintln!("enable {}", igprof_client::enable());
    // The arena stays: its live blocks are inside it at exit.
    std::mem::forget(a);
}
