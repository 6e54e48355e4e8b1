#!/usr/bin/env python3
"""Dense PyTorch attention on the prefill shapes of `kvattn bench-cuda --only prefill`: a peer
measured on the same GPU in the same call as kvattn's paged kernels.

    python3 bench/sdpa_peer.py [--json OUT.json] [--calls N]

For each shape and each of PyTorch's fused SDPA backends (cuDNN, flash, memory-efficient) it
prints the median TFLOP/s of N timed calls (after 10 warm-ups), counted as kvattn counts them:
4 x head_dim x query heads x visible (query, key) pairs, causal pairs bottom-right aligned (a
query of length L over a KV length K sees L(K - L) + L(L + 1) / 2 pairs).  Setup as kvattn's bench:
bf16, 32 query heads over 8 KV heads (K and V repeated to 32 heads before timing: the same
FLOPs), head dim 128, inputs uniform in (-1, 1).  K and V are contiguous (dense): no page gather,
so this is the ceiling a paged kernel is measured against, not an equal.  A backend that does not
take a shape says so in its row instead of a figure.  Needs PyTorch with CUDA.
"""
import argparse
import json
import statistics
import sys

H_Q, H_KV, HEAD_DIM = 32, 8, 128

# (name as kvattn's bench prints it, requests, query length, KV length, causal)
SHAPES = [
    ("causal bf16 8x2048", 8, 2048, 2048, True),
    ("causal bf16 1x8192", 1, 8192, 8192, True),
    ("causal bf16 4x4096", 4, 4096, 4096, True),
    ("causal bf16 16x1024", 16, 1024, 1024, True),
    ("causal bf16 32x512", 32, 512, 512, True),
    ("causal bf16 8x(q 512, kv 4096)", 8, 512, 4096, True),
    ("non-causal bf16 8x2048", 8, 2048, 2048, False),
    ("causal bf16 1x(q 2048, kv 32768)", 1, 2048, 32768, True),
]
BACKENDS = ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"]


def visible_pairs(q_len, kv_len, causal):
    """(query, key) pairs one request's attention computes; causal: query i (0-based, its
    position kv_len - q_len + i) sees keys 0 .. kv_len - q_len + i."""
    if not causal:
        return q_len * kv_len
    return q_len * (kv_len - q_len) + q_len * (q_len + 1) // 2


def flops(requests, q_len, kv_len, causal):
    return 4 * HEAD_DIM * H_Q * requests * visible_pairs(q_len, kv_len, causal)


def measure(torch, backend, requests, q_len, kv_len, causal, calls):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)

    def uniform(*shape):
        return torch.rand(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1

    q = uniform(requests, H_Q, q_len, HEAD_DIM)
    k = uniform(requests, H_KV, kv_len, HEAD_DIM).repeat_interleave(H_Q // H_KV, dim=1)
    v = uniform(requests, H_KV, kv_len, HEAD_DIM).repeat_interleave(H_Q // H_KV, dim=1)
    kwargs = {}
    if causal and q_len == kv_len:
        kwargs["is_causal"] = True
    elif causal:
        kwargs["attn_mask"] = causal_lower_right(q_len, kv_len)
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        for _ in range(10):
            F.scaled_dot_product_attention(q, k, v, **kwargs)
        times = []
        for _ in range(calls):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            F.scaled_dot_product_attention(q, k, v, **kwargs)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--calls", type=int, default=30, help="timed calls per shape (median)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("sdpa_peer: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    print(f"# dense SDPA on {device}, PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    rows = []
    for name, n, lq, lk, causal in SHAPES:
        for backend in BACKENDS:
            row = {"name": f"prefill {name} [dense sdpa {backend.lower()}]", "backend": backend, "device": device}
            try:
                t = measure(torch, backend, n, lq, lk, causal, args.calls)
                row.update(us=t * 1e6, value=flops(n, lq, lk, causal) / t * 1e-12, unit="TFLOP/s")
                print(f"{row['name']:<72} {row['us']:10.1f} us {row['value']:9.1f} TFLOP/s")
            except RuntimeError as e:  # the backend does not take this shape (or mask)
                row["unsupported"] = str(e).splitlines()[0][:200]
                print(f"{row['name']:<72} unsupported: {row['unsupported']}")
            finally:
                torch.cuda.empty_cache()
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
