//! Why a perf event does not open, in words a user can act on (the end of
//! the one `igprof:` line that names the event).
//!
//! Must never: open an event, or be called in signal context (it formats
//! and reads /proc).

use crate::sys::PerfEventKind;

pub(super) use crate::sys::perf_event_paranoid as paranoid;

/// Why an event does not open, and what would let it (one line's end).
pub(super) fn open_refusal(e: i32, kind: &PerfEventKind) -> String {
    match e {
        libc::EACCES | libc::EPERM => format!(
            "not allowed (perf_event_paranoid is {}{}): needs perf_event_paranoid <= {} (sysctl kernel.perf_event_paranoid) or CAP_PERFMON",
            paranoid(),
            if kind.exclude_kernel { "" } else { ", and this event counts in kernel mode" },
            if kind.exclude_kernel { 2 } else { 1 }
        ),
        libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP => format!(
            "not supported here (errno {e}: this machine's PMU does not count it, or the PMU cannot sample; virtual machines often have no hardware PMU)"
        ),
        libc::EINVAL => "the kernel refused its attributes (EINVAL: a term out of range, or a kernel without sigtrap perf events, Linux 5.13+)".into(),
        libc::EMFILE | libc::ENFILE => format!("no descriptor left (errno {e})"),
        _ => format!("perf_event_open failed (errno {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_says_what_would_allow_it() {
        let user = PerfEventKind {
            exclude_kernel: true,
            ..PerfEventKind::default()
        };
        let kernel = PerfEventKind::default();
        for e in [libc::EACCES, libc::EPERM] {
            let u = open_refusal(e, &user);
            assert!(u.starts_with("not allowed (perf_event_paranoid is "), "{u}");
            assert!(u.contains("needs perf_event_paranoid <= 2 "), "{u}");
            assert!(!u.contains("kernel mode"), "{u}");
            let k = open_refusal(e, &kernel);
            assert!(k.contains(", and this event counts in kernel mode)"), "{k}");
            assert!(k.contains("needs perf_event_paranoid <= 1 "), "{k}");
            assert!(k.ends_with("or CAP_PERFMON"), "{k}");
        }
        for e in [libc::ENOENT, libc::ENODEV, libc::EOPNOTSUPP] {
            let s = open_refusal(e, &user);
            assert!(
                s.starts_with(&format!("not supported here (errno {e}:")),
                "{s}"
            );
        }
        assert!(open_refusal(libc::EINVAL, &user).contains("Linux 5.13+"));
        assert_eq!(
            open_refusal(libc::EMFILE, &user),
            format!("no descriptor left (errno {})", libc::EMFILE)
        );
        assert_eq!(
            open_refusal(libc::ENFILE, &user),
            format!("no descriptor left (errno {})", libc::ENFILE)
        );
        assert_eq!(
            open_refusal(libc::EBUSY, &user),
            format!("perf_event_open failed (errno {})", libc::EBUSY)
        );
    }

    #[test]
    fn paranoid_is_the_sysctl_or_a_question_mark() {
        let p = paranoid();
        match std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid") {
            Ok(s) => assert_eq!(p, s.trim()),
            Err(_) => assert_eq!(p, "?"),
        }
    }
}
