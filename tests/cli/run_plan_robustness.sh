#!/usr/bin/env bash
# `kvattn run` / `kvattn plan` robustness, end to end: the scheduler finishes every valid trace
# (the hang reproducer, idle stretches of 1e9 and 2^40 steps, a multi-group model at plan's
# capacity), preemption does not thrash, result files fail loudly, every bad value is refused
# up front with its valid range, and plan works without memory flags.
set -uo pipefail
kvattn=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
fail() { echo "FAIL: $*"; exit 1; }
ok() { passed=$((passed + 1)); }
fast=(--num-layers 1 --check-every 0 --quiet)

# 1. The hang reproducer (default 16 MiB): two long prompts with cached prefixes, then requests
#    reusing another prefix.  It used to spin at "3/4 requests done" forever.
cat >"$tmp/hang.jsonl" <<'T'
{"arrival_step": 0, "prompt_len": 4000, "output_len": 2, "shared_prefix_id": 1, "shared_prefix_len": 3900}
{"arrival_step": 0, "prompt_len": 4000, "output_len": 2, "shared_prefix_id": 3, "shared_prefix_len": 3900}
{"arrival_step": 10, "prompt_len": 64, "output_len": 2, "shared_prefix_id": 2, "shared_prefix_len": 32}
{"arrival_step": 20, "prompt_len": 1000, "output_len": 2, "shared_prefix_id": 2, "shared_prefix_len": 32}
T
timeout 120 "$kvattn" run --trace "$tmp/hang.jsonl" "${fast[@]}" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "hang trace: exit $rc: $(cat "$tmp/err")"
grep -q "requests            4 served" "$tmp/out" || fail "hang trace summary: $(cat "$tmp/out")"
ok

# 2. Idle stretches are skipped: arrivals at 1e9 and 2^40 finish at once.
cat >"$tmp/far.jsonl" <<'T'
{"arrival_step": 0, "prompt_len": 20, "output_len": 2}
{"arrival_step": 1000000000, "prompt_len": 20, "output_len": 2}
{"arrival_step": 1099511627776, "prompt_len": 20, "output_len": 2}
T
timeout 30 "$kvattn" run --trace "$tmp/far.jsonl" "${fast[@]}" >"$tmp/out" 2>"$tmp/err" || fail "far arrivals: $(cat "$tmp/err")"
grep -q "steps               6$" "$tmp/out" || fail "far arrivals: expected 6 steps: $(cat "$tmp/out")"
ok

# 3. A multi-group model serves the 4096-token request plan says fits (sliding-window blocks
#    that leave the window are freed; the groups share one pool's block ids).
"$kvattn" plan --model tiny-gemma2 --gpu-memory 16MiB >"$tmp/plan" || fail "plan tiny-gemma2"
grep -q "one 4096-token request holds 417 blocks" "$tmp/plan" || fail "plan tiny-gemma2: $(cat "$tmp/plan")"
echo '{"arrival_step": 0, "prompt_len": 4000, "output_len": 96}' >"$tmp/long.jsonl"
timeout 240 "$kvattn" run --model tiny-gemma2 --num-layers 2 --trace "$tmp/long.jsonl" --check-every 16 --quiet \
  --json "$tmp/g2.json" >"$tmp/out" 2>"$tmp/err" || fail "tiny-gemma2 4096 tokens: $(cat "$tmp/err")"
grep -q '"all_outputs_correct": true' "$tmp/g2.json" || fail "tiny-gemma2 outputs"
grep -Eq '"checks_passed": [1-9]' "$tmp/g2.json" || fail "tiny-gemma2 checks"
grep -q "group 1           1 layers, full_attention" "$tmp/out" || fail "run prints its plan's groups: $(cat "$tmp/out")"
ok

# 4. Preemption without thrash (a small version of tests/cli/exhaustion24.jsonl, whose full
#    figures the scheduler-level test asserts): 8 long requests under 64 usable blocks.  With
#    optimistic admission decode growth preempts and work is recomputed; the default reserve
#    computes at most 1.5x the necessary tokens.  The summary and JSON carry the figures.
for i in 0 1 2 3 4 5 6 7; do
  echo "{\"arrival_step\": 0, \"prompt_len\": $((300 + i * 37)), \"output_len\": $((60 + i * 5))}"
done >"$tmp/ex.jsonl"
for adm in optimistic reserve; do
  "$kvattn" run --trace "$tmp/ex.jsonl" --max-model-len 1024 --gpu-memory 532480 --admission $adm "${fast[@]}" \
    --json "$tmp/ex-$adm.json" >"$tmp/out-$adm" 2>"$tmp/err" || fail "small exhaustion trace ($adm): $(cat "$tmp/err")"
  grep -Eq "recomputed tokens [0-9]+ \([0-9.]+x the 4048 necessary; --admission $adm" "$tmp/out-$adm" ||
    fail "recompute line: $(cat "$tmp/out-$adm")"
done
/usr/bin/python3 -c '
import json, sys
o, r = (json.load(open(p)) for p in sys.argv[1:3])
for j in (o, r):
    assert j["all_outputs_correct"] and j["requests_served"] == 8, j
    assert j["computed_tokens"] - j["recomputed_tokens"] == 4048, j["computed_tokens"]
assert o["preemptions"] > 0 and o["recompute_ratio"] > 1.0, (o["preemptions"], o["recompute_ratio"])
assert r["recompute_ratio"] <= 1.5, r["recompute_ratio"]
' "$tmp/ex-optimistic.json" "$tmp/ex-reserve.json" || fail "exhaustion json"
ok

