#!/usr/bin/env bash
# scripts/dev/ncu_source.sh OUT_DIR [BENCH_ARGS...] — where a decode kernel's warps spend their
# time, per SASS instruction: one launch of the kernel matching $NCU_KERNEL (default the decode
# kernels, regex "decode|attn_kernel") in `kvattn bench-cuda BENCH_ARGS --kept-plan` (default
# --batch 64 --kv-len 4096), profiled by Nsight Compute with warp-state sampling; writes the
# source page as CSV (OUT_DIR/sass_source.csv.gz, every instruction with its stall samples, read
# with scripts/dev/ncu_source_top.py) and the summary sections (OUT_DIR/ncu_details.txt).
#   NCU_SKIP  launches skipped before the profiled one (default 20);  KVATTN  the binary
set -uo pipefail
RESULT_DIR=$1; shift
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
K="${KVATTN:-$ROOT/build/cuda-release/tools/kvattn}"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
[ -n "$NCU" ] || { echo "ncu (Nsight Compute) not found" >&2; exit 2; }
args=("$@"); [ ${#args[@]} -eq 0 ] && args=(--batch 64 --kv-len 4096)
mkdir -p "$RESULT_DIR"
timeout 240 "$NCU" --clock-control none -k "regex:${NCU_KERNEL:-decode|attn_kernel}" -s "${NCU_SKIP:-20}" -c 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
  --section Occupancy --section LaunchStats -f -o "$RESULT_DIR/rep" \
  "$K" bench-cuda "${args[@]}" --kept-plan > "$RESULT_DIR/ncu_run.txt" 2>&1
echo "ncu rc=$?"
"$NCU" --import "$RESULT_DIR/rep.ncu-rep" --page details > "$RESULT_DIR/ncu_details.txt" 2>&1
"$NCU" --import "$RESULT_DIR/rep.ncu-rep" --page source --csv --print-source sass 2> "$RESULT_DIR/ncu_source_err.txt" |
  gzip -9 > "$RESULT_DIR/sass_source.csv.gz"
rm -f "$RESULT_DIR/rep.ncu-rep"
grep -E "Duration|DRAM Throughput|Issue Slots|Issued Ipc|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Registers|Achieved Occ|Stall" \
  "$RESULT_DIR/ncu_details.txt" | cut -c1-150 | head -40
