#!/usr/bin/env bash
# scripts/dev/ab_bench.sh LABEL "SETTING_A|SETTING_B|..." ROUNDS GREP BENCH_ARGS... — an A/B of
# environment settings or of two builds on one GPU: runs `kvattn bench-cuda BENCH_ARGS` once per
# setting, alternating the settings for ROUNDS rounds (so drift of the machine hits every arm
# alike), and prints the rows matching GREP prefixed with the setting and round.  A setting is a
# space-separated list of VAR=VALUE words ("-" = none); the word BIN=PATH runs that kvattn binary
# instead of $KVATTN (default build/cuda-release/tools/kvattn).  Each run has a 120 s limit.
#   scripts/dev/ab_bench.sh page "KVATTN_PAGE_DECODE=off|-" 2 '^decode' --batch 64 --kv-len 4096 --kept-plan
#   scripts/dev/ab_bench.sh build "BIN=/tmp/base/kvattn|-" 3 '^prefill' --only prefill
set -uo pipefail
label=$1 settings=$2 rounds=$3 pattern=$4
shift 4
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
KVATTN="${KVATTN:-$ROOT/build/cuda-release/tools/kvattn}"
IFS='|' read -r -a arms <<< "$settings"
for ((i = 1; i <= rounds; ++i)); do
  for e in "${arms[@]}"; do
    [ "$e" = "-" ] && e=""
    bin=$KVATTN vars=""
    for w in $e; do
      case "$w" in BIN=*) bin=${w#BIN=} ;; *) vars="$vars $w" ;; esac
    done
    # shellcheck disable=SC2086
    env $vars timeout 120 "$bin" bench-cuda "$@" 2>&1 | grep -E "$pattern" | sed "s|^|[$label ${e:-default} r$i] |"
  done
done
