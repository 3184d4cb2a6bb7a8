//! `--pprof FILE.pb.gz`: Google's profile.proto, gzipped, for `go tool
//! pprof`, pprof's web UI and the tools that read Go profiles.
//!
//! One or two sample types per counter, with units, named as Go names its
//! own: MEM_TOTAL is `alloc_objects`/count (calls) and `alloc_space`/bytes,
//! MEM_LIVE `inuse_objects`/`inuse_space`, PERF_TICKS `samples`/count and
//! `cpu`/nanoseconds (ticks x period); any other counter is its name in
//! lower case, in bytes for MEM_MAX and counts otherwise. The selected
//! counter's main type is the default one. One sample per call path with a
//! value of its own. One function per function (per source line with
//! `--lines`, whose ` (file:line)` becomes the function's file and the
//! line), one location per function and the functions `--inline` shows
//! inlined into it (a line each, innermost first), one mapping per object file with its build id when the
//! object can be read. There are no addresses: functions are already named
//! (`has_functions`), so pprof does not try to symbolize.
//!
//! The messages are written with prost's derive from [`proto`], a copy of
//! profile.proto's fields: no protoc at build time, and no dependency on a
//! pprof crate (the maintained ones are profilers, with their own sampling
//! and unwinding code).
//!
//! Owns: the mapping from counters to sample types.

use super::{Counter, FuncId, Input, Unit, View, ViewError};
use prost::Message;
use rustc_hash::FxHashMap;
use std::io::Write;

/// profile.proto (github.com/google/pprof/proto/profile.proto), field for
/// field.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

pub struct Pprof;

/// Where a sample type's value comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    /// The counter's value times this.
    Value(i64),
    /// The counter's calls.
    Calls,
}

/// The sample types of a counter: (type, unit, source); the last is the
/// counter's main one.
fn sample_types(c: &Counter) -> Vec<(String, &'static str, Source)> {
    let v = |t: &str, u| (t.to_string(), u, Source::Value(1));
    let n = |t: &str| (t.to_string(), "count", Source::Calls);
    match c.name.as_str() {
        "MEM_TOTAL" => vec![n("alloc_objects"), v("alloc_space", "bytes")],
        "MEM_LIVE" => vec![n("inuse_objects"), v("inuse_space", "bytes")],
        "PERF_TICKS" => vec![
            v("samples", "count"),
            (
                "cpu".to_string(),
                "nanoseconds",
                Source::Value((c.scale * 1e9).round() as i64),
            ),
        ],
        "CALL_TIME" => vec![n("calls"), v("wall", "nanoseconds")],
        name => {
            let unit = if c.unit == Unit::Bytes {
                "bytes"
            } else {
                "count"
            };
            vec![v(&name.to_lowercase(), unit)]
        }
    }
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: FxHashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.id("");
        s
    }
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// `name (file.c:12)` as (`name`, `file.c`, 12): the ` (file:line)` that
/// `--lines` appends.
pub fn split_line(name: &str) -> Option<(&str, &str, i64)> {
    let rest = name.strip_suffix(')')?;
    let open = rest.rfind(" (")?;
    let (file, line) = rest[open + 2..].rsplit_once(':')?;
    let line: i64 = line.parse().ok()?;
    if file.is_empty() || file.contains(['(', ')']) {
        return None;
    }
    Some((&name[..open], file, line))
}

/// The GNU build id of an object file, in hex; reads only what it needs.
fn build_id(path: &str) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(file);
    let obj = object::File::parse(&cache).ok()?;
    let id = object::Object::build_id(&obj).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// The profile of `input`.
