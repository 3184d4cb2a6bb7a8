//! The profile's file: created beside its final name and renamed into place
//! (safefs), gzipped by libdeflate a member of 256 KiB of text at a time,
//! under the file-size limit's guard.
//!
//! Owns the output's creation ([`create_output`]), the gzip writer, the
//! file prepared before a privilege drop ([`prepare_for_setuid`]) and the
//! name of the temporary being written ([`remove_unfinished`]).
//!
//! Must never: write a partial file under the final name, write through a
//! link planted at the name, or leave a temporary behind (a process killed
//! while it wrote one leaves it to the keeper to remove).

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use igprof_format::write::{IoSink, WriteError};

use super::records::write_profile;
use super::resolve::Naming;
use super::view::ProfileTree;
use super::DumpError;
use super::{deflate, path};

/// Writes the merged profile to `path` (through a temporary, see
/// [`create_output`]); `complete`, if any, gets its size once it is all
/// written, before it takes its name.
pub(super) fn write_named<T: ProfileTree>(
    path: &str,
    gzip: bool,
    merged: &T,
    naming: &Naming,
    complete: Option<&dyn Fn(u64)>,
) -> Result<(), DumpError> {
    let out = create_output(path)?;
    let _named = UNFINISHED.name(out.written_path(Path::new(path)), Path::new(path));
    let written = {
        let _fsize = crate::base::limits::FsizeGuard::block();
        write_file(out.file(), gzip, merged, naming)
    };
    if let Err(err) = written {
        let path = out.written_path(Path::new(path)).display().to_string();
        out.discard();
        return Err(DumpError::Write { path, err });
    }
    if let Some(complete) = complete {
        if let Ok(m) = out.file().metadata() {
            complete(m.len());
        }
    }
    out.finish(Path::new(path)).map_err(|e| DumpError::Rename {
        path: path.to_string(),
        errno: e.raw_os_error().unwrap_or(0),
    })
}

/// The temporary a dump of this process is writing, by name (0 bytes:
/// none), in the process's memory, which the keeper shares: a process
/// killed while it wrote its profile (SIGKILL from a parent that ends its
/// children, as chromium does) leaves the file to the keeper, which writes
/// the profile itself and removes the temporary ([`remove_unfinished`]).
/// Dumps of a process do not overlap (`DUMPING`), so one name is enough.
struct Unfinished {
    len: AtomicUsize,
    path: UnsafeCell<[u8; libc::PATH_MAX as usize]>,
}

// SAFETY: `path` is written only by the one dump under way, before `len`
// is published (release), and read only after an acquire of `len` by the
// keeper, once the writer is dead.
unsafe impl Sync for Unfinished {}

static UNFINISHED: Unfinished = Unfinished::new();

/// While alive: its [`Unfinished`] names the file being written.
struct Named<'a>(Option<&'a Unfinished>);

impl Unfinished {
    const fn new() -> Self {
        Unfinished {
            len: AtomicUsize::new(0),
            path: UnsafeCell::new([0; libc::PATH_MAX as usize]),
        }
    }

    /// Names `written` until the guard is dropped, when it is a temporary
    /// (not `dest`, a device or a file written in place, which are never
    /// removed).
    fn name<'a>(&'a self, written: &Path, dest: &Path) -> Named<'a> {
        let b = written.as_os_str().as_bytes();
        if written == dest || b.len() >= libc::PATH_MAX as usize {
            return Named(None);
        }
        // SAFETY: no other dump is under way (see the type's docs), and the
        // keeper reads the buffer only after `len` says it is complete.
        unsafe {
            let buf = &mut *self.path.get();
            buf[..b.len()].copy_from_slice(b);
            buf[b.len()] = 0;
        }
        self.len.store(b.len(), Ordering::Release);
        Named(Some(self))
    }

    /// Removes the named file, if one is named (its writer dead; a raw
    /// system call: nothing of libc).
    fn remove(&self) {
        if self.len.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        // SAFETY: a NUL-terminated path (see `name`); unlinkat only reads
        // it.
        unsafe {
            crate::sys::raw_syscall(
                libc::SYS_unlinkat,
                [
                    libc::AT_FDCWD as usize,
                    self.path.get() as usize,
                    0,
                    0,
                    0,
                    0,
                ],
            );
        }
    }
}

impl Drop for Named<'_> {
    fn drop(&mut self) {
        if let Some(u) = self.0 {
            u.len.store(0, Ordering::Release);
        }
    }
}

/// In the keeper, the process's threads gone: removes the temporary a dump
/// of theirs was writing, if one was, and any other temporary of this
/// process's profile name (a dump killed before it named its file:
/// nothing else writes under that name, which holds the pid).
pub fn remove_unfinished() {
    UNFINISHED.remove();
    let dest = path::output_path();
    if !path::is_device_or_pipe(dest.as_bytes()) {
        safefs::remove_temporaries_of(Path::new(&dest));
    }
}

