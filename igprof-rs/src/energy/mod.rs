//! Energy readings (RAPL via perf power PMU, powercap, MSR) and their attribution to threads.
