//! The function-call profiler (`-fp:FUNC[:LIB]`, `-fpi:...`, `-fpf:...`,
//! IgProf's): every call of FUNC is counted in CALLS_TOTAL on the stack
//! that calls it.
//!
//! FUNC is looked up as the process resolves it (first definition, then
//! the symbol tables of the loaded objects: a `static` function of the
//! program is found too), or in library LIB (and what LIB links) when
//! given. A spec whose LIB is not loaded yet, or whose FUNC no loaded
//! object defines, is tried again after every successful `dlopen`
//! ([`objects_changed`]); one whose library is unloaded waits again, to
//! be hooked anew if the library is loaded again. Its entry is patched (trampoline crate) with a
//! jump to one of the [`stub`]s, which keeps every argument register,
//! calls [`count_entry`] and jumps on to the original: FUNC's return is
//! never intercepted, so `-fpi` (integer or pointer result) and `-fpf`
//! (double result), which IgProf needs to return the value from its
//! typed replacement, are the same profiler here. As IgProf's, the stack
//! begins with the return address into FUNC's caller: FUNC itself is not
//! on it.
//!
//! CALLS_TOTAL per node is (calls, calls, running total). IgProf's value
//! is the cycles spent in the calls (it returns through its replacement
//! to read the clock); here the value is the number of calls too, since
//! the return is not seen (use `-pp` for time).
//!
//! A call is recorded through the memory hooks' event path
//! (`mem::site::event`: guard, path cache, stack memo). The profiler's
//! own calls pass uncounted, never recursing ([`begin_count`]): those made
//! from libigprof's code (Rust's memcpy, the profile's `write`), while
//! the thread is inside the profiler or a hook records, and by the
//! counting itself. So does a call from a program signal handler that
//! interrupted profiler code (the memory hooks defer such events; a call
//! cannot be told from the profiler's own there). Calls while recording
//! is off (`-pd`, `igprof_disable()`) are not counted.
//!
//! Owns: the `-fp` specifications and their state (pending, hooked on a
//! stub, refused), the stubs' slots, the counter CALLS_TOTAL.
//!
//! Must never: allocate or lock on the counting path, change errno or
//! any register FUNC receives, or hook a function that the counting path
//! needs before it takes the thread's guard (`__tls_get_addr`).

pub mod stub;

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::base::counters::{self, CounterId};
use crate::base::tree::Node;
use crate::modules::mem::site;
use crate::modules::StartError;

/// Deferred-event kind of a call (see `mem::site`).
const KIND_CALL: u8 = 16;

const NONE: usize = usize::MAX;
static SLOT: AtomicUsize = AtomicUsize::new(NONE);
/// Whether some spec waits for a library (checked after each dlopen).
static PENDING: AtomicBool = AtomicBool::new(false);
/// The pending specs were named once (see [`report`]).
static SAID_PENDING: AtomicBool = AtomicBool::new(false);

/// Functions the counting path may call before it holds the thread's
/// guard (the library's own TLS is initial-exec, but its runtime's
/// thread-locals are not): counting their calls would recurse without end.
const REFUSED: [&str; 2] = ["__tls_get_addr", "___tls_get_addr"];

/// The -fp profiler in the runtime's module registry.
pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe,
    register_counters: |_| {
        counters::enable(CounterId::CallsTotal);
    },
    start,
    objects_changed: Some(objects_changed),
    before_dump: Some(report),
    left_by_jump: Some(site::jumped_out),
    ..crate::modules::Module::new("-fp", |o| !o.functions.is_empty())
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Its library is not loaded, or no loaded object defines it (yet).
    Pending,
    /// Counted by stub `slot`.
    Hooked(usize),
    /// Refused (the reason was said).
    Refused,
}

/// One `-fp` option.
struct Spec {
    /// The option as given (`-fpi:f:libm.so.6`), for messages.
    word: String,
    func: String,
    lib: Option<String>,
    state: State,
    /// The stub it had before its library was unloaded (used again).
    slot: Option<usize>,
}

/// The specs and the address hooked on each stub (index = stub).
struct Table {
    specs: Vec<Spec>,
    hooked: Vec<u64>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    specs: Vec::new(),
    hooked: Vec::new(),
});

/// `-fp:FUNC[:LIB]` (also `-fpi:`, `-fpf:`) -> (FUNC, LIB).
fn parse_word(w: &str) -> Option<(&str, Option<&str>)> {
    let rest = ["-fp:", "-fpi:", "-fpf:"]
        .iter()
        .find_map(|p| w.strip_prefix(p))?;
    let (func, lib) = match rest.split_once(':') {
        Some((f, l)) => (f, (!l.is_empty()).then_some(l)),
        None => (rest, None),
    };
    (!func.is_empty()).then_some((func, lib))
}

fn describe(o: &crate::base::options::Options) -> Option<String> {
    let words: Vec<&str> = o.function_specs().collect();
    Some(format!("calls of {} (CALLS_TOTAL)", words.join(" ")))
}

