//! The profile's file: created beside its final name and renamed into place
//! (safefs), gzipped whole by libdeflate or, past 32 MiB of text, streamed
//! through flate2's zlib-rs, under the file-size limit's guard.
//!
//! Owns the output's creation ([`create_output`]), the gzip writer and the
//! file prepared before a privilege drop ([`prepare_for_setuid`]).
//!
//! Must never: write a partial file under the final name, or write through
//! a link planted at the name.

use std::io::Write;
use std::path::Path;

use igprof_format::write::{IoSink, WriteError};

use super::merge::Merged;
use super::records::write_profile;
use super::resolve::Naming;
use super::DumpError;
use super::{deflate, path};

/// Writes the merged profile to `path` (through a temporary, see
/// [`create_output`]).
pub(super) fn write_named(
    path: &str,
    gzip: bool,
    merged: &Merged,
    naming: &Naming,
) -> Result<(), DumpError> {
    let out = create_output(path)?;
    let written = {
        let _fsize = crate::base::limits::FsizeGuard::block();
        write_file(out.file(), gzip, merged, naming)
    };
    if let Err(err) = written {
        let path = out.written_path(Path::new(path)).display().to_string();
        out.discard();
        return Err(DumpError::Write { path, err });
    }
    out.finish(Path::new(path)).map_err(|e| DumpError::Rename {
        path: path.to_string(),
        errno: e.raw_os_error().unwrap_or(0),
    })
}

/// Streams the merged profile into `file`, gzipped or plain.
pub(super) fn write_file(
    file: &std::fs::File,
    gzip: bool,
    merged: &Merged,
    naming: &Naming,
) -> Result<(), WriteError> {
    let io = |e: std::io::Error| WriteError::Io {
        errno: e.raw_os_error().unwrap_or(0),
    };
    if gzip {
        let expected = merged.nodes.len().saturating_mul(TEXT_PER_NODE);
        let out = GzipWriter::new(file, expected, WHOLE_GZIP_MAX);
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

/// Text of a profile kept in memory and gzipped whole by libdeflate (see
/// `deflate`), up to this size; a larger one streams through zlib-rs.
pub(super) const WHOLE_GZIP_MAX: usize = 32 << 20;

/// Bytes of text reserved per call-tree node (a small cc1's profile: 31 a
/// node), so that the text rarely grows by copying.
pub(super) const TEXT_PER_NODE: usize = 40;

/// Gzips a dump's text into `file`: whole with libdeflate while it is at
/// most [`WHOLE_GZIP_MAX`] bytes, else (and if libdeflate fails) as a
/// stream through zlib-rs at level 3 (faster than miniz_oxide at the same
/// ratio), so that a dump's memory stays bounded.
pub(super) struct GzipWriter<'f> {
    pub(super) file: &'f std::fs::File,
    /// The text so far, until it streams.
    pub(super) text: Option<Vec<u8>>,
    /// The most text kept.
    pub(super) whole_max: usize,
    pub(super) stream: Option<flate2::write::GzEncoder<&'f std::fs::File>>,
}

impl<'f> GzipWriter<'f> {
    /// Room for `expected` bytes of text, kept whole up to `whole_max`.
    fn new(file: &'f std::fs::File, expected: usize, whole_max: usize) -> Self {
        GzipWriter {
            file,
            text: Some(Vec::with_capacity(expected.min(whole_max))),
            whole_max,
            stream: None,
        }
    }

    /// Switches to the stream, handing it the text so far.
    fn stream(&mut self) -> std::io::Result<&mut flate2::write::GzEncoder<&'f std::fs::File>> {
        if self.stream.is_none() {
            let mut enc = flate2::write::GzEncoder::new(self.file, flate2::Compression::new(3));
            enc.write_all(&self.text.take().unwrap_or_default())?;
            self.stream = Some(enc);
        }
        Ok(self.stream.as_mut().expect("set above"))
    }

    /// Compresses what is left and writes it out.
    fn finish(mut self) -> std::io::Result<()> {
        if let Some(text) = &self.text {
            if let Some(z) = deflate::gzip(text, deflate::LEVEL) {
                let mut f = self.file;
                return f.write_all(&z);
            }
        }
        self.stream()?.try_finish()
    }
}

impl Write for GzipWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match &mut self.text {
            Some(text) if text.len() + bytes.len() <= self.whole_max => {
                text.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            _ => self.stream()?.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // The text is written at `finish`; a stream flushes its own.
        match &mut self.stream {
            Some(s) => s.flush(),
            None => Ok(()),
        }
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

    #[test]
    fn gzip_writer_keeps_small_texts_whole_and_streams_large_ones() {
        use std::io::{Read, Seek};
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("C{} FN{:x}+{:x}\n", i % 30, i % 500, i).into_bytes())
            .collect();
        // Whole (one libdeflate call), then past the limit from the start,
        // then past it halfway.
        for whole_max in [usize::MAX, 0, text.len() / 2] {
            let mut file = unnamed_temp_file();
            let mut w = GzipWriter::new(&file, 64, whole_max);
            for chunk in text.chunks(8192) {
                w.write_all(chunk).unwrap();
            }
            let streamed = w.stream.is_some();
            w.finish().unwrap();
            assert_eq!(streamed, whole_max < text.len(), "whole_max {whole_max}");
            file.rewind().unwrap();
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&mut file)
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, text, "whole_max {whole_max}");
        }
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
