//! Start-up, process and thread life cycle of the profiler.
//!
//! Owns: the constructor's sequence (options, counters, handler, hooks,
//! main thread, watcher, fatal-signal handlers), the one start-up line,
//! per-thread set-up and teardown (and the count of the program's live
//! threads, which ends the watcher with the last of them), what happens
//! around fork and exec, and the output file name.
//!
//! Must never: print more than the one start-up line unless `-d` (or
//! something went wrong), or change the program's behaviour when the
//! options are invalid (it then runs unprofiled).

pub mod attach;
pub mod ending;
pub mod fatal;
pub mod hooks;
pub mod keeper;
mod planner;
mod raw_exit;
pub mod signals;
pub mod watcher;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub use crate::base::run::{active, info, is_own_process};
use crate::base::thread::{self, ThreadState};
use crate::base::{options, run};
use crate::modules::Module;
pub use crate::output::path::output_path;
use crate::{base::counters, output, sampler, sys};

/// Set by the launcher (IGPROF_QEMU_USER) when the program runs under
/// qemu-user: see [`after_fork_child`].
static QEMU_USER: AtomicBool = AtomicBool::new(false);
/// Threads of the program that have started and not ended (the watcher
/// is not one): when the last ends, the watcher ends too.
static LIVE_THREADS: AtomicUsize = AtomicUsize::new(0);

fn getenv(name: &[u8]) -> Option<&'static [u8]> {
    debug_assert!(name.ends_with(b"\0"));
    // SAFETY: name is NUL-terminated; getenv's result lives as long as the
    // environment entry (we copy what we keep before the program runs).
    let p = unsafe { libc::getenv(name.as_ptr() as *const libc::c_char) };
    if p.is_null() {
        None
    } else {
        // SAFETY: p is a NUL-terminated string.
        Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
    }
}

fn read_exe() -> Vec<u8> {
    std::fs::read_link("/proc/self/exe")
        .map(|p| p.into_os_string().into_encoded_bytes())
        .unwrap_or_default()
}

/// The program's argv[0] (glibc's `program_invocation_name`, set from
/// it before any constructor of ours runs: no file to read), else the
/// executable's path.
fn read_argv0() -> Vec<u8> {
    extern "C" {
        static program_invocation_name: *const libc::c_char;
    }
    // SAFETY: glibc's pointer to argv[0] (or to an empty string), written
    // before the constructors run.
    let p = unsafe { program_invocation_name };
    let argv0 = if p.is_null() {
        Vec::new()
    } else {
        // SAFETY: a NUL-terminated string of the process's argument area.
        unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes().to_vec()
    };
    if argv0.is_empty() {
        read_exe()
    } else {
        argv0
    }
}

const EXEC_OF: &[u8] = b"IGPROF_EXEC_OF=";

/// The environment for an exec from this image: `envp` with
/// `IGPROF_EXEC_OF=<pid>.<generation + 1>` in place of any previous one, so
/// that the new image (same pid) knows it follows this one. None when
/// `envp` does not profile the new image (no `IGPROF=`).
pub struct ExecEnv {
    _entry: Vec<u8>,
    ptrs: Vec<*const libc::c_char>,
}

impl ExecEnv {
    pub fn as_ptr(&self) -> *const *const libc::c_char {
        self.ptrs.as_ptr()
    }
}

/// See [`ExecEnv`].
///
/// # Safety
/// `envp` is null or a null-terminated array of NUL-terminated strings.
pub unsafe fn exec_env(envp: *const *const libc::c_char) -> Option<ExecEnv> {
    if envp.is_null() {
        return None;
    }
    let mut all: Vec<*const libc::c_char> = Vec::new();
    let mut bytes: Vec<&[u8]> = Vec::new();
    loop {
        let e = *envp.add(all.len());
        if e.is_null() {
            break;
        }
        all.push(e);
        bytes.push(core::ffi::CStr::from_ptr(e).to_bytes());
    }
    let (keep, entry) = exec_env_plan(&bytes, sys::getpid(), run::exec_generation() + 1)?;
    let mut ptrs: Vec<*const libc::c_char> = keep.into_iter().map(|i| all[i]).collect();
    ptrs.push(entry.as_ptr() as *const libc::c_char);
    ptrs.push(core::ptr::null());
    Some(ExecEnv {
        _entry: entry,
        ptrs,
    })
}

