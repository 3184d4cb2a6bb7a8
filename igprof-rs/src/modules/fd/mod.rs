//! The file-descriptor profiler (-fd): FD_USED and FD_LIVE.
//!
//! Owns the descriptor hooks ([`hooks`]) and what an acquire or release does
//! to the counters. FD_USED is (descriptors created, same, same) per
//! creating stack; FD_LIVE is (open now, open now, per-stack peak), and a
//! descriptor closed by another thread is released from the stack that
//! created it (the live table [`crate::base::live::LiveFds`] remembers it).
//!
//! Released, besides close/fclose: a descriptor that dup2/dup3 replaces (the
//! *new* one, which IgProf got wrong), every descriptor in a close_range
//! (unless CLOSE_RANGE_CLOEXEC), and, at exec, every descriptor with
//! FD_CLOEXEC set (they are gone in the new image; the profile written at
//! exec shows them closed). pipe, pipe2 and socketpair create two.
//!
//! Must never: allocate, lock, or change a call's result or errno.

pub mod hooks;

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::counters::{self, CounterId};
use crate::base::live::LiveFds;
use crate::base::thread::Guard;
use crate::base::tree::{Counter, Node};
use crate::modules::mem::journal::{self, Family};
use crate::modules::StartError;

/// Descriptors open now and their creating nodes.
pub static LIVE: LiveFds = LiveFds::new();

const NONE: usize = usize::MAX;
static USED: AtomicUsize = AtomicUsize::new(NONE);
static LIVE_SLOT: AtomicUsize = AtomicUsize::new(NONE);

/// Enables FD_USED and FD_LIVE when -fd was asked for.
pub fn register_counters() {
    if crate::base::options::get().fd {
        counters::enable(CounterId::FdUsed);
        counters::enable(CounterId::FdLive);
    }
}

pub fn init_slots() {
    USED.store(
        counters::slot(CounterId::FdUsed).unwrap_or(NONE),
        Ordering::Relaxed,
    );
    LIVE_SLOT.store(
        counters::slot(CounterId::FdLive).unwrap_or(NONE),
        Ordering::Relaxed,
    );
}

/// Whether the descriptor hooks are needed in this run.
pub fn wanted() -> bool {
    crate::base::options::get().fd
}

/// The descriptor profiler in the runtime's module registry.
pub const MODULE: crate::modules::Module = crate::modules::Module {
    describe: |_| Some("file descriptors (FD_USED, FD_LIVE)".into()),
    register_counters: |_| register_counters(),
    start: |_| start(),
    thread_end: Some(|_| crate::modules::mem::site::release_thread_extras()),
    left_by_jump: Some(crate::modules::mem::site::jumped_out),
    fork_child: Some(reset_after_fork),
    before_exec: Some(before_exec),
    leaks: Some(leaks),
    ..crate::modules::Module::new("-fd", |o| o.fd)
};

#[inline]
fn counter(node: *const Node, slot: usize) -> Option<&'static Counter> {
    if slot == NONE || node.is_null() {
        return None;
    }
    // SAFETY: nodes are never freed; slot < nslots.
    Some(unsafe { &*node }.counter(slot))
}

/// `fd` was created by the stack of `node` (owner thread, inside profiler
/// code: `_held`).
pub fn acquire(_held: &Guard, node: *mut Node, fd: i32) {
    if let Some(c) = counter(node, USED.load(Ordering::Relaxed)) {
        c.tick(1);
    }
    match LIVE.acquire(fd, node) {
        Ok(replaced) => {
            // A descriptor whose close we did not see (raw syscall, or
            // replaced behind our back): it is gone now.
            if let Some(c) = counter(replaced, LIVE_SLOT.load(Ordering::Relaxed)) {
                c.release_shared(1);
                if journal::on() {
                    journal::free(Family::Descriptors, replaced, fd as usize, 1, 1);
                }
            }
            if let Some(c) = counter(node, LIVE_SLOT.load(Ordering::Relaxed)) {
                c.tick_shared(1);
            }
            if journal::on() {
                journal::alloc(Family::Descriptors, node, fd as usize, 1, 1, 0);
            }
        }
        Err(_) => {
            crate::modules::mem::site::LOST.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `fd` is being closed (any thread): released from its creating stack.
#[inline]
pub fn release(fd: i32) {
    let n = LIVE.release(fd);
    if let Some(c) = counter(n, LIVE_SLOT.load(Ordering::Relaxed)) {
        c.release_shared(1);
        if journal::on() {
            journal::free(Family::Descriptors, n, fd as usize, 1, 1);
        }
    }
}

/// Deferred-event kinds of this module.
pub const KIND_ACQUIRE: u8 = 16;
pub const KIND_RELEASE: u8 = 17;

/// Replays one deferred descriptor event.
pub fn replay(g: &Guard, node: *mut Node, kind: u8, a: usize, _b: u64) {
    match kind {
        KIND_ACQUIRE => acquire(g, node, a as i32),
        KIND_RELEASE => release(a as i32),
        _ => {}
    }
}

/// Before exec: descriptors marked close-on-exec are released (they do not
/// survive into the new image).
pub fn before_exec() {
    if !wanted() {
        return;
    }
    let mut closing: Vec<i32> = Vec::new();
    LIVE.for_each(usize::MAX, |fd, _| {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFD) };
        if fl >= 0 && fl as i32 & libc::FD_CLOEXEC != 0 {
            closing.push(fd);
        }
    });
    for fd in closing {
        release(fd);
    }
}

/// In a forked child: the parent's descriptors belong to the parent's profile.
pub fn reset_after_fork() {
    if !crate::base::run::fork_keeps_tables() {
        LIVE.reset();
    }
    crate::modules::mem::site::spare_after_fork();
}

/// Slots, live table, hooks (start-up, guard held).
fn start() -> Result<(), StartError> {
    init_slots();
    crate::modules::mem::site::init_libc_range();
    // The hard limit: the program may raise its soft limit up to it later.
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid out-pointer (start-up, not signal context).
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_max.min(1 << 24) as usize
    } else {
        crate::sys::nofile_limit().min(1 << 24) as usize
    };
    LIVE.init(limit).map_err(StartError::refused)?;
    hooks::install();
    Ok(())
}

/// Open descriptors for `LK` records under FD_LIVE: (fd, 1) as IgProf.
pub fn leaks(f: &mut dyn FnMut(*const Node, usize, u64, u64)) {
    let slot = LIVE_SLOT.load(Ordering::Relaxed);
    if slot == NONE {
        return;
    }
    LIVE.for_each(usize::MAX, |fd, n| f(n, slot, fd as u64, 1));
}