fn start(o: &crate::base::options::Options) -> Result<(), StartError> {
    let Some(slot) = counters::slot(CounterId::CallsTotal) else {
        return Err(StartError::refused("its counter could not be enabled"));
    };
    SLOT.store(slot, Ordering::Relaxed);
    crate::modules::mem::memo::init_check();
    if let Some(m) = crate::unwind::module_of(count_entry as *const () as usize) {
        OWN_TEXT[0].store(m.text.0, Ordering::Relaxed);
        OWN_TEXT[1].store(m.text.1, Ordering::Relaxed);
    }
    let saved = stub::init();
    crate::igprof_debug!("-fp: the entry stubs save the argument registers and {saved}");
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    for w in o.function_specs() {
        match parse_word(w) {
            Some((func, lib)) => t.specs.push(Spec {
                word: w.to_string(),
                func: func.to_string(),
                lib: lib.map(str::to_string),
                state: State::Pending,
                slot: None,
            }),
            None => crate::igprof_log!("{w}: give a function name, e.g. -fp:malloc; ignored"),
        }
    }
    resolve(&mut t, true);
    if t.specs.iter().all(|s| s.state == State::Refused) {
        return Err(StartError::AlreadyReported);
    }
    Ok(())
}

/// After a dlopen or dlclose: a hooked function whose object is gone
/// waits again (its stub is kept for it); the specs waiting may be in
/// the new objects.
fn objects_changed() {
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let t = &mut *t;
    for s in t.specs.iter_mut() {
        if let State::Hooked(k) = s.state {
            let a = t.hooked[k];
            if a == 0 || crate::unwind::module_of(a as usize).is_none() {
                crate::igprof_debug!(
                    "{}: its library was unloaded; hooked again if loaded again",
                    s.word
                );
                t.hooked[k] = 0;
                s.state = State::Pending;
                s.slot = Some(k);
                PENDING.store(true, Ordering::Release);
            }
        }
    }
    if PENDING.load(Ordering::Acquire) {
        resolve(t, false);
    }
}

/// Whether `addr` is in libigprof itself.
fn own(addr: u64) -> bool {
    let me = crate::unwind::module_of(count_entry as *const () as usize);
    let it = crate::unwind::module_of(addr as usize);
    matches!((me, it), (Some(a), Some(b)) if a.text == b.text)
}

/// Hooks every pending spec that can be found now; says why for those
/// that cannot be hooked (and, at start-up, for those left waiting).
fn resolve(t: &mut Table, at_start: bool) {
    use trampoline::LookupError;
    let mut pending = false;
    for i in 0..t.specs.len() {
        let s = &t.specs[i];
        if s.state != State::Pending {
            continue;
        }
        let (word, func) = (s.word.clone(), s.func.clone());
        let lib = s.lib.clone();
        let refuse = |t: &mut Table, why: &dyn core::fmt::Display| {
            crate::igprof_log!("{word}: {why}; not profiled");
            t.specs[i].state = State::Refused;
        };
        if REFUSED.contains(&func.as_str()) {
            refuse(
                t,
                &format_args!("the profiler calls {func} to find the calling thread before it can tell its own calls from the program's"),
            );
            continue;
        }
        let sym = match trampoline::find_function(&func, lib.as_deref()) {
            Ok(sym) => sym,
            Err(LookupError::LibraryNotLoaded { lib }) => {
                if at_start {
                    crate::igprof_debug!("{word}: {lib} is not loaded yet; hooked when it is");
                }
                pending = true;
                continue;
            }
            Err(e @ LookupError::NotFound { .. }) if lib.is_none() => {
                if at_start {
                    crate::igprof_log!("{word}: {e}; hooked if a library loaded later defines it");
                }
                pending = true;
                continue;
            }
            Err(e) => {
                refuse(t, &e);
                continue;
            }
        };
        if own(sym.addr) {
            refuse(t, &format_args!("{func} is the profiler's own function"));
            continue;
        }
        if let Some(k) = t.hooked.iter().position(|&a| a == sym.addr) {
            crate::igprof_debug!("{word}: the function another -fp hooked; counted once");
            t.specs[i].state = State::Hooked(k);
            continue;
        }
        // Code elsewhere in the object that enters FUNC inside the bytes
        // the patch overwrites would run half of the patch.
        if let Ok(probe) = trampoline::probe(&sym) {
            let at = sym.addr + probe.plan.keep as u64;
            let window = (at + 1, at + probe.plan.taken as u64);
            if let Some(e) = trampoline::interior::interior_entry(sym.addr, window.0, window.1) {
                refuse(
                    t,
                    &format_args!("cannot hook {func} at {:#x}: {e}, inside the bytes the hook would overwrite", sym.addr),
                );
                continue;
            }
        }
        let k = t.specs[i].slot.unwrap_or(t.hooked.len());
        if k == stub::ENTRIES {
            refuse(
                t,
                &format_args!("at most {} functions are counted in one run", stub::ENTRIES),
            );
            continue;
        }
        match crate::hook::hook_symbol(&sym, stub::entry(k), |c| stub::set_chain(k, c)) {
            Ok(()) => {
                if k == t.hooked.len() {
                    t.hooked.push(sym.addr);
                } else {
                    t.hooked[k] = sym.addr;
                }
                t.specs[i].state = State::Hooked(k);
                crate::igprof_debug!("{word}: counting the calls of {func} at {:#x}", sym.addr);
            }
            Err(e) => {
                stub::set_chain(k, core::ptr::null());
                refuse(t, &e);
            }
        }
    }
    PENDING.store(pending, Ordering::Release);
}

