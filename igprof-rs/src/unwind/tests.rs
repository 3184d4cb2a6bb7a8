//! Tests of the stack walk against real code: C and assembly built at test
//! time with the system compiler into shared objects that are dlopen'ed
//! into the test process, real signal frames, deep recursion, broken stacks.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::*;

/// Run `f` on the current module table.
fn table<R>(f: impl FnOnce(&modules::ModuleTable) -> R) -> R {
    modules::with_current(f).expect("a module table")
}

/// Serialises module table refreshes of the tests, so that a test can
/// observe the table before and after a refresh of its own.
static TABLE_LOCK: Mutex<()> = Mutex::new(());

fn refresh_locked() {
    let _l = TABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    refresh().unwrap();
}

/// The C compiler for the target: the cross compiler when the tests run
/// under qemu-user for AArch64.
fn c_compiler() -> &'static str {
    if cfg!(target_arch = "aarch64")
        && Command::new("aarch64-linux-gnu-gcc")
            .arg("--version")
            .output()
            .is_ok()
    {
        "aarch64-linux-gnu-gcc"
    } else {
        "cc"
    }
}

/// Registers of a synthetic interrupted context.
fn set_uc_regs(uc: &mut libc::ucontext_t, pc: usize, sp: usize, fp: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] = pc as i64;
        uc.uc_mcontext.gregs[libc::REG_RSP as usize] = sp as i64;
        uc.uc_mcontext.gregs[libc::REG_RBP as usize] = fp as i64;
    }
    #[cfg(target_arch = "aarch64")]
    {
        uc.uc_mcontext.pc = pc as u64;
        uc.uc_mcontext.sp = sp as u64;
        uc.uc_mcontext.regs[29] = fp as u64;
        uc.uc_mcontext.regs[30] = 0;
    }
}

