#!/usr/bin/env bash
# scripts/device_e2e.sh — the whole system on a GPU machine, in one call: build everything
# with CUDA (sm_90a), run every CUDA test, `kvattn run --device cuda` on the default trace and
# on a larger model, the CPU kernel and host benchmarks on the machine's (quiet) CPU, and the
# PyTorch comparison script when the Python module builds there.
#
#   scripts/device_e2e.sh [OUT_DIR]      (device tool: carry [".devdeps"], see scripts/device.sh)
#
# Logs under OUT_DIR (default $OUT): env.txt, build.log, ctest.log, run_*.txt, bench_cpu.txt,
# bench_host.txt, torch_check.txt.  The last lines printed are a summary.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUTDIR="${1:-${OUT:-$ROOT/build/device-out}}"
BUILD="$ROOT/build/device-e2e"
JOBS="$(nproc 2>/dev/null || echo 8)"
mkdir -p "$OUTDIR"
t0=$(date +%s)
stamp() { echo "[e2e +$(( $(date +%s) - t0 ))s] $*"; }
summary=()

{ nvidia-smi; nvcc --version || /usr/local/cuda/bin/nvcc --version; nproc; python3 --version; } > "$OUTDIR/env.txt" 2>&1
. "$ROOT/scripts/device-deps.sh"

# Python: build the module when the interpreter's headers exist (pybind11 comes from .devdeps).
PYINC="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)"
PYOPT="-DKVATTN_BUILD_PYTHON=OFF"
if [ -n "$PYINC" ] && [ -f "$PYINC/Python.h" ]; then PYOPT="-DKVATTN_BUILD_PYTHON=ON -DPython3_EXECUTABLE=$(command -v python3)"; fi
stamp "configure + build (sm_90a, $JOBS jobs) -> build.log"
{ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=ON -DKVATTN_CUDA_ARCHS=90a $PYOPT &&
  cmake --build "$BUILD" -j "$JOBS"; } > "$OUTDIR/build.log" 2>&1
brc=$?
stamp "build rc=$brc"; [ $brc -ne 0 ] && tail -30 "$OUTDIR/build.log"
K="$BUILD/tools/kvattn"

stamp "ctest -L cuda -> ctest.log"
(cd "$BUILD" && ctest -L cuda --output-on-failure -j 4 --timeout 300) > "$OUTDIR/ctest.log" 2>&1
summary+=("ctest -L cuda: $(grep -E 'tests passed' "$OUTDIR/ctest.log")")

run_case() {  # name, args...
  local name=$1; shift
  stamp "kvattn run $* -> run_$name.txt"
  timeout 240 "$K" run --quiet "$@" > "$OUTDIR/run_$name.txt" 2>&1
  local rc=$?
  summary+=("run $name (rc=$rc): $(grep -E 'correctness' "$OUTDIR/run_$name.txt" | sed 's/^ *//') | $(grep -E 'throughput' "$OUTDIR/run_$name.txt" | sed 's/^ *//')")
  grep -E "attention /|host /|preemptions|outputs|rror" "$OUTDIR/run_$name.txt" | sed 's/^/    /'
}
run_case cuda_default --device cuda
run_case cuda_fp8_hnd --device cuda --kv-cache-dtype fp8 --layout HND --model tiny-gemma2
run_case cuda_llama8l --device cuda --model llama3-8b --num-layers 8 --gpu-memory 2GiB --max-num-seqs 64 \
  --max-num-batched-tokens 4096 --num-requests 96 --check-every 8 --json "$OUTDIR/run_cuda_llama8l.json"
run_case cpu_default --device cpu

stamp "CPU decode bench (this host's cores) -> bench_cpu.txt"
timeout 120 "$K" bench --device cpu --op decode --batch 64 --kv-len 4096 > "$OUTDIR/bench_cpu.txt" 2>&1
summary+=("cpu bench: $(grep -iE 'decode' "$OUTDIR/bench_cpu.txt" | tail -2 | tr '\n' ' ')")
stamp "host benchmarks -> bench_host.txt"
timeout 120 "$BUILD/bench/bench_host" --benchmark_filter='StepMetadata|BM_Backend' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true > "$OUTDIR/bench_host.txt" 2>&1
grep -E "median" "$OUTDIR/bench_host.txt" | head -12

if [ -f "$ROOT/scripts/torch_backend_check.py" ] && ls "$BUILD"/python/kvattn/_kvattn*.so >/dev/null 2>&1; then
  stamp "torch comparison -> torch_check.txt"
  PYTHONPATH="$BUILD/python" timeout 180 python3 "$ROOT/scripts/torch_backend_check.py" > "$OUTDIR/torch_check.txt" 2>&1
  summary+=("torch check rc=$?: $(tail -2 "$OUTDIR/torch_check.txt" | tr '\n' ' ')")
else
  summary+=("torch check: not run (python module not built here: $PYOPT)")
fi
stamp "done"
printf '%s\n' "${summary[@]}"
