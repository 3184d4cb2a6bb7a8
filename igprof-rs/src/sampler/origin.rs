//! Who sent a sampling signal: the calling thread's own sampler, its -pr
//! context-switch event, one of its `-e` events, a sampler of ours that is
//! stopped or another thread's (stale: ignored), or the program (its own
//! itimer, kill, raise...: forwarded to it). Read from the siginfo fields
//! its code makes valid, our cookies, and the timer ids and descriptors
//! our samplers ever used.
//!
//! Must never: take a signal that is not ours for a sample, nor let one of
//! ours (even late, after its sampler ended) reach the program.

use core::sync::atomic::{AtomicU64, Ordering};

use super::choice::signal;
use super::{has_event, COOKIE, EVENT_COOKIE, EVENT_SAMPLES, SWITCH_COOKIE};
use crate::base::thread::ThreadState;
use crate::sys;

const SI_TIMER: i32 = -2;

/// The kernel timer id of an SI_TIMER siginfo (the `_timer._tid` field).
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn timer_id_of(info: *const libc::siginfo_t) -> i32 {
    *((info as *const u8).add(16) as *const i32)
}

/// The value an SI_TIMER siginfo carries (the `_timer._sigval` field): the
/// `sigev_value` the timer was made with.
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn timer_value_of(info: *const libc::siginfo_t) -> u64 {
    *((info as *const u8).add(24) as *const u64)
}

/// The value a sampling timer of thread `tid` carries in its signals: our
/// timers are recognised by it where the timer id in the siginfo is not the
/// one timer_create returned (qemu-user hands the program its own ids).
pub(super) fn timer_cookie(tid: i32) -> u64 {
    COOKIE ^ ((tid as u32 as u64) << 32)
}

/// Whether `v` is the value of one of our sampling timers (any thread's).
fn is_timer_cookie(v: u64) -> bool {
    v & 0xffff_ffff == COOKIE & 0xffff_ffff
}

/// The descriptor of a SIGPOLL-style siginfo (the `_sigpoll._fd` field).
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn poll_fd_of(info: *const libc::siginfo_t) -> i32 {
    *((info as *const u8).add(24) as *const i32)
}

/// The `si_perf_data` of a TRAP_PERF siginfo (`_sigfault._perf._data`).
///
/// # Safety
/// `info` must be a valid siginfo.
unsafe fn perf_data_of(info: *const libc::siginfo_t) -> u64 {
    *((info as *const u8).add(24) as *const u64)
}

const POLL_IN: i32 = 1;
const POLL_HUP: i32 = 6;

/// Timer ids and descriptors our samplers ever used (bit sets). A signal
/// from one of them that is not the thread's current sampler (one still
/// pending when the sampler was stopped) is ours too, and ignored.
const BITSET_WORDS: usize = 1024;
static OUR_FDS: [AtomicU64; BITSET_WORDS] = [const { AtomicU64::new(0) }; BITSET_WORDS];
static OUR_TIMERS: [AtomicU64; BITSET_WORDS] = [const { AtomicU64::new(0) }; BITSET_WORDS];

/// Records that descriptor `fd` is one of our sampling events (its
/// signals, even late ones after it ended, are never the program's).
pub fn mark_fd_ours(fd: i32) {
    mark(&OUR_FDS, fd);
}

/// Records that timer `id` is one of our samplers (see [`mark_fd_ours`]).
pub(super) fn mark_timer_ours(id: i32) {
    mark(&OUR_TIMERS, id);
}

fn mark(set: &[AtomicU64; BITSET_WORDS], n: i32) {
    if n >= 0 && (n as usize) < BITSET_WORDS * 64 {
        set[n as usize / 64].fetch_or(1 << (n % 64), Ordering::Release);
    }
}

fn marked(set: &[AtomicU64; BITSET_WORDS], n: i32) -> bool {
    n >= 0
        && (n as usize) < BITSET_WORDS * 64
        && set[n as usize / 64].load(Ordering::Acquire) & (1 << (n % 64)) != 0
}

