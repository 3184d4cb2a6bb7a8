//! What `igprof --attach` learns about a running process before touching
//! it: whether it can be attached to at all (one refusal line each: no
//! such process, another machine's program, a static one, one already
//! traced, a libc the library cannot load into), and where its functions
//! are (an object's load address from `/proc/PID/maps`, a symbol's
//! value from the object's file, read through `/proc/PID/root` so that a
//! process in a container is read from its own files).
//!
//! What it must never do: write anything, or stop the process.

use object::read::elf::ElfFile64;
use object::{Object, ObjectSymbol};
use std::path::{Path, PathBuf};

/// One object mapped in the process.
#[derive(Debug, Clone)]
pub struct Mapped {
    /// Its path as the process sees it.
    pub path: String,
    /// Where its file offset 0 is mapped.
    pub base: u64,
}

/// The objects mapped in process `pid` (each once, by the mapping of its
/// file offset 0).
pub fn objects(pid: i32) -> Result<Vec<Mapped>, String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("cannot read process {pid}'s memory map: {e}"))?;
    let mut out: Vec<Mapped> = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(path) = crate::sys::maps_line_path(line) else {
            continue;
        };
        if f[2] != "00000000" {
            continue;
        }
        let path = path.to_string();
        if out.iter().any(|m| m.path == path) {
            continue;
        }
        let Some(base) = f[0]
            .split('-')
            .next()
            .and_then(|a| u64::from_str_radix(a, 16).ok())
        else {
            continue;
        };
        out.push(Mapped { path, base });
    }
    Ok(out)
}

/// The file of `path` as process `pid` sees it.
pub fn in_root(pid: i32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// The value of each of `names` among the dynamic symbols of the ELF
/// file `file` (None for a name it does not define).
pub fn symbols(file: &Path, names: &[&str]) -> Result<Vec<Option<u64>>, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let elf = ElfFile64::<object::Endianness>::parse(&bytes[..])
        .map_err(|e| format!("cannot read {} as a 64-bit ELF file: {e}", file.display()))?;
    let mut out = vec![None; names.len()];
    for s in elf.dynamic_symbols() {
        if s.is_undefined() {
            continue;
        }
        if let Some(i) = s
            .name()
            .ok()
            .and_then(|n| names.iter().position(|w| *w == n))
        {
            out[i].get_or_insert(s.address());
        }
    }
    Ok(out)
}

/// The process's C library among `objs`.
pub fn libc(objs: &[Mapped]) -> Option<&Mapped> {
    objs.iter().find(|m| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        name == "libc.so.6" || (name.starts_with("libc-2.") && name.ends_with(".so"))
    })
}

/// A function that loads a library in the process, `dlopen(path, mode)`
/// shaped: libc's `dlopen` (glibc 2.34 on), libdl's when loaded, else
/// libc's `__libc_dlopen_mode` (glibc before 2.34).
pub fn dlopen_in(pid: i32, objs: &[Mapped]) -> Result<u64, String> {
    let c = libc(objs).ok_or_else(|| {
        format!("process {pid} has no glibc libc.so.6 mapped: igprof --attach needs a program linked with glibc")
    })?;
    let s = symbols(&in_root(pid, &c.path), &["dlopen", "__libc_dlopen_mode"])?;
    if let Some(v) = s[0] {
        return Ok(c.base + v);
    }
    if let Some(dl) = objs
        .iter()
        .find(|m| m.path.rsplit('/').next() == Some("libdl.so.2"))
    {
        if let Some(v) = symbols(&in_root(pid, &dl.path), &["dlopen"])?[0] {
            return Ok(dl.base + v);
        }
    }
    s[1].map(|v| c.base + v).ok_or_else(|| {
        format!(
            "{} defines no dlopen: cannot load the profiler into process {pid}",
            c.path
        )
    })
}

/// The value of line `name` (with its colon) of a `/proc/.../status` text.
pub fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
}

/// Reasons found before tracing why process `pid` cannot be attached
/// to; `lib` is libigprof.so.
pub fn check(pid: i32, lib: &[u8]) -> Result<(), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("no process {pid}"),
            _ => format!("cannot read process {pid}'s status ({e})"),
        })?;
    let tracer = status_field(&status, "TracerPid:").unwrap_or_default();
    if !tracer.is_empty() && tracer != "0" {
        return Err(format!(
            "process {pid} is already traced by process {tracer} (a debugger, strace?): detach that first"
        ));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "cannot attach to process {pid}: it is another user's (run igprof --attach as that user or root)"
        ),
        Some(libc::ENOENT) => format!("process {pid} has no executable (a kernel thread or a zombie)"),
        _ => format!("cannot read process {pid}'s executable: {e}"),
    })?;
    let exe_s = exe.to_string_lossy().into_owned();
    let name = exe_s.rsplit('/').next().unwrap_or("");
    if name.starts_with("qemu-") {
        return Err(format!(
            "process {pid} is {exe_s}, running a program of another machine: igprof --attach cannot load the profiler into it (start it under igprof instead)"
        ));
    }
    let exe_file = format!("/proc/{pid}/exe");
    match crate::elf::linkage(exe_file.as_bytes()) {
        crate::elf::Linkage::Static => {
            return Err(format!(
                "process {pid} ({exe_s}) is statically linked: it has no dynamic loader to load the profiler with"
            ))
        }
        crate::elf::Linkage::Dynamic(Some(m)) if m.name() != std::env::consts::ARCH.as_bytes() => {
            return Err(format!(
                "process {pid} ({exe_s}) is {} program: igprof --attach loads only a profiler of its own machine",
                String::from_utf8_lossy(m.what()),
            ))
        }
        _ => {}
    }
    let objs = objects(pid)?;
    if let Some(c) = libc(&objs) {
        let file = in_root(pid, &c.path);
        if let Some(m) = crate::glibc::missing(Path::new(crate::sys::os(lib)), &file) {
            return Err(format!(
                "process {pid}'s C library ({}) is glibc {}; libigprof.so needs {}",
                c.path, m.found, m.needed
            ));
        }
    }
    Ok(())
}
