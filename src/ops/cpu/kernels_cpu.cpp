// The CPU implementations of the non-attention ops (arguments already validated).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/thread_pool.h"

namespace kvattn::ops::cpu {
using detail::IndexView;

namespace {
inline float load_f(const char* p, DType t) {
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return f16_bits_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_bits_to_f32(v); }
    case DType::fp8_e4m3: return fp8_e4m3_bits_to_f32(*reinterpret_cast<const uint8_t*>(p));
    case DType::fp8_e5m2: return fp8_e5m2_bits_to_f32(*reinterpret_cast<const uint8_t*>(p));
    default: return static_cast<float>(load_as_double(p, t));
  }
}
inline void store_f(char* p, DType t, float x) {
  switch (t) {
    case DType::f32: std::memcpy(p, &x, 4); return;
    case DType::f16: { const uint16_t v = f32_to_f16_bits(x); std::memcpy(p, &v, 2); return; }
    case DType::bf16: { const uint16_t v = f32_to_bf16_bits(x); std::memcpy(p, &v, 2); return; }
    case DType::fp8_e4m3: *reinterpret_cast<uint8_t*>(p) = f32_to_fp8_e4m3_bits(x); return;
    case DType::fp8_e5m2: *reinterpret_cast<uint8_t*>(p) = f32_to_fp8_e5m2_bits(x); return;
    default: store_from_double(p, t, x); return;
  }
}
struct Strided4 {
  char* base;
  int64_t st[4];  // byte strides
  explicit Strided4(const Tensor& t) : base(static_cast<char*>(t.data())) {
    for (int i = 0; i < 4; ++i) st[i] = t.stride(i) * t.element_size();
  }
  char* at(int64_t a, int64_t b, int64_t c) const { return base + a * st[0] + b * st[1] + c * st[2]; }
};
}  // namespace

void reshape_and_cache_flash(const ReshapeAndCacheArgs& a, const detail::CacheWriteDims& d) {
  const IndexView slots(a.slot_mapping);
  const bool fp8 = is_fp8(a.kv_cache_dtype);
  const DType src_t = a.key.dtype(), dst_t = d.cache_dtype;
  const int64_t ses = a.key.element_size(), des = dtype_size(dst_t);
  const Strided4 kc(a.key_cache), vc(a.value_cache);
  std::vector<float> ks, vs;
  if (fp8) {
    ks = a.k_scale.contiguous().to_vector<float>();
    vs = a.v_scale.contiguous().to_vector<float>();
  }
  const int64_t H = d.num_heads, D = d.head_size;
  ThreadPool::instance().parallel_for(d.num_tokens, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      const int64_t blk = slot / d.block_size, off = slot % d.block_size;
      for (int which = 0; which < 2; ++which) {
        const Tensor& src = which == 0 ? a.key : a.value;
        const Strided4& dst = which == 0 ? kc : vc;
        const char* sb = static_cast<const char*>(src.data()) + t * src.stride(0) * ses;
        for (int64_t h = 0; h < H; ++h) {
          const char* s = sb + h * src.stride(1) * ses;
          char* o = dst.at(blk, off, h);
          const int64_t ss = src.stride(2) * ses, os = dst.st[3];
          if (!fp8) {
            if (ss == ses && os == des) std::memcpy(o, s, static_cast<size_t>(D * des));
            else for (int64_t i = 0; i < D; ++i) std::memcpy(o + i * os, s + i * ss, static_cast<size_t>(des));
            continue;
          }
          const std::vector<float>& sc = which == 0 ? ks : vs;
          const float scale = sc.size() == 1 ? sc[0] : sc[static_cast<size_t>(h)];
          for (int64_t i = 0; i < D; ++i) store_f(o + i * os, dst_t, load_f(s + i * ss, src_t) / scale);
        }
      }
    }
  });
}

void merge_attn_states(const MergeAttnStatesArgs& a, const detail::MergeDims& d) {
  const float out_scale = a.output_scale.defined() ? static_cast<float>(a.output_scale.contiguous().get({0})) : 1.f;
  const bool fp8 = dtype_is_fp8(a.output.dtype());
  const int64_t T = d.num_tokens, H = d.num_heads, D = d.head_dim;
  const int64_t ptwc = a.prefill_tokens_with_context.value_or(T);
  const DType it = a.prefix_output.dtype(), ot = a.output.dtype();
  const int64_t ies = dtype_size(it), oes = dtype_size(ot);
  const auto lse_at = [](const Tensor& l, int64_t h, int64_t t) {
    float v;
    std::memcpy(&v, static_cast<const char*>(l.data()) + (h * l.stride(0) + t * l.stride(1)) * 4, 4);
    return v;
  };
  ThreadPool::instance().parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        float p = lse_at(a.prefix_lse, h, t), s = lse_at(a.suffix_lse, h, t);
        float wp, ws, out_lse;
        if (t >= ptwc) {
          wp = 0.f; ws = 1.f; out_lse = s;
        } else {
          if (std::isinf(p)) p = -INFINITY;
          if (std::isinf(s)) s = -INFINITY;
          const float m = std::max(p, s);
          if (m == -INFINITY) {
            wp = 1.f; ws = 0.f; out_lse = -INFINITY;
          } else {
            const float ep = std::exp(p - m), es = std::exp(s - m), sum = ep + es;
            wp = ep / sum; ws = es / sum;
            out_lse = std::log(sum) + m;
          }
        }
        const char* po = static_cast<const char*>(a.prefix_output.data()) +
                         (t * a.prefix_output.stride(0) + h * a.prefix_output.stride(1)) * ies;
        const char* so = static_cast<const char*>(a.suffix_output.data()) +
                         (t * a.suffix_output.stride(0) + h * a.suffix_output.stride(1)) * ies;
        char* oo = static_cast<char*>(a.output.data()) + (t * a.output.stride(0) + h * a.output.stride(1)) * oes;
        const int64_t ps = a.prefix_output.stride(2) * ies, ss = a.suffix_output.stride(2) * ies,
                      os = a.output.stride(2) * oes;
        for (int64_t i = 0; i < D; ++i) {
          float o = ws == 0.f ? load_f(po + i * ps, it) * wp
                  : wp == 0.f ? load_f(so + i * ss, it) * ws
                  : load_f(po + i * ps, it) * wp + load_f(so + i * ss, it) * ws;
          if (fp8) o /= out_scale;
          store_f(oo + i * os, ot, o);
        }
        if (a.output_lse.defined())
          std::memcpy(static_cast<char*>(a.output_lse.data()) +
                          (h * a.output_lse.stride(0) + t * a.output_lse.stride(1)) * 4,
                      &out_lse, 4);
      }
    }
  });
}

