//! Creating files where someone else may have planted a link.
//!
//! A profiler writes into directories it does not own: a shared scratch
//! directory, `/tmp`, the home of the user who ran `sudo`. Whoever else may
//! write there can plant a symbolic link (or a file of their own) under the
//! name the profiler is about to create, and a process that opens that name
//! writes through the link into whatever it points at (as root: any file of
//! the machine). Every file igprof-rs and igprof-analyse create therefore
//! goes through this crate:
//!
//! - a new file is first created under an unpredictable name beside its
//!   destination, exclusively (`O_CREAT|O_EXCL`, which never follows a link
//!   and never reuses a file that exists), then renamed over the
//!   destination, which replaces a link there instead of writing through it
//!   ([`Output`], [`Temp`]); the temporaries a killed writer left are found
//!   by that name's pattern ([`remove_temporaries_of`]);
//! - what is not a regular file (`/dev/null`, `/dev/stdout`, a FIFO: links
//!   to them included) is written in place, since a rename would replace the
//!   device or pipe itself ([`open_special`]);
//! - a regular file that must be written in place (one prepared before the
//!   process gave up its privileges) is opened without following a link,
//!   and only if it belongs to one of the users allowed ([`open_in_place`],
//!   [`prepare`]);
//! - a cache directory is used only when it is owned by the effective user
//!   and writable by nobody else, and its files are read and written
//!   relative to the directory's descriptor, never through a link
//!   ([`PrivateDir`]); missing directories are made one by one relative to
//!   their parent's descriptor, below a directory of the user or of root.
//!
//! Owns: the rules above and the typed reasons ([`Refusal`]) for saying no.
//!
//! Must never: follow a symbolic link when creating or writing a regular
//! file, reuse a file it did not create under a temporary name, or leave a
//! descriptor open past the value it returns (every descriptor is
//! close-on-exec). Not for signal handlers (it allocates).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a file or directory was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The name is a symbolic link.
    Link,
    /// A regular file was needed.
    NotRegular,
    /// A directory was needed.
    NotDirectory,
    /// It belongs to another user.
    NotOwned { owner: u32 },
    /// A directory that others may write into (mode shown in octal).
    SharedWritable { mode: u32 },
    /// A name with a `/` (or empty) where one file name was expected.
    BadName,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Link => write!(f, "it is a symbolic link"),
            Refusal::NotRegular => write!(f, "it is not a regular file"),
            Refusal::NotDirectory => write!(f, "it is not a directory"),
            Refusal::NotOwned { owner } => write!(f, "it belongs to another user (uid {owner})"),
            Refusal::SharedWritable { mode } => {
                write!(f, "other users may write into it (mode {mode:o})")
            }
            Refusal::BadName => write!(f, "not a plain file name"),
        }
    }
}

/// A failure: a system call's error or a refusal.
#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    Refused(Refusal),
}

