//! Installing and removing a hook in the running process, for any
//! architecture implementing [`Arch`].
//!
//! Owns: the install sequence (read the function's bytes, plan, or take
//! the plan the table of known plans has for exactly these bytes, place
//! the trampoline near the target, place an entry stub when the
//! replacement is out of near reach, write the patch) and its reverse.
//! Holds a process-wide lock so installs and uninstalls never interleave.
//!
//! Must never: be used from a signal handler or from inside a hook (it
//! allocates, reads /proc/self/maps, takes a lock).

use crate::arch::{Arch, Plan};
use crate::error::{HookError, Reason};
use crate::symbols::Symbol;
use crate::{known, maps, nearmem, patch, symbols};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static INSTALL_LOCK: Mutex<()> = Mutex::new(());

/// How far into a trampoline [`Hook::moved_pc`] looks for the taken
/// bytes: up to the length of a landing pad (`endbr64`) before them. A
/// trampoline ends with a jump back of at least this many bytes, so the
/// bytes read stay inside it.
const MAX_SCAN: usize = 4;

/// An installed hook. Dropping it leaves the hook installed (a profiler keeps
/// its hooks for the process lifetime); call [`Hook::uninstall`] to remove it.
#[derive(Debug)]
pub struct Hook {
    name: String,
    target: u64,
    patch_at: u64,
    original: Vec<u8>,
    patch: Vec<u8>,
    chain: u64,
    plan: Plan,
    /// Patch written and not removed (enable sets it, uninstall clears it).
    installed: AtomicBool,
}

/// What [`crate::probe`] found: the plan install would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub plan: Plan,
    /// Length of the trampoline it would build (at a representative address).
    pub trampoline_len: usize,
}

impl Hook {
    /// Address that runs the original function (the trampoline). Cast it to
    /// the function's type with `std::mem::transmute`.
    pub fn chain(&self) -> *const () {
        self.chain as *const ()
    }

    /// The hooked function's address.
    pub fn target(&self) -> u64 {
        self.target
    }

    /// The plan used: bytes kept, taken and patched.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Restore the original bytes. The trampoline stays mapped (threads may
    /// still be running in it), so `chain` stays callable. Refused with
    /// `PatchChanged` (and the hook stays installed) when the patch was
    /// overwritten since, e.g. by a second hook on the same function: remove
    /// stacked hooks in reverse order. Uninstalling twice is a no-op.
    pub fn uninstall(&self) -> Result<(), HookError> {
        uninstall_with::<crate::arch::Host>(self)
    }

