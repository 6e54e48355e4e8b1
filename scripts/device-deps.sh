# Sourced by scripts/device*.sh: makes the Debian -dev packages carried in .devdeps/ usable on
# a GPU machine that has no package registry, by unpacking them with `dpkg -x` into a private
# prefix (never into /) and pointing CMake and the loader at it.  Prepare .devdeps/ once on the
# development machine (see scripts/device.sh for the package list; add pybind11-dev for Python).
PREFIX=/tmp/kvattn-deps
if ls "$ROOT"/.devdeps/*.deb >/dev/null 2>&1; then
  mkdir -p "$PREFIX"
  for f in "$ROOT"/.devdeps/*.deb; do dpkg -x "$f" "$PREFIX" || echo "dpkg -x failed: $f"; done
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  echo "[deps] unpacked $(ls "$ROOT"/.devdeps/*.deb | wc -l) packages into $PREFIX"
fi
export PATH="/usr/local/cuda/bin:$PATH"
