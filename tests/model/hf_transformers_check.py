#!/usr/bin/env python3
"""kvattn against Hugging Face transformers on real architectures (run where torch and
transformers are installed, e.g. a machine with an NVIDIA GPU).

For each architecture (Llama 3 with llama3 rope scaling, Mistral with a sliding window, Qwen2 with
q/k/v bias, Qwen3 with q/k norms, Gemma 2 with soft caps and alternating sliding layers) it builds
a small model with transformers from a config (random weights from a seed, norm weights perturbed
so they matter), saves it with save_pretrained (float32 safetensors), adds a real tokenizer, and
for every dtype D of --dtypes runs `kvattn generate --json --logprobs K --device DEV --dtype D`
(DEV = --kvattn-device) greedily on a batch of prompts (lengths 1 .. --max-prompt-len, as token
ids), once with the default token budget and once with chunked prefill (--variants).  --full-size adds a
Llama-3-8B-shaped model (random bf16 weights, std 0.02, the real Llama 3 tokenizer, sharded
bf16 safetensors), checked in every dtype of --dtypes with the default token budget.  Models are
cast the way from_pretrained(dtype=...) loads them: parameters only, the rotary inverse
frequencies stay float32 (cast_parameters).

Reference: teacher forcing.  Each prompt followed by kvattn's generated tokens is run through
transformers in ONE forward pass (on the GPU when there is one); the logits at the last prompt
position and at every generated position give, for every step, transformers' log-softmax at the
token kvattn chose and at kvattn's top-K alternatives, transformers' argmax and its top-2 logit
margin.  Both sides see the same prefix at every step, so every step is a fair comparison, also
after a step where they chose differently.  (`--json` exposes log-probabilities, not logits;
the raw log-probabilities, `--logprobs-mode raw_logprobs`, are the log-softmax of the model's
logits, so the first generated step compares the prompt's last-position logits up to their
log-sum-exp.)

* float32: max |kvattn logprob - transformers f32 logprob| over the chosen tokens and the top-K
  entries must be <= --tol (1e-3).  Greedy: at every step kvattn's token must be transformers'
  argmax, except where transformers' top-2 logit margin is below max(--tie-gap, 2 x the largest
  |delta logprob| measured in that run, at most 2 x --tol) -- a tie: an error e on each of two
  log-probs can flip a margin up to 2e.
* bfloat16: transformers runs the same model in bfloat16 AND float32 on the same teacher-forced
  sequences.  Its own gap G = max |logprob_bf16 - logprob_f32| over the same compared entries
  measures the rounding noise of one sound bf16 implementation of this model on these inputs.
  kvattn-bf16 is compared with transformers-f32 and must be within B = max(k x G, floor) with
  k = --bf16-k (2) and floor = --bf16-floor (1e-2).  k = 2 because kvattn is an independent bf16
  implementation: it rounds at other points (fused kernels, other GEMM tilings, its own rounding
  of the logits), so its noise has the size of transformers' but not the same values, and the
  maximum of such noise over thousands of entries can land above G; twice the reference noise
  covers that while a real bug (a wrong rope frequency, a missing norm or bias, a soft cap off,
  a wrong sliding window) moves log-probs by O(1), far above 2G.  The floor keeps B from
  shrinking below bf16's resolution of the logits.  Greedy: a differing token is a tie where
  transformers-f32's top-2 margin is below 2B (each of the two log-probs may be off by B), a
  failure otherwise.
* tokenization: kvattn's prompt_token_ids of a text corpus against the `tokenizers` library's
  encoding of the same tokenizer.json.

Random-weight models have flat distributions (many small top-2 margins), so ties are common and
are counted, not hidden: the summary gives per architecture and dtype the max |delta|, the
transformers gap, the bound, the steps compared, ties, divergences, kvattn's wall time and
generated tokens/s.  Timings per phase go to stdout and to the JSON file (--out/hf_check.json);
the log of every command is --out/hf_check.log.  Exit status 0 only when every check passes.

  tests/model/hf_transformers_check.py --kvattn build/cuda-release/tools/kvattn \\
      --tokenizers DIR_WITH_tokenizer-*/models --out DIR [--arch llama,...] [--full-size]

`--self-test` checks the comparison rules, the bound and the summary table on synthetic NumPy
data (no torch, transformers or kvattn needed); with --kvattn it also runs the comparison path
end to end on the CPU, against the float64 NumPy reference forward instead of transformers.
"""
import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

# torch and transformers are imported by main() for a real check; --self-test needs NumPy only.
torch = None
transformers = None

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "你好，世界。日本語のテキストも。",
    "emoji: 😀🎉👍🏽 and a flag 🇫🇷",
    "def f(x):\n    return x ** 2  # code\n\n\tindented",
    "   leading and    internal   whitespace runs   ",
    "numbers 3.14159 2,718 1e-10 -42",
]

FULL_SIZE = "llama3-8b-shape"


# ----------------------------------------------------------------------------------------------
# The comparison rules (pure Python / NumPy: the self-test runs them on synthetic data)

