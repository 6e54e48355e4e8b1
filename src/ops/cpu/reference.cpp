// The plain CPU oracles (kvattn/ops/reference.h): scalar loops, float64 accumulation,
// a two-pass softmax.  Written to be obviously right, not fast; paged_attention shares its query
// rows out over threads (each row is independent), because the GPU tests compare large calls.
#include "kvattn/ops/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "ops/common.h"

namespace kvattn::ops::reference {
using detail::elem_ptr;

namespace {
void require_cpu(const Tensor& t, const char* op) {
  if (!t.device().is_cpu())
    throw Unsupported(fmt::format("reference::{}: the reference runs on CPU tensors, got {}", op,
                                  t.device().str()));
}
}  // namespace

void reshape_and_cache_flash(const ReshapeAndCacheArgs& a) {
  const detail::CacheWriteDims d = detail::validate_reshape_and_cache(a);
  require_cpu(a.key, "reshape_and_cache_flash");
  const detail::IndexView slots(a.slot_mapping);
  const bool fp8 = is_fp8(a.kv_cache_dtype);
  for (int64_t t = 0; t < d.num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;  // padding, or a token owned by another DCP rank
    const int64_t blk = slot / d.block_size, off = slot % d.block_size;
    for (int64_t h = 0; h < d.num_heads; ++h) {
      for (int which = 0; which < 2; ++which) {
        const Tensor& src = which == 0 ? a.key : a.value;
        const Tensor& dst = which == 0 ? a.key_cache : a.value_cache;
        float scale = 1.f;
        if (fp8) {
          const Tensor& s = which == 0 ? a.k_scale : a.v_scale;
          scale = static_cast<float>(s.numel() == 1 ? s.contiguous().get({0}) : s.get({h}));
        }
        for (int64_t i = 0; i < d.head_size; ++i) {
          const float x = static_cast<float>(load_as_double(elem_ptr(src, {t, h, i}), src.dtype()));
          void* p = elem_ptr(dst, {blk, off, h, i});
          if (fp8) store_from_double(p, d.cache_dtype, x / scale);  // saturating conversion
          else store_from_double(p, d.cache_dtype, x);
        }
      }
    }
  }
}

void paged_attention(const PagedAttentionArgs& a) {
  const detail::AttnDims d = detail::validate_paged_attention(a);
  require_cpu(a.query, "paged_attention");
  const detail::ResolvedBatch b = detail::resolve_batch(a, d);
  const int64_t group = d.num_qo_heads / d.num_kv_heads;
  const double scale = d.sm_scale * a.q_scale * a.k_scale;
  const double cap = a.logits_soft_cap;
  // Each query row (request r, token t) is computed on its own and writes only its own output and
  // LSE elements, so the rows are shared out over threads; nothing else is shared but the inputs.
  std::vector<std::pair<int64_t, int64_t>> rows;
  int64_t work = 0;  // query-key pairs, to leave small calls on the calling thread
  for (int64_t r = 0; r < d.batch; ++r)
    for (int64_t t = b.q_begin[r]; t < b.q_begin[r + 1]; ++t) {
      rows.emplace_back(r, t);
      work += b.kv_len[r];
    }
  const auto one_row = [&](int64_t r, int64_t t, std::vector<double>& q, std::vector<double>& s,
                           std::vector<double>& acc) {
    const int64_t kv_len = b.kv_len[r];
    const auto key_addr = [&](const Tensor& cache, int64_t j, int64_t kh, int64_t i) {
      const int64_t page = b.pages[static_cast<size_t>(b.page_begin[r] + j / d.page_size)];
      return elem_ptr(cache, {page, j % d.page_size, kh, i});
    };
    const detail::RowMask m = detail::make_row_mask(a, b, r, t);
    for (int64_t h = 0; h < d.num_qo_heads; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = 0; i < d.head_dim; ++i) q[i] = load_as_double(elem_ptr(a.query, {t, h, i}), a.query.dtype());
      // pass 1: scores and their maximum
      s.assign(static_cast<size_t>(kv_len), detail::kNegInf);
      double mx = detail::kNegInf;
      for (int64_t j = 0; j < kv_len; ++j) {
        if (!m.visible(j)) continue;
        double dot = 0;
        for (int64_t i = 0; i < d.head_dim; ++i)
          dot += q[i] * load_as_double(key_addr(a.k_cache, j, kh, i), a.k_cache.dtype());
        double x = dot * scale;
        if (cap > 0) x = cap * std::tanh(x / cap);
        s[j] = x;
        mx = std::max(mx, x);
      }
      const double sink = a.sinks.defined() ? a.sinks.get({h}) : detail::kNegInf;
      mx = std::max(mx, sink);
      // pass 2: normalised weighted sum of V
      std::fill(acc.begin(), acc.end(), 0.0);
      double denom = 0;
      if (mx != detail::kNegInf) {
        for (int64_t j = 0; j < kv_len; ++j) {
          if (s[j] == detail::kNegInf) continue;
          const double p = std::exp(s[j] - mx);
          denom += p;
          for (int64_t i = 0; i < d.head_dim; ++i)
            acc[i] += p * load_as_double(key_addr(a.v_cache, j, kh, i), a.v_cache.dtype());
        }
        if (sink != detail::kNegInf) denom += std::exp(sink - mx);
      }
      for (int64_t i = 0; i < d.head_dim; ++i) {
        const double o = denom > 0 ? acc[i] / denom * a.v_scale : 0.0;
        store_from_double(elem_ptr(a.out, {t, h, i}), a.out.dtype(), o);
      }
      if (a.lse.defined()) {
        double lse = denom > 0 ? mx + std::log(denom) : detail::kNegInf;
        if (a.lse_base == LseBase::Two) lse /= std::log(2.0);
        store_from_double(elem_ptr(a.lse, {t, h}), DType::f32, lse);
      }
    }
  };
  std::atomic<size_t> next{0};
  const auto worker = [&] {
    std::vector<double> q(static_cast<size_t>(d.head_dim)), s, acc(static_cast<size_t>(d.head_dim));
    for (size_t i = next++; i < rows.size(); i = next++) one_row(rows[i].first, rows[i].second, q, s, acc);
  };
  const int64_t kPairsPerThread = int64_t{1} << 16;
  const auto threads = static_cast<size_t>(std::clamp<int64_t>(
      std::min<int64_t>(static_cast<int64_t>(rows.size()), work * d.num_qo_heads / kPairsPerThread), 1,
      std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> helpers;
  std::vector<std::exception_ptr> errors(threads);
  for (size_t k = 1; k < threads; ++k)
    helpers.emplace_back([&, k] {
      try {
        worker();
      } catch (...) {
        errors[k] = std::current_exception();
        next = rows.size();  // the others stop at their next row
      }
    });
  try {
    worker();
  } catch (...) {
    errors[0] = std::current_exception();
    next = rows.size();
  }
  for (std::thread& th : helpers) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

void merge_attn_states(const MergeAttnStatesArgs& a) {
  const detail::MergeDims d = detail::validate_merge(a);
  require_cpu(a.output, "merge_attn_states");
  const double out_scale = a.output_scale.defined() ? a.output_scale.contiguous().get({0}) : 1.0;
  const bool fp8 = dtype_is_fp8(a.output.dtype());
  for (int64_t t = 0; t < d.num_tokens; ++t) {
    const bool merge = !a.prefill_tokens_with_context || t < *a.prefill_tokens_with_context;
    for (int64_t h = 0; h < d.num_heads; ++h) {
      double p = a.prefix_lse.get({h, t}), s = a.suffix_lse.get({h, t});
      double wp, ws, out_lse;
      if (!merge) {
        wp = 0; ws = 1; out_lse = s;
      } else {
        if (std::isinf(p)) p = detail::kNegInf;  // +inf: FA2's empty-sequence LSE
        if (std::isinf(s)) s = detail::kNegInf;
        const double mx = std::max(p, s);
        if (mx == detail::kNegInf) {
          wp = 1; ws = 0; out_lse = detail::kNegInf;
        } else {
          const double ep = std::exp(p - mx), es = std::exp(s - mx);
          wp = ep / (ep + es);
          ws = es / (ep + es);
          out_lse = std::log(ep + es) + mx;
        }
      }
      for (int64_t i = 0; i < d.head_dim; ++i) {
        double o = ws == 0 ? load_as_double(elem_ptr(a.prefix_output, {t, h, i}), a.prefix_output.dtype()) * wp
                 : wp == 0 ? load_as_double(elem_ptr(a.suffix_output, {t, h, i}), a.suffix_output.dtype()) * ws
                 : wp * load_as_double(elem_ptr(a.prefix_output, {t, h, i}), a.prefix_output.dtype()) +
                       ws * load_as_double(elem_ptr(a.suffix_output, {t, h, i}), a.suffix_output.dtype());
        if (fp8) o /= out_scale;
        store_from_double(elem_ptr(a.output, {t, h, i}), a.output.dtype(), o);
      }
      if (a.output_lse.defined()) store_from_double(elem_ptr(a.output_lse, {h, t}), DType::f32, out_lse);
    }
  }
}

}  // namespace kvattn::ops::reference
