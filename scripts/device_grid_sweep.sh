#!/usr/bin/env bash
# scripts/device_grid_sweep.sh [OUTDIR] — how fast one CTA of the whole-page decode streams when
# DRAM is not the limit, against the bulk-copy gather over the same pages: both with their grids
# capped at 33 / 66 / 99 / 132 CTAs (KVATTN_PAGE_CTAS, KVATTN_GATHER_CTAS), 64 x 4096, plan kept,
# on the binaries carried in .devbin/ (device tool: carry [".devdeps", ".devbin"]).  Tests the
# hypothesis in docs/cuda-notes.md "Session 18": if the decode's per-CTA rate at a small grid is
# well under the gather's, the CTAs still looping at the end of a call cannot use the bandwidth
# the finished ones leave, and that tail is 64 x 4096's remaining gap.
. "$(dirname "$0")/device-prebuilt.sh"
for n in ${GRID_SWEEP:-33 66 99 132}; do
  KVATTN_PAGE_CTAS=$n KVATTN_GATHER_CTAS=$n timeout 120 "$K" bench-cuda --batch 64 --kv-len 4096 --kept-plan 2>&1 |
    grep -E "bulk copy|bulk, claimed|^decode bf16 [0-9x]+ +[0-9]" | sed "s/^/[ctas $n] /"
done | tee "$OUTDIR/grid_sweep.log"