/// Build `sources` (written into a fresh directory) into a shared object
/// with `cc` and `flags` (`-l...` flags go after the sources).
fn build_so(name: &str, sources: &[(&str, &str)], flags: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("igprof-unwind-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new(c_compiler());
    let (libs, flags): (Vec<&str>, Vec<&str>) = flags.iter().partition(|f| f.starts_with("-l"));
    cmd.args(["-shared", "-fPIC", "-g0"]).args(flags);
    for (file, text) in sources {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, text).unwrap();
        cmd.arg(path);
    }
    cmd.args(libs);
    let out = dir.join(format!("lib{name}.so"));
    cmd.arg("-o").arg(&out);
    let res = cmd
        .output()
        .expect("running `cc` (the C compiler the unwinder tests need)");
    assert!(
        res.status.success(),
        "cc failed for {name}: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

struct Lib(*mut libc::c_void);
// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

impl Lib {
    fn open(path: &Path) -> Lib {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string; RTLD_NOW resolves everything up front.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        // SAFETY: dlerror returns NULL or a NUL-terminated message.
        let why = || {
            unsafe { CStr::from_ptr(libc::dlerror()) }
                .to_string_lossy()
                .into_owned()
        };
        assert!(!h.is_null(), "dlopen {}: {}", path.display(), why());
        Lib(h)
    }
    fn sym(&self, name: &str) -> usize {
        let c = CString::new(name).unwrap();
        // SAFETY: valid handle and C string.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "dlsym {name}");
        p as usize
    }
}

/// Name of the function containing `addr` (dladdr: exported symbols only).
fn sym_name(addr: usize) -> String {
    let mut info = unsafe { std::mem::zeroed::<libc::Dl_info>() };
    // SAFETY: info is a valid out pointer.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0
        || info.dli_sname.is_null()
    {
        return format!("?{addr:#x}");
    }
    // SAFETY: dladdr returned a NUL-terminated name.
    unsafe { CStr::from_ptr(info.dli_sname) }
        .to_string_lossy()
        .into_owned()
}

/// Names of a trace's frames. Entry 0 (an interrupted PC when `from_pc`)
/// is looked up as is, return addresses at the call instruction.
fn names(trace: &[usize], from_pc: bool) -> Vec<String> {
    trace
        .iter()
        .enumerate()
        .map(|(i, &a)| sym_name(if i == 0 && from_pc { a } else { a - 1 }))
        .collect()
}

const CHAIN_C: &str = r#"
typedef long (*cb_t)(void *);
#define KEEP __attribute__((noipa))
/* Garbage in rbp while the callee runs, in the x86-64 build without frame
   pointers: the unwinder must not rely on rbp there. (GCC for AArch64 does
   not save x29 for an asm clobber, so there it stays unused instead.) */
#if defined(CLOBBER_FP) && defined(__x86_64__)
#define SCRAMBLE() __asm__ volatile("mov $0x5a5a5a5a5a5a5a5a, %%rbp" ::: "rbp")
#else
#define SCRAMBLE() do {} while (0)
#endif
KEEP long chain_c(cb_t cb, void *arg, volatile long *sink) { long r = cb(arg); *sink += r; return r + 1; }
KEEP long chain_b(cb_t cb, void *arg, volatile long *sink) { SCRAMBLE(); long r = chain_c(cb, arg, sink); *sink += r; return r + 2; }
KEEP long chain_a(cb_t cb, void *arg, volatile long *sink) { volatile char buf[200]; buf[0] = 1; buf[199] = (char)*sink; *sink += buf[0] + buf[199]; long r = chain_b(cb, arg, sink); *sink += r; return r + 3; }
KEEP long rec(int n, cb_t cb, void *arg, volatile long *sink) { if (n == 0) { long r = cb(arg); *sink += r; return r; } long r = rec(n - 1, cb, arg, sink); *sink += r; return r + 1; }
KEEP unsigned long mix(unsigned long x) { x ^= x >> 13; x *= 0x9E3779B97F4A7C15ul; return x ^ (x >> 29); }
KEEP unsigned long spin_c(volatile int *stop) { unsigned long x = 1; SCRAMBLE(); while (!*stop) x = mix(x) + x; return x; }
KEEP unsigned long spin_b(volatile int *stop) { SCRAMBLE(); unsigned long r = spin_c(stop); return r * 3 + mix(r); }
KEEP unsigned long spin_a(volatile int *stop) { unsigned long r = spin_b(stop); return r * 5 + mix(r); }
"#;

type Cb = extern "C" fn(*mut libc::c_void) -> libc::c_long;
type ChainFn = extern "C" fn(Cb, *mut libc::c_void, *mut libc::c_long) -> libc::c_long;
type RecFn = extern "C" fn(libc::c_int, Cb, *mut libc::c_void, *mut libc::c_long) -> libc::c_long;
type SpinFn = extern "C" fn(*const libc::c_int) -> libc::c_ulong;

/// The chain library in both builds, loaded once per test process.
fn chain_libs() -> &'static [(&'static str, Lib); 2] {
    static LIBS: OnceLock<[(&'static str, Lib); 2]> = OnceLock::new();
    LIBS.get_or_init(|| {
        let nofp = build_so(
            "chain-nofp",
            &[("chain.c", CHAIN_C)],
            &["-O2", "-fomit-frame-pointer", "-DCLOBBER_FP"],
        );
        let fp = build_so(
            "chain-fp",
            &[("chain.c", CHAIN_C)],
            &["-O2", "-fno-omit-frame-pointer"],
        );
        let libs = [
            ("-fomit-frame-pointer", Lib::open(&nofp)),
            ("-fno-omit-frame-pointer", Lib::open(&fp)),
        ];
        refresh_locked();
        libs
    })
}

/// What a callback does inside the chain: trace from here into `out`.
struct HereCtx {
    unwinder: ThreadUnwinder,
    bounds: StackBounds,
    out: Vec<usize>,
    trace: Option<Trace>,
}

extern "C" fn trace_cb(arg: *mut libc::c_void) -> libc::c_long {
    // SAFETY: arg is the &mut HereCtx the test passed down the chain.
    let ctx = unsafe { &mut *arg.cast::<HereCtx>() };
    ctx.trace = Some(ctx.unwinder.trace_here(&ctx.bounds, &mut ctx.out));
    7
}

fn here_ctx(depth: usize) -> HereCtx {
    HereCtx {
        unwinder: ThreadUnwinder::new().unwrap(),
        bounds: StackBounds::for_current_thread().unwrap(),
        out: vec![0; depth],
        trace: None,
    }
}

#[test]
fn chain_from_here_with_and_without_frame_pointers() {
    for (build, lib) in chain_libs() {
        // SAFETY: chain_a has the ChainFn signature (CHAIN_C).
        let chain_a: ChainFn = unsafe { std::mem::transmute(lib.sym("chain_a")) };
        let mut ctx = here_ctx(DEFAULT_MAX_DEPTH);
        let mut sink = 0;
        let mut walks = Vec::new();
        for round in 0..2 {
            // Round 0 fills the cache, round 1 must give the same from it.
            run_chain(chain_a, &mut ctx, &mut sink);
            let t = ctx.trace.take().unwrap();
            walks.push((ctx.out[..t.depth].to_vec(), ctx.unwinder.stats()));
            let n = names(&ctx.out[..t.depth], false);
            assert_eq!(
                &n[..3],
                ["chain_c", "chain_b", "chain_a"],
                "{build} round {round}: {n:?}"
            );
            assert_eq!(
                t.end,
                TraceEnd::Outermost,
                "{build}: the walk reaches the thread's first frame: {n:?}"
            );
            assert!(!t.truncated());
            // The test function itself (in this binary) follows the chain.
            let me =
                module_of(chain_from_here_with_and_without_frame_pointers as *const () as usize)
                    .unwrap();
            assert!(
                ctx.out[3..t.depth]
                    .iter()
                    .any(|&a| me.text.0 <= a && a < me.text.1),
                "{build}: {n:?}"
            );
        }
        let ((first, s0), (second, s1)) = (&walks[0], &walks[1]);
        // The same stack twice, but for the call site of run_chain (an
        // optimised build may unroll the loop).
        assert_eq!(first.len(), second.len(), "{build}");
        assert_eq!(first[..4], second[..4], "{build}");
        assert_eq!(first[5..], second[5..], "{build}");
        assert_eq!(s0.hits, 0, "{build}");
        // Every lookup of the second walk hits, unless three of its PCs
        // share a cache set (exact cache behaviour: descriptor.rs tests).
        let lookups = s0.misses;
        assert_eq!(s1.hits + s1.misses - s0.misses, lookups, "{build}");
        assert!(
            s1.misses - s0.misses <= lookups / 4,
            "{build}: second walk served from the cache: {s0:?} {s1:?}"
        );
    }
}

/// Threads keep walking (and so keep their caches in step with the table)
/// while another thread loads and unloads a library and refreshes the
/// module table after each change.
#[test]
fn walks_while_objects_load_and_unload() {
    let (_, lib) = &chain_libs()[0];
    // SAFETY: chain_a has the ChainFn signature (CHAIN_C).
    let chain_a: ChainFn = unsafe { std::mem::transmute(lib.sym("chain_a")) };
    let churn = build_so(
        "churn",
        &[("churn.c", "int churn_fn(void) { return 1; }\n")],
        &["-O2"],
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let walks = std::thread::scope(|s| {
        let walkers: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    let mut ctx = here_ctx(DEFAULT_MAX_DEPTH);
                    let mut sink = 0;
                    let mut walks = 0;
                    while !stop.load(Ordering::Relaxed) || walks < 10 {
                        run_chain(chain_a, &mut ctx, &mut sink);
                        let t = ctx.trace.take().unwrap();
                        assert_eq!(t.end, TraceEnd::Outermost);
                        let n = names(&ctx.out[..3], false);
                        assert_eq!(n, ["chain_c", "chain_b", "chain_a"]);
                        walks += 1;
                    }
                    walks
                })
            })
            .collect();
        for _ in 0..30 {
            // Load and unload under the lock too, so that the tests that
            // compare tables across a refresh see none of this.
            let _l = TABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let h = Lib::open(&churn);
            refresh().unwrap();
            let f = h.sym("churn_fn");
            assert!(module_of(f).is_some());
            // SAFETY: nothing of the library is in use.
            assert_eq!(unsafe { libc::dlclose(h.0) }, 0);
            refresh().unwrap();
            assert!(module_of(f).is_none());
        }
        stop.store(true, Ordering::Relaxed);
        walkers
            .into_iter()
            .map(|w| w.join().unwrap())
            .sum::<usize>()
    });
    assert!(walks >= 30);
}

/// One call site for every round, so that both walks see the same stack.
#[inline(never)]
fn run_chain(chain_a: ChainFn, ctx: &mut HereCtx, sink: &mut libc::c_long) {
    chain_a(trace_cb, (ctx as *mut HereCtx).cast(), sink);
    std::hint::black_box(ctx);
}

