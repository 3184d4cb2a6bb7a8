//! The profile's records in IgProf's format: header, counters, functions
//! and files, then each merged node with its stack and values.
//!
//! Owns the order in which the records are written ([`write_profile`]).
//!
//! Must never: write a record the format's grammar refuses (the writer,
//! format::write, checks it).

use igprof_format::write::{CounterRef, FileRef, FuncRef, Sink, WriteError, Writer};

use super::merge::HashMap;
use super::resolve::{resolve, Naming, Symbols};
use super::view::ProfileTree;
use crate::base::counters;

pub(super) fn write_profile<S: Sink, T: ProfileTree>(
    sink: S,
    m: &T,
    naming: &Naming,
) -> Result<S, WriteError> {
    let mut w = Writer::new(sink);
    let rt = crate::base::run::info();
    let mut tick = None;
    crate::modules::each(crate::base::options::get(), |md| {
        tick = tick.or(md.header_tick.map(|f| f(crate::base::options::get())))
    });
    let tick = tick.unwrap_or(0.0);
    // Facts IgProf's header has no field for (a sampled memory profile,
    // counting groups, when the process started and the dump was written)
    // go after the program's name (igprof_format::notes).
    let mut notes: Vec<String> = Vec::new();
    crate::modules::each(crate::base::options::get(), |md| {
        notes.extend(md.header_note.and_then(|f| f()))
    });
    use igprof_format::notes::{time_note, DUMPED, STARTED};
    use std::time::Duration;
    let started = crate::base::run::started_ns();
    let now = crate::sys::clock_ns(libc::CLOCK_REALTIME).unwrap_or(0);
    notes.push(time_note(STARTED, Duration::from_nanos(started)));
    notes.push(time_note(DUMPED, Duration::from_nanos(now)));
    super::journal::note_dumped(now);
    notes.extend(super::timeline::note());
    notes.extend(super::snapshot_why().map(|w| igprof_format::notes::snapshot_note(&w)));
    let program = igprof_format::notes::join(&rt.program, &notes);
    w.header(crate::sys::getpid() as u64, &program, tick)?;
    let mut syms = Symbols {
        files: HashMap::default(),
        funcs: HashMap::default(),
        exe: rt.exe.clone(),
    };
    let mut counter_defined = vec![false; m.nslots()];
    let mut values = vec![(0u64, 0u64, 0u64); m.nslots()];
    // Per code address once written: its symbol's start and its
    // function's id. Its names are needed only once, for the function's
    // definition; kept small and sized for every address at once, the
    // table costs no regrowth (a small cc1's 3,700 addresses made it
    // rehash four times, 400 page faults in all).
    let mut known: HashMap<usize, (usize, u32)> =
        HashMap::with_capacity_and_hasher(naming.addresses(), Default::default());
    let mut kids = Vec::new();
    // Iterative pre-order walk: (node, depth).
    let mut stack: Vec<(T::Id, u32)> = Vec::new();
    m.top(&mut kids);
    stack.extend(kids.iter().rev().map(|&k| (k, 1)));
    while let Some((id, depth)) = stack.pop() {
        let addr = m.addr(id);
        // A function met for the first time: its names and file.
        let mut fresh = None;
        let (sym_addr, fnid) = match known.get(&addr) {
            Some(&k) => k,
            None => {
                let r = resolve(addr, &syms.exe, m.synthetic(), naming);
                let next_file = syms.files.len() as u32;
                let mut new_file = false;
                let fid = syms
                    .files
                    .entry(r.file_key)
                    .or_insert_with(|| {
                        new_file = true;
                        (next_file, r.file_path.clone())
                    })
                    .0;
                let next_fn = syms.funcs.len() as u32;
                let mut new_fn = false;
                let fnid = *syms
                    .funcs
                    .entry((r.file_key, r.sym_addr))
                    .or_insert_with(|| {
                        new_fn = true;
                        next_fn
                    });
                known.insert(addr, (r.sym_addr, fnid));
                let sym_addr = r.sym_addr;
                if new_fn {
                    fresh = Some((r, new_file, fid));
                }
                (sym_addr, fnid)
            }
        };
        let func = match &fresh {
            Some((r, new_file, fid)) => FuncRef::New {
                id: fnid,
                file: if *new_file {
                    FileRef::New {
                        id: *fid,
                        path: &r.file_path,
                    }
                } else {
                    FileRef::Known(*fid)
                },
                object_offset: r.object_offset,
                name: &r.name,
            },
            None => FuncRef::Known(fnid),
        };
        w.node(depth, func, (addr - sym_addr) as u64)?;
        let any = m.values(id, &mut values);
        let written = if any { &values[..] } else { &[] };
        for ((s, defined), &(t, v, p)) in counter_defined.iter_mut().enumerate().zip(written) {
            if t == 0 && v == 0 && p == 0 {
                continue;
            }
            let cref = if *defined {
                CounterRef::Known(s as u32)
            } else {
                *defined = true;
                CounterRef::New {
                    id: s as u32,
                    name: counters::def_of_slot(s).name.as_bytes(),
                }
            };
            w.counter(cref, t, v, p)?;
            for l in m.leaks(id, s) {
                w.leak(l.addr, l.size)?;
            }
        }
        w.end_node()?;
        // Children in order.
        m.children(id, &mut kids);
        for &k in kids.iter().rev() {
            stack.push((k, depth + 1));
        }
    }
    Ok(w.into_sink())
}
