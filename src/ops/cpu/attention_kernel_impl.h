// src/ops/cpu/attention_kernel_impl.h — the tiled online-softmax attention kernel.
//
// Included by attention_generic.cpp and attention_avx2.cpp (the latter under
// `#pragma GCC target("avx2,fma,f16c")`), each of which defines, before including:
//   KVATTN_KERNEL_ENTRY  the name of the entry function (attention_items_<isa>)
//   kvattn_fma8(a,b,c)   a * b + c on v8f
//   kvattn_cvt_f16_8(p)  8 f16 values at p -> v8f
// One work item = (request, KV head, a tile of query rows): the query rows of all the KV
// head's query heads form a [rows, D] f32 block; keys are processed `key_tile` at a time:
// K rows are converted to f32 once per tile and reused by every query row (GQA), then the
// online softmax (running max m, running sum l, accumulator acc) folds the tile in.
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
  // Epilogue: sinks, normalisation, v_scale, LSE.
  const int64_t osz = dtype_size(P.o_dtype);
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t tt = 0; tt < nt; ++tt) {
      const int64_t t = it.t0 + tt;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = (hh * nt + tt) * G + g, h = (it.kv_head + hh) * G + g;
        float m = W.m[row], l = W.l[row];
        float* acc = W.acc + row * D;
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

}  // namespace

void KVATTN_KERNEL_ENTRY(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
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
