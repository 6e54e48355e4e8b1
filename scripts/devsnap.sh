#!/usr/bin/env bash
# scripts/devsnap.sh NAME [SRC_DIR] — copies a working tree (tracked + untracked, not ignored
# files) into .devsnap/NAME of this checkout, so the device tool can carry a worktree other
# than the main checkout:  run(carry=[".devsnap/NAME", ".devdeps"], command=
#   'ln -sfn "$PWD/.devdeps" .devsnap/NAME/.devdeps && cd .devsnap/NAME && bash scripts/device.sh all "$OUT"')
set -euo pipefail
NAME="$1"
SRC="${2:-$(pwd)}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DST="$ROOT/.devsnap/$NAME"
rm -rf "$DST" && mkdir -p "$DST"
(cd "$SRC" && git ls-files -co --exclude-standard -z | tar --null -cf - -T -) | tar -xf - -C "$DST"
echo "snapshot of $SRC -> $DST ($(du -sh "$DST" | cut -f1))"
