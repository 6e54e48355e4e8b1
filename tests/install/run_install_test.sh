#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs a tiny
# consumer with find_package(kvattn), and checks the pkg-config file resolves.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src_dir" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs kvattn | grep -q -- -lkvattn_core
echo "install test: find_package and pkg-config consumers OK"
