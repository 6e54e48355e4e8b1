# Sourced by scripts/device.sh and scripts/device_dcp.sh: one configuration of the device build
# (build/device: Release, CUDA for sm_90a, NCCL when the toolkit has it, spill warnings from
# ptxas), so the scripts share one build directory and a second script in the same call only
# builds what the first did not.
#   device_build LOG TARGET...   configure + build the targets, output appended to LOG; returns
#                                the build's exit status.
DEVICE_BUILD_DIR="${KVATTN_DEVICE_BUILD:-$ROOT/build/device}"
device_build() {
  local log=$1; shift
  {
    cmake -S "$ROOT" -B "$DEVICE_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=ON \
      -DKVATTN_CUDA_ARCHS=90a -DKVATTN_NCCL=AUTO -DKVATTN_BUILD_PYTHON=OFF -DKVATTN_BUILD_BENCHMARKS=OFF \
      -DCMAKE_CUDA_FLAGS="-Xptxas=-warn-spills" &&
      cmake --build "$DEVICE_BUILD_DIR" -j "$(nproc 2>/dev/null || echo 8)" --target "$@"
  } >> "$log" 2>&1
}