/// In a fork child: no temporary of this process is being written.
pub fn forget_unfinished() {
    UNFINISHED.len.store(0, Ordering::Release);
}

/// Streams the merged profile into `file`, gzipped or plain.
pub(super) fn write_file<T: ProfileTree>(
    file: &std::fs::File,
    gzip: bool,
    merged: &T,
    naming: &Naming,
) -> Result<(), WriteError> {
    let io = |e: std::io::Error| WriteError::Io {
        errno: e.raw_os_error().unwrap_or(0),
    };
    if gzip {
        let expected = merged.len().saturating_mul(TEXT_PER_NODE);
        let out = GzipWriter::new(file, expected, MEMBER);
        write_profile(IoSink::new(out), merged, naming)?
            .finish()?
            .finish()
            .map_err(io)?;
    } else {
        let mut f = write_profile(IoSink::new(file), merged, naming)?.finish()?;
        f.flush().map_err(io)?;
    }
    Ok(())
}

/// Text gzipped at once by libdeflate, as one member of the gzip file: a
/// gzip file may hold several members one after the other, which every
/// reader of profiles reads as one text (zcat, zlib's gzread, flate2's
/// MultiGzDecoder, Python's gzip). Deflate looks back 32 KiB only, so
/// members of this size compress as well as one; the dump's memory for
/// its text stays this size, not the profile's (12 MB for a compiler's).
/// The dump comes at the end of a process, often at its peak memory:
/// members of 1 MiB held 1.8 MiB of text and output at once.
pub(super) const MEMBER: usize = 256 << 10;

/// Bytes of text expected per call-tree node (a small cc1's profile: 31 a
/// node), to size a small profile's buffer at once.
pub(super) const TEXT_PER_NODE: usize = 40;

/// Gzips a dump's text into `file`, a [`MEMBER`] at a time with libdeflate;
/// if libdeflate fails, the rest streams through zlib-rs at level 3 (as
/// one more member).
pub(super) struct GzipWriter<'f> {
    pub(super) file: &'f std::fs::File,
    /// The current member's text.
    pub(super) text: Vec<u8>,
    /// Text per member.
    pub(super) member: usize,
    /// The compressor, kept from member to member.
    pub(super) gzip: deflate::Gzip,
    /// Whether a member was compressed: the rest are too, the compressor
    /// made (only a profile of one short member is stored).
    pub(super) compressed: bool,
    pub(super) stream: Option<flate2::write::GzEncoder<&'f std::fs::File>>,
}

impl<'f> GzipWriter<'f> {
    /// Room for `expected` bytes of text, in members of `member` bytes.
    fn new(file: &'f std::fs::File, expected: usize, member: usize) -> Self {
        GzipWriter {
            file,
            text: Vec::with_capacity(expected.min(member)),
            member,
            gzip: deflate::Gzip::default(),
            compressed: false,
            stream: None,
        }
    }

    /// Writes the text so far as one member (or into the stream).
    fn end_member(&mut self) -> std::io::Result<()> {
        if self.text.is_empty() {
            return Ok(());
        }
        if self.stream.is_none() {
            let level = if self.compressed {
                deflate::LEVEL
            } else {
                deflate::level_for(self.text.len())
            };
            self.compressed |= level != 0;
            if let Some(z) = self.gzip.member(&self.text, level) {
                let mut f = self.file;
                f.write_all(z)?;
                self.text.clear();
                return Ok(());
            }
            let enc = flate2::write::GzEncoder::new(self.file, flate2::Compression::new(3));
            self.stream = Some(enc);
        }
        let s = self.stream.as_mut().expect("set above");
        s.write_all(&self.text)?;
        self.text.clear();
        Ok(())
    }

    /// Compresses what is left and writes it out.
    fn finish(mut self) -> std::io::Result<()> {
        self.end_member()?;
        match self.stream.take() {
            Some(s) => s.finish().map(|_| ()),
            None => Ok(()),
        }
    }
}

impl Write for GzipWriter<'_> {
    /// Takes what fits in the member, ending it when full: the text's
    /// buffer never grows past a member (grown, it doubled, and in the
    /// final dump's region the first buffer was not used again: 768 KiB
    /// for a member of 256).
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = bytes
            .len()
            .min(self.member.saturating_sub(self.text.len()).max(1));
        self.text.extend_from_slice(&bytes[..n]);
        if self.text.len() >= self.member {
            self.end_member()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Members are written as they fill, the last at `finish`.
        Ok(())
    }
}

