//! The keeper: a process that writes the final profile of an image that
//! ended without writing it (SIGKILL, a crash in the program's own signal
//! handler, a raw `exit_group`, a fatal signal the handlers could not
//! serve, death in the middle of the final dump).
//!
//! Owns the keeper's life: its creation at start-up, in a fork child and
//! after an exec that failed ([`start`]); the image's word that it wrote its
//! profile itself ([`image_ended`]); the wait for the program's end; the
//! dump the keeper writes when that word never came. Where the process's
//! cgroup limits its memory, the keeper also runs the watch of `limit`
//! (a snapshot as the usage nears the limit: the evidence that remains
//! when the OOM killer strikes, which kills the keeper too), and gives the
//! library's code pages back [`GIVE_BACK_AFTER_NS`] into the run; `raw`
//! holds its libc-free system calls.
//!
//! How it sees the profile after the program is gone: it is made by
//! `clone(CLONE_VM)` without `CLONE_THREAD`, so it shares the program's memory
//! but is not in its thread group. Whatever ends every thread of the program
//! leaves the memory in place while the keeper holds it, with every call
//! tree, live table and module list as they were at that instant, and the
//! keeper runs the ordinary final dump over them. The OOM killer is the one
//! exception: it kills every process that shares the victim's memory, the
//! keeper too.
//!
//! What the program sees of it: nothing it can wait for, signal or inherit.
//! An intermediate process makes the keeper and exits at once, and is
//! reaped here, so the keeper is not the program's child; it has no signal
//! to send its parent; it starts a session of its own (no signal to the
//! program's process group or terminal reaches it); it blocks every signal;
//! it closes every descriptor it got from the program (a pipe's reader
//! still sees end-of-file when the program ends) except a copy of stderr
//! when that is a terminal or a regular file, for its one line. Its
//! creating thread's CPU set is narrowed to the CPU it runs on for the
//! instant of one `clone`, and put back before the creator waits: the
//! intermediate process and the keeper run on that CPU for the first
//! [`GIVE_BACK_AFTER_NS`] (`affinity`).
//!
//! Must never: touch TLS, errno or anything of libc while the program lives
//! (the keeper runs with its creator's TLS, so it makes raw system calls
//! only, into its own stack; the `memcpy`/`memset` calls the compiler emits
//! for its buffers are bound to glibc's by base/mem_calls.rs, never to a
//! sanitizer's interceptors, which keep per-thread state in TLS); write a profile the image wrote or said it
//! could not write; keep the program's memory after the image is gone
//! (it exits when the image ends by exec, and after its dump).

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

use crate::sys;

pub(crate) mod affinity;
pub mod facts;
mod limit;
mod raw;

pub use limit::{cache_left_out, pressure_asked, pressure_file, watching_rss, PRESSURE_MEANS};

use limit::{
    check_near_limit_from_keeper, find_memory_limit, on_pressure, pressure_fd, threshold_eventfd,
    thresholds, CROSSED, LIMIT, SNAPSHOT, WATCH_NS,
};
use raw::raw_read;

/// The keeper's stack: the final dump's deepest calls (naming, gzip) run on
/// it. Mapped without reserve: only the pages it touches cost memory.
const STACK_BYTES: usize = 8 << 20;
/// The intermediate process's stack, at the top of the same mapping.
const SPAWN_STACK_BYTES: usize = 64 << 10;
/// A dump that takes longer than this (a lock held by a killed thread) ends
/// the keeper instead of keeping the program's memory for ever.
const DUMP_LIMIT_S: u64 = 600;

/// Generation of the current keeper (0: none started yet); each [`start`]
/// makes a new one, and a keeper exits once its generation has ended.
static GEN: AtomicU32 = AtomicU32::new(0);
/// The latest generation whose image ended having written its profile (or
/// said why not) itself.
static ENDED: AtomicU32 = AtomicU32::new(0);
/// The current keeper's pid (0: none).
static KEEPER: AtomicI32 = AtomicI32::new(0);
/// The program's pid, for the keeper (a fork child inherits the parent's
/// value, and so knows the keeper is not its own).
static PROGRAM: AtomicI32 = AtomicI32::new(0);
/// The program's pidfd, opened by the intermediate process (its table,
/// inherited by the keeper's).
static PIDFD: AtomicI32 = AtomicI32::new(-1);
/// Why the intermediate process made no keeper (an errno; 0: it did).
static SPAWN_ERRNO: AtomicI32 = AtomicI32::new(0);
/// The stack mapping of the current keeper (0: none).
static STACK: AtomicUsize = AtomicUsize::new(0);
/// Set at start-up when no keeper may be made in this process (see
/// [`configure`]).
static OFF: AtomicU32 = AtomicU32::new(0);

