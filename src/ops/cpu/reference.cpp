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

// n elements of one dtype, `stride` bytes apart, widened to double.
void load_row(const char* p, int64_t stride, DType t, int64_t n, double* dst) {
  for (int64_t i = 0; i < n; ++i, p += stride) dst[i] = load_as_double(p, t);
}

// A worker's buffers for one query row and one KV head's group of query heads.
struct RowScratch {
  std::vector<double> q, kv, s, acc, mx, sink, denom;
  RowScratch(int64_t group, int64_t dim)
      : q(static_cast<size_t>(group * dim)), kv(static_cast<size_t>(dim)), acc(static_cast<size_t>(group * dim)),
        mx(static_cast<size_t>(group)), sink(static_cast<size_t>(group)), denom(static_cast<size_t>(group)) {}
};
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
  // One query row: its heads are taken a KV head at a time, so each key and value row is read
  // (and widened to double) once for the query heads that share it.
  const auto one_row = [&](int64_t r, int64_t t, RowScratch& w) {
    const int64_t kv_len = b.kv_len[r];
    const int64_t D = d.head_dim;
    const auto load_kv_row = [&](const Tensor& cache, int64_t j, int64_t kh, double* dst) {
      const int64_t page = b.pages[static_cast<size_t>(b.page_begin[r] + j / d.page_size)];
      load_row(elem_ptr(cache, {page, j % d.page_size, kh, 0}), cache.stride(3) * cache.element_size(),
               cache.dtype(), D, dst);
    };
    const detail::RowMask m = detail::make_row_mask(a, b, r, t);
    const int64_t q_stride = a.query.stride(2) * a.query.element_size();
    for (int64_t kh = 0; kh < d.num_kv_heads; ++kh) {
      const int64_t h0 = kh * group;  // query heads h0 .. h0 + group - 1 read KV head kh
      for (int64_t g = 0; g < group; ++g)
        load_row(elem_ptr(a.query, {t, h0 + g, 0}), q_stride, a.query.dtype(), D, &w.q[g * D]);
      // pass 1: scores and their maximum
      w.s.assign(static_cast<size_t>(group * kv_len), detail::kNegInf);
      std::fill(w.mx.begin(), w.mx.end(), detail::kNegInf);
      for (int64_t j = 0; j < kv_len; ++j) {
        if (!m.visible(j)) continue;
        load_kv_row(a.k_cache, j, kh, w.kv.data());
        for (int64_t g = 0; g < group; ++g) {
          double dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += w.q[g * D + i] * w.kv[i];
          double x = dot * scale;
          if (cap > 0) x = cap * std::tanh(x / cap);
          w.s[g * kv_len + j] = x;
          w.mx[g] = std::max(w.mx[g], x);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        w.sink[g] = a.sinks.defined() ? a.sinks.get({h0 + g}) : detail::kNegInf;
        w.mx[g] = std::max(w.mx[g], w.sink[g]);
      }
      // pass 2: normalised weighted sum of V
      std::fill(w.acc.begin(), w.acc.end(), 0.0);
      std::fill(w.denom.begin(), w.denom.end(), 0.0);
      for (int64_t j = 0; j < kv_len; ++j) {
        if (!m.visible(j)) continue;
        load_kv_row(a.v_cache, j, kh, w.kv.data());
        for (int64_t g = 0; g < group; ++g) {
          const double sj = w.s[g * kv_len + j];
          if (w.mx[g] == detail::kNegInf || sj == detail::kNegInf) continue;
          const double p = std::exp(sj - w.mx[g]);
          w.denom[g] += p;
          for (int64_t i = 0; i < D; ++i) w.acc[g * D + i] += p * w.kv[i];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = h0 + g;
        double denom = w.denom[g];
        if (w.mx[g] != detail::kNegInf && w.sink[g] != detail::kNegInf) denom += std::exp(w.sink[g] - w.mx[g]);
        for (int64_t i = 0; i < D; ++i) {
          const double o = denom > 0 ? w.acc[g * D + i] / denom * a.v_scale : 0.0;
          store_from_double(elem_ptr(a.out, {t, h, i}), a.out.dtype(), o);
        }
        if (a.lse.defined()) {
          double lse = denom > 0 ? w.mx[g] + std::log(denom) : detail::kNegInf;
          if (a.lse_base == LseBase::Two) lse /= std::log(2.0);
          store_from_double(elem_ptr(a.lse, {t, h}), DType::f32, lse);
        }
      }
    }
  };
  std::atomic<size_t> next{0};
  const auto worker = [&] {
    RowScratch w(group, d.head_dim);
    for (size_t i = next++; i < rows.size(); i = next++) one_row(rows[i].first, rows[i].second, w);
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
