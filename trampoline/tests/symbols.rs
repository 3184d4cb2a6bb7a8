//! Symbol lookup in the running process: dlsym, dlvsym, sizes, errors.
//! (The ELF .symtab fallback for unexported functions is exercised by the
//! live tests, which find their assembly functions by name.)

use trampoline::{find_function, find_function_versioned, LookupError};

#[test]
fn first_definition_and_named_library_agree() {
    let any = find_function("malloc", None).unwrap();
    let libc = find_function("malloc", Some("libc.so.6")).unwrap();
    assert_eq!(any, libc);
    assert_eq!(any.name, "malloc");
    // SAFETY: dlsym with a NUL-terminated name.
    let direct = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as u64;
    assert_eq!(any.addr, direct);
    let size = any.size.expect("malloc has a size in .dynsym");
    assert!(size > 16 && size < 0x10000, "{size}");
}

/// The first glibc symbol version of the host architecture.
#[cfg(target_arch = "x86_64")]
const BASE: &std::ffi::CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const BASE: &std::ffi::CStr = c"GLIBC_2.17";

#[test]
fn versioned_lookup() {
    let base = BASE.to_str().unwrap();
    let old = find_function_versioned("pthread_create", base, None).unwrap();
    // SAFETY: dlvsym with NUL-terminated strings.
    let direct = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"pthread_create".as_ptr(),
            BASE.as_ptr(),
        )
    };
    assert_eq!(old.addr, direct as u64);
    assert!(old.size.is_some());
    assert_eq!(
        find_function_versioned("pthread_create", "GLIBC_9.99", None),
        Err(LookupError::NotFound {
            name: "pthread_create".into(),
            version: Some("GLIBC_9.99".into()),
            lib: None
        })
    );
}

#[test]
fn errors_name_the_problem() {
    let e = find_function("no_such_function_anywhere", None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "symbol no_such_function_anywhere not found in any loaded object"
    );
    let e = find_function("malloc", Some("libnot-loaded-here.so.1")).unwrap_err();
    assert_eq!(
        e,
        LookupError::LibraryNotLoaded {
            lib: "libnot-loaded-here.so.1".into()
        }
    );
    assert!(e.to_string().contains("dlopen it first"), "{e}");
    assert!(matches!(
        find_function("a\0b", None),
        Err(LookupError::BadName { .. })
    ));
}