void mask_empty_context_lse(const Tensor& lse, const Tensor& qsl, const Tensor& csl) {
  const IndexView q(qsl), c(csl);
  const float ninf = -INFINITY;
  for (int64_t r = 0; r + 1 < qsl.size(0); ++r) {
    if (c[r] != c[r + 1]) continue;
    for (int64_t h = 0; h < lse.size(0); ++h)
      for (int64_t t = q[r]; t < q[r + 1]; ++t)
        std::memcpy(static_cast<char*>(lse.data()) + (h * lse.stride(0) + t * lse.stride(1)) * 4, &ninf, 4);
  }
}

void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides, const Tensor& seg_page_sizes,
                    const Tensor& block_ids) {
  const IndexView addr(seg_addrs), stride(seg_block_strides), page(seg_page_sizes), ids(block_ids);
  const int64_t S = seg_addrs.size(0), n = block_ids.size(0);
  ThreadPool::instance().parallel_for(n * S, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / S, s = i % S;
      char* p = reinterpret_cast<char*>(static_cast<uintptr_t>(addr[s])) + ids[b] * stride[s] * 4;
      std::memset(p, 0, static_cast<size_t>(page[s] * 4));
    }
  });
}

void copy_page_indices(const Tensor& out, const Tensor& block_table, const Tensor& indptr) {
  const IndexView ip(indptr), bt(block_table);
  char* o = static_cast<char*>(out.data());
  const int64_t os = out.stride(0) * out.element_size();
  const bool o64 = out.dtype() == DType::i64;
  for (int64_t r = 0; r + 1 < indptr.size(0); ++r)
    for (int64_t i = 0; i < ip[r + 1] - ip[r]; ++i) {
      const int64_t v = bt.at(r, i);
      if (o64) std::memcpy(o + (ip[r] + i) * os, &v, 8);
      else { const int32_t v32 = static_cast<int32_t>(v); std::memcpy(o + (ip[r] + i) * os, &v32, 4); }
    }
}

void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens,
                             int64_t block_size) {
  const IndexView bt(block_table), sl(seq_lens);
  const int64_t R = out.size(0), n_out = out.size(1);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t start = std::max<int64_t>((sl[r] - 1) / block_size, 0);
    for (int64_t j = 0; j < n_out; ++j) {
      char* p = static_cast<char*>(out.data()) + (r * out.stride(0) + j * out.stride(1)) * out.element_size();
      const int64_t v = bt.at(r, start + j);
      if (out.dtype() == DType::i64) std::memcpy(p, &v, 8);
      else { const int32_t v32 = static_cast<int32_t>(v); std::memcpy(p, &v32, 4); }
    }
  }
}

void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables, const Tensor& k_scale,
                   const Tensor& v_scale, const Tensor& out_k, const Tensor& out_v) {
  const IndexView bt(block_tables);
  const int64_t R = block_tables.size(0), P = block_tables.size(1);
  const int64_t ps = k_cache.size(1), H = k_cache.size(2), D = k_cache.size(3);
  const float scales[2] = {static_cast<float>(k_scale.contiguous().get({0})),
                           static_cast<float>(v_scale.contiguous().get({0}))};
  const Strided4 src[2] = {Strided4(k_cache), Strided4(v_cache)};
  const Strided4 dst[2] = {Strided4(out_k), Strided4(out_v)};
  const DType st = k_cache.dtype(), dt = out_k.dtype();
  ThreadPool::instance().parallel_for(R * P, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / P, c = i % P, page = bt.at(r, c);
      if (page <= 0) continue;
      const int64_t mock = r * P + 1 + c;
      for (int w = 0; w < 2; ++w)
        for (int64_t s = 0; s < ps; ++s)
          for (int64_t h = 0; h < H; ++h) {
            const char* sp = src[w].at(page, s, h);
            char* dp = dst[w].at(mock, s, h);
            for (int64_t e = 0; e < D; ++e)
              store_f(dp + e * dst[w].st[3], dt, load_f(sp + e * src[w].st[3], st) * scales[w]);
          }
    }
  });
}

}  // namespace kvattn::ops::cpu