#[test]
fn deep_recursion_truncates_at_the_limit() {
    for (build, lib) in chain_libs() {
        // SAFETY: rec has the RecFn signature (CHAIN_C).
        let rec: RecFn = unsafe { std::mem::transmute(lib.sym("rec")) };
        let mut sink = 0;
        // 10,000 frames need more than the test thread's default stack.
        let out = std::thread::scope(|s| {
            std::thread::Builder::new()
                .stack_size(64 << 20)
                .spawn_scoped(s, || {
                    let mut small = here_ctx(DEFAULT_MAX_DEPTH);
                    rec(
                        10_000,
                        trace_cb,
                        (&mut small as *mut HereCtx).cast(),
                        &mut sink,
                    );
                    let mut full = here_ctx(20_000);
                    rec(
                        10_000,
                        trace_cb,
                        (&mut full as *mut HereCtx).cast(),
                        &mut sink,
                    );
                    (
                        small.trace.unwrap(),
                        small.out,
                        full.trace.unwrap(),
                        full.out,
                    )
                })
                .unwrap()
                .join()
                .unwrap()
        });
        let (t, small, tf, full) = out;
        assert_eq!(
            t,
            Trace {
                depth: DEFAULT_MAX_DEPTH,
                end: TraceEnd::Truncated
            },
            "{build}"
        );
        assert!(t.truncated());
        assert!(names(&small, false).iter().all(|n| n == "rec"), "{build}");
        assert_eq!(tf.end, TraceEnd::Outermost, "{build}");
        let n = names(&full[..tf.depth], false);
        // rec(10000) .. rec(0): 10,001 frames, the callback's caller first.
        assert_eq!(
            n.iter().take_while(|n| *n == "rec").count(),
            10_001,
            "{build}"
        );
        assert_eq!(
            &full[..DEFAULT_MAX_DEPTH],
            &small[..],
            "{build}: the truncated trace is a prefix"
        );
    }
}

/// A signal handler that traces both ways into preallocated buffers.
struct SignalCtx {
    unwinder: ThreadUnwinder,
    bounds: StackBounds,
    from_uc: [usize; 256],
    from_uc_trace: Option<Trace>,
    here: [usize; 256],
    here_trace: Option<Trace>,
    /// Address of a local of the handler: which stack it ran on.
    handler_local: usize,
}

static SIGNAL_CTX: AtomicPtr<SignalCtx> = AtomicPtr::new(std::ptr::null_mut());
/// One signal test at a time: the handler and its context are process-wide.
static SIGNAL_TESTS: Mutex<()> = Mutex::new(());

extern "C" fn tracing_handler(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    uc: *mut libc::c_void,
) {
    let p = SIGNAL_CTX.load(Ordering::Acquire);
    // SAFETY: set by the test on this thread before the signal is raised.
    let Some(ctx) = (unsafe { p.as_mut() }) else {
        return;
    };
    // SAFETY: uc is this handler's ucontext.
    ctx.from_uc_trace = Some(unsafe {
        ctx.unwinder
            .trace_from_ucontext(uc, &ctx.bounds, &mut ctx.from_uc)
    });
    ctx.here_trace = Some(ctx.unwinder.trace_here(&ctx.bounds, &mut ctx.here));
    let local = 0u8;
    ctx.handler_local = std::hint::black_box(&local) as *const u8 as usize;
}

/// A real-time signal rather than SIGPROF, so that these tests cannot meet
/// a profiling timer that another test of this crate may run in parallel;
/// the frames the kernel builds are the same for every signal.
fn test_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

fn install(handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)) {
    install_with(handler, 0);
}

fn install_with(
    handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
    flags: libc::c_int,
) {
    // SAFETY: a zeroed sigaction with a valid SA_SIGINFO handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | flags;
        assert_eq!(libc::sigaction(test_signal(), &sa, std::ptr::null_mut()), 0);
    }
}

extern "C" fn raise_cb(_arg: *mut libc::c_void) -> libc::c_long {
    // SAFETY: signal to the calling thread; the handler is installed.
    unsafe { libc::pthread_kill(libc::pthread_self(), test_signal()) as libc::c_long }
}

#[test]
fn trace_through_a_signal_frame() {
    let _one = SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    // The handler runs on the thread's stack, then on an alternate signal
    // stack of its own (the walk from inside it crosses from one to the
    // other through the signal frame).
    let mut alt = vec![0u8; 256 << 10];
    let cases = chain_libs()
        .iter()
        .map(|(b, l)| (*b, l, false))
        .chain(chain_libs().iter().map(|(b, l)| (*b, l, true)));
    for (build, lib, on_altstack) in cases {
        let mut old_ss: libc::stack_t = unsafe { std::mem::zeroed() };
        if on_altstack {
            let ss = libc::stack_t {
                ss_sp: alt.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: alt.len(),
            };
            // SAFETY: `alt` outlives its use as this thread's altstack (restored below).
            assert_eq!(unsafe { libc::sigaltstack(&ss, &mut old_ss) }, 0);
        }
        let build = if on_altstack {
            format!("{build}, handler on an altstack")
        } else {
            build.to_string()
        };
        // SAFETY: chain_a has the ChainFn signature.
        let chain_a: ChainFn = unsafe { std::mem::transmute(lib.sym("chain_a")) };
        let mut ctx = Box::new(SignalCtx {
            unwinder: ThreadUnwinder::new().unwrap(),
            bounds: StackBounds::for_current_thread().unwrap(),
            from_uc: [0; 256],
            from_uc_trace: None,
            here: [0; 256],
            here_trace: None,
            handler_local: 0,
        });
        SIGNAL_CTX.store(&mut *ctx, Ordering::Release);
        install_with(
            tracing_handler,
            if on_altstack { libc::SA_ONSTACK } else { 0 },
        );
        let mut sink = 0;
        chain_a(raise_cb, std::ptr::null_mut(), &mut sink);
        SIGNAL_CTX.store(std::ptr::null_mut(), Ordering::Release);
        if on_altstack {
            // SAFETY: restores the thread's previous alternate stack.
            assert_eq!(
                unsafe { libc::sigaltstack(&old_ss, std::ptr::null_mut()) },
                0
            );
            let a = alt.as_ptr() as usize;
            assert!(
                (a..a + alt.len()).contains(&ctx.handler_local),
                "{build}: ran on the altstack"
            );
            assert_eq!(ctx.bounds.altstack, (a, a + alt.len()), "{build}");
        } else {
            assert!(
                ctx.bounds.stack.0 <= ctx.handler_local && ctx.handler_local < ctx.bounds.stack.1
            );
        }

        // From the ucontext: the interrupted PC is in libc (pthread_kill),
        // then raise_cb, then the chain.
        let t = ctx.from_uc_trace.unwrap();
        let n = names(&ctx.from_uc[..t.depth], true);
        assert_eq!(t.end, TraceEnd::Outermost, "{build}: {n:?}");
        let c = n
            .iter()
            .position(|s| s == "chain_c")
            .unwrap_or_else(|| panic!("{build}: {n:?}"));
        assert_eq!(
            &n[c..c + 3],
            ["chain_c", "chain_b", "chain_a"],
            "{build}: {n:?}"
        );
        let me = module_of(raise_cb as *const () as usize).unwrap();
        assert!(
            c >= 2 && (me.text.0..me.text.1).contains(&ctx.from_uc[c - 1]),
            "{build}: raise_cb calls libc: {n:?}"
        );
        assert!(
            module_of(ctx.from_uc[0]).unwrap().path.ends_with(b".so.6"),
            "{build}: interrupted in libc: {n:?}"
        );

        // From inside the handler: the handler's frames are skipped, the
        // signal trampoline is recorded, then exactly the ucontext trace.
        let h = ctx.here_trace.unwrap();
        let hn = names(&ctx.here[..h.depth], false);
        if cfg!(target_arch = "aarch64") && module_of(ctx.here[0]).is_none() {
            // qemu-user (7.2) returns from handlers through a trampoline
            // page of its own, in no loaded object; a kernel uses the vDSO's
            // __kernel_rt_sigreturn, which the module table lists. The walk
            // keeps the address and stops there.
            assert_eq!(
                h,
                Trace {
                    depth: 1,
                    end: TraceEnd::Broken(BrokenFrame::NotInAnyObject { pc: ctx.here[0] })
                },
                "{build}: {hn:?}"
            );
            continue;
        }
        assert_eq!(h.end, TraceEnd::Outermost, "{build}: {hn:?}");
        // glibc's __restore_rt is a local symbol that dladdr cannot name.
        assert!(
            table(|t| t.code_at(ctx.here[0], super::arch::SIGRETURN)),
            "{build}: {hn:?}"
        );
        assert_eq!(
            &ctx.here[1..h.depth],
            &ctx.from_uc[..t.depth],
            "{build}: {hn:?}"
        );
    }
}

