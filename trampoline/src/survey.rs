//! Survey: try to relocate every exported function of an ELF file without
//! executing anything, and check each relocation by re-decoding it.
//!
//! Owns: reading ELF files (x86-64 or AArch64, chosen by `e_machine`),
//! selecting exported `STT_FUNC` symbols of size >= 5, running the pure
//! [`Arch`] functions on their bytes, and counting outcomes, for the near
//! or the far patch form ([`PatchForm`]). Used by the `survey` example and
//! by tests that keep the README figures honest.
//!
//! Must never: execute or map the surveyed code.

use crate::arch::{Arch, Plan, PADDING_READ};
use crate::error::Reason;
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, Sym};
use object::{Endianness, Object, ObjectSection, ObjectSymbol};
use std::collections::BTreeMap;

/// Functions the profiler must be able to hook (issue 2).
pub const REQUIRED: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "free",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "open",
    "open64",
    "openat",
    "creat",
    "close",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "socket",
    "socketpair",
    "accept",
    "accept4",
    "fopen",
    "fclose",
    "fork",
    "system",
    "exit",
    "_exit",
    "kill",
    "pthread_create",
    "sigaction",
    "signal",
    "sigprocmask",
    "pthread_sigmask",
    "dlopen",
    "dlclose",
];

/// Which patch the survey plans for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PatchForm {
    /// `A::NEAR_PATCH_LEN` bytes; trampoline 16 MiB below the function
    /// (what `install` does when near memory is free).
    #[default]
    Near,
    /// `A::FAR_PATCH_LEN` bytes (AArch64: the real 16 or 20); trampoline
    /// 8 GiB below the function, beyond both architectures' near reach
    /// (what `install` falls back to, and what `prepare_far` forces).
    Far,
}

impl PatchForm {
    /// The `patch_len` passed to [`Arch::plan`].
    pub fn patch_len<A: Arch>(self) -> usize {
        match self {
            PatchForm::Near => A::NEAR_PATCH_LEN,
            PatchForm::Far => A::FAR_PATCH_LEN,
        }
    }

    /// Where the survey pretends the trampoline of the function at `addr` lives.
    pub fn trampoline_addr(self, addr: u64) -> u64 {
        let below: u64 = match self {
            PatchForm::Near => 16 << 20,
            PatchForm::Far => 8 << 30,
        };
        (addr & !0xfff).wrapping_sub(below)
    }
}

/// Outcome for one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Planned, relocated and verified: the trampoline length.
    Relocatable { plan: Plan, trampoline_len: usize },
    /// `plan` or `relocate` refused.
    Refused(Reason),
    /// Relocated, but re-decoding found a mismatch (a bug in relocate).
    VerifyFailed(String),
}

/// One surveyed function.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    pub outcome: Outcome,
}

/// All surveyed functions of one file.
#[derive(Debug, Clone)]
pub struct Report {
    pub path: String,
    /// Architecture name (`Arch::NAME`).
    pub arch: &'static str,
    /// The patch form surveyed.
    pub form: PatchForm,
    pub functions: Vec<Function>,
}

impl Report {
    pub fn relocatable(&self) -> usize {
        self.functions
            .iter()
            .filter(|f| matches!(f.outcome, Outcome::Relocatable { .. }))
            .count()
    }

    /// Relocatable functions whose patch covers alignment padding after the
    /// function (the function itself is shorter than the patch).
    pub fn using_padding(&self) -> usize {
        self.functions
            .iter()
            .filter(|f| match f.outcome {
                Outcome::Relocatable { plan, .. } => (plan.keep + plan.taken) as u64 > f.size,
                _ => false,
            })
            .count()
    }

    /// Percentage of relocatable functions (100 for an empty file).
    pub fn percent(&self) -> f64 {
        if self.functions.is_empty() {
            100.0
        } else {
            100.0 * self.relocatable() as f64 / self.functions.len() as f64
        }
    }

    /// Counts of outcomes: "relocatable", "verify failed", "refused: REASON".
    pub fn by_outcome(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for f in &self.functions {
            let k = match &f.outcome {
                Outcome::Relocatable { .. } => "relocatable".to_string(),
                Outcome::Refused(r) => format!("refused: {}", r.key()),
                Outcome::VerifyFailed(_) => "verify failed".to_string(),
            };
            *m.entry(k).or_insert(0) += 1;
        }
        m
    }

    /// The final line, e.g. `relocatable: 2781/2790 (99.68%) /lib/x86_64-linux-gnu/libc.so.6`
    /// (`relocatable with the far patch: ...` for [`PatchForm::Far`]).
    pub fn summary_line(&self) -> String {
        let form = match self.form {
            PatchForm::Near => "",
            PatchForm::Far => " with the far patch",
        };
        format!(
            "relocatable{form}: {}/{} ({:.2}%) {}",
            self.relocatable(),
            self.functions.len(),
            self.percent(),
            self.path
        )
    }

    /// Every symbol named `name` in this file.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Function> + 'a {
        self.functions.iter().filter(move |f| f.name == name)
    }
}

/// Why a file cannot be surveyed.
#[derive(Debug)]
pub enum SurveyError {
    Read(std::io::Error),
    NotElf64(String),
    UnsupportedMachine(u16),
}

