// src/ops/cpu/attention_kernel_impl.h — the tiled online-softmax attention kernel.
//
// Included by attention_generic.cpp, attention_avx2.cpp and attention_avx512bf16.cpp (the
// latter two under a `#pragma GCC target`), each of which defines, before including:
//   KVATTN_KERNEL_ENTRY  the name of the entry function (attention_items_<isa>)
//   KVATTN_MERGE_ENTRY   the name of the split-KV merge entry (attention_merge_<isa>)
//   kvattn_fma8(a,b,c)   a * b + c on v8f
//   kvattn_cvt_f16_8(p)  8 f16 values at p -> v8f
// and optionally kvattn_cvt_bf16_8, kvattn_zext_u8_8, kvattn_hadd8 (intrinsic versions of
// portable code below) and kvattn_dpbf16_8 (vdpbf16ps: enables bf16 x bf16 dot products).
// Two kernels:
// * run_item_decode — items with <= kDecodeMaxRows query rows per KV head (decode,
//   short multi-token decode): dot products straight from the cache rows, see below.
// * run_item — the tiled kernel for everything else: the query rows of all the KV head's
//   query heads form a [rows, D] f32 block; keys are processed `key_tile` at a time: K rows
//   are converted to f32 once per tile and reused by every query row (GQA), then the online
//   softmax (running max m, running sum l, accumulator acc) folds the tile in.
// (No include guard: included once per instruction set.)

namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

inline v8f ld8(const float* p) { v8f v; __builtin_memcpy(&v, p, 32); return v; }
inline void st8(float* p, v8f v) { __builtin_memcpy(p, &v, 32); }
template <typename T> inline T max_(T a, T b) { return a < b ? b : a; }
template <typename T> inline T min_(T a, T b) { return b < a ? b : a; }
inline float hsum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

inline float dot_f32(const float* a, const float* b, int64_t D) {
  v8f s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 32 <= D; i += 32) {
    s0 = kvattn_fma8(ld8(a + i), ld8(b + i), s0);
    s1 = kvattn_fma8(ld8(a + i + 8), ld8(b + i + 8), s1);
    s2 = kvattn_fma8(ld8(a + i + 16), ld8(b + i + 16), s2);
    s3 = kvattn_fma8(ld8(a + i + 24), ld8(b + i + 24), s3);
  }
  for (; i < D; i += 8) s0 = kvattn_fma8(ld8(a + i), ld8(b + i), s0);
  return hsum8((s0 + s1) + (s2 + s3));
}

// out[u] = q_u . k for the four rows q, q + qs, q + 2 qs, q + 3 qs (one pass over k).
inline void dot4_f32(const float* q, int64_t qs, const float* k, int64_t D, float* out) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
  int64_t i = 0;
  for (; i + 16 <= D; i += 16) {
    const v8f k0 = ld8(k + i), k1 = ld8(k + i + 8);
    a0 = kvattn_fma8(ld8(q + i), k0, a0);
    a1 = kvattn_fma8(ld8(q + qs + i), k0, a1);
    a2 = kvattn_fma8(ld8(q + 2 * qs + i), k0, a2);
    a3 = kvattn_fma8(ld8(q + 3 * qs + i), k0, a3);
    b0 = kvattn_fma8(ld8(q + i + 8), k1, b0);
    b1 = kvattn_fma8(ld8(q + qs + i + 8), k1, b1);
    b2 = kvattn_fma8(ld8(q + 2 * qs + i + 8), k1, b2);
    b3 = kvattn_fma8(ld8(q + 3 * qs + i + 8), k1, b3);
  }
  for (; i < D; i += 8) {
    const v8f k0 = ld8(k + i);
    a0 = kvattn_fma8(ld8(q + i), k0, a0);
    a1 = kvattn_fma8(ld8(q + qs + i), k0, a1);
    a2 = kvattn_fma8(ld8(q + 2 * qs + i), k0, a2);
    a3 = kvattn_fma8(ld8(q + 3 * qs + i), k0, a3);
  }
  out[0] = hsum8(a0 + b0);
  out[1] = hsum8(a1 + b1);
  out[2] = hsum8(a2 + b2);
  out[3] = hsum8(a3 + b3);
}

// acc_u[0, D) += sum_j P_u[j] V[j] for four rows u (accumulators acc + u * D, weights
// P + u * ps), register-blocked over 16 dims: each V load feeds four FMAs.
inline void accumulate_pv4(float* acc, const float* P, int64_t ps, const float* V, int64_t nk, int64_t D) {
  for (int64_t i = 0; i < D; i += 16) {
    const bool two = i + 16 <= D;
    v8f a0 = ld8(acc + i), a1 = ld8(acc + D + i), a2 = ld8(acc + 2 * D + i), a3 = ld8(acc + 3 * D + i);
    v8f b0 = {}, b1 = {}, b2 = {}, b3 = {};
    if (two) { b0 = ld8(acc + i + 8); b1 = ld8(acc + D + i + 8); b2 = ld8(acc + 2 * D + i + 8); b3 = ld8(acc + 3 * D + i + 8); }
    for (int64_t j = 0; j < nk; ++j) {
      const float* v = V + j * D + i;
      const v8f v0 = ld8(v);
      const float p0 = P[j], p1 = P[ps + j], p2 = P[2 * ps + j], p3 = P[3 * ps + j];
      const v8f q0 = {p0, p0, p0, p0, p0, p0, p0, p0}, q1 = {p1, p1, p1, p1, p1, p1, p1, p1},
                q2 = {p2, p2, p2, p2, p2, p2, p2, p2}, q3 = {p3, p3, p3, p3, p3, p3, p3, p3};
      a0 = kvattn_fma8(q0, v0, a0); a1 = kvattn_fma8(q1, v0, a1);
      a2 = kvattn_fma8(q2, v0, a2); a3 = kvattn_fma8(q3, v0, a3);
      if (two) {
        const v8f v1 = ld8(v + 8);
        b0 = kvattn_fma8(q0, v1, b0); b1 = kvattn_fma8(q1, v1, b1);
        b2 = kvattn_fma8(q2, v1, b2); b3 = kvattn_fma8(q3, v1, b3);
      }
    }
    st8(acc + i, a0); st8(acc + D + i, a1); st8(acc + 2 * D + i, a2); st8(acc + 3 * D + i, a3);
    if (two) { st8(acc + i + 8, b0); st8(acc + D + i + 8, b1); st8(acc + 2 * D + i + 8, b2); st8(acc + 3 * D + i + 8, b3); }
  }
}

