#!/usr/bin/env bash
# scripts/device_check.sh — the whole device validation of a tree in one call (about 6-8
# minutes on one H200; the NCCL parts skip on one GPU):
#   binaries (built here by scripts/device-build.sh, or carried in .devbin/)
#   -> every CUDA test (ops + backend, incl. NCCL DCP), the ops suite in parallel shards (the
#      tests a shard's time limit cut off are listed and run again in a short extra phase)
#   -> compute-sanitizer memcheck and racecheck on filters, also in parallel
#   -> `kvattn run` on CUDA (default with lazy and eager module loading, fp8, DCP over NCCL)
#   -> `kvattn bench-dcp` -> `kvattn bench-cuda` (alone on the GPU: nothing else runs then).
# Every step has its own time limit, so one slow step cannot eat the call.  The device tool
# brings back at most 8 files: the logs travel as one logs.tgz; summary.txt is printed.
#
#   scripts/device_check.sh [OUT_DIR]     (device tool: carry [".devdeps"], and ".devbin" with
#                                          KVATTN_PREBUILT=1; .devbin/bins.tar.xz, when present,
#                                          is unpacked first by scripts/device-deps.sh)
# Knobs: KVATTN_PREBUILT=1 (run kvattn, test_ops_cuda, test_attention_cuda from .devbin/, built on
#        the dev machine with -DKVATTN_CUDA_ARCHS=90a; falls back to building when they do not run),
#        KVATTN_MEMCHECK_FILTER, KVATTN_RACECHECK_FILTER, KVATTN_RACECHECK_PREFILL_FILTER (gtest
#        filters for test_ops_cuda), KVATTN_BENCH_ARGS (extra bench-cuda arguments), KVATTN_BENCH_LIMIT
#        (seconds for the bench, default 200: the target rows run with and without a kept plan),
#        KVATTN_CHECK_QUICK=1 (no bench, no runs), KVATTN_CHECK_AB="NAME=VAR=VALUE#FILTER#BENCH ..."
#        (for each entry: test_ops_cuda on FILTER with VAR=VALUE, memcheck of the same, and
#        `kvattn bench-cuda BENCH` with VAR=VALUE after the default bench; BENCH words joined by ','),
#        KVATTN_SHARDS (parallel test_ops_cuda processes, default 4; memcheck runs 1.5x as many),
#        KVATTN_RACECHECK_SHARDS (default 2), KVATTN_TEST_LIMIT / KVATTN_SANITIZER_LIMIT (seconds
#        per process, default 150 / 130), KVATTN_CHECK_ONE_PHASE=1 (tests and sanitizers in one
#        parallel phase: shorter, the timings of the tests are then not meaningful),
#        KVATTN_CHECK_RERUN_CUT=0 (a shard cut by its limit: only list the ops tests it did not
#        finish; by default they run again, spread over KVATTN_SHARDS processes, after the phase).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUTDIR="${1:-${OUT:-$ROOT/build/device-out}}"
LOGS="$(mktemp -d)/logs"
mkdir -p "$OUTDIR" "$LOGS"
t0=$(date +%s)
stamp() { echo "[check +$(( $(date +%s) - t0 ))s] $*" | tee -a "$LOGS/summary.txt"; }
save() {  # after every step, so a call cut short by its limit still brings back what ran
  tar -czf "$OUTDIR/logs.tgz" -C "$(dirname "$LOGS")" logs
  cp "$LOGS/summary.txt" "$OUTDIR/summary.txt"
}
trap 'stamp done; save' EXIT

{ nvidia-smi; nvidia-smi topo -m; nvcc --version || /usr/local/cuda/bin/nvcc --version; nproc; } > "$LOGS/env.txt" 2>&1
. "$ROOT/scripts/device-deps.sh" > /dev/null
. "$ROOT/scripts/device-build.sh"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
B="$DEVICE_BUILD_DIR"; K="$B/tools/kvattn"; TOPS="$B/tests/test_ops_cuda"; TATT="$B/tests/test_attention_cuda"
if [ "${KVATTN_PREBUILT:-0}" = 1 ] && "$ROOT/.devbin/kvattn" version > /dev/null 2>&1 &&
   "$ROOT/.devbin/test_ops_cuda" --gtest_list_tests > /dev/null 2>&1 &&
   "$ROOT/.devbin/test_attention_cuda" --gtest_list_tests > /dev/null 2>&1; then
  K="$ROOT/.devbin/kvattn"; TOPS="$ROOT/.devbin/test_ops_cuda"; TATT="$ROOT/.devbin/test_attention_cuda"
  stamp "GPUs: $NGPU; prebuilt binaries from .devbin/"
