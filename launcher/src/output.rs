//! Whether the run can write its profile where -o says, checked before the
//! program runs.
//!
//! What it owns: the -o path's directory (it exists, the user may create
//! files in it), a directory named as the file, and what is left to the
//! run (a device or FIFO, a `%p` in the directory).
//!
//! What it must never do: create or open anything (the library writes the
//! profile, as the user the program runs as).

use crate::refusal::Refusal;
use crate::sys::{accessible, stat};

/// Whether the run can write its profile at `path` (absolute): an existing
/// device or FIFO, or a file in an existing directory the user may create
/// files in. Checked before the program runs, so that a mistyped -o does
/// not cost a whole run (the library would then write the profile in the
/// temporary directory instead). A `%p` in the directory part is left to
/// the run.
pub fn output_place(path: &[u8]) -> Result<(), Refusal> {
    if let Some(m) = stat(path) {
        if m.is_dir() {
            return Err(Refusal::OutputIsDir(path.to_vec()));
        }
        if !m.is_file() {
            return Ok(());
        }
    }
    let dir = match path.iter().rposition(|&b| b == b'/') {
        Some(0) | None => b"/".to_vec(),
        Some(i) => path[..i].to_vec(),
    };
    if dir.windows(2).any(|w| w == b"%p") {
        return Ok(());
    }
    if !stat(&dir).is_some_and(|m| m.is_dir()) {
        return Err(Refusal::NoOutputDir(path.to_vec(), dir));
    }
    if !accessible(&dir, libc::W_OK | libc::X_OK) {
        return Err(Refusal::OutputDirNotWritable(path.to_vec(), dir));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn an_output_the_run_cannot_write_is_refused() {
        let d = std::env::temp_dir().join(format!("igprof-launcher-out-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let path = |p: &str| d.join(p).into_os_string().into_vec();
        assert_eq!(output_place(&path("p.gz")), Ok(()));
        assert_eq!(output_place(b"/dev/null"), Ok(()));
        assert_eq!(output_place(&path("x%p/p.gz")), Ok(()), "left to the run");
        let msg = |r: Result<(), Refusal>| String::from_utf8(r.unwrap_err().message()).unwrap();
        assert_eq!(
            msg(output_place(&path("no/p.gz"))),
            format!(
                "-o {0}/no/p.gz: no directory {0}/no (create it first, or give another path)",
                d.display()
            )
        );
        let dir = d.clone().into_os_string().into_vec();
        assert_eq!(
            msg(output_place(&dir)),
            format!(
                "-o {0}: is a directory (give a file name in it, e.g. {0}/p.gz)",
                d.display()
            )
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
