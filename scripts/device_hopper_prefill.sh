#!/usr/bin/env bash
# scripts/device_hopper_prefill.sh [OUT_DIR] — one run on a GPU machine for the Hopper prefill kernel
# (src/ops/cuda/hopper_prefill.cu): build test_ops_cuda and kvattn for sm_90a (scripts/device-build.sh,
# .devdeps carried), the prefill tests (CudaPrefill.*), compute-sanitizer memcheck and racecheck on
# HP_SANITIZE_FILTER (default CudaPrefill.HopperWgmmaSmall), then `kvattn bench-cuda --only prefill`
# (the wgmma and mma.sync kernels on the Hopper prefill shapes, plans kept).  HP_NCU=1 adds an
# Nsight Compute pass over one wgmma launch (bench-cuda --only prefill --quick).  HP_LIMIT: seconds for
# each of the tests, memcheck and racecheck (run in parallel; default 200); HP_NCU_LIMIT (default 150).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUTDIR="${1:-$ROOT/build/device-out}"
mkdir -p "$OUTDIR"
cd "$ROOT"
t0=$(date +%s)
stamp() { echo "[hp +$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUTDIR/summary.txt"; }
. "$ROOT/scripts/device-deps.sh" > /dev/null
. "$ROOT/scripts/device-build.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$OUTDIR/summary.txt" 2>&1
stamp "build"
device_build "$OUTDIR/build.log" test_ops_cuda kvattn || { stamp "BUILD FAILED"; grep -E "error" "$OUTDIR/build.log" | head -30; tail -20 "$OUTDIR/build.log"; exit 1; }
stamp "build ok"
grep -E "hopper_prefill" -A3 "$OUTDIR/build.log" | grep -iE "spill|warning" | head
T="$DEVICE_BUILD_DIR/tests/test_ops_cuda"
K="$DEVICE_BUILD_DIR/tools/kvattn"
CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
F="${HP_SANITIZE_FILTER:-CudaPrefill.HopperWgmmaSmall}"
timeout "${HP_LIMIT:-200}" "$T" --gtest_filter="${HP_TEST_FILTER:-CudaPrefill.*}" > "$OUTDIR/tests.log" 2>&1 &
tp=$!
timeout "${HP_LIMIT:-200}" "$CS" --tool memcheck --print-limit 10 "$T" --gtest_filter="$F" > "$OUTDIR/memcheck.log" 2>&1 &
mp=$!
timeout "${HP_LIMIT:-200}" "$CS" --tool racecheck --print-limit 10 "$T" --gtest_filter="$F" > "$OUTDIR/racecheck.log" 2>&1 &
rp=$!
wait "$tp"; stamp "tests rc=$?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[       OK|Failure|Expected|Which is|actual|worst|rel" "$OUTDIR/tests.log" | head -40 | tee -a "$OUTDIR/summary.txt"
wait "$mp"; stamp "memcheck rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |Invalid|at 0x" "$OUTDIR/memcheck.log" | head -12 | tee -a "$OUTDIR/summary.txt"
wait "$rp"; stamp "racecheck rc=$?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|^\[  (PASSED|FAILED) |hazard" "$OUTDIR/racecheck.log" | head -8 | tee -a "$OUTDIR/summary.txt"
stamp "bench"
timeout 200 "$K" bench-cuda --only prefill > "$OUTDIR/bench.txt" 2>&1
stamp "bench rc=$?"
grep -E "prefill|ceiling" "$OUTDIR/bench.txt" | tee -a "$OUTDIR/summary.txt"
if [ "${HP_NCU:-0}" = 1 ]; then
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  timeout "${HP_NCU_LIMIT:-150}" "$NCU" --clock-control none -k regex:hp_prefill_kernel -s 3 -c 1 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis "$K" bench-cuda --only prefill --quick \
    > "$OUTDIR/ncu.txt" 2>&1
  stamp "ncu rc=$?"
  grep -E "Duration|Throughput|Pipe|Tensor|Stall|Warp Cycles|Issued|Occupancy" "$OUTDIR/ncu.txt" | cut -c1-140 | head -40 | tee -a "$OUTDIR/summary.txt"
fi
stamp done
