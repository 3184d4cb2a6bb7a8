#!/usr/bin/env bash
# igprof-analyse benchmark: a generated 1 GiB (uncompressed) memory profile,
# parsed and reported (flat cumulative, flat self and the full call graph, as
# `igprof-analyse -r MEM_TOTAL` prints them). Prints wall time, CPU time and
# peak RSS from /usr/bin/time -v. The profile is generated once into
# ${BENCH_DIR:-/tmp/igprof-bench} and never committed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${BENCH_DIR:-/tmp/igprof-bench}
mkdir -p "$dir"
prof=$dir/analyse-1g.txt
[ -s "$prof" ] || python3 "$here/bench/analyse-gen-profile.py" "$prof" --size-mb 1024
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/target}
cargo build -q --release -p igprof-analyse
bin=$CARGO_TARGET_DIR/release/igprof-analyse
echo "profile: $(du -h --apparent-size "$prof" | cut -f1) $(wc -l < "$prof") lines; load: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v "$bin" -r MEM_TOTAL "$prof" > "$dir/analyse-report.txt" 2> "$dir/analyse-time.txt"
grep -E 'Elapsed|User time|System time|Maximum resident' "$dir/analyse-time.txt"
echo "report: $(wc -c < "$dir/analyse-report.txt") bytes in $dir/analyse-report.txt"
# The same profile gzipped, as igprof writes profiles (ANALYSE_GZ=1).
if [ "${ANALYSE_GZ:-0}" = 1 ]; then
  [ -s "$prof.gz" ] || gzip -1 -c "$prof" > "$prof.gz"
  echo "gzip: $(du -h --apparent-size "$prof.gz" | cut -f1)"
  /usr/bin/time -v "$bin" -r MEM_TOTAL "$prof.gz" > "$dir/analyse-report-gz.txt" 2> "$dir/analyse-time-gz.txt"
  grep -E 'Elapsed|User time|System time|Maximum resident' "$dir/analyse-time-gz.txt"
  cmp -s "$dir/analyse-report.txt" "$dir/analyse-report-gz.txt" && echo "gzip report identical"
fi
