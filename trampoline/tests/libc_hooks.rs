//! Hook real libc functions (getpid, strlen, malloc, free, open, close) in
//! this process while 8 threads call them, and check results and exact call
//! counts. Own test binary without the libtest harness (`harness = false`),
//! so no harness thread allocates or opens files behind our back.
//!
//! The workers call the functions the whole time. Each hook is written
//! with the workers parked by a signal, as `igprof --attach` stops a
//! program's threads: one whose next instruction lies strictly inside the
//! bytes the patch covers (`mov %edi,%eax` done, `mov %rdi,%rdx` next, in
//! glibc's `__strlen_avx2`) would run the middle of the new jump, which the
//! trampoline does not promise against (its patch module); it is moved to
//! the same instruction in the trampoline, as the profiler does. Between
//! the hooks the workers run in libc's code while the batch keeps it
//! writable. The hooks are removed with the workers running: a thread
//! cannot be inside the one jump a patch is.
//!
//! Calls are counted only on a worker thread inside its measured window
//! (a const-initialised thread-local flag, no allocation), so the counts
//! are exact: workers x iterations. The replacements never allocate.

mod counting;

use counting::{
    r_close, r_free, r_getpid, r_malloc, r_open, r_strlen, set_measured, Slot, CLOSE, FREE, GETPID,
    MALLOC, OPEN, STRLEN,
};
use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use trampoline::{find_function, prepare, Hook, Prepared, Symbol};

const WORKERS: usize = 8;
const ITERATIONS: usize = 2000;

static PHASE: AtomicUsize = AtomicUsize::new(0);
static DONE: AtomicUsize = AtomicUsize::new(0);
static ERRORS: AtomicUsize = AtomicUsize::new(0);
/// Workers that have made their first round (parked only after it: the
/// start of a thread frees what the main thread allocated for it).
static STARTED: AtomicUsize = AtomicUsize::new(0);

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

