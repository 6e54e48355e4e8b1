// Helpers shared by the ops tests: random tensors, KV caches in every layout, random batches,
// and tolerant comparisons that never let NaN pass.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvattn/core/tensor.h"
#include "kvattn/ops/ops.h"
#include "kvattn/ops/reference.h"

namespace kvattn::ops::testing {

inline double kNaN = std::numeric_limits<double>::quiet_NaN();

// Fill every element of a (possibly strided) CPU float tensor with U(lo, hi).
// Contiguous tensors (whole KV caches of hundreds of millions of elements) take a counter-based
// generator seeded once from `rng`: element k's value depends only on the seed and k, so the
// tensor is filled by several threads with the same result as by one.
inline void fill_uniform(const Tensor& t, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  if (t.is_contiguous()) {
    const uint64_t seed = (static_cast<uint64_t>(rng()) << 32) | rng();
    char* base = static_cast<char*>(t.data());
    const int64_t es = t.element_size(), total = t.numel();
    const DType dt = t.dtype();
    const auto fill_range = [=](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        uint64_t z = seed + static_cast<uint64_t>(k) * 0x9e3779b97f4a7c15ull;  // splitmix64
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const double u = static_cast<double>(z >> 11) * 0x1p-53;  // [0, 1)
        store_from_double(base + k * es, dt, lo + (hi - lo) * u);
      }
    };
    const int64_t kPerThread = int64_t{1} << 22;
    const int64_t threads = std::clamp<int64_t>(total / kPerThread, 1, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> helpers;
    const int64_t chunk = (total + threads - 1) / threads;
    for (int64_t i = 1; i < threads; ++i)
      helpers.emplace_back(fill_range, std::min(total, i * chunk), std::min(total, (i + 1) * chunk));
    fill_range(0, std::min(total, chunk));
    for (std::thread& th : helpers) th.join();
    return;
  }
  std::uniform_real_distribution<double> u(lo, hi);
  const int n = t.dim();
  std::vector<int64_t> idx(static_cast<size_t>(n), 0);
  const int64_t total = t.numel();
  const int64_t es = t.element_size();
  for (int64_t k = 0; k < total; ++k) {
    int64_t off = 0;
    for (int d = 0; d < n; ++d) off += idx[d] * t.stride(d);
    store_from_double(static_cast<char*>(t.data()) + off * es, t.dtype(), u(rng));
    for (int d = n - 1; d >= 0; --d) {
      if (++idx[d] < t.size(d)) break;
      idx[d] = 0;
    }
  }
}

// Fill with NaN (fp8 e4m3 has a NaN code; every float dtype here does).
inline void fill_nan(const Tensor& t) {
  const int n = t.dim();
  std::vector<int64_t> idx(static_cast<size_t>(n), 0);
  const int64_t total = t.numel();
  for (int64_t k = 0; k < total; ++k) {
    int64_t off = 0;
    for (int d = 0; d < n; ++d) off += idx[d] * t.stride(d);
    store_from_double(static_cast<char*>(t.data()) + off * t.element_size(), t.dtype(), kNaN);
    for (int d = n - 1; d >= 0; --d) {
      if (++idx[d] < t.size(d)) break;
      idx[d] = 0;
    }
  }
}

// Max error of `got` against `want` relative to max(|want|, rms(want)); infinity when any
// compared element is NaN in either (so NaN never passes), or when finiteness differs.
inline double rel_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  EXPECT_EQ(g.size(), w.size());
  double ss = 0;
  for (double x : w) ss += std::isfinite(x) ? x * x : 0;
  const double rms = w.empty() ? 0 : std::sqrt(ss / static_cast<double>(w.size()));
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) || std::isnan(w[i])) return INFINITY;
    if (std::isinf(g[i]) || std::isinf(w[i])) {
      if (g[i] != w[i]) return INFINITY;
      continue;
    }
    const double denom = std::max({std::abs(w[i]), rms, 1e-30});
    worst = std::max(worst, std::abs(g[i] - w[i]) / denom);
  }
  return worst;
}

// ---- KV caches in every layout -------------------------------------------------------------
// 0..5: vLLM's six KVCacheLayouts (LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC) of a 2-layer
// backing tensor [L, B, H, N, C] with C = 2 * D (K and V concatenated), layer 1 viewed and
// split by split_kv_cache_layer_view.  6: separate contiguous NHD K and V tensors.
// 7: separate HND K and V tensors (viewed as NHD by a transpose).
inline constexpr int kNumLayouts = 8;
inline const char* layout_name(int i) {
  static const char* names[] = {"LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND"};
  return names[i];
}

struct KVCache {
  Tensor backing;        // owns the memory
  Tensor k, v;           // [num_pages, page_size, H, D] views
};

