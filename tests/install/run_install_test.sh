#!/usr/bin/env bash
# The installed package works for its users, from a non-default prefix that is then moved
# (both the CMake package and kvattn.pc are relocatable):
#   1. `cmake --install BUILD --prefix <tmp>/stage`, then the tree is moved to <tmp>/moved;
#   2. a CMake project that sets no C++ standard finds it with find_package(kvattn), builds and runs;
#   3. a plain compiler command with `pkg-config --cflags --libs kvattn` builds and runs.
# Each consumer's output is checked.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install test FAILED: $*" >&2; exit 1; }

cmake --install "$build_dir" --prefix "$tmp/stage" >/dev/null
mv "$tmp/stage" "$tmp/moved"
prefix=$tmp/moved
pc_file=$(find "$prefix" -name kvattn.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc_file ]] || fail "no kvattn.pc under $prefix"
grep -q '^prefix=${pcfiledir}/' "$pc_file" || fail "kvattn.pc is not relocatable: $(grep '^prefix=' "$pc_file")"

expect="consumer: 1.5"
# find_package consumer in a project with no CMAKE_CXX_STANDARD.
cmake -S "$src_dir" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log"; fail "configuring the find_package consumer"; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building the find_package consumer"; }
printed=$("$tmp/build/consumer")
[[ $printed == "$expect" ]] || fail "find_package consumer printed '$printed', expected '$expect'"
echo "find_package consumer (no C++ standard set): $printed"

# pkg-config consumer.
export PKG_CONFIG_PATH=$(dirname "$pc_file")
flags=$(pkg-config --cflags --libs kvattn) || fail "pkg-config --cflags --libs kvattn"
[[ $(pkg-config --variable=includedir kvattn) -ef $prefix/include ]] ||
  fail "kvattn.pc's includedir $(pkg-config --variable=includedir kvattn) is not $prefix/include"
# shellcheck disable=SC2086  # the flags are words
${CXX:-c++} "$src_dir/consumer.cpp" -o "$tmp/consumer_pc" $flags >"$tmp/pc.log" 2>&1 ||
  { cat "$tmp/pc.log"; fail "building the pkg-config consumer with: $flags"; }
printed=$("$tmp/consumer_pc")
[[ $printed == "$expect" ]] || fail "pkg-config consumer printed '$printed', expected '$expect'"
echo "pkg-config consumer: $printed"
echo "install test: find_package and pkg-config consumers OK (prefix installed, then moved)"
