//! A profile never writes through a link someone else planted.
//!
//! Another user of the machine (uid [`PLANTER`]) plants symbolic links, or
//! files of their own, at every name the library or the analyser may
//! create: the profile's final name, the old `<name>.tmp`, the `$TMPDIR`
//! fallback, the descriptor store's directory and files, the file prepared
//! before a privilege drop, the analyser's outputs. Each run, as root and
//! as `nobody`, in a sticky world-writable directory and in a plain one,
//! must leave the link's target byte-identical, put the profile where the
//! user asked (or say in one line why not and where it went), and leave
//! the program's output and status as they are unprofiled.
//!
//! The tests need root (to be root, to become nobody and to plant files of
//! another user); as another user they say so and pass.

use std::ffi::OsStr;
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use igprof_tests::*;

/// The other user, who plants links.
const PLANTER: u32 = 4242;
const NOBODY: u32 = 65534;
const VICTIM: &[u8] = b"precious contents, not a profile\n";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Root,
    Nobody,
}

impl Who {
    fn uid(self) -> u32 {
        match self {
            Who::Root => 0,
            Who::Nobody => NOBODY,
        }
    }

    /// A command running `prog` as this user.
    fn command(self, prog: &Path) -> Command {
        match self {
            Who::Root => Command::new(prog),
            Who::Nobody => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                    .arg(prog);
                c
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    /// World-writable and sticky, owned by root (as /tmp).
    Sticky,
    /// The user's own directory.
    Plain,
}

fn chown(p: &Path, uid: u32) {
    lchown(p, Some(uid), Some(uid)).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A new directory `dir` of kind `place` for `who`.
fn directory(dir: &Path, place: Place, who: Who) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    match place {
        Place::Sticky => chmod(dir, 0o1777),
        Place::Plain => {
            chown(dir, who.uid());
            chmod(dir, 0o755);
        }
    }
    dir.to_path_buf()
}

/// A file the profiled user may write, which must stay as it is.
fn victim(path: &Path, who: Who) -> PathBuf {
    std::fs::write(path, VICTIM).unwrap();
    chown(path, who.uid());
    chmod(path, 0o644);
    path.to_path_buf()
}

fn assert_intact(victim: &Path) {
    assert_eq!(
        std::fs::read(victim).unwrap(),
        VICTIM,
        "{} was written through a planted link",
        victim.display()
    );
}

/// A link at `at` to `to`, planted by the other user.
fn plant(at: &Path, to: &Path) {
    symlink(to, at).unwrap();
    chown(at, PLANTER);
}

fn is_link(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

/// The test program, built once into `base` (readable by nobody).
fn program(base: &Path) -> PathBuf {
    chmod(base, 0o755);
    build(base, "planted.c", "planted", &[])
}

/// `igprof ARGS` as `who` in `dir`, with `env` only (no store setting of
/// the test run's).
fn igprof_as(who: Who, dir: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Output {
    let mut c = who.command(&launcher());
    c.args(args)
        .current_dir(dir)
        .env("IGPROF_LIB", lib())
        .env_remove("IGPROF_CACHE_DIR")
        .env_remove("XDG_CACHE_HOME");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run the launcher")
}

/// `igprof ARGS ./planted` as `who` in `base`, with `env`.
fn run(who: Who, base: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let prog = base.join("planted");
    let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    all.push(prog.as_os_str());
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    igprof_as(who, base, &all, &env)
}

/// `igprof -mp -o OUT ./planted` as `who` in `base`, with `$TMPDIR` at
/// `tmp` and no store.
fn run_to(who: Who, base: &Path, out: &Path, tmp: &Path) -> Output {
    let prog = base.join("planted");
    igprof_as(
        who,
        base,
        &[
            "-mp".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
            prog.as_os_str(),
        ],
        &[
            ("TMPDIR", tmp.as_os_str()),
            ("IGPROF_CACHE_DIR", "none".as_ref()),
        ],
    )
}

/// What the program does unprofiled: its output and status.
fn assert_unchanged(o: &Output) {
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()),
        (Some(0), "allocated 1000\n"),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The profile at `p`: a regular file holding the program's 1,000 calls.
fn assert_profile(p: &Path) {
    assert!(!is_link(p), "{} is still a link", p.display());
    let prof = parse_strict(&read_text(p)).unwrap();
    assert_eq!(
        under(&prof, "MEM_TOTAL", "allocate").0,
        1000,
        "{}",
        p.display()
    );
}

/// No temporary file of ours is left in `dir`.
fn assert_no_temporaries(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !(name.ends_with(".tmp") && name.len() > "p.gz.tmp".len()),
            "{name} left in {}",
            dir.display()
        );
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn links_planted_at_the_profiles_names_are_replaced_never_followed() {
    if !is_root() {
        eprintln!("not root: cannot plant another user's links or run as nobody");
        return;
    }
    let base = scratch("planted_names");
    program(&base);
    for who in [Who::Root, Who::Nobody] {
        for place in [Place::Sticky, Place::Plain] {
            let case = format!("{who:?}-{place:?}");
            let d = directory(&base.join(&case), place, who);
            let fallback = directory(&base.join(format!("{case}-tmp")), Place::Plain, who);
            let v = victim(&base.join(format!("{case}-victim")), who);
            let dest = d.join("p.gz");
            plant(&dest, &v);
            plant(&d.join("p.gz.tmp"), &v);
            let o = run_to(who, &base, &dest, &fallback);
            assert_unchanged(&o);
            assert_intact(&v);
            if who == Who::Nobody && place == Place::Sticky {
                // The sticky bit forbids replacing the other user's link:
                // the profile goes to $TMPDIR, and a line says so.
                assert!(is_link(&dest), "{case}");
                assert!(stderr(&o).contains("instead"), "{case}: {}", stderr(&o));
                assert_profile(&fallback.join("p.gz"));
            } else {
                assert_profile(&dest);
                assert!(!stderr(&o).contains("instead"), "{case}: {}", stderr(&o));
            }
            assert_no_temporaries(&d);
            assert_no_temporaries(&fallback);
        }
    }
}

#[test]
fn a_fallback_directory_with_a_planted_link_loses_nothing_and_says_why() {
    if !is_root() {
        eprintln!("not root: cannot plant another user's links or run as nobody");
        return;
    }
    let base = scratch("planted_fallback");
    program(&base);
    let d = directory(&base.join("out"), Place::Sticky, Who::Nobody);
    let tmp = directory(&base.join("tmp"), Place::Sticky, Who::Nobody);
    let v = victim(&base.join("victim"), Who::Nobody);
    for dir in [&d, &tmp] {
        plant(&dir.join("p.gz"), &v);
        plant(&dir.join("p.gz.tmp"), &v);
    }
    let o = run_to(Who::Nobody, &base, &d.join("p.gz"), &tmp);
    assert_unchanged(&o);
    assert_intact(&v);
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.contains("could not write the profile") && l.contains("p.gz")),
        "{err}"
    );
    assert!(is_link(&d.join("p.gz")) && is_link(&tmp.join("p.gz")));
    assert_no_temporaries(&d);
    assert_no_temporaries(&tmp);
}

#[test]
fn the_descriptor_store_is_used_only_in_the_users_own_private_directory() {
    if !is_root() {
        eprintln!("not root: cannot make directories of another user or run as nobody");
        return;
    }
    let base = scratch("planted_store");
    program(&base);
    for who in [Who::Root, Who::Nobody] {
        let case = format!("{who:?}");
        let v = victim(&base.join(format!("{case}-victim")), who);
        // Owned by the other user; the user's own but writable by all; a
        // link of the other user to the user's own private directory.
        let theirs = base.join(format!("{case}-theirs"));
        std::fs::create_dir(&theirs).unwrap();
        chown(&theirs, PLANTER);
        chmod(&theirs, 0o777);
        let shared = directory(&base.join(format!("{case}-shared")), Place::Plain, who);
        chmod(&shared, 0o777);
        let own = directory(&base.join(format!("{case}-own")), Place::Plain, who);
        chmod(&own, 0o700);
        let link = base.join(format!("{case}-link"));
        plant(&link, &own);
        for (store, why) in [
            (&theirs, "belongs to another user"),
            (&shared, "other users may write into it"),
            (&link, "symbolic link"),
        ] {
            let o = run(
                who,
                &base,
                &["-d", "-mp", "-o", "/dev/null"],
                &[("IGPROF_CACHE_DIR", store)],
            );
            assert_unchanged(&o);
            let err = stderr(&o);
            assert!(
                err.lines().any(|l| l
                    .contains("the store of hook plans and unwind descriptors cannot be kept")
                    && l.contains(why)),
                "{case} {}: {err}",
                store.display()
            );
            for d in [&theirs, &shared, &own] {
                assert_eq!(
                    std::fs::read_dir(d).unwrap().count(),
                    0,
                    "{case}: {}",
                    d.display()
                );
            }
        }
        // HOME of another user (root under sudo keeps the user's HOME): no
        // directory is made in it, the store is off and a line says why.
        let home = base.join(format!("{case}-home"));
        std::fs::create_dir(&home).unwrap();
        chown(&home, PLANTER);
        chmod(&home, 0o777);
        let prog = base.join("planted");
        let o = igprof_as(
            who,
            &base,
            &[
                "-d".as_ref(),
                "-mp".as_ref(),
                "-o".as_ref(),
                "/dev/null".as_ref(),
                prog.as_os_str(),
            ],
            &[("HOME", home.as_os_str())],
        );
        assert_unchanged(&o);
        assert!(
            stderr(&o).lines().any(|l| l
                .contains("the store of hook plans and unwind descriptors cannot be kept")
                && l.contains("belongs to another user")),
            "{case}: {}",
            stderr(&o)
        );
        assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0, "{case}");

        // The user's own store with every file replaced by a link to the
        // victim: nothing is read or written through them.
        let store = directory(&base.join(format!("{case}-store")), Place::Plain, who);
        chmod(&store, 0o700);
        // The first process makes the directory, the second keeps its
        // hook plans there too.
        for _ in 0..2 {
            let o = run(
                who,
                &base,
                &["-mp", "-o", "/dev/null"],
                &[("IGPROF_CACHE_DIR", &store)],
            );
            assert_unchanged(&o);
        }
        let unwind = store.join("unwind");
        let names: Vec<PathBuf> = std::fs::read_dir(&unwind)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            names.iter().any(|n| n.to_string_lossy().contains("plans-")),
            "{case}: the store holds descriptors and hook plans: {names:?}"
        );
        for n in &names {
            std::fs::remove_file(n).unwrap();
            symlink(&v, n).unwrap();
            chown(n, who.uid());
        }
        let o = run(
            who,
            &base,
            &["-d", "-mp", "-o", "/dev/null"],
            &[("IGPROF_CACHE_DIR", &store)],
        );
        assert_unchanged(&o);
        assert_intact(&v);
        assert!(
            stderr(&o).contains("descriptors added"),
            "{case}: the files were derived again: {}",
            stderr(&o)
        );
        assert_no_temporaries(&unwind);
    }
}

