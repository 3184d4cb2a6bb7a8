//! Hook plumbing shared by every layer that hooks a function: the chain
//! pointers of the process-wide hooks ([`orig`]), one install sequence
//! ([`install`]: the chain is published before the patch goes live), the
//! real `sigaction` that bypasses our own hook, whether a call of the
//! dynamic loader is in progress, and the hooked functions' plans kept
//! between processes ([`plans`]).
//!
//! Owns: chain pointer storage and installation. Which functions are
//! hooked, and what the replacements do, belongs to the layers above
//! (`process/hooks.rs`, `modules/mem`, `modules/fd`).
//!
//! Must never: import anything above `base/`, or call a hooked function
//! other than through its chain pointer.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::sys;

pub mod plans;

/// The function a `clone()` child runs.
pub type CloneFn = extern "C" fn(*mut c_void) -> c_int;

/// glibc's clone, past our hook (which would take the profiler's own
/// processes, the keeper and the planner, for threads of the program).
pub fn real_clone() -> orig::Clone {
    orig::clone().unwrap_or_else(|| {
        // SAFETY: glibc's variadic clone, called with its seven arguments
        // (see orig::Clone); its code reads no variadic register count.
        unsafe { core::mem::transmute::<*const (), orig::Clone>(libc::clone as *const ()) }
    })
}

/// Chain pointers of the hooked functions (0 = not hooked).
pub mod orig {
    use super::*;

    pub type PthreadCreate = unsafe extern "C" fn(
        *mut libc::pthread_t,
        *const libc::pthread_attr_t,
        extern "C" fn(*mut c_void) -> *mut c_void,
        *mut c_void,
    ) -> c_int;
    pub type Fork = unsafe extern "C" fn() -> libc::pid_t;
    pub type Execve =
        unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    pub type Sigaction =
        unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
    pub type Signal = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;
    pub type Mask =
        unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
    pub type Exit = unsafe extern "C" fn(c_int) -> !;
    pub type Abort = unsafe extern "C" fn() -> !;
    pub type Kill = unsafe extern "C" fn(libc::pid_t, c_int) -> c_int;
    pub type Raise = unsafe extern "C" fn(c_int) -> c_int;
    pub type Dlopen = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    pub type Dlclose = unsafe extern "C" fn(*mut c_void) -> c_int;
    pub type Longjmp = unsafe extern "C" fn(*mut c_void, c_int) -> !;
    pub type SetId1 = unsafe extern "C" fn(libc::uid_t) -> c_int;
    pub type SetId2 = unsafe extern "C" fn(libc::uid_t, libc::uid_t) -> c_int;
    pub type SetId3 = unsafe extern "C" fn(libc::uid_t, libc::uid_t, libc::uid_t) -> c_int;
    /// glibc's variadic `ptrace`, called with its request and the three
    /// words it may read.
    pub type Ptrace =
        unsafe extern "C" fn(c_int, libc::pid_t, *mut c_void, *mut c_void) -> libc::c_long;
    /// glibc's variadic `clone`, called with all seven arguments (the last
    /// three are read by the kernel only when `flags` asks for them).
    pub type Clone = unsafe extern "C" fn(
        super::CloneFn,
        *mut c_void,
        c_int,
        *mut c_void,
        *mut libc::pid_t,
        *mut c_void,
        *mut libc::pid_t,
    ) -> c_int;