def bf16_bound(hf_gap, k, floor):
    """kvattn-bf16 vs transformers-f32 may differ by at most max(k x transformers' own gap, floor)."""
    return max(k * hf_gap, floor)


def reference_from_logits(logits, want_ids):
    """The reference of one teacher-forced sequence from its logits rows (steps x vocab, NumPy):
    per step the argmax, the top-2 logit margin and the log-softmax at each id of want_ids[step].
    (The GPU path computes the same with torch in hf_reference.)"""
    ref = []
    for row, ids in zip(np.asarray(logits, dtype=np.float64), want_ids):
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        top2 = np.sort(row)[-2:]
        ref.append({"argmax": int(row.argmax()), "margin": float(top2[1] - top2[0]),
                    "lp": {int(t): float(row[t] - lse) for t in ids}})
    return ref


def wanted_ids(out):
    """Per generated step: kvattn's chosen token and the ids of its top-K entries."""
    want = []
    for t, entries in zip(out["token_ids"], out["logprobs"]):
        ids = [int(t)] + [int(e["token_id"]) for e in entries if int(e["token_id"]) != int(t)]
        want.append(ids)
    return want


def logprob_deltas(out, ref):
    """Max |kvattn - reference| over the chosen tokens and over all listed entries of one prompt,
    and the number of steps.  A chosen token missing from kvattn's list is an error."""
    max_chosen, max_all = 0.0, 0.0
    for s, (t, entries, r) in enumerate(zip(out["token_ids"], out["logprobs"], ref)):
        listed = {int(e["token_id"]): float(e["logprob"]) for e in entries}
        if int(t) not in listed:
            raise ValueError(f"step {s}: kvattn's logprobs do not list its chosen token {t}")
        for tid, v in listed.items():
            d = abs(v - r["lp"][tid]) if math.isfinite(v) else math.inf
            max_all = max(max_all, d)
            if tid == int(t):
                max_chosen = max(max_chosen, d)
    return max_chosen, max_all, len(ref)


def reference_gap(ref_a, ref_b):
    """Max |a - b| over the entries two references share (transformers bf16 vs f32)."""
    g = 0.0
    for ra, rb in zip(ref_a, ref_b):
        for tid, v in ra["lp"].items():
            g = max(g, abs(v - rb["lp"][tid]))
    return g


def greedy_check(tokens, ref, margin_limit):
    """Position by position: kvattn's token must be the reference's argmax, or the reference's
    top-2 margin must be below margin_limit (a tie).  Returns (equal, ties, divergences)."""
    equal, ties, diverged = 0, 0, []
    for s, (t, r) in enumerate(zip(tokens, ref)):
        if int(t) == r["argmax"]:
            equal += 1
        elif r["margin"] < margin_limit:
            ties += 1
        else:
            diverged.append({"step": s, "kvattn": int(t), "reference": r["argmax"], "margin": r["margin"]})
    return equal, ties, diverged


def evaluate_run(dtype, prompts, outs, ref_f32, ref_bf16, a):
    """Judge one kvattn run: outs[i] (kvattn's JSON output of prompt i) against ref_f32[i] and,
    for bfloat16, transformers' own bf16 reference ref_bf16[i] on the same sequences."""
    if len(outs) != len(prompts):
        raise ValueError(f"kvattn returned {len(outs)} outputs for {len(prompts)} prompts")
    max_chosen, max_all, steps = 0.0, 0.0, 0
    for o, r in zip(outs, ref_f32):
        c, m, n = logprob_deltas(o, r)
        max_chosen, max_all, steps = max(max_chosen, c), max(max_all, m), steps + n
    res = {"dtype": dtype, "steps_compared": steps, "max_abs_dlogprob_chosen": max_chosen,
           "max_abs_dlogprob": max_all}
    if dtype == "bfloat16":
        gap = max((reference_gap(rb, rf) for rb, rf in zip(ref_bf16, ref_f32)), default=0.0)
        bound = bf16_bound(gap, a.bf16_k, a.bf16_floor)
        margin_limit = 2 * bound
        res.update(hf_bf16_vs_f32_gap=gap, bound=bound, bound_rule=f"max({a.bf16_k} x gap, {a.bf16_floor})")
    else:
        bound = a.tol
        margin_limit = max(a.tie_gap, 2 * min(max_all, a.tol))
        res.update(hf_bf16_vs_f32_gap=None, bound=bound, bound_rule="--tol")
    equal = ties = 0
    diverged = []
    for i, (p, o, r) in enumerate(zip(prompts, outs, ref_f32)):
        e, t, d = greedy_check(o["token_ids"], r, margin_limit)
        equal, ties = equal + e, ties + t
        diverged += [dict(x, prompt=i, prompt_len=len(p)) for x in d]
    res.update(tie_margin=margin_limit, greedy_equal=equal, ties=ties, diverged=diverged[:20],
               num_diverged=len(diverged), ok=not diverged and max_all <= bound)
    return res