inline KVCache make_kv_cache(int layout, int64_t num_pages, int64_t page_size, int64_t H, int64_t D, DType dt) {
  static const int orders[6][5] = {{0, 1, 2, 3, 4}, {0, 1, 3, 2, 4}, {0, 2, 1, 3, 4},
                                   {1, 0, 2, 3, 4}, {1, 0, 3, 2, 4}, {1, 2, 0, 3, 4}};
  KVCache c;
  if (layout < 6) {
    const int64_t L = 2;
    const int64_t logical[5] = {L, num_pages, H, page_size, 2 * D};
    Dims phys_shape;
    for (int i = 0; i < 5; ++i) phys_shape.push_back(logical[orders[layout][i]]);
    c.backing = Tensor::empty(phys_shape, dt);
    Dims inv = Dims::filled(5, 0);
    for (int i = 0; i < 5; ++i) inv[orders[layout][i]] = i;
    const Tensor layer = c.backing.permute(inv).select(0, 1);  // [B, H, N, C]
    std::tie(c.k, c.v) = split_kv_cache_layer_view(layer, D);
  } else if (layout == 6) {
    c.backing = Tensor::empty({2, num_pages, page_size, H, D}, dt);
    c.k = c.backing.select(0, 0);
    c.v = c.backing.select(0, 1);
  } else {
    c.backing = Tensor::empty({2, num_pages, H, page_size, D}, dt);
    c.k = c.backing.select(0, 0).transpose(1, 2);
    c.v = c.backing.select(0, 1).transpose(1, 2);
  }
  return c;
}

// Random values everywhere, NaN in page 0 (the null block: it must never be read).
inline void fill_cache(const KVCache& c, std::mt19937& rng) {
  fill_uniform(c.backing, rng);
  fill_nan(c.k.select(0, 0));
  fill_nan(c.v.select(0, 0));
}

// ---- random batches ---------------------------------------------------------------------------
struct Batch {
  std::vector<int64_t> q_lens, kv_lens;
  int64_t num_tokens = 0;   // query rows (>= sum q_lens: trailing padding rows)
  int64_t num_pages = 0;    // cache pages (page 0 never used)
  Tensor qo_indptr;         // [B + 1] int32
  Tensor indptr, indices, last_page_len;  // paged form
  Tensor block_table, seq_lens;           // block-table form
};

// Pages are a random permutation of 1..num_pages-1 (page 0 never referenced).
inline Batch make_batch(const std::vector<int64_t>& q_lens, const std::vector<int64_t>& kv_lens, int64_t page_size,
                        std::mt19937& rng, int64_t pad_rows = 0, int64_t spare_pages = 3) {
  Batch b;
  b.q_lens = q_lens;
  b.kv_lens = kv_lens;
  const size_t B = q_lens.size();
  std::vector<int32_t> qo(B + 1, 0), ip(B + 1, 0), last(B, 0);
  int64_t max_blocks = 1;
  for (size_t r = 0; r < B; ++r) {
    qo[r + 1] = qo[r] + static_cast<int32_t>(q_lens[r]);
    const int64_t n = (kv_lens[r] + page_size - 1) / page_size;
    ip[r + 1] = ip[r] + static_cast<int32_t>(n);
    last[r] = static_cast<int32_t>(n == 0 ? 0 : kv_lens[r] - (n - 1) * page_size);
    max_blocks = std::max(max_blocks, n);
  }
  b.num_tokens = qo[B] + pad_rows;
  b.num_pages = ip[B] + 1 + spare_pages;
  std::vector<int32_t> perm(static_cast<size_t>(b.num_pages - 1));
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> indices(perm.begin(), perm.begin() + ip[B]);
  std::vector<int32_t> bt(B * static_cast<size_t>(max_blocks + 1), 0);
  std::vector<int32_t> sl(B);
  for (size_t r = 0; r < B; ++r) {
    for (int32_t i = ip[r]; i < ip[r + 1]; ++i) bt[r * (max_blocks + 1) + (i - ip[r])] = indices[i];
    // unused block-table entries hold garbage that must not be read
    for (int64_t i = ip[r + 1] - ip[r]; i < max_blocks + 1; ++i) bt[r * (max_blocks + 1) + i] = 1 << 30;
    sl[r] = static_cast<int32_t>(kv_lens[r]);
  }
  b.qo_indptr = Tensor::from_vector(qo);
  b.indptr = Tensor::from_vector(ip);
  b.indices = indices.empty() ? Tensor::empty({0}, DType::i32) : Tensor::from_vector(indices);
  b.last_page_len = B == 0 ? Tensor::empty({0}, DType::i32) : Tensor::from_vector(last);
  b.block_table = B == 0 ? Tensor::empty({0, max_blocks + 1}, DType::i32)
                         : Tensor::from_vector(bt, Dims{static_cast<int64_t>(B), max_blocks + 1});
  b.seq_lens = B == 0 ? Tensor::empty({0}, DType::i32) : Tensor::from_vector(sl);
  return b;
}

// paged_attention arguments over a batch and a cache: query, caches, qo_indptr and the pages in
// the FlashInfer paged form or as a block table; outputs and options left to the caller.
inline PagedAttentionArgs attn_args(const Batch& b, const KVCache& cache, const Tensor& query, bool paged_form) {
  PagedAttentionArgs a;
  a.query = query;
  a.k_cache = cache.k;
  a.v_cache = cache.v;
  a.qo_indptr = b.qo_indptr;
  if (paged_form) {
    a.paged_kv_indptr = b.indptr;
    a.paged_kv_indices = b.indices;
    a.paged_kv_last_page_len = b.last_page_len;
  } else {
    a.block_table = b.block_table;
    a.seq_lens = b.seq_lens;
  }
  return a;
}

}  // namespace kvattn::ops::testing
