//! `--jit`'s part in the launcher: the runtimes that write a perf map only
//! when their environment asks (node through `NODE_OPTIONS`, Python 3.12+
//! through `PYTHONPERFSUPPORT`). node is given
//! `--perf-basic-prof-only-functions`: `--perf-basic-prof` also writes an
//! `isolate-*-v8.log` into the program's directory. The JVM is asked by the library, which
//! adds options to its own start-up (modules/jit), without the "Picked
//! up JAVA_TOOL_OPTIONS" line that variable would print.
//!
//! What it must never do: drop or reorder what the user already put in
//! `NODE_OPTIONS`, or set anything when `--jit` is not given.

use std::os::unix::ffi::OsStringExt;

/// Whether the `IGPROF` words ask for `--jit`.
pub fn asked(igprof: &[u8]) -> bool {
    igprof.split(|b| *b == b' ').any(|w| w == b"--jit")
}

/// Sets the variables of the exec for `--jit`.
pub fn set_env() {
    let node = match std::env::var_os("NODE_OPTIONS").map(|v| v.into_vec()) {
        Some(v)
            if v.split(|b| *b == b' ')
                .any(|w| w.starts_with(b"--perf-basic-prof")) =>
        {
            v
        }
        Some(v) if !v.is_empty() => [&v[..], b" --perf-basic-prof-only-functions"].concat(),
        _ => b"--perf-basic-prof-only-functions".to_vec(),
    };
    std::env::set_var("NODE_OPTIONS", std::ffi::OsString::from_vec(node));
    if std::env::var_os("PYTHONPERFSUPPORT").is_none() {
        std::env::set_var("PYTHONPERFSUPPORT", "1");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_word_asks() {
        assert!(super::asked(b"-pp --jit -o x.gz"));
        assert!(!super::asked(b"-pp -o --jit.gz"));
    }
}
