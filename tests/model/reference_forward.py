#!/usr/bin/env python3
"""An independent reference forward pass of a Hugging Face model directory, in float64 NumPy.

    reference_forward.py MODEL_DIR PROMPTS_JSON OUT_BIN [--kv-fp8] [--round bf16|f16]
    reference_forward.py MODEL_DIR PROMPTS_JSON OUT_JSON --greedy N [--kv-fp8] [--round bf16|f16]

PROMPTS_JSON: {"prompts": [[token ids], ...], "positions": [[positions to emit], ...]}.
OUT_BIN: the logits of every requested position, prompt after prompt, as little-endian f64
rows of vocab_size values.  --kv-fp8: keys and values are rounded to fp8 e4m3 (scale 1,
round to nearest even, saturating at 448) before attention, as an fp8 KV cache stores them.
--round bf16|f16: every activation a 16-bit forward stores (embeddings, norm outputs,
projections, q/k after norm and rotary, attention probabilities and output, the residual
stream after each add, the MLP's activation) is rounded to that dtype (round to nearest even);
logits stay unrounded.  Not an oracle: it measures how far 16-bit rounding alone moves the
logits, from which the CUDA tests' bf16 / f16 bounds are derived.
--greedy N: for every prompt, the N tokens greedy decoding produces (argmax, lowest id on a
tie), written as JSON {"tokens": [[ids]...], "margins": [[top1 - top2 logit per step]...]}:
the oracle for token-for-token generation checks (a step whose margin is below the compared
implementation's error may legitimately differ).  "positions" is not needed in this mode.

Written from the architectures' definitions (transformers' modeling_llama / mistral / qwen2 /
qwen3 / gemma2), not from kvattn: its own safetensors reader, plain causal attention over the
whole prompt with an explicit mask (sliding window: a query at i sees keys j with i - j <
window), per-head soft cap, grouped-query heads, neox rotary embedding (Llama 3 frequency
rewrite), RMSNorm, gated MLP, Gemma 2's norms, scalings and caps.
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, t = e["data_offsets"]
        raw = data[b:t]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype=np.float16)
        elif e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype=np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {e['dtype']}")
        out[name] = a.astype(np.float64).reshape(e["shape"])
    return out


def load_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(d, fn)))
    return w


def rms_norm(x, w, eps, plus_one):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (1.0 + w) if plus_one else y * w


def inv_freq(c, head_dim):
    f = 1.0 / (c.get("rope_theta", 10000.0) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rs = c.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type")) == "linear":
        f = f / rs["factor"]
    if rs and (rs.get("rope_type") or rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        scaled = np.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        f = np.where(medium, smoothed, scaled)
    return f


def rope(x, pos, freqs):
    # x [n, heads, D]; rotate_half on halves (neox style)
    ang = np.outer(pos, freqs)                          # [n, D/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def round_e4m3(x):
    """Rounds to the nearest fp8 e4m3 value (3 mantissa bits, exponent bias 7, subnormals
    below 2^-6, finite max 448), ties to even, saturating."""
    a = np.abs(x)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -6)))
    step = 2.0 ** (e - 3)
    q = np.round(a / step) * step
    return np.sign(x) * np.minimum(q, 448.0)


def round_bf16(x):
    a = np.asarray(x, dtype=np.float32)
    b = a.reshape(-1).view(np.uint32).astype(np.uint64)
    sh = np.uint64(16)
    b = ((b + np.uint64(0x7FFF) + ((b >> sh) & np.uint64(1))) >> sh) << sh
    return b.astype(np.uint32).view(np.float32).astype(np.float64).reshape(a.shape)


def round_f16(x):
    return np.asarray(x, dtype=np.float16).astype(np.float64)


def no_round(x):
    return x


def sliding_layers(c):
    L = c["num_hidden_layers"]
    mt = c["model_type"]
    if "layer_types" in c:
        return [t == "sliding_attention" for t in c["layer_types"]]
    if mt == "mistral":
        return [c.get("sliding_window") is not None] * L
    if mt == "gemma2":
        return [i % 2 == 0 for i in range(L)]
    if mt in ("qwen2", "qwen3") and c.get("use_sliding_window"):
        return [i >= c.get("max_window_layers", L) for i in range(L)]
    return [False] * L


def forward(c, w, ids, kv_fp8=False, r=no_round):
    mt = c["model_type"]
    gemma = mt == "gemma2"
    H, L = c["hidden_size"], c["num_hidden_layers"]
    Hq, Hk = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    D = c.get("head_dim") or H // Hq
    eps = c["rms_norm_eps"]
    act = c.get("hidden_activation") or c.get("hidden_act", "silu")
    scale = c["query_pre_attn_scalar"] ** -0.5 if gemma else D ** -0.5
    attn_cap = c.get("attn_logit_softcapping") if gemma else None
    final_cap = c.get("final_logit_softcapping") if gemma else None
    sliding = sliding_layers(c)
    window = c.get("sliding_window")
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    freqs = inv_freq(c, D)

    x = r(w["model.embed_tokens.weight"][ids])
    if gemma:
        x = r(x * r(math.sqrt(H)))
    qi = np.arange(n)[:, None]
    kj = np.arange(n)[None, :]
    for i in range(L):
        p = f"model.layers.{i}."
        h = r(rms_norm(x, w[p + "input_layernorm.weight"], eps, gemma))
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q, k, v = r(q), r(k), r(v)
        q, k, v = q.reshape(n, Hq, D), k.reshape(n, Hk, D), v.reshape(n, Hk, D)
        if mt == "qwen3":
            q = r(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps, False))
            k = r(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps, False))
        q, k = r(rope(q, pos, freqs)), r(rope(k, pos, freqs))
        if kv_fp8:
            k, v = round_e4m3(k), round_e4m3(v)
        mask = kj <= qi
        if sliding[i]:
            mask = mask & (qi - kj < window)
        o = np.empty((n, Hq, D))
        for hh in range(Hq):
            kv = hh // (Hq // Hk)
            s = (q[:, hh, :] @ k[:, kv, :].T) * scale
            if attn_cap:
                s = attn_cap * np.tanh(s / attn_cap)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, hh, :] = r(s) @ v[:, kv, :]
        a = r(r(o).reshape(n, Hq * D) @ w[p + "self_attn.o_proj.weight"].T)
        if gemma:
            a = r(rms_norm(a, w[p + "post_attention_layernorm.weight"], eps, True))
        x = r(x + a)
        h = r(rms_norm(x, w[p + ("pre_feedforward_layernorm.weight" if gemma else "post_attention_layernorm.weight")],
                       eps, gemma))
        g = r(h @ w[p + "mlp.gate_proj.weight"].T)
        u = r(h @ w[p + "mlp.up_proj.weight"].T)
        if act in ("gelu_pytorch_tanh", "gelu_tanh"):
            g = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            g = g / (1 + np.exp(-g))
        m = r(r(g * u) @ w[p + "mlp.down_proj.weight"].T)
        if gemma:
            m = r(rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps, True))
        x = r(x + m)
    x = r(rms_norm(x, w["model.norm.weight"], eps, gemma))
    return x


def main():
    argv = sys.argv[1:]
    greedy = None
    if "--greedy" in argv:
        k = argv.index("--greedy")
        greedy = int(argv[k + 1])
        del argv[k:k + 2]
    rnd = no_round
    if "--round" in argv:
        k = argv.index("--round")
        rnd = {"bf16": round_bf16, "f16": round_f16}[argv[k + 1]]
        del argv[k:k + 2]
    args = [a for a in argv if a != "--kv-fp8"]
    if len(args) != 3:
        raise SystemExit(__doc__)
    kv_fp8 = "--kv-fp8" in argv
    d, prompts_json, out = args
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    w = load_weights(d)
    lm = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    gemma = c["model_type"] == "gemma2"
    final_cap = c.get("final_logit_softcapping") if gemma else None
    with open(prompts_json) as f:
        spec = json.load(f)
    if greedy is not None:
        result = {"tokens": [], "margins": []}
        for ids in spec["prompts"]:
            seq, toks, margins = list(ids), [], []
            for _ in range(greedy):
                x = forward(c, w, np.asarray(seq, dtype=np.int64), kv_fp8, rnd)
                logits = x[-1] @ lm.T
                if final_cap:
                    logits = final_cap * np.tanh(logits / final_cap)
                order = np.argsort(-logits, kind="stable")
                toks.append(int(order[0]))
                margins.append(float(logits[order[0]] - logits[order[1]]))
                seq.append(int(order[0]))
            result["tokens"].append(toks)
            result["margins"].append(margins)
        with open(out, "w") as f:
            json.dump(result, f)
        return
    rows = []
    for ids, positions in zip(spec["prompts"], spec["positions"]):
        x = forward(c, w, np.asarray(ids, dtype=np.int64), kv_fp8, rnd)
        logits = x[np.asarray(positions, dtype=np.int64)] @ lm.T
        if final_cap:
            logits = final_cap * np.tanh(logits / final_cap)
        rows.append(logits)
    np.concatenate(rows).astype("<f8").tofile(out)


if __name__ == "__main__":
    main()
