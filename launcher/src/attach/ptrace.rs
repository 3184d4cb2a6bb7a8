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
    /// Set for calls that patch code: the other threads never run during
    /// them (a call that takes long is waited for; it must wait for no
    /// lock another thread may hold).
    pub hold_others: bool,
    /// Threads calls no longer go to ([`Stopped::avoid_caller`]).
    avoid: std::collections::BTreeSet<i32>,
    /// The library's flags that govern the other threads' running during
    /// a call ([`Gate`]).
    pub gate: Option<Gate>,
    /// Where, in the call's data, the library writes each move of a
    /// stopped thread out of a patch's bytes (offset of its array of
    /// (tid, thread pointer, pc)), and the array as sent: applied before
    /// the other threads are let run.
    pub moves: Option<(usize, Vec<[u64; 3]>)>,
    /// The thread [`Stopped::ready_caller`] has run out of the runtime's
    /// code in this stop: not run again, so that the places the attach
    /// read after it stay true.
    readied: Option<i32>,
    /// The current call's data, in the process.
    data_at: u64,
    /// Whether the other threads ran during the last call.
    pub others_ran: bool,
    /// How long the other threads ran during calls, in all (not time they
    /// were stopped: the attach and detach lines leave it out), and since
    /// when they run, while they do.
    pub ran: Duration,
    ran_from: Option<Instant>,
    /// The profiler library's path as the process maps it, once loaded
    /// (see [`super::caller`]).
    pub library: Option<String>,
}