/// Why the image an exec makes will run unprofiled ([`unprofiled_exec`]);
/// displayed as the end of a sentence naming the exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnprofiledExec {
    /// The environment has no `IGPROF=` (the program cleared it).
    NoIgprof,
    /// Its `LD_PRELOAD` does not name this library (the program changed it).
    NotPreloaded,
    /// The file is statically linked: no loader to preload the library.
    Static,
    /// The exec is in the loader's secure-execution mode, which ignores
    /// LD_PRELOAD: why, and what to do (`igprof_execfile::secure`).
    Secure([&'static [u8]; 2]),
}

impl core::fmt::Display for UnprofiledExec {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use crate::base::log::Bytes;
        match self {
            UnprofiledExec::NoIgprof => {
                f.write_str(" with an environment that has no IGPROF (the program cleared it)")
            }
            UnprofiledExec::NotPreloaded => f.write_str(
                " with an LD_PRELOAD that no longer names libigprof.so (the program changed it)",
            ),
            UnprofiledExec::Static => f.write_str(
                ", which is statically linked: libigprof.so can only be preloaded into dynamically linked programs",
            ),
            UnprofiledExec::Secure([what, advice]) => write!(
                f,
                ", which is {}: the loader does not preload libigprof.so into it ({})",
                Bytes(what),
                Bytes(advice)
            ),
        }
    }
}

/// Why the image an exec of `path` with environment `envp` makes will run
/// unprofiled, if it will; None when it will be profiled, or when `path`
/// is not a file this process may execute (a candidate of execvp's search
/// that the exec will refuse). Allocates nothing: a child that `vfork`
/// made (`posix_spawn`'s) asks too, in its parent's memory.
///
/// # Safety
/// `envp` is null or a null-terminated array of NUL-terminated strings.
pub unsafe fn unprofiled_exec(
    path: &core::ffi::CStr,
    envp: *const *const libc::c_char,
) -> Option<UnprofiledExec> {
    use igprof_execfile::{elf, secure};
    // SAFETY: a NUL-terminated path alive for the call, only read.
    let may_run =
        unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), libc::X_OK, libc::AT_EACCESS) }
            == 0;
    if !may_run {
        return None;
    }
    let (mut igprof, mut preload) = (false, None);
    let mut i = 0;
    while !envp.is_null() {
        // SAFETY: the caller's null-terminated array.
        let e = unsafe { *envp.add(i) };
        if e.is_null() {
            break;
        }
        // SAFETY: a NUL-terminated string of that array.
        let e = unsafe { core::ffi::CStr::from_ptr(e) }.to_bytes();
        igprof |= e.starts_with(b"IGPROF=");
        if let Some(v) = e.strip_prefix(b"LD_PRELOAD=") {
            preload = Some(v);
        }
        i += 1;
    }
    if !igprof {
        return Some(UnprofiledExec::NoIgprof);
    }
    if !preload.is_some_and(preloads_us) {
        return Some(UnprofiledExec::NotPreloaded);
    }
    if elf::linkage_no_alloc(path) == Some(elf::Linkage::Static) {
        return Some(UnprofiledExec::Static);
    }
    secure::secure_exec_c(path).map(UnprofiledExec::Secure)
}

/// Whether an `LD_PRELOAD` value names this library: one of its elements
/// (separated by colons or spaces, as the loader reads them) is the path
/// the loader loaded it from, or the same file. True when this library's
/// path is not known. Allocates nothing.
fn preloads_us(list: &[u8]) -> bool {
    let Some(ours) = crate::unwind::module_of(preloads_us as *const () as usize) else {
        return true;
    };
    let mut named = list
        .split(|&b| b == b':' || b == b' ')
        .filter(|p| !p.is_empty());
    if named.clone().any(|p| p == ours.path) {
        return true;
    }
    let our_id = file_id(ours.path);
    our_id.is_some() && named.any(|p| file_id(p) == our_id)
}