def summary_table(rows):
    """One line per architecture, dtype and kvattn run."""
    head = (f"{'arch':<16} {'dtype':<8} {'run':<8} {'max|d|':>9} {'hf gap':>9} {'bound':>9} {'steps':>6} "
            f"{'ties':>5} {'div':>4} {'kv s':>6} {'tok/s':>8}  result")
    lines = [head, "-" * len(head)]

    def num(v):
        return f"{v:9.2e}" if isinstance(v, (int, float)) else f"{'-':>9}"

    for r in rows:
        if "error" in r:
            lines.append(f"{r['arch']:<16} {r.get('dtype', '-'):<8} {r.get('run', '-'):<8} ERROR "
                         f"{' '.join(r['error'].split())[:60]}")
            continue
        lines.append(f"{r['arch']:<16} {r['dtype']:<8} {r['run']:<8} {num(r['max_abs_dlogprob'])} "
                     f"{num(r['hf_bf16_vs_f32_gap'])} {num(r['bound'])} {r['steps_compared']:>6} "
                     f"{r['ties']:>5} {r['num_diverged']:>4} {r.get('kvattn_wall_s', 0):>6.1f} "
                     f"{r.get('kvattn_tokens_per_s', 0):>8.1f}  {'pass' if r['ok'] else 'FAIL'}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Models, prompts, kvattn

def tokenizer_for(arch):
    return {"llama": "tokenizer-llama3_1", "mistral": "tokenizer-llama2", "qwen2": "tokenizer-qwen3",
            "qwen3": "tokenizer-qwen3", "gemma2": "tokenizer-gemma3", FULL_SIZE: "tokenizer-llama3_1"}[arch]


def make_config(arch, vocab, bos, eos):
    if arch == FULL_SIZE:  # Llama-3-8B's shape
        return transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
            rms_norm_eps=1e-5, bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=False,
            initializer_range=0.02, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    common = dict(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=bos,
                  eos_token_id=eos, tie_word_embeddings=False)
    if arch == "llama":
        return transformers.LlamaConfig(
            **common, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})
    if arch == "mistral":
        return transformers.MistralConfig(**common, rope_theta=10000.0, sliding_window=96)
    if arch == "qwen2":
        c = dict(common, tie_word_embeddings=True)
        return transformers.Qwen2Config(**c, rope_theta=1000000.0)
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, rope_theta=1000000.0)
    if arch == "gemma2":
        c = dict(common, tie_word_embeddings=True, rms_norm_eps=1e-6)
        return transformers.Gemma2Config(**c, rope_theta=10000.0, sliding_window=96,
                                         attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                         query_pre_attn_scalar=64, hidden_activation="gelu_pytorch_tanh")
    raise ValueError(f"unknown architecture '{arch}'; valid: llama, mistral, qwen2, qwen3, gemma2")


def tokenizer_info(tok_dir):
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = max(max(tj["model"]["vocab"].values()) if isinstance(tj["model"]["vocab"], dict)
                else len(tj["model"]["vocab"]) - 1,
                max([t["id"] for t in tj.get("added_tokens", [])] or [0])) + 1
    tc = json.load(open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8"))
    id_of = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}

    def tok_id(name):
        v = tc.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        return id_of.get(v) if v is not None else None

    return vocab, tok_id("bos_token"), tok_id("eos_token")


def model_from_config(cfg, dtype):
    try:
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=dtype)
    except TypeError:  # transformers before `dtype` was accepted
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=dtype)


def cast_parameters(model, dtype):
    """The model in `dtype` as `from_pretrained(..., dtype=dtype)` loads it: the parameters cast,
    the rotary embedding's inverse frequencies kept in float32.  (`model.to(dtype)` would cast
    those buffers too: bf16 frequencies put the angle of position 1500 off by several radians,
    a transformers artefact no real bf16 deployment has.)"""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    rotary_in_float32(model)
    return model


def rotary_in_float32(model):
    """Recomputes every rotary module's float buffers (inv_freq, original_inv_freq) in float32
    where they are not: from its config, as the module's constructor does."""
    for mod in model.modules():
        buf = getattr(mod, "inv_freq", None)
        if not isinstance(buf, torch.Tensor) or buf.dtype == torch.float32:
            continue
        try:
            fresh = type(mod)(config=mod.config, device=buf.device)
        except TypeError:
            fresh = type(mod)(mod.config)
        for name, b in fresh.named_buffers(recurse=False):
            setattr(mod, name, b.to(device=buf.device, dtype=torch.float32))
        for name in ("original_inv_freq",):
            if isinstance(getattr(fresh, name, None), torch.Tensor):
                setattr(mod, name, getattr(fresh, name).to(device=buf.device, dtype=torch.float32))
        if mod.inv_freq.dtype != torch.float32:
            raise RuntimeError(f"{type(mod).__name__}: inv_freq stays {mod.inv_freq.dtype}")


def copy_tokenizer(tok_dir, out_dir):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), out_dir)


def build_model_dir(arch, tok_dir, out_dir, seed):
    """A small float32 model (kept in CPU memory; the caller moves it)."""
    vocab, bos, eos = tokenizer_info(tok_dir)
    cfg = make_config(arch, vocab, bos, eos)
    torch.manual_seed(seed)
    model = model_from_config(cfg, torch.float32).to(torch.float32)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if "norm" in name:  # norms near 1 (Gemma stores w for a (1 + w) scale: near 0)
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer(tok_dir, out_dir)
    return model, vocab


