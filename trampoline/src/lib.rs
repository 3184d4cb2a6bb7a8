//! Install a hook on a function by patching its first instructions.
//!
//! See DESIGN.md ("Trampolines"). This crate knows nothing about profiling.
