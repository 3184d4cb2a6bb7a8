//! Links libigprof.so with `dump-code.ld`, which gathers the functions of
//! the final dump in one section after `.text` (`igprof_dump`): the dump's
//! steps then fault a few 64 KiB windows of the library's text back into the
//! process, not most of it (base/code_pages.rs; the list is written by
//! scripts/dump-code-order).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=dump-code.ld");
    println!("cargo:rustc-link-arg-cdylib=-Wl,-T,{dir}/dump-code.ld");
}
