//! Which stopped thread a call in the process should run on.
//!
//! A thread stopped wherever it was may be inside `malloc` with its arena
//! locked, or inside the profiler with one of its spin locks held. A call
//! made on that same thread (`dlopen`, `igprof_attach`, the detach's
//! profile writing) then waits for a lock its own interrupted code holds:
//! letting the other threads run cannot free it, and the call never
//! returns. A thread asleep in a system call that only waits (for a
//! descriptor, a child, a time, a signal, or a futex of the program's own
//! data) holds none of those locks: glibc takes none across such a wait,
//! nor does the profiler. Such a thread is chosen first, the main thread
//! before others; a thread other than the main one also needs room on its
//! stack, since the call runs there. A futex wait comes after the other
//! waits: a program's own allocator (jemalloc, PartitionAlloc) may wait
//! for one of its locks while holding another, and the call allocates.
//!
//! Where no thread waits so (every thread busy allocating), the one chosen
//! is first run on alone until it has left the C library's, the loader's
//! and the profiler's code ([`leave_runtime`]; the stepping is
//! `Stopped::ready_caller`'s): in its own code it holds none of their
//! locks.
//!
//! What it owns: that choice's rules, read from the threads' registers at
//! their stop and from `/proc/PID/maps`.
//!
//! What it must never do: touch the process (it only reads its map).

/// What a stopped thread's registers say about where it stopped.
#[derive(Debug, Clone, Copy)]
pub struct At {
    /// The system call it is in or has just made (`orig_rax`), negative
    /// when it stopped in its own code.
    pub syscall: i64,
    /// The system call's first two arguments (rdi, rsi).
    pub args: [u64; 2],
    /// Its stack pointer.
    pub sp: u64,
    /// Its next instruction.
    pub pc: u64,
    /// The system call's result so far (`rax`): one of [`INTERRUPTED`]
    /// while the call sleeps.
    pub ret: i64,
}

/// The results of a system call a stop interrupted: the kernel's restart
/// codes (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND,
/// ERESTART_RESTARTBLOCK), and EINTR, which `epoll_wait` and `poll`
/// return for any stop and their callers retry.
const INTERRUPTED: [i64; 5] = [-512, -513, -514, -516, -(libc::EINTR as i64)];

/// Whether a thread stopped at `at` should first run on alone until it
/// leaves the runtime's code: it is at an instruction of the C library,
/// the loader or the profiler (`profiler`: its mapped path), and not
/// asleep in a system call there (a sleeper would not move; it waits for
/// something, not inside a lock's critical section).
pub fn leave_runtime(at: &At, maps: &[Mapping], profiler: Option<&str>) -> bool {
    let asleep = at.syscall >= 0 && INTERRUPTED.contains(&at.ret);
    !asleep && in_runtime(at.pc, maps, profiler)
}

/// Room below the stack pointer a thread other than the main one needs
/// for a call: the call's data, `dlopen`, the library's start.
pub const STACK_ROOM: u64 = 256 << 10;

/// One mapping of the process: its range and file, if any.
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub path: Option<String>,
}

/// The mappings of `/proc/PID/maps`'s text.
pub fn mappings(maps: &str) -> Vec<Mapping> {
    maps.lines()
        .filter_map(|line| {
            let (range, _) = line.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                path: crate::sys::maps_line_path(line).map(str::to_string),
            })
        })
        .collect()
}

/// How safe a thread stopped at `at` is to call on (see the module's
/// doc), lower first: 0 asleep in a wait that is not a futex's, 1 in a
/// futex wait on the program's own data; None where it may hold a lock
/// the call needs, or lacks the stack. `main`: it is the main thread,
/// whose stack grows. `profiler`: the profiler library's mapped path,
/// when it is loaded.
pub fn rank(at: &At, main: bool, maps: &[Mapping], profiler: Option<&str>) -> Option<u8> {
    let rank = match at.syscall {
        libc::SYS_epoll_wait
        | libc::SYS_epoll_pwait
        | libc::SYS_epoll_pwait2
        | libc::SYS_poll
        | libc::SYS_ppoll
        | libc::SYS_select
        | libc::SYS_pselect6
        | libc::SYS_nanosleep
        | libc::SYS_clock_nanosleep
        | libc::SYS_wait4
        | libc::SYS_waitid
        | libc::SYS_pause
        | libc::SYS_rt_sigsuspend
        | libc::SYS_rt_sigtimedwait
        | libc::SYS_accept
        | libc::SYS_accept4 => 0,
        libc::SYS_futex => {
            let op = at.args[1] as i32 & libc::FUTEX_CMD_MASK;
            let waits = op == libc::FUTEX_WAIT || op == libc::FUTEX_WAIT_BITSET;
            if !waits || in_runtime(at.args[0], maps, profiler) {
                return None;
            }
            1
        }
        _ => return None,
    };
    (main || stack_room(at.sp, maps) >= STACK_ROOM).then_some(rank)
}