// acc[0, D) += p * v[0, D)
inline void axpy_f32(float* acc, float p, const float* v, int64_t D) {
  const v8f pv = {p, p, p, p, p, p, p, p};
  for (int64_t i = 0; i < D; i += 8) st8(acc + i, kvattn_fma8(pv, ld8(v + i), ld8(acc + i)));
}

// acc[row] += sum_j P[j] * V[j] for `nk` keys, register-blocked over 32 dims.
inline void accumulate_pv(float* acc, const float* P, const float* V, int64_t nk, int64_t D) {
  int64_t i = 0;
  for (; i + 32 <= D; i += 32) {
    v8f a0 = ld8(acc + i), a1 = ld8(acc + i + 8), a2 = ld8(acc + i + 16), a3 = ld8(acc + i + 24);
    for (int64_t j = 0; j < nk; ++j) {
      const float p = P[j];
      if (p == 0.f) continue;
      const v8f pv = {p, p, p, p, p, p, p, p};
      const float* v = V + j * D + i;
      a0 = kvattn_fma8(pv, ld8(v), a0);
      a1 = kvattn_fma8(pv, ld8(v + 8), a1);
      a2 = kvattn_fma8(pv, ld8(v + 16), a2);
      a3 = kvattn_fma8(pv, ld8(v + 24), a3);
    }
    st8(acc + i, a0); st8(acc + i + 8, a1); st8(acc + i + 16, a2); st8(acc + i + 24, a3);
  }
  for (; i < D; i += 8) {
    v8f a0 = ld8(acc + i);
    for (int64_t j = 0; j < nk; ++j) {
      const float p = P[j];
      if (p == 0.f) continue;
      const v8f pv = {p, p, p, p, p, p, p, p};
      a0 = kvattn_fma8(pv, ld8(V + j * D + i), a0);
    }
    st8(acc + i, a0);
  }
}

// One cache row of D elements (element stride sd) -> f32.
template <DType KV>
inline void convert_row(const char* src, int64_t sd, float* dst, int64_t D) {
  if constexpr (KV == DType::f32) {
    const float* s = reinterpret_cast<const float*>(src);
    if (sd == 1) { __builtin_memcpy(dst, s, static_cast<size_t>(D) * 4); return; }
    for (int64_t i = 0; i < D; ++i) __builtin_memcpy(dst + i, s + i * sd, 4);
  } else if constexpr (KV == DType::bf16) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    if (sd == 1) {
      for (int64_t i = 0; i < D; i += 8) {
        v8u16 h;
        __builtin_memcpy(&h, s + i, 16);
        const v8u32 w = __builtin_convertvector(h, v8u32) << 16;
        __builtin_memcpy(dst + i, &w, 32);
      }
      return;
    }
    for (int64_t i = 0; i < D; ++i) { uint16_t h; __builtin_memcpy(&h, s + i * sd, 2); dst[i] = bf16_bits_to_f32(h); }
  } else if constexpr (KV == DType::f16) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    if (sd == 1) {
      for (int64_t i = 0; i < D; i += 8) st8(dst + i, kvattn_cvt_f16_8(s + i));
      return;
    }
    for (int64_t i = 0; i < D; ++i) { uint16_t h; __builtin_memcpy(&h, s + i * sd, 2); dst[i] = f16_bits_to_f32(h); }
  } else {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src);
    const float* lut = KV == DType::fp8_e4m3 ? fp8_e4m3_table() : fp8_e5m2_table();
    if (sd == 1) { for (int64_t i = 0; i < D; ++i) dst[i] = lut[s[i]]; return; }
    for (int64_t i = 0; i < D; ++i) dst[i] = lut[s[i * sd]];
  }
}

inline float load_elem(const char* p, DType t) {
  switch (t) {
    case DType::f32: { float v; __builtin_memcpy(&v, p, 4); return v; }
    case DType::f16: { uint16_t v; __builtin_memcpy(&v, p, 2); return f16_bits_to_f32(v); }
    case DType::bf16: { uint16_t v; __builtin_memcpy(&v, p, 2); return bf16_bits_to_f32(v); }
    default: return static_cast<float>(load_as_double(p, t));
  }
}
inline void store_elem(char* p, DType t, float x) {
  switch (t) {
    case DType::f32: __builtin_memcpy(p, &x, 4); return;
    case DType::f16: { const uint16_t v = f32_to_f16_bits(x); __builtin_memcpy(p, &v, 2); return; }
    case DType::bf16: { const uint16_t v = f32_to_bf16_bits(x); __builtin_memcpy(p, &v, 2); return; }
    default: store_from_double(p, t, x); return;
  }
}

// exp(x) for 8 floats: Cody-Waite range reduction + degree-6 polynomial (max relative error
// ~2 ulp); exp(-inf) = 0, large negative inputs flush to 0, inputs are <= 0 here.
inline v8f exp8(v8f x) {
  const v8f lo = {-87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f};
  const v8f xc = x < lo ? lo : x;  // vector select
  const v8f log2e = {1.44269504f, 1.44269504f, 1.44269504f, 1.44269504f, 1.44269504f, 1.44269504f, 1.44269504f, 1.44269504f};
  v8f n = xc * log2e;
  // round to nearest (magic-number trick; |n| < 2^22)
  const v8f magic = {12582912.f, 12582912.f, 12582912.f, 12582912.f, 12582912.f, 12582912.f, 12582912.f, 12582912.f};
  n = (n + magic) - magic;
  const v8f c1 = {0.693359375f, 0.693359375f, 0.693359375f, 0.693359375f, 0.693359375f, 0.693359375f, 0.693359375f, 0.693359375f};
  const v8f c2 = {-2.12194440e-4f, -2.12194440e-4f, -2.12194440e-4f, -2.12194440e-4f, -2.12194440e-4f, -2.12194440e-4f, -2.12194440e-4f, -2.12194440e-4f};
  const v8f r = (xc - n * c1) - n * c2;
#define KV8(c) v8f{c, c, c, c, c, c, c, c}
  v8f p = KV8(1.9875691500e-4f);
  p = kvattn_fma8(p, r, KV8(1.3981999507e-3f));
  p = kvattn_fma8(p, r, KV8(8.3334519073e-3f));
  p = kvattn_fma8(p, r, KV8(4.1665795894e-2f));
  p = kvattn_fma8(p, r, KV8(1.6666665459e-1f));
  p = kvattn_fma8(p, r, KV8(5.0000001201e-1f));
  p = kvattn_fma8(p, r * r, r + KV8(1.0f));
#undef KV8
  typedef int32_t v8i __attribute__((vector_size(32)));
  const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f res = p * (v8f)e;
  const v8f zero = {};
  return x < lo ? zero : res;
}

