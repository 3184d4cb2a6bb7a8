//! The plans of hooked functions kept between processes
//! (`trampoline::known`): a process whose hooked functions an earlier one
//! planned never decodes them (on x86-64 it never builds iced-x86's
//! decoder tables, about 0.45 ms of every profiled process).
//!
//! Owns: where the table lives, `plans-<build-id of this libigprof.so>` in
//! the descriptor store's directory (`unwind/store.rs`, whose
//! `IGPROF_CACHE_DIR` and `none` it follows), read before the
//! start-up hooks are installed and written when a process planned
//! something new. A table written by another build of the library is
//! never read: plans depend on the trampoline code that made them.
//!
//! Must never: run in a signal handler (files, allocation), or stop the
//! program when the directory cannot be read or written (the hooks are
//! then planned as without it).

use std::sync::OnceLock;

use crate::unwind::store;

/// The table's file name, when the store is on and the library has a
/// build-id: `plans-<build-id>` among the store's descriptor files (whose
/// names are bare build-ids), so that a first process makes no second
/// directory. Found once, for [`load`] and [`save`] alike.
fn file() -> Option<&'static str> {
    static FILE: OnceLock<Option<String>> = OnceLock::new();
    FILE.get_or_init(|| own_file("plans")).as_deref()
}

/// `<prefix>-<build-id of this library>`, the name of a table of the
/// store's directory that only this build of the library may read; None
/// when the store is off or the library has no build-id.
pub(crate) fn own_file(prefix: &str) -> Option<String> {
    store::dir()?;
    let id = own_build_id()?;
    Some(format!("{prefix}-{}", store::hex(&id)))
}

/// The most bytes a plans table is read up to (a table of every hook of
/// every module is a few KiB).
const MAX_TABLE: usize = 1 << 20;

/// Reads the plans earlier processes kept (only from the store's checked
/// directory, see `unwind/store.rs`). Returns how many were added.
pub fn load() -> usize {
    let bytes = file().and_then(|name| {
        let dir = store::open_dir(false)?.ok()?;
        dir.read(name, MAX_TABLE).ok()
    });
    match bytes {
        Some(bytes) => trampoline::known::import(&bytes),
        None => 0,
    }
}

/// Writes the table when this process planned something new, making the
/// store's directory (mode 0700) where it is missing: a process that
/// derives no descriptor (a `/bin/true`, a shell's short command) would
/// otherwise never find its plans again and decode its hooked functions
/// on every run (about 1 ms each time, against one `mkdir` once per
/// machine). Returns whether it wrote, or why it could not.
pub fn save() -> Result<bool, String> {
    let Some(name) = file() else {
        return Ok(false);
    };
    let Some(bytes) = trampoline::known::export() else {
        return Ok(false);
    };
    let dir = match store::open_dir(true) {
        None => return Ok(false),
        Some(Err(e)) => {
            let at = store::dir().map(|d| d.display().to_string());
            return Err(format!("{}: {e}", at.unwrap_or_default()));
        }
        Some(Ok(d)) => d,
    };
    dir.write(name, &bytes)
        .map(|()| true)
        .map_err(|e| format!("{}/{name}: {e}", dir.path().display()))
}

/// The GNU build-id of this library, from its own notes.
fn own_build_id() -> Option<Vec<u8>> {
    let addr = own_build_id as *const () as usize;
    trampoline::image::first_object(|info| {
        // SAFETY: a loaded object, inside first_object's callback. Objects'
        // spans do not overlap, so the one that may hold this function
        // holds it.
        if !unsafe { trampoline::image::may_hold(info, addr, 4096) } {
            return None;
        }
        // SAFETY: a loaded object, read only inside first_object's callback.
        let img = unsafe { trampoline::image::Image::of(info) };
        // SAFETY: the loader's program headers of the object at its bias.
        Some(unsafe { store::build_id_of(img.bias, img.phdrs()) }.map(<[u8]>::to_vec))
    })
    .flatten()
    .filter(|id| !id.is_empty())
}