def build_full_size_dir(tok_dir, out_dir, seed):
    """Llama-3-8B's shape with random weights (normal, std 0.02; norms 1), created in bfloat16 on
    the GPU from a seed and saved as sharded bf16 safetensors."""
    vocab, bos, eos = tokenizer_info(tok_dir)
    vocab = max(vocab, 128256)
    cfg = make_config(FULL_SIZE, vocab, bos, eos)
    with torch.device("cuda"):
        model = model_from_config(cfg, torch.bfloat16)
    model = cast_parameters(model.to(device="cuda"), torch.bfloat16)
    with torch.no_grad():
        g = torch.Generator(device="cuda").manual_seed(seed)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="4GB")
    copy_tokenizer(tok_dir, out_dir)
    return model.eval(), vocab


def prompts_for(vocab, n, max_len, seed):
    rng = np.random.default_rng(seed)
    lens = sorted({1, 2, 3, max_len} | set(int(x) for x in np.geomspace(4, max_len, max(n - 4, 0))))
    while len(lens) < n:
        lens.append(int(rng.integers(1, max_len + 1)))
    hi = min(vocab, 120000)  # ordinary tokens (special tokens sit at the top of these vocabularies)
    return [rng.integers(100, hi, size=L).tolist() for L in lens[:n]]


def gpu_memory_utilization(a):
    """kvattn checks free memory >= utilization x total at start (as vLLM does); transformers holds
    part of the same GPU, so the default is what is free, less a margin, at most 0.5."""
    if a.gpu_memory_utilization:
        return a.gpu_memory_utilization
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return max(0.05, min(0.5, math.floor((free / total - 0.03) * 100) / 100))


