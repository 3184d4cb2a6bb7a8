//! `--jit`: names for JIT code. The runtimes already describe the code
//! they generate in a perf map (`/tmp/perf-PID.map`) or a jitdump
//! (`/tmp/jit-PID.dump`), which igprof-analyse reads; this module makes
//! them write one and keeps it with the profile.
//!
//! Owns: turning the JVM's map on without a word on its output (its
//! `JNI_CreateJavaVM` is hooked, when libjvm is loaded, to put
//! `-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit` before the
//! program's own options, which `JAVA_TOOL_OPTIONS` would announce on
//! stderr), and copying the process's map and dump next to its profile
//! once the final profile is written (the runtimes write their maps a line
//! at a time, and the JVM at its exit, before the profiler's final dump).
//! node and Python 3.12+ are turned on
//! by the launcher, through `NODE_OPTIONS=--perf-basic-prof-only-functions` and
//! `PYTHONPERFSUPPORT=1` in the program's environment.
//!
//! Must never: change the program's own options (the JVM gets a copy of
//! its option list), copy a file that is not a regular file of this user,
//! or write anywhere but beside the profile.

use core::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use crate::base::options::Options;
use crate::hook::hook_table;
use crate::modules::{Module, StartError};

/// The module in the runtime's registry.
pub const MODULE: Module = Module {
    describe: |_| Some("JIT maps (node, the JVM, Python 3.12+)".into()),
    start,
    objects_changed: Some(hook_jvm),
    after_final_dump: Some(copy_maps),
    ..Module::new("--jit", |o| o.jit)
};

fn start(_: &Options) -> Result<(), StartError> {
    hook_jvm();
    Ok(())
}

hook_table! {
    /// The JVM's entry point, hooked when libjvm is loaded.
    enum Func {
        CreateJavaVm => fn create_java_vm(vm: *mut *mut c_void, env: *mut *mut c_void, args: *mut InitArgs) -> c_int;
    }
}

/// JNI's `JavaVMOption`.
#[repr(C)]
#[derive(Clone, Copy)]
struct VmOption {
    option_string: *const c_char,
    extra_info: *mut c_void,
}

/// JNI's `JavaVMInitArgs`.
#[repr(C)]
struct InitArgs {
    version: i32,
    n_options: i32,
    options: *mut VmOption,
    ignore_unrecognized: u8,
}

/// What the JVM is given before the program's own options (which win
/// where they say otherwise).
const JVM_OPTIONS: [&core::ffi::CStr; 2] =
    [c"-XX:+UnlockDiagnosticVMOptions", c"-XX:+DumpPerfMapAtExit"];

/// Hooks `JNI_CreateJavaVM` once, when an object defines it.
fn hook_jvm() {
    if CHAIN.is_set(Func::CreateJavaVm as usize) {
        return;
    }
    let Ok(sym) = trampoline::find_function("JNI_CreateJavaVM", None) else {
        return;
    };
    match crate::hook::hook_symbol(&sym, create_java_vm_hook as *const (), |c| {
        CHAIN.set(Func::CreateJavaVm as usize, c)
    }) {
        Ok(()) => crate::igprof_debug!("--jit: the JVM will write its perf map at exit"),
        Err(e) => crate::igprof_log!(
            "--jit: cannot hook JNI_CreateJavaVM ({e}): the JVM writes no perf map unless run with -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit"
        ),
    }
}

extern "C" fn create_java_vm_hook(
    vm: *mut *mut c_void,
    env: *mut *mut c_void,
    args: *mut InitArgs,
) -> c_int {
    if args.is_null() {
        return chain::create_java_vm(vm, env, args);
    }
    // SAFETY: the JVM's caller passes a valid JavaVMInitArgs.
    let a = unsafe { &*args };
    let own: &[VmOption] = if a.options.is_null() || a.n_options <= 0 {
        &[]
    } else {
        // SAFETY: `n_options` options at `options`, as JNI defines them.
        unsafe { core::slice::from_raw_parts(a.options, a.n_options as usize) }
    };
    let mut options: Vec<VmOption> = JVM_OPTIONS
        .iter()
        .map(|o| VmOption {
            option_string: o.as_ptr(),
            extra_info: core::ptr::null_mut(),
        })
        .collect();
    options.extend_from_slice(own);
    let mut copy = InitArgs {
        version: a.version,
        n_options: options.len() as i32,
        options: options.as_mut_ptr(),
        ignore_unrecognized: a.ignore_unrecognized,
    };
    let r = chain::create_java_vm(vm, env, &mut copy);
    // The JVM may keep pointers into the list for its life.
    core::mem::forget(options);
    r
}

/// The process's JIT files in /tmp, as the runtimes name them.
fn jit_files(pid: i32) -> [PathBuf; 2] {
    [
        PathBuf::from(format!("/tmp/perf-{pid}.map")),
        PathBuf::from(format!("/tmp/jit-{pid}.dump")),
    ]
}

/// After the final dump: copies the process's perf map and jitdump beside
/// `profile` (where igprof-analyse looks first), so that a profile taken
/// elsewhere keeps its names.
fn copy_maps(profile: &str) {
    let dir = match Path::new(profile).parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dir == Path::new("/tmp") {
        return;
    }
    for src in jit_files(crate::sys::getpid()) {
        let Ok(m) = std::fs::symlink_metadata(&src) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        if !m.is_file() || m.uid() != safefs::euid() {
            crate::igprof_log!(
                "--jit: {} is not a regular file of this user: not copied",
                src.display()
            );
            continue;
        }
        let dest = dir.join(src.file_name().unwrap());
        match copy_file(&src, &dest) {
            Ok(n) => crate::igprof_debug!(
                "--jit: copied {} ({n} bytes) to {}",
                src.display(),
                dest.display()
            ),
            Err(e) => crate::igprof_log!(
                "--jit: could not copy {} to {}: {e}",
                src.display(),
                dest.display()
            ),
        }
    }
}

/// Copies `src` over `dest` through an exclusive temporary beside it.
fn copy_file(src: &Path, dest: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut from = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)?;
    let mut t = safefs::Temp::beside(dest, 0o644)?;
    let _fsize = crate::base::limits::FsizeGuard::block();
    match std::io::copy(&mut from, &mut t.file) {
        Ok(n) => t.commit(dest).map(|_| n),
        Err(e) => {
            t.discard();
            Err(e)
        }
    }
}
