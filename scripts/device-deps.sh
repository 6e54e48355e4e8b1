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
# Prebuilt binaries may travel packed (three of them exceed the device tool's 64 MiB carry):
# .devbin/bins.tar.xz is unpacked in place once, before anything uses .devbin/.
if [ -f "$ROOT/.devbin/bins.tar.xz" ]; then
  (cd "$ROOT/.devbin" && { tar -xJf bins.tar.xz ||
     python3 -c "import lzma, tarfile; tarfile.open(fileobj=lzma.open('bins.tar.xz')).extractall('.')"; } &&
   rm -f bins.tar.xz && echo "[deps] unpacked .devbin/bins.tar.xz")
fi