// Epilogue of one work item: sinks, normalisation, v_scale, LSE.  Row (hh, tt, g) of the item
// is at index hh * rows_per_head + tt * G + g of acc ([row, D]), m and l.
inline void finish_rows(const AttnKernelParams& P, const AttnWorkItem& it, float* acc_all, const float* m_all,
                        const float* l_all, int64_t rows_per_head) {
  const detail::AttnDims& d = *P.dims;
  const int64_t D = d.head_dim, G = d.num_qo_heads / d.num_kv_heads;
  const int64_t nh = it.num_kv_heads, nt = it.t1 - it.t0;
  const int64_t osz = dtype_size(P.o_dtype);
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t tt = 0; tt < nt; ++tt) {
      const int64_t t = it.t0 + tt;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = hh * rows_per_head + tt * G + g, h = (it.kv_head + hh) * G + g;
        float m = m_all[row], l = l_all[row];
        float* acc = acc_all + row * D;
        if (P.sinks != nullptr) {
          float sink;
          __builtin_memcpy(&sink, P.sinks + h * P.sinks_st * 4, 4);
          const float m_new = max_(m, sink);
          if (m_new != -INFINITY) {
            const float alpha = std::exp(m - m_new);
            l = l * alpha + std::exp(sink - m_new);
            for (int64_t i = 0; i < D; ++i) acc[i] *= alpha;
            m = m_new;
          }
        }
        const float inv = l > 0.f ? P.v_scale / l : 0.f;
        char* op = P.o + (t * P.o_st[0] + h * P.o_st[1]) * osz;
        for (int64_t i = 0; i < D; ++i) store_elem(op + i * P.o_st[2] * osz, P.o_dtype, l > 0.f ? acc[i] * inv : 0.f);
        if (P.lse != nullptr) {
          float lse = l > 0.f ? m + std::log(l) : -INFINITY;
          if (P.lse_base2) lse *= 1.4426950408889634f;
          __builtin_memcpy(P.lse + (t * P.lse_st[0] + h * P.lse_st[1]) * 4, &lse, 4);
        }
      }
    }
}