/// What the keeper calls in the rest of the runtime, given at start-up so
/// that this file imports none of it (the final dump imports this file).
#[derive(Clone, Copy)]
pub struct Calls {
    /// Writes the final profile of an image that died (`how` it ended).
    pub final_dump: fn(&str),
    /// Asks the program for a snapshot near its memory limit (usage,
    /// limit, a futex wake): no TLS, no libc.
    pub snapshot_near_limit: fn(u64, u64, fn(&AtomicU32)),
    /// Adds a timeline point with these facts ([`facts::point`]); returns
    /// the step to the next one (ns). No TLS, no libc, no allocation.
    pub timeline_point: fn(&[u64; 4]) -> u64,
    /// Gives the library's code pages back to the kernel, once start-up is
    /// [`GIVE_BACK_AFTER_NS`] behind. No TLS, no libc, no allocation.
    pub give_back_code: fn() -> usize,
}

/// How long after it starts the keeper gives the library's code pages
/// back (base/code_pages.rs). Start-up faults in nearly all of them; a
/// process that ends sooner (a build's short commands: a compiler driver,
/// the assembler) is spared the advice and the faults that bring back the
/// pages its final dump runs, and one that runs longer has them out of
/// its resident set long before its peak.
pub const GIVE_BACK_AFTER_NS: u64 = 20_000_000;

/// [`Calls::give_back_code`] (a `fn` as usize; 0: nothing to give back).
static GIVE_BACK: AtomicUsize = AtomicUsize::new(0);

/// [`Calls::timeline_point`] (a `fn` as usize; 0: no timeline).
static TIMELINE_POINT: AtomicUsize = AtomicUsize::new(0);

/// The [`Calls`] (set once by [`configure`]; `fn` pointers as usize).
static FINAL_DUMP: AtomicUsize = AtomicUsize::new(0);

/// Why no keeper may run in this process (see [`configure`]).
static OFF_WHY: AtomicUsize = AtomicUsize::new(0);
const OFF_REASONS: [&str; 2] = [
    "turned off (IGPROF_KEEPER=0)",
    "qemu-user has no clone(CLONE_VM) without a thread",
];

/// Start-up, before the first [`start`]: `off` says why no keeper may run
/// (an index into the reasons: IGPROF_KEEPER=0, qemu-user), None where
/// one may.
pub fn configure(off: Option<usize>, calls: Calls) {
    FINAL_DUMP.store(calls.final_dump as usize, Ordering::Release);
    SNAPSHOT.store(calls.snapshot_near_limit as usize, Ordering::Release);
    TIMELINE_POINT.store(calls.timeline_point as usize, Ordering::Release);
    GIVE_BACK.store(calls.give_back_code as usize, Ordering::Release);
    OFF_WHY.store(off.unwrap_or(0), Ordering::Relaxed);
    OFF.store(off.is_some() as u32, Ordering::Relaxed);
}

/// [`configure`]'s reasons, by index.
pub const OFF_BY_ENV: usize = 0;
pub const OFF_UNDER_QEMU: usize = 1;