pub fn profile(input: &Input<'_>) -> proto::Profile {
    let mut p = proto::Profile::default();
    let mut strings = Strings::new();
    let fns = input.functions;

    // Sample types: per counter, its types and where each value goes.
    let mut types: Vec<Vec<(usize, Source)>> = Vec::new();
    for ct in input.counters {
        let mut mine = Vec::new();
        for (t, u, src) in sample_types(&ct.counter) {
            mine.push((p.sample_type.len(), src));
            p.sample_type.push(proto::ValueType {
                r#type: strings.id(&t),
                unit: strings.id(u),
            });
        }
        types.push(mine);
    }
    if let Some(first) = input.counters.first() {
        let main = sample_types(&first.counter).pop().expect("a sample type");
        p.default_sample_type = strings.id(&main.0);
        p.period_type = Some(proto::ValueType {
            r#type: strings.id(&main.0),
            unit: strings.id(main.1),
        });
        p.period = match main.2 {
            Source::Value(k) => k,
            Source::Calls => 1,
        };
    }
    let mut comment = format!("igprof-analyse {}", input.files.join(" "));
    if input.counters.first().is_some_and(|c| c.baseline.is_some()) {
        comment.push_str(" (values: profiles minus the baseline)");
    }
    p.comment.push(strings.id(&comment));

    // Mappings (one per object), functions and locations (one per function,
    // or per function and line).
    let mut mapping_of: Vec<Option<u64>> = vec![None; fns.objects().len()];
    let mut location_of: FxHashMap<Vec<FuncId>, u64> = FxHashMap::default();
    let mut function_ids: FxHashMap<(String, String), u64> = FxHashMap::default();
    // A location is a function and the functions inlined into it (outer
    // first); its lines go innermost first, as pprof orders them.
    let mut location = |group: &[FuncId], p: &mut proto::Profile, strings: &mut Strings| -> u64 {
        if let Some(&l) = location_of.get(group) {
            return l;
        }
        let f = group[0];
        let o = fns.object_id(f) as usize;
        let mapping_id = *mapping_of[o].get_or_insert_with(|| {
            let path = fns.object(f);
            let id = p.mapping.len() as u64 + 1;
            let build = if input.read_objects && path.starts_with('/') {
                build_id(path).unwrap_or_default()
            } else {
                String::new()
            };
            p.mapping.push(proto::Mapping {
                id,
                filename: strings.id(path),
                build_id: strings.id(&build),
                has_functions: true,
                has_filenames: input.lines,
                has_line_numbers: input.lines,
                ..Default::default()
            });
            id
        });
        let mut lines = Vec::with_capacity(group.len());
        for &f in group.iter().rev() {
            let full = fns.name(f);
            let (name, file, line) = match input.lines.then(|| split_line(full)).flatten() {
                Some(s) => s,
                None => (full, "", 0),
            };
            let next = p.function.len() as u64 + 1;
            let function_id = *function_ids
                .entry((name.to_string(), file.to_string()))
                .or_insert_with(|| {
                    p.function.push(proto::Function {
                        id: next,
                        name: strings.id(name),
                        system_name: strings.id(name),
                        filename: strings.id(file),
                        start_line: 0,
                    });
                    next
                });
            lines.push(proto::Line {
                function_id,
                line,
                column: 0,
            });
        }
        if lines.len() > 1 {
            p.mapping[mapping_id as usize - 1].has_inline_frames = true;
        }
        let id = p.location.len() as u64 + 1;
        p.location.push(proto::Location {
            id,
            mapping_id,
            address: 0,
            line: lines,
            is_folded: false,
        });
        location_of.insert(group.to_vec(), id);
        id
    };

    // Samples: one per call path with a value, the values of every counter.
    let width = p.sample_type.len();
    let mut sample_at: FxHashMap<(Vec<FuncId>, Vec<bool>), usize> = FxHashMap::default();
    for (ct, types) in input.counters.iter().zip(&types) {
        ct.tree.for_each_frames(|path, inlined, node| {
            if node.value == 0 && node.calls == 0 {
                return;
            }
            let key = (path.to_vec(), inlined.to_vec());
            let i = match sample_at.get(&key) {
                Some(&i) => i,
                None => {
                    // Frames inlined into the one before join its location.
                    let mut groups: Vec<&[FuncId]> = Vec::new();
                    let mut start = 0;
                    for k in 1..=path.len() {
                        if k == path.len() || !inlined[k] {
                            groups.push(&path[start..k]);
                            start = k;
                        }
                    }
                    let locs = groups
                        .iter()
                        .rev()
                        .map(|g| location(g, &mut p, &mut strings))
                        .collect();
                    sample_at.insert(key, p.sample.len());
                    p.sample.push(proto::Sample {
                        location_id: locs,
                        value: vec![0; width],
                        label: Vec::new(),
                    });
                    p.sample.len() - 1
                }
            };
            let values = &mut p.sample[i].value;
            for &(at, src) in types {
                values[at] += match src {
                    Source::Value(k) => node.value.saturating_mul(k),
                    Source::Calls => node.calls,
                };
            }
        });
    }
    p.string_table = strings.table;
    p
}

impl View for Pprof {
    fn name(&self) -> &'static str {
        "--pprof"
    }
    fn counters(&self) -> super::Counters {
        super::Counters::All
    }
    fn write(&self, input: &Input<'_>, out: &mut dyn Write) -> Result<(), ViewError> {
        let bytes = profile(input).encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_suffixes_split_only_when_well_formed() {
        assert_eq!(split_line("main (a.c:12)"), Some(("main", "a.c", 12)));
        assert_eq!(split_line("f(int) (x.cc:3)"), Some(("f(int)", "x.cc", 3)));
        assert_eq!(split_line("main"), None);
        assert_eq!(split_line("f(int)"), None);
        assert_eq!(split_line("g (a.c:x)"), None);
    }

    #[test]
    fn counters_map_to_go_sample_types() {
        let names = |c: &str| -> Vec<(String, &'static str)> {
            sample_types(&Counter::new(c, 0.005))
                .into_iter()
                .map(|(t, u, _)| (t, u))
                .collect()
        };
        let s = |t: &str, u| (t.to_string(), u);
        assert_eq!(
            names("MEM_TOTAL"),
            [s("alloc_objects", "count"), s("alloc_space", "bytes")]
        );
        assert_eq!(
            names("MEM_LIVE"),
            [s("inuse_objects", "count"), s("inuse_space", "bytes")]
        );
        assert_eq!(
            names("PERF_TICKS"),
            [s("samples", "count"), s("cpu", "nanoseconds")]
        );
        assert_eq!(names("MEM_MAX"), [s("mem_max", "bytes")]);
        assert_eq!(names("FD_USED"), [s("fd_used", "count")]);
        assert_eq!(names("NRG_PKG"), [s("nrg_pkg", "count")]);
        let cpu = sample_types(&Counter::new("PERF_TICKS", 0.005));
        assert_eq!(cpu[1].2, Source::Value(5_000_000));
    }
}
