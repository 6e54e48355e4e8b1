#!/usr/bin/env python3
"""kvattn against Hugging Face transformers on real architectures (run where torch and
transformers are installed, e.g. a machine with an NVIDIA GPU).

For each architecture (Llama 3 with llama3 rope scaling, Mistral with a sliding window, Qwen2 with
q/k/v bias, Qwen3 with q/k norms, Gemma 2 with soft caps and alternating sliding layers) it builds
a model with transformers from a config (random weights from a seed, norm weights perturbed so they
matter), saves it with save_pretrained, adds a real tokenizer, and compares:

* greedy continuations of a batch of prompts (lengths 1 .. --max-prompt-len, as token ids) from
  `kvattn generate --json` with those of transformers' forward in float32;
* the raw log-probabilities (log-softmax of the logits) of every generated token and of the top-k
  alternatives: max |delta| against transformers;
* tokenization: kvattn's prompt_token_ids of a text corpus against the `tokenizers` library's
  encoding of the same tokenizer.json.

kvattn runs the model on the CPU in float32 (`--device cpu --dtype float32`); transformers runs
on the GPU when there is one.

Greedy continuations may part where transformers' own top-2 logit gap is below the float32 noise
(`--tie-gap`); such a divergence is reported as a tie, and the comparison stops there for that
prompt.  Exit status 0 when every architecture passes.

  tests/model/hf_transformers_check.py --kvattn build/cuda-release/tools/kvattn \
      --tokenizers tests/model/oracle/node_modules/@lenml --out DIR [--arch llama,...]
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import transformers

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "你好，世界。日本語のテキストも。",
    "emoji: 😀🎉👍🏽 and a flag 🇫🇷",
    "def f(x):\n    return x ** 2  # code\n\n\tindented",
    "   leading and    internal   whitespace runs   ",
    "numbers 3.14159 2,718 1e-10 -42",
]


def tokenizer_for(arch):
    return {"llama": "tokenizer-llama3_1", "mistral": "tokenizer-llama2", "qwen2": "tokenizer-qwen3",
            "qwen3": "tokenizer-qwen3", "gemma2": "tokenizer-gemma3"}[arch]


def make_config(arch, vocab, bos, eos):
    common = dict(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=32,
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
                                         query_pre_attn_scalar=32, hidden_activation="gelu_pytorch_tanh")
    raise ValueError(arch)


def build_model_dir(arch, tok_dir, out_dir, seed):
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

    bos, eos = tok_id("bos_token"), tok_id("eos_token")
    cfg = make_config(arch, vocab, bos, eos)
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": "eager"}
    model = transformers.AutoModelForCausalLM.from_config(cfg, **kwargs).to(torch.float32)
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
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), out_dir)
    return model, vocab


def prompts_for(vocab, n, max_len, seed):
    rng = np.random.default_rng(seed)
    lens = sorted({1, 2, 3, max_len} | set(int(x) for x in np.geomspace(4, max_len, n - 4)))
    while len(lens) < n:
        lens.append(int(rng.integers(1, max_len + 1)))
    hi = min(vocab, 120000)  # ordinary tokens (special tokens sit at the top of these vocabularies)
    return [rng.integers(100, hi, size=L).tolist() for L in lens[:n]]


@torch.no_grad()
def hf_greedy(model, ids, steps, topk, device):
    """Greedy continuation with transformers in float32: tokens, the chosen token's log-prob,
    the top-k log-probs and the top-2 logit gap at every step."""
    out_tokens, chosen_lp, top, gaps = [], [], [], []
    x = torch.tensor([ids], device=device)
    res = model(input_ids=x, use_cache=True)
    past = res.past_key_values
    logits = res.logits[0, -1].float()
    for _ in range(steps):
        lp = torch.log_softmax(logits, dim=-1)
        v, i = torch.topk(logits, 2)
        gaps.append(float(v[0] - v[1]))
        t = int(i[0])
        tv, ti = torch.topk(lp, topk)
        top.append(dict(zip(ti.tolist(), tv.tolist())))
        out_tokens.append(t)
        chosen_lp.append(float(lp[t]))
        res = model(input_ids=torch.tensor([[t]], device=device), past_key_values=past, use_cache=True)
        past = res.past_key_values
        logits = res.logits[0, -1].float()
    return out_tokens, chosen_lp, top, gaps


def run_kvattn(kvattn, model_dir, prompts, steps, topk, extra, log):
    pf = os.path.join(model_dir, "prompts.jsonl")
    with open(pf, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_token_ids": p}) + "\n")
    cmd = [kvattn, "generate", model_dir, "--prompts", pf, "--device", "cpu", "--dtype", "float32",
           "--temperature", "0", "--max-tokens", str(steps), "--ignore-eos", "--logprobs", str(topk),
           "--logprobs-mode", "raw_logprobs", "--json"] + extra
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    log.write(" ".join(cmd) + f"\n  rc {r.returncode} in {time.time() - t0:.1f} s\n{r.stderr[-4000:]}\n")
    if r.returncode != 0:
        raise RuntimeError(f"kvattn generate failed (rc {r.returncode}): {r.stderr[-2000:]}")
    doc = json.loads(r.stdout)
    outs = doc["outputs"] if isinstance(doc, dict) else doc
    return outs


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


def check_arch(arch, a, log):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok_dir = os.path.join(a.tokenizers, tokenizer_for(arch), "models")
    model_dir = os.path.join(a.out, f"hf-{arch}")
    model, vocab = build_model_dir(arch, tok_dir, model_dir, a.seed)
    model = model.to(device).eval()
    prompts = prompts_for(vocab, a.num_prompts, a.max_prompt_len, a.seed)
    res = {"arch": arch, "vocab": vocab, "prompts": len(prompts),
           "prompt_lens": [len(p) for p in prompts], "transformers": transformers.__version__}
    t0 = time.time()
    hf = [hf_greedy(model, p, a.steps, a.topk, device) for p in prompts]
    log.write(f"{arch}: transformers greedy of {len(prompts)} prompts in {time.time() - t0:.1f} s\n")
    for variant, extra in (("default", []), ("chunked", ["--max-num-batched-tokens", "256"])):
        outs = run_kvattn(a.kvattn, model_dir, prompts, a.steps, a.topk, extra, log)
        max_d, max_top_d, equal, ties, diverged = 0.0, 0.0, 0, 0, []
        for p, o, ref in zip(prompts, outs, hf):
            toks, lps, tops, gaps = ref
            kt = o["token_ids"]
            klp = o["logprobs"]
            n_ok = 0
            for s in range(a.steps):
                kv_top = {e["token_id"]: e["logprob"] for e in klp[s]}
                if kt[s] != toks[s]:
                    if gaps[s] < a.tie_gap:
                        ties += 1
                    else:
                        diverged.append({"prompt_len": len(p), "step": s, "kvattn": kt[s], "hf": toks[s],
                                         "hf_gap": gaps[s]})
                    break
                max_d = max(max_d, abs(kv_top.get(toks[s], math.inf) - lps[s]))
                for t, v in tops[s].items():
                    if t in kv_top:
                        max_top_d = max(max_top_d, abs(kv_top[t] - v))
                n_ok += 1
            equal += n_ok == a.steps
        res[variant] = {"greedy_equal_prompts": equal, "ties": ties, "diverged": diverged,
                        "max_abs_dlogprob_chosen": max_d, "max_abs_dlogprob_topk": max_top_d,
                        "ok": not diverged and max(max_d, max_top_d) <= a.tol}
        log.write(f"{arch} {variant}: {json.dumps(res[variant])}\n")
    res["tokenizer"] = tokenizer_check(a.kvattn, model_dir, log)
    res["ok"] = res["default"]["ok"] and res["chunked"]["ok"] and res["tokenizer"]["ok"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvattn", required=True)
    ap.add_argument("--tokenizers", required=True, help="folder holding tokenizer-*/models/tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="llama,mistral,qwen2,qwen3,gemma2")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-prompt-len", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--tie-gap", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = []
    with open(os.path.join(a.out, "hf_check.log"), "w") as log:
        for arch in a.arch.split(","):
            try:
                r = check_arch(arch, a, log)
            except Exception as e:  # report and go on with the next architecture
                r = {"arch": arch, "ok": False, "error": f"{type(e).__name__}: {e}"[:3000]}
            results.append(r)
            log.flush()
            print(json.dumps({k: v for k, v in r.items() if k != "prompt_lens"}), flush=True)
    json.dump(results, open(os.path.join(a.out, "hf_check.json"), "w"), indent=1)
    ok = all(r["ok"] for r in results)
    print(f"{sum(r['ok'] for r in results)} passed, {sum(not r['ok'] for r in results)} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
