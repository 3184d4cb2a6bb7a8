//! What a program file says about being run with libigprof.so preloaded,
//! asked before it is exec'd: by the launcher, which refuses to run such a
//! program, and by libigprof.so's exec hook, which says so in one line when
//! a profiled program execs one (the profile cannot follow it).
//!
//! What it owns: reading the file's ELF headers ([`elf`]: whether a loader
//! runs it, for which machine) and its mode and attributes ([`secure`]:
//! whether the exec would put it in the loader's secure-execution mode,
//! which ignores LD_PRELOAD).
//!
//! What it must never do: change the file or any id, map or run the file,
//! or trust its contents.

pub mod elf;
pub mod secure;
