//! Holding a running process still with ptrace, and calling a function in
//! it: every thread seized and stopped ([`Stopped::all`]), one thread's
//! registers and vector state saved, a call run there on its own stack
//! (returning to address 0, whose fault brings the thread back to us), the
//! registers put back, every thread let go as it was ([`Stopped::release`]).
//!
//! x86-64 only (`igprof --attach` refuses elsewhere before coming here).
//!
//! What it owns: the ptrace requests and the waits, the signals that
//! arrive meanwhile (delivered as they would have been), reading and
//! writing the process's memory.
//!
//! What it must never do: leave a thread stopped or traced, lose a signal
//! meant for the program, or resume a thread with registers other than
//! its own (a syscall it was in restarts as after any signal).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One stopped thread.
struct Thread {
    /// Its registers when stopped, put back on release.
    regs: libc::user_regs_struct,
}

/// Every thread of a process, seized and stopped.
pub struct Stopped {
    pub pid: i32,
    threads: BTreeMap<i32, Thread>,
}

/// A call's result, or why it has none.
pub type CallResult = Result<u64, String>;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn tids(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// How a wait for one thread ended.
enum Stop {
    /// A ptrace event stop (our interrupt, or a group stop).
    Event,
    /// A signal is about to be delivered to the thread.
    Signal(i32),
    /// The thread is gone.
    Gone,
}

fn wait_for(tid: i32, deadline: Option<Instant>) -> Result<Stop, String> {
    let mut status = 0;
    loop {
        let flags = libc::__WALL | if deadline.is_some() { libc::WNOHANG } else { 0 };
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, flags) };
        if r == tid {
            break;
        }
        if r == 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err("timeout".into());
            }
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        if errno() == libc::EINTR {
            continue;
        }
        return Ok(Stop::Gone);
    }
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Ok(Stop::Gone);
    }
    if (status >> 16) == libc::PTRACE_EVENT_STOP {
        return Ok(Stop::Event);
    }
    Ok(Stop::Signal(libc::WSTOPSIG(status)))
}

