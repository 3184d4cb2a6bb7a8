//! Streaming reader of IgProf-format profiles.
