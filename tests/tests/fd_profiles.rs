//! End-to-end checks of the descriptor profiler (-fd): exact FD_USED and
//! FD_LIVE per creating function for every hooked function, dup2/dup3
//! replacing a descriptor, close_range, a close on another thread, exec with
//! close-on-exec, and -pp -mp -fd in one run.

mod mem_support;
use mem_support::*;

#[test]
fn fd_churn_is_exact() {
    let n: u64 = 2000;
    let (_d, out, _err, p) = run("fdchurn", "fd_churn.c", &["-fd"], &["2000"]);
    check_fd_churn(&out, &p, n);
}

#[test]
fn every_descriptor_function() {
    let (_d, out, _err, p) = run("fdkinds", "fd_kinds.c", &["-fd"], &[]);
    assert!(out.contains("kinds done"), "{out}");
    let used = sites(&p, "FD_USED");
    let live = sites(&p, "FD_LIVE");
    // (function, created, still open at exit)
    let want: [(&str, u64, u64); 27] = [
        ("f_range", 3, 0),
        ("f_open", 1, 1),
        ("f_openat", 1, 1),
        ("f_creat", 1, 1),
        ("f_target", 2, 0),
        ("f_dup", 1, 1),
        ("f_dup2", 1, 1),
        ("f_dup3", 1, 1),
        ("f_pipe", 2, 2),
        ("f_pipe2", 2, 2),
        ("f_socket", 1, 1),
        ("f_socketpair", 2, 2),
        ("f_listen", 1, 1),
        ("f_connect", 2, 2),
        ("f_accept", 1, 1),
        ("f_accept4", 1, 1),
        ("f_epoll_create", 1, 1),
        ("f_epoll_create1", 1, 1),
        ("f_eventfd", 1, 1),
        ("f_timerfd", 1, 1),
        ("f_signalfd", 1, 1),
        ("f_memfd", 1, 1),
        ("f_inotify_init", 1, 1),
        ("f_inotify_init1", 1, 1),
        ("f_fopen", 1, 0),
        ("f_tmpfile", 1, 1),
        ("f_closed", 1, 0),
    ];
    for (f, u, l) in want {
        assert_eq!(site(&used, f).calls, u, "{f} FD_USED");
        assert_eq!(site(&live, f).bytes, l, "{f} FD_LIVE at exit");
        assert_eq!(site(&live, f).leaks.len() as u64, l, "{f} LK records");
    }
    let t = site(&used, "f_thread_open");
    assert_eq!(t.calls, 1);
    assert_eq!(
        site(&live, "f_thread_open").bytes,
        0,
        "closed by the main thread"
    );
    // Nothing else creates descriptors in this program.
    let all: u64 = used.values().map(|s| s.calls).sum();
    assert_eq!(all, want.iter().map(|w| w.1).sum::<u64>() + 1, "{used:?}");
}

#[test]
fn close_on_exec_descriptors_end_at_exec() {
    let d = scratch("fdexec");
    build(&d, "fd_exec.c", "fd_exec", &[]);
    let o = igprof(&d, &["-fd", "./fd_exec"]);
    let _ = ok(&o);
    let mine: Vec<_> = profiles(&d)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("igprof.fd_exec.")
        })
        .collect();
    assert_eq!(mine.len(), 1, "{:?}", profiles(&d));
    let p = load(&mine[0]);
    let live = sites(&p, "FD_LIVE");
    assert_eq!(site(&sites(&p, "FD_USED"), "f_cloexec").calls, 1);
    assert_eq!(site(&live, "f_cloexec").bytes, 0, "O_CLOEXEC: gone at exec");
    assert_eq!(
        site(&live, "f_keep").bytes,
        1,
        "no O_CLOEXEC: survives exec"
    );
}

#[test]
fn memory_descriptors_and_cpu_in_one_run() {
    let (_d, out, err, p) = run("together", "fd_churn.c", &["-pp", "-mp", "-fd"], &["20000"]);
    check_fd_mem_cpu(&out, &err, &p, 20_000);
}

#[test]
fn results_and_errno_are_the_programs() {
    let d = scratch("errno");
    build(&d, "mem_errno.c", "mem_errno", &[]);
    let plain = std::process::Command::new(d.join("mem_errno"))
        .output()
        .unwrap();
    assert!(plain.status.success());
    let o = igprof(&d, &["-mp", "-fd", "-o", "prof.gz", "./mem_errno"]);
    let _ = ok(&o);
    let want = String::from_utf8_lossy(&plain.stdout);
    let got = String::from_utf8_lossy(&o.stdout);
    assert!(
        want.contains("malloc ok: errno 1234") && want.contains("close bad: -1 errno 9"),
        "{want}"
    );
    assert_eq!(
        got, want,
        "the program sees the same results and errno under -mp -fd"
    );
}
