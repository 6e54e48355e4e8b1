// src/attention/dcp_communicator.cpp — the in-process DCP group and the cross-rank combines.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "kvattn/attention/communicator.h"
#include "kvattn/core/error.h"

namespace kvattn {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Tensor as_f32_contiguous(const Tensor& t) {
  if (!t.device().is_cpu())
    throw Unsupported(fmt::format("DCP combine: the in-process group works on CPU tensors, got {}; a device "
                                  "communicator (NCCL) is not implemented",
                                  t.device().str()));
  Tensor c = t.dtype() == DType::f32 ? t.contiguous() : t.to(DType::f32).contiguous();
  return c;
}

int wrap(int dim, int n) { return dim < 0 ? dim + n : dim; }

}  // namespace

class InProcessDcpGroup::Rank final : public DcpCommunicator {
 public:
  Rank(InProcessDcpGroup& g, int64_t rank) : g_(g), rank_(rank) {}
  int64_t world_size() const override { return g_.world_size_; }
  int64_t rank() const override { return rank_; }

  Tensor all_gather(const Tensor& t, int dim) override {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim(), "all_gather: dim {} out of range for {}", dim, t.str());
    g_.slots_[rank_] = t.contiguous();
    g_.barrier_.arrive_and_wait();
    Dims shape = t.shape();
    const int64_t n = shape[dim];
    for (int64_t r = 0; r < g_.world_size_; ++r)
      KVATTN_CHECK(g_.slots_[r].shape() == t.shape() && g_.slots_[r].dtype() == t.dtype(),
                   "all_gather: rank {} contributed {}, rank {} {}", r, g_.slots_[r].str(), rank_, t.str());
    shape[dim] = n * g_.world_size_;
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    for (int64_t r = 0; r < g_.world_size_; ++r) out.narrow(dim, r * n, n).copy_from(g_.slots_[r]);
    g_.barrier_.arrive_and_wait();
    return out;
  }

  Tensor reduce_scatter(const Tensor& t, int dim) override {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim() && t.size(dim) % g_.world_size_ == 0,
                 "reduce_scatter: dim {} of {} must exist and divide by the world size {}", dim, t.str(),
                 g_.world_size_);
    g_.slots_[rank_] = as_f32_contiguous(t);
    g_.barrier_.arrive_and_wait();
    const int64_t n = t.size(dim) / g_.world_size_;
    Dims shape = t.shape();
    shape[dim] = n;
    Tensor acc = Tensor::zeros(shape, DType::f32);
    float* a = acc.data_ptr<float>();
    for (int64_t r = 0; r < g_.world_size_; ++r) {
      Tensor part = g_.slots_[r].narrow(dim, rank_ * n, n).contiguous();
      const float* p = part.data_ptr<float>();
      for (int64_t i = 0; i < acc.numel(); ++i) a[i] += p[i];
    }
    g_.barrier_.arrive_and_wait();
    return t.dtype() == DType::f32 ? acc : acc.to(t.dtype());
  }

  Tensor all_to_all(const Tensor& t, int dim) override {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim() && t.size(dim) % g_.world_size_ == 0,
                 "all_to_all: dim {} of {} must exist and divide by the world size {}", dim, t.str(),
                 g_.world_size_);
    g_.slots_[rank_] = t.contiguous();
    g_.barrier_.arrive_and_wait();
    const int64_t n = t.size(dim) / g_.world_size_;
    Dims shape = t.shape();
    shape[dim] = n;
    shape.insert(0, g_.world_size_);
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    for (int64_t r = 0; r < g_.world_size_; ++r) out.select(0, r).copy_from(g_.slots_[r].narrow(dim, rank_ * n, n));
    g_.barrier_.arrive_and_wait();
    return out;
  }

 private:
  InProcessDcpGroup& g_;
  int64_t rank_;
};

