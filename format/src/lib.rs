//! IgProf's profile dump format, owned in one place for the writer (in the
//! injected library, `write`) and the reader (in igprof-analyse, `read`).
pub mod read;
pub mod write;