def run_kvattn(a, model_dir, prompts, steps, dtype, extra, log):
    pf = os.path.join(model_dir, "prompts.jsonl")
    with open(pf, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_token_ids": p}) + "\n")
    cmd = [a.kvattn, "generate", model_dir, "--prompts", pf, "--device", a.kvattn_device, "--dtype", dtype,
           "--temperature", "0", "--max-tokens", str(steps), "--ignore-eos", "--logprobs", str(a.topk),
           "--logprobs-mode", "raw_logprobs", "--json"]
    if a.kvattn_device.startswith("cuda"):
        cmd += ["--gpu-memory-utilization", f"{gpu_memory_utilization(a):.2f}"]
        kv = a.full_kv_cache_memory if os.path.basename(model_dir) == f"hf-{FULL_SIZE}" else a.kv_cache_memory
        if kv:
            cmd += ["--kv-cache-memory", kv]
    with open(os.path.join(model_dir, "config.json")) as f:
        max_positions = json.load(f).get("max_position_embeddings", 0)
    if max_positions > 8192:  # the full-size config allows 131072; the prompts need far fewer
        cmd += ["--max-model-len", "8192"]
    cmd += extra
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    log.write(" ".join(cmd) + f"\n  rc {r.returncode} in {wall:.1f} s\n{r.stderr[-4000:]}\n")
    log.flush()
    if r.returncode != 0:
        raise RuntimeError(f"kvattn generate failed (rc {r.returncode}): {r.stderr[-1500:]}")
    doc = json.loads(r.stdout)
    outs = doc["outputs"] if isinstance(doc, dict) else doc
    stats = doc.get("stats", {}) if isinstance(doc, dict) else {}
    for i, o in enumerate(outs):
        if len(o["token_ids"]) != steps or len(o.get("logprobs", [])) != steps:
            raise RuntimeError(f"prompt {i}: kvattn generated {len(o['token_ids'])} tokens with "
                               f"{len(o.get('logprobs', []))} logprob lists, expected {steps}")
    return outs, stats, wall


def forward_logits(model, seq, n):
    """Logits (float32) of the last n positions of one sequence, one forward pass."""
    x = torch.tensor([seq], device=model.device)
    try:
        out = model(input_ids=x, use_cache=False, logits_to_keep=n)
    except TypeError:  # transformers without logits_to_keep
        out = model(input_ids=x, use_cache=False)
    return out.logits[0, -n:].float()


def hf_reference(model, prompts, outs):
    """Teacher-forced reference of every prompt + kvattn's continuation (see reference_from_logits)."""
    refs = []
    with torch.no_grad():
        for p, o in zip(prompts, outs):
            gen = [int(t) for t in o["token_ids"]]
            n = len(gen)
            logits = forward_logits(model, list(p) + gen[:-1], n)
            lp = torch.log_softmax(logits, dim=-1)
            top = torch.topk(logits, 2, dim=-1)
            want = wanted_ids(o)
            width = max(len(w) for w in want)
            idx = torch.tensor([w + [w[0]] * (width - len(w)) for w in want], device=logits.device)
            got = lp.gather(1, idx).cpu().tolist()
            arg = top.indices[:, 0].cpu().tolist()
            margin = (top.values[:, 0] - top.values[:, 1]).cpu().tolist()
            refs.append([{"argmax": int(arg[s]), "margin": float(margin[s]),
                          "lp": {t: float(v) for t, v in zip(want[s], got[s])}} for s in range(n)])
    return refs


def tokenizer_check(kvattn, model_dir, log):
    import tokenizers
    tk = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    pf = os.path.join(model_dir, "corpus.jsonl")
    with open(pf, "w") as f:
        for t in CORPUS:
            f.write(json.dumps({"prompt": t}) + "\n")
    r = subprocess.run([kvattn, "generate", model_dir, "--prompts", pf, "--device", "cpu", "--dtype", "float32",
                        "--temperature", "0", "--max-tokens", "1", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return {"ok": False, "error": r.stderr[-1000:]}
    doc = json.loads(r.stdout)
    outs = doc["outputs"] if isinstance(doc, dict) else doc
    bad = []
    for text, o in zip(CORPUS, outs):
        ref = tk.encode(text, add_special_tokens=True).ids
        if list(o["prompt_token_ids"]) != list(ref):
            bad.append({"text": text, "kvattn": o["prompt_token_ids"][:40], "tokenizers": ref[:40]})
    log.write(f"tokenizer check: {len(CORPUS) - len(bad)}/{len(CORPUS)} equal\n")
    return {"ok": not bad, "equal": len(CORPUS) - len(bad), "total": len(CORPUS), "mismatches": bad}


def check_model(arch, model, model_dir, prompts, steps, dtypes, variants, a, log, phases):
    """kvattn runs (every dtype x variant) against transformers' teacher-forced references.
    `model` is transformers' model in float32, or in bfloat16 for the full-size model (upcast for
    the float32 reference after the bf16 one)."""
    runs = []
    rows = []
    for dtype in dtypes:
        for variant in variants:
            extra = ["--max-num-batched-tokens", "256"] if variant == "chunked" else []
            t0 = time.time()
            try:
                outs, stats, wall = run_kvattn(a, model_dir, prompts, steps, dtype, extra, log)
            except Exception as e:  # report and go on
                rows.append({"arch": arch, "dtype": dtype, "run": variant, "ok": False,
                             "error": f"{type(e).__name__}: {e}"[:3000]})
                continue
            phases[f"kvattn {dtype} {variant}"] = round(time.time() - t0, 2)
            runs.append((dtype, variant, outs, stats, wall))
    refs = {}
    full_bf16 = next(model.parameters()).dtype == torch.bfloat16
    order = ["bfloat16", "float32"] if full_bf16 else ["float32", "bfloat16"]
    for ref_dtype in order:
        need = [r for r in runs if ref_dtype == "float32" or r[0] == "bfloat16"]
        if not need:
            continue
        t0 = time.time()
        if ref_dtype == "float32" and full_bf16:
            model = cast_parameters(model, torch.float32)  # the same weights, upcast exactly
            m = model
        elif ref_dtype == "bfloat16" and not full_bf16:
            m = cast_parameters(copy.deepcopy(model), torch.bfloat16)
        else:
            m = model
        for dtype, variant, outs, _, _ in need:
            refs[(ref_dtype, dtype, variant)] = hf_reference(m, prompts, outs)
        if m is not model:
            del m
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        phases[f"transformers {ref_dtype}"] = round(time.time() - t0, 2)
    for dtype, variant, outs, stats, wall in runs:
        try:
            r = evaluate_run(dtype, prompts, outs, refs[("float32", dtype, variant)],
                             refs.get(("bfloat16", dtype, variant)), a)
        except Exception as e:
            r = {"dtype": dtype, "ok": False, "error": f"{type(e).__name__}: {e}"[:3000]}
        r.update(arch=arch, run=variant, kvattn_wall_s=round(wall, 2),
                 kvattn_tokens_per_s=float(stats.get("generated_tokens_per_s", 0.0)),
                 kvattn_stats=stats)
        rows.append(r)
        log.write(f"{arch} {dtype} {variant}: {json.dumps(r)}\n")
    return rows


def check_arch(arch, a, log):
    t_all = time.time()
    phases = {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"arch": arch, "transformers": transformers.__version__, "torch": torch.__version__,
           "kvattn_device": a.kvattn_device, "phases_s": phases}
    t0 = time.time()
    if arch == FULL_SIZE:
        if device != "cuda":
            raise RuntimeError("--full-size needs a CUDA GPU for transformers")
        tok_dir = os.path.join(a.tokenizers, tokenizer_for(arch), "models")
        model_dir = os.path.join(a.out, f"hf-{arch}")
        model, vocab = build_full_size_dir(tok_dir, model_dir, a.seed)
        n, max_len, steps, dtypes, variants = (a.full_num_prompts, a.full_max_prompt_len, a.full_steps, a.dtypes,
                                               ["default"])
    else:
        tok_dir = os.path.join(a.tokenizers, tokenizer_for(arch), "models")
        model_dir = os.path.join(a.out, f"hf-{arch}")
        model, vocab = build_model_dir(arch, tok_dir, model_dir, a.seed)
        model = model.to(device).eval()
        n, max_len, steps, dtypes, variants = (a.num_prompts, a.max_prompt_len, a.steps, a.dtypes,
                                               a.variants)
    phases["build model"] = round(time.time() - t0, 2)
    prompts = prompts_for(vocab, n, max_len, a.seed)
    res.update(vocab=vocab, prompts=len(prompts), prompt_lens=[len(p) for p in prompts], steps=steps)
    res["runs"] = check_model(arch, model, model_dir, prompts, steps, dtypes, variants, a, log, phases)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if arch != FULL_SIZE:
        t0 = time.time()
        res["tokenizer"] = tokenizer_check(a.kvattn, model_dir, log)
        phases["tokenizer"] = round(time.time() - t0, 2)
    elif not a.keep_models:
        shutil.rmtree(model_dir, ignore_errors=True)
    res["ok"] = bool(res["runs"]) and all(r["ok"] for r in res["runs"]) and res.get("tokenizer", {"ok": True})["ok"]
    phases["total"] = round(time.time() - t_all, 2)
    return res


# ----------------------------------------------------------------------------------------------
# Self-test on synthetic data

def self_test():
    """The rules on synthetic logits: a faithful run passes, a bug fails, a flip at a small margin
    is a tie, a flip at a large margin a divergence, the bf16 bound follows transformers' gap."""
    rng = np.random.default_rng(0)
    a = argparse.Namespace(tol=1e-3, tie_gap=1e-4, bf16_k=2.0, bf16_floor=1e-2)
    vocab, steps, topk = 50, 6, 3
    checks = 0

    def fake_run(logits_list, noise, rng):
        """kvattn's JSON output from logits + noise: greedy tokens and raw top-k logprobs."""
        outs = []
        for lg in logits_list:
            lk = lg + rng.normal(0, noise, lg.shape) if noise else lg.copy()
            lp = lk - (lk.max(1, keepdims=True) + np.log(np.exp(lk - lk.max(1, keepdims=True)).sum(1, keepdims=True)))
            toks = lk.argmax(1).tolist()
            lps = [[{"token_id": int(t), "logprob": float(row[t])} for t in np.argsort(-row)[:topk]] for row in lp]
            outs.append({"token_ids": toks, "logprobs": lps})
        return outs

    logits = [rng.normal(0, 2, (steps, vocab)) for _ in range(4)]
    for lg in logits:  # clear winners: top-2 margins of at least 1
        lg[np.arange(steps), lg.argmax(1)] += 1.0
    prompts = [[1] * L for L in (1, 5, 9, 13)]

    # float32: noise 1e-5 passes; a systematic error of 0.01 on one logit fails the tolerance
    outs = fake_run(logits, 1e-5, rng)
    ref = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(logits, outs)]
    r = evaluate_run("float32", prompts, outs, ref, None, a)
    assert r["ok"] and r["ties"] == 0 and r["greedy_equal"] == 4 * steps and r["steps_compared"] == 4 * steps, r
    assert 0 < r["max_abs_dlogprob"] < 1e-4, r
    checks += 1
    bad = copy.deepcopy(outs)
    bad[2]["logprobs"][3][1]["logprob"] += 0.01
    r = evaluate_run("float32", prompts, bad, ref, None, a)
    assert not r["ok"] and abs(r["max_abs_dlogprob"] - 0.01) < 1e-3 and r["num_diverged"] == 0, r
    checks += 1

    # greedy: a flip where the reference's margin is tiny is a tie, where it is large a divergence
    tie_logits = [lg.copy() for lg in logits]
    row = tie_logits[1][2]
    first, second = np.argsort(-row)[:2]
    row[second] = row[first] - 5e-5  # margin below --tie-gap
    outs = fake_run(tie_logits, 0, rng)
    outs[1]["token_ids"][2] = int(second)
    outs[1]["logprobs"][2] = [{"token_id": int(second), "logprob": 0.0}] + outs[1]["logprobs"][2]
    ref = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(tie_logits, outs)]
    outs[1]["logprobs"][2][0]["logprob"] = ref[1][2]["lp"][int(second)]
    r = evaluate_run("float32", prompts, outs, ref, None, a)
    assert r["ok"] and r["ties"] == 1 and r["greedy_equal"] == 4 * steps - 1, r
    checks += 1
    row[second] = row[first] - 0.5  # the same flip at margin 0.5 is a divergence
    ref = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(tie_logits, outs)]
    outs[1]["logprobs"][2][0]["logprob"] = ref[1][2]["lp"][int(second)]
    for e in outs[1]["logprobs"][2][1:]:
        e["logprob"] = ref[1][2]["lp"][e["token_id"]]
    r = evaluate_run("float32", prompts, outs, ref, None, a)
    assert not r["ok"] and r["num_diverged"] == 1 and r["diverged"][0]["step"] == 2, r
    assert r["diverged"][0]["prompt"] == 1 and r["diverged"][0]["prompt_len"] == 5, r
    checks += 1

    # a chosen token missing from kvattn's list is an error, not a silent pass
    outs = fake_run(logits, 0, rng)
    ref = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(logits, outs)]
    outs[0]["logprobs"][0] = outs[0]["logprobs"][0][1:]
    try:
        evaluate_run("float32", prompts, outs, ref, None, a)
        raise AssertionError("missing chosen token accepted")
    except ValueError:
        checks += 1

    # bfloat16: transformers' own gap g sets the bound max(2 g, 1e-2)
    g = 0.02
    hf_bf16_logits = [lg + rng.uniform(-g, g, lg.shape) for lg in logits]
    outs = fake_run(logits, 0.006, rng)  # kvattn's noise below 2 g
    ref32 = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(logits, outs)]
    ref16 = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(hf_bf16_logits, outs)]
    r = evaluate_run("bfloat16", prompts, outs, ref32, ref16, a)
    gap = r["hf_bf16_vs_f32_gap"]
    assert 0.5 * g < gap < 2.5 * g and r["bound"] == bf16_bound(gap, 2.0, 1e-2) == 2 * gap, r
    assert r["ok"] and r["max_abs_dlogprob"] < r["bound"] and r["tie_margin"] == 2 * r["bound"], r
    checks += 1
    outs = fake_run(logits, 0.1, rng)  # noise far above transformers' own: fails
    ref32 = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(logits, outs)]
    ref16 = [reference_from_logits(lg, wanted_ids(o)) for lg, o in zip(hf_bf16_logits, outs)]
    r = evaluate_run("bfloat16", prompts, outs, ref32, ref16, a)
    assert not r["ok"] and r["max_abs_dlogprob"] > r["bound"], r
    checks += 1
    assert bf16_bound(1e-4, 2.0, 1e-2) == 1e-2 and bf16_bound(0.03, 2.0, 1e-2) == 0.06
    checks += 1

    # the summary table: a header, a rule, one line per row, errors on one line
    rows = [dict(r, arch="llama", run="default", kvattn_wall_s=1.5, kvattn_tokens_per_s=123.4),
            {"arch": "gemma2", "dtype": "float32", "run": "chunked", "ok": False, "error": "RuntimeError: x\ny"}]
    table = summary_table(rows)
    lines = table.split("\n")
    assert len(lines) == 4 and "FAIL" in lines[2] and "ERROR" in lines[3] and "123.4" in lines[2], table
    assert all(len(line) <= 110 for line in lines), table
    checks += 1
    print(table)
    print(f"self-test: {checks} checks passed")
    return 0


