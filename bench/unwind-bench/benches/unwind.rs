//! Stack-walk cost per frame, side by side in one run:
//!
//! * igprof: the cached path (`ThreadUnwinder::trace_here`, every PC a
//!   descriptor-cache hit);
//! * igprof's first walk: every PC a miss (descriptor derived via framehop);
//! * framehop, warm: framehop unwinding every frame with its own rule cache hot;
//! * framehop, cold: framehop unwinding every frame with a fresh rule cache
//!   (every frame parsed from `.eh_frame`);
//! * libunwind: Debian's `unw_backtrace` (libunwind.so.8, dlopen'ed here,
//!   never by the profiler), its own per-thread fast-trace cache warm.
//!
//! The stack is a chain of distinct C functions (built at run time with
//! `cc -O2 -fomit-frame-pointer` into a shared object) below this program's
//! own frames, so every frame has its own PC. Per-frame cost is the slope between the shallowest and the
//! deepest chain, so the fixed cost per walk (register capture, the frames
//! under `main`) cancels out.
//!
//!     cargo bench -p igprof-unwind-bench --bench unwind

use std::ffi::CString;
use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use igprof::unwind::{refresh, FramehopCache, StackBounds, ThreadUnwinder, TraceEnd};

/// Number of distinct C functions in the chain: every frame has its own PC,
/// so a cold cache misses on every frame.
const CHAIN: usize = 512;

/// `f0` calls `f1` ... calls `f{CHAIN-1}`, which calls back; every third
/// function has a stack buffer (another CFA offset).
fn chain_c() -> String {
    let mut s = String::from("typedef long (*cb_t)(void *);\n#define K __attribute__((noipa))\n");
    s += &format!("K long f{}(cb_t cb, void *arg, volatile long *sink) {{ long r = cb(arg); *sink += r; return r; }}\n", CHAIN - 1);
    for i in (0..CHAIN - 1).rev() {
        let buf = if i % 3 == 0 {
            "volatile char buf[48]; buf[0] = 1; *sink += buf[0]; "
        } else {
            ""
        };
        s += &format!(
            "K long f{i}(cb_t cb, void *arg, volatile long *sink) {{ {buf}long r = f{}(cb, arg, sink); *sink += r; return r + {i}; }}\n",
            i + 1
        );
    }
    s
}

const DEPTHS: [usize; 4] = [8, 32, 128, 512];
const BUDGET: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Cached,
    FirstWalk,
    FramehopWarm,
    FramehopCold,
    Libunwind,
}

const METHODS: [(Method, &str); 5] = [
    (Method::Cached, "igprof cached"),
    (Method::FirstWalk, "igprof first walk"),
    (Method::FramehopWarm, "framehop warm"),
    (Method::FramehopCold, "framehop cold"),
    (Method::Libunwind, "libunwind"),
];

type UnwBacktrace = unsafe extern "C" fn(*mut *mut libc::c_void, libc::c_int) -> libc::c_int;

struct Ctx {
    method: Method,
    bounds: StackBounds,
    unw_backtrace: Option<UnwBacktrace>,
    /// (nanoseconds per walk, frames per walk)
    result: Option<(f64, usize)>,
}

fn time_per_walk(mut walk: impl FnMut() -> usize) -> (f64, usize) {
    let frames = walk();
    for _ in 0..10 {
        black_box(walk());
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < BUDGET {
        for _ in 0..16 {
            black_box(walk());
        }
        n += 16;
    }
    (start.elapsed().as_nanos() as f64 / n as f64, frames)
}

/// Time walks that each start from fresh state made by `make` (outside
/// the timing), in batches, for the budget.
fn time_fresh_walks<T>(
    make: impl Fn() -> T,
    mut walk: impl FnMut(&mut T) -> usize,
) -> (f64, usize) {
    let mut frames = 0;
    let mut total = Duration::ZERO;
    let mut walks = 0u64;
    while total < BUDGET {
        let mut batch: Vec<T> = (0..32).map(|_| make()).collect();
        let start = Instant::now();
        for state in batch.iter_mut() {
            frames = walk(state);
        }
        total += start.elapsed();
        walks += batch.len() as u64;
    }
    (total.as_nanos() as f64 / walks as f64, frames)
}

extern "C" fn at_bottom(arg: *mut libc::c_void) -> libc::c_long {
    // SAFETY: arg is the &mut Ctx main passed down the chain.
    let ctx = unsafe { &mut *arg.cast::<Ctx>() };
    let mut out = vec![0usize; 2048];
    let ok =
        |end: TraceEnd| assert_eq!(end, TraceEnd::Outermost, "{:?} walk incomplete", ctx.method);
    ctx.result = Some(match ctx.method {
        Method::Cached => {
            let u = ThreadUnwinder::new().unwrap();
            time_per_walk(|| {
                let t = u.trace_here(&ctx.bounds, &mut out);
                ok(t.end);
                t.depth
            })
        }
        Method::FirstWalk => {
            // A fresh unwinder per walk: every PC misses the descriptor
            // cache (and framehop's rule cache).
            time_fresh_walks(
                || ThreadUnwinder::new().unwrap(),
                |u| {
                    let t = u.trace_here(&ctx.bounds, &mut out);
                    ok(t.end);
                    t.depth
                },
            )
        }
        Method::FramehopWarm => {
            let u = ThreadUnwinder::new().unwrap();
            let mut fh = FramehopCache::new_in();
            time_per_walk(|| {
                let t = u.trace_here_framehop_only(&ctx.bounds, &mut out, &mut fh);
                ok(t.end);
                t.depth
            })
        }
        Method::FramehopCold => {
            let u = ThreadUnwinder::new().unwrap();
            time_fresh_walks(FramehopCache::new_in, |fh| {
                let t = u.trace_here_framehop_only(&ctx.bounds, &mut out, fh);
                ok(t.end);
                t.depth
            })
        }
        Method::Libunwind => {
            let f = ctx.unw_backtrace.expect("checked by main");
            let mut buf = vec![std::ptr::null_mut::<libc::c_void>(); 2048];
            time_per_walk(|| {
                // SAFETY: buf holds 2048 entries.
                unsafe { f(buf.as_mut_ptr(), buf.len() as libc::c_int) as usize }
            })
        }
    });
    0
}

fn build_chain() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("igprof-unwind-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("chain.c");
    std::fs::write(&src, chain_c()).unwrap();
    let so = dir.join("libchain.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-fomit-frame-pointer"])
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .status()
        .expect("running cc (the C compiler this benchmark needs)");
    assert!(st.success(), "cc failed");
    so
}

