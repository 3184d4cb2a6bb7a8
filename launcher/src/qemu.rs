//! A program of another architecture (AArch64 on x86-64, or the reverse),
//! run under qemu-user with the library built for its machine.
//!
//! What it owns: finding `qemu-<arch>` in PATH, the guest's library root
//! (`QEMU_LD_PREFIX`, else `/usr/<arch>-linux-gnu`), the library built for
//! the program's machine (`IGPROF_LIB_AARCH64` / `IGPROF_LIB_X86_64`, else
//! `<arch>/libigprof.so` next to this program, else the build tree's
//! `target/<arch>-unknown-linux-gnu/release`), and the exec of qemu with
//! the guest's `LD_PRELOAD` passed through its `-E`.
//!
//! What it must never do: leave `LD_PRELOAD` set for qemu itself (the
//! host's loader would preload the guest's library into qemu), or start a
//! process before the exec.

use std::os::unix::ffi::OsStrExt;

use crate::elf::Machine;
use crate::exec::exec;
use crate::path::{absolute, build_trees, find_in_path, here};
use crate::refusal::Refusal;
use crate::sanitizers;
use crate::sys::{env_set, is_file, os, stat};

/// Execs qemu-user for `machine` running `resolved` (with `args`) under
/// the library built for it, with `IGPROF=igprof` and the sanitizer
/// `runtimes` the program needs first; returns only if it could not.
pub fn launch(
    machine: Machine,
    resolved: Vec<u8>,
    args: &[&[u8]],
    igprof: &[u8],
    runtimes: &[Vec<u8>],
    user_preload: Option<&[u8]>,
    pwd: &mut dyn FnMut() -> Vec<u8>,
) -> Result<libc::c_int, Refusal> {
    let target_dir = env_set("CARGO_TARGET_DIR");
    let pid = std::process::id().to_string();
    let arch = machine.name();
    let triple_lib = [arch, b"-unknown-linux-gnu/release/libigprof.so"].concat();
    let xlib = env_set(machine.lib_var()).or_else(|| {
        let here = here();
        let mut candidates = Vec::with_capacity(4);
        if let Some(h) = &here {
            candidates.push([h, &b"/"[..], arch, b"/libigprof.so"].concat());
        }
        if let Some(t) = &target_dir {
            candidates.push([t, &b"/"[..], &triple_lib].concat());
        }
        if let Some(h) = &here {
            for t in build_trees(h) {
                candidates.push([&t, &b"/"[..], &triple_lib].concat());
            }
        }
        candidates.into_iter().find(|c| is_file(c))
    });
    let qemu_name = [b"qemu-", arch].concat();
    let qemu = find_in_path(
        &qemu_name,
        std::env::var_os("PATH").as_ref().map(|p| p.as_bytes()),
        pwd,
    );
    let root =
        env_set("QEMU_LD_PREFIX").unwrap_or_else(|| [b"/usr/", arch, b"-linux-gnu"].concat());
    let Some(qemu) = qemu else {
        return Err(Refusal::NoQemu {
            prog: resolved,
            machine,
        });
    };
    if !stat(&root).is_some_and(|m| m.is_dir()) {
        return Err(Refusal::NoGuestRoot {
            prog: resolved,
            machine,
            root,
        });
    }
    let xlib = match xlib {
        Some(x) if is_file(&x) => absolute(x, pwd),
        _ => {
            return Err(Refusal::NoGuestLib {
                prog: resolved,
                machine,
            })
        }
    };
    let guest_preload = [
        &b"LD_PRELOAD="[..],
        &sanitizers::preload(runtimes, &xlib, user_preload),
    ]
    .concat();
    std::env::set_var("IGPROF", os(igprof));
    std::env::set_var("IGPROF_ROOT_PID", &pid);
    // The library then starts no watcher thread in fork children,
    // which qemu-user cannot give a thread (igprof-rs process::after_fork_child).
    std::env::set_var("IGPROF_QEMU_USER", "1");
    std::env::remove_var("LD_PRELOAD");
    let mut argv: Vec<&[u8]> = vec![&qemu, b"-L", &root, b"-E", &guest_preload, &resolved];
    argv.extend(args);
    Ok(exec(&qemu, &argv, pwd))
}