def self_test_kvattn(kvattn):
    """The comparison path end to end on the CPU: kvattn generates (float32) on small generated
    models, the float64 NumPy reference forward (reference_forward.py) of each prompt + kvattn's
    continuation stands in for transformers' teacher-forced forward, and the run must pass."""
    import tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import reference_forward as rf
    a = argparse.Namespace(kvattn=kvattn, kvattn_device="cpu", topk=3, tol=1e-3, tie_gap=1e-4, bf16_k=2.0,
                           bf16_floor=1e-2, gpu_memory_utilization=0.0, kv_cache_memory="", full_kv_cache_memory="")
    steps = 6
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as log:
        for arch in ("llama", "gemma2"):
            d = os.path.join(tmp, arch)
            subprocess.run([sys.executable, os.path.join(here, "make_test_model.py"), "--arch", arch, "--out", d,
                            "--tokenizer", "generate", "--dtype", "float32", "--std", "0.15", "--seed", "3"],
                           check=True, capture_output=True)
            c = json.load(open(os.path.join(d, "config.json")))
            w = rf.load_weights(d)
            lm = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
            cap = c.get("final_logit_softcapping") if c["model_type"] == "gemma2" else None
            prompts = prompts_for(c["vocab_size"], 5, 40, 1)
            for p in prompts:  # prompts_for keeps ids >= 100: a small vocabulary needs them lower
                p[:] = [t % (c["vocab_size"] - 10) for t in p]
            outs, stats, _ = run_kvattn(a, d, prompts, steps, "float32", [], log)
            refs = []
            for p, o in zip(prompts, outs):
                seq = list(p) + [int(t) for t in o["token_ids"][:-1]]
                x = rf.forward(c, w, np.asarray(seq, dtype=np.int64))[len(p) - 1:]
                logits = x @ lm.T
                if cap:
                    logits = cap * np.tanh(logits / cap)
                refs.append(reference_from_logits(logits, wanted_ids(o)))
            r = evaluate_run("float32", prompts, outs, refs, None, a)
            assert r["ok"] and r["steps_compared"] == 5 * steps, r
            assert r["greedy_equal"] + r["ties"] == 5 * steps and r["max_abs_dlogprob"] < 1e-4, r
            assert stats["generated_tokens"] == 5 * steps, stats
            print(f"self-test: kvattn {arch} float32 on the CPU against the float64 reference: max |d| "
                  f"{r['max_abs_dlogprob']:.2e} over {r['steps_compared']} steps, {r['ties']} ties")
    return 0