#[test]
fn a_file_prepared_before_a_privilege_drop_is_never_a_link_or_another_users() {
    if !is_root() {
        eprintln!("not root: setuid cannot be tested here");
        return;
    }
    let base = scratch("planted_setuid");
    chmod(&base, 0o755);
    build(&base, "drop_privileges.c", "drop_privileges", &[]);
    // Root's directory, where nobody cannot create files once the program
    // has dropped to it; $TMPDIR one where nobody can.
    let d = directory(&base.join("out"), Place::Plain, Who::Root);
    let tmp = directory(&base.join("tmp"), Place::Sticky, Who::Nobody);
    let v = victim(&base.join("victim"), Who::Nobody);
    let theirs = base.join("theirs");
    std::fs::write(&theirs, VICTIM).unwrap();
    chown(&theirs, PLANTER);
    for (planted, why) in [("link", "symbolic link"), ("file", "another user")] {
        let dest = d.join(format!("{planted}.gz"));
        match planted {
            "link" => plant(&dest, &v),
            _ => {
                std::fs::copy(&theirs, &dest).unwrap();
                chown(&dest, PLANTER);
                chmod(&dest, 0o666);
            }
        }
        let o = igprof_as(
            Who::Root,
            &base,
            &[
                "-mp".as_ref(),
                "-o".as_ref(),
                dest.as_os_str(),
                "./drop_privileges".as_ref(),
            ],
            &[
                ("TMPDIR", tmp.as_os_str()),
                ("IGPROF_CACHE_DIR", "none".as_ref()),
            ],
        );
        assert_eq!(
            (o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()),
            (Some(0), "uid 65534\n"),
            "{}",
            stderr(&o)
        );
        assert_intact(&v);
        let err = stderr(&o);
        assert!(
            err.contains(&format!("not preparing {}", dest.display())) && err.contains(why),
            "{planted}: {err}"
        );
        assert!(err.contains("instead"), "{planted}: {err}");
        if planted == "file" {
            assert_eq!(std::fs::read(&dest).unwrap(), VICTIM);
            assert_eq!(std::fs::metadata(&dest).unwrap().uid(), PLANTER);
        } else {
            assert!(is_link(&dest));
        }
        let p = parse_strict(&read_text(&tmp.join(format!("{planted}.gz")))).unwrap();
        assert_eq!(under(&p, "MEM_TOTAL", "allocate").0, 1000);
    }
}