/// (device, inode) of the file at `path`, through a NUL-terminated copy on
/// the stack; None for a path too long for it or a file stat cannot see.
fn file_id(path: &[u8]) -> Option<(u64, u64)> {
    let mut c = [0u8; libc::PATH_MAX as usize];
    c.get_mut(..path.len())?.copy_from_slice(path);
    let c = core::ffi::CStr::from_bytes_until_nul(&c).ok()?;
    // SAFETY: a zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; `st` is valid for the kernel to fill.
    (unsafe { libc::stat(c.as_ptr(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// One line for an exec of `path` whose image runs unprofiled (`why`): the
/// user who looks for the profile of the program that followed learns why
/// there is none. `profile`: where this image's profile until the exec was
/// written (None in a child that `vfork` made, which has none of its own).
/// Allocates nothing.
pub fn say_unprofiled_exec(path: &[u8], why: UnprofiledExec, profile: Option<&str>) {
    let (program, pid, path) = (
        crate::base::log::Bytes(&info().program),
        sys::getpid(),
        crate::base::log::Bytes(path),
    );
    match profile {
        Some(p) => crate::igprof_log!(
            "{program} (pid {pid}) execs {path}{why}; it runs unprofiled, and the profile until the exec is {p}"
        ),
        None => crate::igprof_log!("{program} (pid {pid}) execs {path}{why}; it runs unprofiled"),
    }
}

/// The new image's environment, as a plan over `env`'s entries: the ones
/// that stay (all but a previous `IGPROF_EXEC_OF=`) and the entry to add
/// (`IGPROF_EXEC_OF=<pid>.<gen>`, NUL-terminated); None when `env` does
/// not profile the new image (no `IGPROF=`).
fn exec_env_plan(env: &[&[u8]], pid: i32, gen: u32) -> Option<(Vec<usize>, Vec<u8>)> {
    if !env.iter().any(|e| e.starts_with(b"IGPROF=")) {
        return None;
    }
    let keep = (0..env.len())
        .filter(|&i| !env[i].starts_with(EXEC_OF))
        .collect();
    let mut entry = EXEC_OF.to_vec();
    entry.extend_from_slice(format!("{pid}.{gen}\0").as_bytes());
    Some((keep, entry))
}

/// Runs `f` for every module the options select (after start-up: the
/// ones that started).
pub fn each_module(f: impl FnMut(&'static Module)) {
    crate::modules::each(options::get(), f)
}

extern "C" fn toggle_signal_handler(_sig: i32) {
    let was = run::recording();
    run::set_recording(!was);
}

/// `--toggle-signal N`: each signal N turns recording off or on.
fn install_toggle_signal(sig: i32) {
    if sig == 0 {
        return;
    }
    // The handler only flips a flag.
    let handler = toggle_signal_handler as *const () as usize;
    if let Err(e) = crate::hook::take_signal(sig, handler, libc::SA_RESTART) {
        crate::igprof_log!("--toggle-signal {sig}: cannot handle it (errno {e}); recording cannot be toggled by signal");
    }
}

extern "C" fn mark_signal_handler(sig: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let _e = crate::sys::ErrnoGuard::save();
    let Some(epoch) = run::mark() else { return };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, pid, value) = unsafe {
        let i = &*info;
        (
            i.si_code,
            i.si_pid(),
            i.si_value().sival_ptr as usize as i32,
        )
    };
    // `igprof --mark PID` sent it with sigqueue and waits for the answer:
    // the same signal, carrying the new epoch. A plain kill gets none.
    if code == libc::SI_QUEUE && value == igprof_options::MARK_MAGIC && pid > 0 {
        let v = libc::sigval {
            sival_ptr: epoch as usize as *mut libc::c_void,
        };
        // SAFETY: sigqueue is async-signal-safe; pid is the sender's.
        unsafe { libc::sigqueue(pid, sig, v) };
    }
}

/// `--marks`: the mark signal (`--mark-signal`, default 43) starts a new
/// epoch, and answers `igprof --mark PID`.
fn install_mark_signal(o: &options::Options) {
    if !o.marks {
        return;
    }
    let sig = o.mark_signal;
    let handler = mark_signal_handler as *const () as usize;
    if let Err(e) = crate::hook::take_signal(sig, handler, libc::SA_RESTART | libc::SA_SIGINFO) {
        crate::igprof_log!("--marks: cannot handle signal {sig} (errno {e}): igprof --mark cannot reach this process");
    }
}

/// `igprof_enable()` / `igprof_disable()`: turns recording on or off;
/// returns 1 if it was on, 0 if it was off, -1 if the process is not
/// profiled.
pub fn set_recording(on: bool) -> i32 {
    if !run::is_own_process() {
        return -1;
    }
    run::set_recording(on) as i32
}

/// Requests that waited for a thread to leave profiler code (see
/// `thread::LeaveHooks`).
fn after_leave() {
    thread::requests_taken();
    fatal::die_if_pending();
    watcher::serve_pending();
}

/// Keeps the plans of the functions hooked at start-up that were not
/// known (`known` were read); says what it did under `-d`, and without it
/// when they cannot be kept: a store in an unwritable place (a daemon's
/// user whose home is `/nonexistent`) made every process plan its hooks
/// again, unseen.
fn save_plans(known: usize) {
    let saved = {
        let _fsize = crate::base::limits::FsizeGuard::block();
        crate::hook::plans::save()
    };
    match saved {
        Ok(wrote) if options::get().debug => crate::igprof_log!(
            "hook plans: {known} known from earlier runs, {} in all{}",
            trampoline::known::len(),
            if wrote { ", saved" } else { "" }
        ),
        Ok(_) => {}
        Err(e) => say_store_unkept(format_args!("{e}")),
    }
}

/// Says that the store (hook plans, unwind descriptors) cannot be kept,
/// `why`, what that costs and what to set (once for a run: start-up's
/// lines are said by the process the user started).
fn say_store_unkept(why: core::fmt::Arguments) {
    crate::igprof_log!(
        "the store of hook plans and unwind descriptors cannot be kept ({why}): every process plans its hooks and derives its descriptors again, about 1 ms more each; IGPROF_CACHE_DIR names a writable directory for it (none: no store, and no line)"
    );
}

/// The library constructor's work. Never panics into the program.
pub fn init(modules: &'static [&'static Module]) {
    let Some(raw) = getenv(b"IGPROF\0") else {
        return;
    };
    set_up(modules);
    crate::base::log::remember_stderr();
    // <pid>.<generation> from the exec hook of a previous image (exec_env).
    let exec_of =
        getenv(b"IGPROF_EXEC_OF\0").and_then(|s| std::str::from_utf8(s).ok()?.split_once('.'));
    if let Some((p, g)) = exec_of {
        if p.parse() == Ok(sys::getpid()) {
            run::set_exec_generation(g.parse().unwrap_or(0));
        }
    }
    if let Some(r) =
        getenv(b"IGPROF_ROOT_PID\0").and_then(|s| std::str::from_utf8(s).ok()?.parse().ok())
    {
        run::set_root_pid(r);
    }
    QEMU_USER.store(getenv(b"IGPROF_QEMU_USER\0").is_some(), Ordering::Relaxed);
    let _ = start(raw, How::Preload);
}

/// What the start-up sequence needs before anything else, whichever way
/// the library came into the process.
pub(crate) fn set_up(modules: &'static [&'static Module]) {
    crate::base::mem_calls::bind_to_libc();
    sys::learn_errno_offset();
    crate::modules::set_registry(modules);
    crate::sampler::set_program_signal(signals::forward_program_signal);
    crate::base::alloc::set_signal_probe(thread::in_sampling_handler);
    thread::set_leave_hooks(thread::LeaveHooks {
        settle: crate::sampler::settle_pending,
        after: after_leave,
    });
}

/// How the library came into the process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// Preloaded at the program's start (the constructor).
    Preload,
    /// Loaded into the running process by `igprof --attach`, on one of
    /// its threads while the others are stopped (`attach.rs`).
    Attach,
}

/// Why start-up left the program unprofiled (said in a line already).
#[derive(Debug)]
pub(crate) struct Unprofiled;

/// Start-up from the option words `raw`: options, counters, handler,
/// hooks, the calling thread, and (preloaded) the watcher, the fatal
/// signals' handlers and the keeper.
pub(crate) fn start(raw: &[u8], how: How) -> Result<(), Unprofiled> {
    let attach = how == How::Attach;
    let parsed = options::parse(raw);
    // What start-up has to say is said once for the run, by the process
    // the user started; its other processes say it with -d only.
    let _quiet = crate::base::log::StartupQuiet::unless(
        attach || run::is_first_image() || parsed.as_ref().is_ok_and(|o| o.debug),
    );
    let mut o = match parsed {
        Ok(o) => o,
        Err(e) => {
            crate::igprof_log!("{e}; the program runs unprofiled");
            return Err(Unprofiled);
        }
    };
    let exe = read_exe();
    if !attach && !o.targets_match(&exe) {
        if o.debug {
            crate::igprof_log!(
                "{} does not match -t; not profiled",
                crate::base::log::Bytes(&exe)
            );
        }
        return Err(Unprofiled);
    }
    for (flag, what) in o.selected() {
        if !crate::modules::built(flag) {
            crate::igprof_log!(
                "{flag}: {what} is not built into this libigprof yet; running without it"
            );
            o.deselect(flag);
        }
    }
    if !crate::modules::all().iter().any(|m| (m.wanted)(&o)) {
        crate::igprof_log!(
            "nothing to profile (no available module selected); the program runs unprofiled"
        );
        return Err(Unprofiled);
    }
    // SAFETY: constructor, single-threaded as far as we are concerned.
    unsafe { options::init(o) };
    run::set_info(run::Info {
        program: read_argv0(),
        exe,
        start_dir: std::env::current_dir()
            .map(|d| std::os::unix::ffi::OsStringExt::into_vec(d.into_os_string()))
            .unwrap_or_default(),
        // SAFETY: getuid has no preconditions.
        start_uid: unsafe { libc::getuid() },
    });
    run::set_pid(sys::getpid());

    each_module(|m| (m.register_counters)(options::get()));
    counters::freeze();
    crate::output::timeline::prepare();
    keeper::facts::set_units();

    sampler::choose_sampler(attach);
    if attach {
        signals::adopt_program_action();
    }
    if let Err(e) = sampler::install_handler() {
        crate::igprof_log!(
            "cannot install the sampling signal's handler (errno {e}); the program runs unprofiled"
        );
        return Err(Unprofiled);
    }
    init_thread_key();
    if let Some(dir) = crate::unwind::store::dir_from_env(|k| std::env::var_os(k)) {
        if let Err(e) = crate::unwind::store::configure(dir.clone()) {
            say_store_unkept(format_args!("{}: {e}", dir.display()));
        }
    }
    crate::base::trace::modules_changed();
    // One read of /proc/self/maps for the main thread's stack bounds and
    // the hooks' installation.
    let maps_held = trampoline::maps::hold();
    let Some(main) = thread::register_current(options::get().max_depth) else {
        crate::igprof_log!(
            "out of memory for the profiler's thread state; the program runs unprofiled"
        );
        return Err(Unprofiled);
    };
    let guard = main.enter();
    let mut started: Vec<String> = Vec::new();
    let mut running = 0;
    // A process that must decode (plans not all known) builds the
    // decoder's tables once, in a region of their own (base/alloc.rs).
    trampoline::x86_64::on_first_decoder(crate::base::alloc::tables_region);
    let known = crate::hook::plans::load();
    // And where plans are not known, a planner process decodes instead,
    // its tables its own (process/planner.rs).
    planner::offer(!attach && getenv(b"IGPROF_PLANNER\0") != Some(b"0"));
    trampoline::batch(|| {
        crate::process::hooks::install_core();
        raw_exit::install();
        each_module(|m| match (m.start)(options::get()) {
            Ok(()) => {
                running += 1;
                started.extend((m.describe)(options::get()));
            }
            Err(e) => {
                if let Some(line) = e.line(m.flag) {
                    crate::igprof_log!("{line}");
                }
            }
        });
    });
    drop(maps_held);
    let planned = planner::finish();
    if let Some(line) = planned.filter(|_| options::get().debug) {
        crate::igprof_log!("{line}");
    }
    save_plans(known);
    let tables = crate::base::alloc::tables_region_used();
    if tables > 0 {
        crate::igprof_debug!(
            "instruction decoder: {} KiB of tables, built for hooks whose plans were not known",
            tables >> 10
        );
    }
    if running == 0 {
        crate::igprof_log!("nothing left to profile; the program runs unprofiled");
        // No exec hook will say that the next image of this process is a
        // later one: say it now, so that it does not repeat what was said.
        let next = format!("{}.{}\0", sys::getpid(), run::exec_generation() + 1);
        if !attach {
            // SAFETY: NUL-terminated name and value; start-up, one thread.
            unsafe { libc::setenv(c"IGPROF_EXEC_OF".as_ptr(), next.as_ptr().cast(), 1) };
        }
        return Err(Unprofiled);
    }
    each_module(|m| {
        if let Some(f) = m.thread_begin {
            f(main)
        }
    });
    LIVE_THREADS.store(1, Ordering::Release);
    // SAFETY: THREAD_KEY was created above; main is never freed. Its
    // destructor runs if the main thread ends through pthread_exit.
    unsafe {
        libc::pthread_setspecific(
            THREAD_KEY,
            main as *const ThreadState as *const libc::c_void,
        )
    };
    if attach {
        // Nothing of the program's signals changes, and no thread of ours
        // stays behind after the detach: no watcher, no handlers of the
        // dump, toggle, mark or fatal signals.
        crate::process::watcher::none_in_child(true);
    } else {
        crate::process::watcher::install_dump_signal();
        install_toggle_signal(o.toggle_signal);
        install_mark_signal(&o);
    }
    crate::base::run::set_recording(!o.start_disabled);
    let o = options::get();
    crate::base::solo::begin(
        !attach
            && !crate::process::watcher::needed_from_start(o)
            && crate::base::solo::libc_single_threaded(),
    );
    if !crate::base::solo::solo() {
        crate::process::watcher::start();
    }
    run::set_active();
    if !attach {
        crate::process::fatal::install();
    }
    drop(guard);
    {
        crate::igprof_log!(
            "profiling {} (pid {}): {}; profile -> {}",
            crate::base::log::Bytes(&info().program),
            sys::getpid(),
            started.join(", "),
            output_path()
        );
    }
    if attach {
        give_back_code_pages(false);
        sampler::start_thread(main);
        return Ok(());
    }
    keeper::configure(
        if getenv(b"IGPROF_KEEPER\0") == Some(b"0") {
            Some(keeper::OFF_BY_ENV)
        } else if QEMU_USER.load(Ordering::Relaxed) {
            Some(keeper::OFF_UNDER_QEMU)
        } else {
            None
        },
        keeper::Calls {
            final_dump: ending::final_dump_by_keeper,
            snapshot_near_limit: watcher::snapshot_near_limit,
            timeline_point: crate::output::timeline::add_point,
            give_back_code: crate::base::code_pages::give_back_again,
        },
    );
    let kept = start_keeper();
    give_back_code_pages(kept);
    sampler::start_thread(main);
    Ok(())
}

/// Start-up is over: the library's code and read-only data pages leave the
/// process's resident set (base/code_pages.rs), now, or a little later by
/// the keeper where one runs (`kept`); `-d` says how much and when.
fn give_back_code_pages(kept: bool) {
    let bytes = crate::base::code_pages::find();
    if kept {
        crate::igprof_debug!(
            "start-up over: {} KiB of the library's code and read-only data to unmap, by the keeper {} ms into the run (they fault back in where used)",
            bytes >> 10,
            keeper::GIVE_BACK_AFTER_NS / 1_000_000
        );
    } else {
        crate::base::code_pages::give_back_again();
        crate::igprof_debug!(
            "start-up over: {} KiB of the library's code and read-only data unmapped (they fault back in where used)",
            bytes >> 10
        );
    }
}

/// Starts this image's keeper (before the sampler of the thread that makes
/// it starts: the keeper must inherit no timer or counter); `-d` says how.
/// Whether one runs.
fn start_keeper() -> bool {
    let t0 = sys::monotonic_ns();
    match keeper::start() {
        Ok(pid) => {
            crate::igprof_debug!(
                "keeper: pid {pid} writes the profile if this process dies without writing it (started in {} us)",
                (sys::monotonic_ns() - t0) / 1000
            );
            true
        }
        Err(why) => {
            crate::igprof_debug!(
                "keeper: none ({why}); a process killed by SIGKILL leaves no profile"
            );
            if options::get().timeline_ns() != 0 {
                // The watcher takes the timeline's points instead: the
                // process is no longer single-threaded.
                crate::igprof_debug!("timeline: points taken by the watcher thread (no keeper)");
                before_thread_create();
            }
            if options::get().snapshot_above != 0 {
                crate::igprof_log!(
                    "--snapshot-above: no snapshot will be written: the keeper that watches the RSS cannot run here ({why})"
                );
            }
            false
        }
    }
}

/// Adds a timeline point of this process, read here (the watcher where
/// no keeper runs; the final dump's last point); the step to the next.
pub fn timeline_point_here() -> u64 {
    crate::output::timeline::add_point(&keeper::facts::point(sys::getpid()))
}

/// The library destructor: the final dump at normal exit.
pub fn fini() {
    if is_own_process() {
        ending::final_dump("exit");
    }
}

static mut THREAD_KEY: libc::pthread_key_t = 0;

extern "C" fn thread_end(p: *mut libc::c_void) {
    // SAFETY: the key's value is the thread's &'static ThreadState.
    end_thread(unsafe { &*(p as *const ThreadState) });
}

/// Last thing in a thread the profiler knows (pthread key destructor, or
/// the return of a raw clone()'s function).
pub fn end_thread(t: &'static ThreadState) {
    sampler::charge_tail(t);
    sampler::stop_thread(t);
    each_module(|m| {
        if let Some(f) = m.thread_end {
            f(t)
        }
    });
    t.exited.store(true, Ordering::Release);
    if LIVE_THREADS.fetch_sub(1, Ordering::AcqRel) == 1 {
        crate::process::watcher::quit();
    }
}

fn init_thread_key() {
    // SAFETY: THREAD_KEY is written once here, before any thread we wrap starts.
    unsafe { libc::pthread_key_create(&raw mut THREAD_KEY, Some(thread_end)) };
}

/// First thing in every thread created through pthread_create.
pub fn thread_begin() {
    let Some(t) = thread::paused(|| thread::register_current(options::get().max_depth)) else {
        return;
    };
    // SAFETY: THREAD_KEY was created in init; t is never freed.
    unsafe {
        libc::pthread_setspecific(THREAD_KEY, t as *const ThreadState as *const libc::c_void)
    };
    begin_thread(t);
}

/// First thing in a thread made by a raw `clone()` that shares its
/// creator's TLS (no pthread key destructor runs for it: its function's
/// return calls [`end_thread`]), running on the stack that ends at `top`.
pub fn shared_tls_thread_begin(top: usize) -> Option<&'static ThreadState> {
    let bounds = crate::unwind::StackBounds::for_stack_top(top);
    let t = thread::register_shared_tls(options::get().max_depth, bounds)?;
    begin_thread(t);
    Some(t)
}

/// A thread that was running before `igprof --attach`, registered in a
/// hook: its state is found at its end, then its modules start.
pub(crate) fn adopt_thread(t: &'static ThreadState) {
    // SAFETY: THREAD_KEY was created at start-up; t is never freed.
    unsafe {
        libc::pthread_setspecific(THREAD_KEY, t as *const ThreadState as *const libc::c_void)
    };
    begin_thread(t);
}

/// The modules' and the sampler's part of a new thread's start.
fn begin_thread(t: &'static ThreadState) {
    LIVE_THREADS.fetch_add(1, Ordering::AcqRel);
    begin_other_thread(t);
}

/// What a new thread gets from the modules, and its sampler; also, at an
/// attach, a thread that was running before it (its state written into
/// its TLS slot by the caller, the thread stopped), opened by the caller
/// for its thread id. Such a thread's end is not seen (no key destructor)
/// and it is not counted live.
pub(crate) fn begin_other_thread(t: &'static ThreadState) {
    let g = t.enter();
    each_module(|m| {
        if let Some(f) = m.thread_begin {
            f(t)
        }
    });
    drop(g);
    sampler::start_thread(t);
}

/// The program is about to create a thread (or a process sharing its
/// memory): the process is no longer solo and gets its watcher.
pub fn before_thread_create() {
    if !crate::base::solo::solo() {
        return;
    }
    // While the process still has one thread.
    each_module(|m| {
        if let Some(f) = m.before_threads {
            f()
        }
    });
    crate::base::solo::leave();
    if active() && is_own_process() {
        thread::paused(crate::process::watcher::start);
    }
}

/// Before the real fork (calling thread busy): no allocator lock may be
/// held across it.
pub fn before_fork() {
    crate::base::alloc::lock_all();
}

pub fn after_fork_parent() {
    crate::base::alloc::unlock_all();
}

/// In the child: a fresh profile of its own (the parent's samples stay
/// with the parent), a timer for its only thread, solo again (a watcher
/// only where `-D`/`--dump-every` need one from the start).
pub fn after_fork_child() {
    crate::base::alloc::unlock_all();
    // The parent's journals are the parent's, whatever is profiled here.
    output::journal::reset_after_fork();
    if run::attached() {
        // A child of a process igprof attached to is not profiled: it
        // gets the functions' own bytes back and records nothing.
        crate::hook::remove_all();
        run::set_inactive();
        return;
    }
    run::set_pid(sys::getpid());
    // The parent's samples and events stay with the parent, unless -pk:
    // then the child's profile goes on from the parent's (IgProf's keep).
    let keep = options::get().fork_keep;
    if !keep {
        sampler::forget_parent_counts();
    }
    for t in thread::all() {
        if !keep {
            t.stale.store(true, Ordering::Release);
        }
        sampler::forget_inherited(t);
    }
    output::reset_after_fork();
    ending::allow_final_again();
    each_module(|m| {
        if let Some(f) = m.fork_child {
            f()
        }
    });
    // The program's view of the sampling signal on the forking thread,
    // which the child's thread keeps.
    let blocked = thread::current().is_some_and(|t| t.shadow.blocks.get());
    thread::detach_current();
    LIVE_THREADS.store(1, Ordering::Release);
    if let Some(t) = thread::register_current(options::get().max_depth) {
        t.shadow.blocks.set(blocked);
        // SAFETY: THREAD_KEY exists (created in init); t is never freed.
        unsafe {
            libc::pthread_setspecific(THREAD_KEY, t as *const ThreadState as *const libc::c_void)
        };
        // qemu-user (7.2) aborts a forked child of a multi-threaded guest
        // when the child creates a thread (plugins/core.c: "assertion
        // failed: (success)": the new vCPU reuses the index of a parent
        // thread that is gone from the child's CPU list but not from the
        // plugin table). So under qemu-user the child never starts a
        // watcher: while it has one thread it serves the dump signal and
        // fatal signals itself, as any single-threaded process does; it
        // does not serve -D or --dump-every, and once it has threads of
        // its own, a death by signal leaves no profile ("no profile
        // written").
        let qemu = QEMU_USER.load(Ordering::Relaxed);
        crate::process::watcher::none_in_child(qemu);
        crate::base::solo::begin(!crate::process::watcher::needed_from_start(options::get()));
        if !crate::base::solo::solo() {
            let g = t.enter();
            crate::process::watcher::start();
            drop(g);
        }
        start_keeper();
        if blocked {
            // Forked with the sampling signal blocked (in the program's
            // view): a program about to exec blocks every signal around
            // fork, and its child may reset every handler to the default
            // and unblock by raw system calls before the exec (chromium's
            // do), where a sample would end it. The child samples from
            // the moment it unblocks the signal through the library.
            SAMPLING_DEFERRED.store(true, Ordering::Release);
        } else {
            restart_thread(t);
        }
    }
}

/// Set in a forked child whose sampling waits for the program to unblock
/// the sampling signal ([`after_fork_child`]).
static SAMPLING_DEFERRED: AtomicBool = AtomicBool::new(false);

/// The program unblocked the sampling signal on thread `t` (through the
/// library): a forked child whose sampling was deferred samples now, if
/// the signal still reaches the library's handler (a child that reset
/// every handler by raw system calls, to exec next, stays unsampled).
pub(crate) fn sampling_signal_unblocked(t: &'static ThreadState) {
    if SAMPLING_DEFERRED.swap(false, Ordering::AcqRel) && sampler::handler_installed() {
        restart_thread(t);
    }
}

/// The calling thread samples again (a forked child's, an exec that failed).
pub(crate) fn restart_thread(t: &'static ThreadState) {
    let g = t.enter();
    each_module(|m| {
        if let Some(f) = m.thread_restart {
            f(t)
        }
    });
    drop(g);
    sampler::allow();
    sampler::start_thread(t);
}

/// Every thread stops sampling (final profile, exec).
pub fn stop_sampling() {
    sampler::end_all();
    for t in thread::all() {
        sampler::stop_thread(t);
        each_module(|m| {
            if let Some(f) = m.thread_stop {
                f(t)
            }
        });
    }
}

/// Before exec: write the profile and stop this thread's timer so that no
/// sampling signal is pending when the new image starts (its default action
/// would kill it before its own libigprof is ready).
pub fn before_exec() {
    each_module(|m| {
        if let Some(f) = m.before_exec {
            f()
        }
    });
    run::set_execing(true);
    ending::final_dump("exec");
    stop_sampling();
}

/// exec returned (it failed): the calling thread samples again; the other
/// threads' samplers, stopped for the exec, stay stopped.
pub fn exec_failed() {
    run::set_execing(false);
    ending::allow_final_again();
    // One keeper for the image that goes on: a second one would run on the
    // first one's stack (see keeper::start).
    start_keeper();
    if let Some(t) = thread::current() {
        restart_thread(t);
    }
}

/// After a successful dlopen/dlclose (calling thread busy).
pub fn modules_changed() {
    crate::base::trace::modules_changed();
}

/// After a successful dlopen or dlclose (calling thread busy): the module
/// table, then the modules that act on loaded objects.
pub fn objects_changed() {
    modules_changed();
    crate::hook::forget_unmapped();
    if !active() {
        return;
    }
    each_module(|m| {
        if let Some(f) = m.objects_changed {
            f()
        }
    });
}

/// `igprof_dump_now(path)`: a snapshot into `path` (NULL: the output file).
pub fn dump_now(path: Option<&[u8]>) -> i32 {
    if !is_own_process() {
        return -1;
    }
    let path = match path {
        Some(p) => String::from_utf8_lossy(p).into_owned(),
        None => output_path(),
    };
    match thread::paused(|| output::dump_to(&path)) {
        Ok(_) => 0,
        Err(e) => {
            crate::igprof_log!("igprof_dump_now({path}): {e}");
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::exec_env_plan;

    #[test]
    fn an_exec_hands_the_next_image_its_generation() {
        let env: [&[u8]; 4] = [
            b"PATH=/bin",
            b"IGPROF_EXEC_OF=9.1",
            b"IGPROF=-pp",
            b"HOME=/",
        ];
        let (keep, entry) = exec_env_plan(&env, 9, 2).unwrap();
        assert_eq!(keep, [0, 2, 3], "the previous generation's entry goes");
        assert_eq!(entry, b"IGPROF_EXEC_OF=9.2\0");
        // An environment without IGPROF= does not profile the new image.
        assert!(exec_env_plan(&[b"PATH=/bin", b"IGPROF_EXEC_OF=9.1"], 9, 2).is_none());
        assert!(exec_env_plan(&[], 9, 1).is_none());
    }
}
