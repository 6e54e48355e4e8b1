#!/usr/bin/env bash
# scripts/device_ncu_source.sh [OUT_DIR] — where a decode kernel's warps spend their time, per
# SASS instruction: one launch of attn_kernel (the bench's --batch case, plan kept) profiled by
# Nsight Compute with warp-state sampling (SourceCounters, WarpStateStats), then the source page
# printed as CSV (sass_source.csv.gz, every instruction with its stall samples) and the kernel's
# summary sections (ncu_details.txt).  The CSV is read on the dev machine
# (scripts/ncu_source_top.py).  Runs .devbin/kvattn (built on the dev machine for sm_90a).
#   NCU_SHAPE   bench-cuda arguments (default "--batch 64 --kv-len 4096")
#   NCU_SKIP    launches of attn_kernel skipped before the profiled one (default 20)
#   NCU_AB_LIST one bench-cuda argument set per line: when .devbin/kvattn_base exists, its
#               kept-plan rows on both binaries, alternated (a same-machine baseline)
set -uo pipefail
. "$(dirname "$0")/device-prebuilt.sh"  # OUTDIR ROOT K T CS NCU t0
stamp() { echo "[ncu-src +$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUTDIR/summary.txt"; }
if [ -x "$ROOT/.devbin/kvattn_base" ]; then
  while IFS= read -r a; do
    [ -z "$a" ] && continue
    for bin in kvattn_base kvattn kvattn_base kvattn; do
      stamp "$bin bench-cuda $a --kept-plan"
      timeout 60 "$ROOT/.devbin/$bin" bench-cuda $a --kept-plan 2>&1 | grep "^decode" | sed "s/^/[$bin] /" | tee -a "$OUTDIR/summary.txt"
    done
  done <<< "${NCU_AB_LIST:-$'--batch 64 --kv-len 4096\n--batch 128 --kv-len 4096\n--batch 256 --kv-len 8192 --fp8'}"
fi
stamp "ncu: $NCU; shape ${NCU_SHAPE:---batch 64 --kv-len 4096}"
timeout 240 "$NCU" --clock-control none -k regex:attn_kernel -s "${NCU_SKIP:-20}" -c 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
  --section Occupancy --section LaunchStats -f -o "$OUTDIR/rep" \
  "$K" bench-cuda ${NCU_SHAPE:---batch 64 --kv-len 4096} --kept-plan > "$OUTDIR/ncu_run.txt" 2>&1
stamp "ncu rc=$?"
"$NCU" --import "$OUTDIR/rep.ncu-rep" --page details > "$OUTDIR/ncu_details.txt" 2>&1
"$NCU" --import "$OUTDIR/rep.ncu-rep" --page source --csv --print-source sass 2> "$OUTDIR/ncu_source_err.txt" |
  gzip -9 > "$OUTDIR/sass_source.csv.gz"
stamp "source page: $(zcat "$OUTDIR/sass_source.csv.gz" | wc -l) lines"
rm -f "$OUTDIR/rep.ncu-rep"
grep -E "Duration|DRAM Throughput|Issue Slots|Issued Ipc|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Registers|Achieved Occ|Stall" \
  "$OUTDIR/ncu_details.txt" | cut -c1-150 | head -40 | tee -a "$OUTDIR/summary.txt"
stamp done