impl Error {
    /// The system error number, if the failure was one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io(e) => e.raw_os_error(),
            Error::Refused(_) => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => e.fmt(f),
            Error::Refused(r) => write!(f, "refused: {r}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<Refusal> for Error {
    fn from(r: Refusal) -> Self {
        Error::Refused(r)
    }
}

/// 64 unpredictable bits: the kernel's random numbers, or where the call
/// is missing (a kernel before 3.17, a seccomp filter), the clock, the pid
/// and the stack's randomised address mixed.
pub fn token() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            &mut v as *mut u64,
            8usize,
            libc::GRND_NONBLOCK,
        )
    };
    if n == 8 {
        return v;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let seed = ((ts.tv_sec as u64) << 32)
        ^ ts.tv_nsec as u64
        ^ ((std::process::id() as u64) << 17)
        ^ (&ts as *const _ as u64);
    // splitmix64's finaliser.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `path` with `suffix` appended to its last component.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Removes the temporaries [`Temp::beside`] made for `dest` and left
/// behind (`<dest>.<16 hex digits>.tmp` in its directory: a writer killed
/// before it renamed or removed its file); returns how many. Only for a
/// `dest` that one writer alone uses (a temporary of another writer under
/// way would go too). Links and other files are left alone.
///
/// The directory is read with `getdents64` into a buffer on the stack,
/// not through the C library's directory stream: the caller may be a
/// process whose program died while a thread held the C library
/// allocator's lock (the profiler's keeper), and `opendir` allocates with
/// it (waiting for ever).
pub fn remove_temporaries_of(dest: &Path) -> usize {
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(dir) = open_dir_fd(None, dir, 0) else {
        return 0;
    };
    let name = name.as_bytes();
    let mut removed = 0;
    // Aligned for the records' 8-byte fields.
    let mut buf = [0u64; 1024];
    loop {
        // SAFETY: getdents64 into `buf`, of the size given.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                core::mem::size_of_val(&buf),
            )
        };
        if n <= 0 {
            break;
        }
        // SAFETY: the kernel wrote `n` bytes of records into `buf`.
        let bytes = unsafe { core::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
        let mut at = 0;
        while at + DIRENT_NAME <= bytes.len() {
            // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2),
            // d_type (1), d_name (NUL-terminated).
            let reclen = u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]) as usize;
            if reclen == 0 || at + reclen > bytes.len() {
                break;
            }
            let d_type = bytes[at + 18];
            let entry = &bytes[at + DIRENT_NAME..at + reclen];
            at += reclen;
            let Some(len) = entry.iter().position(|&b| b == 0) else {
                continue;
            };
            if !is_temporary_of(&entry[..len], name) {
                continue;
            }
            // The name with its NUL, in the record.
            let f = entry.as_ptr().cast::<libc::c_char>();
            let regular = match d_type {
                libc::DT_REG => true,
                libc::DT_UNKNOWN => {
                    // SAFETY: fstatat(2) of a NUL-terminated name relative
                    // to our descriptor, into a zeroed stat, no link followed.
                    unsafe {
                        let mut st: libc::stat = core::mem::zeroed();
                        libc::fstatat(dir.as_raw_fd(), f, &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0
                            && st.st_mode & libc::S_IFMT == libc::S_IFREG
                    }
                }
                _ => false,
            };
            // SAFETY: unlinkat(2) of a NUL-terminated name relative to our
            // descriptor.
            if regular && unsafe { libc::unlinkat(dir.as_raw_fd(), f, 0) } == 0 {
                removed += 1;
            }
        }
    }
    removed
}

/// Where a `linux_dirent64` record's name starts.
const DIRENT_NAME: usize = 19;

/// Whether file name `f` is a temporary [`Temp::beside`] makes for a
/// destination named `name`: `<name>.<16 lowercase hex digits>.tmp`.
fn is_temporary_of(f: &[u8], name: &[u8]) -> bool {
    f.len() == name.len() + 1 + 16 + 4
        && f.starts_with(name)
        && f[name.len()] == b'.'
        && f[name.len() + 1..name.len() + 17]
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && f.ends_with(b".tmp")
}

/// How many unpredictable names are tried before giving up (each one
/// taken already means someone plants names as fast as they are made).
const TRIES: usize = 8;

/// A file created exclusively under an unpredictable name beside its
/// destination, renamed over it by [`Temp::commit`].
#[derive(Debug)]
pub struct Temp {
    pub file: File,
    path: PathBuf,
}

impl Temp {
    /// Creates `<dest>.<16 hex digits>.tmp` with `O_CREAT|O_EXCL` (a link
    /// or file under that name is never followed or reused), mode `mode`
    /// less the umask.
    pub fn beside(dest: &Path, mode: u32) -> io::Result<Temp> {
        let mut last = io::Error::from_raw_os_error(libc::EEXIST);
        for _ in 0..TRIES {
            let path = with_suffix(dest, &format!(".{:016x}.tmp", token()));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
                .open(&path)
            {
                Ok(file) => return Ok(Temp { file, path }),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Where the temporary is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the finished file over `dest` (a link there is replaced,
    /// not followed); on failure the temporary is removed.
    pub fn commit(self, dest: &Path) -> io::Result<()> {
        let Temp { file, path } = self;
        drop(file);
        std::fs::rename(&path, dest).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })
    }

    /// Removes the temporary (a failed write leaves nothing behind).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `path` opened for writing in place if it exists and is neither a
/// regular file nor a directory (a device, a FIFO, a socket; a link to one
/// is followed: `-o /dev/stdout` is such a link). `Ok(None)`: it does not
/// exist, or is a regular file or a directory. The file is opened without
/// creating or truncating anything and checked again once open, so a
/// regular file swapped in meanwhile is never written here.
pub fn open_special(path: &Path) -> io::Result<Option<File>> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => {}
        _ => return Ok(None),
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)?;
    let m = file.metadata()?;
    Ok((!m.is_file() && !m.is_dir()).then_some(file))
}

/// Where a file is written: in place (a device, a FIFO) or through a
/// temporary renamed over the destination.
#[derive(Debug)]
pub enum Output {
    InPlace(File),
    Temp(Temp),
}

impl Output {
    /// [`open_special`]'s file for a device or pipe, else a [`Temp`]
    /// beside `dest`, mode 0666 less the umask (as `File::create`).
    pub fn create(dest: &Path) -> io::Result<Output> {
        match open_special(dest)? {
            Some(f) => Ok(Output::InPlace(f)),
            None => Temp::beside(dest, 0o666).map(Output::Temp),
        }
    }