/// Who sent this signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// The calling thread's current sampler.
    Sampler,
    /// The calling thread's context-switch event (-pr): it ran again.
    Switched,
    /// The calling thread's `-e` event of this index.
    Event(u8),
    /// A sampler of ours that was stopped (or another thread's): ignore.
    Stale,
    /// The program (its own itimer, kill, ...): forward.
    Program,
}

/// What a sampling-signal delivery says about where it came from (the
/// fields of its siginfo that its code makes valid).
#[derive(Clone, Copy, Debug)]
enum Delivery {
    /// A sigtrap perf event's SIGTRAP, with its `si_perf_data`.
    Perf { data: u64 },
    /// A POSIX timer's signal: its timer id and `sigev_value`.
    Timer { id: i32, value: u64 },
    /// A perf event's fasync SIGPROF: the event's descriptor.
    Poll { fd: i32 },
    /// Anything else (kill, raise, the program's own itimer...).
    Other,
}

/// The calling thread's samplers, as [`origin_of`] needs them.
#[derive(Clone, Copy, Debug)]
struct Samplers {
    has_event: bool,
    /// The `-e` events the thread holds, one bit per index.
    held_events: u8,
    /// Their descriptors where they signal through fasync (-1: none).
    event_fds: [i32; 8],
    has_switch_event: bool,
    timer: i32,
    tid: i32,
    perf_fd: i32,
}

/// Where a sampling-signal delivery comes from: the thread's own sampler,
/// a sampler of ours that is not (or no longer) this thread's, or the
/// program. `ours_timer` / `ours_fd` say whether a timer id / descriptor
/// was ever one of our samplers.
fn origin_of(
    d: Delivery,
    t: Option<Samplers>,
    ours_timer: impl Fn(i32) -> bool,
    ours_fd: impl Fn(i32) -> bool,
) -> Origin {
    match d {
        Delivery::Perf { data } if data == COOKIE => {
            if t.is_some_and(|t| t.has_event) {
                Origin::Sampler
            } else {
                Origin::Stale
            }
        }
        Delivery::Perf { data } if data == SWITCH_COOKIE => {
            if t.is_some_and(|t| t.has_switch_event) {
                Origin::Switched
            } else {
                Origin::Stale
            }
        }
        Delivery::Perf { data } if data & !0xff == EVENT_COOKIE => {
            let i = (data & 0xff) as u8;
            if i < 8 && t.is_some_and(|t| t.held_events & 1 << i != 0) {
                Origin::Event(i)
            } else {
                Origin::Stale
            }
        }
        Delivery::Timer { id, value } => {
            if t.is_some_and(|t| t.timer == id || t.timer >= 0 && value == timer_cookie(t.tid)) {
                Origin::Sampler
            } else if ours_timer(id) || is_timer_cookie(value) {
                Origin::Stale
            } else {
                Origin::Program
            }
        }
        Delivery::Poll { fd } => {
            let event = t.and_then(|t| t.event_fds.iter().position(|&f| f >= 0 && f == fd));
            if t.is_some_and(|t| t.perf_fd == fd) {
                Origin::Sampler
            } else if let Some(i) = event {
                Origin::Event(i as u8)
            } else if ours_fd(fd) {
                Origin::Stale
            } else {
                Origin::Program
            }
        }
        _ => Origin::Program,
    }
}

