//! Typed errors of the crate: why a function cannot be hooked
//! ([`Reason`], wrapped with the function's name and address in
//! [`HookError`]) and why a symbol cannot be found ([`LookupError`]).
//!
//! Owns: error types and their one-line messages. Must never: carry bare
//! integers or booleans as reasons.

use std::fmt;

/// Why a function cannot be hooked (or a hook cannot be removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The function (or the code before a `ret`/unconditional jump) is
    /// shorter than the patch.
    TooShort { need: usize, have: usize },
    /// Code later in the function at `at` branches to `target`, inside the
    /// bytes the patch would overwrite.
    BranchIntoPatchedBytes { at: u64, target: u64 },
    /// The instruction at `at` cannot be moved to the trampoline.
    Unrelocatable { at: u64, what: String },
    /// The bytes at `at` do not decode as an instruction.
    Undecodable { at: u64 },
    /// A relocated operand at `at` would need to reach `target` from the
    /// trampoline, which is too far for its encoding.
    OutOfReach { at: u64, target: u64 },
    /// No free address range within `reach` bytes of `near` for a trampoline.
    NoMemoryInReach { near: u64, reach: u64 },
    /// `mmap`/`mprotect` failed with this errno.
    Protect(i32),
    /// The address is not inside a mapped executable region.
    NotMapped { addr: u64 },
    /// On uninstall: the patched bytes were changed by someone else since
    /// install (e.g. another hook installed on top); nothing was restored.
    PatchChanged { at: u64 },
    /// A stopped thread's next instruction is at `pc`, inside the bytes
    /// the patch would overwrite (after its first): the patch would leave
    /// it half an instruction (a caller that stops threads says which).
    ThreadInside { pc: u64 },
    /// The process's other threads were let run during this attach (it
    /// waited for a lock one of them held): no code may be written now.
    OthersRunning,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::TooShort { need, have } => {
                write!(f, "too short: the patch needs {need} bytes, only {have} can be taken")
            }
            Reason::BranchIntoPatchedBytes { at, target } => write!(
                f,
                "branch at {at:#x} jumps to {target:#x}, inside the bytes the patch would overwrite"
            ),
            Reason::Unrelocatable { at, what } => {
                write!(f, "instruction at {at:#x} cannot be relocated: {what}")
            }
            Reason::Undecodable { at } => write!(f, "undecodable instruction at {at:#x}"),
            Reason::OutOfReach { at, target } => write!(
                f,
                "instruction at {at:#x} would have to reach {target:#x} from the trampoline, out of range"
            ),
            Reason::NoMemoryInReach { near, reach } => write!(
                f,
                "no free memory within {reach:#x} bytes of {near:#x} for a trampoline"
            ),
            Reason::Protect(errno) => write!(
                f,
                "changing memory protection failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Reason::NotMapped { addr } => write!(f, "{addr:#x} is not in mapped executable memory"),
            Reason::PatchChanged { at } => write!(
                f,
                "the patch at {at:#x} was overwritten since install (another hook on top?); not restored"
            ),
            Reason::ThreadInside { pc } => write!(
                f,
                "a stopped thread's next instruction ({pc:#x}) is inside the bytes the patch would overwrite"
            ),
            Reason::OthersRunning => write!(
                f,
                "the other threads were running (the attach waited for a lock one of them held)"
            ),
        }
    }
}

impl Reason {
    /// Short stable key for grouping refusals (used by the survey), e.g.
    /// "too short", "unrelocatable: loop to outside".
    pub fn key(&self) -> String {
        match self {
            Reason::TooShort { .. } => "too short".into(),
            Reason::BranchIntoPatchedBytes { .. } => "branch into patched bytes".into(),
            Reason::Unrelocatable { what, .. } => format!("unrelocatable: {what}"),
            Reason::Undecodable { .. } => "undecodable".into(),
            Reason::OutOfReach { .. } => "out of reach".into(),
            Reason::NoMemoryInReach { .. } => "no memory in reach".into(),
            Reason::Protect(_) => "protection change failed".into(),
            Reason::NotMapped { .. } => "not mapped".into(),
            Reason::PatchChanged { .. } => "patch changed".into(),
            Reason::ThreadInside { .. } => "thread inside".into(),
            Reason::OthersRunning => "others running".into(),
        }
    }
}

/// A function could not be hooked: which one and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookError {
    /// Symbol name when known (from [`crate::find_function`]), else empty.
    pub function: String,
    /// Address of the function.
    pub addr: u64,
    pub reason: Reason,
}

impl fmt::Display for HookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.function.is_empty() {
            write!(
                f,
                "cannot hook function at {:#x}: {}",
                self.addr, self.reason
            )
        } else {
            write!(
                f,
                "cannot hook {} at {:#x}: {}",
                self.function, self.addr, self.reason
            )
        }
    }
}

impl std::error::Error for HookError {}

/// A symbol could not be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// The named library is not loaded in this process.
    LibraryNotLoaded { lib: String },
    /// No definition of the symbol (with this version, if given).
    NotFound {
        name: String,
        version: Option<String>,
        lib: Option<String>,
    },
    /// The name contains a NUL byte.
    BadName { name: String },
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::LibraryNotLoaded { lib } => {
                write!(
                    f,
                    "library {lib} is not loaded in this process (dlopen it first)"
                )
            }
            LookupError::NotFound { name, version, lib } => {
                write!(f, "symbol {name}")?;
                if let Some(v) = version {
                    write!(f, "@{v}")?;
                }
                match lib {
                    Some(l) => write!(f, " not found in {l}"),
                    None => write!(f, " not found in any loaded object"),
                }
            }
            LookupError::BadName { name } => write!(f, "symbol name {name:?} contains a NUL byte"),
        }
    }
}

impl std::error::Error for LookupError {}