    pub fn file(&self) -> &File {
        match self {
            Output::InPlace(f) => f,
            Output::Temp(t) => &t.file,
        }
    }

    pub fn file_mut(&mut self) -> &mut File {
        match self {
            Output::InPlace(f) => f,
            Output::Temp(t) => &mut t.file,
        }
    }

    /// The name being written: the temporary's, or the destination's.
    pub fn written_path<'a>(&'a self, dest: &'a Path) -> &'a Path {
        match self {
            Output::InPlace(_) => dest,
            Output::Temp(t) => t.path(),
        }
    }

    /// The complete file in place at `dest`.
    pub fn finish(self, dest: &Path) -> io::Result<()> {
        match self {
            Output::InPlace(_) => Ok(()),
            Output::Temp(t) => t.commit(dest),
        }
    }

    /// A failed write: no temporary is left behind.
    pub fn discard(self) {
        if let Output::Temp(t) = self {
            t.discard();
        }
    }
}

/// Checks an open file: regular and owned by one of `owners`.
fn check_owned_file(file: &File, owners: &[u32]) -> Result<u64, Error> {
    let m = file.metadata()?;
    if !m.is_file() {
        return Err(Refusal::NotRegular.into());
    }
    if !owners.contains(&m.uid()) {
        return Err(Refusal::NotOwned { owner: m.uid() }.into());
    }
    Ok(m.len())
}

/// The regular file `path`, opened to be rewritten in place and emptied:
/// never through a link, and only if it belongs to one of `owners`.
pub fn open_in_place(path: &Path, owners: &[u32]) -> Result<File, Error> {
    let file = open_nofollow(path, libc::O_WRONLY)?;
    check_owned_file(&file, owners)?;
    file.set_len(0)?;
    Ok(file)
}

/// Opens `path` with `flags | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY |
/// O_NONBLOCK` (a FIFO planted under the name must not block the open):
/// a link is [`Refusal::Link`].
fn open_nofollow(path: &Path, flags: i32) -> Result<File, Error> {
    let c = cstring(path.as_os_str())?;
    let fl = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), fl) };
    if fd < 0 {
        return Err(nofollow_error(io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// ELOOP from an `O_NOFOLLOW` open means the name is a link.
fn nofollow_error(e: io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        Refusal::Link.into()
    } else {
        e.into()
    }
}

fn cstring(s: &OsStr) -> Result<CString, Error> {
    CString::new(s.as_bytes()).map_err(|_| Error::Refused(Refusal::BadName))
}

/// Before the process gives up its privileges: makes sure `path` exists
/// as a regular file owned by `new_owner`, so that the process can still
/// write it in place later. A new file is created exclusively; one that
/// exists already is used only if it is a regular file (not a link) owned
/// by one of `owners`.
pub fn prepare(path: &Path, owners: &[u32], new_owner: u32) -> Result<(), Error> {
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let f = open_nofollow(path, libc::O_WRONLY)?;
            check_owned_file(&f, owners)?;
            f
        }
        Err(e) => return Err(e.into()),
    };
    // SAFETY: fchown on a descriptor we own; -1 keeps the group.
    if unsafe { libc::fchown(file.as_raw_fd(), new_owner, u32::MAX) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A directory owned by the effective user that no other user may write
/// into, held open: its files are read and written relative to it, so a
/// directory renamed or replaced after the check is never used.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// The error of opening directory `path` with `O_DIRECTORY|O_NOFOLLOW`.
fn open_dir_error(e: io::Error, path: &Path) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => Refusal::Link.into(),
        // With O_DIRECTORY, a link is ENOTDIR too.
        Some(libc::ENOTDIR)
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            Refusal::Link.into()
        }
        Some(libc::ENOTDIR) => Refusal::NotDirectory.into(),
        _ => e.into(),
    }
}