    /// Write the patch again after [`Hook::uninstall`] (the same
    /// trampoline and replacement). Refused with `PatchChanged` when the
    /// function's bytes are no longer the original ones. Installing twice
    /// is a no-op.
    pub fn reinstall(&self) -> Result<(), HookError> {
        if self.installed.load(Ordering::SeqCst) {
            return Ok(());
        }
        replace_bytes::<crate::arch::Host>(self, &self.original, &self.patch)?;
        self.installed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The bytes the patch overwrites: `[start, end)`. A thread whose next
    /// instruction lies strictly inside it must not run while the patch
    /// is written or removed.
    pub fn patched_range(&self) -> (u64, u64) {
        (self.patch_at, self.patch_at + self.original.len() as u64)
    }

    /// Where a thread whose next instruction is `pc`, strictly inside the
    /// patched bytes, can go on instead: the same instruction in the
    /// trampoline, when the trampoline holds the taken bytes unchanged
    /// (no instruction among them needed relocation); None otherwise, or
    /// when `pc` is not inside.
    pub fn moved_pc(&self, pc: u64) -> Option<u64> {
        let (start, end) = self.patched_range();
        if pc <= start || pc >= end {
            return None;
        }
        let len = self.original.len();
        // SAFETY: the trampoline stays mapped for the life of the process
        // and holds the relocated taken bytes (at least `len` when none
        // was relocated), maybe a landing pad before them and a jump back
        // of at least MAX_SCAN bytes after them.
        let tramp = unsafe { std::slice::from_raw_parts(self.chain as *const u8, len + MAX_SCAN) };
        (0..=MAX_SCAN)
            .find(|&k| tramp[k..k + len] == self.original[..])
            .map(|k| self.chain + k as u64 + (pc - start))
    }

    /// False once [`Hook::uninstall`] has succeeded.
    pub fn is_installed(&self) -> bool {
        self.installed.load(Ordering::SeqCst)
    }
}

fn err(sym: &Symbol, reason: Reason) -> HookError {
    HookError {
        function: sym.name.clone(),
        addr: sym.addr,
        reason,
    }
}

/// Copy the function's bytes out of live memory: the whole function when its
/// size is known (with the padding after it if `padding`), else up to
/// `A::MAX_READ` bytes, never past its mapping.
fn read_code<A: Arch>(sym: &Symbol, padding: bool) -> Result<Vec<u8>, Reason> {
    let io = |e: std::io::Error| Reason::Protect(e.raw_os_error().unwrap_or(0));
    let code_at = |map: &[maps::Mapping]| {
        maps::find(map, sym.addr)
            .filter(|m| m.read && m.exec)
            .cloned()
    };
    let m = match code_at(&maps::read_self().map_err(io)?) {
        Some(m) => m,
        None => code_at(&maps::read_self_fresh().map_err(io)?)
            .ok_or(Reason::NotMapped { addr: sym.addr })?,
    };
    let want = match sym.size {
        Some(s) if padding => {
            s + symbols::padding_after(sym.addr + s, crate::arch::PADDING_READ as u64)
        }
        Some(s) => s,
        None => A::MAX_READ as u64,
    };
    let len = want.min(m.end - sym.addr) as usize;
    // SAFETY: [addr, addr+len) lies in a readable mapping (checked above).
    Ok(unsafe { std::slice::from_raw_parts(sym.addr as *const u8, len) }.to_vec())
}

/// Runs `f` on the function's code as [`Arch`] describes it. The padding
/// after a function of known size is looked for only when the function
/// alone is too short for the patch: finding where it ends costs symbol
/// look-ups (a scan of the object's symbols each), which add up over the
/// dozens of functions hooked at every process start.
fn with_code<A: Arch, R>(
    sym: &Symbol,
    mut f: impl FnMut(&[u8]) -> Result<R, Reason>,
) -> Result<(Vec<u8>, R), Reason> {
    let code = read_code::<A>(sym, false)?;
    match f(&code) {
        Err(Reason::TooShort { .. }) if sym.size.is_some() => {
            let code = read_code::<A>(sym, true)?;
            let r = f(&code)?;
            Ok((code, r))
        }
        r => r.map(|r| (code, r)),
    }
}

pub(crate) fn probe_with<A: Arch>(sym: &Symbol) -> Result<Probe, HookError> {
    // From the known plans when they hold these bytes: no decoding.
    let (code, (plan, record)) = with_code::<A, _>(sym, |code| {
        plan_for::<A>(sym, code, A::NEAR_PATCH_LEN).map(|(plan, record, _)| (plan, record))
    })
    .map_err(|r| err(sym, r))?;
    let patch_at = sym.addr + plan.keep as u64;
    let tramp = nearmem::would_place(
        patch_at,
        A::NEAR_REACH,
        A::MAX_TRAMPOLINE_LEN as u64,
        A::CODE_ALIGN as u64,
    )
    .ok_or_else(|| {
        err(
            sym,
            Reason::NoMemoryInReach {
                near: patch_at,
                reach: A::NEAR_REACH,
            },
        )
    })?;
    let out =
        relocated::<A>(sym, &code, &plan, record.as_deref(), tramp).map_err(|r| err(sym, r))?;
    Ok(Probe {
        plan,
        trampoline_len: out.len(),
    })
}

/// A hook whose trampoline is built but whose patch is not written yet:
/// publish [`Prepared::chain`] where the replacement will find it, then
/// [`Prepared::enable`]. Dropping it leaves the function untouched (the
/// trampoline memory is not reused).
#[derive(Debug)]
pub struct Prepared {
    hook: Hook,
}

impl Prepared {
    /// Address that runs the original function (the trampoline).
    pub fn chain(&self) -> *const () {
        self.hook.chain()
    }

    /// The plan that will be used.
    pub fn plan(&self) -> Plan {
        self.hook.plan
    }