    /// The process hooks' chain pointers in one [`super::Chains`] table,
    /// indexed by [`Core`], and a typed getter `$f` for each.
    macro_rules! chains {
        ($($f:ident, $s:ident, $t:ty;)*) => {
            /// Index of each process hook in `CHAINS`.
            #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
            #[derive(Clone, Copy, Debug)]
            pub enum Core { $($s,)* }
            const N: usize = [$(stringify!($s)),*].len();
            pub(crate) static CHAINS: super::Chains<N> = super::Chains::new();
            $(
                #[inline]
                pub fn $f() -> Option<$t> {
                    let i = Core::$s as usize;
                    // SAFETY: only the chain of a function of type $t is
                    // stored at its index, and only when it is hooked.
                    CHAINS.is_set(i).then(|| unsafe { CHAINS.get::<$t>(i) })
                }
            )*
        };
    }
    chains! {
        pthread_create, PTHREAD_CREATE, PthreadCreate;
        clone, CLONE, Clone;
        fork, FORK, Fork;
        execve, EXECVE, Execve;
        sigaction, SIGACTION, Sigaction;
        signal, SIGNAL, Signal;
        sigprocmask, SIGPROCMASK, Mask;
        pthread_sigmask, PTHREAD_SIGMASK, Mask;
        exit_, EXIT_, Exit;
        abort, ABORT, Abort;
        kill, KILL, Kill;
        raise, RAISE, Raise;
        dlopen, DLOPEN, Dlopen;
        dlclose, DLCLOSE, Dlclose;
        siglongjmp, SIGLONGJMP, Longjmp;
        longjmp_chk, LONGJMP_CHK, Longjmp;
        setuid, SETUID, SetId1;
        seteuid, SETEUID, SetId1;
        setreuid, SETREUID, SetId2;
        setresuid, SETRESUID, SetId3;
        ptrace, PTRACE, Ptrace;
    }
}

/// Why a core hook could not be installed.
#[derive(Debug)]
pub enum InstallError {
    Lookup {
        name: &'static str,
        err: trampoline::LookupError,
    },
    Hook {
        name: &'static str,
        err: trampoline::HookError,
    },
}

impl core::fmt::Display for InstallError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InstallError::Lookup { name, err } => write!(f, "cannot find {name}: {err}"),
            InstallError::Hook { name, err } => write!(f, "cannot hook {name}: {err}"),
        }
    }
}

/// Hooks `name` in libc with `replacement`, storing the chain in `slot`.
pub fn install(
    name: &'static str,
    replacement: *const (),
    slot: orig::Core,
) -> Result<(), InstallError> {
    let sym = trampoline::find_function(name, Some("libc.so.6"))
        .map_err(|err| InstallError::Lookup { name, err })?;
    let i = slot as usize;
    hook_symbol(&sym, replacement, |c| orig::CHAINS.set(i, c)).map_err(|err| {
        orig::CHAINS.set(i, core::ptr::null());
        InstallError::Hook { name, err }
    })?;
    Ok(())
}

/// A table of chain pointers indexed by a module's own enum of hooked
/// functions (0 = not hooked).
pub struct Chains<const N: usize>([AtomicUsize; N]);

impl<const N: usize> Chains<N> {
    pub const fn new() -> Self {
        Chains([const { AtomicUsize::new(0) }; N])
    }

    /// Stores the chain pointer of function `i`.
    pub fn set(&self, i: usize, chain: *const ()) {
        self.0[i].store(chain as usize, Ordering::Release);
    }

    /// Whether function `i` is hooked.
    pub fn is_set(&self, i: usize) -> bool {
        self.0[i].load(Ordering::Relaxed) != 0
    }

    /// The chain pointer of function `i` as its function type `F`.
    ///
    /// # Safety
    /// `F` is the type of the function stored at `i` (a function pointer),
    /// and it is hooked (a replacement runs only after its chain is set).
    #[inline(always)]
    pub unsafe fn get<F: Copy>(&self, i: usize) -> F {
        debug_assert_eq!(core::mem::size_of::<F>(), core::mem::size_of::<usize>());
        let p = self.0[i].load(Ordering::Relaxed);
        // SAFETY: guaranteed by the caller: F is a function pointer type.
        unsafe { core::mem::transmute_copy::<usize, F>(&p) }
    }
}