/// The checks of a directory opened at `fd`: its owner is the effective
/// user, or with `root_too` root as well, and nobody else may write into
/// it unless `sticky_too` and it is sticky (`/tmp`).
fn check_dir(fd: &OwnedFd, root_too: bool, sticky_too: bool) -> Result<(), Error> {
    // SAFETY: a File over `fd` for one fstat, never dropped (the
    // descriptor stays `fd`'s): no duplicate made and closed for it.
    let m =
        core::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd.as_raw_fd()) }).metadata()?;
    if m.uid() != euid() && !(root_too && m.uid() == 0) {
        return Err(Refusal::NotOwned { owner: m.uid() }.into());
    }
    if m.mode() & 0o022 != 0 && !(sticky_too && m.mode() & 0o1000 != 0) {
        return Err(Refusal::SharedWritable {
            mode: m.mode() & 0o7777,
        }
        .into());
    }
    Ok(())
}

/// Opens directory `path` (`at`: relative to that directory) with
/// `flags`.
fn open_dir_fd(at: Option<&OwnedFd>, path: &Path, flags: i32) -> Result<OwnedFd, Error> {
    let c = cstring(path.as_os_str())?;
    let flags = flags | libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path, relative to a directory we hold when
    // `at` is given; the descriptor is owned below.
    let fd = unsafe {
        match at {
            Some(dir) => libc::openat(dir.as_raw_fd(), c.as_ptr(), flags),
            None => libc::open(c.as_ptr(), flags),
        }
    };
    if fd < 0 {
        return Err(open_dir_error(io::Error::last_os_error(), path));
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the directories of `path` that are missing, mode 0700, each one
/// created and opened relative to its parent's descriptor, never through a
/// link. They are made only below an existing directory that the effective
/// user or root owns (reached through no link of another user) and that
/// others cannot write into unless it is sticky (`/tmp`): a home directory
/// of another user (root under `sudo` keeps the user's `HOME`) is refused.
fn create_missing(path: &Path) -> Result<(), Error> {
    let (mut fd, missing) = missing_below(path)?;
    for name in missing.iter().rev() {
        let c = cstring(name)?;
        // SAFETY: a NUL-terminated name relative to the directory we hold.
        if unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e.into());
            }
        }
        let child = open_dir_fd(Some(&fd), Path::new(name), libc::O_NOFOLLOW)?;
        check_dir(&child, false, false)?;
        fd = child;
    }
    Ok(())
}

/// The deepest existing directory above `path`, opened and checked as
/// [`create_missing`] requires, and the missing components below it,
/// deepest first (none: `path` exists, and the descriptor is unchecked).
fn missing_below(path: &Path) -> Result<(OwnedFd, Vec<OsString>), Error> {
    let mut missing: Vec<OsString> = Vec::new();
    let mut top = path;
    while std::fs::symlink_metadata(top).is_err() {
        let (Some(parent), Some(name)) = (top.parent(), top.file_name()) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT).into());
        };
        missing.push(name.to_owned());
        top = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
    }
    let link = std::fs::symlink_metadata(top)?;
    let me = euid();
    if !missing.is_empty() && link.file_type().is_symlink() && link.uid() != me && link.uid() != 0 {
        return Err(Refusal::Link.into());
    }
    let fd = open_dir_fd(None, top, 0)?;
    if !missing.is_empty() {
        check_dir(&fd, true, true)?;
    }
    Ok((fd, missing))
}