    /// The bytes [`Prepared::enable`] will overwrite (see [`Hook::patched_range`]).
    pub fn patched_range(&self) -> (u64, u64) {
        self.hook.patched_range()
    }

    /// See [`Hook::moved_pc`].
    pub fn moved_pc(&self, pc: u64) -> Option<u64> {
        self.hook.moved_pc(pc)
    }

    /// Write the patch: from now on calls go to the replacement.
    pub fn enable(self) -> Result<Hook, HookError> {
        enable_with::<crate::arch::Host>(self)
    }
}

/// Reach used for far-form trampolines: the whole user address space.
const ANYWHERE: u64 = 1 << 47;

/// Plan, trampoline address and patch bytes of a prepared hook.
type Built = (Plan, u64, Vec<u8>);

/// Build a hook. `force_far` skips the near form; otherwise the far form is
/// the fallback when no memory is free within the near reach.
pub(crate) fn prepare_with<A: Arch>(
    sym: &Symbol,
    replacement: *const (),
    force_far: bool,
) -> Result<Prepared, HookError> {
    let _guard = INSTALL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let replacement = replacement as u64;
    let (code, built) = with_code::<A, _>(sym, |code| {
        if force_far {
            build_far::<A>(sym, code, replacement)
        } else {
            match build_near::<A>(sym, code, replacement) {
                Err(Reason::NoMemoryInReach { .. }) => build_far::<A>(sym, code, replacement),
                other => other,
            }
        }
    })
    .map_err(|r| err(sym, r))?;
    let (plan, chain, patch) = built;
    let start = plan.keep;
    let original = code[start..start + plan.taken].to_vec();
    let patch_at = sym.addr + plan.keep as u64;
    Ok(Prepared {
        hook: Hook {
            name: sym.name.clone(),
            target: sym.addr,
            patch_at,
            original,
            patch,
            chain,
            plan,
            installed: AtomicBool::new(false),
        },
    })
}

/// The plan of a patch of `patch_len` bytes on `code`: from the table of
/// known plans when it has one for these bytes whose record fits them
/// (then no decoding), else planned. Returns the record, if known, and the
/// table's key for the caller to add a plan it made.
fn plan_for<A: Arch>(
    sym: &Symbol,
    code: &[u8],
    patch_len: usize,
) -> Result<(Plan, Option<Vec<u8>>, known::Key), Reason> {
    let key = known::key(code, sym.size, patch_len);
    // Known, or planned by the planner elsewhere (then known), or here.
    let mut asked = false;
    loop {
        if let Some((plan, record)) = known::get(&key) {
            let fits = plan.patch_len == patch_len
                && plan.keep + plan.taken <= code.len()
                && plan.taken >= patch_len
                && A::relocate_known(code, sym.addr, &plan, sym.addr, &record).is_ok();
            if fits {
                return Ok((plan, Some(record), key));
            }
        }
        if asked || !known::plan_elsewhere(code, sym.addr, sym.size, patch_len) {
            break;
        }
        asked = true;
    }
    Ok((A::plan(code, sym.addr, sym.size, patch_len)?, None, key))
}

/// What a [`known::Planner`] runs in its process: the plan and record of
/// a patch of `patch_len` bytes on `code` (at `addr`, of `size`), as a
/// table of one entry for [`known::import`]; None where it cannot be
/// hooked (the process that asked then plans it itself, and says why).
pub(crate) fn plan_entry<A: Arch>(
    code: &[u8],
    addr: u64,
    size: Option<u64>,
    patch_len: usize,
) -> Option<Vec<u8>> {
    let plan = A::plan(code, addr, size, patch_len).ok()?;
    let record = A::record(code, addr, &plan)?;
    Some(known::entry_bytes(
        known::key(code, size, patch_len),
        plan,
        record,
    ))
}

/// The trampoline at `tramp`: from the known record, else decoded.
fn relocated<A: Arch>(
    sym: &Symbol,
    code: &[u8],
    plan: &Plan,
    record: Option<&[u8]>,
    tramp: u64,
) -> Result<Vec<u8>, Reason> {
    match record {
        Some(r) => A::relocate_known(code, sym.addr, plan, tramp, r),
        None => A::relocate(code, sym.addr, plan, tramp),
    }
}

/// After a hook was built from a plan made here: keep its plan and record
/// for later processes.
fn remember<A: Arch>(sym: &Symbol, code: &[u8], plan: &Plan, key: known::Key, known: bool) {
    if !known {
        if let Some(record) = A::record(code, sym.addr, plan) {
            known::put(key, *plan, record);
        }
    }
}

/// Near form: `A::NEAR_PATCH_LEN` bytes at the target, trampoline (and, if
/// the replacement is out of reach, an entry stub) within `A::NEAR_REACH`.
fn build_near<A: Arch>(sym: &Symbol, code: &[u8], replacement: u64) -> Result<Built, Reason> {
    let (plan, record, key) = plan_for::<A>(sym, code, A::NEAR_PATCH_LEN)?;
    let patch_at = sym.addr + plan.keep as u64;
    let chain = nearmem::place::<A>(patch_at, A::MAX_TRAMPOLINE_LEN, |tramp| {
        relocated::<A>(sym, code, &plan, record.as_deref(), tramp)
    })?;
    let mut patch = match A::near_patch(patch_at, replacement) {
        Some(p) => p,
        None => {
            let stub =
                nearmem::place::<A>(patch_at, A::STUB_LEN, |at| Ok(A::stub(at, replacement)))?;
            // `place` keeps the stub within reach of the patch site; the
            // branch is measured from a slightly different origin, so check.
            A::near_patch(patch_at, stub).ok_or(Reason::NoMemoryInReach {
                near: patch_at,
                reach: A::NEAR_REACH,
            })?
        }
    };
    patch.extend(A::filler(plan.taken - plan.patch_len));
    remember::<A>(sym, code, &plan, key, record.is_some());
    Ok((plan, chain, patch))
}

/// Far form: `A::FAR_PATCH_LEN` bytes at the target jump anywhere; the
/// trampoline goes wherever memory is free (nearest first).
fn build_far<A: Arch>(sym: &Symbol, code: &[u8], replacement: u64) -> Result<Built, Reason> {
    let (plan, record, key) = plan_for::<A>(sym, code, A::FAR_PATCH_LEN)?;
    let patch_at = sym.addr + plan.keep as u64;
    let chain = nearmem::place_within::<A>(patch_at, ANYWHERE, A::MAX_TRAMPOLINE_LEN, |tramp| {
        relocated::<A>(sym, code, &plan, record.as_deref(), tramp)
    })?;
    let mut patch = A::far_patch(patch_at, replacement);
    patch.extend(A::filler(plan.taken - plan.patch_len));
    remember::<A>(sym, code, &plan, key, record.is_some());
    Ok((plan, chain, patch))
}

fn enable_with<A: Arch>(prepared: Prepared) -> Result<Hook, HookError> {
    let hook = prepared.hook;
    replace_bytes::<A>(&hook, &hook.original, &hook.patch)?;
    hook.installed.store(true, Ordering::SeqCst);
    Ok(hook)
}

fn uninstall_with<A: Arch>(hook: &Hook) -> Result<(), HookError> {
    if !hook.installed.load(Ordering::SeqCst) {
        return Ok(());
    }
    replace_bytes::<A>(hook, &hook.patch, &hook.original)?;
    hook.installed.store(false, Ordering::SeqCst);
    Ok(())
}

/// Under the install lock: if the bytes at the patch site are `expect`,
/// write `new` there; otherwise refuse with `PatchChanged`.
fn replace_bytes<A: Arch>(hook: &Hook, expect: &[u8], new: &[u8]) -> Result<(), HookError> {
    let _guard = INSTALL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let e = |reason| HookError {
        function: hook.name.clone(),
        addr: hook.target,
        reason,
    };
    // SAFETY: the patch site is mapped code: prepare read it, and a caller
    // removing or writing a hook again after the program may have unloaded
    // its library checks first that its bytes are still mapped (igprof's
    // hook registry does).
    let now = unsafe { std::slice::from_raw_parts(hook.patch_at as *const u8, expect.len()) };
    if now != expect {
        return Err(e(Reason::PatchChanged { at: hook.patch_at }));
    }
    patch::write_code::<A>(hook.patch_at, new).map_err(e)
}
