//! The stack memo: skip the stack walk when an allocation comes from
//! exactly the same stack as the thread's previous one.
//!
//! A stack walk is a pure function of the registers it starts from and the
//! stack memory it reads (and the unwind tables). The hot allocation hooks
//! are entered through small naked stubs ([`entry`]) that pass the
//! program's stack pointer and frame pointer at the call (AArch64: and the
//! link register) to the hook. After a full walk the memo keeps those
//! registers, a copy of the stack from the program's stack pointer up to
//! just above the slot of the outermost return address found, and the
//! call-tree node. The next event with the same registers and a
//! byte-identical stack region gets that node without walking: it is what
//! the walk would return. Anything different (a local variable spilled to
//! the stack, a different caller) is a miss and walks as usual; after many
//! misses in a row the memo rests for a while so that programs whose
//! stacks always differ pay almost nothing for it.
//!
//! Not used for calls on an alternate signal stack (the walk may continue
//! on another stack), while another hook of ours is active on the thread,
//! or for walks cut by the depth limit. A walk that ended on a broken frame
//! is memoised like any other: it read nothing above its last return
//! address unless that frame's rule pointed far above it (then a change
//! up there that would have repaired the walk is not noticed).
//! A dlclose/dlopen that maps different code at the same addresses between
//! two identical stacks is not noticed (the addresses recorded would be the
//! same either way).
//!
//! Must never: read outside the thread's stack, allocate in a hook (the
//! copy buffer is made with the thread's other extras), or lock.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::thread::ThreadState;
use crate::tree::Node;

/// Registers of the program at the call of a hooked function.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct EntryRegs {
    pub sp: usize,
    pub fp: usize,
    /// The return address when it is in a register (AArch64 LR); 0 on x86-64.
    pub lr: usize,
}

/// Largest stack region the memo copies (a size class of the library's
/// allocator, so a thread's copies never need mappings of their own).
const MAX_REGION: usize = 32 * 1024;
/// Extra bytes kept above the outermost return-address slot.
const MARGIN: usize = 256;
/// Misses in a row after which the memo rests, and for how many events.
const MISS_LIMIT: u32 = 64;
const REST: u32 = 4096;

pub static HITS: AtomicU64 = AtomicU64::new(0);
pub static MISSES: AtomicU64 = AtomicU64::new(0);

/// One remembered stack.
struct Slot {
    regs: EntryRegs,
    /// The return address at the call (first word of the region).
    ret: usize,
    len: usize,
    node: *mut Node,
    copy: Vec<u8>,
}

/// A few remembered stacks per thread (allocation sites in one loop, such
/// as a malloc followed by a realloc, alternate between them).
pub struct StackMemo {
    owner: *const ThreadState,
    slots: [Slot; WAYS],
    next: usize,
    misses: u32,
    rest: u32,
}

const WAYS: usize = 4;

impl StackMemo {
    pub fn new() -> Self {
        StackMemo {
            owner: core::ptr::null(),
            slots: core::array::from_fn(|_| Slot {
                regs: EntryRegs::default(),
                ret: 0,
                len: 0,
                node: core::ptr::null_mut(),
                // Reserved, not written: filled when a stack is stored.
                copy: Vec::with_capacity(MAX_REGION),
            }),
            next: 0,
            misses: 0,
            rest: 0,
        }
    }

    /// Whether the memo should be consulted for this event.
    #[inline]
    pub fn usable(&mut self, t: &ThreadState, r: &EntryRegs) -> bool {
        if self.rest > 0 {
            self.rest -= 1;
            return false;
        }
        let (lo, hi) = t.bounds.stack;
        r.sp >= lo && r.sp + 8 <= hi
    }