// One work item: the query rows of a tile of query tokens, for KV heads [kv_head, kv_head + nh)
// and all their query heads.  Row index = (hh * nt + tt) * G + g.
template <DType KV>
void run_item(const AttnKernelParams& P, const AttnWorkItem& it) {
  const PagedAttentionArgs& a = *P.args;
  const detail::AttnDims& d = *P.dims;
  const detail::ResolvedBatch& b = *P.batch;
  const int64_t D = d.head_dim, G = d.num_qo_heads / d.num_kv_heads, ps = d.page_size;
  const int64_t nh = it.num_kv_heads, nt = it.t1 - it.t0, rows_h = nt * G, rows = nh * rows_h, TK = P.key_tile;
  const int64_t kv_len = b.kv_len[it.req];
  const int64_t* pages = b.pages.data() + b.page_begin[it.req];
  // Thread-local buffers (allocated by the baseline-ISA translation unit, so no standard
  // library template is instantiated here with AVX2 code).
  const AttnScratch W = attention_scratch(rows, nt, D, TK * nh);
  for (int64_t i = 0; i < rows * D; ++i) W.acc[i] = 0.f;
  for (int64_t r = 0; r < rows; ++r) { W.m[r] = -INFINITY; W.l[r] = 0.f; }
  // Query rows (pre-scaled) and their visible key ranges.
  int64_t jlo = kv_len, jhi = 0;
  const int64_t qes = dtype_size(P.q_dtype);
  for (int64_t tt = 0; tt < nt; ++tt) {
    const int64_t t = it.t0 + tt;
    W.masks[tt] = detail::make_row_mask(a, b, it.req, t);
    W.lo[tt] = W.masks[tt].lo();
    W.hi[tt] = W.masks[tt].hi();
    if (W.hi[tt] > W.lo[tt]) { jlo = min_(jlo, W.lo[tt]); jhi = max_(jhi, W.hi[tt]); }
    for (int64_t hh = 0; hh < nh; ++hh)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = (it.kv_head + hh) * G + g;
        const char* qp = P.q + (t * P.q_st[0] + h * P.q_st[1]) * qes;
        float* qd = W.q + ((hh * nt + tt) * G + g) * D;
        for (int64_t i = 0; i < D; ++i) qd[i] = load_elem(qp + i * P.q_st[2] * qes, P.q_dtype) * P.scale;
      }
  }
  const int64_t kvs = dtype_size(KV);
  // Software prefetch: pages are scattered, so the hardware prefetcher sees only short runs;
  // ask for the next K tile and this tile's V rows ahead of use.
  const int64_t row_bytes = P.k_st[3] == 1 && P.v_st[3] == 1 ? D * kvs : 0;
  const auto prefetch_rows = [&](const char* base, const int64_t* st, int64_t from, int64_t to) {
    if (row_bytes == 0) return;
    for (int64_t j = from; j < to; ++j) {
      const int64_t page = pages[j / ps], slot = j % ps;
      for (int64_t hh = 0; hh < nh; ++hh) {
        const char* src = base + (page * st[0] + slot * st[1] + (it.kv_head + hh) * st[2]) * kvs;
        for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(src + off, 0, 2);
      }
    }
  };
  // Converts rows [j0, j0 + nk) to f32; while doing so, prefetches the rows `ahead` keys later
  // of `pf_base` (interleaved, so the misses stream instead of arriving in one burst).
  const auto convert_tile = [&](const char* base, const int64_t* st, int64_t j0, int64_t nk, float* dst,
                                const char* pf_base, const int64_t* pf_st, int64_t ahead) {
    for (int64_t jj = 0; jj < nk; ++jj) {
      const int64_t j = j0 + jj;
      if (pf_base != nullptr && j + ahead < jhi) prefetch_rows(pf_base, pf_st, j + ahead, j + ahead + 1);
      const int64_t page = pages[j / ps], slot = j % ps;
      for (int64_t hh = 0; hh < nh; ++hh) {
        const char* src = base + (page * st[0] + slot * st[1] + (it.kv_head + hh) * st[2]) * kvs;
        convert_row<KV>(src, st[3], dst + (hh * TK + jj) * D, D);
      }
    }
  };
  prefetch_rows(P.k, P.k_st, jlo, min_(jhi, jlo + TK));
  prefetch_rows(P.v, P.v_st, jlo, min_(jhi, jlo + TK));
  for (int64_t j0 = jlo; j0 < jhi; j0 += TK) {
    const int64_t nk = min_(TK, jhi - j0);
    convert_tile(P.k, P.k_st, j0, nk, W.kf, P.k, P.k_st, TK);
    bool any = false;
    for (int64_t hh = 0; hh < nh; ++hh) {
      const float* kf = W.kf + hh * TK * D;
      for (int64_t tt = 0; tt < nt; ++tt) {
        const int64_t lo = max_(W.lo[tt], j0), hi = min_(W.hi[tt], j0 + nk);
        // Scores of the G query heads of this token against the tile; four heads share each
        // K load (GQA).
        const int64_t r0 = (hh * nt + tt) * G;
        for (int64_t jj = 0; jj < nk; ++jj) {
          const int64_t j = j0 + jj;
          float* s0 = W.s + r0 * TK + jj;
          if (!(j >= lo && j < hi && (!P.complex_mask || W.masks[tt].visible(j)))) {
            for (int64_t g = 0; g < G; ++g) s0[g * TK] = -INFINITY;
            continue;
          }
          const float* k = kf + jj * D;
          int64_t g = 0;
          for (; g + 4 <= G; g += 4) {
            float x[4];
            dot4_f32(W.q + (r0 + g) * D, D, k, D, x);
            for (int u = 0; u < 4; ++u) s0[(g + u) * TK] = x[u];
          }
          for (; g < G; ++g) s0[g * TK] = dot_f32(W.q + (r0 + g) * D, k, D);
          if (P.cap > 0.f)
            for (int64_t u = 0; u < G; ++u) s0[u * TK] = P.cap * std::tanh(s0[u * TK] / P.cap);
        }
        for (int64_t g = 0; g < G; ++g) {
          const int64_t row = r0 + g;
          float* s = W.s + row * TK;
          float mx = -INFINITY;
          for (int64_t jj = 0; jj < nk; ++jj) mx = max_(mx, s[jj]);
          if (mx == -INFINITY) {  // nothing visible in this tile for this row
            for (int64_t jj = 0; jj < nk; ++jj) s[jj] = 0.f;
            continue;
          }
          any = true;
          const float m_old = W.m[row], m_new = max_(m_old, mx);
          const float alpha = std::exp(m_old - m_new);  // 0 when m_old = -inf
          const v8f mv = {m_new, m_new, m_new, m_new, m_new, m_new, m_new, m_new};
          v8f sumv = {};
          int64_t jj = 0;
          for (; jj + 8 <= nk; jj += 8) {
            const v8f pv = exp8(ld8(s + jj) - mv);  // exp(-inf) = 0 for masked keys
            st8(s + jj, pv);
            sumv += pv;
          }
          float sum = hsum8(sumv);
          for (; jj < nk; ++jj) {
            const float p = s[jj] == -INFINITY ? 0.f : std::exp(s[jj] - m_new);
            s[jj] = p;
            sum += p;
          }
          W.l[row] = W.l[row] * alpha + sum;
          W.m[row] = m_new;
          if (alpha != 1.f) {
            float* acc = W.acc + row * D;
            const v8f av = {alpha, alpha, alpha, alpha, alpha, alpha, alpha, alpha};
            for (int64_t i = 0; i < D; i += 8) st8(acc + i, ld8(acc + i) * av);
          }
        }
      }
    }
    if (!any) {
      prefetch_rows(P.v, P.v_st, min_(jhi, j0 + TK), min_(jhi, j0 + nk + TK));
      continue;
    }
    convert_tile(P.v, P.v_st, j0, nk, W.vf, P.v, P.v_st, TK);
    // Rows of one KV head are consecutive; groups of four share each V load.
    for (int64_t hh = 0; hh < nh; ++hh) {
      const float* vf = W.vf + hh * TK * D;
      int64_t row = hh * rows_h;
      const int64_t end = row + rows_h;
      for (; row + 4 <= end; row += 4) accumulate_pv4(W.acc + row * D, W.s + row * TK, TK, vf, nk, D);
      for (; row < end; ++row) accumulate_pv(W.acc + row * D, W.s + row * TK, vf, nk, D);
    }
  }
  finish_rows(P, it, W.acc, W.m, W.l, rows_h);
}

// ---- the decode kernel -------------------------------------------------------------------------
// For items with few query rows per KV head (decode, short multi-token decode).  Blocks of
// kDecodeBlock keys; per block and KV head the rows (4 at a time) take dot products straight
// from the cache rows (converted to f32 in registers: bf16 by a 16-bit shift, f16 by F16C),
// each K chunk feeding the FMAs of every row of the group; an online-softmax step per block;
// then P.V with each V chunk feeding every row.  Nothing is copied to scratch but the scores.
constexpr int64_t kDecodeBlock = 32;

template <DType KV> constexpr int64_t kv_elem_size() {
  return KV == DType::f32 ? 4 : (KV == DType::bf16 || KV == DType::f16) ? 2 : 1;
}