fn request(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> Result<(), i32> {
    // SAFETY: the requests used here take plain values or pointers to
    // buffers owned by the caller, of the size the request needs.
    let r = unsafe {
        libc::ptrace(
            req,
            tid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn get_regs(tid: i32) -> Result<libc::user_regs_struct, i32> {
    // SAFETY: all-zero is a valid user_regs_struct.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    request(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _ as usize)?;
    Ok(regs)
}

fn set_regs(tid: i32, regs: &libc::user_regs_struct) -> Result<(), i32> {
    request(libc::PTRACE_SETREGS, tid, 0, regs as *const _ as usize)
}

/// NT_X86_XSTATE: the vector registers, AVX and AVX-512 included.
const NT_X86_XSTATE: usize = 0x202;

fn get_xstate(tid: i32) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; 16 << 10];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    request(
        libc::PTRACE_GETREGSET,
        tid,
        NT_X86_XSTATE,
        &mut iov as *mut _ as usize,
    )?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

fn set_xstate(tid: i32, state: &[u8]) -> Result<(), i32> {
    let mut iov = libc::iovec {
        iov_base: state.as_ptr() as *mut libc::c_void,
        iov_len: state.len(),
    };
    request(
        libc::PTRACE_SETREGSET,
        tid,
        NT_X86_XSTATE,
        &mut iov as *mut _ as usize,
    )
}

/// Why seizing failed, in words for the refusal line.
pub fn seize_error(pid: i32, e: i32) -> String {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match e {
        libc::EPERM if scope >= 3 => format!(
            "cannot trace process {pid}: kernel.yama.ptrace_scope is {scope} (no process may be traced until reboot)"
        ),
        libc::EPERM if scope == 2 && !root => format!(
            "cannot trace process {pid}: kernel.yama.ptrace_scope is 2 (only root may): run igprof --attach as root"
        ),
        libc::EPERM if scope == 1 && !root => format!(
            "cannot trace process {pid}: kernel.yama.ptrace_scope is 1 (only a parent may trace): run as root, or sysctl kernel.yama.ptrace_scope=0"
        ),
        libc::EPERM => format!(
            "cannot trace process {pid}: no permission (another user's process, or no CAP_SYS_PTRACE here): run igprof --attach as its user or root"
        ),
        libc::ESRCH => format!("no process {pid}"),
        e => format!(
            "cannot trace process {pid}: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

impl Stopped {
    /// Seizes and stops every thread of `pid` (threads made meanwhile too).
    pub fn all(pid: i32) -> Result<Stopped, String> {
        let mut s = Stopped {
            pid,
            threads: BTreeMap::new(),
        };
        let mut seized = std::collections::BTreeSet::new();
        loop {
            let new: Vec<i32> = tids(pid)
                .into_iter()
                .filter(|t| !seized.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            // All interrupted first, then waited for: they stop in
            // parallel (a busy machine takes a while to run each).
            let mut asked = Vec::with_capacity(new.len());
            for tid in new {
                if let Err(e) = request(libc::PTRACE_SEIZE, tid, 0, 0) {
                    if e == libc::ESRCH && tid != pid {
                        continue;
                    }
                    s.release();
                    return Err(seize_error(pid, e));
                }
                seized.insert(tid);
                if request(libc::PTRACE_INTERRUPT, tid, 0, 0).is_ok() {
                    asked.push(tid);
                }
            }
            for tid in asked {
                if let Some(t) = s.wait_stopped(tid)? {
                    s.threads.insert(tid, t);
                }
            }
        }
        if s.threads.is_empty() {
            return Err(format!("no process {pid}"));
        }
        Ok(s)
    }

    /// Waits for the stop of a thread asked to stop (PTRACE_INTERRUPT);
    /// signals that arrive first are delivered on the way.
    fn wait_stopped(&mut self, tid: i32) -> Result<Option<Thread>, String> {
        loop {
            match wait_for(tid, None)? {
                Stop::Gone => return Ok(None),
                Stop::Event => break,
                Stop::Signal(sig) => {
                    // The signal goes to the program, as it would have;
                    // the interrupt then stops the thread.
                    if request(libc::PTRACE_CONT, tid, 0, sig as usize).is_err() {
                        return Ok(None);
                    }
                }
            }
        }
        match get_regs(tid) {
            Ok(regs) => Ok(Some(Thread { regs })),
            Err(_) => Ok(None),
        }
    }

    /// Every stopped thread: (id, thread pointer, next instruction), as
    /// `igprof_attach` takes them.
    pub fn threads(&self) -> Vec<[u64; 3]> {
        self.threads
            .iter()
            .map(|(&tid, t)| [tid as u64, t.regs.fs_base, t.regs.rip])
            .collect()
    }

    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// The thread calls run on: the main thread if it still runs.
    fn caller(&self) -> Option<i32> {
        if self.threads.contains_key(&self.pid) && !zombie(self.pid) {
            Some(self.pid)
        } else {
            self.threads.keys().copied().find(|&t| !zombie(t))
        }
    }

    /// Calls `func(args...)` in the process on one stopped thread, with
    /// `data` copied onto that thread's stack first: `args` may name
    /// [`DATA`]-relative addresses (see [`data_arg`]). Returns rax.
    pub fn call(&mut self, func: u64, args: &[u64], data: &[u8]) -> CallResult {
        self.call_in_out(func, args, data).map(|(r, _)| r)
    }

    /// [`Stopped::call`], also returning the call's data as the call left it.
    pub fn call_in_out(
        &mut self,
        func: u64,
        args: &[u64],
        data: &[u8],
    ) -> Result<(u64, Vec<u8>), String> {
        let tid = self
            .caller()
            .ok_or("no thread of the process can run a call")?;
        let saved = self.threads[&tid].regs;
        let xstate =
            get_xstate(tid).map_err(|e| format!("cannot read vector registers: errno {e}"))?;
        // Below the red zone, 16-aligned, the data; then the return address.
        let data_at = (saved.rsp - 4096 - data.len() as u64) & !15;
        write_mem(self.pid, data_at, data)?;
        let sp = data_at - 8;
        write_mem(self.pid, sp, &0u64.to_le_bytes())?;
        let mut regs = saved;
        regs.rip = func;
        regs.rsp = sp;
        regs.rax = 0;
        // Not inside a system call: no restart when the thread goes on.
        regs.orig_rax = u64::MAX;
        let reg = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (r, &a) in reg.into_iter().zip(args) {
            *r = if a & DATA_TAG != 0 {
                data_at + (a & !DATA_TAG)
            } else {
                a
            };
        }
        set_regs(tid, &regs).map_err(|e| format!("cannot set registers: errno {e}"))?;
        let result = self.run_call(tid);
        // The thread's own registers back, whatever happened.
        let _ = set_regs(tid, &saved);
        let _ = set_xstate(tid, &xstate);
        let r = result?;
        Ok((r, read_mem(self.pid, data_at, data.len())?))
    }

    /// Thread `tid` goes on at `pc` when let go (moved out of the bytes a
    /// patch covers, to the same instruction in its trampoline).
    pub fn move_to(&mut self, tid: i32, pc: u64) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.regs.rip = pc;
            let _ = set_regs(tid, &t.regs);
        }
    }

    /// Lets the calling thread run until it returns to address 0; signals
    /// for it meanwhile are delivered. When the call takes long (the other
    /// threads may hold a lock it needs), they run meanwhile, and are
    /// stopped again after.
    fn run_call(&mut self, tid: i32) -> CallResult {
        request(libc::PTRACE_CONT, tid, 0, 0).map_err(|e| format!("cannot resume: errno {e}"))?;
        let mut deadline = Some(Instant::now() + Duration::from_secs(2));
        let mut others_running = false;
        let outcome = loop {
            let stop = match wait_for(tid, deadline) {
                Ok(s) => s,
                Err(_) => {
                    // Probably a lock held by a stopped thread: let them go.
                    deadline = Some(Instant::now() + Duration::from_secs(60));
                    if others_running {
                        break Err("the call in the process did not return within a minute".into());
                    }
                    others_running = true;
                    for (&t, _) in self.threads.iter().filter(|(&t, _)| t != tid) {
                        let _ = request(libc::PTRACE_CONT, t, 0, 0);
                    }
                    continue;
                }
            };
            match stop {
                Stop::Gone => break Err("the process ended during the call".into()),
                Stop::Event => {
                    let _ = request(libc::PTRACE_CONT, tid, 0, 0);
                }
                Stop::Signal(sig) => {
                    let regs = get_regs(tid).map_err(|e| format!("errno {e}"))?;
                    if sig == libc::SIGSEGV && regs.rip == 0 {
                        break Ok(regs.rax);
                    }
                    if sig == libc::SIGSEGV || sig == libc::SIGBUS || sig == libc::SIGILL {
                        break Err(format!(
                            "the call faulted in the process (signal {sig} at {:#x}); its registers were restored",
                            regs.rip
                        ));
                    }
                    let _ = request(libc::PTRACE_CONT, tid, 0, sig as usize);
                }
            }
        };
        if others_running {
            let others: Vec<i32> = self.threads.keys().copied().filter(|&t| t != tid).collect();
            let asked: Vec<i32> = others
                .iter()
                .copied()
                .filter(|&t| request(libc::PTRACE_INTERRUPT, t, 0, 0).is_ok())
                .collect();
            for t in others {
                let th = if asked.contains(&t) {
                    self.wait_stopped(t)?
                } else {
                    None
                };
                match th {
                    Some(th) => {
                        self.threads.insert(t, th);
                    }
                    None => {
                        self.threads.remove(&t);
                    }
                }
            }
        }
        outcome
    }

    /// Lets every thread go on as it was (registers as stopped).
    pub fn release(&mut self) {
        for (&tid, t) in &self.threads {
            let _ = set_regs(tid, &t.regs);
            let _ = request(libc::PTRACE_DETACH, tid, 0, 0);
        }
        self.threads.clear();
    }

    /// As [`Stopped::release`], after a detach: a sample the profiler's
    /// samplers (now stopped) sent a thread just before they stopped would
    /// meet the program's own action on the signal (SIGTRAP's default ends
    /// the process). So the threads first run on, still traced, for
    /// [`DRAIN`]: a SIGTRAP from a perf event (TRAP_PERF) or a SIGPROF from
    /// a POSIX timer that reaches one then is taken away, any other signal
    /// delivered; then each is stopped again and let go.
    pub fn release_without_samples(&mut self) {
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for &tid in &tids {
            let regs = self.threads[&tid].regs;
            let _ = set_regs(tid, &regs);
            let _ = request(libc::PTRACE_CONT, tid, 0, 0);
        }
        let end = Instant::now() + DRAIN;
        let mut status = 0;
        while Instant::now() < end {
            // SAFETY: status is a valid out pointer.
            let t = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
            if t <= 0 {
                if t < 0 && errno() != libc::EINTR {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            self.pass_on(t, status);
        }
        let asked: Vec<i32> = tids
            .into_iter()
            .filter(|&tid| request(libc::PTRACE_INTERRUPT, tid, 0, 0).is_ok())
            .collect();
        for tid in asked {
            loop {
                match wait_for(tid, Some(Instant::now() + Duration::from_secs(2))) {
                    Ok(Stop::Signal(sig)) => {
                        let sig = if is_sample(tid, sig) { 0 } else { sig };
                        // Delivered (or not) as it goes: the interrupt
                        // stops it next.
                        let _ = request(libc::PTRACE_CONT, tid, 0, sig as usize);
                    }
                    Ok(Stop::Event) => {
                        let _ = request(libc::PTRACE_DETACH, tid, 0, 0);
                        break;
                    }
                    _ => break,
                }
            }
        }
        self.threads.clear();
    }

    /// A stop of a thread running on while the samples drain: passed on.
    fn pass_on(&self, tid: i32, status: i32) {
        if !libc::WIFSTOPPED(status) {
            return;
        }
        let sig = libc::WSTOPSIG(status);
        let deliver = if (status >> 16) != 0 || is_sample(tid, sig) {
            0
        } else {
            sig
        };
        let _ = request(libc::PTRACE_CONT, tid, 0, deliver as usize);
    }

    /// Lets the threads run for `d`, then stops them all again.
    pub fn pause(mut self, d: Duration) -> Result<Stopped, String> {
        let pid = self.pid;
        self.release();
        std::thread::sleep(d);
        Stopped::all(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.release();
    }
}

/// Marks a call argument as an offset into the call's data.
const DATA_TAG: u64 = 1 << 63;

/// The address, in the process, of byte `off` of the call's data.
pub fn data_arg(off: usize) -> u64 {
    DATA_TAG | off as u64
}

/// How long threads run on, still traced, after a detach (see
/// [`Stopped::release_without_samples`]).
const DRAIN: Duration = Duration::from_millis(30);

/// SIGTRAP's si_code from a perf event's sigtrap.
const TRAP_PERF: i32 = 6;

/// Whether the signal `sig` thread `tid` is stopped with is a sample.
fn is_sample(tid: i32, sig: i32) -> bool {
    // SAFETY: all-zero is a valid siginfo_t; the kernel fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    if request(
        libc::PTRACE_GETSIGINFO,
        tid,
        0,
        &mut info as *mut _ as usize,
    )
    .is_err()
    {
        return false;
    }
    (sig == libc::SIGTRAP && info.si_code == TRAP_PERF)
        || (sig == libc::SIGPROF && info.si_code == libc::SI_TIMER)
}

fn zombie(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Writes `bytes` at `addr` in process `pid` (its writable memory).
pub fn write_mem(pid: i32, addr: u64, bytes: &[u8]) -> Result<(), String> {
    let local = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: both iovecs describe valid buffers of the given length (the
    // remote one in the other process, checked by the kernel).
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n as usize != bytes.len() {
        return Err(format!(
            "cannot write the process's memory at {addr:#x}: errno {}",
            errno()
        ));
    }
    Ok(())
}

/// Reads `len` bytes at `addr` in process `pid`.
pub fn read_mem(pid: i32, addr: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: as in write_mem.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n as usize != len {
        return Err(format!(
            "cannot read the process's memory at {addr:#x}: errno {}",
            errno()
        ));
    }
    Ok(buf)
}
