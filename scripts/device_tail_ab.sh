#!/usr/bin/env bash
# scripts/device_tail_ab.sh [OUT_DIR] — one device call that measures the decode tail levers in
# one process per shape (session 8): decode option / forced-chunk variants
# (`--variants opts/splits/chunk`) timed with plans kept, per-unit timelines (the K/V rate over
# the span, the wait per tile), random vs sequential page order (TAIL_SEQ=1), the KV-write
# kernels, and the tests of the knobs (plus memcheck / racecheck).  Runs the binaries carried in
# .devbin/ (built on the dev machine for sm_90a).
#   TAIL_TESTS=0 skip the tests; TAIL_TEST_FILTER / TAIL_MEMCHECK / TAIL_RACECHECK gtest filters;
#   TAIL_TEST_ENV environment assignments for the test, memcheck and racecheck processes (e.g.
#   KVATTN_DECODE_NEXT=1: the option's default for every test that does not set its own)
#   TAIL_V_<shape> the variant lists (64, 128, MIX, 256, FP8; empty: shape skipped); TAIL_TL the
#   timeline variants; TAIL_SEQ=1 the 64 / 128 x 4096 rows and timelines with sequential pages too
#   TAIL_WRITE the KV-write kernel list (e.g. 1,0,1,0; empty: skipped)
set -uo pipefail
. "$(dirname "$0")/device-prebuilt.sh"  # OUTDIR ROOT K T CS NCU t0
stamp() { echo "[tail-ab +$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUTDIR/ab.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$OUTDIR/ab.txt" 2>&1
if [ "${TAIL_TESTS:-1}" = 1 ]; then
  stamp "tests ${TAIL_TEST_FILTER:-CudaDecodeV6.*:CudaOps.ReshapeAndCache*:CudaPlanReuse.*} -> tests.log"
  env ${TAIL_TEST_ENV:-} timeout "${TAIL_TEST_TIMEOUT:-150}" "$T" --gtest_filter="${TAIL_TEST_FILTER:-CudaDecodeV6.*:CudaOps.ReshapeAndCache*:CudaPlanReuse.*}" \
    > "$OUTDIR/tests.log" 2>&1 &
  tp=$!
fi
if [ -n "${TAIL_MEMCHECK:-}" ]; then
  env ${TAIL_TEST_ENV:-} timeout "${TAIL_MEMCHECK_TIMEOUT:-150}" "$CS" --tool memcheck --print-limit 20 "$T" --gtest_filter="$TAIL_MEMCHECK" \
    > "$OUTDIR/memcheck.log" 2>&1 &
  mp=$!
fi
if [ -n "${TAIL_RACECHECK:-}" ]; then
  env ${TAIL_TEST_ENV:-} timeout "${TAIL_MEMCHECK_TIMEOUT:-150}" "$CS" --tool racecheck --racecheck-report hazard --print-limit 20 "$T" \
    --gtest_filter="$TAIL_RACECHECK" > "$OUTDIR/racecheck.log" 2>&1 &
  rp=$!
fi
if [ -n "${rp:-}" ]; then wait "$rp"; stamp "racecheck rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|^\[  (PASSED|FAILED) " "$OUTDIR/racecheck.log" | tail -4 | tee -a "$OUTDIR/ab.txt"; fi
if [ -n "${tp:-}" ]; then wait "$tp"; stamp "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" "$OUTDIR/tests.log" | head -12 | tee -a "$OUTDIR/ab.txt"; fi
if [ -n "${mp:-}" ]; then wait "$mp"; stamp "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$OUTDIR/memcheck.log" | tail -4 | tee -a "$OUTDIR/ab.txt"; fi
# (the timing runs start after the tests: alone on the GPU)
shape() {  # $1 args, $2 kept-plan variants
  [ -z "$2" ] && return
  stamp "bench-cuda $1 --kept-plan --variants $2"
  timeout 120 "$K" bench-cuda $1 --kept-plan --variants "$2" 2>&1 | grep -v "^case\|^kvattn\|ceiling" | tee -a "$OUTDIR/ab.txt"
}
shape "--batch 64 --kv-len 4096" "${TAIL_V_64-109/0,109/0}"
shape "--batch 128 --kv-len 4096" "${TAIL_V_128-109/0,109/0}"
shape "--batch 128 --kv-len 8192 --mixed" "${TAIL_V_MIX-109/0,109/0}"
shape "--batch 256 --kv-len 8192" "${TAIL_V_256-109/0,109/0}"
shape "--batch 256 --kv-len 8192 --fp8" "${TAIL_V_FP8-109/0,109/0}"
if [ "${TAIL_SEQ:-0}" = 1 ]; then
  shape "--batch 64 --kv-len 4096 --sequential-pages" "109/0,109/0"
  shape "--batch 128 --kv-len 4096 --sequential-pages" "109/0,109/0"
fi
SEQ_TL=""; [ "${TAIL_SEQ:-0}" = 1 ] && SEQ_TL="--sequential-pages"
for a in "--batch 64 --kv-len 4096" "--batch 128 --kv-len 4096" ${SEQ_TL:+"--batch 64 --kv-len 4096 $SEQ_TL"}; do
  stamp "timelines $a --variants ${TAIL_TL:-109/0}"
  KVATTN_DECODE_TIMELINE=5 timeout 90 "$K" bench-cuda $a --variants "${TAIL_TL:-109/0}" 2>&1 |
    grep -v "^case\|^kvattn\|ceiling" | tee -a "$OUTDIR/ab.txt"
done
if [ -n "${TAIL_WRITE-1,0,1,0}" ]; then
  stamp "KV write variants ${TAIL_WRITE-1,0,1,0}"
  timeout 90 "$K" bench-cuda --only write --variants "${TAIL_WRITE-1,0,1,0}" 2>&1 | grep -v "^kvattn" | tee -a "$OUTDIR/ab.txt"
fi
stamp done