/// What the sampling handler writes into: preallocated, one per test run.
struct Sampler {
    unwinder: ThreadUnwinder,
    bounds: StackBounds,
    traces: Vec<[usize; 256]>,
    ends: Vec<Trace>,
}

static SAMPLER: AtomicPtr<Sampler> = AtomicPtr::new(std::ptr::null_mut());
static TAKEN: AtomicUsize = AtomicUsize::new(0);
/// Set when the sampler's buffers are full.
static FULL: AtomicI32 = AtomicI32::new(0);

extern "C" fn sampling_handler(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    uc: *mut libc::c_void,
) {
    // SAFETY: set before the timer starts; only this thread is signalled.
    let Some(s) = (unsafe { SAMPLER.load(Ordering::Acquire).as_mut() }) else {
        return;
    };
    let i = TAKEN.load(Ordering::Relaxed);
    if i >= s.ends.len() {
        FULL.store(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: uc is this handler's ucontext; buffers are preallocated.
    s.ends[i] = unsafe {
        s.unwinder
            .trace_from_ucontext(uc, &s.bounds, &mut s.traces[i])
    };
    TAKEN.store(i + 1, Ordering::Relaxed);
}

/// Run `work` while a thread CPU-time timer samples this thread every
/// `interval_ns` (at most `capacity` samples; `FULL` is set once taken).
/// The caller holds `SIGNAL_TESTS`.
fn sample_during<R>(
    interval_ns: i64,
    capacity: usize,
    work: impl FnOnce() -> R,
) -> (R, Vec<(Vec<usize>, Trace)>) {
    let mut s = Box::new(Sampler {
        unwinder: ThreadUnwinder::new().unwrap(),
        bounds: StackBounds::for_current_thread().unwrap(),
        traces: vec![[0; 256]; capacity],
        ends: vec![
            Trace {
                depth: 0,
                end: TraceEnd::NoModuleTable
            };
            capacity
        ],
    });
    FULL.store(0, Ordering::Relaxed);
    TAKEN.store(0, Ordering::Relaxed);
    SAMPLER.store(&mut *s, Ordering::Release);
    install(sampling_handler);
    let interval = libc::timespec {
        tv_sec: 0,
        tv_nsec: interval_ns,
    };
    // SAFETY: a per-thread CPU-time timer that signals this thread; deleted
    // below.
    let timer = unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = test_signal();
        sev.sigev_notify_thread_id = crate::sys::gettid();
        let mut timer: libc::timer_t = std::mem::zeroed();
        assert_eq!(
            libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut timer),
            0
        );
        let its = libc::itimerspec {
            it_interval: interval,
            it_value: interval,
        };
        assert_eq!(libc::timer_settime(timer, 0, &its, std::ptr::null_mut()), 0);
        timer
    };
    let r = work();
    // No sample after the work: one taken in this function would have none
    // of the work's frames (seen under qemu, where the timer's deletion is
    // slow enough for a sample to land before it).
    SAMPLER.store(std::ptr::null_mut(), Ordering::Release);
    // SAFETY: the timer created above.
    unsafe { libc::timer_delete(timer) };
    let n = TAKEN.load(Ordering::Relaxed);
    let samples = s.traces[..n]
        .iter()
        .zip(&s.ends[..n])
        .map(|(t, e)| (t[..e.depth].to_vec(), *e))
        .collect();
    (r, samples)
}

/// Samples taken by a thread CPU-time timer at arbitrary instructions
/// (prologues, epilogues, loop bodies of code with and without frame
/// pointers): every one must unwind through the whole chain.
#[test]
fn timer_samples_at_arbitrary_instructions() {
    let _one = SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    for (build, lib) in chain_libs() {
        // SAFETY: spin_a has the SpinFn signature.
        let spin_a: SpinFn = unsafe { std::mem::transmute(lib.sym("spin_a")) };
        let (_, samples) = sample_during(500_000, 150, || spin_a(FULL.as_ptr()));
        assert_eq!(samples.len(), 150);
        let me = module_of(timer_samples_at_arbitrary_instructions as *const () as usize).unwrap();
        let chain = ["spin_c", "spin_b", "spin_a"];
        for (trace, t) in &samples {
            let n = names(trace, true);
            assert_eq!(t.end, TraceEnd::Outermost, "{build}: {n:?}");
            // The leaf is spin_c, or mix or the PLT stub spin_c calls it
            // through; spin_c, spin_b, spin_a follow in order.
            let start = n
                .iter()
                .position(|f| f == "spin_c")
                .unwrap_or_else(|| panic!("{build}: {n:?}"));
            assert!(start <= 2, "{build}: {n:?}");
            assert_eq!(&n[start..start + 3], chain, "{build}: {n:?}");
            let after = trace[start + 3];
            assert!(
                me.text.0 <= after && after < me.text.1,
                "{build}: spin_a returns into the test: {n:?}"
            );
        }
    }
}

const THROW_CC: &str = r#"
#include <stdexcept>
#define KEEP __attribute__((noipa))
extern "C" {
KEEP int thrower(int n, volatile int *sink) {
    if (n == 0) throw std::runtime_error("deep");
    int r = thrower(n - 1, sink); *sink += r; return r + 1;
}
KEEP long catcher(int rounds) {
    volatile int sink = 0; long caught = 0;
    for (int i = 0; i < rounds; i++) {
        try { thrower(50, &sink); } catch (const std::exception &) { caught++; }
    }
    return caught;
}
}
"#;

