#!/usr/bin/env bash
# scripts/device.sh — build kvattn's CUDA kernels for sm_90a on a machine with an NVIDIA GPU,
# run every CUDA test (CTest label `cuda`) and the kernel benchmarks, and write logs.
#
#   scripts/device.sh [all|test|bench|sanitize|ncu] [OUT_DIR]
#
# all = build + ctest -L cuda + compute-sanitizer memcheck and racecheck + `kvattn bench-cuda`.  Knobs:
#   KVATTN_SANITIZE_FILTER='*'   gtest filter for the memcheck pass (default: the fast tests)
#   KVATTN_RACECHECK_FILTER=...  gtest filter for the racecheck pass (after memcheck)
#   KVATTN_SKIP_SANITIZER=1      skip memcheck and racecheck
#   KVATTN_PREBUILT=1            run binaries carried in .devbin/ instead of building
#   KVATTN_BENCH_ARGS / KVATTN_NCU_ARGS   extra arguments (e.g. "--batch 64 --kv-len 4096")
# With the device tool (no registry there), prepare once on the dev machine:
#   echo /.devdeps/ >> .git/info/exclude; mkdir .devdeps; cd .devdeps; apt-get download \
#     libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libgtest-dev libgmock-dev googletest \
#     libbenchmark-dev libbenchmark1debian libcli11-dev nlohmann-json3-dev libdlpack-dev pybind11-dev
# and call with carry [".devdeps"]:  bash scripts/device.sh all
#
# OUT_DIR defaults to $OUT (the device tool's result folder) or build/device-out.  Logs:
#   env.txt (nvidia-smi, nvcc), build.log, ctest.log, sanitizer.log, racecheck.log, bench.txt, resources.txt
# Dependencies: uses the system's -dev packages when CMake finds them; otherwise unpacks the
# Debian .debs carried in .devdeps/ (fmt, spdlog, gtest, CLI11, nlohmann-json, dlpack,
# benchmark) into a private prefix with `dpkg -x` (never into /).
set -uo pipefail
MODE="${1:-all}"
OUTDIR="${2:-${OUT:-$(cd "$(dirname "$0")/.." && pwd)/build/device-out}}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUTDIR"
cd "$ROOT"
t0=$(date +%s)
stamp() { echo "[device.sh +$(( $(date +%s) - t0 ))s] $*"; }

{
  echo "== nvidia-smi"; nvidia-smi 2>&1 || true
  echo "== nvcc"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 || true
  echo "== cmake"; cmake --version 2>&1 | head -1
  echo "== host"; uname -a; nproc; (cat /etc/os-release | head -2) 2>/dev/null
} > "$OUTDIR/env.txt" 2>&1
stamp "environment -> env.txt"; grep -E "H200|H100|A100|release|NVIDIA-SMI" "$OUTDIR/env.txt" | head -4

# ---- dependencies ------------------------------------------------------------------------------
. "$ROOT/scripts/device-deps.sh"
. "$ROOT/scripts/device-build.sh"
BUILD="$DEVICE_BUILD_DIR"

# ---- build -------------------------------------------------------------------------------------
# KVATTN_PREBUILT=1 runs the binaries carried in .devbin/ (built on the dev machine with
# -DKVATTN_CUDA_ARCHS=90a) instead of building here; falls back to building if they don't run.
TEST_BIN="$BUILD/tests/test_ops_cuda"
KVATTN_BIN="$BUILD/tools/kvattn"
use_prebuilt=0
if [ "${KVATTN_PREBUILT:-0}" = 1 ] && [ -x "$ROOT/.devbin/test_ops_cuda" ]; then
  if "$ROOT/.devbin/test_ops_cuda" --gtest_list_tests > /dev/null 2>&1; then
    use_prebuilt=1; TEST_BIN="$ROOT/.devbin/test_ops_cuda"; KVATTN_BIN="$ROOT/.devbin/kvattn"
    stamp "using prebuilt binaries from .devbin/"
  else
    stamp "prebuilt binaries do not run here; building"
    "$ROOT/.devbin/test_ops_cuda" --gtest_list_tests 2>&1 | head -3
  fi