/// Before a dump: names, once, the specs whose function was never found
/// (and with `IGPROF_MEMO_CHECK=1`, the stack memo's check, which `-mp`
/// reports when it runs).
fn report() {
    if !crate::base::options::get().mem {
        crate::modules::mem::memo::report_check();
    }
    if !PENDING.load(Ordering::Acquire) || SAID_PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    // The table is held across a dlopen's re-resolution; a thread killed
    // there never lets it go, and the keeper writing that process's
    // profile would wait for it until its alarm (no profile). The lines
    // are a courtesy: left to a later dump when the table is busy.
    let t = match TABLE.try_lock() {
        Ok(t) => t,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            SAID_PENDING.store(false, Ordering::Release);
            return;
        }
    };
    // (One hooked before its library was unloaded has been counted.)
    for s in t
        .specs
        .iter()
        .filter(|s| s.state == State::Pending && s.slot.is_none())
    {
        match &s.lib {
            Some(l) => crate::igprof_log!("{}: {l} was not loaded (yet); no call counted", s.word),
            None => crate::igprof_log!(
                "{}: no loaded object defines {} (yet); no call counted",
                s.word,
                s.func
            ),
        }
    }
}

#[inline]
fn tick(n: *mut Node) {
    // SAFETY: nodes are never freed; the owner thread holds its guard.
    unsafe { &*n }
        .counter(SLOT.load(Ordering::Relaxed))
        .add(1, 1);
}

/// Replays a call deferred from a signal handler (`mem::site`); not
/// reached while [`begin_count`] refuses calls during a hook's recording,
/// which is when `site::event` defers.
fn replay(_: &crate::base::thread::Guard, n: *mut Node, kind: u8, _: usize, _: u64) {
    if kind == KIND_CALL {
        tick(n)
    }
}

/// libigprof's executable range (set at start-up): a call of FUNC from
/// there is the profiler's own.
static OWN_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Whether the calling thread may count a call now, marking it counting
/// if so. Not when the call is the profiler's own: made from libigprof's
/// code (`ret`: the return address), inside profiler code (the thread's
/// guard is held: writing the profile, a hook recording an event), while
/// a hook records without the guard (the free path), or by the counting
/// itself (memcpy, say). A program signal handler that calls FUNC while
/// its thread is inside the profiler is not counted either.
#[inline]
fn begin_count(ret: usize) -> bool {
    if (OWN_TEXT[0].load(Ordering::Relaxed)..OWN_TEXT[1].load(Ordering::Relaxed)).contains(&ret)
        || crate::base::thread::is_busy()
    {
        return false;
    }
    site::tls(|h| {
        let o = h.outer.get();
        if o & (site::IN_RECORD | site::CALLS_COUNTING) != 0 {
            return false;
        }
        h.outer.set(o | site::CALLS_COUNTING);
        true
    })
}

/// Called by stub `i` at every call of the function hooked on it, with
/// the program's registers saved and its stack pointer, frame pointer and
/// (AArch64) link register at the call: counts the call on its caller's
/// stack.
extern "C" fn count_entry(i: usize, sp: usize, fp: usize, lr: usize) {
    stub::clobber();
    if !crate::base::run::recording() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sp is the program's stack pointer at the call of FUNC: it
    // points at the return address the call pushed.
    let ret = unsafe { *(sp as *const usize) };
    #[cfg(not(target_arch = "x86_64"))]
    let ret = lr;
    if !begin_count(ret) {
        return;
    }
    site::event(KIND_CALL, i, 0, replay, |g, h| {
        // Inside the guard: errno's slot is found through libc, whose
        // functions may be -fp'd themselves (they pass through now).
        let _e = crate::sys::ErrnoGuard::save();
        // The stack memo answers when the stack is the previous walk's
        // (not inside a real realloc, where it would ask whether the call
        // is libc's own: every call of FUNC counts).
        let n = if h.outer.get() & site::MEM_OUTER == 0 {
            site::caller_node_at(g, h, &crate::modules::mem::memo::EntryRegs { sp, fp, lr })
        } else {
            site::caller_node(g, h, 0)
        };
        if let Some(n) = n {
            tick(n)
        }
    });
    site::tls(|h| h.outer.set(h.outer.get() & !site::CALLS_COUNTING));
}

#[cfg(test)]
mod tests {
    use super::parse_word;

    #[test]
    fn words_give_the_function_and_library() {
        assert_eq!(parse_word("-fp:malloc"), Some(("malloc", None)));
        assert_eq!(
            parse_word("-fpi:f:libm.so.6"),
            Some(("f", Some("libm.so.6")))
        );
        assert_eq!(parse_word("-fpf:sqrt:"), Some(("sqrt", None)));
        assert_eq!(parse_word("-fp::libc.so.6"), None);
        assert_eq!(parse_word("-fx:malloc"), None);
    }
}