/// Samples (timer interval 100 us of CPU) while C++ exceptions unwind through 50
/// frames: the exceptions are all caught, and the walks (many of them
/// through libgcc's unwinder and libstdc++) reach the outermost frame.
#[test]
fn timer_samples_while_cpp_exceptions_unwind() {
    let _one = SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let path = build_so(
        "throw",
        &[("throw.cc", THROW_CC)],
        &["-O2", "-fomit-frame-pointer", "-lstdc++"],
    );
    let lib = Lib::open(&path);
    refresh_locked();
    // SAFETY: catcher(int) -> long (THROW_CC).
    let catcher: extern "C" fn(libc::c_int) -> libc::c_long =
        unsafe { std::mem::transmute(lib.sym("catcher")) };
    // CPU-time timers fire at most once per scheduler tick (4 ms at
    // HZ=250), whatever the interval, and only at a tick the thread is
    // running at (on a loaded machine, fewer of them per millisecond of
    // CPU): throw in rounds of 1,000 until 40 samples are in, for at most
    // 10 s of this thread's CPU time (a timer that never fires fails).
    const ROUNDS: i32 = 1_000;
    const SAMPLES: usize = 40;
    let cpu_ms = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec * 1000 + t.tv_nsec / 1_000_000
    };
    let start = cpu_ms();
    let ((thrown, caught), samples) = sample_during(100_000, 2000, || {
        let (mut thrown, mut caught) = (0, 0);
        while TAKEN.load(Ordering::Relaxed) < SAMPLES && cpu_ms() - start < 10_000 {
            thrown += ROUNDS as libc::c_long;
            caught += catcher(ROUNDS);
        }
        (thrown, caught)
    });
    assert_eq!(caught, thrown);
    assert!(
        samples.len() >= SAMPLES,
        "{} samples in {} ms of CPU time",
        samples.len(),
        cpu_ms() - start
    );
    let (mut in_unwinder, mut outermost, mut cut_short) = (0, 0, Vec::new());
    let mut taken = 0;
    for (trace, t) in &samples {
        let n = names(trace, true);
        let unwinding = n.iter().any(|f| f.starts_with("_Unwind_"));
        // catcher, or its cold part (the landing pad; a local symbol
        // dladdr cannot name), is on every complete stack taken inside it.
        let in_lib = |(i, a): (usize, &usize)| {
            let at = if i == 0 { *a } else { a - 1 };
            module_of(at).is_some_and(|m| m.path.ends_with(b"libthrow.so"))
        };
        let inside = trace.iter().enumerate().any(in_lib);
        if t.end == TraceEnd::Outermost && !inside && !unwinding {
            // A complete stack of the loop around catcher (its CPU clock
            // reading every round: seen in CI on a loaded machine): not a
            // sample of the exceptions.
            continue;
        }
        taken += 1;
        in_unwinder += unwinding as usize;
        let complete = t.end == TraceEnd::Outermost && inside;
        outermost += complete as usize;
        if !complete {
            // libgcc's CFI is not exact while `__builtin_eh_return` moves
            // the stack to the landing pad's frame: a walk from there may
            // end early (broken, or at a word that is no return address,
            // seen once in CI under qemu), never outside the unwinder.
            assert!(unwinding, "{t:?} {n:?}");
            cut_short.push((t.end, n));
        }
    }

    assert!(
        in_unwinder > 0,
        "some samples land in the exception unwinder"
    );
    assert!(
        taken * 2 >= samples.len(),
        "{taken} of {} samples in catcher",
        samples.len()
    );
    assert!(
        outermost * 10 >= taken * 9,
        "{outermost} of {taken} samples complete; cut short: {cut_short:?}"
    );
}

/// Unwind rules of hand-written functions with exact CFI.
#[cfg(target_arch = "x86_64")]
const DESC_S: &str = r#"
    .text
    .macro fn name
    .globl \name
    .type \name, @function
\name:
    .endm

fn fsp
    .cfi_startproc
    push %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -16
    sub $32, %rsp
    .cfi_adjust_cfa_offset 32
fn fsp_body
    nop
    add $32, %rsp
    .cfi_adjust_cfa_offset -32
    pop %rbx
    .cfi_adjust_cfa_offset -8
fn fsp_ret
    ret
    .cfi_endproc

fn ffp
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    mov %rsp, %rbp
    .cfi_def_cfa_register %rbp
    sub $64, %rsp
fn ffp_body
    nop
    leave
    .cfi_def_cfa %rsp, 8
    ret
    .cfi_endproc

fn fsaved
    .cfi_startproc
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbp, -16
    push %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -24
fn fsaved_body
    nop
    pop %rbx
    .cfi_adjust_cfa_offset -8
    pop %rbp
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc

fn fbig
    .cfi_startproc
    sub $0x20000, %rsp
    .cfi_adjust_cfa_offset 0x20000
fn fbig_body
    nop
    add $0x20000, %rsp
    .cfi_adjust_cfa_offset -0x20000
    ret
    .cfi_endproc

fn fexpr
    .cfi_startproc
    /* DW_CFA_def_cfa_expression { DW_OP_breg7 (rsp) 0; DW_OP_lit2; DW_OP_mul } */
    .cfi_escape 0x0f, 0x04, 0x77, 0x00, 0x32, 0x1e
fn fexpr_body
    nop
    ret
    .cfi_endproc

    /* The CFA expression of a lazy-binding PLT entry: rsp + 8, plus 8
       from the 11th byte of each 16-byte entry on (after its push). */
    .p2align 4
fn fplt
    .cfi_startproc
    .cfi_escape 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22
    .fill 16, 1, 0x90
    ret
    .cfi_endproc

fn fundef
    .cfi_startproc
    .cfi_undefined %rip
fn fundef_body
    nop
    ret
    .cfi_endproc

    nop
fn fsigret
    .byte 0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05
    .section .note.GNU-stack,"",@progbits
"#;

/// What a descriptor test expects at one address.
enum Expect {
    Is(descriptor::Descriptor),
    OfKind(descriptor::Kind),
}

