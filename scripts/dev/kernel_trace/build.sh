#!/usr/bin/env bash
# Builds scripts/dev/kernel_trace/kernel_trace.cpp into build/kernel_trace/libkernel_trace.so (with
# a copy of CUPTI next to it, found through its rpath) on a machine with the CUDA toolkit; then, e.g.:
#   CUDA_INJECTION64_PATH=$PWD/build/kernel_trace/libkernel_trace.so KVTRACE_OUT=trace.log \
#     build/cuda-release/tools/kvattn bench-cuda --batch 64 --kv-len 4096 --kept-plan
# CUPTI's own overhead adds to each gap it reports.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
DEST="${1:-$ROOT/build/kernel_trace}"
CUDA="${CUDA_HOME:-/usr/local/cuda}"
CUPTI_LIB="$(ls "$CUDA"/lib/libcupti.so.* "$CUDA"/lib64/libcupti.so.* "$CUDA"/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null | head -1 || true)"
[ -n "$CUPTI_LIB" ] || { echo "no libcupti under $CUDA" >&2; exit 1; }
mkdir -p "$DEST"
g++ -O2 -std=c++17 -shared -fPIC -I"$CUDA/include" -I"$CUDA/extras/CUPTI/include" "$ROOT/scripts/dev/kernel_trace/kernel_trace.cpp" \
  -L"$(dirname "$CUPTI_LIB")" -lcupti -Wl,-rpath,'$ORIGIN' -o "$DEST/libkernel_trace.so"
cp -L "$CUPTI_LIB" "$DEST/"
echo "built $DEST/libkernel_trace.so (+ $(basename "$CUPTI_LIB"))"
