#!/usr/bin/env bash
# End-to-end checks of the `kvattn` tool: `run` on a malformed trace reports each bad line with
# its number and serves every valid one; `run --json` writes the summary; `plan` works and
# rejects bad input with exit code 2.
set -uo pipefail
kvattn=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$kvattn" run --trace "$here/malformed.jsonl" --num-layers 2 --json "$tmp/run.json" --quiet >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "malformed trace: expected exit code 1 (served, with trace errors), got $rc"
grep -q "malformed.jsonl:3: field \"prompt_len\" = -5" "$tmp/err" || fail "line 3 not reported: $(cat "$tmp/err")"
grep -q "malformed.jsonl:4: not valid JSON" "$tmp/err" || fail "line 4 not reported"
grep -q "malformed.jsonl:5: .*9000" "$tmp/err" || fail "line 5 not reported"
grep -q "3 served, 3 malformed trace lines skipped" "$tmp/out" || fail "summary: $(cat "$tmp/out")"
grep -q '"all_outputs_correct": true' "$tmp/run.json" || fail "json summary"
grep -q '"requests": 3' "$tmp/run.json" || fail "json request count"
grep -q '"generated_tokens": 9' "$tmp/run.json" || fail "json generated tokens"
# every step's timing: as many entries as steps, their tokens summing to the total
/usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
st = j["step_timings"]
assert len(st) == j["steps"] > 0, (len(st), j["steps"])
assert sum(t["tokens"] for t in st) == j["tokens"], "step tokens do not sum to the total"
assert all(t["attention_us"] > 0 and t["host_us"] > 0 for t in st), "a step without timings"
' "$tmp/run.json" || fail "json step_timings"
grep -q "slowest step        #" "$tmp/out" || fail "summary lacks the slowest step"

"$kvattn" plan --model llama3-8b --gpu-memory 16GiB >"$tmp/plan" || fail "plan failed"
grep -q "8192 fit" "$tmp/plan" || fail "plan output: $(cat "$tmp/plan")"
"$kvattn" plan --model llama3-8b --gpu-memory 16GiB --layout XYZ >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "bad layout: expected exit code 2"
grep -q "LBNHC" "$tmp/err" || fail "bad layout message lists the valid layouts: $(cat "$tmp/err")"
"$kvattn" run --trace /nonexistent.jsonl --quiet >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "missing trace: expected exit code 2"

# Decode context parallelism on CPU: 2 ranks as threads, every step checked against the
# reference (which reads a host shadow of both ranks' shards); a bad rank count is rejected.
"$kvattn" run --dcp 2 --dcp-comm-backend a2a --dcp-interleave 4 --num-requests 8 --num-layers 2 \
  --json "$tmp/dcp.json" --quiet >"$tmp/out" 2>"$tmp/err" || fail "run --dcp 2: $(cat "$tmp/err")"
grep -q "DCP                 2 ranks (in-process" "$tmp/out" || fail "DCP summary line: $(cat "$tmp/out")"
grep -q '"dcp": 2' "$tmp/dcp.json" || fail "json dcp"
grep -q '"all_outputs_correct": true' "$tmp/dcp.json" || fail "dcp outputs"
grep -Eq '"checks_passed": [1-9]' "$tmp/dcp.json" || fail "dcp checks: $(cat "$tmp/dcp.json")"
"$kvattn" run --dcp 3 --quiet >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "--dcp 3 with 8 heads: expected exit code 2"
grep -q "valid --dcp values divide 8" "$tmp/err" || fail "--dcp 3 message: $(cat "$tmp/err")"
echo "cli tests: 4 passed, 0 failed"