/// Makes this image's keeper (start-up; a fork child; an exec that failed).
/// Returns why there is none, for `-d`.
pub fn start() -> Result<i32, &'static str> {
    let me = sys::getpid();
    // This image's keeper still watches it: a second one would share its
    // stack. (A fork child's copy of the parent's state names another pid.)
    let k = KEEPER.load(Ordering::Acquire);
    if k > 0
        && PROGRAM.load(Ordering::Acquire) == me
        && GEN.load(Ordering::Acquire) != ENDED.load(Ordering::Acquire)
    {
        return Ok(k);
    }
    KEEPER.store(0, Ordering::Release);
    // The new keeper looks for the memory limit again (a fork child's
    // copy of the parent's is not published until it has).
    LIMIT.store(0, Ordering::Release);
    CROSSED.store(0, Ordering::Release);
    limit::forget_pressure();
    crate::base::cgroup::stop_checks();
    if OFF.load(Ordering::Relaxed) != 0 {
        return Err(OFF_REASONS[OFF_WHY.load(Ordering::Relaxed).min(OFF_REASONS.len() - 1)]);
    }
    // Orphans go to the nearest subreaper: if that is the program itself
    // (an init, PR_SET_CHILD_SUBREAPER), the keeper would become a child
    // it can wait for.
    let mut subreaper: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int.
    unsafe {
        libc::prctl(
            libc::PR_GET_CHILD_SUBREAPER,
            &mut subreaper as *mut libc::c_int,
        )
    };
    if me == 1 || subreaper != 0 {
        return Err("the program adopts orphans (an init or a subreaper): it would see the keeper");
    }
    // After an exec that failed, the keeper of the ended generation was
    // told to go (image_ended): its stack is free once it has, else a new
    // one is mapped (and the old one stays, 8 MiB of address space). A
    // fork child's copy of the parent's is free.
    let old = STACK.load(Ordering::Acquire);
    let ended = GEN.load(Ordering::Acquire) == ENDED.load(Ordering::Acquire);
    let stack = if old != 0 && ended && PROGRAM.load(Ordering::Acquire) == me && !exited(k) {
        sys::mmap_anon(STACK_BYTES + SPAWN_STACK_BYTES)
    } else if old != 0 {
        old as *mut u8
    } else {
        sys::mmap_anon(STACK_BYTES + SPAWN_STACK_BYTES)
    };
    if stack.is_null() {
        return Err("no memory for its stack");
    }
    STACK.store(stack as usize, Ordering::Release);
    let gen = GEN.fetch_add(1, Ordering::AcqRel) + 1;
    PROGRAM.store(me, Ordering::Release);
    SPAWN_ERRNO.store(0, Ordering::Release);
    let spawn_top = (stack as usize + STACK_BYTES + SPAWN_STACK_BYTES) & !15;
    let clone = crate::hook::real_clone();
    let _e = sys::ErrnoGuard::save();
    // Made on this thread's CPU, it runs there once we wait (affinity.rs).
    affinity::pin();
    // The intermediate process: shares our memory, exit signal 0 (no
    // SIGCHLD to the program), reaped below.
    // SAFETY: spawn runs on its own stack at spawn_top and only makes raw
    // system calls and the clone below.
    let pid = unsafe {
        clone(
            spawn,
            spawn_top as *mut libc::c_void,
            libc::CLONE_VM,
            gen as usize as *mut libc::c_void,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    };
    affinity::restore();
    if pid <= 0 {
        return Err("clone refused");
    }
    // A "clone" child (exit signal 0); no status wanted.
    sys::reap_own_child(pid, false);
    match KEEPER.load(Ordering::Acquire) {
        0 => Err(match SPAWN_ERRNO.load(Ordering::Acquire) {
            libc::ENOSYS => "this kernel has no pidfd_open (Linux 5.3)",
            _ => "the kernel refused its process",
        }),
        k => Ok(k),
    }
}

