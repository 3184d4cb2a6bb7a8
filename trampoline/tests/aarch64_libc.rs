//! Hook real libc functions (malloc, free, open, close, getpid) of this
//! AArch64 process under qemu while 4 threads call them; exact call counts.
//!
//! Twice: with the near patch (a single `b` to the replacement or to an
//! entry stub) and with the far patch (`prepare_far`: `ldr x16, =repl;
//! br x16`, 16 or 20 bytes, trampoline anywhere). AArch64 specifics checked
//! on top of the counts: the patch bytes at each function, the
//! trampoline in memory is byte for byte what `Aarch64::relocate` produces
//! for its address and passes `Aarch64::verify`, and `free`, whose first
//! instruction in Debian's glibc is `cbz x0` (PC-relative), runs correctly
//! through its relocated copy.
//!
//! Calls are counted only on a worker thread inside its measured window
//! (const thread-local flag, no allocation); the replacements never
//! allocate and publish nothing but a counter increment.
#![cfg(target_arch = "aarch64")]

mod counting;

use counting::{
    r_close, r_free, r_getpid, r_malloc, r_open, set_measured, Slot, CLOSE, FREE, GETPID, MALLOC,
    OPEN,
};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use trampoline::aarch64::decode::{decode, Insn};
use trampoline::aarch64::Aarch64;
use trampoline::arch::Arch;
use trampoline::{find_function, prepare, prepare_far, Hook};

const THREADS: usize = 4;
const ROUNDS: usize = 500;

const DEV_NULL: &CStr = c"/dev/null";

/// One round of calls, every result checked; returns the number of wrong results.
fn round(pid: libc::pid_t) -> usize {
    let mut bad = 0;
    // SAFETY: plain libc calls with valid arguments; black_box keeps the
    // malloc/free pair and the free(NULL) from being folded away.
    unsafe {
        bad += (libc::getpid() != pid) as usize;
        let p = std::hint::black_box(libc::malloc(std::hint::black_box(40))) as *mut u8;
        if p.is_null() {
            bad += 1;
        } else {
            p.write_bytes(0xa5, 40);
            bad += (*p.add(39) != 0xa5) as usize;
        }
        libc::free(std::hint::black_box(p as *mut c_void));
        libc::free(std::hint::black_box(std::ptr::null_mut())); // cbz x0 taken
        let fd = libc::open(DEV_NULL.as_ptr(), libc::O_RDONLY);
        bad += (fd < 0) as usize;
        bad += (libc::close(fd) != 0) as usize;
    }
    bad
}

fn hook(name: &str, counter: &'static Slot, replacement: *const (), far: bool) -> Hook {
    let sym = find_function(name, Some("libc.so.6")).unwrap_or_else(|e| panic!("{e}"));
    let size = sym.size.expect("libc symbols have sizes") as usize;
    // SAFETY: the function's bytes are mapped code of libc.
    let code = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, size) }.to_vec();
    let prepared = if far {
        prepare_far(&sym, replacement)
    } else {
        prepare(&sym, replacement)
    };
    let prepared = prepared.unwrap_or_else(|e| panic!("{e}"));
    let (plan, chain) = (prepared.plan(), prepared.chain() as u64);
    let out = Aarch64::relocate(&code, sym.addr, &plan, chain).unwrap();
    // SAFETY: the trampoline is mapped (prepare wrote it).
    let live = unsafe { std::slice::from_raw_parts(chain as *const u8, out.len()) };
    assert_eq!(live, &out[..], "{name}: trampoline bytes");
    Aarch64::verify(&code, sym.addr, &plan, chain, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
    counter.chain.store(chain as usize, SeqCst);
    let hook = prepared.enable().unwrap_or_else(|e| panic!("{e}"));
    if far {
        let want = Aarch64::far_patch(sym.addr, replacement as u64);
        assert_eq!(plan.patch_len, want.len(), "{name}: far patch length");
        // SAFETY: the patch site is mapped code.
        let live = unsafe { std::slice::from_raw_parts(sym.addr as *const u8, want.len()) };
        assert_eq!(live, &want[..], "{name}: far patch bytes");
        return hook;
    }
    // SAFETY: the patch site is mapped code.
    let word = unsafe { (sym.addr as *const u32).read_volatile() };
    match decode(word, sym.addr) {
        Insn::B { target } if target == replacement as u64 => {}
        Insn::B { target } => {
            // Entry stub: ldr x16, #8; br x16; .quad replacement.
            // SAFETY: the stub is mapped (prepare wrote it).
            let lit = unsafe { ((target + 8) as *const u64).read_volatile() };
            assert_eq!(lit, replacement as u64, "{name}: stub target");
        }
        other => panic!("{name}: patch is {other:?}, not a b"),
    }
    hook
}

/// Hook, call from 4 threads, check exact counts, unhook, check again.
fn run(far: bool) {
    for c in [&MALLOC, &FREE, &OPEN, &CLOSE, &GETPID] {
        c.calls.store(0, SeqCst);
    }
    let pid = std::process::id() as libc::pid_t;
    let free = find_function("free", Some("libc.so.6")).unwrap();
    // SAFETY: mapped code.
    let first = unsafe { (free.addr as *const u32).read() };
    let free_starts_pc_relative = !matches!(decode(first, free.addr), Insn::Other(_));
    let hooks = vec![
        hook("malloc", &MALLOC, r_malloc as *const (), far),
        hook("free", &FREE, r_free as *const (), far),
        hook("open", &OPEN, r_open as *const (), far),
        hook("close", &CLOSE, r_close as *const (), far),
        hook("getpid", &GETPID, r_getpid as *const (), far),
    ];
    let errors = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                set_measured(true);
                let mut bad = 0;
                for _ in 0..ROUNDS {
                    bad += round(pid);
                }
                set_measured(false);
                errors.fetch_add(bad, SeqCst);
            });
        }
    });
    for h in hooks {
        h.uninstall().unwrap_or_else(|e| panic!("{e}"));
    }
    let n = THREADS * ROUNDS;
    let got: Vec<(&str, usize)> = [
        ("malloc", &MALLOC),
        ("free", &FREE),
        ("open", &OPEN),
        ("close", &CLOSE),
        ("getpid", &GETPID),
    ]
    .iter()
    .map(|(name, c)| (*name, c.calls.load(SeqCst)))
    .collect();
    assert_eq!(
        got,
        vec![
            ("malloc", n),
            ("free", 2 * n),
            ("open", n),
            ("close", n),
            ("getpid", n)
        ]
    );
    assert_eq!(
        errors.load(SeqCst),
        0,
        "wrong results from hooked libc calls"
    );
    // Unhooked: nothing counted any more, results still right.
    set_measured(true);
    assert_eq!(round(pid), 0, "far: {far}");
    set_measured(false);
    assert_eq!(
        FREE.calls.load(SeqCst),
        2 * n,
        "free counted after uninstall"
    );
    if !free_starts_pc_relative {
        eprintln!("note: free does not start with a PC-relative instruction in this libc");
    }
}

#[test]
fn libc_functions_from_four_threads() {
    // Near form (one `b`), then the far form (`ldr x16, =repl; br x16`,
    // trampoline anywhere): the same counts and results.
    run(false);
    run(true);
}