else
  [ "${KVATTN_PREBUILT:-0}" = 1 ] && stamp "prebuilt binaries do not run here; building"
  stamp "GPUs: $NGPU; build -> build.log"
  device_build "$LOGS/build.log" kvattn test_ops_cuda test_attention_cuda
  brc=$?
  stamp "build rc=$brc; ptxas spill warnings: $(grep -ci 'spill' "$LOGS/build.log")"; save
  [ $brc -ne 0 ] && { tail -40 "$LOGS/build.log"; exit $brc; }
fi
"$K" version >> "$LOGS/summary.txt" 2>&1

# The last gtest / sanitizer / run lines of a log, into the summary.
digest() {
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|ERROR SUMMARY|RACECHECK SUMMARY|correctness|throughput  |attention / step|slowest step|DCP 2 step" \
    "$1" | head -14 | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
  # a process cut by its limit prints no summary: count what finished and what was reported
  echo "    ($(grep -c '^\[       OK \]' "$1") tests OK, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$1") failed," \
    "$(grep -E '^========= [A-Z]' "$1" | grep -vcE 'COMPUTE-SANITIZER|SUMMARY') sanitizer reports)" | tee -a "$LOGS/summary.txt"
}
step() {  # name, seconds, command...  (output -> NAME.log)
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  stamp "$name rc=$rc$([ $rc = 124 ] && echo ' (TIME LIMIT)')"
  digest "$LOGS/$name.log"
  save
}
# Runs "name secs command..." jobs given one per line on stdin in parallel, then reports each.
parallel_steps() {
  local -a names=() pids=()
  while read -r name secs cmd; do
    [ -z "$name" ] && continue
    ( eval "timeout $secs $cmd" > "$LOGS/$name.log" 2>&1; echo $? > "$LOGS/$name.rc" ) &
    names+=("$name"); pids+=($!)
  done
  wait "${pids[@]}"
  for n in "${names[@]}"; do
    local rc; rc=$(cat "$LOGS/$n.rc" 2>/dev/null || echo '?')
    stamp "$n rc=$rc$([ "$rc" = 124 ] && echo ' (TIME LIMIT)')"
    digest "$LOGS/$n.log"
  done
  save
}
SH=${KVATTN_SHARDS:-4}   # parallel test processes (the tests' CPU references are the slow part)
MSH=$((SH + SH / 2))      # memcheck shards
RSH=${KVATTN_RACECHECK_SHARDS:-2}
TT=${KVATTN_TEST_LIMIT:-150} ST=${KVATTN_SANITIZER_LIMIT:-130}  # per-process limits (s)
CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
MF="${KVATTN_MEMCHECK_FILTER:-*Decode*:*Merge*:*Reshape*:*Zero*:*Copy*:*Fp8*:*Mask*:*Dcp*:CudaPrefill.HeadDims*}"
RF="${KVATTN_RACECHECK_FILTER:-*Decode*:*Merge*:*Fp8*:*Mask*}"
# the prefill kernels on their own racecheck (session 3's single racecheck ran out of time first)
RPF="${KVATTN_RACECHECK_PREFILL_FILTER:-CudaPrefill.HeadDims*:CudaPrefill.CausalAndNonCausal*:CudaPrefill.WindowSoftCap*}"

