//! Finding the program and making paths absolute, as bash did for the
//! shell launcher.
//!
//! What it owns: the PATH search of bash's `type -P` ([`find_in_path`],
//! with bash's default PATH when it is unset), the current directory as
//! bash's `$PWD` ([`bash_pwd`]), paths made absolute against it
//! ([`absolute`], [`full_pathname`]), and where this program is: its
//! directory ([`here`]) and the build trees it may be in ([`build_trees`]).
//!
//! What it must never do: look at a file's contents or decide whether it
//! may be run (that is `main`'s, with `secure` and `elf`), or change the
//! current directory.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;

use crate::sys::{executable, stat};

/// PATH when it is unset: bash's default, which the shell launcher used.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin:.";

/// The current directory as bash's `$PWD` at start-up: the inherited PWD
/// when it is absolute and names this directory, else getcwd.
pub fn bash_pwd() -> Vec<u8> {
    if let Some(p) = std::env::var_os("PWD") {
        if p.as_bytes().starts_with(b"/") {
            if let (Ok(a), Ok(b)) = (std::fs::metadata(&p), std::fs::metadata(".")) {
                if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                    return p.into_vec();
                }
            }
        }
    }
    std::env::current_dir()
        .map(|d| d.into_os_string().into_vec())
        .unwrap_or_default()
}

/// `p` made absolute against `pwd` (bytes concatenated, as the shell did).
pub fn absolute(p: Vec<u8>, pwd: &mut dyn FnMut() -> Vec<u8>) -> Vec<u8> {
    if p.starts_with(b"/") {
        p
    } else {
        [&pwd()[..], b"/", &p].concat()
    }
}

/// `file` made absolute as bash's full_pathname (sh_makepath with
/// MP_DOCWD|MP_RMDOT): `pwd`, a '/' unless it ends with one, `file` without
/// one leading "./".
pub fn full_pathname(file: &[u8], pwd: &mut dyn FnMut() -> Vec<u8>) -> Vec<u8> {
    if file.starts_with(b"/") {
        return file.to_vec();
    }
    let mut full = pwd();
    if !full.ends_with(b"/") {
        full.push(b'/');
    }
    full.extend_from_slice(file.strip_prefix(b"./").unwrap_or(file));
    full
}

/// The file bash's `type -P name` names: the first executable non-directory
/// `dir/name` for the directories of `path` (an empty one is "."), else the
/// first existing `dir/name` if that is not a directory (the caller then
/// says "not executable"). An empty PATH: `name` in the current directory
/// if it is executable.
pub fn find_in_path(
    name: &[u8],
    path: Option<&[u8]>,
    pwd: &mut dyn FnMut() -> Vec<u8>,
) -> Option<Vec<u8>> {
    let path = path.unwrap_or(DEFAULT_PATH);
    if path.is_empty() {
        let found = stat(name).is_some_and(|m| !m.is_dir()) && executable(name);
        return found.then(|| full_pathname(name, pwd));
    }
    let mut first: Option<(Vec<u8>, bool)> = None;
    for dir in path.split(|&b| b == b':') {
        let dir = if dir.is_empty() { &b"."[..] } else { dir };
        let sep: &[u8] = if dir.ends_with(b"/") { b"" } else { b"/" };
        let full = [dir, sep, name].concat();
        let Some(m) = stat(&full) else { continue };
        if !m.is_dir() && executable(&full) {
            return Some(full);
        }
        if first.is_none() {
            first = Some((full, m.is_dir()));
        }
    }
    first.and_then(|(f, dir)| (!dir).then_some(f))
}

/// This program's directory (the real one: /proc/self/exe), where the
/// library is looked for first.
pub fn here() -> Option<Vec<u8>> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.as_os_str().as_bytes().to_vec())
}

/// The cargo target directories a launcher in directory `here` (a real
/// path: [`here`]) may be built in: its parent (`target/release/igprof`,
/// `target/debug/igprof`) and grandparent (`target/<triple>/release/igprof`,
/// the static build), without `..` (the path becomes the program's
/// LD_PRELOAD).
pub fn build_trees(here: &[u8]) -> Vec<Vec<u8>> {
    let up = |p: &[u8]| {
        let parent = &p[..p.iter().rposition(|&b| b == b'/')?];
        (!parent.is_empty()).then(|| parent.to_vec())
    };
    let parent = up(here);
    let grandparent = parent.as_deref().and_then(up);
    [parent, grandparent].into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn build_trees_are_the_parent_and_grandparent() {
        let t = |h: &str| -> Vec<String> {
            build_trees(h.as_bytes())
                .into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect()
        };
        assert_eq!(
            t("/w/target/x86_64-unknown-linux-musl/release"),
            ["/w/target/x86_64-unknown-linux-musl", "/w/target"]
        );
        assert_eq!(t("/w/release"), ["/w"]);
        assert!(t("/bin").is_empty());
    }

    #[test]
    fn path_lookup_is_bash_type_p() {
        let d = std::env::temp_dir().join(format!("igprof-launcher-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["a", "b", "c/foo"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("a/foo"), "#!/bin/sh\n").unwrap();
        std::fs::copy(d.join("a/foo"), d.join("b/foo")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("a/foo"), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(d.join("b/foo"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = |s: &str| d.join(s).into_os_string().into_vec();
        let find = |path: &[u8]| {
            find_in_path(b"foo", Some(path), &mut || b"/nowhere".to_vec())
                .map(|p| String::from_utf8(p).unwrap())
        };
        let s = |v: Vec<u8>| String::from_utf8(v).unwrap();
        let ab = [dir("a"), dir("b")].join(&b':');
        assert_eq!(find(&ab), Some(s(dir("b/foo"))), "executable first");
        assert_eq!(
            find(&dir("a")),
            Some(s(dir("a/foo"))),
            "else the first file"
        );
        let ca = [dir("c"), dir("a")].join(&b':');
        assert_eq!(find(&ca), None, "unless it is a directory");
        let slash = [dir("b"), b"/".to_vec()].concat();
        assert_eq!(find(&slash), Some(s(dir("b/foo"))));
        let slashes = [dir("b"), b"//".to_vec()].concat();
        assert_eq!(find(&slashes), Some(s(dir("b//foo"))));
        assert_eq!(find_in_path(b"", Some(&ab), &mut Vec::new), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