inline v8f splat8(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// 8 consecutive cache elements at p -> f32
template <DType KV>
inline v8f load8(const char* p) {
  if constexpr (KV == DType::f32) {
    v8f v;
    __builtin_memcpy(&v, p, 32);
    return v;
  } else if constexpr (KV == DType::bf16) {
#ifdef kvattn_cvt_bf16_8
    return kvattn_cvt_bf16_8(p);
#else
    v8u16 h;
    __builtin_memcpy(&h, p, 16);
    return (v8f)(__builtin_convertvector(h, v8u32) << 16);
#endif
  } else if constexpr (KV == DType::f16) {
    return kvattn_cvt_f16_8(reinterpret_cast<const uint16_t*>(p));
  } else {
    // fp8 by bit placement: sign to bit 31, exponent + mantissa just below f32's exponent
    // field, then a multiply by 2^(127 - bias) re-biases the exponent (exact, subnormals
    // included); the codes with an all-ones pattern become NaN (e4m3) or inf / NaN (e5m2).
#ifdef kvattn_zext_u8_8
    const v8u32 x = kvattn_zext_u8_8(p);
#else
    typedef uint8_t v8u8 __attribute__((vector_size(8)));
    v8u8 b;
    __builtin_memcpy(&b, p, 8);
    const v8u32 x = __builtin_convertvector(b, v8u32);
#endif
    typedef int32_t v8i32 __attribute__((vector_size(32)));
    const v8u32 sign = (x & 0x80u) << 24;
    if constexpr (KV == DType::fp8_e4m3) {
      const v8f v = (v8f)(sign | ((x & 0x7Fu) << 20)) * splat8(0x1p120f);
      const v8i32 nan = (v8i32)((x & 0x7Fu) == 0x7Fu);
      return (v8f)(((v8i32)v & ~nan) | (nan & 0x7FC00000));
    } else {
      const v8f v = (v8f)(sign | ((x & 0x7Fu) << 21)) * splat8(0x1p112f);
      const v8i32 special = (v8i32)((x & 0x7Cu) == 0x7Cu);  // exponent all ones
      const v8i32 inf_nan = (v8i32)(sign | 0x7F800000u | ((x & 3u) << 21));
      return (v8f)(((v8i32)v & ~special) | (special & inf_nan));
    }
  }
}

// [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7] (vhaddps)
typedef int32_t v8i_mask __attribute__((vector_size(32)));
// Two-vector lane shuffle with constant indices: GCC's __builtin_shuffle, clang's
// __builtin_shufflevector (the same selection; clang builds the fuzz targets).
#if defined(__clang__)
#define KVATTN_SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
  __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define KVATTN_SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
  __builtin_shuffle(a, b, v8i_mask{i0, i1, i2, i3, i4, i5, i6, i7})
#endif
inline v8f hadd8(v8f a, v8f b) {
#ifdef kvattn_hadd8
  return kvattn_hadd8(a, b);
#else
  return KVATTN_SHUFFLE8(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         KVATTN_SHUFFLE8(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
#endif
}
// The horizontal sums of eight vectors, as one vector (lane i = sum of v_i).
inline v8f hsum8x8(v8f v0, v8f v1, v8f v2, v8f v3, v8f v4, v8f v5, v8f v6, v8f v7) {
  const v8f u0 = hadd8(hadd8(v0, v1), hadd8(v2, v3)), u1 = hadd8(hadd8(v4, v5), hadd8(v6, v7));
  return KVATTN_SHUFFLE8(u0, u1, 0, 1, 2, 3, 8, 9, 10, 11) +
         KVATTN_SHUFFLE8(u0, u1, 4, 5, 6, 7, 12, 13, 14, 15);
}

// prefetcht1: measured best on both an AMD Zen 4 VM and an Intel Xeon (AMX generation) host;
// the non-temporal hint was 2-3x slower on the Xeon.
inline void prefetch_row(const char* p, int64_t lines) {
  for (int64_t o = 0; o < lines; ++o) __builtin_prefetch(p + 64 * o, 0, 2);
}

// Scores of NR query rows (q, [NR][D] f32, pre-scaled) against keys kp[0, nk): s[j * 4 + r]
// (key-major, four lanes per key; lanes r >= NR are left alone).  NK keys at a time so that
// NR * NK = 8 independent accumulators hide the FMA latency; each K chunk is loaded once.
// While doing so, prefetches rows pf[0, npf) and pf[npf, 2 npf) (the next unit's K and V
// rows, `lines` cache lines each), spread evenly over the keys.
template <DType KV, int NR>
inline void decode_scores(const float* q, int64_t D, const char* const* kp, int64_t nk, float* s,
                          const char* const* pf, int64_t npf, int64_t lines) {
  constexpr int NK = 8 / NR;
  constexpr int64_t es = kv_elem_size<KV>();
  int64_t next_pf = 0;
  for (int64_t j = 0; j < nk; j += NK) {
    if (pf != nullptr) {  // rows [next_pf, target) of both K and V, keeping pace with j
      const int64_t target = min_(npf, (j + NK) * npf / nk);
      for (; next_pf < target; ++next_pf) {
        prefetch_row(pf[next_pf], lines);
        prefetch_row(pf[npf + next_pf], lines);
      }
    }
    const char* k[NK];
#pragma GCC unroll 8
    for (int u = 0; u < NK; ++u) k[u] = kp[min_<int64_t>(j + u, nk - 1)];
    v8f acc[NK][NR];
#pragma GCC unroll 8
    for (int u = 0; u < NK; ++u)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[u][r] = v8f{};
    for (int64_t i = 0; i < D; i += 8) {
      v8f kv[NK];
#pragma GCC unroll 8
      for (int u = 0; u < NK; ++u) kv[u] = load8<KV>(k[u] + i * es);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const v8f qv = ld8(q + r * D + i);
#pragma GCC unroll 8
        for (int u = 0; u < NK; ++u) acc[u][r] = kvattn_fma8(qv, kv[u], acc[u][r]);
      }
    }
    const v8f* a = &acc[0][0];  // index u * NR + r
    const v8f sums = hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    if constexpr (NR == 4) {
      st8(s + j * 4, sums);  // keys j, j + 1 (the buffer has room for the padding key)
    } else {
#pragma GCC unroll 8
      for (int u = 0; u < NK; ++u)
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) s[(j + u) * 4 + r] = sums[u * NR + r];
    }
  }
  if (pf != nullptr)
    for (; next_pf < npf; ++next_pf) {
      prefetch_row(pf[next_pf], lines);
      prefetch_row(pf[npf + next_pf], lines);
    }
}

#ifdef kvattn_dpbf16_8
// decode_scores for bf16 keys and bf16 queries (q: [NR][D] raw bf16 bits, not scaled; D % 16
// == 0): vdpbf16ps multiplies the bf16 pairs exactly and accumulates in f32, so the result
// matches the f32 path to rounding; the scale is applied to the sums.
// NR = 4 takes four keys at a time (16 accumulators: the AVX-512 build has 32 registers).
template <int NR>
inline void decode_scores_dpbf16(const uint16_t* q, int64_t D, const char* const* kp, int64_t nk, float* s,
                                 const char* const* pf, int64_t npf, int64_t lines, float scale) {
  constexpr int NK = NR == 4 ? 4 : 8 / NR;
  int64_t next_pf = 0;
  const v8f sc = splat8(scale);
  for (int64_t j = 0; j < nk; j += NK) {
    if (pf != nullptr) {
      const int64_t target = min_(npf, (j + NK) * npf / nk);
      for (; next_pf < target; ++next_pf) {
        prefetch_row(pf[next_pf], lines);
        prefetch_row(pf[npf + next_pf], lines);
      }
    }
    const char* k[NK];
#pragma GCC unroll 8
    for (int u = 0; u < NK; ++u) k[u] = kp[min_<int64_t>(j + u, nk - 1)];
    v8f acc[NK][NR];
#pragma GCC unroll 8
    for (int u = 0; u < NK; ++u)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[u][r] = v8f{};
    for (int64_t i = 0; i < D; i += 16) {
      v8f kv[NK];
#pragma GCC unroll 8
      for (int u = 0; u < NK; ++u) __builtin_memcpy(&kv[u], k[u] + i * 2, 32);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        v8f qv;
        __builtin_memcpy(&qv, q + r * D + i, 32);
#pragma GCC unroll 8
        for (int u = 0; u < NK; ++u) acc[u][r] = kvattn_dpbf16_8(acc[u][r], qv, kv[u]);
      }
    }
    const v8f* a = &acc[0][0];  // index u * NR + r
    const v8f sums = hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]) * sc;
    if constexpr (NR == 4) {  // keys j .. j + 3 (the buffer has room for the padding keys)
      st8(s + j * 4, sums);
      st8(s + j * 4 + 8, hsum8x8(a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]) * sc);
    } else {
#pragma GCC unroll 8
      for (int u = 0; u < NK; ++u)
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) s[(j + u) * 4 + r] = sums[u * NR + r];
    }
  }
  if (pf != nullptr)
    for (; next_pf < npf; ++next_pf) {
      prefetch_row(pf[next_pf], lines);
      prefetch_row(pf[npf + next_pf], lines);
    }
}
#endif

