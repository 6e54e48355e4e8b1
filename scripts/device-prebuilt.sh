# Sourced (first) by the device scripts that run the binaries carried in .devbin/ (built on the
# dev machine): OUTDIR (the script's first argument, else $OUT, else build/device-out), ROOT (the
# repository, also the working directory), the carried Debian packages and packed binaries
# unpacked (scripts/device-deps.sh), K / T (kvattn, test_ops_cuda), CS / NCU (compute-sanitizer,
# Nsight Compute) and t0 (the start, for each script's stamp()).
# A script that tees its output with `exec > >(tee FILE)` must wait on its background jobs' pids
# (`wait "${pids[@]}"`): a bare `wait` also waits for the tee and hangs until the call's time
# limit (session 18 lost ≈ 400 s of device time to it).
OUTDIR="${1:-${OUT:-build/device-out}}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"  # this file's repository (also when sourced from bash -c)
mkdir -p "$OUTDIR"
cd "$ROOT"
. "$ROOT/scripts/device-deps.sh" > /dev/null
K="$ROOT/.devbin/kvattn"
T="$ROOT/.devbin/test_ops_cuda"
CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
t0=$(date +%s)
