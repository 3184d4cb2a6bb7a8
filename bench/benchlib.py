"""Helpers shared by the Python benchmarks in bench/ (pp-bench, real-programs)
and, through its command line, the shell ones (mem-compare).

Owns: finding libigprof.so and the launcher, running a command and taking the
CPU time of its whole process tree, and counting the allocation calls in
igprof-rs memory profiles. Prints nothing itself; the scripts do.

    python3 bench/benchlib.py mem-total-calls PROFILE.gz...
"""
import ctypes, gzip, os, re, resource, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The cargo target directory ($CARGO_TARGET_DIR, else target/).
TARGET = os.environ.get("CARGO_TARGET_DIR", "target")
TARGET = TARGET if os.path.isabs(TARGET) else os.path.join(ROOT, TARGET)
# The launcher users install: its static build (cargo build --release
# --target <arch>-unknown-linux-musl -p igprof-launcher; scripts/test builds it).
LAUNCHER_TRIPLE = f"{os.uname().machine}-unknown-linux-musl"
IGPROF = os.path.join(TARGET, LAUNCHER_TRIPLE, "release", "igprof")


def libigprof(who):
    """IGPROF_LIB, else $CARGO_TARGET_DIR (or target/) /release/libigprof.so;
    exits with a message naming `who` when it is not built."""
    lib = os.environ.get("IGPROF_LIB") or os.path.join(TARGET, "release", "libigprof.so")
    if not os.path.exists(lib):
        sys.exit(f"{who}: {lib} missing: run cargo build --release -p igprof-rs")
    if not os.path.exists(IGPROF):
        sys.exit(f"{who}: {IGPROF} missing: run cargo build --release --target {LAUNCHER_TRIPLE} -p igprof-launcher")
    return lib


def gperftools_profiler():
    """gperftools' CPU profiler library (libprofiler.so from
    libgoogle-perftools-dev, else the runtime's libprofiler.so.0), or None."""
    for name in ("libprofiler.so", "libprofiler.so.0"):
        path = os.path.join("/usr/lib", os.uname().machine + "-linux-gnu", name)
        if os.path.exists(path):
            return path
    return None


_subreaper = False


def become_subreaper():
    # PR_SET_CHILD_SUBREAPER (36): a descendant whose parent exits first is
    # re-parented to this process instead of init, so that run_tree can wait
    # for it and its CPU time counts.
    global _subreaper
    if not _subreaper:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
        _subreaper = True


def children_cpu():
    """User + system seconds of every descendant this process has reaped."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def reap_all():
    """Waits for every remaining child, orphaned descendants included (see
    become_subreaper), so that their CPU time is in children_cpu()."""
    while True:
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            break


class Run:
    """One finished run: exit code (negative: killed by that signal), CPU
    seconds (user+sys of every process of the tree), wall seconds (until the
    command itself exited), stdout and stderr as bytes, and the peak RSS in
    KiB of the tree's largest process (ru_maxrss: the highest of any one
    process, not their sum; 0 when not measured)."""

    def __init__(self, code, cpu, wall, stdout, stderr, maxrss_kb=0):
        self.code, self.cpu, self.wall, self.stdout, self.stderr = code, cpu, wall, stdout, stderr
        self.maxrss_kb = maxrss_kb


# GNU time (Debian's `time` package), for the peak RSS of a run.
TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None


def run_tree(argv, cwd=None, env=None):
    """Runs argv (stdin /dev/null, output to temporary files, so a
    descendant that keeps a pipe open cannot hang the caller), waits for it
    and then for any orphaned descendant; CPU time is the growth of this
    process's RUSAGE_CHILDREN, which holds every reaped descendant. The
    caller must have no other child running."""
    become_subreaper()
    e = dict(os.environ, **(env or {}))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile() as rss:
        # The peak RSS comes from GNU time, which forks the command: a
        # command forked from this process would start with its ru_maxrss
        # at this Python's size (Linux keeps the larger of an exec's old
        # and new memory), whatever it uses itself.
        if TIME:
            argv = [TIME, "-q", "-f", "%M", "-o", rss.name, *argv]
        before = children_cpu()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, cwd=cwd, env=e, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, _ = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        reap_all()
        try:
            maxrss = int(open(rss.name).read().split()[-1])
        except (ValueError, IndexError):
            maxrss = 0
        cpu = children_cpu() - before
        out.seek(0)
        err.seek(0)
        return Run(p.returncode, cpu, wall, out.read(), err.read(), maxrss)


_COUNTER = re.compile(r"V(\d+)(?:=\(([A-Z_]+)\))?:\(([0-9a-f]+),")


def mem_total_calls(paths):
    """Allocation calls recorded in igprof-rs profiles: the sum of MEM_TOTAL
    counts (the first field of each MEM_TOTAL counter) over every file."""
    calls = 0
    for path in paths:
        names = {}
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            for m in _COUNTER.finditer(f.read()):
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                if names.get(m.group(1)) == "MEM_TOTAL":
                    calls += int(m.group(3), 16)
    return calls


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "mem-total-calls":
        print(mem_total_calls(sys.argv[2:]))
    else:
        sys.exit("usage: benchlib.py mem-total-calls PROFILE.gz...")
