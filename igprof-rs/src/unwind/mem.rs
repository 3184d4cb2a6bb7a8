//! Memory for the unwinder that is not the program's heap: anonymous,
//! zero-filled `mmap` regions, pre-populated unless asked otherwise.
//!
//! Owns: the unwinder's use of such regions (the mapping itself and errno
//! hygiene are `sys`'s, raw system calls that hold no runtime state). Never calls
//! malloc. Mapping and unmapping happen outside signal context (module
//! table refresh, thread start and exit); the regions are read from signal
//! context.

use core::ptr::NonNull;

/// Types that are valid when every byte is zero (what `mmap` hands out).
///
/// # Safety
/// Implementors must be plain data for which the all-zero bit pattern is a
/// valid value, with no drop glue that matters.
pub(crate) unsafe trait Zeroable {}

// SAFETY: every bit pattern, zero included, is a valid u8.
unsafe impl Zeroable for u8 {}

/// Why an anonymous mapping failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// `mmap` of `bytes` bytes failed with `errno`.
    Mmap {
        bytes: usize,
        errno: crate::sys::Errno,
    },
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MapError::Mmap { bytes, errno } => write!(
                f,
                "unwinder: mmap of {bytes} bytes failed (errno {errno}); the process is out of address space or memory"
            ),
        }
    }
}

/// Map `bytes` (> 0) of zeroed, populated (so that a signal handler never
/// takes the page faults of first use), page-aligned memory.
fn map(bytes: usize, populate: bool) -> Result<NonNull<u8>, MapError> {
    let p =
        crate::sys::map_anon(bytes, populate).map_err(|errno| MapError::Mmap { bytes, errno })?;
    // mmap never returns null on success with a null hint.
    Ok(NonNull::new(p).expect("mmap returned null"))
}

/// # Safety
/// `p..p+bytes` must be a whole mapping made by `map` that nothing uses any
/// more.
unsafe fn unmap(p: NonNull<u8>, bytes: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { crate::sys::munmap(p.as_ptr(), bytes) };
}

/// An owned, zero-initialised array of `len` values of `T` in its own mapping.
pub(crate) struct MmapSlice<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
}

impl<T: Zeroable> MmapSlice<T> {
    /// Map a zeroed array of `len` elements (`len` may be 0: nothing mapped).
    pub(crate) fn zeroed(len: usize) -> Result<Self, MapError> {
        Self::mapped(len, true)
    }

    /// [`Self::zeroed`] without faulting the pages in: for an array whose
    /// pages may never all be touched (a signal handler may then take the
    /// page fault of first use).
    pub(crate) fn zeroed_lazy(len: usize) -> Result<Self, MapError> {
        Self::mapped(len, false)
    }

    fn mapped(len: usize, populate: bool) -> Result<Self, MapError> {
        let bytes = len
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(MapError::Mmap {
                bytes: usize::MAX,
                errno: crate::sys::Errno(libc::ENOMEM),
            })?;
        if bytes == 0 {
            return Ok(Self {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        const {
            assert!(
                core::mem::align_of::<T>() <= 4096,
                "page alignment suffices"
            )
        };
        Ok(Self {
            ptr: map(bytes, populate)?.cast(),
            len,
        })
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: ptr points to `len` zero-initialised (hence valid, by
        // `Zeroable`) elements owned by self, or len is 0.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in as_slice, and &mut self gives exclusive access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Give up ownership: the mapping stays for the life of the process.
    pub(crate) fn leak(self) -> &'static mut [T] {
        let s = core::mem::ManuallyDrop::new(self);
        // SAFETY: the mapping is never unmapped after this (no Drop runs),
        // so the slice is valid for 'static.
        unsafe { core::slice::from_raw_parts_mut(s.ptr.as_ptr(), s.len) }
    }
}

impl<T: Zeroable> Drop for MmapSlice<T> {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the region was mapped by `zeroed` with this size and is
            // owned exclusively by self.
            unsafe { unmap(self.ptr.cast(), self.len * core::mem::size_of::<T>()) };
        }
    }
}

/// One `T` in its own mapping, for values that signal handlers on other
/// threads read through a raw pointer (module tables).
pub(crate) struct MmapBox<T> {
    ptr: NonNull<T>,
}

impl<T> MmapBox<T> {
    const BYTES: usize = if core::mem::size_of::<T>() == 0 {
        1
    } else {
        core::mem::size_of::<T>()
    };

    pub(crate) fn new(value: T) -> Result<Self, MapError> {
        const {
            assert!(
                core::mem::align_of::<T>() <= 4096,
                "page alignment suffices"
            )
        };
        let ptr = map(Self::BYTES, true)?.cast::<T>();
        // SAFETY: ptr is page aligned, writable and large enough for a T.
        unsafe { ptr.as_ptr().write(value) };
        Ok(MmapBox { ptr })
    }

    /// Give up ownership; `from_raw` takes it back.
    pub(crate) fn into_raw(self) -> *mut T {
        core::mem::ManuallyDrop::new(self).ptr.as_ptr()
    }

    /// # Safety
    /// `p` must come from `into_raw` and not be taken back twice.
    pub(crate) unsafe fn from_raw(p: *mut T) -> Self {
        MmapBox {
            ptr: NonNull::new(p).expect("null MmapBox"),
        }
    }
}

impl<T> core::ops::Deref for MmapBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: ptr holds a T written in `new` and owned by self.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for MmapBox<T> {
    fn drop(&mut self) {
        // SAFETY: ptr holds a T owned by self, dropped once here, in a
        // mapping of BYTES bytes made by `map`.
        unsafe {
            core::ptr::drop_in_place(self.ptr.as_ptr());
            unmap(self.ptr.cast(), Self::BYTES);
        }
    }
}