impl std::fmt::Display for SurveyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SurveyError::Read(e) => write!(f, "cannot read: {e}"),
            SurveyError::NotElf64(e) => {
                write!(f, "not a 64-bit ELF file ({e}); give a shared library")
            }
            SurveyError::UnsupportedMachine(m) => {
                write!(
                    f,
                    "ELF e_machine {m} is neither x86-64 (62) nor AArch64 (183)"
                )
            }
        }
    }
}

impl std::error::Error for SurveyError {}

/// Survey the ELF file at `path` for the patch `form`.
pub fn survey_file(path: &str, form: PatchForm) -> Result<Report, SurveyError> {
    let data = std::fs::read(path).map_err(SurveyError::Read)?;
    survey_elf(path, &data, form)
}

/// Survey ELF bytes (`path` is only used in the report).
pub fn survey_elf(path: &str, data: &[u8], form: PatchForm) -> Result<Report, SurveyError> {
    let file =
        ElfFile64::<Endianness>::parse(data).map_err(|e| SurveyError::NotElf64(e.to_string()))?;
    let machine = file.elf_header().e_machine(file.endian());
    match machine {
        elf::EM_X86_64 => Ok(survey_with::<crate::x86_64::X86_64>(path, &file, form)),
        elf::EM_AARCH64 => Ok(survey_with::<crate::aarch64::Aarch64>(path, &file, form)),
        m => Err(SurveyError::UnsupportedMachine(m)),
    }
}

/// Plan, relocate and verify one function's bytes (`code` = the whole
/// function) for the patch `form`.
pub fn try_function<A: Arch>(
    code: &[u8],
    addr: u64,
    size: Option<u64>,
    form: PatchForm,
) -> Outcome {
    let plan = match A::plan(code, addr, size, form.patch_len::<A>()) {
        Ok(p) => p,
        Err(r) => return Outcome::Refused(r),
    };
    let tramp = form.trampoline_addr(addr);
    match A::relocate(code, addr, &plan, tramp) {
        Err(r) => Outcome::Refused(r),
        Ok(out) => match A::verify(code, addr, &plan, tramp, &out) {
            Ok(()) if out.len() > A::MAX_TRAMPOLINE_LEN => Outcome::VerifyFailed(format!(
                "trampoline of {} bytes exceeds MAX_TRAMPOLINE_LEN",
                out.len()
            )),
            Ok(()) if !replays::<A>(code, addr, &plan, tramp, &out) => Outcome::VerifyFailed(
                "the plan's record gives another trampoline than decoding".into(),
            ),
            Ok(()) => Outcome::Relocatable {
                plan,
                trampoline_len: out.len(),
            },
            Err(e) => Outcome::VerifyFailed(e),
        },
    }
}

/// Whether the architecture's record of the taken instructions (the plan
/// store's, `known.rs`) gives `out` again at `tramp`, and what decoding
/// gives at another trampoline address (one page further; where a record
/// is kept). True when the architecture keeps none.
fn replays<A: Arch>(code: &[u8], addr: u64, plan: &Plan, tramp: u64, out: &[u8]) -> bool {
    let Some(record) = A::record(code, addr, plan) else {
        return true;
    };
    let other = tramp.wrapping_add(4096);
    A::relocate_known(code, addr, plan, tramp, &record).as_deref() == Ok(out)
        && A::relocate_known(code, addr, plan, other, &record)
            == A::relocate(code, addr, plan, other)
}

fn survey_with<A: Arch>(path: &str, file: &ElfFile64<Endianness>, form: PatchForm) -> Report {
    let endian = file.endian();
    // Every symbol start: the padding used after a too-short function must
    // not reach another symbol.
    let mut starts: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.is_definition() && s.address() != 0)
        .map(|s| s.address())
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let mut functions = Vec::new();
    for sym in file.dynamic_symbols() {
        let raw = sym.elf_symbol();
        if raw.st_type() != elf::STT_FUNC || !sym.is_definition() || sym.size() < 5 {
            continue;
        }
        if !matches!(raw.st_bind(), elf::STB_GLOBAL | elf::STB_WEAK)
            || raw.st_shndx(endian) == elf::SHN_UNDEF
        {
            continue;
        }
        let (addr, size) = (sym.address(), sym.size());
        let name = sym.name().unwrap_or("?").to_string();
        let code = file
            .sections()
            .find(|s| s.address() <= addr && addr < s.address() + s.size())
            .and_then(|s| {
                let d = s.data().ok()?;
                let from = (addr - s.address()) as usize;
                let end = addr + size;
                let next = starts[starts.partition_point(|&a| a < end)..]
                    .first()
                    .copied();
                let pad = next.map_or(PADDING_READ as u64, |n| (n - end).min(PADDING_READ as u64));
                d.get(from..(from + (size + pad) as usize).min(d.len()))
            });
        let outcome = match code {
            Some(code) => try_function::<A>(code, addr, Some(size), form),
            None => Outcome::Refused(Reason::NotMapped { addr }),
        };
        functions.push(Function {
            name,
            addr,
            size,
            outcome,
        });
    }
    Report {
        path: path.to_string(),
        arch: A::NAME,
        form,
        functions,
    }
}
