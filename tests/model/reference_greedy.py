#!/usr/bin/env python3
"""Greedy continuations of prompts by the independent NumPy reference forward (float64).

    reference_greedy.py MODEL_DIR PROMPTS_JSON NUM_TOKENS OUT_JSON [--kv-fp8]

PROMPTS_JSON: {"prompts": [[token ids], ...]}.  OUT_JSON: {"tokens": [[...], ...],
"margins": [[...], ...]}: per prompt, the NUM_TOKENS greedy tokens (argmax, first index on
ties) and at each step the gap between the two largest logits (how close the choice was).
--kv-fp8: keys and values rounded to fp8 e4m3 before attention, as reference_forward.py does.
Each step recomputes the whole sequence with reference_forward.forward (no cache).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as ref  # noqa: E402


def main():
    args = [a for a in sys.argv[1:] if a != "--kv-fp8"]
    if len(args) != 4:
        raise SystemExit(__doc__)
    kv_fp8 = "--kv-fp8" in sys.argv
    d, prompts_json, num_tokens, out = args[0], args[1], int(args[2]), args[3]
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    w = ref.load_weights(d)
    lm = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    final_cap = c.get("final_logit_softcapping") if c["model_type"] == "gemma2" else None
    with open(prompts_json) as f:
        prompts = json.load(f)["prompts"]
    tokens, margins = [], []
    for ids in prompts:
        seq = list(ids)
        gen, gaps = [], []
        for _ in range(num_tokens):
            x = ref.forward(c, w, np.asarray(seq, dtype=np.int64), kv_fp8)
            logits = x[-1] @ lm.T
            if final_cap:
                logits = final_cap * np.tanh(logits / final_cap)
            t = int(np.argmax(logits))
            top2 = np.partition(logits, -2)[-2:]
            gen.append(t)
            gaps.append(float(abs(top2[1] - top2[0])))
            seq.append(t)
        tokens.append(gen)
        margins.append(gaps)
    with open(out, "w") as f:
        json.dump({"tokens": tokens, "margins": margins}, f)


if __name__ == "__main__":
    main()
