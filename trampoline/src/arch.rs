//! The interface every architecture module implements (`x86_64`, `aarch64`).
//!
//! Owns: the [`Arch`] trait and the [`Plan`] it produces. Everything here is
//! pure: functions take bytes and addresses and return bytes or a typed
//! [`Reason`]; they never read process memory, allocate executable pages,
//! change protections or look at the host. That is what lets both
//! architectures compile and be tested on every host, and what lets the
//! survey example run them over ELF files without executing anything.
//!
//! Must never: touch process state (the only exception is
//! [`Arch::flush_icache`], which is called by `patch`/`nearmem` after
//! writing code and is a no-op when the host is another architecture).

use crate::error::Reason;

/// How the first bytes of a function will be replaced.
///
/// Layout at the target after install:
///
/// ```text
/// addr            addr+keep                  addr+keep+taken
/// | kept (endbr64 | patch (jump to entry)... | rest of the function, unchanged
/// |  / bti c)     | + filler up to `taken`   |
/// ```
///
/// The trampoline (`chain`) holds: the kept landing-pad instruction again
/// (so an indirect call to `chain` works under CET/BTI), the `taken` bytes
/// relocated, then a jump back to `addr + keep + taken`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Bytes at the start of the function left in place (a landing pad:
    /// `endbr64` on x86-64, `bti c`/`paciasp` style on AArch64). The patch is
    /// written after them, so indirect calls still land on a landing pad.
    pub keep: usize,
    /// Bytes replaced by the patch, starting at `addr + keep`; always a whole
    /// number of instructions and `>= patch_len`.
    pub taken: usize,
    /// Number of instructions in the `taken` bytes.
    pub instructions: usize,
    /// Length of the patch that will be written at `addr + keep`.
    pub patch_len: usize,
}

/// Bytes after a function of known size that callers pass along in `code`.
pub const PADDING_READ: usize = 16;

/// One architecture: decode, plan, relocate, verify and emit. All pure.
///
/// `code` always starts at the function's first byte (`addr`) and holds the
/// whole function when its size is known (`func_size`) plus up to
/// [`PADDING_READ`] following bytes when they exist (alignment padding an
/// architecture may use for very short functions), otherwise as many bytes
/// as are mapped, up to [`Arch::MAX_READ`].
pub trait Arch {
    /// Human name, e.g. "x86-64".
    const NAME: &'static str;
    /// ELF `e_machine` of code this module handles (62 = x86-64, 183 = AArch64).
    const ELF_MACHINE: u16;
    /// Distance (bytes, either direction) a near patch branch reaches; the
    /// trampoline and the entry stub must lie within it of the patch site.
    /// x86-64: 2 GiB (`jmp rel32`); AArch64: 128 MiB (`b`).
    const NEAR_REACH: u64;
    /// Length of the near patch (x86-64 `jmp rel32`: 5; AArch64 `b`: 4).
    const NEAR_PATCH_LEN: usize;
    /// Length of the far patch (absolute jump to anywhere).
    const FAR_PATCH_LEN: usize;
    /// Length of an entry stub: absolute jump to any address, placed in a
    /// trampoline page, used when the replacement is out of near reach.
    const STUB_LEN: usize;
    /// Upper bound of the trampoline length [`Arch::relocate`] produces for
    /// any plan with `patch_len <= FAR_PATCH_LEN`.
    const MAX_TRAMPOLINE_LEN: usize;
    /// Alignment of code placed in trampoline pages.
    const CODE_ALIGN: usize;
    /// How many bytes from the function start `plan` wants when the function
    /// size is unknown.
    const MAX_READ: usize;

    /// A branch to itself (x86-64 `jmp .` = `eb fe`; AArch64 `b .` =
    /// `00 00 00 14`). When a patch cannot be written with one atomic store,
    /// it is stored atomically over the patch head first so that a thread
    /// entering meanwhile waits, then the tail, then the real head. Empty:
    /// no such step (the tail is written first and the head last).
    const SELF_LOOP: &'static [u8] = &[];

    /// Decide which instructions are taken for a patch of `patch_len` bytes.
    /// Refuses (typed) when the function is too short, an instruction cannot
    /// be relocated, or code later in the function (within `func_size`)
    /// branches into the taken bytes.
    fn plan(
        code: &[u8],
        addr: u64,
        func_size: Option<u64>,
        patch_len: usize,
    ) -> Result<Plan, Reason>;

