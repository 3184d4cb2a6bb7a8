//! Why a dump failed, said as the user reads it: what could not be done,
//! the system's reason and the limit behind it where there is one.
//!
//! Owns [`DumpError`] and the display of errno values in it.
//!
//! Must never: allocate to display (errors are said from the final dump,
//! which may be short of memory).

use igprof_format::write::WriteError;

/// Why a dump failed.
#[derive(Debug)]
pub enum DumpError {
    NotProfiling,
    Busy,
    /// A snapshot asked for once the final profile's dump had begun.
    Ending,
    Create {
        path: String,
        errno: i32,
    },
    /// The program's address-space limit leaves no room for the dump.
    NoMemory {
        needed: usize,
        limit: u64,
    },
    /// A file that must be written in place was not safe to write.
    Refused {
        path: String,
        why: safefs::Refusal,
    },
    Write {
        path: String,
        err: WriteError,
    },
    Rename {
        path: String,
        errno: i32,
    },
}

impl DumpError {
    /// Whether the dump found no descriptor left for its file (the
    /// program holds every one its limits allow): a process with one
    /// more, such as the keeper, can still write it.
    pub fn out_of_descriptors(&self) -> bool {
        matches!(
            self,
            DumpError::Create { errno, .. } if *errno == libc::EMFILE || *errno == libc::ENFILE
        )
    }
}

impl core::fmt::Display for DumpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DumpError::NotProfiling => write!(f, "profiling is not active in this process"),
            DumpError::Busy => write!(f, "another dump is being written"),
            DumpError::Ending => write!(f, "the process is ending: its final profile is written"),
            DumpError::Create { path, errno } => {
                write!(f, "cannot create {path}: {}", OsError(*errno))
            }
            DumpError::NoMemory { needed, limit } => write!(
                f,
                "the program's address-space limit (RLIMIT_AS, {} MiB) leaves no room for the dump (about {} MiB)",
                limit >> 20,
                needed >> 20
            ),
            DumpError::Refused { path, why } => write!(f, "not writing {path}: {why}"),
            DumpError::Write {
                path,
                err: WriteError::Io { errno },
            } => write!(f, "writing {path}: {}", OsError(*errno)),
            DumpError::Write { path, err } => write!(f, "writing {path}: {err}"),
            DumpError::Rename { path, errno } => write!(
                f,
                "cannot rename the finished dump to {path}: {}",
                OsError(*errno)
            ),
        }
    }
}

/// A system error's text, with the limit of the program's that caused it
/// where that is the usual reason.
struct OsError(i32);

impl core::fmt::Display for OsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))?;
        match self.0 {
            libc::EFBIG => write!(f, " (the program's file size limit, RLIMIT_FSIZE)"),
            libc::EMFILE => write!(
                f,
                " (the program holds every descriptor its RLIMIT_NOFILE allows)"
            ),
            _ => Ok(()),
        }
    }
}