impl PrivateDir {
    /// Whether `path` would be used: it is a private directory already,
    /// or it is missing and [`PrivateDir::open`] with `create` would be
    /// allowed to make it. Makes nothing.
    pub fn check(path: &Path) -> Result<(), Error> {
        match PrivateDir::open(path, false) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => missing_below(path).map(drop),
            r => r.map(drop),
        }
    }

    /// Opens `path` (never through a link at its last component) and
    /// checks it; with `create`, makes it first where missing (see
    /// [`create_missing`]).
    pub fn open(path: &Path, create: bool) -> Result<PrivateDir, Error> {
        if create {
            create_missing(path)?;
        }
        let fd = open_dir_fd(None, path, libc::O_NOFOLLOW)?;
        check_dir(&fd, false, false)?;
        Ok(PrivateDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn name(name: &str) -> Result<CString, Error> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Refusal::BadName.into());
        }
        cstring(OsStr::new(name))
    }

    /// The contents of file `name`, at most `max` bytes (a longer file is
    /// read up to there): only a regular file owned by the effective user,
    /// never through a link.
    pub fn read(&self, name: &str, max: usize) -> Result<Vec<u8>, Error> {
        let c = Self::name(name)?;
        // SAFETY: a NUL-terminated name relative to the directory we hold.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(nofollow_error(io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        let len = check_owned_file(&file, &[euid()])?;
        // Room for the whole file and one byte more: one read fills it and
        // the next says it ended (from an empty vector, read_to_end reads
        // 32, 32, 64, 128... bytes at a time: seven reads for a 1 KB file).
        let room = usize::try_from(len).unwrap_or(usize::MAX).min(max);
        let mut out = Vec::with_capacity(room.saturating_add(1));
        file.take(max as u64).read_to_end(&mut out)?;
        Ok(out)
    }

    /// Replaces file `name` with `bytes` (mode 0600): written under an
    /// unpredictable name created exclusively, then renamed over `name`,
    /// so a reader sees the old file or the new one, never a part.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        let dest = Self::name(name)?;
        let dir = self.fd.as_raw_fd();
        let mut last = io::Error::from_raw_os_error(libc::EEXIST);
        for _ in 0..TRIES {
            let tmp = Self::name(&format!(".{name}.{:016x}.tmp", token()))?;
            // SAFETY: a NUL-terminated name relative to the directory we hold.
            let fd = unsafe {
                libc::openat(
                    dir,
                    tmp.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600 as libc::c_uint,
                )
            };
            if fd < 0 {
                last = io::Error::last_os_error();
                if last.raw_os_error() == Some(libc::EEXIST) {
                    continue;
                }
                return Err(last.into());
            }
            // SAFETY: a descriptor just opened, owned by nothing else.
            let mut file = unsafe { File::from_raw_fd(fd) };
            let written = file.write_all(bytes);
            drop(file);
            let done = written.and_then(|()| {
                // SAFETY: two NUL-terminated names relative to our directory.
                match unsafe { libc::renameat(dir, tmp.as_ptr(), dir, dest.as_ptr()) } {
                    0 => Ok(()),
                    _ => Err(io::Error::last_os_error()),
                }
            });
            if done.is_err() {
                // SAFETY: as above.
                unsafe { libc::unlinkat(dir, tmp.as_ptr(), 0) };
            }
            return done.map_err(Error::Io);
        }
        Err(last.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn victim(dir: &Path) -> PathBuf {
        let v = dir.join("victim");
        std::fs::write(&v, b"precious").unwrap();
        v
    }

    #[test]
    fn left_temporaries_of_one_destination_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("p.7.gz");
        let t = Temp::beside(&dest, 0o600).unwrap();
        let left = t.path().to_path_buf();
        std::mem::forget(t);
        for other in [
            "p.7.gz.tmp",
            "p.7.gz.0123456789ABCDEF.tmp",
            "p.8.gz.0123456789abcdef.tmp",
            "p.7.gz",
        ] {
            std::fs::write(d.path().join(other), "x").unwrap();
        }
        assert_eq!(remove_temporaries_of(&dest), 1);
        assert!(!left.exists());
        for other in [
            "p.7.gz.tmp",
            "p.7.gz.0123456789ABCDEF.tmp",
            "p.8.gz.0123456789abcdef.tmp",
            "p.7.gz",
        ] {
            assert!(d.path().join(other).exists(), "{other} kept");
        }
    }

    #[test]
    fn tokens_differ() {
        let a: std::collections::HashSet<u64> = (0..1000).map(|_| token()).collect();
        assert_eq!(a.len(), 1000);
    }

    #[test]
    fn an_output_replaces_a_planted_link_instead_of_writing_through_it() {
        let d = tempfile::tempdir().unwrap();
        let v = victim(d.path());
        let dest = d.path().join("p.gz");
        symlink(&v, &dest).unwrap();
        let mut out = Output::create(&dest).unwrap();
        assert!(matches!(out, Output::Temp(_)));
        out.file_mut().write_all(b"profile").unwrap();
        out.finish(&dest).unwrap();
        assert_eq!(std::fs::read(&v).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(&dest)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&dest).unwrap(), b"profile");
        // Nothing but the victim and the profile is left.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    #[test]
    fn devices_and_fifos_are_written_in_place_links_to_them_too() {
        let d = tempfile::tempdir().unwrap();
        let null = d.path().join("null");
        symlink("/dev/null", &null).unwrap();
        assert!(matches!(Output::create(&null).unwrap(), Output::InPlace(_)));
        assert!(std::fs::symlink_metadata(&null)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(open_special(&d.path().join("missing")).unwrap().is_none());
        assert!(open_special(d.path()).unwrap().is_none());
        let v = victim(d.path());
        assert!(open_special(&v).unwrap().is_none());
    }

    #[test]
    fn in_place_files_are_never_links_nor_another_users() {
        let d = tempfile::tempdir().unwrap();
        let v = victim(d.path());
        let link = d.path().join("link");
        symlink(&v, &link).unwrap();
        let me = euid();
        assert!(matches!(
            open_in_place(&link, &[me]),
            Err(Error::Refused(Refusal::Link))
        ));
        assert!(matches!(
            open_in_place(&v, &[me + 1]),
            Err(Error::Refused(Refusal::NotOwned { .. }))
        ));
        assert!(matches!(
            prepare(&link, &[me], me),
            Err(Error::Refused(Refusal::Link))
        ));
        assert_eq!(std::fs::read(&v).unwrap(), b"precious");
        let mut f = open_in_place(&v, &[me]).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(std::fs::read(&v).unwrap(), b"x");
        let fresh = d.path().join("fresh");
        prepare(&fresh, &[me], me).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().len(), 0);
    }

    #[test]
    fn private_dirs_are_the_users_alone_and_their_files_no_links() {
        let d = tempfile::tempdir().unwrap();
        let store = d.path().join("a/b");
        let dir = PrivateDir::open(&store, true).unwrap();
        for p in [d.path().join("a"), store.clone()] {
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o700
            );
        }
        dir.write("f", b"one").unwrap();
        dir.write("f", b"two").unwrap();
        assert_eq!(dir.read("f", 100).unwrap(), b"two");
        assert_eq!(dir.read("f", 2).unwrap(), b"tw");
        assert_eq!(std::fs::read_dir(&store).unwrap().count(), 1);
        let v = victim(d.path());
        symlink(&v, store.join("g")).unwrap();
        assert!(matches!(
            dir.read("g", 100),
            Err(Error::Refused(Refusal::Link))
        ));
        dir.write("g", b"new").unwrap();
        assert_eq!(std::fs::read(&v).unwrap(), b"precious");
        assert!(matches!(
            dir.read("../x", 1),
            Err(Error::Refused(Refusal::BadName))
        ));

        let link = d.path().join("storelink");
        symlink(&store, &link).unwrap();
        assert!(matches!(
            PrivateDir::open(&link, false),
            Err(Error::Refused(Refusal::Link))
        ));
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(
            PrivateDir::open(&store, false),
            Err(Error::Refused(Refusal::SharedWritable { mode: 0o770 }))
        ));
        assert!(matches!(
            PrivateDir::open(&v, false),
            Err(Error::Refused(Refusal::NotDirectory))
        ));
    }

    #[test]
    fn directories_are_made_below_the_users_or_sticky_ones_only() {
        let d = tempfile::tempdir().unwrap();
        // Below a directory others may write into, not sticky: refused.
        let shared = d.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            PrivateDir::open(&shared.join("x/y"), true),
            Err(Error::Refused(Refusal::SharedWritable { mode: 0o777 }))
        ));
        assert!(!shared.join("x").exists());
        // Sticky, as /tmp: made.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        PrivateDir::open(&shared.join("x/y"), true).unwrap();
        // Through a link of another user at the existing top: refused,
        // nothing made where it points (needs root, to plant it).
        if euid() == 0 {
            let elsewhere = d.path().join("elsewhere");
            std::fs::create_dir(&elsewhere).unwrap();
            let planted = shared.join("planted");
            symlink(&elsewhere, &planted).unwrap();
            std::os::unix::fs::lchown(&planted, Some(4242), Some(4242)).unwrap();
            assert!(matches!(
                PrivateDir::open(&planted.join("w"), true),
                Err(Error::Refused(Refusal::Link))
            ));
            assert!(!elsewhere.join("w").exists());
        }
    }
}