/// The file a dump is written into (see `safefs`): a device or FIFO in
/// place; else a file created exclusively under an unpredictable name
/// beside `path` and renamed over it when complete (a link planted at
/// either name is never written through); or, when the process may no
/// longer create files there (it dropped its privileges: see
/// [`prepare_for_setuid`]), the prepared `path` itself, written in place
/// if it is a regular file, not a link, of the process's user or of the
/// user who started it.
pub(super) fn create_output(path: &str) -> Result<safefs::Output, DumpError> {
    let dest = Path::new(path);
    let errno = match crate::base::limits::with_descriptor_room(|| safefs::Output::create(dest)) {
        Ok(out) => return Ok(out),
        Err(e) => e.raw_os_error().unwrap_or(0),
    };
    let create_failed = DumpError::Create {
        path: path.to_string(),
        errno,
    };
    if errno != libc::EACCES && errno != libc::EPERM {
        return Err(create_failed);
    }
    match safefs::open_in_place(dest, &file_owners()) {
        Ok(file) => Ok(safefs::Output::InPlace(file)),
        Err(safefs::Error::Refused(why)) => Err(DumpError::Refused {
            path: path.to_string(),
            why,
        }),
        Err(safefs::Error::Io(_)) => Err(create_failed),
    }
}

/// The users whose regular file a profile may be written into in place:
/// the process's effective user and the user who started it.
pub(super) fn file_owners() -> [u32; 2] {
    [safefs::euid(), crate::base::run::info().start_uid]
}

/// Before the process gives up its privileges (setuid and friends, to the
/// effective user `uid`): makes sure the profile can still be written where
/// the user asked, by creating the output file now, owned by `uid`; a dump
/// that can no longer create its temporary there writes it in place. Not signal
/// context.
pub fn prepare_for_setuid(uid: libc::uid_t) {
    if !crate::base::run::active() {
        return;
    }
    let path = path::output_path();
    if path::is_device_or_pipe(path.as_bytes()) {
        return;
    }
    if let Err(safefs::Error::Refused(why)) = safefs::prepare(Path::new(&path), &file_owners(), uid)
    {
        crate::igprof_log!("not preparing {path} for the profile: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump that died while it wrote its temporary leaves it named, and
    /// the keeper's removal takes it away; a finished dump (its guard
    /// dropped) names nothing, and a file written in place is never named.
    #[test]
    fn a_dead_dumps_temporary_is_removed_and_nothing_else() {
        let d = std::env::temp_dir().join(format!("igprof-unfinished-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (dest, tmp) = (d.join("p.gz"), d.join("p.gz.1234.tmp"));
        let u = Unfinished::new();
        std::fs::write(&tmp, "partial").unwrap();
        std::mem::forget(u.name(&tmp, &dest));
        u.remove();
        assert!(!tmp.exists(), "the dead dump's temporary removed");
        std::fs::write(&tmp, "partial").unwrap();
        drop(u.name(&tmp, &dest));
        u.remove();
        assert!(tmp.exists(), "a finished dump's name is forgotten");
        std::fs::write(&dest, "in place").unwrap();
        std::mem::forget(u.name(&dest, &dest));
        u.remove();
        assert!(dest.exists(), "a file written in place is never removed");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn gzip_writer_writes_members_that_read_back_as_one_text() {
        use std::io::{Read, Seek};
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("C{} FN{:x}+{:x}\n", i % 30, i % 500, i).into_bytes())
            .collect();
        // One member; a member per 4 KiB; a member per byte written.
        for (member, members) in [(usize::MAX, 1), (4096, text.len().div_ceil(4096)), (1, 0)] {
            let mut file = unnamed_temp_file();
            let mut w = GzipWriter::new(&file, 64, member);
            for chunk in text.chunks(4096) {
                w.write_all(chunk).unwrap();
            }
            w.finish().unwrap();
            file.rewind().unwrap();
            let mut z = Vec::new();
            file.read_to_end(&mut z).unwrap();
            let starts = z.windows(3).filter(|w| *w == [0x1f, 0x8b, 8]).count();
            if members > 0 {
                assert!(starts >= members, "member {member}: {starts} gzip headers");
            }
            let mut back = Vec::new();
            flate2::read::MultiGzDecoder::new(&z[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, text, "member {member}");
        }
    }

    #[test]
    fn only_a_profile_of_one_short_member_is_stored() {
        use std::io::{Read, Seek};
        let line = b"C1 FN0+0 V0:(1,2,3)\n";
        let gzipped = |len: usize, member: usize| {
            let text: Vec<u8> = line.iter().copied().cycle().take(len).collect();
            let mut file = unnamed_temp_file();
            let mut w = GzipWriter::new(&file, 64, member);
            w.write_all(&text).unwrap();
            w.finish().unwrap();
            file.rewind().unwrap();
            let mut z = Vec::new();
            file.read_to_end(&mut z).unwrap();
            let mut back = Vec::new();
            flate2::read::MultiGzDecoder::new(&z[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, text);
            z.len()
        };
        let short = deflate::STORE_BELOW - 1000;
        // One short member: stored, as long as its text.
        assert!(gzipped(short, MEMBER) > short);
        // The same text after a long member: compressed like the first.
        let long = deflate::STORE_BELOW + 1000;
        assert!(
            gzipped(long + short, long) < 2000,
            "a short last member is compressed"
        );
    }

    /// An unnamed file in the temporary directory, removed when closed.
    fn unnamed_temp_file() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "igprof-gzip-test.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }
}
