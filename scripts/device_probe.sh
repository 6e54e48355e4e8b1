#!/usr/bin/env bash
# scripts/device_probe.sh [OUT_DIR] — focused A/B probes of CUDA knobs in one device call, on the
# binaries carried in .devbin/ (kvattn, test_ops_cuda built for sm_90a on the dev machine; carry
# [".devdeps", ".devbin"]).  Each probe is one word of PROBES (default: all of them, in order):
#   decode the issue-6 decode shapes, each in one process with `--variants $DECODE_VARIANTS`
#          (v6-path option bits / forced splits, default "1/0,1/0"; e.g. "1/0,5/0,1/0,5/0" to
#          alternate the default with an option bit), each variant with a per-unit timeline
#   small  ncu gpu__time_duration of every kernel of `bench-cuda --batch 1 --kv-len 1024`
#          (cold caches, clocks not locked): GPU time of the 1 x 1024 decode call vs its event time;
#          then the cluster kernel's per-CTA stage timeline (KVATTN_SMALL_TIMELINE) on 3 shapes
#          (SMALL_NCU=0 skips the ncu part); when .devbin/kvattn_base (an earlier build) is
#          carried too, the small shapes alternate between the two binaries in the same call
#          (SMALL_ENV_AB="VAR=VALUE": the small shapes also alternate without / with that setting)
#   tests  in parallel: test_ops_cuda on TESTS_FILTER, memcheck on MEMCHECK_FILTER, racecheck on
#          RACECHECK_FILTER (each skipped when empty; TESTS_ENV="VAR=VALUE ..." applies to all three)
#   ab     PROBE_AB="VAR=VALUE#gtest-filter#bench args" — tests, memcheck and the bench with the knob
#          set, and the same bench without it, alternated twice (for a helper's knob)
# Every step has its own time limit; results go to OUT_DIR/probe.txt (and per-step logs).
set -uo pipefail
. "$(dirname "$0")/device-prebuilt.sh"  # OUTDIR ROOT K T CS NCU t0
P="$OUTDIR/probe.txt"
stamp() { echo "[probe +$(( $(date +%s) - t0 ))s] $*" | tee -a "$P"; }
# name, seconds, command... -> OUTDIR/name.log; the gtest / sanitizer summary lines into probe.txt
step() {
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$OUTDIR/$name.log" 2>&1
  stamp "$name rc=$?"
  grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]|ERROR SUMMARY|RACECHECK SUMMARY" "$OUTDIR/$name.log" | head -8 | tee -a "$P"
}
bench() {  # label, env assignments (may be empty), bench args...
  local label=$1 envs=$2; shift 2
  echo "== $label" >> "$P"
  env $envs timeout 90 "$K" bench-cuda "$@" 2>&1 | grep -vE "^case|^kvattn bench" | sed "s/^/[$label] /" | tee -a "$P" > /dev/null
}

