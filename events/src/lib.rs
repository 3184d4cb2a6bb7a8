//! perf event specifications, as `perf record -e` spells them, for
//! igprof's `-e EVENT[/PERIOD]`: the launcher checks their syntax
//! ([`parse`]) so that a mistake stops the run with one line, and the
//! injected library resolves them ([`resolve`]) against the PMUs the
//! kernel describes in `/sys/bus/event_source/devices` into the fields of
//! a `perf_event_attr`, at start-up.
//!
//! Owns: the grammar of a specification, the kernel's generic event
//! numbers (hardware, software, hardware cache), and reading a PMU's
//! `type`, `format/` and `events/` files.
//!
//! Also AMD IBS ([`ibs`]): the `-ibs` options, what the IBS PMUs offer,
//! and decoding each sample's raw registers.
//!
//! Must never: open an event or touch the process (it only reads files
//! under the directory it is given, so tests use fake sysfs trees).

pub mod ibs;
mod resolve;
mod spec;

pub use resolve::{resolve, Attr, ResolveError, DEVICES};
pub use spec::{parse, split_list, Event, Period, Spec, SpecError};