/// The intermediate process: opens the program's pidfd (the program is
/// alive: it waits for this process), makes the keeper and exits.
extern "C" fn spawn(arg: *mut libc::c_void) -> libc::c_int {
    let program = PROGRAM.load(Ordering::Acquire);
    // SAFETY: pidfd_open(pid, 0).
    let fd = unsafe { raw::call(libc::SYS_pidfd_open, [program as usize, 0, 0, 0, 0, 0]) };
    if fd < 0 {
        SPAWN_ERRNO.store(-fd as i32, Ordering::Release);
        return 0;
    }
    PIDFD.store(fd as i32, Ordering::Release);
    let stack_top = (STACK.load(Ordering::Acquire) + STACK_BYTES) & !15;
    let clone = crate::hook::real_clone();
    // SAFETY: keep runs on its own stack below ours; glibc's clone touches
    // neither TLS nor errno in the child, and in the parent only on
    // failure, which this process survives by exiting.
    let k = unsafe {
        clone(
            keep,
            stack_top as *mut libc::c_void,
            libc::CLONE_VM,
            arg,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    };
    if k > 0 {
        KEEPER.store(k, Ordering::Release);
    } else {
        SPAWN_ERRNO.store(libc::EAGAIN, Ordering::Release);
    }
    0
}

/// Whether keeper `pid`, told to go, has exited (it runs no more on its
/// stack), waiting for it up to [`EXIT_WAIT_MS`]: it wakes and exits in
/// well under a millisecond. False when that cannot be known (no pidfd
/// before Linux 5.3; its pid reused by another process).
fn exited(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: pidfd_open(pid, 0); the descriptor is closed below.
    let fd = unsafe { raw::call(libc::SYS_pidfd_open, [pid as usize, 0, 0, 0, 0, 0]) } as i32;
    if fd < 0 {
        // Gone and reaped already.
        return fd == -libc::ESRCH;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) of one pollfd on this stack; close(2) of our pidfd.
    let gone = unsafe { libc::poll(&mut p, 1, EXIT_WAIT_MS) } == 1;
    sys::close(fd);
    gone
}

/// How long an exec that failed waits for the old keeper to exit.
const EXIT_WAIT_MS: i32 = 100;

/// The keeper process.
#[link_section = "igprof_hot"]
extern "C" fn keep(arg: *mut libc::c_void) -> libc::c_int {
    let gen = arg as usize as u32;
    let all: u64 = !0;
    // SAFETY: raw system calls with valid pointers into this stack.
    unsafe {
        raw::call(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_SETMASK as usize,
                &all as *const u64 as usize,
                0,
                8,
                0,
                0,
            ],
        );
        raw::call(libc::SYS_setsid, [0; 6]);
        let name = b"igprof-keeper\0";
        raw::call(
            libc::SYS_prctl,
            [
                libc::PR_SET_NAME as usize,
                name.as_ptr() as usize,
                0,
                0,
                0,
                0,
            ],
        );
    }
    let pidfd = PIDFD.load(Ordering::Acquire);
    let stderr = kept_stderr();
    close_all_but(&[pidfd, stderr]);
    let chld: u64 = 1 << (libc::SIGCHLD - 1);
    // SAFETY: signalfd4(-1, mask, 8, SFD_CLOEXEC).
    let sfd = unsafe {
        raw::call(
            libc::SYS_signalfd4,
            [
                usize::MAX,
                &chld as *const u64 as usize,
                8,
                libc::SFD_CLOEXEC as usize,
                0,
                0,
            ],
        )
    } as i32;
    find_memory_limit(PROGRAM.load(Ordering::Acquire));
    let limit = LIMIT.load(Ordering::Acquire);
    let mut step = crate::base::options::get().timeline_ns();
    let mut next_point = monotonic_ns().saturating_add(step);
    let efd = if limit != 0 {
        let (at, n) = thresholds(limit);
        threshold_eventfd(&at[..n])
    } else {
        -1
    };
    let mut pfd = pressure_fd();
    // When the library's code pages go back (0: done).
    let mut give_back_at = monotonic_ns().saturating_add(GIVE_BACK_AFTER_NS);
    loop {
        if ENDED.load(Ordering::Acquire) >= gen {
            raw::exit(0);
        }
        let mut fds = [
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: efd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pfd,
                events: libc::POLLPRI,
                revents: 0,
            },
        ];
        // The watch's interval, the time to the next timeline point, or
        // no timeout.
        let mut wait_ns = if limit != 0 { WATCH_NS } else { u64::MAX };
        if step != 0 {
            wait_ns = wait_ns.min(next_point.saturating_sub(monotonic_ns()));
        }
        if give_back_at != 0 {
            wait_ns = wait_ns.min(give_back_at.saturating_sub(monotonic_ns()));
        }
        let wait = libc::timespec {
            tv_sec: (wait_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (wait_ns % 1_000_000_000) as libc::c_long,
        };
        let timeout = if wait_ns != u64::MAX {
            &wait as *const libc::timespec as usize
        } else {
            0
        };
        // SAFETY: ppoll over four pollfds on this stack (a negative one is
        // skipped); no timeout, or the watch interval, or the time to the
        // next timeline point or to the code pages' return.
        let n = unsafe {
            raw::call(
                libc::SYS_ppoll,
                [fds.as_mut_ptr() as usize, 4, timeout, 0, 0, 0],
            )
        };
        if ENDED.load(Ordering::Acquire) >= gen {
            raw::exit(0);
        }
        if n > 0 && fds[3].revents != 0 {
            if fds[3].revents & libc::POLLPRI != 0 {
                on_pressure(monotonic_ns());
            } else {
                // The trigger is gone (POLLERR): no more pressure watch.
                raw::raw_close(pfd);
                pfd = -1;
            }
        }
        let crossed = n > 0 && fds[2].revents != 0;
        if crossed {
            // The eventfd's counter.
            raw_read(efd, &mut [0u8; 8]);
        }
        if step != 0 && monotonic_ns() >= next_point {
            step = timeline_point(PROGRAM.load(Ordering::Acquire));
            next_point = monotonic_ns().saturating_add(step);
        }
        if give_back_at != 0 && monotonic_ns() >= give_back_at {
            give_back_at = 0;
            // Past a short process's life: the watch of a long one may
            // run on any of the program's CPUs (affinity.rs).
            affinity::restore();
            give_back_code();
        }
        if n == 0 || crossed {
            check_near_limit_from_keeper();
            continue;
        }
        if n > 0 && fds[0].revents != 0 {
            break;
        }
        if n > 0 && fds[1].revents != 0 {
            // One signalfd_siginfo.
            raw_read(sfd, &mut [0u8; 128]);
        }
    }
    // Every thread of the program is gone: its memory is this process's
    // alone, and libc may be used (the TLS and errno are a dead thread's).
    // The dump may run on any CPU the program could (affinity.rs; a
    // keeper of a process that ended within GIVE_BACK_AFTER_NS is still
    // on one).
    affinity::restore();
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(pidfd);
        libc::close(sfd);
        for fd in [efd, pfd] {
            if fd >= 0 {
                libc::close(fd);
            }
        }
    }
    after_death(gen, stderr)
}

