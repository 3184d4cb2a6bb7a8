//! Allocation-free writer of IgProf-format profiles, used by libigprof.so.
