//! Hook real libc functions (getpid, strlen, malloc, free, open, close) in
//! this process while 8 threads call them, and check results and exact call
//! counts. Own test binary without the libtest harness (`harness = false`),
//! so no harness thread allocates or opens files behind our back.
//!
//! Hooks are installed and removed while the workers are calling the
//! functions. Calls are counted only on a worker thread inside its measured
//! window (a const-initialised thread-local flag, no allocation), so the
//! counts are exact: workers x iterations. The replacements never allocate.

mod counting;

use counting::{
    r_close, r_free, r_getpid, r_malloc, r_open, r_strlen, set_measured, Slot, CLOSE, FREE, GETPID,
    MALLOC, OPEN, STRLEN,
};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use trampoline::{find_function, prepare, Hook, Symbol};

const WORKERS: usize = 8;
const ITERATIONS: usize = 2000;

static PHASE: AtomicUsize = AtomicUsize::new(0);
static DONE: AtomicUsize = AtomicUsize::new(0);
static ERRORS: AtomicUsize = AtomicUsize::new(0);

const TEXT: &CStr = c"trampoline";
const DEV_NULL: &CStr = c"/dev/null";

/// One round of calls with every result checked; no Rust allocation.
fn round(pid: libc::pid_t) {
    let bad = || {
        ERRORS.fetch_add(1, SeqCst);
    };
    // SAFETY: plain libc calls with valid arguments; black_box keeps the
    // compiler from folding strlen or eliding the malloc/free pair.
    unsafe {
        if libc::getpid() != pid {
            bad();
        }
        if libc::strlen(std::hint::black_box(TEXT.as_ptr())) != 10 {
            bad();
        }
        let p = std::hint::black_box(libc::malloc(std::hint::black_box(48))) as *mut u8;
        if p.is_null() {
            bad();
        } else {
            p.write_bytes(0x5a, 48);
            if *p.add(47) != 0x5a {
                bad();
            }
        }
        libc::free(std::hint::black_box(p as *mut c_void));
        let fd = libc::open(DEV_NULL.as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            bad();
        }
        if libc::close(fd) != 0 {
            bad();
        }
    }
}

fn worker(pid: libc::pid_t) {
    // Unmeasured calls while the hooks are being installed.
    while PHASE.load(SeqCst) == 0 {
        round(pid);
    }
    set_measured(true);
    for _ in 0..ITERATIONS {
        round(pid);
    }
    set_measured(false);
    DONE.fetch_add(1, SeqCst);
    // Unmeasured calls while the hooks are being removed.
    while PHASE.load(SeqCst) < 3 {
        round(pid);
    }
}

fn lookup(name: &str) -> Symbol {
    find_function(name, Some("libc.so.6")).unwrap_or_else(|e| panic!("{e}"))
}

fn hook(name: &str, slot: &'static Slot, replacement: *const ()) -> Hook {
    let sym = lookup(name);
    let prepared = prepare(&sym, replacement).unwrap_or_else(|e| panic!("{e}"));
    slot.chain.store(prepared.chain() as usize, SeqCst);
    prepared.enable().unwrap_or_else(|e| panic!("{e}"))
}

fn main() {
    let pid = std::process::id() as libc::pid_t;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| std::thread::spawn(move || worker(pid)))
        .collect();
    // As a profiler installs them: in one batch, which opens libc's whole
    // code mapping for writing while the workers run in it, and closes it
    // at the end.
    let hooks = trampoline::batch(|| {
        vec![
            hook("getpid", &GETPID, r_getpid as *const ()),
            hook("strlen", &STRLEN, r_strlen as *const ()),
            hook("malloc", &MALLOC, r_malloc as *const ()),
            hook("free", &FREE, r_free as *const ()),
            hook("open", &OPEN, r_open as *const ()),
            hook("close", &CLOSE, r_close as *const ()),
        ]
    });
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let writable_code: Vec<&str> = maps
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|p| p.starts_with("rwx"))
        })
        .collect();
    assert!(
        writable_code.is_empty(),
        "code left writable after the batch: {writable_code:?}"
    );
    assert!(
        maps.lines()
            .any(|l| l.contains("r-xp") && l.ends_with("libc.so.6")),
        "libc's code is executable and read-only again:\n{maps}"
    );
    PHASE.store(1, SeqCst);
    while DONE.load(SeqCst) < WORKERS {
        std::hint::spin_loop();
    }
    PHASE.store(2, SeqCst);
    for h in hooks {
        h.uninstall().unwrap_or_else(|e| panic!("{e}"));
    }
    PHASE.store(3, SeqCst);
    for w in workers {
        w.join().expect("worker");
    }
    let want = WORKERS * ITERATIONS;
    let mut failed = false;
    for (name, slot) in [
        ("getpid", &GETPID),
        ("strlen", &STRLEN),
        ("malloc", &MALLOC),
        ("free", &FREE),
        ("open", &OPEN),
        ("close", &CLOSE),
    ] {
        let got = slot.calls.load(SeqCst);
        println!("{name}: {got} calls counted (want {want})");
        failed |= got != want;
    }
    // After uninstall nothing is counted any more.
    set_measured(true);
    round(pid);
    set_measured(false);
    let after: usize = [&GETPID, &STRLEN, &MALLOC, &FREE, &OPEN, &CLOSE]
        .iter()
        .map(|s| s.calls.load(SeqCst))
        .sum();
    if after != 6 * want {
        println!("calls counted after uninstall: {}", after - 6 * want);
        failed = true;
    }
    let errors = ERRORS.load(SeqCst);
    if errors != 0 {
        println!("{errors} wrong results from hooked or unhooked libc calls");
        failed = true;
    }
    if failed {
        println!("libc_hooks: FAILED");
        std::process::exit(1);
    }
    println!("libc_hooks: ok ({WORKERS} threads x {ITERATIONS} rounds, hooks installed and removed under load)");
}
