// src/ops/cuda/small_decode.h — the cluster small-call decode kernel (small_decode.cu), internal
// to src/ops/cuda/: paged_attention.cu asks it whether it takes a call and launches it.
#pragma once

#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl::k {

// Pieces per (request, KV head) unit the cluster kernel would use for this call on the current
// device — the thread-block cluster size, 1..16 — or 0 when it does not take the call (device
// before sm_90, head dim other than 64/128, fp8 or float32 caches, a query whose type is not the
// cache's or whose rows are not 16-byte vectors, PrefixLM / XQA masks, KernelRouting::small_cluster off).  `num_sms` is
// the device's multiprocessor count.  Automatic routing (`force` false) takes a call when the
// 4-warp kernel fits at least kClusterMinAutoPieces pieces per unit (16 x 4096 at 2 pieces on 4
// warps ran 2.5 % slower than attn_kernel<..., SMALL>), or when the 8-warp kernel's clusters fill
// at least 3/4 of the SMs (8 x 1024 17.4 vs 23.7 us, 16 x 4096 73.0-73.3 vs 76.8-76.9); the rest
// stays on attn_kernel<..., SMALL>.  `force` (KVATTN_SMALL_DECODE=force) takes every call
// it covers.  Of the pieces that fit, a kv_indptr-form call uses about one per 256 keys of its
// average request length, at least 8; 8-warp CTAs use at most 8 pieces (pieces_and_warps).
constexpr int kClusterMinAutoPieces = 4;
int cluster_decode_pieces(const AttnParams& p, int num_sms, bool force);
// One launch: grid (pieces, batch * hkv) in clusters of `pieces` CTAs; no workspace.
int launch_cluster_decode(const AttnParams& p, int pieces);
// Compute capability major of the current device, cached per device (0 when it cannot be read).
// The sm_90-only kernels (this one, the fp8 fast decode variant) are chosen on the host by it.
int device_cc_major();

// Variants (KernelRouting, routing.h; tests and benchmarks): small_page_window (default on): each
// CTA copies the first entries of the page index (up to 2 KB) into shared memory alongside the
// index words, so its page ids cost no second dependent global round trip; small_warps4: 4 warps
// per CTA always (default: 8, with at most 8 pieces per unit, wherever one 8-warp CTA per SM holds
// every unit's cluster at once; else 4); small_route8 (default on): automatic routing also takes
// calls whose 8-warp clusters fill >= 3/4 of the SMs, even below kClusterMinAutoPieces pieces on 4
// warps; small_cluster_max: the most pieces per unit.

}  // namespace kvattn::ops::cuda_impl::k
