#!/usr/bin/env bash
# scripts/device_check.sh — the whole device validation of a tree in one call (at most about
# 9 minutes, usually less, on nvidia-h200-x2; the NCCL parts skip on one GPU):
#   build (scripts/device-build.sh) -> every CUDA test (ops + backend, incl. NCCL DCP)
#   -> compute-sanitizer memcheck and racecheck on filters -> `kvattn run` on CUDA (default,
#   fp8, DCP over NCCL) -> `kvattn bench-dcp` -> `kvattn bench-cuda`.
# Every step has its own time limit, so one slow step cannot eat the call.  The device tool
# brings back at most 8 files: the logs travel as one logs.tgz; summary.txt is printed.
#
#   scripts/device_check.sh [OUT_DIR]     (device tool: carry [".devdeps"])
# Knobs: KVATTN_MEMCHECK_FILTER, KVATTN_RACECHECK_FILTER (gtest filters for test_ops_cuda),
#        KVATTN_BENCH_ARGS (extra bench-cuda arguments), KVATTN_CHECK_QUICK=1 (no bench, no runs).
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
stamp "GPUs: $(nvidia-smi -L 2>/dev/null | wc -l); build -> build.log"
device_build "$LOGS/build.log" kvattn test_ops_cuda test_attention_cuda
brc=$?
stamp "build rc=$brc; ptxas spill warnings: $(grep -ci 'spill' "$LOGS/build.log")"; save
[ $brc -ne 0 ] && { tail -40 "$LOGS/build.log"; exit $brc; }
B="$DEVICE_BUILD_DIR"; K="$B/tools/kvattn"; TOPS="$B/tests/test_ops_cuda"; TATT="$B/tests/test_attention_cuda"
"$K" version >> "$LOGS/summary.txt" 2>&1

step() {  # name, seconds, command...  (output -> NAME.log, last gtest/sanitizer lines to the summary)
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  stamp "$name rc=$rc$([ $rc = 124 ] && echo ' (TIME LIMIT)')"
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY|RACECHECK SUMMARY|correctness|throughput  |attention / step|slowest step|DCP 2 step" \
    "$LOGS/$name.log" | head -12 | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
  save
}
step test_ops_cuda 200 "$TOPS"
step test_attention_cuda 150 "$TATT"
CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
step memcheck 100 "$CS" --tool memcheck --print-limit 20 "$TOPS" \
  --gtest_filter="${KVATTN_MEMCHECK_FILTER:-*Decode*:*Merge*:*Reshape*:*Zero*:*Copy*:*Fp8*:*Mask*:*Dcp*:CudaPrefill.HeadDims*}"
step racecheck 70 "$CS" --tool racecheck --print-limit 20 "$TOPS" \
  --gtest_filter="${KVATTN_RACECHECK_FILTER:-*Decode*:*Merge*:*Fp8*:*Mask*}"
# the prefill kernels on their own step (session 3's single racecheck step ran out of time
# before reaching them)
step racecheck_prefill 110 "$CS" --tool racecheck --print-limit 20 "$TOPS" \
  --gtest_filter="${KVATTN_RACECHECK_PREFILL_FILTER:-CudaPrefill.HeadDims*:CudaPrefill.CausalAndNonCausal*:CudaPrefill.WindowSoftCap*}"
if [ "${KVATTN_CHECK_QUICK:-0}" != 1 ]; then
  # The default run twice, CUDA modules loaded lazily (the driver's default) and eagerly: the
  # per-step timings in the JSON show what the first launches of each kernel cost the first steps.
  CUDA_MODULE_LOADING=LAZY step run_cuda 60 "$K" run --quiet --device cuda --json "$LOGS/run_cuda.json"
  CUDA_MODULE_LOADING=EAGER step run_cuda_eager 60 "$K" run --quiet --device cuda --json "$LOGS/run_cuda_eager.json"
  step run_cuda_fp8 60 "$K" run --quiet --device cuda --model tiny-gemma2 --kv-cache-dtype fp8 --layout HND
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    step run_dcp2 60 "$K" run --quiet --device cuda --dcp 2
    step bench_dcp 60 "$K" bench-dcp --dcp 2 --batch 8 --kv-len 131072
  fi
  step bench_cuda 120 "$K" bench-cuda ${KVATTN_BENCH_ARGS:-}
  cat "$LOGS/bench_cuda.log"
fi
