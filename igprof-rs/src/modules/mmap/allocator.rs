//! Which frames are inside an allocation function, so that a mapping an
//! allocator makes for its own use (glibc's malloc mapping a large block,
//! jemalloc or mimalloc extending an arena) is charged under the
//! `<allocator mmap>` leaf of the allocating stack.
//!
//! Owns the code ranges of the allocation entry points (found by name once
//! at start-up: libc's, and the process's first definition when another
//! allocator replaces them). The test reads the charged node's path, so
//! the memory profiler's hooks pay nothing for it.
//!
//! Must never: allocate or lock after start-up (it is read while a hook
//! records).

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::tree::Node;

/// The allocation entry points whose frames mark an allocator's mapping.
const NAMES: [&str; 12] = [
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "posix_memalign",
    "memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "mallocx",
    "rallocx",
];

const MAX: usize = 2 * NAMES.len();

/// `[start, end)` of each entry point found; unused slots are empty.
static RANGES: [[AtomicUsize; 2]; MAX] =
    [const { [AtomicUsize::new(0), AtomicUsize::new(0)] }; MAX];

/// Finds the entry points (start-up, before the hooks are installed).
pub fn init() {
    let mut n = 0;
    for name in NAMES {
        for lib in [Some("libc.so.6"), None] {
            let Ok(s) = trampoline::find_function(name, lib) else {
                continue;
            };
            let Some(size) = s.size.filter(|&z| z > 0) else {
                continue;
            };
            let (lo, hi) = (s.addr as usize, (s.addr + size) as usize);
            let known = RANGES[..n]
                .iter()
                .any(|r| r[0].load(Ordering::Relaxed) == lo);
            if !known && n < MAX {
                RANGES[n][0].store(lo, Ordering::Relaxed);
                RANGES[n][1].store(hi, Ordering::Relaxed);
                n += 1;
            }
        }
    }
}

/// Whether return address `pc` is inside an entry point (a return address
/// may be the end of a function that ends with a call).
fn inside(pc: usize) -> bool {
    RANGES.iter().any(|r| {
        let lo = r[0].load(Ordering::Relaxed);
        lo != 0 && pc > lo && pc <= r[1].load(Ordering::Relaxed)
    })
}

/// Whether the stack of `node` passes through an allocation function.
pub fn in_allocator(node: *const Node) -> bool {
    let mut p = node;
    while !p.is_null() {
        // SAFETY: nodes are never freed; a node's parent chain ends at the root.
        let n = unsafe { &*p };
        if inside(n.addr) {
            return true;
        }
        p = n.parent;
    }
    false
}