    /// The trampoline code for `plan` placed at address `tramp`: the kept
    /// landing pad, the taken instructions relocated, and a jump back to
    /// `addr + keep + taken`. Its length is at most `MAX_TRAMPOLINE_LEN`.
    fn relocate(code: &[u8], addr: u64, plan: &Plan, tramp: u64) -> Result<Vec<u8>, Reason>;

    /// What [`Arch::relocate`] learns by decoding the taken instructions of
    /// `plan`, as bytes that [`Arch::relocate_known`] turns into the same
    /// trampoline without decoding (the plan store: a process whose hooked
    /// functions were all planned by an earlier one never builds its
    /// decoder's tables). `None`: the architecture keeps nothing (decoding
    /// costs it nothing to set up).
    fn record(_code: &[u8], _addr: u64, _plan: &Plan) -> Option<Vec<u8>> {
        None
    }

    /// [`Arch::relocate`] from a `record` made for the same code at any
    /// address: byte for byte what `relocate` gives. Refuses a record that
    /// does not fit `code` and `plan`.
    fn relocate_known(
        _code: &[u8],
        _addr: u64,
        _plan: &Plan,
        _tramp: u64,
        _record: &[u8],
    ) -> Result<Vec<u8>, Reason> {
        Err(Reason::Unrelocatable {
            at: _addr,
            what: "no plan record for this architecture".into(),
        })
    }

    /// Independent check of a relocation: decode `out` (at `tramp`) and the
    /// original taken instructions and compare every absolute branch and
    /// memory target (targets inside the taken bytes map to their copies).
    /// `Err` carries a human description of the first mismatch.
    fn verify(code: &[u8], addr: u64, plan: &Plan, tramp: u64, out: &[u8]) -> Result<(), String>;

    /// Near patch at `from` jumping to `to`; `None` if `to` is out of reach.
    /// Exactly `NEAR_PATCH_LEN` bytes.
    fn near_patch(from: u64, to: u64) -> Option<Vec<u8>>;

    /// Far patch at `from` jumping to `to` (any distance); `FAR_PATCH_LEN` bytes.
    fn far_patch(from: u64, to: u64) -> Vec<u8>;

    /// Entry stub at `at` jumping to `to` (any distance); `STUB_LEN` bytes.
    fn stub(at: u64, to: u64) -> Vec<u8>;

    /// Bytes that fill a taken area after the patch (never executed in
    /// correct programs; a trap is preferred). `len` may be 0.
    fn filler(len: usize) -> Vec<u8>;

    /// Make freshly written code at `addr..addr+len` visible to instruction
    /// fetch. No-op on x86-64 (coherent); `dc cvau`/`ic ivau` on AArch64.
    /// Must be a no-op when compiled for another host architecture.
    fn flush_icache(addr: u64, len: usize);
}

/// Inside an `impl Arch`: [`Arch::plan`], [`Arch::relocate`] and
/// [`Arch::verify`] forwarded to free functions of the same signatures
/// (each architecture keeps them in its own `plan`/`relocate`/`verify`
/// modules), so the signatures are written once.
macro_rules! forward_pure {
    (plan: $plan:path, relocate: $relocate:path, verify: $verify:path $(,)?) => {
        fn plan(
            code: &[u8],
            addr: u64,
            func_size: Option<u64>,
            patch_len: usize,
        ) -> Result<$crate::arch::Plan, $crate::error::Reason> {
            $plan(code, addr, func_size, patch_len)
        }

        fn relocate(
            code: &[u8],
            addr: u64,
            plan: &$crate::arch::Plan,
            tramp: u64,
        ) -> Result<Vec<u8>, $crate::error::Reason> {
            $relocate(code, addr, plan, tramp)
        }

        fn verify(
            code: &[u8],
            addr: u64,
            plan: &$crate::arch::Plan,
            tramp: u64,
            out: &[u8],
        ) -> Result<(), String> {
            $verify(code, addr, plan, tramp, out)
        }
    };
}
pub(crate) use forward_pure;

/// The host architecture: the single place where `cfg(target_arch)` picks
/// the module that [`crate::install`] uses.
#[cfg(target_arch = "x86_64")]
pub type Host = crate::x86_64::X86_64;
/// The host architecture: the single place where `cfg(target_arch)` picks
/// the module that [`crate::install`] uses.
#[cfg(target_arch = "aarch64")]
pub type Host = crate::aarch64::Aarch64;

/// True when `to` is reachable from `from` by a signed displacement of
/// `reach` bytes (helper shared by both architectures).
pub fn within(from: u64, to: u64, reach: u64) -> bool {
    let d = to.wrapping_sub(from) as i64;
    d >= -(reach as i64) && d < reach as i64
}
