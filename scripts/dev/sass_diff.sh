#!/usr/bin/env bash
# scripts/dev/sass_diff.sh REV FILE.cu [ARCH] — is a refactor of a CUDA source free of code changes?
# Compiles FILE.cu (path relative to the repository) with src/ and include/ as they are at git
# revision REV and as they are in the working tree, in place (the anonymous-namespace names nvcc
# mangles depend on the path), for ARCH (default 90a) with the build's flags, and compares every
# kernel's machine code (.text sections of the two cubins); a refactor of a header the file
# includes is covered too.  Exit 0 when every kernel is byte-identical: then the refactor needs
# no GPU run.  Needs nvcc only (no GPU, no cuobjdump).
# BY_CONTENT=1: for a change that renames kernels or drops instantiations (template parameters
# removed) — exit 0 when every kernel now is byte-identical to some kernel then, whatever its name.
set -euo pipefail
rev=$1 file=$2 arch=${3:-90a}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
tmp="$(mktemp -d)"
# The files of src/ and include/ that differ from REV: saved, replaced by REV's (or removed where
# REV lacks them) for the first compile, then restored (also on failure or interruption).
mapfile -t changed < <(git diff --name-only "$rev" -- src include)
for f in "${changed[@]}"; do
  if [ -e "$f" ]; then mkdir -p "$tmp/now/$(dirname "$f")" && cp -p "$f" "$tmp/now/$f"; fi
done
restore() {
  for f in "${changed[@]}"; do
    if [ -e "$tmp/now/$f" ]; then cp -p "$tmp/now/$f" "$f"; else rm -f "$f"; fi
  done
}
trap 'restore; rm -rf "$tmp"' EXIT
for f in "${changed[@]}"; do
  if git cat-file -e "$rev:$f" 2>/dev/null; then mkdir -p "$(dirname "$f")" && git show "$rev:$f" >"$f"; else rm -f "$f"; fi
done
flags=(-std=c++20 -O3 "-gencode=arch=compute_$arch,code=sm_$arch" -Isrc -Iinclude -cubin)
"$NVCC" "${flags[@]}" "$file" -o "$tmp/then.cubin"
restore
"$NVCC" "${flags[@]}" "$file" -o "$tmp/now.cubin"
BY_CONTENT=${BY_CONTENT:-0} /usr/bin/python3 - "$tmp/then.cubin" "$tmp/now.cubin" <<'PY'
import os, struct, sys
def text_sections(path):
    d = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3A)
    hdrs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    stroff = hdrs[shstrndx][4]
    def name(o):
        return d[stroff + o:d.index(b'\0', stroff + o)].decode()
    return {name(h[0]): d[h[4]:h[4] + h[5]] for h in hdrs if name(h[0]).startswith('.text.')}
a, b = text_sections(sys.argv[1]), text_sections(sys.argv[2])
if os.environ['BY_CONTENT'] == '1':
    then_by_code = {}
    for k, v in a.items():
        then_by_code.setdefault(v, k)
    same = True
    for k in sorted(b):
        match = then_by_code.get(b[k])
        same = same and match is not None
        print(f'{"identical" if match else "NO MATCH":9} {len(b[k]):7} {k[6:]}' + (f'  <- {match[6:]}' if match and match != k else ''))
    now_codes = set(b.values())
    print(f'{sum(v not in now_codes for v in a.values())} kernels then have no counterpart now')
    print('same machine code' if same else 'machine code differs')
    sys.exit(0 if same else 1)
same = set(a) == set(b) and all(a[k] == b[k] for k in b)
for k in sorted(set(a) | set(b)):
    status = 'identical' if a.get(k) == b.get(k) else ('only then' if k not in b else 'only now' if k not in a else 'DIFFERS')
    print(f'{status:9} {len(b.get(k, a.get(k, b""))):7} {k[6:]}')
print('same machine code' if same else 'machine code differs')
sys.exit(0 if same else 1)
PY
