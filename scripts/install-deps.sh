#!/usr/bin/env bash
# Installs the Debian 12 packages kvattn builds and tests with, if any is missing.
# Idempotent and quiet when everything is present.  Needs root (or sudo) only to install.
set -euo pipefail
PACKAGES=(
  python3-matplotlib  # bench/plot.py (the performance plots) and its test
  build-essential cmake ninja-build pkg-config
  libfmt-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libdlpack-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-dev pybind11-dev python3-numpy python3-pytest
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
