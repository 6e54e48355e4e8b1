#!/usr/bin/env bash
# scripts/device_alternate.sh LABEL "ENV_A|ENV_B|..." ROUNDS GREP BENCH_ARGS... — same-process-class
# A/B of environment knobs on the carried binary (.devbin/kvattn): runs `kvattn bench-cuda
# BENCH_ARGS` once per setting, alternating the settings for ROUNDS rounds, and prints the rows
# matching GREP prefixed with the setting and round.  Settings are `|`-separated lists of
# VAR=VALUE words ("-" = no extra setting); the word BIN=NAME runs .devbin/NAME instead of
# .devbin/kvattn (an A/B of two builds, e.g. the base commit's kvattn packed as kvattn_base).
# Each run has a 120 s limit.  For a device call, e.g.
#   bash scripts/device_alternate.sh prefill "KVATTN_PREFILL_V6=0|KVATTN_PREFILL_V6=1" 2 '^prefill' --only prefill
#   bash scripts/device_alternate.sh small "BIN=kvattn_base|-" 2 '^decode' --only small
set -uo pipefail
label=$1 settings=$2 rounds=$3 pattern=$4
shift 4
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/scripts/device-deps.sh" > /dev/null
IFS='|' read -r -a envs <<< "$settings"
for ((i = 1; i <= rounds; ++i)); do
  for e in "${envs[@]}"; do
    [ "$e" = "-" ] && e=""
    bin=kvattn vars=""
    for w in $e; do
      case "$w" in BIN=*) bin=${w#BIN=} ;; *) vars="$vars $w" ;; esac
    done
    # shellcheck disable=SC2086
    env $vars timeout 120 "$ROOT/.devbin/$bin" bench-cuda "$@" 2>&1 | grep -E "$pattern" | sed "s/^/[$label ${e:-default} r$i] /"
  done
done
