#!/usr/bin/env bash
# The tool's front door and the benchmarks' options: unknown subcommands named with the valid
# ones, --version, the exit-code table in --help, every integer option of bench / bench-cuda /
# bench-dcp range-checked at full width before any work (exit code 2), and `bench --device cpu`
# reporting prefill against the FMA peak and decode against the copy bandwidth of the same run.
set -uo pipefail
kvattn=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
passed=0

# expect RC NEEDLE ARGS...: the command exits with RC and its stderr+stdout holds NEEDLE.
expect() {
  local want=$1 needle=$2
  shift 2
  "$kvattn" "$@" >"$tmp/out" 2>&1
  local rc=$?
  [ $rc -eq "$want" ] || fail "kvattn $*: expected exit code $want, got $rc: $(head -c 600 "$tmp/out")"
  grep -qF -- "$needle" "$tmp/out" || fail "kvattn $*: output lacks '$needle': $(head -c 600 "$tmp/out")"
  passed=$((passed + 1))
}

# ---- main: subcommands, version, exit codes ------------------------------------------------
expect 2 "unknown subcommand 'frobnicate'; valid: plan, run" frobnicate
expect 2 "unknown subcommand 'frobnicate'; valid: plan, run" frobnicate --help
expect 2 "a subcommand is required; valid: plan, run"
expect 0 "kvattn 0.1.0" --version
expect 0 "kvattn 0.1.0" version
expect 0 "  2  bad input" --help
expect 0 "  3  internal error" --help
expect 2 "--no-such-option" bench --no-such-option

# ---- bench: every integer option refused up front with its range ----------------------------
expect 2 "--page-size" bench --page-size 0                        # was SIGFPE
expect 2 "not in range" bench --page-size 0
expect 2 "--batch" bench --batch 100000000 --kv-len 100000000     # was a signed overflow
expect 2 "--batch" bench --batch 0
expect 2 "--kv-len" bench --kv-len -5
expect 2 "--threads" bench --threads -1
expect 2 "--threads" bench --threads 4294967298                   # no 32-bit truncation
expect 2 "--q-len" bench --q-len 0
expect 2 "--head-dim" bench --head-dim 99999999999999999999        # beyond int64
expect 2 "--copy-mib" bench --copy-mib 0
expect 2 "--min-seconds" bench --min-seconds -1
expect 2 "--num-kv-heads" bench --num-qo-heads 32 --num-kv-heads 5
expect 2 "unknown dtype 'f13'" bench --dtype f13
expect 2 "--q-len 2000 exceeds the prefill case's KV length 1024" bench --op prefill --q-len 2000
# in range one by one, but their product is not: refused before anything is allocated or timed
expect 2 "outside the representable range" bench --batch 1048576 --kv-len 16777216 --page-size 1
expect 2 "use a smaller --batch or --kv-len" bench --op decode --batch 4000 --kv-len 1000000
# --help shows types, defaults and ranges
expect 0 "INT in [1 - 65536]" bench --help
"$kvattn" bench --help >"$tmp/help"
grep -Eq -- "--page-size .*16" "$tmp/help" || fail "bench --help shows no default for --page-size: $(cat "$tmp/help")"
grep -Eq -- "--min-seconds FLOAT" "$tmp/help" || fail "bench --help types --min-seconds: $(cat "$tmp/help")"
passed=$((passed + 1))

# ---- bench-cuda and bench-dcp options -------------------------------------------------------
expect 2 "--batch" bench-cuda --batch 0 --kv-len 4096
expect 2 "--kv-len" bench-cuda --batch 4 --kv-len 99999999999
expect 2 "--kv-len" bench-cuda --batch 4                          # needs --kv-len
expect 2 "--long" bench-cuda --batch 4 --kv-len 4096 --long -3
expect 2 "must be opts[/splits[/chunk]]" bench-cuda --batch 4 --kv-len 4096 --variants 109/x
expect 2 "--dcp" bench-dcp --dcp 4294967298
expect 2 "--iters" bench-dcp --iters 0
expect 2 "--comm" bench-dcp --comm ring
expect 0 "INT in [2 - 64]" bench-dcp --help

# ---- bench --device cpu: each op against its own ceiling, measured in the same run ----------
# (small shapes: this also runs in the sanitizer build)
small=(--device cpu --batch 2 --kv-len 128 --threads 1 --copy-mib 8 --min-seconds 0.01)
"$kvattn" bench --op decode "${small[@]}" >"$tmp/decode" 2>&1 || fail "bench decode: $(cat "$tmp/decode")"
grep -Eq "^decode .* of copy bandwidth" "$tmp/decode" || fail "bench decode ratio: $(cat "$tmp/decode")"
grep -q "FMA peak" "$tmp/decode" && fail "bench decode alone measures no FMA peak: $(cat "$tmp/decode")"
"$kvattn" bench --op prefill "${small[@]}" --q-len 64 >"$tmp/prefill" 2>&1 || fail "bench prefill: $(cat "$tmp/prefill")"
grep -q "f32 FMA peak (1 threads)" "$tmp/prefill" || fail "bench prefill: no FMA peak: $(cat "$tmp/prefill")"
grep -Eq "^prefill .* of the FMA peak" "$tmp/prefill" || fail "bench prefill ratio: $(cat "$tmp/prefill")"
grep -Eq "^prefill .*copy bandwidth" "$tmp/prefill" && fail "prefill against the copy bandwidth: $(cat "$tmp/prefill")"
"$kvattn" bench --op prefill "${small[@]}" --q-len 64 --json >"$tmp/bench.json" 2>"$tmp/err" ||
  fail "bench --json: $(cat "$tmp/err")"
/usr/bin/python3 - "$tmp/bench.json" <<'PY' || fail "bench --json content: $(cat "$tmp/bench.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert "GFLOPps" not in json.dumps(j), "the misspelled key is gone"
assert j["fma_peak_GFLOP_per_s"] > 0 and j["copy_GBps"] > 0
p = j["prefill"]
assert p["batch"] == 2 and p["kv_len"] == 128 and p["q_len"] == 64, p
assert p["GFLOP_per_s"] > 0 and "ratio_to_copy" not in p
assert abs(p["ratio_to_fma_peak"] - p["GFLOP_per_s"] / j["fma_peak_GFLOP_per_s"]) < 1e-9
PY
passed=$((passed + 1))
echo "cli input tests: $passed passed, 0 failed"