fn worker(index: usize, pid: libc::pid_t) {
    WORKER.with(|w| w.set(index));
    round(pid);
    STARTED.fetch_add(1, SeqCst);
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

thread_local! {
    /// This worker's index in the parking slots.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Per worker: the next instruction it parked at (0: not parked).
static PARKED_AT: [AtomicU64; WORKERS] = [const { AtomicU64::new(0) }; WORKERS];
/// Per worker: where it goes on when released (0: where it parked).
static RESUME_AT: [AtomicU64; WORKERS] = [const { AtomicU64::new(0) }; WORKERS];
/// Bumped to release the parked workers.
static RELEASE: AtomicUsize = AtomicUsize::new(0);
/// Workers moved out of a patch's bytes (shown in the summary line).
static MOVED: AtomicUsize = AtomicUsize::new(0);

/// The interrupted instruction address in a signal's saved context.
///
/// # Safety
/// `ctx` is the `ucontext_t` the kernel passed to an SA_SIGINFO handler.
unsafe fn saved_pc(ctx: *mut libc::c_void) -> *mut u64 {
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: the caller's contract; the field is the saved program counter.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        let pc = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as *mut i64 as *mut u64;
        #[cfg(target_arch = "aarch64")]
        let pc = &mut (*uc).uc_mcontext.pc as *mut u64;
        pc
    }
}

/// SIGUSR1 on a worker: say where it stopped, wait for the release, go on
/// where the main thread says. Only atomics and sched_yield: the worker
/// may have been stopped anywhere, inside malloc included.
extern "C" fn park(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let i = WORKER.with(|w| w.get());
    // SAFETY: the kernel's context for this SA_SIGINFO handler.
    let pc = unsafe { saved_pc(ctx) };
    let released = RELEASE.load(SeqCst);
    // SAFETY: `pc` points into the signal frame on this thread's stack.
    PARKED_AT[i].store(unsafe { pc.read() }, SeqCst);
    while RELEASE.load(SeqCst) == released {
        std::thread::yield_now();
    }
    let to = RESUME_AT[i].swap(0, SeqCst);
    if to != 0 {
        // SAFETY: as above; sigreturn resumes the thread there.
        unsafe { pc.write(to) };
    }
    PARKED_AT[i].store(0, SeqCst);
}

/// Enables `prepared` with every worker parked outside the bytes it
/// covers: a worker inside them is moved to the same instruction in the
/// trampoline, or, where the trampoline holds those bytes changed, let
/// go and parked again.
fn enable_parked(prepared: Prepared, workers: &[libc::pthread_t]) -> Hook {
    let (start, end) = prepared.patched_range();
    let mut prepared = Some(prepared);
    for _attempt in 0..1000 {
        for &t in workers {
            // SAFETY: a live worker thread of this process (joined at the end).
            assert_eq!(unsafe { libc::pthread_kill(t, libc::SIGUSR1) }, 0);
        }
        while PARKED_AT.iter().any(|p| p.load(SeqCst) == 0) {
            std::hint::spin_loop();
        }
        let p = prepared.as_ref().expect("not enabled yet");
        let mut stuck = false;
        for (i, at) in PARKED_AT.iter().enumerate() {
            let pc = at.load(SeqCst);
            if pc > start && pc < end {
                match p.moved_pc(pc) {
                    Some(to) => RESUME_AT[i].store(to, SeqCst),
                    None => stuck = true,
                }
            }
        }
        let hook = if stuck {
            RESUME_AT.iter().for_each(|r| r.store(0, SeqCst));
            None
        } else {
            let moved = RESUME_AT.iter().filter(|r| r.load(SeqCst) != 0).count();
            MOVED.fetch_add(moved, SeqCst);
            let p = prepared.take().expect("not enabled yet");
            Some(p.enable().unwrap_or_else(|e| panic!("{e}")))
        };
        RELEASE.fetch_add(1, SeqCst);
        while PARKED_AT.iter().any(|p| p.load(SeqCst) != 0) {
            std::hint::spin_loop();
        }
        if let Some(hook) = hook {
            return hook;
        }
    }
    panic!("a worker stayed inside the bytes of the patch at {start:#x}");
}

fn hook(
    name: &str,
    slot: &'static Slot,
    replacement: *const (),
    workers: &[libc::pthread_t],
) -> Hook {
    let sym = lookup(name);
    let prepared = prepare(&sym, replacement).unwrap_or_else(|e| panic!("{e}"));
    slot.chain.store(prepared.chain() as usize, SeqCst);
    enable_parked(prepared, workers)
}

fn main() {
    let pid = std::process::id() as libc::pid_t;
    // An arena per thread: a worker parked inside malloc holds its arena's
    // lock, and the main thread allocates while the workers are parked
    // (glibc's default limit, 8 arenas a CPU, is 8 on one CPU).
    // SAFETY: mallopt before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2 * WORKERS as libc::c_int + 2) };
    // SAFETY: installs a handler that touches only atomics and the
    // signal frame; SA_RESTART keeps the workers' open/close uninterrupted.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = park as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| std::thread::spawn(move || worker(i, pid)))
        .collect();
    let threads: Vec<libc::pthread_t> = workers.iter().map(|w| w.as_pthread_t()).collect();
    while STARTED.load(SeqCst) < WORKERS {
        std::hint::spin_loop();
    }
    // As a profiler installs them: in one batch, which opens libc's whole
    // code mapping for writing while the workers run in it, and closes it
    // at the end.
    let hooks = trampoline::batch(|| {
        vec![
            hook("getpid", &GETPID, r_getpid as *const (), &threads),
            hook("strlen", &STRLEN, r_strlen as *const (), &threads),
            hook("malloc", &MALLOC, r_malloc as *const (), &threads),
            hook("free", &FREE, r_free as *const (), &threads),
            hook("open", &OPEN, r_open as *const (), &threads),
            hook("close", &CLOSE, r_close as *const (), &threads),
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
    println!(
        "libc_hooks: ok ({WORKERS} threads x {ITERATIONS} rounds, hooks installed and removed \
         under load, {} parked workers moved out of a patch)",
        MOVED.load(SeqCst)
    );
}
