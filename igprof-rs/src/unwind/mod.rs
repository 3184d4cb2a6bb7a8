//! Stack traces: cached per-PC frame descriptors, framehop on a miss.