/// Check `step::describe` at each (label, pc, first, expectation).
fn check_descriptors(cases: &[(&str, usize, bool, Expect)]) {
    let mut fh = FramehopCache::new_in();
    for (label, pc, first, expect) in cases {
        let got = table(|t| step::describe(t, &mut fh, *pc, *first));
        let direct = table(|t| step::direct(t, *pc, *first));
        if let Some(d) = direct {
            assert_eq!(d, got, "{label}: read from the CFI row directly");
        }
        match expect {
            Expect::Is(d) => assert_eq!(got, *d, "{label}"),
            Expect::OfKind(k) => assert_eq!(got.kind, *k, "{label}: {got:?}"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn descriptors_from_real_eh_frame() {
    use descriptor::{Descriptor, Kind::*};
    use Expect::*;
    let lib = Lib::open(&build_so("desc", &[("desc.S", DESC_S)], &[]));
    refresh_locked();
    let d = Descriptor::new;
    let at = |sym: &str| lib.sym(sym);
    // A return address is looked up one byte before it.
    let ret = |sym: &str| lib.sym(sym) + 1;
    check_descriptors(&[
        (
            "function entry",
            at("fsp"),
            true,
            Is(d(CfaSp, 8, -1, 0, true)),
        ),
        (
            "pushed rbx, 32 bytes",
            at("fsp_body"),
            true,
            Is(d(CfaSp, 48, -1, 0, true)),
        ),
        (
            "as a return address",
            ret("fsp_body"),
            false,
            Is(d(CfaSp, 48, -1, 0, false)),
        ),
        (
            "epilogue",
            at("fsp_ret"),
            true,
            Is(d(CfaSp, 8, -1, 0, true)),
        ),
        (
            "frame pointer",
            at("ffp_body"),
            true,
            Is(d(CfaFp, 16, -1, -2, true)),
        ),
        (
            "rbp saved, not a frame pointer",
            at("fsaved_body"),
            true,
            Is(d(CfaSp, 24, -1, -2, true)),
        ),
        (
            "128 KiB frame",
            at("fbig_body"),
            true,
            Is(d(CfaSp, 0x20008, -1, 0, true)),
        ),
        (
            "a CFA that is no offset from rsp or rbp",
            at("fexpr_body"),
            true,
            OfKind(Framehop),
        ),
        (
            "PLT expression, before its push",
            at("fplt") + 2,
            true,
            Is(d(CfaSp, 8, -1, 0, true)),
        ),
        (
            "PLT expression, after its push",
            at("fplt") + 12,
            true,
            Is(d(CfaSp, 16, -1, 0, true)),
        ),
        (
            "undefined return address",
            at("fundef_body"),
            true,
            OfKind(Outermost),
        ),
        // A handler returns to the trampoline's first byte.
        (
            "sigreturn trampoline",
            at("fsigret"),
            false,
            OfKind(SignalFrame),
        ),
        (
            "no FDE: framehop's frame-pointer rule",
            at("fsigret") + 1,
            false,
            Is(d(CfaFp, 16, -1, -2, false)),
        ),
        (
            "libc's getpid at entry",
            libc::getpid as *const () as usize,
            true,
            Is(d(CfaSp, 8, -1, 0, true)),
        ),
    ]);
}

/// Descriptors read from CFI rows directly (`cfi.rs`) are framehop's, on
/// every FDE of the objects in this process (the test binary, libc, ld.so,
/// libgcc_s, and the larger libraries below when installed: code of GCC,
/// Clang and rustc, with and without frame pointers): at its start, its
/// last byte and spread addresses, as an interrupted PC and as a return
/// address. Most of them must be answered directly: about 15% of the
/// addresses lie in the padding between two functions, outside any FDE,
/// where framehop has a rule of its own and the reader rightly declines;
/// of the rest, all but a few dozen in 400,000 are read directly. On
/// AArch64 (70% read directly of 198,000 under qemu) a fifth more are
/// return addresses in code whose return address is still in LR, where no
/// caller returns and framehop has no rule either.
#[test]
fn cfi_rows_give_framehops_descriptors() {
    let libs: Vec<Lib> = [
        "libstdc++.so.6",
        "libsqlite3.so.0",
        "libcrypto.so.3",
        "libpython3.11.so.1.0",
        "libz.so.1",
    ]
    .iter()
    .filter_map(|name| {
        let c = CString::new(*name).unwrap();
        // SAFETY: a NUL-terminated library name; the handle is kept below.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        (!h.is_null()).then_some(Lib(h))
    })
    .collect();
    refresh_locked();
    let mut fh = FramehopCache::new_in();
    let (mut asked, mut direct, mut fdes) = (0u64, 0u64, 0usize);
    table(|t| {
        for m in t.entries() {
            let starts = cfi::fde_starts(m);
            // At most 3,000 FDEs of an object, spread over all of them.
            let step = starts.len().div_ceil(3000).max(1);
            for (i, &start) in starts.iter().enumerate().step_by(step) {
                let end = starts
                    .get(i + 1)
                    .copied()
                    .unwrap_or(start + 64)
                    .min(m.text.1);
                if end <= start {
                    continue;
                }
                fdes += 1;
                let len = end - start;
                let mut addrs = vec![start, start + 1, end - 1];
                addrs.extend((1..12).map(|k| start + (len * k * 7919 / 12) % len));
                for a in addrs {
                    for first in [true, false] {
                        let pc = if first { a } else { a + 1 };
                        asked += 1;
                        if let Some(d) = step::direct(t, pc, first) {
                            direct += 1;
                            let f = step::describe_by_framehop(t, &mut fh, pc, first);
                            assert_eq!(d, f, "pc {pc:#x} (first: {first}) in {:?}", m.text);
                        }
                    }
                }
            }
        }
    });
    drop(libs);
    eprintln!("{fdes} FDEs, {asked} addresses, {direct} read directly");
    assert!(fdes > 5000, "only {fdes} FDEs checked");
    let tenths = if cfg!(target_arch = "aarch64") { 6 } else { 8 };
    assert!(
        direct * 10 > asked * tenths,
        "{direct} of {asked} read directly"
    );
}

/// AArch64 unwind rules of hand-written functions with exact CFI.
#[cfg(target_arch = "aarch64")]
const DESC_AARCH64_S: &str = r#"
    .text
    .macro fn name
    .globl \name
    .type \name, @function
\name:
    .endm

fn aleaf
    .cfi_startproc
fn aleaf_body
    nop
    ret
    .cfi_endproc

fn aframe
    .cfi_startproc
    stp x29, x30, [sp, -48]!
    .cfi_def_cfa_offset 48
    .cfi_offset 29, -48
    .cfi_offset 30, -40
    mov x29, sp
fn aframe_body
    nop
    ldp x29, x30, [sp], 48
    .cfi_restore 30
    .cfi_restore 29
    .cfi_def_cfa_offset 0
fn aframe_ret
    ret
    .cfi_endproc

fn afp
    .cfi_startproc
    stp x29, x30, [sp, -32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov x29, sp
    .cfi_def_cfa 29, 32
    sub sp, sp, #64
fn afp_body
    nop
    mov sp, x29
    ldp x29, x30, [sp], 32
    ret
    .cfi_endproc

fn apac
    .cfi_startproc
    hint #25
    .cfi_negate_ra_state
    stp x29, x30, [sp, -32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov x29, sp
fn apac_body
    nop
    ldp x29, x30, [sp], 32
    .cfi_restore 30
    .cfi_restore 29
    .cfi_def_cfa_offset 0
    hint #29
    .cfi_negate_ra_state
fn apac_ret
    ret
    .cfi_endproc

fn aundef
    .cfi_startproc
    .cfi_undefined 30
fn aundef_body
    nop
    ret
    .cfi_endproc

    nop
fn asigret
    .inst 0xd2801168
    .inst 0xd4000001
    .section .note.GNU-stack,"",@progbits
"#;

#[cfg(target_arch = "aarch64")]
#[test]
fn descriptors_from_real_eh_frame() {
    use descriptor::{Descriptor, Kind::*};
    use Expect::*;
    let lib = Lib::open(&build_so(
        "desc-aarch64",
        &[("desc.S", DESC_AARCH64_S)],
        &[],
    ));
    refresh_locked();
    let d = Descriptor::new;
    let at = |sym: &str| lib.sym(sym);
    // A return address (after a 4-byte bl) is looked up one byte before it.
    let ret = |sym: &str| lib.sym(sym) + 4;
    check_descriptors(&[
        // A leaf: the return address is still in LR (slot 0), SP unchanged.
        ("leaf", at("aleaf_body"), true, Is(d(CfaSp, 0, 0, 0, true))),
        (
            "function entry",
            at("aframe"),
            true,
            Is(d(CfaSp, 0, 0, 0, true)),
        ),
        (
            "x29, x30 saved",
            at("aframe_body"),
            true,
            Is(d(CfaSp, 48, -5, -6, true)),
        ),
        (
            "as a return address",
            ret("aframe_body"),
            false,
            Is(d(CfaSp, 48, -5, -6, false)),
        ),
        (
            "epilogue",
            at("aframe_ret"),
            true,
            Is(d(CfaSp, 0, 0, 0, true)),
        ),
        (
            "frame pointer",
            at("afp_body"),
            true,
            Is(d(CfaFp, 32, -3, -4, true)),
        ),
        // Pointer authentication (paciasp, autiasp: hints 25 and 29)
        // toggles the return address's signing state in the CFI
        // (negate_ra_state), not where it is saved.
        (
            "signed return address saved",
            at("apac_body"),
            true,
            Is(d(CfaSp, 32, -3, -4, true)),
        ),
        (
            "signed, as a return address",
            ret("apac_body"),
            false,
            Is(d(CfaSp, 32, -3, -4, false)),
        ),
        (
            "after autiasp",
            at("apac_ret"),
            true,
            Is(d(CfaSp, 0, 0, 0, true)),
        ),
        // framehop reads an undefined LR as "same value" in the first frame
        // and as the end of the stack in a caller.
        (
            "undefined LR, first frame",
            at("aundef_body"),
            true,
            Is(d(CfaSp, 0, 0, 0, true)),
        ),
        (
            "undefined LR, caller",
            ret("aundef_body"),
            false,
            OfKind(Outermost),
        ),
        (
            "sigreturn trampoline",
            at("asigret"),
            false,
            OfKind(SignalFrame),
        ),
    ]);
}

#[test]
fn broken_stacks_end_the_trace_without_crashing() {
    let (_, lib) = &chain_libs()[0];
    let unwinder = ThreadUnwinder::new().unwrap();
    let bounds = StackBounds::for_current_thread().unwrap();
    let pc = lib.sym("chain_b") + 4;
    let mut out = [0usize; 64];
    let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
    let set = set_uc_regs;
    let trace = |uc: &libc::ucontext_t, out: &mut [usize]| {
        // SAFETY: a complete ucontext_t with the registers set.
        unsafe {
            unwinder.trace_from_ucontext((uc as *const libc::ucontext_t).cast(), &bounds, out)
        }
    };
    // A stack pointer outside the stack: the PC is kept, nothing is read.
    set(&mut uc, pc, 0xdead_0000, 0);
    let t = trace(&uc, &mut out);
    assert_eq!(t.depth, 1);
    assert!(
        matches!(
            t.end,
            TraceEnd::Broken(BrokenFrame::ReadOutsideStack { .. })
        ),
        "{t:?}"
    );
    // A PC in no object.
    set(&mut uc, 0x10, bounds.stack.1 - 4096, 0);
    assert_eq!(
        trace(&uc, &mut out),
        Trace {
            depth: 1,
            end: TraceEnd::Broken(BrokenFrame::NotInAnyObject { pc: 0x10 })
        }
    );
    // A stack of garbage, inside the bounds: many seeds, no crash, and every
    // trace ends (broken or at a zero return address) within the limit.
    const GARBAGE_WORDS: usize = 4096;
    let mut garbage = vec![0usize; GARBAGE_WORDS];
    let mut x = 0x1234_5678_9abc_def0u64;
    for seed in 0..200 {
        let words = garbage.as_ptr() as usize;
        for (i, w) in garbage.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mix plausible stack addresses and code addresses into the noise.
            *w = match x % 4 {
                0 => words + (x as usize >> 8) % (GARBAGE_WORDS * 8),
                1 => pc + (x as usize >> 8) % 4096,
                _ => x as usize,
            } ^ (i & seed & 1);
        }
        let gb = StackBounds {
            stack: (words, words + garbage.len() * 8),
            altstack: (0, 0),
        };
        set(&mut uc, pc, words + 64, words + 512);
        // SAFETY: a complete ucontext_t.
        let t = unsafe {
            unwinder.trace_from_ucontext((&uc as *const libc::ucontext_t).cast(), &gb, &mut out)
        };
        assert!(t.depth >= 1 && t.depth <= out.len(), "{t:?}");
        assert_ne!(t.end, TraceEnd::Reentered);
        // No frame where no process runs code (most of the noise is).
        assert!(
            out[..t.depth].iter().all(|&a| a < super::arch::USER_END),
            "{:x?} {t:?}",
            &out[..t.depth]
        );
    }
}

#[test]
fn reentered_walk_returns_at_once() {
    refresh_locked();
    let unwinder = ThreadUnwinder::new().unwrap();
    let bounds = StackBounds::for_current_thread().unwrap();
    let mut out = [0usize; 8];
    // Simulate a signal arriving while this unwinder walks.
    unwinder.busy_for_test(true);
    assert_eq!(
        unwinder.trace_here(&bounds, &mut out),
        Trace {
            depth: 0,
            end: TraceEnd::Reentered
        }
    );
    unwinder.busy_for_test(false);
    let t = unwinder.trace_here(&bounds, &mut out);
    assert!(t.depth > 0, "{t:?}");
    // A walk the thread left by a jump (a program's handler that
    // interrupted it called siglongjmp) never finishes: once abandoned, the
    // unwinder walks again instead of refusing every later walk.
    unwinder.busy_for_test(true);
    unwinder.abandon_walk();
    let t = unwinder.trace_here(&bounds, &mut out);
    assert!(t.depth > 0, "{t:?}");
    // Abandoning when no walk is under way changes nothing.
    unwinder.abandon_walk();
    assert!(unwinder.trace_here(&bounds, &mut out).depth > 0);
}

#[test]
fn refresh_and_stack_bounds_keep_errno() {
    let set = |v| unsafe { *libc::__errno_location() = v };
    let get = || unsafe { *libc::__errno_location() };
    // A new object forces a full rebuild (mmap, readlink, dl_iterate_phdr).
    let path = build_so(
        "errno",
        &[("errno.c", "int errno_fn(void) { return 2; }\n")],
        &["-O2"],
    );
    let _lib = Lib::open(&path);
    set(4321);
    refresh_locked();
    assert_eq!(get(), 4321, "refresh");
    set(1234);
    StackBounds::for_current_thread().unwrap();
    assert_eq!(get(), 1234, "stack bounds");
}

#[test]
fn replaced_tables_are_freed_once_no_walk_holds_them() {
    let path = build_so(
        "reclaim",
        &[("reclaim.c", "int reclaim_fn(void) { return 3; }\n")],
        &["-O2"],
    );
    let _l = TABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    refresh().unwrap();
    // Hold the current table as a walk does.
    let h = hazard::Hazard::claim().unwrap();
    let held = modules::current(h).unwrap() as *const modules::ModuleTable as usize;
    let lib = Lib::open(&path);
    let freed_before = modules::TABLES_FREED.load(Ordering::Relaxed);
    refresh().unwrap();
    assert_ne!(table(|t| t as *const modules::ModuleTable as usize), held);
    assert!(
        modules::is_retired(held),
        "a table a walk holds is not freed"
    );
    h.clear();
    // The next refresh frees it (a walk that another test started before
    // the swap may hold it a moment longer).
    for _ in 0..200 {
        refresh().unwrap();
        if !modules::is_retired(held) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!modules::is_retired(held), "freed once no walk holds it");
    assert!(modules::TABLES_FREED.load(Ordering::Relaxed) > freed_before);
    h.release();
    // A path outlives its object and every table that listed it.
    let pc = lib.sym("reclaim_fn");
    let path_bytes = module_of(pc).unwrap().path;
    // SAFETY: nothing of the library is in use.
    assert_eq!(unsafe { libc::dlclose(lib.0) }, 0);
    refresh().unwrap();
    refresh().unwrap();
    // Another test may have loaded its own object at the freed address.
    let now = module_of(pc).map(|m| m.path);
    assert!(
        !now.is_some_and(|p| p.ends_with(b"libreclaim.so")),
        "an unloaded object is still listed"
    );
    assert!(
        path_bytes.ends_with(b"libreclaim.so"),
        "{:?}",
        String::from_utf8_lossy(path_bytes)
    );
}

#[test]
fn a_refresh_without_loads_keeps_the_table() {
    let _l = TABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Another test may dlopen in between: then the table must change, and
    // the check is repeated.
    for _ in 0..5 {
        refresh().unwrap();
        let before = table(|t| t as *const modules::ModuleTable);
        refresh().unwrap();
        if before == table(|t| t as *const modules::ModuleTable) {
            return;
        }
    }
    panic!("every refresh built a new table although nothing was loaded");
}

#[test]
fn objects_are_known_from_the_refresh_after_they_load() {
    let path = build_so("late", &[("late.c", CHAIN_C)], &["-O2"]);
    let _l = TABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    refresh().unwrap();
    let generation = table(|t| t.generation);
    let lib = Lib::open(&path);
    let pc = lib.sym("chain_c");
    assert_eq!(module_of(pc), None, "not in the table before a refresh");
    let unwinder = ThreadUnwinder::new().unwrap();
    let bounds = StackBounds::for_current_thread().unwrap();
    let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
    set_uc_regs(&mut uc, pc, bounds.stack.1 - 4096, 0);
    let mut out = [0usize; 4];
    // SAFETY: a complete ucontext_t.
    let t = unsafe {
        unwinder.trace_from_ucontext((&uc as *const libc::ucontext_t).cast(), &bounds, &mut out)
    };
    assert_eq!(t.end, TraceEnd::Broken(BrokenFrame::NotInAnyObject { pc }));
    refresh().unwrap();
    let (new_generation, self_text) = table(|t| (t.generation, t.self_text));
    assert!(new_generation != generation);
    let m = module_of(pc).expect("known after the refresh");
    assert!(
        m.path.ends_with(b"liblate.so"),
        "{:?}",
        String::from_utf8_lossy(m.path)
    );
    assert!(m.text.0 <= pc && pc < m.text.1);
    // The executable is listed under its path, libc under its own, and the
    // table knows which object is the profiler's (here: the test binary).
    let exe = module_of(objects_are_known_from_the_refresh_after_they_load as *const () as usize)
        .unwrap();
    let own = std::fs::read_link("/proc/self/exe").unwrap();
    assert_eq!(exe.path, own.as_os_str().as_encoded_bytes());
    assert_eq!(self_text, exe.text);
    let libc_path = module_of(libc::getpid as *const () as usize).unwrap().path;
    assert!(
        libc_path.ends_with(b"libc.so.6"),
        "{:?}",
        String::from_utf8_lossy(libc_path)
    );
    assert_eq!(module_of(0), None);
}

#[test]
fn listed_objects_are_what_dl_iterate_phdr_lists() {
    // The keeper names a dead program's addresses from these records
    // instead of calling the loader: the same objects, order and headers.
    let _l = TABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = build_so(
        "listed",
        &[("listed.c", "int listed_fn(void) { return 3; }\n")],
        &["-O2"],
    );
    let _lib = Lib::open(&path);
    type Record = (usize, usize, usize, usize);
    extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> i32 {
        // SAFETY: dl_iterate_phdr's record for the call; data is the Vec below.
        let (i, v) = unsafe { (&*info, &mut *(data as *mut Vec<Record>)) };
        v.push((
            i.dlpi_addr as usize,
            i.dlpi_name as usize,
            i.dlpi_phdr as usize,
            i.dlpi_phnum as usize,
        ));
        0
    }
    // Other tests of this binary load and unload objects meanwhile: the
    // lists must agree in one of a few tries.
    let mut tries = Vec::new();
    for _ in 0..5 {
        refresh().unwrap();
        let mut loader: Vec<Record> = Vec::new();
        // SAFETY: `each` matches the callback type; `loader` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(each), (&mut loader as *mut Vec<Record>).cast()) };
        let listed: Vec<Record> = listed_objects()
            .iter()
            .map(|i| {
                (
                    i.dlpi_addr as usize,
                    i.dlpi_name as usize,
                    i.dlpi_phdr as usize,
                    i.dlpi_phnum as usize,
                )
            })
            .collect();
        assert!(loader.len() > 3, "{loader:?}");
        if listed == loader {
            return;
        }
        tries.push((listed, loader));
    }
    panic!("listed objects differ from the loader's: {tries:?}");
}
