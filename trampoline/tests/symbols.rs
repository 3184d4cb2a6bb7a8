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

/// Every function libc defines, by name and by each of its versions
/// (`readelf --dyn-syms`: `realpath@@GLIBC_2.3`, `realpath@GLIBC_2.2.5`),
/// looked up in libc: the address the loader's `dlsym` / `dlvsym` on
/// libc's handle gives. The lookup reads libc's tables in memory (no
/// `dlopen`, which allocates with the program's malloc) except for
/// IFUNCs, which it leaves to the loader; a default version picked
/// wrongly, or a version name misread, gives another address.
#[test]
fn libc_functions_by_name_and_version_are_the_loaders() {
    // SAFETY: NUL-terminated names; RTLD_NOLOAD loads nothing.
    let h = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    assert!(!h.is_null());
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr of a libc function, into a zeroed Dl_info.
    assert_ne!(
        unsafe { libc::dladdr(libc::free as *const _, &mut info) },
        0
    );
    // SAFETY: dladdr's file name is NUL-terminated and lives with libc.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
        .to_str()
        .unwrap();
    // Under qemu-user (`-L /usr/aarch64-linux-gnu`, see .cargo/config.toml)
    // the loader's path is the guest's; readelf runs on the host.
    let name = std::path::Path::new(path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let host = [
        path.to_string(),
        format!("/usr/aarch64-linux-gnu{path}"),
        format!("/usr/aarch64-linux-gnu/lib/{name}"),
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .unwrap_or_else(|| panic!("{path}: no such file here"));
    let out = std::process::Command::new("readelf")
        .args(["--dyn-syms", "-W", &host])
        .output()
        .expect("readelf");
    let text = String::from_utf8(out.stdout).unwrap();
    let (mut by_name, mut by_version, mut hidden) = (0, 0, 0);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num: Value Size Type Bind Vis Ndx Name
        if f.len() < 8 || !matches!(f[3], "FUNC" | "IFUNC") || f[6] == "UND" {
            continue;
        }
        let (name, version, default) = match f[7].split_once("@@") {
            Some((n, v)) => (n, Some(v), true),
            None => match f[7].split_once('@') {
                Some((n, v)) => (n, Some(v), false),
                None => (f[7], None, true),
            },
        };
        let cname = std::ffi::CString::new(name).unwrap();
        if default {
            // SAFETY: a live handle and a NUL-terminated name.
            let want = unsafe { libc::dlsym(h, cname.as_ptr()) } as u64;
            if want != 0 {
                let got = find_function(name, Some("libc.so.6")).unwrap();
                assert_eq!(got.addr, want, "{name}");
                by_name += 1;
            }
        }
        if let Some(v) = version {
            let cv = std::ffi::CString::new(v).unwrap();
            // SAFETY: as above.
            let want = unsafe { libc::dlvsym(h, cname.as_ptr(), cv.as_ptr()) } as u64;
            if want != 0 {
                let got = find_function_versioned(name, v, Some("libc.so.6")).unwrap();
                assert_eq!(got.addr, want, "{name}@{v}");
                by_version += 1;
                hidden += !default as usize;
            }
        }
    }
    // SAFETY: balances the dlopen above.
    unsafe { libc::dlclose(h) };
    eprintln!("{by_name} by name, {by_version} by version ({hidden} not the default)");
    assert!(
        by_name > 1000 && by_version > 1000 && hidden > 10,
        "{by_name} {by_version} {hidden}"
    );
}

/// `object_base_of`, read from program headers, names the object `dladdr`
/// names (its `dli_fbase`) for a function of the program, of libc, of the
/// loader and of the vDSO, and no object for an address outside them.
#[test]
fn object_base_of_is_dladdrs_base() {
    fn dladdr_base(addr: usize) -> Option<u64> {
        // SAFETY: all-zero is a valid Dl_info, which dladdr only fills.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr reads the loader's tables for any address.
        let found = unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } != 0;
        (found && !info.dli_fbase.is_null()).then_some(info.dli_fbase as u64 & !0xfff)
    }
    // SAFETY: getauxval reads the process's auxiliary vector.
    let (entry, vdso) = unsafe {
        (
            libc::getauxval(libc::AT_ENTRY) as usize,
            libc::getauxval(libc::AT_SYSINFO_EHDR) as usize,
        )
    };
    let here = object_base_of_is_dladdrs_base as fn() as usize;
    let malloc = libc::malloc as *const () as usize;
    // SAFETY: dlsym with a NUL-terminated name.
    let loader = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) } as usize;
    let mut addrs = vec![entry, here, malloc, here + 1];
    if loader != 0 {
        addrs.push(loader);
    }
    if vdso != 0 {
        addrs.push(vdso + 0x100);
    }
    for a in addrs {
        let ours = trampoline::object_base_of(a);
        assert!(ours.is_some(), "{a:#x}: no object");
        assert_eq!(ours, dladdr_base(a), "{a:#x}");
    }
    let stack = 0u8;
    assert_eq!(
        trampoline::object_base_of(&stack as *const u8 as usize),
        None
    );
}
