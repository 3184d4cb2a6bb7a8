//! Cost of a call through an installed hook against a direct call.
//!
//!     cargo bench -p trampoline --bench hook_call
//!
//! Three loops of the same function: unhooked (direct call), hooked with a
//! pass-through replacement (patch jump -> replacement -> chain/trampoline
//! -> jump back), and the trampoline called directly. Reports ns per call as
//! the best of 5 runs of 20 M calls each (best-of filters scheduler noise on
//! a shared machine).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

type F = extern "C" fn(u64) -> u64;

#[inline(never)]
extern "C" fn work(x: u64) -> u64 {
    black_box(x.wrapping_mul(3) ^ 0x55)
}

static CHAIN: AtomicUsize = AtomicUsize::new(0);

extern "C" fn pass_through(x: u64) -> u64 {
    // SAFETY: CHAIN holds the trampoline of `work`, stored before enabling.
    let original: F = unsafe { std::mem::transmute(CHAIN.load(Ordering::Relaxed)) };
    original(x)
}

const CALLS: u64 = 20_000_000;

fn ns_per_call(f: F) -> f64 {
    let f = black_box(f);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut acc = 0u64;
        for i in 0..CALLS {
            acc = acc.wrapping_add(f(i));
        }
        black_box(acc);
        best = best.min(t.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    best
}

fn main() {
    let target = trampoline::Symbol::at(work as *const () as u64);
    let direct = ns_per_call(work);
    let prepared = trampoline::prepare(&target, pass_through as *const ()).expect("hook work()");
    CHAIN.store(prepared.chain() as usize, Ordering::Relaxed);
    // SAFETY: the trampoline runs `work`'s original code, same signature.
    let trampoline_only: F = unsafe { std::mem::transmute(prepared.chain()) };
    let hook = prepared.enable().expect("enable");
    let hooked = ns_per_call(work);
    let tramp = ns_per_call(trampoline_only);
    hook.uninstall().expect("uninstall");
    let after = ns_per_call(work);
    println!("direct call (unhooked):            {direct:.2} ns/call");
    println!(
        "through hook (pass-through):       {hooked:.2} ns/call  (+{:.2} ns)",
        hooked - direct
    );
    println!("trampoline (chain) called directly: {tramp:.2} ns/call");
    println!("direct call after uninstall:       {after:.2} ns/call");
}