/// Whether `addr` lies in a mapping of the C library, the loader, or the
/// profiler: a futex there is one of their locks (the malloc arena's, the
/// loader's, the profiler's back-off), which a thread may wait on while
/// holding another of theirs; an instruction there may be inside one of
/// their critical sections.
fn in_runtime(addr: u64, maps: &[Mapping], profiler: Option<&str>) -> bool {
    let Some(m) = maps.iter().find(|m| m.start <= addr && addr < m.end) else {
        return false;
    };
    let Some(path) = m.path.as_deref() else {
        return false;
    };
    let name = path.rsplit('/').next().unwrap_or(path);
    Some(path) == profiler
        || ["libc.so", "libc-", "ld-linux", "libpthread"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// Bytes of the mapping that holds `sp`, below it (0 when none holds it).
fn stack_room(sp: u64, maps: &[Mapping]) -> u64 {
    maps.iter()
        .find(|m| m.start <= sp && sp < m.end)
        .map_or(0, |m| sp - m.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0a0000000-55d0a0100000 r-xp 00000000 08:01 1234 /usr/bin/node
7f0000000000-7f0000800000 rw-p 00000000 00:00 0 
7f1000000000-7f1000001000 ---p 00000000 00:00 0 
7f1000001000-7f1000801000 rw-p 00000000 00:00 0 
7f2000000000-7f2000200000 rw-p 001d0000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f3000000000-7f3000300000 rw-p 00200000 08:01 77 /opt/my igprof/lib/libprof copy.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

    fn at(syscall: i64, args: [u64; 2], sp: u64) -> At {
        At {
            syscall,
            args,
            sp,
            pc: 0x55d0_a000_1000,
            ret: 0,
        }
    }

    #[test]
    fn a_thread_inside_libc_leaves_it_first_unless_it_sleeps_there() {
        let maps = mappings(MAPS);
        let lib = Some("/opt/my igprof/lib/libprof copy.so");
        let in_malloc = At {
            pc: 0x7f20_0000_0100,
            ..at(-1, [0, 0], 0x7ffd_0002_0000)
        };
        assert!(leave_runtime(&in_malloc, &maps, lib));
        let in_profiler = At {
            pc: 0x7f30_0000_0100,
            ..in_malloc
        };
        assert!(leave_runtime(&in_profiler, &maps, lib));
        // Its own code; asleep in read() inside libc; just back from mmap.
        assert!(!leave_runtime(
            &at(-1, [0, 0], 0x7ffd_0002_0000),
            &maps,
            lib
        ));
        let reading = At {
            syscall: libc::SYS_read,
            ret: -512,
            ..in_malloc
        };
        assert!(!leave_runtime(&reading, &maps, lib));
        // epoll_wait answers any stop with EINTR, and is called again.
        let polling = At {
            syscall: libc::SYS_epoll_pwait,
            ret: -(libc::EINTR as i64),
            ..in_malloc
        };
        assert!(!leave_runtime(&polling, &maps, lib));
        let mapped = At {
            syscall: libc::SYS_mmap,
            ret: 0x7f00_0000_0000,
            ..in_malloc
        };
        assert!(leave_runtime(&mapped, &maps, lib));
    }

    #[test]
    fn a_futex_wait_on_the_programs_own_data_comes_after_other_waits() {
        let maps = mappings(MAPS);
        let lib = Some("/opt/my igprof/lib/libprof copy.so");
        // A condition variable on the heap, a thread with 8 MiB of stack.
        let cond = at(
            libc::SYS_futex,
            [
                0x7f00_0000_1000,
                (libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG) as u64,
            ],
            0x7f10_0080_0000,
        );
        assert_eq!(rank(&cond, false, &maps, lib), Some(1));
        // The malloc arena's lock in libc's data, the profiler's back-off.
        let arena = At {
            args: [0x7f20_0000_3c60, cond.args[1]],
            ..cond
        };
        assert_eq!(rank(&arena, false, &maps, lib), None);
        let back_off = At {
            args: [0x7f30_0000_b298, cond.args[1]],
            ..cond
        };
        assert_eq!(rank(&back_off, false, &maps, lib), None);
        // A wake is no wait.
        let wake = At {
            args: [cond.args[0], libc::FUTEX_WAKE as u64],
            ..cond
        };
        assert_eq!(rank(&wake, false, &maps, lib), None);
    }

    #[test]
    fn stopped_in_its_own_code_or_in_mmap_is_never_called_on() {
        let maps = mappings(MAPS);
        assert_eq!(
            rank(&at(-1, [0, 0], 0x7ffd_0002_0000), true, &maps, None),
            None
        );
        let mmap = at(libc::SYS_mmap, [0, 4096], 0x7ffd_0002_0000);
        assert_eq!(rank(&mmap, true, &maps, None), None);
        let epoll = at(libc::SYS_epoll_wait, [3, 0], 0x7ffd_0002_0000);
        assert_eq!(rank(&epoll, true, &maps, None), Some(0));
    }

    #[test]
    fn another_thread_needs_room_on_its_stack() {
        let maps = mappings(MAPS);
        let near_guard = at(libc::SYS_nanosleep, [0, 0], 0x7f10_0000_9000);
        assert_eq!(rank(&near_guard, false, &maps, None), None);
        // The main thread's stack grows.
        let main = at(libc::SYS_nanosleep, [0, 0], 0x7ffd_0000_9000);
        assert_eq!(rank(&main, true, &maps, None), Some(0));
        let roomy = at(libc::SYS_nanosleep, [0, 0], 0x7f10_0080_0000);
        assert_eq!(rank(&roomy, false, &maps, None), Some(0));
    }
}