InProcessDcpGroup::InProcessDcpGroup(int64_t world_size)
    : world_size_(world_size), slots_(static_cast<size_t>(world_size > 0 ? world_size : 1)),
      barrier_(static_cast<std::ptrdiff_t>(world_size > 0 ? world_size : 1)) {
  KVATTN_CHECK(world_size >= 1 && world_size <= 64, "InProcessDcpGroup: world_size {} must be in [1, 64]",
               world_size);
  for (int64_t r = 0; r < world_size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

InProcessDcpGroup::~InProcessDcpGroup() = default;

DcpCommunicator& InProcessDcpGroup::communicator(int64_t rank) {
  KVATTN_CHECK(rank >= 0 && rank < world_size_, "InProcessDcpGroup: rank {} out of range [0, {})", rank,
               world_size_);
  return *ranks_[static_cast<size_t>(rank)];
}

// ---------------------------------------------------------------------------------------
namespace {

void check_combine_args(const Tensor& out, const Tensor& lse, const DcpCommunicator& g, const char* who) {
  KVATTN_CHECK(out.dim() == 3 && lse.dim() == 2 && lse.size(0) == out.size(0) && lse.size(1) == out.size(1),
               "{}: cp_attn_out must be [T, W*H, D] and cp_attn_lse [T, W*H]; got {} and {}", who, out.str(),
               lse.str());
  KVATTN_CHECK(lse.dtype() == DType::f32, "{}: cp_attn_lse must be float32, got {}", who, dtype_name(lse.dtype()));
  KVATTN_CHECK(out.size(1) % g.world_size() == 0, "{}: {} heads do not divide over {} DCP ranks", who, out.size(1),
               g.world_size());
}

inline float lse_exp(float x, bool base_e) { return base_e ? std::exp(x) : std::exp2(x); }
inline float lse_log(float x, bool base_e) { return base_e ? std::log(x) : std::log2(x); }

// Global LSE over `w` values at stride `stride` from `p`.
inline float global_lse(const float* p, int64_t w, int64_t stride, bool base_e) {
  float m = kNegInf;
  for (int64_t r = 0; r < w; ++r) {
    float v = p[r * stride];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) v = kNegInf;
    m = std::max(m, v);
  }
  if (m == kNegInf) return kNegInf;
  float s = 0.f;
  for (int64_t r = 0; r < w; ++r) {
    const float v = p[r * stride];
    if (!(std::isnan(v) || std::isinf(v))) s += lse_exp(v - m, base_e);
  }
  return m + lse_log(s, base_e);
}

}  // namespace

Tensor cp_lse_ag_out_rs(const Tensor& cp_attn_out, const Tensor& cp_attn_lse, DcpCommunicator& group,
                        bool is_lse_base_on_e, Tensor* lse_out) {
  check_combine_args(cp_attn_out, cp_attn_lse, group, "cp_lse_ag_out_rs");
  const int64_t W = group.world_size(), T = cp_attn_out.size(0), WH = cp_attn_out.size(1), D = cp_attn_out.size(2);
  const int64_t H = WH / W, rank = group.rank();
  Tensor lses = group.all_gather(cp_attn_lse.contiguous().unsqueeze(0), 0);  // [W, T, WH]
  const float* L = lses.data_ptr<float>();
  Tensor corrected = as_f32_contiguous(cp_attn_out);
  if (corrected.storage() == cp_attn_out.storage()) corrected = corrected.clone();
  float* o = corrected.data_ptr<float>();
  Tensor global = Tensor::empty({T, WH}, DType::f32);
  float* G = global.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < WH; ++h) {
      const float g = global_lse(L + t * WH + h, W, T * WH, is_lse_base_on_e);
      G[t * WH + h] = g;
      const float mine = L[rank * T * WH + t * WH + h];
      const float f = (g == kNegInf || std::isinf(mine) || std::isnan(mine)) ? 0.f : lse_exp(mine - g, is_lse_base_on_e);
      float* row = o + (t * WH + h) * D;
      for (int64_t d = 0; d < D; ++d) row[d] *= f;
    }
  Tensor out = group.reduce_scatter(corrected, 1);  // [T, H, D] f32
  if (lse_out) *lse_out = global.narrow(1, rank * H, H).contiguous();
  return cp_attn_out.dtype() == DType::f32 ? out : out.to(cp_attn_out.dtype());
}

Tensor dcp_a2a_lse_reduce(const Tensor& cp_attn_out, const Tensor& cp_attn_lse, DcpCommunicator& group,
                          bool is_lse_base_on_e, Tensor* lse_out) {
  check_combine_args(cp_attn_out, cp_attn_lse, group, "dcp_a2a_lse_reduce");
  const int64_t W = group.world_size(), T = cp_attn_out.size(0), WH = cp_attn_out.size(1), D = cp_attn_out.size(2);
  const int64_t H = WH / W;
  Tensor outs = group.all_to_all(as_f32_contiguous(cp_attn_out), 1);  // [W, T, H, D]
  Tensor lses = group.all_to_all(cp_attn_lse.contiguous(), 1);        // [W, T, H]
  const float* O = outs.data_ptr<float>();
  const float* L = lses.data_ptr<float>();
  Tensor out = Tensor::zeros({T, H, D}, DType::f32);
  Tensor global = Tensor::empty({T, H}, DType::f32);
  float* R = out.data_ptr<float>();
  float* G = global.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float g = global_lse(L + t * H + h, W, T * H, is_lse_base_on_e);
      G[t * H + h] = g;
      if (g == kNegInf) continue;
      float* row = R + (t * H + h) * D;
      for (int64_t r = 0; r < W; ++r) {
        const float l = L[r * T * H + t * H + h];
        if (std::isinf(l) || std::isnan(l)) continue;
        const float f = lse_exp(l - g, is_lse_base_on_e);
        const float* src = O + ((r * T + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) row[d] += f * src[d];
      }
    }
  if (lse_out) *lse_out = global;
  return cp_attn_out.dtype() == DType::f32 ? out : out.to(cp_attn_out.dtype());
}

}  // namespace kvattn
