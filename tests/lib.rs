//! Helpers for the end-to-end tests in `tests/e2e/`: build a C program with
//! the system compiler, run it under `scripts/igprof`, read the report.