#[test]
fn the_analysers_outputs_replace_planted_links() {
    if !is_root() {
        eprintln!("not root: cannot plant another user's links");
        return;
    }
    let base = scratch("planted_views");
    program(&base);
    let prof = base.join("p.gz");
    let o = run_to(Who::Root, &base, &prof, &base);
    assert_unchanged(&o);
    let d = directory(&base.join("views"), Place::Sticky, Who::Root);
    let v = victim(&base.join("victim"), Who::Root);
    for (flag, name) in [
        ("--folded", "out.folded"),
        ("--flame", "out.svg"),
        ("--pprof", "out.pb.gz"),
        ("--html", "out.html"),
        ("--db", "out.db"),
    ] {
        let dest = d.join(name);
        plant(&dest, &v);
        let o = Command::new(analyser())
            .args(["-r", "MEM_TOTAL", flag])
            .arg(&dest)
            .arg(&prof)
            .output()
            .unwrap();
        assert!(o.status.success(), "{flag}: {}", stderr(&o));
        assert_intact(&v);
        assert!(!is_link(&dest), "{flag}");
        assert!(std::fs::metadata(&dest).unwrap().len() > 0, "{flag}");
    }
    assert_no_temporaries(&d);
    // A device is still written in place.
    let o = Command::new(analyser())
        .args(["-r", "MEM_TOTAL", "--folded", "/dev/null"])
        .arg(&prof)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}
