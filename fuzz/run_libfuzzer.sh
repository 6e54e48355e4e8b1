#!/usr/bin/env bash
# run_libfuzzer.sh BINARY SECONDS WORKDIR SEEDS [REPRODUCERS]: fuzz one libFuzzer target for a
# bounded time.  New corpus entries go to WORKDIR/corpus (the build tree); the seed corpus and the
# crash reproducers of the repository are read, never written.  A crash leaves its input in
# WORKDIR/ (crash-*, leak-*, timeout-*): copy it to fuzz/regressions/<target>/ once fixed, and it
# is replayed by every build from then on.  Prints libFuzzer's final statistics (runs, exec/s).
set -euo pipefail
bin=$1 seconds=$2 work=$3 seeds=$4 repros=${5:-}
mkdir -p "$work/corpus"
dirs=("$work/corpus")
for d in "$seeds" "$repros"; do  # a target without seeds or reproducers yet starts from nothing
  if [ -n "$d" ] && [ -d "$d" ]; then dirs+=("$d"); fi
done
exec "$bin" -max_total_time="$seconds" -seed=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "${dirs[@]}"
