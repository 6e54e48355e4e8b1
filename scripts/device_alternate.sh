#!/usr/bin/env bash
# scripts/device_alternate.sh LABEL "ENV_A|ENV_B|..." ROUNDS GREP BENCH_ARGS... — same-process-class
# A/B of environment knobs on the carried binary (.devbin/kvattn): runs `kvattn bench-cuda
# BENCH_ARGS` once per setting, alternating the settings for ROUNDS rounds, and prints the rows
# matching GREP prefixed with the setting and round.  Settings are `|`-separated lists of
# VAR=VALUE words ("-" = no extra setting).  Each run has a 120 s limit.  For a device call, e.g.
#   bash scripts/device_alternate.sh prefill "KVATTN_PREFILL_V6=0|KVATTN_PREFILL_V6=1" 2 '^prefill' --only prefill
set -uo pipefail
label=$1 settings=$2 rounds=$3 pattern=$4
shift 4
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/scripts/device-deps.sh" > /dev/null
IFS='|' read -r -a envs <<< "$settings"
for ((i = 1; i <= rounds; ++i)); do
  for e in "${envs[@]}"; do
    [ "$e" = "-" ] && e=""
    # shellcheck disable=SC2086
    env $e timeout 120 "$ROOT/.devbin/kvattn" bench-cuda "$@" 2>&1 | grep -E "$pattern" | sed "s/^/[$label ${e:-default} r$i] /"
  done
done