impl<const N: usize> Default for Chains<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Declares a module's hooked functions once, each with its signature:
/// the index enum (one variant per function), the table of their chain
/// pointers `CHAIN` (a [`Chains`]) and a module `chain` with one safe
/// function per hooked function, `chain::name(args)`, that calls the
/// original through its chain pointer with the declared signature. The
/// replacements call their originals only through `chain`, so the pairing
/// of an index with a type is written once, here, and not at every call
/// (as heaptrack's `HOOK(name)` takes a hook's type from its declaration).
///
/// ```ignore
/// hook_table! {
///     pub enum Func {
///         Malloc => fn malloc(size: usize) -> *mut c_void;
///         Free => fn free(p: *mut c_void);
///     }
/// }
/// ```
///
/// The declaring module must store at index `Func::X` only the chain
/// pointer of the function declared as `X` ([`hook_symbol`] publishes it
/// before the hook goes live), and call `chain::*` only to forward the
/// program's own call of that function.
macro_rules! hook_table {
    (
        $(#[$em:meta])*
        $vis:vis enum $E:ident {
            $( $(#[$m:meta])* $v:ident => fn $f:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)?; )*
        }
    ) => {
        $(#[$em])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        $vis enum $E { $( $(#[$m])* $v, )* }
        const N: usize = [$(stringify!($v)),*].len();
        /// Chain pointers, indexed by the enum of hooked functions.
        static CHAIN: $crate::hook::Chains<N> = $crate::hook::Chains::new();
        /// The originals of the hooked functions, with their declared
        /// signatures (see `hook_table!`).
        mod chain {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[inline(always)]
                pub(super) fn $f($($a: $t),*) $(-> $r)? {
                    // SAFETY: the chain at this index is the original of
                    // the function declared with this signature, set
                    // before its replacement can run (the table's
                    // contract); the arguments are the program's own call
                    // of it, forwarded unchanged.
                    unsafe {
                        super::CHAIN.get::<unsafe extern "C" fn($($t),*) $(-> $r)?>(
                            super::$E::$v as usize,
                        )($($a),*)
                    }
                }
            )*
        }
    };
}
pub(crate) use hook_table;

/// Hooks `sym` with `replacement`: prepared, its chain pointer handed to
/// `store`, then enabled, so the replacement never runs before its chain
/// exists. The hook stays for the life of the process.
pub fn hook_symbol(
    sym: &trampoline::Symbol,
    replacement: *const (),
    store: impl FnOnce(*const ()),
) -> Result<(), trampoline::HookError> {
    let p = trampoline::prepare(sym, replacement)?;
    let Some(_window) = PatchWindow::open() else {
        return Err(trampoline::HookError {
            function: sym.name.clone(),
            addr: sym.addr,
            reason: trampoline::Reason::OthersRunning,
        });
    };
    if let Err(pc) = move_threads_out(|pc| p.moved_pc(pc), p.patched_range()) {
        return Err(trampoline::HookError {
            function: sym.name.clone(),
            addr: sym.addr,
            reason: trampoline::Reason::ThreadInside { pc },
        });
    }
    store(p.chain());
    let h = p.enable()?;
    crate::igprof_debug!("hooked {} at {:#x}", sym.name, sym.addr);
    lock(&HOOKS).push(h);
    Ok(())
}

/// Set to 1 by `igprof --attach` before it lets the process's other
/// threads run during one of its calls that takes long (the call may wait
/// for a lock one of them holds). From then on that call writes no code:
/// what a patch covers may be running. Cleared by [`begin_call`].
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static igprof_attach_others_ran: AtomicU64 = AtomicU64::new(0);

/// 1 while code is being written; the launcher waits for 0 before it
/// lets the other threads run (so either it sees a write under way, or
/// the write sees [`igprof_attach_others_ran`]).
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static igprof_attach_patching: AtomicU64 = AtomicU64::new(0);

/// Set when a write was refused because the other threads ran.
static HELD_OFF: AtomicBool = AtomicBool::new(false);

/// While held, code may be written: every other thread is stopped, or no
/// launcher is calling (the preloaded library's own hooks).
struct PatchWindow;

impl PatchWindow {
    fn open() -> Option<PatchWindow> {
        igprof_attach_patching.store(1, Ordering::SeqCst);
        if igprof_attach_others_ran.load(Ordering::SeqCst) != 0 {
            igprof_attach_patching.store(0, Ordering::SeqCst);
            HELD_OFF.store(true, Ordering::Release);
            return None;
        }
        Some(PatchWindow)
    }
}

impl Drop for PatchWindow {
    fn drop(&mut self) {
        igprof_attach_patching.store(0, Ordering::SeqCst);
    }
}

/// At the start of a launcher's call: the other threads are all stopped.
pub fn begin_call() {
    igprof_attach_others_ran.store(0, Ordering::SeqCst);
    HELD_OFF.store(false, Ordering::Release);
}

/// Whether a write was refused in this call because the other threads
/// were let run (see [`igprof_attach_others_ran`]).
pub fn held_off() -> bool {
    HELD_OFF.load(Ordering::Acquire)
}

/// Whether `igprof --attach` has let the other threads run during this
/// call (see [`igprof_attach_others_ran`]).
pub fn others_ran() -> bool {
    igprof_attach_others_ran.load(Ordering::SeqCst) != 0
}

/// Every hook installed, in order, for [`remove_all`] and [`restore_all`]
/// (a process attached to by `igprof --attach` gets its bytes back).
static HOOKS: std::sync::Mutex<Vec<trampoline::Hook>> = std::sync::Mutex::new(Vec::new());
/// The next instructions of the threads `igprof --attach` stopped: no
/// patch may cover one of them but at its first byte.
static AVOID: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The stopped threads ([`AVOID`]) whose next instruction lies strictly
/// inside `range`, the bytes a patch covers, go on at the same instruction
/// in its trampoline (`moved`: where, if it can); Err(pc) for one that
/// cannot (then nothing is moved and [`refused_for_thread_inside`] says so).
fn move_threads_out(
    moved: impl Fn(u64) -> Option<u64>,
    (start, end): (u64, u64),
) -> Result<(), u64> {
    let mut avoid = lock(&AVOID);
    let inside: Vec<usize> = (0..avoid.len())
        .filter(|&i| avoid[i] > start && avoid[i] < end)
        .collect();
    let mut to = Vec::with_capacity(inside.len());
    for &i in &inside {
        match moved(avoid[i]) {
            Some(pc) => to.push(pc),
            None => {
                THREAD_INSIDE.store(true, Ordering::Release);
                return Err(avoid[i]);
            }
        }
    }
    let report = MOVED_TO.load(Ordering::Acquire);
    for (&i, pc) in inside.iter().zip(to) {
        avoid[i] = pc;
        if report != 0 {
            // SAFETY: MOVED_TO holds 0 or a `fn(usize, u64)` (avoid_pcs).
            let f: fn(usize, u64) = unsafe { core::mem::transmute(report) };
            f(i, pc);
        }
    }
    Ok(())
}

/// Where [`avoid_pcs`]'s caller hears of each move at once (0: nowhere).
static MOVED_TO: AtomicUsize = AtomicUsize::new(0);

/// The stopped threads' next instructions after the installs since
/// [`avoid_pcs`], in its order: moved where a patch covered one.
pub fn moved_pcs() -> Vec<u64> {
    lock(&AVOID).clone()
}

/// Set when an install was refused for a stopped thread inside its bytes.
static THREAD_INSIDE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The stopped threads' next instructions that the next installs must
/// not cover (empty: none); `moved(i, pc)` hears of each move as it is
/// made, before the patch is written.
pub fn avoid_pcs(pcs: &[u64], moved: Option<fn(usize, u64)>) {
    MOVED_TO.store(moved.map_or(0, |f| f as usize), Ordering::Release);
    *lock(&AVOID) = pcs.to_vec();
    THREAD_INSIDE.store(false, Ordering::Release);
}

/// Whether an install since [`avoid_pcs`] was refused because a stopped
/// thread's next instruction was inside its bytes.
pub fn refused_for_thread_inside() -> bool {
    THREAD_INSIDE.load(Ordering::Acquire)
}

/// Removes every hook (newest first: stacked hooks come off in reverse),
/// writing the functions' original bytes back; trampolines stay mapped,
/// for threads still running in them. Returns how many could not be
/// removed (each said in one line).
pub fn remove_all() -> usize {
    let hooks = lock(&HOOKS);
    match PatchWindow::open() {
        Some(_w) => uninstall(&hooks),
        None => hooks.len(),
    }
}

/// [`remove_all`], unless another thread holds the registry (a thread
/// stopped while hooking): then nothing is done (None).
pub fn try_remove_all() -> Option<usize> {
    let hooks = match HOOKS.try_lock() {
        Ok(hooks) => hooks,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    let _w = PatchWindow::open()?;
    Some(uninstall(&hooks))
}

/// Forgets the hooks whose patch site is no longer mapped (the program
/// unloaded their library; after a dlclose). Their records could never be
/// removed or written again, and a library loaded and unloaded in a loop
/// added one each round. Their trampolines stay mapped, for a thread
/// that may still run in one. A site in an object of the module table
/// (just refreshed) is kept without asking the kernel: only the others
/// cost a `mincore`.
pub fn forget_unmapped() {
    lock(&HOOKS).retain(|h| {
        crate::unwind::module_of(h.patched_range().0 as usize).is_some() || site_mapped(h)
    });
}

/// Whether the code a hook patched is still mapped: a library the program
/// unloaded (dlclose) took its hooks' patch sites with it, and reading
/// them faulted (the detach of a process that had unloaded a library
/// hooked by -fp stopped at the first hook it removed, leaving every
/// other one in place).
fn site_mapped(h: &trampoline::Hook) -> bool {
    let (start, end) = h.patched_range();
    crate::sys::mapped(start as usize, (end - start) as usize)
}

fn uninstall(hooks: &[trampoline::Hook]) -> usize {
    let mut failed = 0;
    for h in hooks.iter().rev().filter(|h| site_mapped(h)) {
        if let Err(e) = h.uninstall() {
            crate::igprof_log!("cannot restore {e}");
            failed += 1;
        }
    }
    failed
}

/// Writes every hook [`remove_all`] removed again; how many could not be.
/// Nothing is written when a stopped thread's next instruction lies
/// inside a patch ([`avoid_pcs`]; [`refused_for_thread_inside`] says so).
pub fn restore_all() -> usize {
    let hooks = lock(&HOOKS);
    let Some(_w) = PatchWindow::open() else {
        return hooks.len();
    };
    let live: Vec<&trampoline::Hook> = hooks.iter().filter(|h| site_mapped(h)).collect();
    if live
        .iter()
        .any(|h| move_threads_out(|pc| h.moved_pc(pc), h.patched_range()).is_err())
    {
        return hooks.len();
    }
    let mut failed = 0;
    for h in live {
        if let Err(e) = h.reinstall() {
            crate::igprof_log!("cannot hook again: {e}");
            failed += 1;
        }
    }
    failed
}

/// The addresses one install pass hooked: a name found at an address
/// already hooked is an alias (glibc's cfree and free) and is skipped.
#[derive(Default)]
pub struct Hooked(Vec<u64>);

impl Hooked {
    pub const fn new() -> Self {
        Hooked(Vec::new())
    }

    /// Hooks `sym` unless its address was hooked by this pass (Ok(false)).
    pub fn hook(
        &mut self,
        sym: &trampoline::Symbol,
        replacement: *const (),
        store: impl FnOnce(*const ()),
    ) -> Result<bool, trampoline::HookError> {
        if self.0.contains(&sym.addr) {
            crate::igprof_debug!("{} is an alias of a function already hooked", sym.name);
            return Ok(false);
        }
        hook_symbol(sym, replacement, store)?;
        self.0.push(sym.addr);
        Ok(true)
    }
}

/// sigaction through the original function (our hook bypassed).
pub(crate) fn real_sigaction(
    sig: i32,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> Result<(), i32> {
    // SAFETY: pointers are null or valid, as for sigaction(2).
    let r = unsafe {
        match orig::sigaction() {
            Some(f) => f(sig, act, old),
            None => libc::sigaction(sig, act, old),
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(sys::errno())
    }
}

/// Installs `handler` (a signal handler's address, of the form `flags`
/// says: `SA_SIGINFO` or not) for `sig` through [`real_sigaction`], with an
/// empty mask.
pub(crate) fn take_signal(sig: i32, handler: usize, flags: i32) -> Result<(), i32> {
    // SAFETY: a zeroed sigaction is valid (empty mask); fields set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = flags;
    real_sigaction(sig, &sa, core::ptr::null_mut())
}

/// Calls of dlopen/dlclose in progress (see [`in_loader`]).
static IN_LOADER: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Whether a dlopen or dlclose is in progress: the loader's object list
/// may be half-updated, so the calling thread must not dump from a signal
/// handler (`process/watcher.rs`).
pub fn in_loader() -> bool {
    IN_LOADER.load(core::sync::atomic::Ordering::Acquire) != 0
}

/// Runs a call of the dynamic loader counted in `IN_LOADER`.
pub fn loading<R>(f: impl FnOnce() -> R) -> R {
    use core::sync::atomic::Ordering;
    IN_LOADER.fetch_add(1, Ordering::AcqRel);
    let r = f();
    IN_LOADER.fetch_sub(1, Ordering::AcqRel);
    r
}