// acc[r][i0, i0 + 8 W) = alpha[r] acc[r][...] + sum_j P[j * 4 + r] V_j[...] for NR rows.
template <DType KV, int NR, int W>
inline void decode_pv_chunk(float* acc, int64_t D, int64_t i0, const float* alpha, const float* p,
                            const char* const* vp, int64_t nk) {
  constexpr int64_t es = kv_elem_size<KV>();
  v8f a[W][NR];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    const v8f al = splat8(alpha[r]);
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) a[w][r] = ld8(acc + r * D + i0 + 8 * w) * al;
  }
  for (int64_t j = 0; j < nk; ++j) {
    const char* v = vp[j] + i0 * es;
    v8f vv[W];
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) vv[w] = load8<KV>(v + 8 * w * es);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const v8f pr = splat8(p[j * 4 + r]);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) a[w][r] = kvattn_fma8(pr, vv[w], a[w][r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) st8(acc + r * D + i0 + 8 * w, a[w][r]);
}

template <DType KV, int NR>
inline void decode_pv(float* acc, int64_t D, const float* alpha, const float* p, const char* const* vp, int64_t nk) {
  int64_t i = 0;
#ifdef kvattn_dpbf16_8  // AVX-512 build: 32 vector registers hold 4 rows x 32 dims
  for (; i + 32 <= D; i += 32) decode_pv_chunk<KV, NR, 4>(acc, D, i, alpha, p, vp, nk);
#endif
  for (; i + 16 <= D; i += 16) decode_pv_chunk<KV, NR, 2>(acc, D, i, alpha, p, vp, nk);
  if (i < D) decode_pv_chunk<KV, NR, 1>(acc, D, i, alpha, p, vp, nk);
}

// Online-softmax step for one group of four rows over a block of nk keys: scores s[j * 4 + r]
// become probabilities, m and l are updated, alpha gets the rescaling of the old state.
// Keys nk and nk + 1 of s must be writable (padding to whole vectors).
inline bool decode_softmax(float* s, int64_t nk, float* m, float* l, float* alpha) {
  if (nk % 2) for (int r = 0; r < 4; ++r) s[nk * 4 + r] = -INFINITY;
  const int64_t np = (nk + 1) / 2;
  v8f mx = splat8(-INFINITY);
  for (int64_t p = 0; p < np; ++p) {
    const v8f x = ld8(s + p * 8);
    mx = mx < x ? x : mx;
  }
  float ms[4];
  bool any = false;
  for (int r = 0; r < 4; ++r) {
    const float mb = max_(mx[r], mx[r + 4]), m_new = max_(m[r], mb);
    ms[r] = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: exp(-inf - 0) = 0
    alpha[r] = m_new == m[r] ? 1.f : std::exp(m[r] - ms[r]);
    m[r] = m_new;
    any = any || mb != -INFINITY;
  }
  const v8f mv = {ms[0], ms[1], ms[2], ms[3], ms[0], ms[1], ms[2], ms[3]};
  v8f sum = {};
  for (int64_t p = 0; p < np; ++p) {
    const v8f e = exp8(ld8(s + p * 8) - mv);
    st8(s + p * 8, e);
    sum += e;
  }
  for (int r = 0; r < 4; ++r) l[r] = l[r] * alpha[r] + (sum[r] + sum[r + 4]);
  return any;
}

