#!/usr/bin/env bash
# scripts/device_page.sh [OUTDIR] — one device call for the whole-page decode path
# (src/ops/cuda/page_decode.cu) on the binaries carried in .devbin/: its tests (all, then the
# sanitizers on two of them), then the path against attn_kernel's decode (KVATTN_PAGE_DECODE=off)
# in alternating processes: the --batch rows of 64 / 128 x 4096 with the loads-only gathers and
# the whole-page probe in the same process, then decode rows only on more shapes.
# PAGE_TESTS=0 skips the tests (PAGE_TEST_LIMIT seconds, default 300; PAGE_FILTER replaces their gtest
# filter, PAGE_MEMCHECK / PAGE_RACECHECK the sanitizers'), PAGE_FULL=0 the --batch rows with gathers and probe;
# PAGE_SHAPES="B L ..." replaces the decode-only shapes; PAGE_ARMS (device_alternate.sh settings,
# default "KVATTN_PAGE_DECODE=off|-") replaces the arms, e.g. "BIN=kvattn_base|-|KVATTN_PAGE_DECODE=off".
. "$(dirname "$0")/device-prebuilt.sh"
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
if [ "${PAGE_TESTS:-1}" = 1 ]; then
  timeout "${PAGE_TEST_LIMIT:-300}" "$T" --gtest_filter="${PAGE_FILTER:-CudaPageDecode*}" > "$OUTDIR/page_tests.log" 2>&1
  stamp "tests rc $?"; grep -E "^\[  FAILED|^\[ +OK|^\[  PASSED" "$OUTDIR/page_tests.log" | sort -u
  timeout 150 "$CS" --tool memcheck --print-limit 5 "$T" \
    --gtest_filter="${PAGE_MEMCHECK:-CudaPageDecodeTest.IndexWidths*}" > "$OUTDIR/page_memcheck.log" 2>&1
  stamp "memcheck rc $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUTDIR/page_memcheck.log" | tail -3
  timeout 150 "$CS" --tool racecheck --print-limit 5 "$T" \
    --gtest_filter="${PAGE_RACECHECK:-CudaPageDecodeTest.KeptPlanRepeats}" > "$OUTDIR/page_racecheck.log" 2>&1
  stamp "racecheck rc $?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$OUTDIR/page_racecheck.log" | tail -3
fi
ARMS="${PAGE_ARMS:-KVATTN_PAGE_DECODE=off|-}"
[ "${PAGE_FULL:-1}" = 1 ] && for s in "64 4096" "128 4096"; do
  set -- $s
  bash "$ROOT/scripts/device_alternate.sh" "$1x$2" "$ARMS" 1 '^(decode|probe|ceiling: K)' --batch "$1" --kv-len "$2" --kept-plan
done 2>&1 | tee "$OUTDIR/page_ab_full.log"
stamp "full rows done"
set -- ${PAGE_SHAPES:-32 4096 64 4096 128 4096 256 8192 16 4096 1024 512}
while [ $# -ge 2 ]; do
  bash "$ROOT/scripts/device_alternate.sh" "$1x$2" "$ARMS" 2 '^decode' --batch "$1" --kv-len "$2" --kept-plan --variants 109/0
  shift 2
done 2>&1 | tee "$OUTDIR/page_ab.log"
bash "$ROOT/scripts/device_alternate.sh" "128xU" "$ARMS" 2 '^decode' --batch 128 --kv-len 8192 --mixed --kept-plan --variants 109/0 2>&1 | tee -a "$OUTDIR/page_ab.log"
stamp "done"