# 1. tests: the ops suite in SH shards, the backend suite, each A/B knob's tests
test_jobs() {
  for i in $(seq 0 $((SH - 1))); do
    echo "test_ops_cuda_$i $TT env GTEST_TOTAL_SHARDS=$SH GTEST_SHARD_INDEX=$i $TOPS"
  done
  echo "test_attention_cuda $TT $TATT"
  for ab in ${KVATTN_CHECK_AB:-}; do
    IFS="#" read -r nv filt _ <<< "$ab"; n=${nv%%=*}; kv=${nv#*=}
    echo "ab_${n}_tests $TT env $kv $TOPS --gtest_filter='$filt'"
  done
}
# 2. sanitizers (memcheck in MSH shards, racecheck in RSH shards + the prefill kernels)
sanitizer_jobs() {
  for i in $(seq 0 $((MSH - 1))); do
    echo "memcheck_$i $ST env GTEST_TOTAL_SHARDS=$MSH GTEST_SHARD_INDEX=$i $CS --tool memcheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$MF'"
  done
  for i in $(seq 0 $((RSH - 1))); do
    echo "racecheck_$i $ST env GTEST_TOTAL_SHARDS=$RSH GTEST_SHARD_INDEX=$i $CS --tool racecheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$RF'"
  done
  echo "racecheck_prefill $ST $CS --tool racecheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$RPF'"
  for ab in ${KVATTN_CHECK_AB:-}; do
    IFS="#" read -r nv filt _ <<< "$ab"; n=${nv%%=*}; kv=${nv#*=}
    echo "ab_${n}_memcheck $ST env $kv $CS --tool memcheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$filt'"
  done
}
# The ops tests a shard cut by its limit never finished: gtest gives test j of the list (in
# --gtest_list_tests order) to shard j % SH, and a finished test logs "[       OK ]" or
# "[  FAILED  ]".  Prints "Suite.Name" lines.
unfinished_tests() {
  local i rc
  "$TOPS" --gtest_list_tests 2>/dev/null |
    awk '/^Running/ {next} /^[^ ]/ {suite=$1; next} /^  [^ ]/ {print suite $1}' > "$LOGS/all_tests.txt"
  for i in $(seq 0 $((SH - 1))); do
    rc=$(cat "$LOGS/test_ops_cuda_$i.rc" 2>/dev/null || echo 0)
    [ "$rc" = 124 ] || continue
    awk -v n="$SH" -v i="$i" '(NR - 1) % n == i' "$LOGS/all_tests.txt" |
      grep -vxFf <(grep -hoE '^\[ +(OK|FAILED) +\] [A-Za-z0-9_./]+' "$LOGS/test_ops_cuda_$i.log" | awk '{print $NF}') || true
  done
}
# ... run again, spread over SH processes (KVATTN_CHECK_RERUN_CUT=0: only listed in the summary)
rerun_jobs() {
  local -a left
  mapfile -t left < <(unfinished_tests)
  [ ${#left[@]} -eq 0 ] && return
  stamp "ops tests not reached by their shard: ${#left[@]}: $(IFS=:; echo "${left[*]}")" >&2  # stdout is the job list
  [ "${KVATTN_CHECK_RERUN_CUT:-1}" = 1 ] || return
  local k j filt
  for k in $(seq 0 $((SH - 1))); do
    filt=""
    for ((j = k; j < ${#left[@]}; j += SH)); do filt="$filt${filt:+:}${left[j]}"; done
    [ -n "$filt" ] && echo "test_ops_cuda_rerun_$k $TT $TOPS --gtest_filter='$filt'"
  done
}
# one phase (KVATTN_CHECK_ONE_PHASE=1: everything at once, for a short call) or two
if [ "${KVATTN_CHECK_ONE_PHASE:-0}" = 1 ]; then
  { test_jobs; sanitizer_jobs; } | parallel_steps
  rerun_jobs | parallel_steps
else
  test_jobs | parallel_steps
  rerun_jobs | parallel_steps
  sanitizer_jobs | parallel_steps
fi
if [ "${KVATTN_CHECK_QUICK:-0}" != 1 ]; then
  # The default run twice, CUDA modules loaded lazily (the driver's default) and eagerly: the
  # per-step timings in the JSON show what the first launches of each kernel cost the first steps.
  step run_cuda 45 env CUDA_MODULE_LOADING=LAZY "$K" run --quiet --device cuda --json "$LOGS/run_cuda.json"
  step run_cuda_eager 45 env CUDA_MODULE_LOADING=EAGER "$K" run --quiet --device cuda --json "$LOGS/run_cuda_eager.json"
  step run_cuda_fp8 45 "$K" run --quiet --device cuda --model tiny-gemma2 --kv-cache-dtype fp8 --layout HND
  if [ "$NGPU" -ge 2 ]; then
    step run_dcp2 60 "$K" run --quiet --device cuda --dcp 2
    step bench_dcp 60 "$K" bench-dcp --dcp 2 --batch 8 --kv-len 131072
  fi
  step bench_cuda "${KVATTN_BENCH_LIMIT:-200}" "$K" bench-cuda ${KVATTN_BENCH_ARGS:-}
  cat "$LOGS/bench_cuda.log"
  for ab in ${KVATTN_CHECK_AB:-}; do
    IFS="#" read -r nv _ bargs <<< "$ab"; n=${nv%%=*}; kv=${nv#*=}
    step "ab_${n}_bench" 60 env "$kv" "$K" bench-cuda ${bargs//,/ }
    cat "$LOGS/ab_${n}_bench.log"
  done
fi