/// CLOCK_MONOTONIC in ns (0 if it fails).
#[link_section = "igprof_hot"]
fn monotonic_ns() -> u64 {
    raw::clock_ns(libc::CLOCK_MONOTONIC)
}

/// Adds a timeline point for `program`; the step to the next one (0: no
/// timeline).
fn timeline_point(program: i32) -> u64 {
    let f = TIMELINE_POINT.load(Ordering::Acquire);
    if f == 0 {
        return 0;
    }
    // SAFETY: only Calls::timeline_point is stored in TIMELINE_POINT.
    let f = unsafe { core::mem::transmute::<usize, fn(&[u64; 4]) -> u64>(f) };
    f(&facts::point(program))
}

/// Gives the library's code pages back ([`Calls::give_back_code`]).
#[link_section = "igprof_hot"]
fn give_back_code() {
    let f = GIVE_BACK.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: only Calls::give_back_code is stored in GIVE_BACK.
        let f = unsafe { core::mem::transmute::<usize, fn() -> usize>(f) };
        f();
    }
}

/// A copy of the program's stderr, when it is a terminal or a regular file
/// (holding a pipe or socket would keep its reader from end-of-file); -1
/// otherwise.
fn kept_stderr() -> i32 {
    // SAFETY: a zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: raw fstat(2) into st.
    let r = unsafe {
        raw::call(
            libc::SYS_fstat,
            [2, &mut st as *mut libc::stat as usize, 0, 0, 0, 0],
        )
    };
    let kind = st.st_mode & libc::S_IFMT;
    if r != 0 || (kind != libc::S_IFCHR && kind != libc::S_IFREG) {
        return -1;
    }
    // SAFETY: fcntl(2, F_DUPFD_CLOEXEC, 3).
    let fd = unsafe {
        raw::call(
            libc::SYS_fcntl,
            [2, libc::F_DUPFD_CLOEXEC as usize, 3, 0, 0, 0],
        )
    };
    if fd < 0 {
        -1
    } else {
        fd as i32
    }
}

/// Closes every descriptor but `keep` (negative entries ignored).
fn close_all_but(keep: &[i32]) {
    let mut kept: [u32; 2] = [u32::MAX; 2];
    for (i, &k) in keep.iter().take(2).enumerate() {
        if k >= 0 {
            kept[i] = k as u32;
        }
    }
    kept.sort_unstable();
    let mut from = 0u32;
    for k in kept.iter().copied().chain(core::iter::once(u32::MAX)) {
        if k == u32::MAX {
            close_range(from, u32::MAX);
            break;
        }
        if k > from {
            close_range(from, k - 1);
        }
        from = k + 1;
    }
}

fn close_range(first: u32, last: u32) {
    // SAFETY: close_range(first, last, 0) on this process's own table.
    let r = unsafe {
        raw::call(
            libc::SYS_close_range,
            [first as usize, last as usize, 0, 0, 0, 0],
        )
    };
    if r == -(libc::ENOSYS as isize) {
        // Before Linux 5.9: one by one, as far as descriptors usually go.
        for fd in first..last.min(4096).saturating_add(1) {
            // SAFETY: close(fd).
            unsafe { raw::call(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]) };
        }
    }
}