# ----------------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="check the comparison rules on synthetic data and exit")
    ap.add_argument("--kvattn", help="the kvattn executable")
    ap.add_argument("--tokenizers", help="folder holding tokenizer-*/models/tokenizer.json")
    ap.add_argument("--out", help="folder for the models, hf_check.json and hf_check.log")
    ap.add_argument("--arch", default="llama,mistral,qwen2,qwen3,gemma2")
    ap.add_argument("--kvattn-device", default=None,
                    help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu)")
    ap.add_argument("--dtypes", default=None,
                    help="kvattn compute dtypes, comma-separated: float32, bfloat16 (default: both on CUDA, "
                         "float32 on the CPU)")
    ap.add_argument("--variants", default="default,chunked",
                    help="kvattn runs per dtype: default, chunked (--max-num-batched-tokens 256)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-prompt-len", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--topk", type=int, default=5, help="--logprobs of kvattn: top-k entries compared per step")
    ap.add_argument("--tol", type=float, default=1e-3, help="float32: max |delta logprob|")
    ap.add_argument("--tie-gap", type=float, default=1e-4,
                    help="float32: a greedy flip is a tie below max(this, 2 x max |delta|) top-2 logit margin")
    ap.add_argument("--bf16-k", type=float, default=2.0, help="bfloat16: the bound is max(k x transformers' gap, floor)")
    ap.add_argument("--bf16-floor", type=float, default=1e-2)
    ap.add_argument("--full-size", action="store_true",
                    help="also check a Llama-3-8B-shaped model (random bf16 weights, 16 GB) in each of --dtypes")
    ap.add_argument("--full-num-prompts", type=int, default=8)
    ap.add_argument("--full-max-prompt-len", type=int, default=2000)
    ap.add_argument("--full-steps", type=int, default=16)
    ap.add_argument("--keep-models", action="store_true", help="keep the full-size model folder")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.0,
                    help="kvattn's --gpu-memory-utilization (default: what transformers leaves free, at most 0.5)")
    ap.add_argument("--kv-cache-memory", default="4GiB",
                    help="kvattn's --kv-cache-memory on CUDA for the small models ('': from the utilization)")
    ap.add_argument("--full-kv-cache-memory", default="16GiB", help="the same for the full-size model")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not a.self_test:
        missing = [o for o in ("kvattn", "tokenizers", "out") if getattr(a, o) is None]
        if missing:
            ap.error("the check needs " + ", ".join("--" + m for m in missing) + " (or --self-test)")
    return a


