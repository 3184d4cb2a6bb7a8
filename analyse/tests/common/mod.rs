//! What the igprof-analyse end-to-end tests share: a temporary copy of
//! IgProf's own dumps (fixtures/igprof-dumps) to run in, and snapshots.
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/igprof-dumps");
pub const CPU: &str = "igprof-pp-cpu_split.gz";
pub const MEM: &str = "igprof-mp-alloc_churn.gz";
pub const FD: &str = "igprof-fd-fd_churn.gz";

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
    /// Runs igprof-analyse here: (stdout, stderr, success).
    pub fn run(&self, args: &[&str]) -> (String, String, bool) {
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
