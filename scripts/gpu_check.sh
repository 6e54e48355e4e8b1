#!/usr/bin/env bash
# scripts/gpu_check.sh [OUT_DIR] — the whole GPU validation of a tree, in one bounded command
# (about 6-8 minutes on one H200; the multi-GPU parts run when two GPUs are visible):
#   1. build kvattn, test_ops_cuda, test_attention_cuda (Release, sm_90a, NCCL when found) and,
#      when PyTorch and pybind11 are there, the Python module
#   2. every CUDA test: the ops suite in parallel gtest shards (tests a shard's time limit cut off
#      run again afterwards), the backend suite (incl. NCCL DCP), the PyTorch GPU test
#   3. compute-sanitizer memcheck and racecheck on the kernels' tests, in parallel
#   4. `kvattn run --device cuda` (CUDA modules loaded lazily and eagerly, fp8, --dcp 2 on 2 GPUs),
#      `kvattn bench-dcp` (2 GPUs), then `kvattn bench-cuda` alone on the GPU
# Every step has its own time limit, so one slow step cannot eat the whole run.  Results go to
# OUT_DIR (or $GPU_CHECK_OUT, default build/gpu-check): summary.txt (one line per step with its
# exit status and the tests' / sanitizers' counts) and logs.tgz (every step's log, bench.txt).
#
# Settings (environment):
#   GPU_CHECK_DEBS=DIR    Debian -dev packages (.deb) to unpack into a private prefix (never into /)
#                         for a GPU machine without a package registry: make the list with
#                         `apt-get download` of the packages scripts/install-deps.sh names
#   GPU_CHECK_BIN=DIR     run kvattn, test_ops_cuda and test_attention_cuda from DIR (built
#                         elsewhere with -DKVATTN_CUDA_ARCHS=90a; DIR/bins.tar.xz is unpacked
#                         first) instead of building; falls back to building when they do not run
#   GPU_CHECK_QUICK=1     tests and sanitizers only (no runs, no benchmarks)
#   GPU_CHECK_SHARDS=N    parallel test_ops_cuda processes (default 4; memcheck uses 1.5x as many)
#   GPU_CHECK_TEST_LIMIT / GPU_CHECK_SANITIZER_LIMIT / GPU_CHECK_BENCH_LIMIT  seconds per process
#                         (defaults 150 / 130 / 200)
#   GPU_CHECK_MEMCHECK_FILTER / GPU_CHECK_RACECHECK_FILTER  gtest filters for the sanitizers
#   GPU_CHECK_BENCH_ARGS  extra `kvattn bench-cuda` arguments
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RESULT_DIR="${1:-${GPU_CHECK_OUT:-$ROOT/build/gpu-check}}"
LOGS="$(mktemp -d)/logs"
mkdir -p "$RESULT_DIR" "$LOGS"
t0=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - t0 ))s] $*" | tee -a "$LOGS/summary.txt"; }
save() {  # after every step, so a run stopped early still leaves what ran
  tar -czf "$RESULT_DIR/logs.tgz" -C "$(dirname "$LOGS")" logs
  cp "$LOGS/summary.txt" "$RESULT_DIR/summary.txt"
}
trap 'stamp finished; save' EXIT

