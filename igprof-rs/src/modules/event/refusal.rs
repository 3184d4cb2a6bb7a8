//! Why a perf event does not open, in words a user can act on (the end of
//! the one `igprof:` line that names the event).
//!
//! Must never: open an event, or be called in signal context (it formats
//! and reads /proc).

use crate::base::sys::PerfEventKind;

/// `/proc/sys/kernel/perf_event_paranoid`, for messages.
pub(super) fn paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

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