def main():
    global torch, transformers
    a = parse_args()
    if a.self_test:
        return self_test() or (self_test_kvattn(a.kvattn) if a.kvattn else 0)
    import torch as _torch
    import transformers as _transformers
    torch, transformers = _torch, _transformers
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference is float32
    torch.backends.cudnn.allow_tf32 = False
    if a.kvattn_device is None:
        a.kvattn_device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = a.kvattn_device.startswith("cuda")
    a.dtypes = (a.dtypes or ("float32,bfloat16" if on_cuda else "float32")).split(",")
    a.variants = a.variants.split(",")
    for d in a.dtypes:
        if d not in ("float32", "bfloat16"):
            sys.exit(f"--dtypes: '{d}' is not checked; valid: float32, bfloat16")
    for v in a.variants:
        if v not in ("default", "chunked"):
            sys.exit(f"--variants: '{v}' is unknown; valid: default, chunked")
    archs = [x for x in a.arch.split(",") if x] + ([FULL_SIZE] if a.full_size else [])
    os.makedirs(a.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, GPU "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; kvattn on "
          f"{a.kvattn_device}, dtypes {','.join(a.dtypes)}", flush=True)
    t_start = time.time()
    results = []
    with open(os.path.join(a.out, "hf_check.log"), "w") as log:
        for arch in archs:
            try:
                r = check_arch(arch, a, log)
            except Exception as e:  # report and go on with the next architecture
                r = {"arch": arch, "ok": False, "runs": [], "error": f"{type(e).__name__}: {e}"[:3000]}
            results.append(r)
            log.flush()
            tok = r.get("tokenizer")
            print(f"{arch}: {'pass' if r['ok'] else 'FAIL'}; phases (s): "
                  + ", ".join(f"{k} {v}" for k, v in r.get("phases_s", {}).items())
                  + (f"; tokenizer {tok['equal']}/{tok['total']}" if tok and "equal" in tok else "")
                  + (f"; error: {r['error'][:200]}" if "error" in r else ""), flush=True)
    rows = [row for r in results for row in r.get("runs", [])]
    rows += [{"arch": r["arch"], "ok": False, "error": r["error"]} for r in results if "error" in r]
    total = time.time() - t_start
    json.dump({"ok": all(r["ok"] for r in results), "total_s": total, "args": vars(a), "results": results},
              open(os.path.join(a.out, "hf_check.json"), "w"), indent=1)
    print()
    print(summary_table(rows))
    ok = all(r["ok"] for r in results)
    print(f"\n{sum(r['ok'] for r in results)} of {len(results)} models passed in {total:.0f} s; "
          f"details: {os.path.join(a.out, 'hf_check.json')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