    /// The node of a remembered event with the same stack as this one.
    #[inline]
    pub fn lookup(&mut self, t: &ThreadState, r: &EntryRegs) -> Option<*mut Node> {
        if core::ptr::eq(self.owner, t) {
            // SAFETY: sp + 8 <= hi (usable()): the word at sp is in the stack.
            let ret = unsafe { *(r.sp as *const usize) };
            for s in self.slots.iter() {
                if s.len == 0 || s.ret != ret || s.regs != *r {
                    continue;
                }
                // SAFETY: [sp, sp+len) lies in the thread's stack (checked
                // when stored: sp + len <= hi).
                let now = unsafe { core::slice::from_raw_parts(r.sp as *const u8, s.len) };
                if now == &s.copy[..s.len] {
                    self.misses = 0;
                    HITS.fetch_add(1, Ordering::Relaxed);
                    return Some(s.node);
                }
            }
        }
        self.misses += 1;
        MISSES.fetch_add(1, Ordering::Relaxed);
        if self.misses >= MISS_LIMIT {
            self.misses = 0;
            self.rest = REST;
        }
        None
    }

    /// Remembers a full walk's result: `node` for `trace` (leaf first)
    /// reached from registers `r`.
    pub fn store(&mut self, t: &ThreadState, r: &EntryRegs, trace: &[usize], node: *mut Node) {
        if !core::ptr::eq(self.owner, t) {
            for s in self.slots.iter_mut() {
                s.len = 0;
            }
            self.owner = t;
        }
        let Some(&outer) = trace.last() else { return };
        let (_, hi) = t.bounds.stack;
        let limit = hi.min(r.sp.saturating_add(MAX_REGION - MARGIN));
        // The highest slot holding the outermost return address: the walk
        // read nothing above it (the outermost frame has no caller).
        let mut top = 0usize;
        let mut a = (r.sp + 7) & !7;
        while a + 8 <= limit {
            // SAFETY: a is 8-aligned and inside [sp, hi) of this thread's stack.
            if unsafe { *(a as *const usize) } == outer {
                top = a + 8;
            }
            a += 8;
        }
        let s = &mut self.slots[self.next];
        self.next = (self.next + 1) % WAYS;
        s.len = 0;
        if top == 0 {
            return;
        }
        let end = (top + MARGIN).min(hi);
        let len = end - r.sp;
        if len > s.copy.capacity() {
            return;
        }
        // SAFETY: [sp, end) is inside the thread's stack.
        let now = unsafe { core::slice::from_raw_parts(r.sp as *const u8, len) };
        s.copy.clear();
        s.copy.extend_from_slice(now);
        s.len = len;
        // SAFETY: sp + 8 <= hi.
        s.ret = unsafe { *(r.sp as *const usize) };
        s.regs = *r;
        s.node = node;
    }
}

impl Default for StackMemo {
    fn default() -> Self {
        Self::new()
    }
}

/// Naked entry stubs: put the program's registers at the call after the
/// real arguments and jump to the Rust hook (the stack is untouched, so the
/// hook returns straight to the program).
pub mod entry {
    #[cfg(target_arch = "x86_64")]
    macro_rules! stub {
        ($name:ident, $imp:path, one) => {
            #[unsafe(naked)]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov rsi, rsp", "mov rdx, rbp", "xor ecx, ecx", "jmp {imp}", imp = sym $imp)
            }
        };
        ($name:ident, $imp:path, two) => {
            #[unsafe(naked)]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov rdx, rsp", "mov rcx, rbp", "xor r8d, r8d", "jmp {imp}", imp = sym $imp)
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    macro_rules! stub {
        ($name:ident, $imp:path, one) => {
            #[unsafe(naked)]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov x1, sp", "mov x2, x29", "mov x3, x30", "b {imp}", imp = sym $imp)
            }
        };
        ($name:ident, $imp:path, two) => {
            #[unsafe(naked)]
            pub extern "C" fn $name() {
                core::arch::naked_asm!("mov x2, sp", "mov x3, x29", "mov x4, x30", "b {imp}", imp = sym $imp)
            }
        };
    }
    stub!(malloc_entry, super::super::hooks::malloc_with_regs, one);
    stub!(calloc_entry, super::super::hooks::calloc_with_regs, two);
    stub!(realloc_entry, super::super::hooks::realloc_with_regs, two);
}
