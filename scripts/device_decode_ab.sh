#!/usr/bin/env bash
# scripts/device_decode_ab.sh [OUT_DIR] — A/B of the v6 decode path's knobs (kernels.h
# set_decode_options / set_decode_splits) on the issue-6 decode shapes, with a per-unit
# timeline of each setting (KVATTN_DECODE_TIMELINE), in one device call.  Runs the binaries
# carried in .devbin/ (kvattn, test_ops_cuda built for sm_90a on the dev machine).
#   DECODE_TESTS=0         skip the tests run first (DECODE_TEST_FILTER, default the decode tests)
#   DECODE_MEMCHECK=filter compute-sanitizer memcheck on these tests
#   DECODE_NCU=1           add ncu of the 256x8192 attention kernel (DECODE_NCU_ARGS: --fp8)
#   DECODE_VARIANTS_<n>    the opts/splits lists of each shape
#   .devbin/kvattn_base    when present, each shape is also run with this binary (same-run baseline)
set -uo pipefail
. "$(dirname "$0")/device-prebuilt.sh"  # OUTDIR ROOT K T CS NCU t0
stamp() { echo "[decode-ab +$(( $(date +%s) - t0 ))s] $*"; }
if [ "${DECODE_TESTS:-1}" = 1 ]; then
  stamp "decode tests -> tests.log"
  timeout "${DECODE_TEST_TIMEOUT:-150}" "$T" --gtest_filter="${DECODE_TEST_FILTER:-CudaDecodeV6.*:CudaOps.PagedDecode*}" > "$OUTDIR/tests.log" 2>&1
  stamp "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED" "$OUTDIR/tests.log" | head -12
fi
if [ -n "${DECODE_MEMCHECK:-}" ]; then
  stamp "memcheck $DECODE_MEMCHECK -> sanitizer.log"
  timeout "${DECODE_MEMCHECK_TIMEOUT:-90}" "$CS" --tool memcheck --print-limit 20 "$T" --gtest_filter="$DECODE_MEMCHECK" > "$OUTDIR/sanitizer.log" 2>&1
  stamp "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$OUTDIR/sanitizer.log" | tail -4
fi
run_shape() {  # $1 args, $2 variants
  if [ -x "$ROOT/.devbin/kvattn_base" ]; then
    stamp "[base binary] bench-cuda $1"
    echo "[base binary]" >> "$OUTDIR/ab.txt"
    KVATTN_DECODE_TIMELINE=5 timeout 60 "$ROOT/.devbin/kvattn_base" bench-cuda $1 --variants 0/0 2>&1 | grep -v "^case\|^kvattn" | tee -a "$OUTDIR/ab.txt"
  fi
  stamp "bench-cuda $1 --variants $2"
  KVATTN_DECODE_TIMELINE=5 timeout 90 "$K" bench-cuda $1 --variants "$2" 2>&1 | grep -v "^case\|^kvattn" | tee -a "$OUTDIR/ab.txt"
}
run_shape "--batch 64 --kv-len 4096" "${DECODE_VARIANTS_64:-0/0,1/0,0/2,0/3,0/4,0/5,0/8,1/3,1/4,0/0,1/0}"
run_shape "--batch 128 --kv-len 4096" "${DECODE_VARIANTS_128:-0/0,1/0,0/2,0/3,0/6,0/8,1/2,0/0,1/0}"
run_shape "--batch 128 --kv-len 8192 --mixed" "${DECODE_VARIANTS_MIX:-0/0,1/0,0/4,0/8,0/0,1/0}"
run_shape "--batch 256 --kv-len 8192" "${DECODE_VARIANTS_256:-0/0,1/0,0/1,0/0,1/0}"
run_shape "--batch 256 --kv-len 8192 --fp8" "${DECODE_VARIANTS_FP8:-0/0,1/0,0/1}"
if [ "${DECODE_NCU:-0}" = 1 ]; then
  for a in ${DECODE_NCU_ARGS:---fp8}; do
    stamp "ncu 256x8192 $a"
    timeout 90 "$NCU" --clock-control none -k regex:attn_kernel -s 4 -c 1 --section SpeedOfLight \
      --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy \
      "$K" bench-cuda --batch 256 --kv-len 8192 --quick $a >> "$OUTDIR/ncu.txt" 2>&1
    stamp "ncu rc=$?"
  done
  grep -E "attn_kernel|Duration|Throughput|Issue Slots|Issued Ipc|Executed Ipc|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Stall|Pipe|Registers|Achieved Occ" "$OUTDIR/ncu.txt" | cut -c1-140 | head -80
fi
stamp done