fn dlopen(path: &str) -> *mut libc::c_void {
    let c = CString::new(path).unwrap();
    // SAFETY: valid C string.
    unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }
}

fn dlsym(h: *mut libc::c_void, name: &str) -> *mut libc::c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: valid handle and C string.
    unsafe { libc::dlsym(h, c.as_ptr()) }
}

type ChainFn = extern "C" fn(
    extern "C" fn(*mut libc::c_void) -> libc::c_long,
    *mut libc::c_void,
    *mut libc::c_long,
) -> libc::c_long;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("unwind: bench");
        return;
    }
    let so = build_chain();
    let h = dlopen(so.to_str().unwrap());
    assert!(!h.is_null(), "dlopen {}", so.display());
    // The chain entered `depth` functions above its bottom.
    let entry = |depth: usize| -> ChainFn {
        let f = dlsym(h, &format!("f{}", CHAIN - depth));
        assert!(!f.is_null());
        // SAFETY: every f<i> has the ChainFn signature (chain_c).
        unsafe { std::mem::transmute(f) }
    };
    let lu = dlopen("libunwind.so.8");
    let unw_backtrace = if lu.is_null() {
        eprintln!("unwind bench: libunwind.so.8 not found (apt-get install libunwind-dev); its column is skipped");
        None
    } else {
        // SAFETY: unw_backtrace(void **, int) -> int.
        Some(unsafe {
            std::mem::transmute::<*mut libc::c_void, UnwBacktrace>(dlsym(lu, "unw_backtrace"))
        })
    };
    let entries: Vec<ChainFn> = DEPTHS.iter().map(|&d| entry(d)).collect();
    refresh().expect("module table");

    // Stack for 512 C frames plus headroom, in a thread of our own.
    let results = std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(move || {
            let bounds = StackBounds::for_current_thread().unwrap();
            let mut results = Vec::new();
            let only = std::env::var("UNWIND_BENCH_ONLY").ok();
            for (method, name) in METHODS {
                if method == Method::Libunwind && unw_backtrace.is_none() {
                    continue;
                }
                if only.as_deref().is_some_and(|o| !name.contains(o)) {
                    continue;
                }
                let mut row = Vec::new();
                for f in &entries {
                    let mut ctx = Ctx {
                        method,
                        bounds,
                        unw_backtrace,
                        result: None,
                    };
                    let mut sink = 0;
                    f(at_bottom, (&mut ctx as *mut Ctx).cast(), &mut sink);
                    row.push(ctx.result.unwrap());
                }
                results.push((name, row));
            }
            results
        })
        .unwrap()
        .join()
        .unwrap();

    println!("stack walk cost (x86-64, C frames built with -O2 -fomit-frame-pointer)");
    print!("{:<20}", "method");
    for d in DEPTHS {
        print!(" {:>16}", format!("depth {d}: ns"));
    }
    println!(" {:>12}", "ns/frame");
    for (name, row) in &results {
        print!("{name:<20}");
        for (ns, frames) in row {
            print!(" {:>16}", format!("{ns:.0} ({frames}f)"));
        }
        let (first, last) = (row[0], row[row.len() - 1]);
        let per_frame = (last.0 - first.0) / (last.1 - first.1) as f64;
        println!(" {per_frame:>12.1}");
    }
}