fi
if [ $use_prebuilt = 0 ]; then
  stamp "configure + build (sm_90a) -> build.log"
  : > "$OUTDIR/build.log"
  device_build "$OUTDIR/build.log" test_ops_cuda
  rc=$?
  # the backend's CUDA tests and the CLI link every layer: a broken layer elsewhere must not
  # hide the ops' CUDA test results
  device_build "$OUTDIR/build.log" test_attention_cuda || stamp "test_attention_cuda did not build (see build.log)"
  device_build "$OUTDIR/build.log" kvattn ||
    { stamp "kvattn CLI did not build (see build.log)"; [ -x "$ROOT/.devbin/kvattn" ] && KVATTN_BIN="$ROOT/.devbin/kvattn"; }
  if [ $rc -ne 0 ]; then
    stamp "BUILD FAILED (rc=$rc); last lines:"; tail -40 "$OUTDIR/build.log"; exit $rc
  fi
  stamp "build ok"
  grep -iE "spill|warning" "$OUTDIR/build.log" | grep -v "^--" | head -20
fi

CUOBJ="$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)"
{
  for o in $(find "$BUILD" "$ROOT/.devbin" -name '*.cu.o' 2>/dev/null); do
    echo "== $o"
    "$CUOBJ" --dump-resource-usage "$o" 2>&1 | grep -E "Function|REG" | sed -E 's/_ZN6kvattn3ops9cuda_impl1k[0-9A-Za-z_]*GLOBAL__N_1//' | cut -c1-220
  done
  [ $use_prebuilt = 1 ] && "$CUOBJ" --dump-resource-usage "$TEST_BIN" 2>&1 | grep -E "Function|REG" | cut -c1-220
} > "$OUTDIR/resources.txt" 2>&1
stamp "resource usage -> resources.txt"

status=0
# ---- tests -------------------------------------------------------------------------------------
if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  stamp "ctest -L cuda -> ctest.log"
  if [ $use_prebuilt = 0 ]; then
    (cd "$BUILD" && ctest -L cuda --output-on-failure -j 4 --timeout 300) > "$OUTDIR/ctest.log" 2>&1
  else
    "$TEST_BIN" > "$OUTDIR/ctest.log" 2>&1
  fi
  trc=$?
  tail -25 "$OUTDIR/ctest.log"
  [ $trc -ne 0 ] && status=$trc
fi
if [ "$MODE" = sanitize ] || [ "$MODE" = all ]; then
  CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [ -x "$CS" ] && [ -z "${KVATTN_SKIP_SANITIZER:-}" ]; then
    stamp "compute-sanitizer memcheck (subset) -> sanitizer.log"
    timeout 240 "$CS" --tool memcheck --print-limit 20 "$TEST_BIN" \
      --gtest_filter="${KVATTN_SANITIZE_FILTER:-*Decode*:*Merge*:*Reshape*:*Zero*:*Copy*:*Fp8*:*Mask*}" \
      > "$OUTDIR/sanitizer.log" 2>&1
    src=$?
    tail -6 "$OUTDIR/sanitizer.log"
    stamp "compute-sanitizer rc=$src"
    # racecheck: shared-memory hazards (the kernels' cp.async rings, smem row tables, epilogue
    # staging).  Slower than memcheck, so a filter of its own.
    stamp "compute-sanitizer racecheck -> racecheck.log"
    timeout "${KVATTN_RACECHECK_TIMEOUT:-240}" "$CS" --tool racecheck --print-limit 20 "$TEST_BIN" \
      --gtest_filter="${KVATTN_RACECHECK_FILTER:-*Decode*:*Merge*:*Prefill*:*Fp8*:*Mask*:*Dcp*}" \
      > "$OUTDIR/racecheck.log" 2>&1
    rrc=$?
    grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED)" "$OUTDIR/racecheck.log" | tail -4
    stamp "racecheck rc=$rrc"
  fi
fi
if [ "$MODE" = ncu ]; then
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  stamp "ncu ($NCU) on ${KVATTN_NCU_ARGS:---batch 64 --kv-len 4096} -> ncu.txt"
  timeout 300 "$NCU" --clock-control none -k "regex:attn_kernel|plan_kernel|merge_splits" -c "${KVATTN_NCU_COUNT:-3}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis \
    "$KVATTN_BIN" bench-cuda ${KVATTN_NCU_ARGS:---batch 64 --kv-len 4096} > "$OUTDIR/ncu.txt" 2>&1
  stamp "ncu rc=$?"
  grep -E "attn_kernel|plan_kernel|merge_splits|Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|Warp Cycles|Issued" "$OUTDIR/ncu.txt" | cut -c1-150 | head -90
fi
# ---- benchmarks ----------------------------------------------------------------------------------
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  stamp "kvattn bench-cuda -> bench.txt"
  timeout 420 "$KVATTN_BIN" bench-cuda ${KVATTN_BENCH_ARGS:-} > "$OUTDIR/bench.txt" 2>&1
  brc=$?
  cat "$OUTDIR/bench.txt"
  stamp "bench rc=$brc"
fi
stamp "done (status $status)"
exit $status
