#!/usr/bin/env bash
# Builds scripts/kernel_trace/kernel_trace.cpp into .devbin/libkernel_trace.so (with a copy of
# CUPTI next to it, found through its rpath) on a machine with the CUDA toolkit; carry .devbin to
# the GPU machine and run, e.g.:
#   CUDA_INJECTION64_PATH=$PWD/.devbin/libkernel_trace.so KVTRACE_OUT=$OUT/trace.log \
#     .devbin/kvattn bench-cuda --batch 64 --kv-len 4096 --kept-plan
# (session 21, S21-1: the gap between consecutive kernels is the same for the decode and the
# bulk-copy gather).  CUPTI's own overhead adds to each gap.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CUDA="${CUDA_HOME:-/usr/local/cuda}"
CUPTI_LIB="$(ls "$CUDA"/lib/libcupti.so.* "$CUDA"/lib64/libcupti.so.* "$CUDA"/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null | head -1 || true)"
[ -n "$CUPTI_LIB" ] || { echo "no libcupti under $CUDA" >&2; exit 1; }
mkdir -p "$ROOT/.devbin"
g++ -O2 -std=c++17 -shared -fPIC -I"$CUDA/include" -I"$CUDA/extras/CUPTI/include" "$ROOT/scripts/kernel_trace/kernel_trace.cpp" \
  -L"$(dirname "$CUPTI_LIB")" -lcupti -Wl,-rpath,'$ORIGIN' -o "$ROOT/.devbin/libkernel_trace.so"
cp -L "$CUPTI_LIB" "$ROOT/.devbin/"
echo "built $ROOT/.devbin/libkernel_trace.so (+ $(basename "$CUPTI_LIB"))"