# 5. Result files: an unwritable path is refused before the run; a write error (/dev/full) is
#    an error; --json - --quiet writes only JSON to stdout.
start=$(date +%s)
"$kvattn" run --json "$tmp/no/such/dir/x.json" --quiet >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "unwritable --json: exit $rc"
grep -q "cannot be opened for writing" "$tmp/err" || fail "unwritable --json message: $(cat "$tmp/err")"
[ $(( $(date +%s) - start )) -lt 5 ] || fail "unwritable --json was reported after the run"
"$kvattn" run --num-requests 4 "${fast[@]}" --json /dev/full >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "--json /dev/full: exit $rc"
grep -q "No space left on device" "$tmp/err" || fail "--json /dev/full message: $(cat "$tmp/err")"
"$kvattn" run --num-requests 4 "${fast[@]}" --json - >"$tmp/stdout.json" 2>/dev/null || fail "--json -"
/usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/stdout.json" || fail "--json - stdout is not only JSON"
"$kvattn" plan --model llama3-8b >/dev/full 2>"$tmp/err"
[ $? -eq 2 ] || fail "plan >/dev/full: expected exit 2"
ok

# 6. Integers are checked at full width; --num-requests with a trace file is refused.
expect_refused() {  # message-regex, args...
  local want=$1
  shift
  "$kvattn" "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: expected exit 2, got $rc"
  grep -Eq -e "$want" "$tmp/err" || fail "$*: message lacks /$want/: $(cat "$tmp/err")"
}
expect_refused "--dcp 4294967298 is outside the valid range \[1, 64\]" run --dcp 4294967298 --quiet
expect_refused "--check-every 4294967296 is outside the valid range \[0, 2147483647\]" run --check-every 4294967296 --quiet
expect_refused "--max-num-seqs must be an integer" run --max-num-seqs 3x --quiet
expect_refused "--num-requests sizes the built-in default trace" run --trace "$tmp/far.jsonl" --num-requests 5 --quiet
expect_refused "--block-size 99999999999999999999 is outside the valid range" plan --model llama3-8b --block-size 99999999999999999999
ok

# 7. Refused up front, in the user's terms.
expect_refused "--dcp-interleave 3 must divide the KV cache block size 16" run --dcp 2 --dcp-interleave 3 --quiet
expect_refused "num_attention_heads / dcp = 8 / 8 = 1 query heads.*num_key_value_heads \(2.*valid --dcp values for tiny-llama: 1, 2, 4" \
  run --dcp 8 --quiet
expect_refused "--max-model-len 16 is below what the default trace needs" run --max-model-len 16 --quiet
ok

# 8. Trace values: a misspelled field is a warning with its line; an overflowing value is quoted
#    as written; the run's exit code says a line was skipped.
printf '%s\n' '{"arrival_step": 0, "prompt_len": 10, "output_len": 2, "shared_prefix_ln": 4}' \
  '{"arrival_step": 18446744073709551615, "prompt_len": 10, "output_len": 2}' >"$tmp/keys.jsonl"
"$kvattn" run --trace "$tmp/keys.jsonl" "${fast[@]}" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "trace with a bad line: expected exit 1, got $rc"
grep -q 'keys.jsonl:1: warning: unknown field "shared_prefix_ln"' "$tmp/err" || fail "unknown key warning: $(cat "$tmp/err")"
grep -q 'keys.jsonl:2: field "arrival_step" = 18446744073709551615 is outside' "$tmp/err" || fail "overflow: $(cat "$tmp/err")"
ok

# 9. plan without memory flags (CPU: the stated 4 GiB default), as the README's tour runs it;
#    --help shows defaults, types and what is required.
"$kvattn" plan --model gemma2-9b --json >"$tmp/plan.json" 2>"$tmp/err" || fail "plan --model gemma2-9b --json: $(cat "$tmp/err")"
/usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["num_blocks"] > j["blocks_per_request"] > 0, j["num_blocks"]
assert j["gpu_memory"] > 0 and j["gpu_memory_reason"], j["gpu_memory_reason"]
' "$tmp/plan.json" || fail "plan json"
"$kvattn" plan --help >"$tmp/help"
grep -q "(required) Model preset" "$tmp/help" || fail "plan --help marks --model required"
grep -q "max-num-batched-tokens INT=2048" "$tmp/help" || fail "plan --help default and type: $(cat "$tmp/help")"
"$kvattn" run --help >"$tmp/help"
grep -q "max-num-seqs INT=32" "$tmp/help" || fail "run --help default and type: $(cat "$tmp/help")"
grep -q "Exit codes: 0" "$tmp/help" || fail "run --help lists the exit codes"
ok

# 10. The summary states the check tolerance, why cascade did not run, with scaled units.
"$kvattn" run --num-requests 12 --num-layers 1 --quiet >"$tmp/out" 2>/dev/null || fail "default run"
grep -Eq "tolerance 0\.03\)" "$tmp/out" || fail "tolerance: $(cat "$tmp/out")"
grep -Eq "cascade             0 of [0-9]+ steps — rule .*not used on group-steps: [0-9]+ " "$tmp/out" || fail "cascade reason"
grep -Eq "attention / step    median [0-9.]+ (us|ms|s)," "$tmp/out" || fail "units"
ok

echo "run/plan robustness tests: $passed passed, 0 failed"
