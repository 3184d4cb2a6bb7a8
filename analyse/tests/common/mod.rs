//! What the igprof-analyse end-to-end tests share: a temporary copy of
//! IgProf's own dumps (fixtures/igprof-dumps) to run in, and snapshots.
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/igprof-dumps");
pub const CPU: &str = "igprof-pp-cpu_split.gz";
pub const MEM: &str = "igprof-mp-alloc_churn.gz";
pub const FD: &str = "igprof-fd-fd_churn.gz";

/// Makes `path` of this machine again under `root` as the loader finds it:
/// each symlink met on the way is made again inside `root` (same target,
/// which igprof-analyse resolves inside the root), the file is copied.
fn mirror(root: &Path, path: &Path) {
    use std::collections::VecDeque;
    use std::path::Component;
    let mut todo: VecDeque<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .collect();
    let mut cur = PathBuf::from("/");
    for _ in 0..256 {
        let Some(name) = todo.pop_front() else { return };
        let here = cur.join(&name);
        let inside = root.join(here.strip_prefix("/").unwrap());
        let meta = std::fs::symlink_metadata(&here).unwrap();
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&here).unwrap();
            if std::fs::symlink_metadata(&inside).is_err() {
                std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(&target, &inside).unwrap();
            }
            if target.is_absolute() {
                cur = PathBuf::from("/");
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => todo.push_front(n.to_os_string()),
                    Component::ParentDir => todo.push_front("..".into()),
                    _ => {}
                }
            }
        } else if name == ".." {
            cur.pop();
        } else if meta.is_dir() {
            std::fs::create_dir_all(&inside).unwrap();
            cur = here;
        } else {
            std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
            std::fs::copy(&here, &inside).unwrap();
            return;
        }
    }
    panic!("{}: too many symlinks", path.display());
}

/// A temporary copy of the fixtures, the working directory of every run.
pub struct Dir(tempfile::TempDir);

impl Dir {
    pub fn new() -> Dir {
        // The fixture reports name libc functions from Debian 12's libc6-dbg.
        let libc_debug = "/usr/lib/debug/.build-id/93/ac61ec5a8eb1396f9fbd350e3169a558528a40.debug";
        assert!(
            Path::new(libc_debug).exists(),
            "{libc_debug} is missing: install libc6-dbg (scripts/setup does) for the libc names of the fixtures"
        );
        let d = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(FIXTURES).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
        Dir(d)
    }
    pub fn path(&self) -> &Path {
        self.0.path()
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
    /// `args` after those that make igprof-analyse read object files only
    /// from a root here that holds the host objects the fixtures name (libc
    /// and the loader, as this machine lays them out, symlinks included),
    /// never from where the fixtures' other paths happen to lead on this
    /// machine (the fixtures' IgProf library path, say).
    pub fn isolated(&self, args: &[&str]) -> Vec<String> {
        let root = self.path().join("sysroot");
        if !root.exists() {
            for p in [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2",
            ] {
                mirror(&root, Path::new(p));
            }
        }
        let root = root.to_str().unwrap();
        ["--sysroot", root, "--sysroot-only"]
            .iter()
            .chain(args)
            .map(|a| a.to_string())
            .collect()
    }

    /// The test file's `ok` (a successful run's stdout), run [`Dir::isolated`].
    pub fn ok_isolated(&self, args: &[&str]) -> String {
        let all = self.isolated(args);
        self.ok(&all.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Runs igprof-analyse here: (stdout, stderr, success).
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> (String, String, bool) {
        let out = Command::new(env!("CARGO_BIN_EXE_igprof-analyse"))
            .args(args)
            .current_dir(self.path())
            .output()
            .unwrap();
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
            out.status.success(),
        )
    }
}