// One decode work item: request it.req, KV heads [kv_head, kv_head + nh), tokens [t0, t1),
// keys [max(lo, k0), min(hi, k1)).  Rows of head hh: hh * R4 + tt * G + g, R4 = rows rounded up to 4.
template <DType KV>
void run_item_decode(const AttnKernelParams& P, const AttnWorkItem& it) {
  const PagedAttentionArgs& a = *P.args;
  const detail::AttnDims& d = *P.dims;
  const detail::ResolvedBatch& b = *P.batch;
  constexpr int64_t es = kv_elem_size<KV>();
  const int64_t D = d.head_dim, G = d.num_qo_heads / d.num_kv_heads, ps = d.page_size;
  const int64_t nh = it.num_kv_heads, nt = it.t1 - it.t0, R = nt * G, R4 = (R + 3) / 4 * 4, rows = nh * R4;
  const int64_t kv_len = b.kv_len[it.req];
  const int64_t* pages = b.pages.data() + b.page_begin[it.req];
  const AttnScratch W = attention_scratch(rows, nt, D, 1);
  for (int64_t i = 0; i < rows * D; ++i) W.acc[i] = 0.f;
  for (int64_t r = 0; r < rows; ++r) { W.m[r] = -INFINITY; W.l[r] = 0.f; }
  int64_t jlo = kv_len, jhi = 0;
  const int64_t qes = dtype_size(P.q_dtype);
#ifdef kvattn_dpbf16_8
  const bool dp = KV == DType::bf16 && P.q_dtype == DType::bf16 && D % 16 == 0;
#else
  constexpr bool dp = false;
#endif
  uint16_t* const qb = reinterpret_cast<uint16_t*>(W.q);  // bf16 queries when dp
  int64_t rlo[kDecodeMaxRows + 4], rhi[kDecodeMaxRows + 4];
  for (int64_t r = 0; r < R4; ++r) { rlo[r] = 0; rhi[r] = 0; }
  for (int64_t tt = 0; tt < nt; ++tt) {
    const int64_t t = it.t0 + tt;
    const detail::RowMask mask = detail::make_row_mask(a, b, it.req, t);
    const int64_t lo = max_(mask.lo(), it.k0), hi = min_(mask.hi(), it.k1);
    if (hi > lo) { jlo = min_(jlo, lo); jhi = max_(jhi, hi); }
    for (int64_t g = 0; g < G; ++g) { rlo[tt * G + g] = lo; rhi[tt * G + g] = hi; }
    for (int64_t hh = 0; hh < nh; ++hh)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = (it.kv_head + hh) * G + g;
        const char* qp = P.q + (t * P.q_st[0] + h * P.q_st[1]) * qes;
        if (dp) {  // raw bf16 bits, unscaled (exact)
          uint16_t* qd = qb + (hh * R4 + tt * G + g) * D;
          for (int64_t i = 0; i < D; ++i) __builtin_memcpy(qd + i, qp + i * P.q_st[2] * 2, 2);
          continue;
        }
        float* qd = W.q + (hh * R4 + tt * G + g) * D;
        for (int64_t i = 0; i < D; ++i) qd[i] = load_elem(qp + i * P.q_st[2] * qes, P.q_dtype) * P.scale;
      }
  }
  for (int64_t hh = 0; hh < nh; ++hh)  // padding rows: zero queries (their scores are masked)
    for (int64_t r = R; r < R4; ++r)
      for (int64_t i = 0; i < D; ++i) {
        if (dp) qb[(hh * R4 + r) * D + i] = 0;
        else W.q[(hh * R4 + r) * D + i] = 0.f;
      }

  // Element offsets of the block's K and V rows (head kv_head), this block and the next.
  int64_t koff[2][kDecodeBlock], voff[2][kDecodeBlock];
  const auto offsets = [&](int64_t j0, int64_t nk, int64_t* ko, int64_t* vo) {
    int64_t pi = j0 / ps, slot = j0 % ps;
    for (int64_t jj = 0; jj < nk; ++jj) {
      const int64_t page = pages[pi];
      ko[jj] = page * P.k_st[0] + slot * P.k_st[1];
      vo[jj] = page * P.v_st[0] + slot * P.v_st[1];
      if (++slot == ps) { slot = 0; ++pi; }
    }
  };
  alignas(32) float s[kDecodeMaxRows / 4][(kDecodeBlock + 4) * 4];  // + padding keys
  float alpha[kDecodeMaxRows];
  bool live[kDecodeMaxRows / 4];
  const char* kp[kDecodeBlock];
  const char* vp[kDecodeBlock];
  // Rows of a later (block, head) unit, prefetched while this one's scores are computed:
  // pages are scattered and a head's rows are strided, so the hardware prefetcher sees only
  // short runs; spreading the prefetches over the dot products keeps misses in flight
  // without stalling on a burst.
  const char* pf[2 * kDecodeBlock];
  int64_t npf = 0;
  const int64_t row_lines = (D * es + 63) / 64;
  const auto set_unit = [&](const int64_t* ko, const int64_t* vo, int64_t nk, int64_t head, const char** k_rows,
                            const char** v_rows) {
    const int64_t kh = head * P.k_st[2], vh = head * P.v_st[2];
    for (int64_t jj = 0; jj < nk; ++jj) {
      k_rows[jj] = P.k + (ko[jj] + kh) * es;
      v_rows[jj] = P.v + (vo[jj] + vh) * es;
    }
  };
  // Prefetch distance in (block, head) units: two when the item has several heads (measured
  // on the 2-core Zen 4 VM: 20% less CPU time per call than one; neutral on the Xeon).
  const int64_t pf_dist = min_<int64_t>(nh, 2);
  const int64_t nq = R4 / 4;
  if (jlo < jhi) offsets(jlo, min_(kDecodeBlock, jhi - jlo), koff[0], voff[0]);
  int cur = 0;
  for (int64_t j0 = jlo; j0 < jhi; j0 += kDecodeBlock, cur ^= 1) {
    const int64_t nk = min_(kDecodeBlock, jhi - j0);
    const int64_t j1 = j0 + kDecodeBlock, nk1 = j1 < jhi ? min_(kDecodeBlock, jhi - j1) : 0;
    if (nk1 > 0) offsets(j1, nk1, koff[cur ^ 1], voff[cur ^ 1]);
    for (int64_t hh = 0; hh < nh; ++hh) {
      set_unit(koff[cur], voff[cur], nk, it.kv_head + hh, kp, vp);
      const int64_t ahead = hh + pf_dist;  // unit to prefetch: this block or the next
      if (ahead < nh) {
        set_unit(koff[cur], voff[cur], nk, it.kv_head + ahead, pf, pf + nk);
        npf = nk;
      } else {
        set_unit(koff[cur ^ 1], voff[cur ^ 1], nk1, it.kv_head + ahead - nh, pf, pf + nk1);
        npf = nk1;
      }
      for (int64_t qd = 0; qd < nq; ++qd) {
        const int64_t r0 = qd * 4, nr = min_<int64_t>(4, R - r0);
        const float* q = W.q + (hh * R4 + r0) * D;
        float* sq = s[qd];
        const char* const* pfk = qd == 0 ? pf : nullptr;  // prefetch during the first pass only
#ifdef kvattn_dpbf16_8
        if (dp) {
          const uint16_t* q16 = qb + (hh * R4 + r0) * D;
          if (nr >= 3) decode_scores_dpbf16<4>(q16, D, kp, nk, sq, pfk, npf, row_lines, P.scale);
          else if (nr == 2) decode_scores_dpbf16<2>(q16, D, kp, nk, sq, pfk, npf, row_lines, P.scale);
          else decode_scores_dpbf16<1>(q16, D, kp, nk, sq, pfk, npf, row_lines, P.scale);
        } else
#endif
        if (nr >= 3) decode_scores<KV, 4>(q, D, kp, nk, sq, pfk, npf, row_lines);
        else if (nr == 2) decode_scores<KV, 2>(q, D, kp, nk, sq, pfk, npf, row_lines);
        else decode_scores<KV, 1>(q, D, kp, nk, sq, pfk, npf, row_lines);
        for (int64_t r = 0; r < 4; ++r) {
          if (r >= nr) {
            for (int64_t jj = 0; jj < nk; ++jj) sq[jj * 4 + r] = -INFINITY;
            continue;
          }
          if (P.cap > 0.f)
            for (int64_t jj = 0; jj < nk; ++jj) sq[jj * 4 + r] = P.cap * std::tanh(sq[jj * 4 + r] / P.cap);
          const int64_t lo = rlo[r0 + r], hi = rhi[r0 + r];
          if (lo > j0 || hi < j0 + nk)
            for (int64_t jj = 0; jj < nk; ++jj)
              if (j0 + jj < lo || j0 + jj >= hi) sq[jj * 4 + r] = -INFINITY;
        }
        live[qd] = decode_softmax(sq, nk, W.m + hh * R4 + r0, W.l + hh * R4 + r0, alpha + r0);
      }
      for (int64_t qd = 0; qd < nq; ++qd) {
        const int64_t r0 = qd * 4, nr = min_<int64_t>(4, R - r0);
        float* acc = W.acc + (hh * R4 + r0) * D;
        if (!live[qd]) continue;  // all probabilities zero and alpha = 1 (nothing seen yet or masked)
        if (nr >= 3) decode_pv<KV, 4>(acc, D, alpha + r0, s[qd], vp, nk);
        else if (nr == 2) decode_pv<KV, 2>(acc, D, alpha + r0, s[qd], vp, nk);
        else decode_pv<KV, 1>(acc, D, alpha + r0, s[qd], vp, nk);
      }
    }
  }
  if (it.part < 0) {
    finish_rows(P, it, W.acc, W.m, W.l, R4);
    return;
  }
  // Split-KV: hand the unnormalised state to the merge.
  float* dst = P.parts + it.part * P.part_stride;
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t src = hh * R4 + r, o = hh * R + r;
      for (int64_t i = 0; i < D; ++i) dst[o * D + i] = W.acc[src * D + i];
      dst[nh * R * D + o] = W.m[src];
      dst[nh * R * D + nh * R + o] = W.l[src];
    }
}