/// Addresses, in the process, of the library's flags for a call during
/// which the other threads run.
#[derive(Clone, Copy)]
pub struct Gate {
    /// `igprof_attach_others_ran` (its hook module): set before the other
    /// threads are let run, so that no code is written from then on.
    pub others_ran: u64,
    /// `igprof_attach_patching`: 1 while code is being written.
    pub patching: u64,
    /// `igprof_attach_restop` (process/attach.rs): 1 when the call asks
    /// for the other threads to be stopped again before it returns; 2
    /// answers that they are, 3 that they could not be.
    pub restop: u64,
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
    let mut polls = 0u32;
    loop {
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            break;
        }
        if r == 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err("timeout".into());
            }
            // A process killed meanwhile leaves its main thread a zombie
            // that is never reported while its other threads are traced.
            polls += 1;
            if polls.is_multiple_of(100) && zombie(tid) {
                return Ok(Stop::Gone);
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

/// A ptrace request's type in the C library's declaration: glibc's enum
/// (`c_uint`), musl's `int`.
#[cfg(not(target_env = "musl"))]
type Request = libc::c_uint;
#[cfg(target_env = "musl")]
type Request = libc::c_int;

/// The kernel's numbers of the signal-mask requests (`libc` declares them
/// `c_uint` for musl too).
const PTRACE_GETSIGMASK: Request = 0x420a;
const PTRACE_SETSIGMASK: Request = 0x420b;

fn request(req: Request, tid: i32, addr: usize, data: usize) -> Result<(), i32> {
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

/// The synchronous fault signals, never blocked by a call's mask.
const FAULTS: u64 = (1 << (libc::SIGSEGV - 1))
    | (1 << (libc::SIGBUS - 1))
    | (1 << (libc::SIGILL - 1))
    | (1 << (libc::SIGFPE - 1));

fn get_sigmask(tid: i32) -> Result<u64, i32> {
    let mut mask = 0u64;
    request(PTRACE_GETSIGMASK, tid, 8, &mut mask as *mut u64 as usize)?;
    Ok(mask)
}

fn set_sigmask(tid: i32, mask: u64) -> Result<(), i32> {
    request(PTRACE_SETSIGMASK, tid, 8, &mask as *const u64 as usize)
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
            hold_others: false,
            avoid: Default::default(),
            gate: None,
            moves: None,
            readied: None,
            data_at: 0,
            others_ran: false,
            ran: Duration::ZERO,
            ran_from: None,
            library: None,
        };
        s.stop_new_threads()?;
        if s.threads.is_empty() {
            return Err(format!("no process {pid}"));
        }
        Ok(s)
    }

    /// Seizes and stops every thread of the process not held yet, threads
    /// made meanwhile too (all of them, at [`Stopped::all`]; those made
    /// while some ran). On an error, those seized stay held (every thread
    /// is let go when the `Stopped` is dropped).
    fn stop_new_threads(&mut self) -> Result<(), String> {
        let mut seized: std::collections::BTreeSet<i32> = self.threads.keys().copied().collect();
        loop {
            let new: Vec<i32> = tids(self.pid)
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
                    // A thread that ended meanwhile: gone (ESRCH), or
                    // ending, which ptrace refuses with EPERM once its
                    // exit state is set (a server's request thread, seen
                    // 1 in 20 attaches under load).
                    if tid != self.pid && (e == libc::ESRCH || (e == libc::EPERM && zombie(tid))) {
                        continue;
                    }
                    return Err(seize_error(self.pid, e));
                }
                seized.insert(tid);
                if request(libc::PTRACE_INTERRUPT, tid, 0, 0).is_ok() {
                    asked.push(tid);
                }
            }
            for tid in asked {
                if let Some(t) = self.wait_stopped(tid)? {
                    self.threads.insert(tid, t);
                }
            }
        }
        Ok(())
    }

    /// Waits for the stop of a thread asked to stop (PTRACE_INTERRUPT);
    /// signals that arrive first are delivered on the way.
    fn wait_stopped(&mut self, tid: i32) -> Result<Option<Thread>, String> {
        loop {
            match wait_for(tid, None)? {
                Stop::Gone => return Ok(None),
                Stop::Event => break,
                Stop::Signal(sig) => {
                    // The signal goes to the program, as it would have (a
                    // sample of ours is taken away: the program's own
                    // action may be back on its signal); the interrupt
                    // then stops the thread.
                    let sig = if is_ours(tid, sig, false) { 0 } else { sig };
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

    /// The thread calls run on, among those not avoided and still
    /// alive: the safest by [`super::caller::rank`], the main thread first
    /// among equals; else the main thread; else any.
    fn caller(&self) -> Option<i32> {
        let usable = |t: i32| !self.avoid.contains(&t) && !zombie(t);
        let maps = self.maps();
        let rank = |t: i32| {
            let at = self.at(t);
            super::caller::rank(&at, t == self.pid, &maps, self.library.as_deref())
        };
        self.threads
            .keys()
            .copied()
            .filter(|&t| usable(t))
            .min_by_key(|&t| (rank(t).unwrap_or(u8::MAX), t != self.pid, t))
    }

    /// The process's mappings now.
    fn maps(&self) -> Vec<super::caller::Mapping> {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .map(|m| super::caller::mappings(&m))
            .unwrap_or_default()
    }

    /// Where stopped thread `t` is, as [`super::caller`] reads it.
    fn at(&self, t: i32) -> super::caller::At {
        let r = &self.threads[&t].regs;
        super::caller::At {
            syscall: r.orig_rax as i64,
            args: [r.rdi, r.rsi],
            sp: r.rsp,
            pc: r.rip,
            ret: r.rax as i64,
        }
    }

    /// The thread the next call runs on ([`Stopped::caller`]), first run
    /// on alone, in slices of half a millisecond, until it is out of the C
    /// library's, the loader's and the profiler's code
    /// ([`super::caller::leave_runtime`]): stopped inside `malloc`, it may
    /// hold the arena lock the call's own allocations need. The other
    /// threads stay stopped; a thread that cannot get out (it waits for a
    /// lock one of them holds) is called on where it ends up, after at
    /// most [`STEP_MOST`]. A caller that must see the threads' places
    /// (the attach) takes them after this; the thread is not run again in
    /// this stop, nor any other while [`Stopped::moves`] is set.
    pub fn ready_caller(&mut self) -> Result<i32, String> {
        loop {
            let tid = self
                .caller()
                .ok_or("no thread of the process can run a call")?;
            // A call that carries the threads' places (the attach's) never
            // moves one after they were read.
            if self.readied == Some(tid) || self.moves.is_some() {
                return Ok(tid);
            }
            let maps = self.maps();
            // A thread asleep in a wait was chosen for it: it is not run.
            let library = self.library.as_deref();
            if super::caller::rank(&self.at(tid), tid == self.pid, &maps, library).is_some() {
                self.readied = Some(tid);
                return Ok(tid);
            }
            let until = Instant::now() + STEP_MOST;
            let (mut ran, mut gone) = (false, false);
            while Instant::now() < until
                && super::caller::leave_runtime(&self.at(tid), &maps, self.library.as_deref())
            {
                ran = true;
                if request(libc::PTRACE_CONT, tid, 0, 0).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(500));
                let _ = request(libc::PTRACE_INTERRUPT, tid, 0, 0);
                if !self.stop_again(tid, Instant::now() + Duration::from_secs(2), false) {
                    gone = true;
                    break;
                }
                match get_regs(tid) {
                    Ok(regs) => self.threads.get_mut(&tid).expect("stopped").regs = regs,
                    Err(_) => {
                        gone = true;
                        break;
                    }
                }
            }
            if ran {
                // A thread it made meanwhile runs: held like the others.
                self.stop_new_threads()?;
            }
            if !gone {
                self.readied = Some(tid);
                return Ok(tid);
            }
            self.threads.remove(&tid);
        }
    }

    /// Calls go to another thread from now on; false when none is left.
    pub fn avoid_caller(&mut self) -> bool {
        match self.caller() {
            Some(t) => {
                self.avoid.insert(t);
                self.caller().is_some()
            }
            None => false,
        }
    }

    /// Calls go to the main thread again.
    pub fn reset_callers(&mut self) {
        self.avoid.clear();
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
        let tid = self.ready_caller()?;
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
        let mask =
            get_sigmask(tid).map_err(|e| format!("cannot read the signal mask: errno {e}"))?;
        set_regs(tid, &regs).map_err(|e| format!("cannot set registers: errno {e}"))?;
        // No handler of the program's, or of ours, runs inside the call:
        // a handler's return would also end the restart of a sleep the
        // thread was in (EINTR where it slept on). Signals that come
        // meanwhile wait for the thread's own mask; faults stay unblocked
        // (a blocked fault's action would be reset by the kernel).
        let _ = set_sigmask(tid, mask | !FAULTS);
        self.data_at = data_at;
        let result = self.run_call(tid);
        // The thread's own registers and mask back, whatever happened.
        let _ = set_regs(tid, &saved);
        let _ = set_xstate(tid, &xstate);
        let _ = set_sigmask(tid, mask);
        self.settle(tid);
        let r = result?;
        Ok((r, read_mem(self.pid, data_at, data.len())?))
    }

    /// Before the other threads run during a call: the library is told to
    /// write no more code (a write under way is waited for), and the
    /// threads it moved out of patches so far are moved.
    fn close_gate(&mut self) {
        if let Some(g) = self.gate {
            let _ = write_mem(self.pid, g.others_ran, &1u64.to_le_bytes());
            let until = Instant::now() + Duration::from_secs(1);
            while read_mem(self.pid, g.patching, 8).is_ok_and(|b| b != [0; 8])
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let Some((off, sent)) = self.moves.take() else {
            return;
        };
        if let Ok(array) = read_mem(self.pid, self.data_at + off as u64, sent.len() * 24) {
            self.apply_moves(&sent, &array);
        }
        self.moves = Some((off, sent));
    }

    /// `array`: `igprof_attach`'s threads as the library left them (tid,
    /// thread pointer, next instruction; 24 bytes each), `sent` as it was
    /// given them: a thread whose next instruction it changed (moved out
    /// of a patch's bytes) goes on there. Only a change counts: a thread
    /// is never put back where it was when the array was made.
    pub fn apply_moves(&mut self, sent: &[[u64; 3]], array: &[u8]) {
        for (w, was) in array.chunks_exact(24).zip(sent) {
            let word = |k: usize| u64::from_le_bytes(w[k..k + 8].try_into().unwrap_or([0; 8]));
            let (tid, pc) = (word(0) as i32, word(16));
            if tid as u64 == was[0] && pc != was[2] && self.threads.contains_key(&tid) {
                self.move_to(tid, pc);
            }
        }
    }

    /// Lets every thread but `caller`, running during a long call, go on
    /// from a stop: a signal is delivered as it would have been (the
    /// library's handler is installed then), a group stop continued.
    fn serve_others(&self, caller: i32) {
        for &t in self.threads.keys().filter(|&&t| t != caller) {
            let mut status = 0;
            // SAFETY: status is a valid out pointer.
            let r = unsafe { libc::waitpid(t, &mut status, libc::__WALL | libc::WNOHANG) };
            if r == t && libc::WIFSTOPPED(status) {
                let sig = if (status >> 16) != 0 {
                    0
                } else {
                    libc::WSTOPSIG(status)
                };
                let _ = request(libc::PTRACE_CONT, t, 0, sig as usize);
            }
        }
    }

    /// After a call on thread `tid`: a sample the call's own time raised
    /// there (held by the call's mask) is taken away, so the thread never
    /// meets it where it was (a system call it slept in would end with
    /// EINTR, or, after a detach, the program's own action would take
    /// it). Any other signal queued meanwhile is delivered as it would
    /// have been. A queued signal is taken before any of the thread's code
    /// runs; the thread is stopped again at once.
    fn settle(&mut self, tid: i32) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while sample_queued(self.pid, tid) && Instant::now() < deadline {
            if request(libc::PTRACE_CONT, tid, 0, 0).is_err() {
                return;
            }
            if !self.stop_again(tid, deadline, false) {
                return;
            }
            if let (Ok(regs), Some(t)) = (get_regs(tid), self.threads.get_mut(&tid)) {
                t.regs = regs;
            }
        }
    }

    /// Waits for thread `tid`, running traced, to stop again: a sample
    /// that reaches it meanwhile is taken away, any other signal
    /// delivered. False when it is gone.
    fn stop_again(&self, tid: i32, deadline: Instant, stepping: bool) -> bool {
        loop {
            match wait_for(tid, Some(deadline)) {
                Ok(Stop::Signal(sig)) => {
                    let sig = if is_ours(tid, sig, stepping) { 0 } else { sig };
                    // The interrupt stops it next, before any more of its
                    // code runs when the signal was taken away.
                    let _ = request(libc::PTRACE_INTERRUPT, tid, 0, 0);
                    let _ = request(libc::PTRACE_CONT, tid, 0, sig as usize);
                }
                Ok(Stop::Event) => return true,
                Ok(Stop::Gone) => return false,
                Err(_) => {
                    let _ = request(libc::PTRACE_INTERRUPT, tid, 0, 0);
                    return matches!(
                        wait_for(tid, Some(Instant::now() + Duration::from_secs(1))),
                        Ok(Stop::Event)
                    );
                }
            }
        }
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
    /// stopped again after, unless [`Stopped::hold_others`].
    fn run_call(&mut self, tid: i32) -> CallResult {
        request(libc::PTRACE_CONT, tid, 0, 0).map_err(|e| format!("cannot resume: errno {e}"))?;
        let started = Instant::now();
        let mut deadline = Some(started + CALL_ALONE);
        self.others_ran = false;
        let mut waited_long = false;
        // Since when the call has been seen blocked in a futex at every
        // look, the others stopped.
        let mut blocked_since = None;
        let outcome = loop {
            // While the others run, their stops are served every 20 ms: a
            // thread stopped by a signal would otherwise wait for us, and
            // the call may be waiting for it. While they are stopped, the
            // call is looked at every FUTEX_LOOK.
            let wait_until = match deadline {
                Some(d) if self.others_ran => {
                    Some(d.min(Instant::now() + Duration::from_millis(20)))
                }
                Some(d) if !waited_long => Some(d.min(Instant::now() + FUTEX_LOOK)),
                d => d,
            };
            let stop = match wait_for(tid, wait_until) {
                Ok(s) => {
                    blocked_since = None;
                    s
                }
                Err(_)
                    if !self.others_ran
                        && !waited_long
                        && deadline.is_some_and(|d| Instant::now() < d)
                        && !blocked_for(self.pid, tid, &mut blocked_since) =>
                {
                    continue;
                }
                Err(_) if self.others_ran && deadline.is_some_and(|d| Instant::now() < d) => {
                    self.serve_others(tid);
                    if self.restop_asked() {
                        let stopped = self.stop_others(tid).is_ok();
                        self.answer_restop(stopped);
                        if stopped {
                            self.others_ran = false;
                            deadline = Some(Instant::now() + CALL_ALONE);
                            waited_long = false;
                        }
                    }
                    continue;
                }
                Err(_) => {
                    if waited_long {
                        break Err(format!(
                            "the call in the process did not return within {} s",
                            started.elapsed().as_secs()
                        ));
                    }
                    // A call that is still working (a loaded machine, a
                    // large process) rather than waiting on a lock keeps
                    // the other threads stopped, up to the minute.
                    if !waits_on_futex(self.pid, tid) && started.elapsed() < CALL_MOST {
                        deadline = Some(Instant::now() + CALL_ALONE);
                        continue;
                    }
                    waited_long = true;
                    deadline = Some(Instant::now() + CALL_MOST);
                    if self.hold_others {
                        continue;
                    }
                    // Probably a lock held by a stopped thread: let them go,
                    // once no more code can be written and every thread
                    // moved out of a patch is where it must go on.
                    self.others_ran = true;
                    self.ran_from = Some(Instant::now());
                    self.close_gate();
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
        if self.others_ran {
            self.stop_others(tid)?;
        }
        outcome
    }

    /// Stops again every thread but `caller`, after they ran during its
    /// call, and those they made meanwhile.
    fn stop_others(&mut self, caller: i32) -> Result<(), String> {
        if let Some(t) = self.ran_from.take() {
            self.ran += t.elapsed();
        }
        let others: Vec<i32> = self
            .threads
            .keys()
            .copied()
            .filter(|&t| t != caller)
            .collect();
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
        self.stop_new_threads()
    }

    /// Whether the call asks for the other threads to be stopped again
    /// ([`Gate::restop`]).
    fn restop_asked(&self) -> bool {
        self.gate
            .is_some_and(|g| read_mem(self.pid, g.restop, 8).is_ok_and(|b| b == 1u64.to_le_bytes()))
    }

    fn answer_restop(&self, stopped: bool) {
        if let Some(g) = self.gate {
            let a: u64 = if stopped { 2 } else { 3 };
            let _ = write_mem(self.pid, g.restop, &a.to_le_bytes());
        }
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
    /// samplers (now stopped) raised just before they stopped would meet
    /// the program's own action on its signal (SIGTRAP's default ends the
    /// process). Such a sample may not be queued yet: a perf event's
    /// SIGTRAP is sent by work the kernel runs as the thread next returns
    /// to user space, which a thread stopped in the kernel has not done.
    /// So each thread is stepped over one instruction of its own
    /// ([`Stopped::flush`]), which takes it through that return, and is let
    /// go once no sampling signal is queued on it; a sample that reaches a
    /// thread meanwhile is taken away, any other signal delivered.
    pub fn release_without_samples(&mut self) {
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for &tid in &tids {
            let regs = self.threads[&tid].regs;
            let _ = set_regs(tid, &regs);
        }
        let deadline = Instant::now() + RELEASE_WITHIN;
        let (done, unblocked) = self.flush(&tids, deadline);
        for tid in done {
            let mut stopped = true;
            while stopped && sample_queued(self.pid, tid) && Instant::now() < deadline {
                stopped = request(libc::PTRACE_CONT, tid, 0, 0).is_ok()
                    && self.stop_again(tid, deadline, true);
            }
            if stopped && unblocked.contains(&tid) {
                // Its mask as the step left it (a system call it made there
                // may have changed it), SIGTRAP blocked again.
                if let Ok(mask) = get_sigmask(tid) {
                    let _ = set_sigmask(tid, mask | (1 << (libc::SIGTRAP - 1)));
                }
            }
            if stopped {
                let _ = request(libc::PTRACE_DETACH, tid, 0, 0);
            }
        }
        self.threads.clear();
    }

    /// Steps each thread of `tids` over one instruction, so that it passes
    /// through a return to user space; returns the ones stopped again. A
    /// thread whose instruction enters a system call that blocks (it is
    /// asleep) is interrupted there. Past `deadline` the rest are
    /// interrupted wherever they are.
    fn flush(&self, tids: &[i32], deadline: Instant) -> (Vec<i32>, Vec<i32>) {
        // A step ends with a SIGTRAP the kernel forces: on a thread that
        // blocks SIGTRAP, forcing it would also reset the program's action
        // on it, so SIGTRAP is unblocked for the step (and until the
        // caller has taken every SIGTRAP of ours away: the second list).
        // Where the program ignores SIGTRAP no sample can hurt.
        if sig_ignored(self.pid, libc::SIGTRAP) {
            return (tids.to_vec(), Vec::new());
        }
        let trap = 1u64 << (libc::SIGTRAP - 1);
        let mut unblocked = Vec::new();
        let mut running: BTreeMap<i32, bool> = BTreeMap::new();
        for &tid in tids {
            let Ok(mask) = get_sigmask(tid) else { continue };
            if mask & trap != 0 {
                if set_sigmask(tid, mask & !trap).is_err() {
                    continue;
                }
                unblocked.push(tid);
            }
            if request(libc::PTRACE_SINGLESTEP, tid, 0, 0).is_ok() {
                running.insert(tid, false);
            }
        }
        let mut done = Vec::with_capacity(running.len());
        let mut status = 0;
        let mut idle = 0u32;
        while !running.is_empty() {
            // SAFETY: status is a valid out pointer.
            let t = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
            if t > 0 {
                idle = 0;
                if !running.contains_key(&t) {
                    continue;
                }
                if !libc::WIFSTOPPED(status) {
                    running.remove(&t);
                    continue;
                }
                let sig = libc::WSTOPSIG(status);
                let stepped = (status >> 16) != 0 || (sig == libc::SIGTRAP && is_step(t));
                if stepped {
                    running.remove(&t);
                    done.push(t);
                } else {
                    let deliver = if is_ours(t, sig, true) { 0 } else { sig };
                    let _ = request(libc::PTRACE_SINGLESTEP, t, 0, deliver as usize);
                }
                continue;
            }
            if t < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                break;
            }
            idle += 1;
            let late = Instant::now() >= deadline;
            if late || idle.is_multiple_of(8) {
                for (&tid, asked) in running.iter_mut() {
                    if !*asked && (late || asleep(tid)) {
                        *asked = request(libc::PTRACE_INTERRUPT, tid, 0, 0).is_ok();
                    }
                }
            }
            if late && idle > 10_000 {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Any still running past the deadline: let go as they are.
        done.extend(running.keys());
        (done, unblocked)
    }

    /// Lets the threads run for `d`, then stops them all again.
    /// The library's gate ([`Stopped::gate`]) stays set.
    pub fn pause(mut self, d: Duration) -> Result<Stopped, String> {
        self.pause_in_place(d)?;
        Ok(self)
    }

    /// [`Stopped::pause`] through a reference; [`Stopped::hold_others`]
    /// stays as it was too.
    pub fn pause_in_place(&mut self, d: Duration) -> Result<(), String> {
        let (pid, gate, hold, ran) = (self.pid, self.gate, self.hold_others, self.ran);
        let library = self.library.take();
        self.release();
        std::thread::sleep(d);
        let mut s = Stopped::all(pid)?;
        s.gate = gate;
        s.hold_others = hold;
        s.library = library;
        s.ran = ran;
        *self = s;
        Ok(())
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

/// How long [`Stopped::release_without_samples`] waits for the threads to
/// take their step before interrupting them wherever they are.
const RELEASE_WITHIN: Duration = Duration::from_secs(3);

/// SIGTRAP's si_code after a single step (or a step over a system call).
const TRAP_BRKPT: i32 = 1;
const TRAP_TRACE: i32 = 2;

/// SIGTRAP's si_code from a perf event's sigtrap.
const TRAP_PERF: i32 = 6;

/// The siginfo of the signal thread `tid` is stopped with.
fn siginfo(tid: i32) -> Option<libc::siginfo_t> {
    // SAFETY: all-zero is a valid siginfo_t; the kernel fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    request(
        libc::PTRACE_GETSIGINFO,
        tid,
        0,
        &mut info as *mut _ as usize,
    )
    .ok()?;
    Some(info)
}

/// Whether the signal `sig` thread `tid` is stopped with is the
/// profiler's own: a perf event's SIGTRAP (TRAP_PERF) carrying one of the
/// library's cookies, a sampling timer's SIGPROF carrying its value, or,
/// while `stepping`, the trap that ends a step of [`Stopped::flush`] (the
/// kernel still queues it when the step ended in a system call we
/// interrupted). Such a signal is never the program's: it is taken away
/// wherever a thread stops with it.
fn is_ours(tid: i32, sig: i32, stepping: bool) -> bool {
    let Some(info) = siginfo(tid) else {
        return false;
    };
    // SAFETY: si_perf_data (TRAP_PERF) and si_value (SI_TIMER) are both
    // the eight bytes at offset 24 of the siginfo the kernel filled.
    let value = unsafe { *((&info as *const libc::siginfo_t as *const u8).add(24) as *const u64) };
    match (sig, info.si_code) {
        (libc::SIGTRAP, TRAP_PERF) => value >> 16 == COOKIE_PREFIX,
        (libc::SIGTRAP, TRAP_TRACE | TRAP_BRKPT) => stepping,
        (libc::SIGPROF, libc::SI_TIMER) => value & 0xffff_ffff == TIMER_COOKIE_LOW,
        _ => false,
    }
}

/// The library's perf event cookies (`si_perf_data`) all begin with
/// "igprof" (0x6967_7072_6f66, the top 48 bits).
const COOKIE_PREFIX: u64 = 0x6967_7072_6f66;

/// The low 32 bits of every value the library's sampling timers carry.
const TIMER_COOKIE_LOW: u64 = 0x6f66_2d72;

/// Whether thread `tid`'s SIGTRAP stop is the end of a single step.
fn is_step(tid: i32) -> bool {
    siginfo(tid).is_some_and(|i| i.si_code == TRAP_TRACE || i.si_code == TRAP_BRKPT)
}

/// Whether process `pid` ignores signal `sig` (SIG_IGN).
fn sig_ignored(pid: i32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    signal_set(&status, "SigIgn:") & (1u64 << (sig - 1)) != 0
}

/// A signal set of a `/proc/.../status` text (`SigPnd:`, `SigBlk:`...).
fn signal_set(status: &str, name: &str) -> u64 {
    super::target::status_field(status, name)
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .unwrap_or(0)
}

/// How long [`Stopped::ready_caller`] lets the caller run alone, in
/// slices of half a millisecond, to leave the runtime's code: on an idle
/// machine 1 to 10 slices do; on a loaded one a slice may pass before the
/// thread runs at all (100 slices were seen to end where they began).
const STEP_MOST: Duration = Duration::from_secs(2);

/// How long a call runs with every other thread stopped before they are
/// let run (it may wait for a lock one of them holds), when it waits on a
/// futex then; and how long a call is waited for at most, while it works
/// with the others stopped, and again once they run (so up to two minutes
/// in all: the error says how long). A call seen blocked in a futex at
/// every look (one each FUTEX_LOOK) for FUTEX_STUCK lets them run sooner:
/// with every other thread stopped, only one of them can end that wait.
const CALL_ALONE: Duration = Duration::from_secs(2);
const CALL_MOST: Duration = Duration::from_secs(60);
const FUTEX_LOOK: Duration = Duration::from_millis(10);
const FUTEX_STUCK: Duration = Duration::from_millis(50);

/// Whether thread `tid` of `pid` has been blocked in a futex wait at every
/// look for [`FUTEX_STUCK`]; `since`: when the looks began to see it so
/// (cleared by a look that does not).
fn blocked_for(pid: i32, tid: i32, since: &mut Option<Instant>) -> bool {
    // Unreadable, it is not taken for a wait here: the call then has the
    // whole CALL_ALONE.
    if futex_wait_seen(pid, tid) != Some(true) {
        *since = None;
        return false;
    }
    since.get_or_insert_with(Instant::now).elapsed() >= FUTEX_STUCK
}

/// Whether thread `tid` of `pid` is blocked in a futex wait (a lock, or a
/// condition): `/proc/PID/task/TID/syscall` gives the system call it is
/// blocked in ("running" or another call: it is working, not waiting for
/// another thread). Readable by the process's tracer. Where it cannot be
/// read, a wait is assumed.
fn waits_on_futex(pid: i32, tid: i32) -> bool {
    futex_wait_seen(pid, tid).unwrap_or(true)
}

/// [`waits_on_futex`], None where the file cannot be read.
fn futex_wait_seen(pid: i32, tid: i32) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    Some(
        s.split_whitespace()
            .next()
            .and_then(|n| n.parse::<i64>().ok())
            .is_some_and(|n| n == libc::SYS_futex),
    )
}

/// The state letter of thread `tid` (`R`, `S`, `D`, `Z`, `t`...), from
/// its `stat`; None when it is gone.
fn task_state(tid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether thread `tid` sleeps in the kernel (a system call that blocks).
fn asleep(tid: i32) -> bool {
    matches!(task_state(tid), Some('S' | 'D'))
}

/// Whether a SIGTRAP or SIGPROF the thread does not block is queued on
/// thread `tid` (its own pending set: the samplers signal one thread
/// each). A blocked one cannot be taken by letting the thread run.
fn sample_queued(pid: i32, tid: i32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else {
        return false;
    };
    let ours = (1u64 << (libc::SIGTRAP - 1)) | (1u64 << (libc::SIGPROF - 1));
    signal_set(&s, "SigPnd:") & !signal_set(&s, "SigBlk:") & ours != 0
}

/// Whether thread `tid` has ended: gone, a zombie, or dead and not yet
/// released.
fn zombie(tid: i32) -> bool {
    task_state(tid).is_none_or(|c| c == 'Z' || c == 'X')
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