#[link_section = "igprof_hot"]
pub(super) fn origin(t: Option<&ThreadState>, code: i32, info: *const libc::siginfo_t) -> Origin {
    // SAFETY: info is the kernel's siginfo for this signal; each field is
    // read only under the code that makes it valid.
    let d = unsafe {
        if code == sys::TRAP_PERF && signal() == libc::SIGTRAP {
            Delivery::Perf {
                data: perf_data_of(info),
            }
        } else if code == SI_TIMER {
            Delivery::Timer {
                id: timer_id_of(info),
                value: timer_value_of(info),
            }
        } else if (code == POLL_HUP || code == POLL_IN) && signal() == libc::SIGPROF {
            Delivery::Poll {
                fd: poll_fd_of(info),
            }
        } else {
            Delivery::Other
        }
    };
    let events = EVENT_SAMPLES.get();
    let samplers = t.map(|t| Samplers {
        has_event: has_event(t),
        held_events: events.map_or(0, |e| (e.held)(t)),
        event_fds: events.map_or([-1; 8], |e| (e.fds)(t)),
        has_switch_event: t.sampler.switch_hold.load(Ordering::Relaxed) != 0,
        timer: t.sampler.timer.load(Ordering::Relaxed),
        tid: t.tid(),
        perf_fd: t.sampler.perf_fd.load(Ordering::Relaxed),
    });
    origin_of(
        d,
        samplers,
        |id| marked(&OUR_TIMERS, id),
        |fd| marked(&OUR_FDS, fd),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mine(has_event: bool) -> Samplers {
        Samplers {
            has_event,
            held_events: 0b101,
            event_fds: [-1, 11, -1, -1, -1, -1, -1, -1],
            has_switch_event: true,
            timer: 7,
            tid: 100,
            perf_fd: 9,
        }
    }

    #[test]
    fn a_delivery_is_ours_stale_or_the_programs() {
        let never = |_| false;
        let o = |d, t| origin_of(d, t, never, never);
        // sigtrap perf events: our cookie, the switch cookie, or the program's.
        assert_eq!(
            o(Delivery::Perf { data: COOKIE }, Some(mine(true))),
            Origin::Sampler
        );
        assert_eq!(
            o(Delivery::Perf { data: COOKIE }, Some(mine(false))),
            Origin::Stale
        );
        assert_eq!(o(Delivery::Perf { data: COOKIE }, None), Origin::Stale);
        let switch = Delivery::Perf {
            data: SWITCH_COOKIE,
        };
        assert_eq!(o(switch, Some(mine(true))), Origin::Switched);
        let no_switch = Samplers {
            has_switch_event: false,
            ..mine(true)
        };
        assert_eq!(o(switch, Some(no_switch)), Origin::Stale);
        assert_eq!(
            o(Delivery::Perf { data: 42 }, Some(mine(true))),
            Origin::Program
        );
        // -e events: held by the thread or not.
        let ev = |i| Delivery::Perf {
            data: EVENT_COOKIE | i,
        };
        assert_eq!(o(ev(0), Some(mine(true))), Origin::Event(0));
        assert_eq!(o(ev(2), Some(mine(false))), Origin::Event(2));
        assert_eq!(o(ev(1), Some(mine(true))), Origin::Stale);
        assert_eq!(o(ev(9), Some(mine(true))), Origin::Stale);
        assert_eq!(o(ev(0), None), Origin::Stale);
        // An -e event signalling through fasync: its descriptor.
        assert_eq!(
            o(Delivery::Poll { fd: 11 }, Some(mine(true))),
            Origin::Event(1)
        );
        // POSIX timers: this thread's by id or by its cookie, another of
        // ours by cookie or id, else the program's.
        let t = Some(mine(false));
        assert_eq!(o(Delivery::Timer { id: 7, value: 0 }, t), Origin::Sampler);
        let by_cookie = Delivery::Timer {
            id: 3,
            value: timer_cookie(100),
        };
        assert_eq!(o(by_cookie, t), Origin::Sampler);
        let other_thread = Delivery::Timer {
            id: 3,
            value: timer_cookie(101),
        };
        assert_eq!(o(other_thread, t), Origin::Stale);
        assert_eq!(o(Delivery::Timer { id: 3, value: 5 }, t), Origin::Program);
        let was_ours = origin_of(Delivery::Timer { id: 3, value: 5 }, t, |id| id == 3, never);
        assert_eq!(was_ours, Origin::Stale);
        // fasync SIGPROF: the thread's event descriptor, one of ours, or not.
        assert_eq!(o(Delivery::Poll { fd: 9 }, t), Origin::Sampler);
        assert_eq!(o(Delivery::Poll { fd: 10 }, t), Origin::Program);
        assert_eq!(
            origin_of(Delivery::Poll { fd: 10 }, t, never, |fd| fd == 10),
            Origin::Stale
        );
        // kill, raise, the program's own itimer.
        assert_eq!(o(Delivery::Other, t), Origin::Program);
    }
}