// A merge item: combines partial slots [part, part + num_parts) (same heads and rows) into the
// state of the whole key range, then the usual epilogue.
inline void merge_item(const AttnKernelParams& P, const AttnWorkItem& it) {
  const detail::AttnDims& d = *P.dims;
  const int64_t D = d.head_dim, G = d.num_qo_heads / d.num_kv_heads;
  const int64_t nh = it.num_kv_heads, R = (it.t1 - it.t0) * G, rows = nh * R;
  const int64_t pf = P.part_stride;
  const AttnScratch W = attention_scratch(rows, it.t1 - it.t0, D, 1);
  for (int64_t row = 0; row < rows; ++row) {
    float m = -INFINITY;
    for (int32_t k = 0; k < it.num_parts; ++k) m = max_(m, P.parts[(it.part + k) * pf + rows * D + row]);
    float l = 0.f;
    float* acc = W.acc + row * D;
    for (int64_t i = 0; i < D; ++i) acc[i] = 0.f;
    if (m != -INFINITY)
      for (int32_t k = 0; k < it.num_parts; ++k) {
        const float* src = P.parts + (it.part + k) * pf;
        const float mk = src[rows * D + row];
        if (mk == -INFINITY) continue;
        const float w = std::exp(mk - m);
        l += w * src[rows * D + rows + row];
        for (int64_t i = 0; i < D; ++i) acc[i] += w * src[row * D + i];
      }
    W.m[row] = m;
    W.l[row] = l;
  }
  finish_rows(P, it, W.acc, W.m, W.l, R);
}

}  // namespace

void KVATTN_KERNEL_ENTRY(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  const int64_t G = p.dims->num_qo_heads / p.dims->num_kv_heads;
  for (int64_t i = 0; i < n; ++i) {
    if (p.decode && (items[i].t1 - items[i].t0) * G <= kDecodeMaxRows) {
      switch (p.kv_dtype) {
        case DType::f32: run_item_decode<DType::f32>(p, items[i]); break;
        case DType::f16: run_item_decode<DType::f16>(p, items[i]); break;
        case DType::bf16: run_item_decode<DType::bf16>(p, items[i]); break;
        case DType::fp8_e4m3: run_item_decode<DType::fp8_e4m3>(p, items[i]); break;
        case DType::fp8_e5m2: run_item_decode<DType::fp8_e5m2>(p, items[i]); break;
        default: throw InternalError("paged_attention: unexpected KV dtype");
      }
      continue;
    }
    switch (p.kv_dtype) {
      case DType::f32: run_item<DType::f32>(p, items[i]); break;
      case DType::f16: run_item<DType::f16>(p, items[i]); break;
      case DType::bf16: run_item<DType::bf16>(p, items[i]); break;
      case DType::fp8_e4m3: run_item<DType::fp8_e4m3>(p, items[i]); break;
      case DType::fp8_e5m2: run_item<DType::fp8_e5m2>(p, items[i]); break;
      default: throw InternalError("paged_attention: unexpected KV dtype");
    }
  }
}

void KVATTN_MERGE_ENTRY(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  for (int64_t i = 0; i < n; ++i) merge_item(p, items[i]);
}