for probe in ${PROBES:-decode small}; do
  case "$probe" in
  decode)
    for a in '--batch 64 --kv-len 4096' '--batch 128 --kv-len 4096' '--batch 128 --kv-len 8192 --mixed' \
             '--batch 256 --kv-len 8192' '--batch 256 --kv-len 8192 --fp8'; do
      # shellcheck disable=SC2086
      bench "decode $a" "KVATTN_DECODE_TIMELINE=5" $a --variants "${DECODE_VARIANTS:-1/0,1/0}"
    done
    ;;
  small)
    if [ "${SMALL_NCU:-1}" = 0 ]; then
      :
    elif [ -n "$NCU" ]; then
      timeout 120 "$NCU" --clock-control none --print-kernel-base function \
        --metrics gpu__time_duration.sum "$K" bench-cuda --batch 1 --kv-len 1024 --quick > "$OUTDIR/small_ncu.log" 2>&1
      stamp "small ncu rc=$?"
      # kernel name and duration per launch, then a count per kernel name with the median duration
      awk '/^  [A-Za-z_].*Context/ {name=$1} /gpu__time_duration.sum/ {print name, $(NF-1) ":" $NF}' "$OUTDIR/small_ncu.log" |
        sort | awk '{n[$1]++; v[$1]=v[$1] " " $2} END {for (k in n) print n[k], k, v[k]}' | cut -c1-300 | tee -a "$P"
    else
      stamp "small: no ncu on this machine"
    fi
    bench "small events" "" --batch 1 --kv-len 1024
    if [ -x "$ROOT/.devbin/kvattn_base" ]; then  # a previous build carried along: same-run baseline
      for a in '--batch 1 --kv-len 1024' '--batch 8 --kv-len 1024' '--batch 1 --kv-len 8192' '--batch 16 --kv-len 4096'; do
        for bin in kvattn_base kvattn kvattn_base kvattn; do
          echo "== small $bin $a" >> "$P"
          # shellcheck disable=SC2086
          timeout 60 "$ROOT/.devbin/$bin" bench-cuda $a 2>&1 | grep -E "^decode" | sed "s/^/[small $bin] /" | tee -a "$P" > /dev/null
        done
      done
    fi
    # per-CTA stage stamps of one cluster launch (KVATTN_SMALL_TIMELINE=N: the Nth launch), 3 shapes
    for a in '--batch 1 --kv-len 1024' '--batch 8 --kv-len 1024' '--batch 1 --kv-len 8192'; do
      # shellcheck disable=SC2086
      bench "small timeline $a" "KVATTN_SMALL_TIMELINE=5" $a
    done
    if [ -n "${SMALL_ENV_AB:-}" ]; then
      for a in '--batch 1 --kv-len 1024' '--batch 8 --kv-len 1024' '--batch 1 --kv-len 8192'; do
        for envs in "" "$SMALL_ENV_AB" "" "$SMALL_ENV_AB"; do
          echo "== small [$envs] $a" >> "$P"
          # shellcheck disable=SC2086
          env $envs timeout 60 "$K" bench-cuda $a 2>&1 | grep -E "^decode" | sed "s/^/[small ${envs:-default}] /" | tee -a "$P" > /dev/null
        done
      done
    fi
    ;;
  tests)
    pids=()
    # shellcheck disable=SC2086
    [ -n "${TESTS_FILTER:-}" ] && { step tests 170 env ${TESTS_ENV:-} "$T" --gtest_filter="$TESTS_FILTER" & pids+=($!); }
    # shellcheck disable=SC2086
    [ -n "${MEMCHECK_FILTER:-}" ] && { step memcheck 170 env ${TESTS_ENV:-} "$CS" --tool memcheck --print-limit 20 "$T" --gtest_filter="$MEMCHECK_FILTER" & pids+=($!); }
    # shellcheck disable=SC2086
    [ -n "${RACECHECK_FILTER:-}" ] && { step racecheck 170 env ${TESTS_ENV:-} "$CS" --tool racecheck --print-limit 20 "$T" --gtest_filter="$RACECHECK_FILTER" & pids+=($!); }
    for pid in "${pids[@]}"; do wait "$pid"; done
    ;;
  ab)
    IFS='#' read -r envs filter bargs <<< "${PROBE_AB:?PROBE_AB=VAR=VALUE#filter#bench args}"
    # shellcheck disable=SC2086
    step ab_tests 150 env $envs "$T" --gtest_filter="$filter"
    step ab_memcheck 150 env $envs "$CS" --tool memcheck --print-limit 20 "$T" --gtest_filter="$filter"
    for round in 1 2; do
      # shellcheck disable=SC2086
      bench "ab default r$round" "" $bargs
      # shellcheck disable=SC2086
      bench "ab $envs r$round" "$envs" $bargs
    done
    ;;
  *) stamp "unknown probe $probe" ;;
  esac
done
stamp done