/// The image ended without its word: write its final profile.
fn after_death(gen: u32, stderr: i32) -> ! {
    let program = PROGRAM.load(Ordering::Acquire);
    sys::stand_for(program);
    crate::base::alloc::owned_by_one_thread();
    crate::base::solo::program_gone();
    // Descriptors 0-2: what a file opened for the dump must not become.
    let null = c"/dev/null";
    // SAFETY: plain opens and dup2 of our own descriptors.
    unsafe {
        for fd in 0..3 {
            let n = libc::open(null.as_ptr(), libc::O_RDWR);
            if n >= 0 && n != fd {
                libc::dup2(n, fd);
                libc::close(n);
            }
        }
        if stderr >= 0 {
            libc::dup2(stderr, 2);
            libc::close(stderr);
        }
    }
    // A lock held by a killed thread would stop the dump for ever: the
    // alarm ends the keeper then (its default action). This process's
    // handlers are copies of the program's, the profiler's own for fatal
    // signals among them, so it is reset first, by system calls: the C
    // library's signal() and pthread_sigmask() are the profiler's hooks,
    // which keep that handler in place (SIGALRM then ran the fatal-signal
    // dump, which waited for the dump under way: the keeper never ended).
    let alrm: u64 = 1 << (libc::SIGALRM - 1);
    // struct kernel_sigaction: handler (SIG_DFL), flags, restorer, mask.
    let dfl = [libc::SIG_DFL, 0, 0, 0];
    // SAFETY: rt_sigaction(SIGALRM, SIG_DFL) and rt_sigprocmask(UNBLOCK)
    // from structs on this stack; alarm has no preconditions.
    unsafe {
        raw::call(
            libc::SYS_rt_sigaction,
            [libc::SIGALRM as usize, dfl.as_ptr() as usize, 0, 8, 0, 0],
        );
        raw::call(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_UNBLOCK as usize,
                &alrm as *const u64 as usize,
                0,
                8,
                0,
                0,
            ],
        );
        libc::alarm(DUMP_LIMIT_S as u32);
    }
    let why = how_it_ended(program, LEFT.load(Ordering::Acquire) == gen);
    if ENDED.load(Ordering::Acquire) < gen {
        let f = FINAL_DUMP.load(Ordering::Acquire);
        if f != 0 {
            // SAFETY: only Calls::final_dump is stored in FINAL_DUMP.
            let f = unsafe { core::mem::transmute::<usize, fn(&str)>(f) };
            f(&why);
        }
    }
    // SAFETY: ends this process (the keeper) only.
    unsafe { libc::_exit(0) }
}

/// How the program ended, from its zombie's /proc/PID/stat (the exit code,
/// the last field) while its parent has not reaped it yet; `left`: the
/// image left its profile to the keeper as it exited (so it ran its exit
/// handlers).
fn how_it_ended(pid: i32, left: bool) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let code = stat
        .rsplit(' ')
        .find(|f| !f.trim().is_empty())
        .and_then(|f| f.trim().parse::<i32>().ok());
    match code {
        Some(c) if c & 0x7f != 0 => format!("death by {}", sys::signal_name(c & 0x7f)),
        Some(c) if left => format!(
            "exit status {} (the process had no descriptor left for it)",
            (c >> 8) & 0xff
        ),
        Some(c) => format!("exit status {} without exit handlers", (c >> 8) & 0xff),
        None => "its end".to_string(),
    }
}

/// The image wrote its final profile, or said why it could not: its keeper
/// has nothing to do. At exec it is told now, so that it lets the old
/// image's memory go; at exit it sees the program end.
pub fn image_ended(exec: bool) {
    ENDED.store(GEN.load(Ordering::Acquire), Ordering::Release);
    let k = KEEPER.load(Ordering::Acquire);
    if exec && k > 0 {
        // SAFETY: kill(keeper, SIGCHLD): the keeper's signalfd wakes. A
        // stray SIGCHLD is ignored by default and harmless to a handler.
        unsafe { libc::syscall(libc::SYS_kill, k, libc::SIGCHLD) };
    }
}

/// The generation whose image left its final profile to its keeper
/// ([`leave_final_dump`]; 0: none).
static LEFT: AtomicU32 = AtomicU32::new(0);

/// The image cannot write its final profile (no descriptor left) and is
/// ending: its keeper, if one watches, writes it once the process has
/// ended. Whether one will.
pub fn leave_final_dump() -> bool {
    if !watching() {
        return false;
    }
    LEFT.store(GEN.load(Ordering::Acquire), Ordering::Release);
    true
}

/// Whether a keeper watches this image (it writes the profile if the
/// image dies without writing it).
pub fn watching() -> bool {
    KEEPER.load(Ordering::Acquire) > 0
        && ENDED.load(Ordering::Acquire) < GEN.load(Ordering::Acquire)
}