# --- dependencies and binaries ------------------------------------------------------------------
export PATH="/usr/local/cuda/bin:$PATH"
if [ -n "${GPU_CHECK_DEBS:-}" ] && ls "$GPU_CHECK_DEBS"/*.deb > /dev/null 2>&1; then
  PREFIX="$(mktemp -d)/deps"
  for f in "$GPU_CHECK_DEBS"/*.deb; do dpkg -x "$f" "$PREFIX" || stamp "dpkg -x failed: $f"; done
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  stamp "unpacked $(ls "$GPU_CHECK_DEBS"/*.deb | wc -l) packages from $GPU_CHECK_DEBS"
fi
{ nvidia-smi; nvidia-smi topo -m; nvcc --version; nproc; } > "$LOGS/env.txt" 2>&1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
B="${GPU_CHECK_BUILD:-$ROOT/build/gpu-check-build}"
PY=/usr/bin/python3
HAVE_TORCH=0
"$PY" -c 'import torch; assert torch.cuda.is_available()' > /dev/null 2>&1 && HAVE_TORCH=1
build() {  # targets...
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=ON -DKVATTN_CUDA_ARCHS=90a \
    -DKVATTN_NCCL=AUTO -DKVATTN_BUILD_PYTHON="$([ $HAVE_TORCH = 1 ] && echo ON || echo OFF)" \
    -DKVATTN_BUILD_BENCHMARKS=OFF -DCMAKE_CUDA_FLAGS="-Xptxas=-warn-spills" >> "$LOGS/build.log" 2>&1 &&
    cmake --build "$B" -j "$(nproc)" --target "$@" >> "$LOGS/build.log" 2>&1
}
K="$B/tools/kvattn"; TOPS="$B/tests/test_ops_cuda"; TATT="$B/tests/test_attention_cuda"
BIN="${GPU_CHECK_BIN:-}"
if [ -n "$BIN" ] && [ -f "$BIN/bins.tar.xz" ]; then
  (cd "$BIN" && tar -xJf bins.tar.xz && rm -f bins.tar.xz)
fi
if [ -n "$BIN" ] && "$BIN/kvattn" version > /dev/null 2>&1 && "$BIN/test_ops_cuda" --gtest_list_tests > /dev/null 2>&1 &&
   "$BIN/test_attention_cuda" --gtest_list_tests > /dev/null 2>&1; then
  K="$BIN/kvattn"; TOPS="$BIN/test_ops_cuda"; TATT="$BIN/test_attention_cuda"
  stamp "GPUs: $NGPU; binaries from $BIN"
else
  [ -n "$BIN" ] && stamp "the binaries in $BIN do not run here; building"
  stamp "GPUs: $NGPU; build -> build.log"
  targets=(kvattn test_ops_cuda test_attention_cuda)
  [ $HAVE_TORCH = 1 ] && targets+=(_kvattn)
  build "${targets[@]}"
  brc=$?
  stamp "build rc=$brc; ptxas spill warnings: $(grep -ci 'spill' "$LOGS/build.log")"; save
  [ $brc -ne 0 ] && { tail -40 "$LOGS/build.log"; exit $brc; }
fi
"$K" version >> "$LOGS/summary.txt" 2>&1

# --- helpers --------------------------------------------------------------------------------------
digest() {  # the last gtest / pytest / sanitizer / run lines of a log, into the summary
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|ERROR SUMMARY|RACECHECK SUMMARY|correctness|throughput  |attention / step|slowest step|DCP 2 step| passed| failed| skipped" \
    "$1" | head -14 | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
  # a process stopped by its limit prints no summary: count what finished and what was reported
  echo "    ($(grep -c '^\[       OK \]' "$1") tests OK, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$1") failed," \
    "$(grep -E '^========= [A-Z]' "$1" | grep -vcE 'COMPUTE-SANITIZER|SUMMARY') sanitizer reports)" | tee -a "$LOGS/summary.txt"
}
step() {  # name seconds command...  (output -> NAME.log)
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  stamp "$name rc=$rc$([ $rc = 124 ] && echo ' (TIME LIMIT)')"
  digest "$LOGS/$name.log"
  save
}
parallel_steps() {  # "name seconds command..." jobs, one per line on stdin, run in parallel
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
SH=${GPU_CHECK_SHARDS:-4}   # parallel test processes (the tests' CPU references are the slow part)
MSH=$((SH + SH / 2))         # memcheck shards
TT=${GPU_CHECK_TEST_LIMIT:-150} ST=${GPU_CHECK_SANITIZER_LIMIT:-130}
CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
MF="${GPU_CHECK_MEMCHECK_FILTER:-*Decode*:*Merge*:*Reshape*:*Zero*:*Copy*:*Fp8*:*Mask*:*Dcp*:CudaPrefill.HeadDims*}"
RF="${GPU_CHECK_RACECHECK_FILTER:-*Decode*:*Merge*:*Fp8*:*Mask*}"
RPF="CudaPrefill.HeadDims*:CudaPrefill.CausalAndNonCausal*:CudaPrefill.WindowSoftCap*"

# --- 2. tests ---------------------------------------------------------------------------------------
test_jobs() {
  for i in $(seq 0 $((SH - 1))); do
    echo "test_ops_cuda_$i $TT env GTEST_TOTAL_SHARDS=$SH GTEST_SHARD_INDEX=$i $TOPS"
  done
  echo "test_attention_cuda $TT $TATT"
  if [ $HAVE_TORCH = 1 ] && [ -d "$B/python/kvattn" ]; then
    echo "pytest_torch_cuda $TT env PYTHONPATH=$B/python $PY -m pytest -v -p no:cacheprovider $ROOT/python/tests/test_torch_cuda.py"
  fi
}
# The ops tests a shard stopped by its limit never finished (gtest gives test j of the list to
# shard j % SH; a finished test logs "[       OK ]" or "[  FAILED  ]"): "Suite.Name" lines.
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
rerun_jobs() {  # ... run again, spread over SH processes
  local -a left
  mapfile -t left < <(unfinished_tests)
  [ ${#left[@]} -eq 0 ] && return
  stamp "ops tests not reached by their shard: ${#left[@]}: $(IFS=:; echo "${left[*]}")" >&2  # stdout is the job list
  local k j filt
  for k in $(seq 0 $((SH - 1))); do
    filt=""
    for ((j = k; j < ${#left[@]}; j += SH)); do filt="$filt${filt:+:}${left[j]}"; done
    [ -n "$filt" ] && echo "test_ops_cuda_rerun_$k $TT $TOPS --gtest_filter='$filt'"
  done
}
# --- 3. sanitizers ----------------------------------------------------------------------------------
sanitizer_jobs() {
  for i in $(seq 0 $((MSH - 1))); do
    echo "memcheck_$i $ST env GTEST_TOTAL_SHARDS=$MSH GTEST_SHARD_INDEX=$i $CS --tool memcheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$MF'"
  done
  for i in 0 1; do
    echo "racecheck_$i $ST env GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i $CS --tool racecheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$RF'"
  done
  echo "racecheck_prefill $ST $CS --tool racecheck --require-cuda-init no --print-limit 20 $TOPS --gtest_filter='$RPF'"
}
test_jobs | parallel_steps
rerun_jobs | parallel_steps
sanitizer_jobs | parallel_steps

# --- 4. runs and benchmarks -------------------------------------------------------------------------
if [ "${GPU_CHECK_QUICK:-0}" != 1 ]; then
  # the default run with CUDA modules loaded lazily (the driver's default) and eagerly: the
  # per-step timings in the JSON show what the first launch of each kernel costs the first steps
  step run_cuda 45 env CUDA_MODULE_LOADING=LAZY "$K" run --quiet --device cuda --json "$LOGS/run_cuda.json"
  step run_cuda_eager 45 env CUDA_MODULE_LOADING=EAGER "$K" run --quiet --device cuda --json "$LOGS/run_cuda_eager.json"
  step run_cuda_fp8 45 "$K" run --quiet --device cuda --model tiny-gemma2 --kv-cache-dtype fp8 --layout HND
  if [ "$NGPU" -ge 2 ]; then
    step run_dcp2 60 "$K" run --quiet --device cuda --dcp 2
    step bench_dcp 60 "$K" bench-dcp --dcp 2 --batch 8 --kv-len 131072
  fi
  # alone on the GPU: nothing else runs now.  The table is also kept as bench.txt, which
  # bench/plot.py reads (as it reads `kvattn bench-cuda --json` output).
  # shellcheck disable=SC2086
  step bench_cuda "${GPU_CHECK_BENCH_LIMIT:-200}" "$K" bench-cuda ${GPU_CHECK_BENCH_ARGS:-}
  cp "$LOGS/bench_cuda.log" "$RESULT_DIR/bench.txt"
  cat "$LOGS/bench_cuda.log"
fi
