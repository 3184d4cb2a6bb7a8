//! The mapping-function replacements installed with trampolines: libc's
//! `mmap` (`mmap64` is the same function in glibc and is hooked once when
//! it is), `munmap` and `mremap`.
//!
//! Owns their chain pointers. Each replacement calls the original through
//! its chain pointer and returns its result unchanged with the `errno` it
//! left. A mapping is recorded after it exists; an unmap is recorded
//! *before* the real call (after it, another thread may be given the same
//! addresses, and its mapping must not be the one removed).
//!
//! Must never: call a hooked function except through its chain pointer,
//! allocate, or change the program's view of the call.

use core::ffi::{c_int, c_void};

use crate::hook::{hook_table, Hooked};

hook_table! {
    /// The hooked mapping functions (`new_address` of mremap is read by
    /// the original only with MREMAP_FIXED, as from the variadic call).
    enum F {
        Mmap => fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: libc::off_t) -> *mut c_void;
        Mmap64 => fn mmap64(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: libc::off64_t) -> *mut c_void;
        Munmap => fn munmap(addr: *mut c_void, len: usize) -> c_int;
        Mremap => fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void;
    }
}

fn list() -> [(F, &'static str, *const ()); N] {
    use F::*;
    [
        (Mmap, "mmap", mmap_hook as *const ()),
        (Mmap64, "mmap64", mmap64_hook as *const ()),
        (Munmap, "munmap", munmap_hook as *const ()),
        (Mremap, "mremap", mremap_hook as *const ()),
    ]
}

/// Installs every mapping hook found in libc (aliases once). Returns
/// whether mmap and munmap were both hooked (the module means nothing
/// without them).
pub fn install() -> bool {
    let mut hooked = Hooked::default();
    let mut essential = 0;
    for (f, name, repl) in list() {
        let Ok(sym) = trampoline::find_function(name, Some("libc.so.6")) else {
            crate::igprof_debug!("-mm: {name} is not in this libc");
            continue;
        };
        match hooked.hook(&sym, repl, |c| CHAIN.set(f as usize, c)) {
            Ok(_) if matches!(f, F::Mmap | F::Munmap) => essential += 1,
            Ok(_) => {}
            Err(err) => {
                crate::igprof_log!("-mm: cannot hook {name}: {err}; continuing without it")
            }
        }
    }
    essential == 2
}

/// Records what an mmap returned, and returns it.
#[inline]
fn mapped(p: *mut c_void, len: usize, flags: c_int) -> *mut c_void {
    if p != libc::MAP_FAILED {
        super::mapped(p as usize, len, flags & libc::MAP_ANONYMOUS != 0);
    }
    p
}

extern "C" fn mmap_hook(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    mapped(chain::mmap(addr, len, prot, flags, fd, off), len, flags)
}

extern "C" fn mmap64_hook(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off64_t,
) -> *mut c_void {
    mapped(chain::mmap64(addr, len, prot, flags, fd, off), len, flags)
}

extern "C" fn munmap_hook(addr: *mut c_void, len: usize) -> c_int {
    super::unmapping(addr as usize, len);
    chain::munmap(addr, len)
}

extern "C" fn mremap_hook(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let p = chain::mremap(old, old_len, new_len, flags, new_addr);
    if p != libc::MAP_FAILED {
        let kept = flags & libc::MREMAP_DONTUNMAP != 0;
        super::remapped(
            old as usize,
            if kept { 0 } else { old_len },
            p as usize,
            new_len,
        );
    }
    p
}
