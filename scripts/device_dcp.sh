#!/usr/bin/env bash
# scripts/device_dcp.sh — issue 9 on a machine with 2+ NVIDIA GPUs, in one call: build with
# CUDA (sm_90a) and NCCL, run every CUDA test (incl. the NCCL DCP tests), `kvattn run` with
# --dcp over NCCL (both combines, interleaved shards, a larger model), one-GPU regressions,
# and `kvattn bench-dcp` on long contexts.
#
#   scripts/device_dcp.sh [OUT_DIR]      (device tool: carry [".devdeps"], kind nvidia-h200-x2)
#
# Logs under OUT_DIR (default $OUT): env.txt, build.log, ctest.log, run_*.txt, bench_dcp_*.txt,
# sanitizer.log.  The last lines printed are a summary.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUTDIR="${1:-${OUT:-$ROOT/build/device-out}}"
mkdir -p "$OUTDIR"
t0=$(date +%s)
stamp() { echo "[dcp +$(( $(date +%s) - t0 ))s] $*"; }
summary=()

{ nvidia-smi; nvidia-smi topo -m; nvcc --version || /usr/local/cuda/bin/nvcc --version; nproc; } > "$OUTDIR/env.txt" 2>&1
. "$ROOT/scripts/device-deps.sh"
. "$ROOT/scripts/device-build.sh"
BUILD="$DEVICE_BUILD_DIR"
stamp "GPUs: $(nvidia-smi -L 2>/dev/null | wc -l)"

# KVATTN_PREBUILT=1: run kvattn, test_ops_cuda and test_attention_cuda carried in .devbin/ (built
# on the dev machine with -DKVATTN_CUDA_ARCHS=90a -DKVATTN_NCCL=ON), saving the device build.
K="$BUILD/tools/kvattn"; TOPS="$BUILD/tests/test_ops_cuda"; TATT="$BUILD/tests/test_attention_cuda"
if [ "${KVATTN_PREBUILT:-0}" = 1 ] && "$ROOT/.devbin/kvattn" version > /dev/null 2>&1; then
  K="$ROOT/.devbin/kvattn"; TOPS="$ROOT/.devbin/test_ops_cuda"; TATT="$ROOT/.devbin/test_attention_cuda"
  stamp "using prebuilt binaries from .devbin/"
else
  stamp "configure + build (sm_90a) -> build.log"
  : > "$OUTDIR/build.log"
  device_build "$OUTDIR/build.log" kvattn test_ops_cuda test_attention_cuda
  brc=$?
  stamp "build rc=$brc"; [ $brc -ne 0 ] && { tail -40 "$OUTDIR/build.log"; exit $brc; }
fi
"$K" version

# KVATTN_DCP_QUICK=1: only the DCP tests, two DCP runs and one bench-dcp (a short call).
Q="${KVATTN_DCP_QUICK:-0}"
stamp "CUDA tests -> ctest.log"
if [ "$Q" = 1 ]; then
  { "$TATT" --gtest_filter='*Dcp*'; echo "rc=$?"; "$TOPS" --gtest_filter='*Dcp*'; echo "rc=$?"; } > "$OUTDIR/ctest.log" 2>&1
else
{ "$TATT" --gtest_filter='*Dcp*'; echo "rc=$?";
  "$TOPS"; echo "rc=$?";
  "$TATT" --gtest_filter='-*Dcp*'; echo "rc=$?"; } > "$OUTDIR/ctest.log" 2>&1
fi
grep -E "^\[  (PASSED|FAILED|SKIPPED) |rc=|Failure" "$OUTDIR/ctest.log" | head -30
summary+=("tests: $(grep -E '^\[  PASSED' "$OUTDIR/ctest.log" | tr '\n' ' ') $(grep -cE '^\[  FAILED  \] [A-Z]' "$OUTDIR/ctest.log") failed")

run_case() {  # name, args...
  local name=$1; shift
  stamp "kvattn run $* -> run_$name.txt"
  timeout 200 "$K" run --quiet "$@" > "$OUTDIR/run_$name.txt" 2>&1
  local rc=$?
  summary+=("run $name (rc=$rc): $(grep -E 'correctness' "$OUTDIR/run_$name.txt" | sed 's/^ *//') | $(grep -E 'throughput' "$OUTDIR/run_$name.txt" | sed 's/^ *//')")
  grep -E "DCP  |attention /|outputs|rror" "$OUTDIR/run_$name.txt" | sed 's/^/    /'
}
run_case dcp2_default --device cuda --dcp 2
run_case dcp2_a2a_il16 --device cuda --dcp 2 --dcp-comm-backend a2a --dcp-interleave 16 --layout HND
[ "$Q" = 1 ] || run_case dcp2_llama8l --device cuda --dcp 2 --model llama3-8b --num-layers 4 --gpu-memory 2GiB --max-num-seqs 64 \
  --max-num-batched-tokens 4096 --num-requests 64 --check-every 8
[ "$Q" = 1 ] || run_case cuda_default --device cuda
[ "$Q" = 1 ] || run_case dcp2_one_gpu --device cuda --dcp 2 --dcp-transport in-process
[ "$Q" = 1 ] || run_case cuda_len1000 --device cuda --max-model-len 1000 --num-requests 24

COMMS="ag_rs a2a"; [ "$Q" = 1 ] && COMMS="ag_rs"
for comm in $COMMS; do
  stamp "bench-dcp --comm $comm -> bench_dcp_$comm.txt"
  timeout 150 "$K" bench-dcp --dcp 2 --batch 8 --kv-len 131072 --comm $comm > "$OUTDIR/bench_dcp_$comm.txt" 2>&1
  cat "$OUTDIR/bench_dcp_$comm.txt"
  summary+=("bench-dcp $comm: $(grep -E 'DCP 2 step' "$OUTDIR/bench_dcp_$comm.txt")")
done
if [ "$Q" != 1 ]; then
  stamp "bench-dcp 64 x 32k -> bench_dcp_64x32k.txt"
  timeout 100 "$K" bench-dcp --dcp 2 --batch 64 --kv-len 32768 > "$OUTDIR/bench_dcp_64x32k.txt" 2>&1
  summary+=("bench-dcp 64x32k: $(grep -E 'DCP 2 step' "$OUTDIR/bench_dcp_64x32k.txt")")
fi

if [ -z "${KVATTN_SKIP_SANITIZER:-}" ] && [ "$Q" != 1 ]; then
  CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  stamp "compute-sanitizer memcheck on the DCP ops + one-GPU DCP tests -> sanitizer.log"
  { timeout 150 "$CS" --tool memcheck --print-limit 20 "$TOPS" --gtest_filter='*Dcp*';
    timeout 150 "$CS" --tool memcheck --print-limit 20 "$TATT" --gtest_filter='*InProcessRanksOnOneGpu*'; } \
    > "$OUTDIR/sanitizer.log" 2>&1
  summary+=("memcheck: $(grep -E 'ERROR SUMMARY' "$OUTDIR/sanitizer.log" | tr '\n' ' ')")
fi

stamp "summary"
printf '%s\n' "${summary[@]}"
