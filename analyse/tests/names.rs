//! Names of code without symbols: a stripped program (tests/programs/
//! stripped_hot.c, built here with the system compiler and `strip`), its
//! separate debug file found through `.gnu_debuglink` (CRC checked) or its
//! build id under repeatable `--debug-dir`s or fetched from a debuginfod
//! server (Debian's `debuginfod`, started here), and JIT code outside any
//! object.
//!
//! The profiles are written here with return addresses chosen inside the
//! program's functions, whose ranges come from the unstripped build.

use object::{Object, ObjectSegment, ObjectSymbol};
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/programs/stripped_hot.c"
);

/// The program built with symbols (`full`) and the same code stripped.
struct Built {
    dir: tempfile::TempDir,
    stripped: PathBuf,
    /// (name prefix, offset of the function's start, its size), in the
    /// address space of the profile's offsets.
    functions: Vec<(&'static str, u64, u64)>,
}

fn run(cmd: &mut Command) {
    let st = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(st.success(), "{cmd:?} failed");
}

impl Built {
    fn new(extra: &[&str]) -> Built {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        run(Command::new("cc")
            .args(["-O2", "-g"])
            .args(extra)
            .arg("-o")
            .arg(&full)
            .arg(SOURCE));
        let stripped = dir.path().join("stripped_hot");
        run(Command::new("strip").arg("-o").arg(&stripped).arg(&full));
        let data = std::fs::read(&full).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let seg = file.segments().next().unwrap();
        let vmbase = seg.address() - seg.file_range().0;
        let functions = ["hot_a", "hot_b", "hot_c", "main"]
            .into_iter()
            .map(|f| {
                let s = file
                    .symbols()
                    .find(|s| {
                        s.name()
                            .is_ok_and(|n| n == f || n.starts_with(&format!("{f}.")))
                    })
                    .unwrap_or_else(|| panic!("{f} not in the symbol table"));
                assert!(s.size() >= 16, "{f}: {} bytes", s.size());
                (f, s.address() - vmbase, s.size())
            })
            .collect();
        Built {
            dir,
            stripped,
            functions,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn function(&self, name: &str) -> (u64, u64) {
        let f = self.functions.iter().find(|f| f.0 == name).unwrap();
        (f.1, f.2)
    }

    /// Writes the separate debug file of the program (objcopy
    /// --only-keep-debug) to `to`.
    fn debug_file(&self, to: &Path) {
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(self.path().join("full"))
            .arg(to));
    }

    /// A profile of `program`: main calls each hot function, sampled at
    /// two or three addresses inside it (12 ticks in hot_a, 5 in hot_b, 2
    /// in hot_c), plus 4 ticks in JIT code called from main.
    fn profile(&self, program: &Path) -> PathBuf {
        let at = |f: &str, frac: u64| {
            let (start, size) = self.function(f);
            start + size * frac / 4
        };
        let text = format!(
            "P=(ID=1 N=(stripped_hot) T=0.010000)\n\
             C1 FN0=(F0=({prog})+{main} N=(@?0x1))+0\n\
             C2 FN1=(F0+{a1} N=(@?0x2))+0 V0=(PERF_TICKS):(5,5,5)\n\
             C2 FN2=(F0+{a2} N=(@?0x3))+0 V0:(4,4,4)\n\
             C2 FN3=(F0+{a3} N=(@?0x4))+0 V0:(3,3,3)\n\
             C2 FN4=(F0+{b1} N=(@?0x5))+0 V0:(3,3,3)\n\
             C2 FN5=(F0+{b2} N=(@?0x6))+0 V0:(2,2,2)\n\
             C2 FN6=(F0+{c1} N=(@?0x7))+0 V0:(1,1,1)\n\
             C2 FN7=(F0+{c2} N=(@?0x8))+0 V0:(1,1,1)\n\
             C2 FN8=(F1=(<unknown>)+139817508593008 N=(@?0x7f29cceedd70))+0 V0:(4,4,4)\n",
            prog = program.display(),
            main = at("main", 2),
            a1 = at("hot_a", 1),
            a2 = at("hot_a", 2),
            a3 = at("hot_a", 3),
            b1 = at("hot_b", 1),
            b2 = at("hot_b", 3),
            c1 = at("hot_c", 1),
            c2 = at("hot_c", 2),
        );
        let p = self.path().join("profile.txt");
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The flat cumulative table of igprof-analyse ARGS PROFILE.
    fn flat(&self, args: &[&str], profile: &Path) -> String {
        self.flat_env(args, profile, &[]).0
    }

    /// The flat cumulative table of igprof-analyse ARGS PROFILE run with
    /// the environment variables `env` (no debuginfod server otherwise),
    /// and its stderr.
    fn flat_env(&self, args: &[&str], profile: &Path, env: &[(&str, &str)]) -> (String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_igprof-analyse"))
            .args(args)
            .arg(profile)
            .current_dir(self.path())
            .env_remove("DEBUGINFOD_URLS")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        // The profile's address outside any object (JIT code, here made
        // up) has no perf map to name it: said, and not what these tests
        // are about.
        let err = err
            .lines()
            .filter(|l| !l.contains("(JIT code)"))
            .map(|l| format!("{l}\n"))
            .collect();
        let report = String::from_utf8(out.stdout).unwrap();
        let flat = report
            .split("Flat profile (self")
            .next()
            .unwrap()
            .to_string();
        (flat, err)
    }

    /// The program's build id, in hex.
    fn build_id(&self) -> String {
        let data = std::fs::read(&self.stripped).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let id = file
            .build_id()
            .unwrap()
            .expect("the compiler writes a build id");
        id.iter().map(|x| format!("{x:02x}")).collect()
    }
}

/// The function column of a flat table, in rank order.
fn functions(flat: &str) -> Vec<String> {
    flat.lines()
        .filter(|l| l.ends_with(']'))
        .map(|l| {
            let name = l.split_whitespace().nth(2).unwrap();
            name.to_string()
        })
        .collect()
}

#[test]
fn a_stripped_program_has_one_entry_per_function() {
    let b = Built::new(&[]);
    let flat = b.flat(&[], &b.profile(&b.stripped));
    let name = |f: &str| format!("@{{stripped_hot+{}}}", b.function(f).0);
    assert_eq!(
        functions(&flat),
        [
            "<spontaneous>".to_string(),
            name("main"),
            name("hot_a"),
            name("hot_b"),
            "@?0x7f29cceedd70".to_string(),
            name("hot_c"),
        ],
        "{flat}"
    );
    assert!(
        flat.contains(&format!("   52.2       0.12  {} [3]", name("hot_a"))),
        "{flat}"
    );
    assert!(
        flat.contains(&format!("    8.7       0.02  {} [6]", name("hot_c"))),
        "{flat}"
    );
}

#[test]
fn a_debug_file_found_through_the_debug_link_names_the_stripped_program() {
    let b = Built::new(&[]);
    let dbg = b.path().join("debug");
    std::fs::create_dir(&dbg).unwrap();
    b.debug_file(&dbg.join("stripped_hot.debug"));
    let linked = b.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    let program = linked.join("stripped_hot");
    // objcopy records the debug file's name and CRC.
    run(Command::new("objcopy")
        .arg(format!(
            "--add-gnu-debuglink={}",
            dbg.join("stripped_hot.debug").display()
        ))
        .arg(&b.stripped)
        .arg(&program));
    let profile = b.profile(&program);
    let names = [
        "<spontaneous>",
        "main",
        "hot_a",
        "hot_b",
        "@?0x7f29cceedd70",
        "hot_c",
    ];
    // Directly in the directory, or under it at the program's own path (gdb's layout).
    assert_eq!(
        functions(&b.flat(&["--debug-dir", "debug"], &profile)),
        names
    );
    let nested = b.path().join("nested");
    let under = nested.join(linked.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&under).unwrap();
    std::fs::rename(
        dbg.join("stripped_hot.debug"),
        under.join("stripped_hot.debug"),
    )
    .unwrap();
    assert_eq!(
        functions(&b.flat(&["--debug-dir", "debug", "--debug-dir", "nested"], &profile)),
        names
    );

    // The debug file of another build under the linked name: its CRC does
    // not match, so it is not used and functions keep their FDE names.
    let other = Built::new(&["-DOTHER_BUILD", "-fno-inline", "-O1"]);
    other.debug_file(&under.join("stripped_hot.debug"));
    let flat = b.flat(&["--debug-dir", "nested"], &profile);
    assert_eq!(
        functions(&flat)[2],
        format!("@{{stripped_hot+{}}}", b.function("hot_a").0),
        "{flat}"
    );
    assert!(!flat.contains("hot_"), "{flat}");
}

#[test]
fn a_debug_file_is_found_by_build_id_under_any_debug_dir() {
    let b = Built::new(&[]);
    let data = std::fs::read(&b.stripped).unwrap();
    let id = object::File::parse(&*data)
        .unwrap()
        .build_id()
        .unwrap()
        .expect("the compiler writes a build id")
        .to_vec();
    let hex: String = id.iter().map(|x| format!("{x:02x}")).collect();
    let under = b.path().join("second/.build-id").join(&hex[..2]);
    std::fs::create_dir_all(&under).unwrap();
    b.debug_file(&under.join(format!("{}.debug", &hex[2..])));
    std::fs::create_dir(b.path().join("first")).unwrap();
    let profile = b.profile(&b.stripped);
    assert_eq!(
        functions(&b.flat(&["--debug-dir", "first", "--debug-dir", "second"], &profile)),
        [
            "<spontaneous>",
            "main",
            "hot_a",
            "hot_b",
            "@?0x7f29cceedd70",
            "hot_c"
        ]
    );
}

/// A debuginfod server on 127.0.0.1 serving the debug files of one
/// directory; stopped when dropped.
struct Debuginfod {
    child: std::process::Child,
    url: String,
}

impl Debuginfod {
    fn start(files: &Path, work: &Path) -> Debuginfod {
        // A free port: bind one, note it, let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(work.join("debuginfod.log")).unwrap();
        let child = Command::new("debuginfod")
            .arg("-d")
            .arg(work.join("debuginfod.sqlite"))
            .arg("-F")
            .arg(files)
            .args(["-p", &port.to_string()])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("debuginfod: {e} (scripts/setup installs it)"));
        Debuginfod {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Waits until the server serves `build_id`'s debug file (it scans
    /// its directory after starting).
    fn wait_for(&self, build_id: &str, work: &Path) {
        use std::io::{Read, Write};
        let addr = self.url.trim_start_matches("http://").to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let status = std::net::TcpStream::connect(&addr).ok().and_then(|mut s| {
                let req = format!("GET /buildid/{build_id}/debuginfo HTTP/1.0\r\n\r\n");
                s.write_all(req.as_bytes()).ok()?;
                let mut answer = Vec::new();
                s.read_to_end(&mut answer).ok()?;
                let head = String::from_utf8_lossy(&answer[..answer.len().min(12)]).into_owned();
                Some(head)
            });
            if status.as_deref().is_some_and(|h| h.ends_with(" 200")) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "debuginfod does not serve {build_id} after 30 s (last: {status:?}): {}",
                std::fs::read_to_string(work.join("debuginfod.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_debug_file_is_fetched_from_a_debuginfod_server_into_its_cache() {
    let b = Built::new(&[]);
    let served = b.path().join("served");
    std::fs::create_dir(&served).unwrap();
    b.debug_file(&served.join("stripped_hot.debug"));
    let hex = b.build_id();
    let profile = b.profile(&b.stripped);
    let named = [
        "<spontaneous>",
        "main",
        "hot_a",
        "hot_b",
        "@?0x7f29cceedd70",
        "hot_c",
    ];
    let cache = b.path().join("cache");
    let cache_env = ("DEBUGINFOD_CACHE_PATH", cache.to_str().unwrap());

    let server = Debuginfod::start(&served, b.path());
    server.wait_for(&hex, b.path());
    // Without DEBUGINFOD_URLS nothing is fetched.
    let (flat, _) = b.flat_env(&[], &profile, &[cache_env]);
    assert!(!flat.contains("hot_"), "{flat}");
    assert!(!cache.exists());
    let urls = format!("http://127.0.0.1:1 {}", server.url);
    let (flat, err) = b.flat_env(&[], &profile, &[("DEBUGINFOD_URLS", &urls), cache_env]);
    assert_eq!(functions(&flat), named, "{flat}");
    // The first server is down: one warning, and the second one answers.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("igprof-analyse: warning: debuginfod http://127.0.0.1:1: "),
        "{err}"
    );
    let cached = cache.join(&hex).join("debuginfo");
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        std::fs::read(served.join("stripped_hot.debug")).unwrap()
    );
    drop(server);

    // The server is gone: the cache still names everything, without asking.
    let (flat, err) = b.flat_env(&[], &profile, &[("DEBUGINFOD_URLS", &urls), cache_env]);
    assert_eq!(functions(&flat), named, "{flat}");
    assert_eq!(err, "");
    // An empty cache and no server: the stripped program's names, one
    // warning per server, never an error.
    let empty = b.path().join("empty-cache");
    let urls = format!("{urls} https://debuginfod.example");
    let (flat, err) = b.flat_env(
        &[],
        &profile,
        &[
            ("DEBUGINFOD_URLS", &urls),
            ("DEBUGINFOD_CACHE_PATH", empty.to_str().unwrap()),
        ],
    );
    assert_eq!(
        functions(&flat)[2],
        format!("@{{stripped_hot+{}}}", b.function("hot_a").0)
    );
    assert_eq!(err.lines().count(), 3, "{err}");
    assert!(err.contains("https is not supported"), "{err}");
}
