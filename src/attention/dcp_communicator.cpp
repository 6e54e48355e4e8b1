// src/attention/dcp_communicator.cpp — the in-process DCP group and the cross-rank combines.
// (The NCCL group is in nccl_group.cpp.)
#include <fmt/format.h>

#include "kvattn/attention/communicator.h"
#include "kvattn/core/error.h"
#include "kvattn/ops/dcp_combine.h"

namespace kvattn {

namespace {

int wrap(int dim, int n) { return dim < 0 ? dim + n : dim; }

// A contiguous host copy (same dtype) of a CPU or CUDA tensor.
Tensor host_contiguous(const Tensor& t) {
  if (t.device().is_cpu()) return t.contiguous();
  Tensor dev = t;
  if (!t.is_contiguous()) {
    dev = Tensor::empty(t.shape(), t.dtype(), t.device());
    ops::copy_(dev, t);
  }
  return dev.to(Device::cpu());
}

Tensor to_device(const Tensor& host, Device device) { return device.is_cpu() ? host : host.to(device); }

}  // namespace

class InProcessDcpGroup::Rank final : public DcpCommunicator {
 public:
  Rank(InProcessDcpGroup& g, int64_t rank) : g_(g), rank_(rank) {}
  int64_t world_size() const override { return g_.world_size_; }
  int64_t rank() const override { return rank_; }
  const char* transport() const noexcept override { return "in-process"; }

  Tensor all_gather(const Tensor& t, int dim) override {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim(), "all_gather: dim {} out of range for {}", dim, t.str());
    g_.slots_[rank_] = host_contiguous(t);
    g_.sync();
    std::string mismatch;
    for (int64_t r = 0; r < g_.world_size_ && mismatch.empty(); ++r)
      if (g_.slots_[r].shape() != t.shape() || g_.slots_[r].dtype() != t.dtype())
        mismatch = fmt::format("all_gather: rank {} contributed {}, rank {} {}", r, g_.slots_[r].str(), rank_, t.str());
    Dims shape = t.shape();
    const int64_t n = shape[dim];
    shape[dim] = n * g_.world_size_;
    Tensor out = Tensor::empty(shape, t.dtype());
    if (mismatch.empty())
      for (int64_t r = 0; r < g_.world_size_; ++r) out.narrow(dim, r * n, n).copy_from(g_.slots_[r]);
    g_.sync();  // every rank has read every slot
    KVATTN_CHECK(mismatch.empty(), "{}", mismatch);
    return to_device(out, t.device());
  }

  Tensor reduce_scatter(const Tensor& t, int dim) override {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim() && t.size(dim) % g_.world_size_ == 0,
                 "reduce_scatter: dim {} of {} must exist and divide by the world size {}", dim, t.str(),
                 g_.world_size_);
    KVATTN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16,
                 "reduce_scatter: float tensors only (f32, f16, bf16), got {}", dtype_name(t.dtype()));
    Tensor mine = host_contiguous(t);
    g_.slots_[rank_] = mine.dtype() == DType::f32 ? mine : mine.to(DType::f32);
    g_.sync();
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
    g_.sync();
    return to_device(t.dtype() == DType::f32 ? acc : acc.to(t.dtype()), t.device());
  }

  Tensor all_to_all(const Tensor& t, int dim) override {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim() && t.size(dim) % g_.world_size_ == 0,
                 "all_to_all: dim {} of {} must exist and divide by the world size {}", dim, t.str(),
                 g_.world_size_);
    g_.slots_[rank_] = host_contiguous(t);
    g_.sync();
    const int64_t n = t.size(dim) / g_.world_size_;
    Dims shape = t.shape();
    shape[dim] = n;
    shape.insert(0, g_.world_size_);
    Tensor out = Tensor::empty(shape, t.dtype());
    for (int64_t r = 0; r < g_.world_size_; ++r) out.select(0, r).copy_from(g_.slots_[r].narrow(dim, rank_ * n, n));
    g_.sync();
    return to_device(out, t.device());
  }

 private:
  InProcessDcpGroup& g_;
  int64_t rank_;
};

InProcessDcpGroup::InProcessDcpGroup(int64_t world_size)
    : world_size_(world_size), slots_(static_cast<size_t>(world_size > 0 ? world_size : 1)) {
  KVATTN_CHECK(world_size >= 1 && world_size <= 64, "InProcessDcpGroup: world_size {} must be in [1, 64]",
               world_size);
  for (int64_t r = 0; r < world_size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

InProcessDcpGroup::~InProcessDcpGroup() = default;

void InProcessDcpGroup::sync() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!aborted_) {
    const uint64_t gen = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ != gen) return;
  }
  throw InternalError("DCP collective abandoned: another rank of the in-process group failed (its error is the "
                      "one to read)");
}

void InProcessDcpGroup::abort() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

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
  KVATTN_CHECK(out.device() == lse.device(), "{}: cp_attn_out is on {} but cp_attn_lse on {}", who,
               out.device().str(), lse.device().str());
  KVATTN_CHECK(out.size(1) % g.world_size() == 0, "{}: {} heads do not divide over {} DCP ranks", who, out.size(1),
               g.world_size());
}

}  // namespace

Tensor cp_lse_ag_out_rs(const Tensor& cp_attn_out, const Tensor& cp_attn_lse, DcpCommunicator& group,
                        bool is_lse_base_on_e, Tensor* lse_out) {
  check_combine_args(cp_attn_out, cp_attn_lse, group, "cp_lse_ag_out_rs");
  const int64_t W = group.world_size(), T = cp_attn_out.size(0), WH = cp_attn_out.size(1), D = cp_attn_out.size(2);
  const int64_t H = WH / W, rank = group.rank();
  const Device dev = cp_attn_out.device();
  // Every rank's LSE -> this rank's weights; its weighted partial, packed by destination rank.
  Tensor lses = group.all_gather(cp_attn_lse.unsqueeze(0), 0);  // [W, T, WH]
  Tensor packed = Tensor::empty({W, T, H, D}, DType::f32, dev);
  Tensor global = lse_out ? Tensor::empty({T, WH}, DType::f32, dev) : Tensor();
  ops::dcp_lse_scale_pack(cp_attn_out, lses, rank, is_lse_base_on_e, packed, global);
  Tensor summed = group.reduce_scatter(packed, 0).select(0, 0);  // [T, H, D] f32
  if (lse_out) {
    *lse_out = Tensor::empty({T, H}, DType::f32, dev);
    ops::copy_(*lse_out, global.narrow(1, rank * H, H));
  }
  if (cp_attn_out.dtype() == DType::f32) return summed;
  Tensor out = Tensor::empty({T, H, D}, cp_attn_out.dtype(), dev);
  ops::copy_(out, summed);
  return out;
}

Tensor dcp_a2a_lse_reduce(const Tensor& cp_attn_out, const Tensor& cp_attn_lse, DcpCommunicator& group,
                          bool is_lse_base_on_e, Tensor* lse_out) {
  check_combine_args(cp_attn_out, cp_attn_lse, group, "dcp_a2a_lse_reduce");
  const int64_t W = group.world_size(), T = cp_attn_out.size(0), WH = cp_attn_out.size(1), D = cp_attn_out.size(2);
  const int64_t H = WH / W;
  const Device dev = cp_attn_out.device();
  Tensor outs = group.all_to_all(cp_attn_out, 1);  // [W, T, H, D]: every rank's partial of my heads
  Tensor lses = group.all_to_all(cp_attn_lse, 1);  // [W, T, H]
  Tensor out = Tensor::empty({T, H, D}, cp_attn_out.dtype(), dev);
  Tensor global = lse_out ? Tensor::empty({T, H}, DType::f32, dev) : Tensor();
  ops::dcp_lse_combine(outs, lses, is_lse_base_on_e, out, global);
  if (lse_out) *lse_out = global;
  return out;
}

}  // namespace kvattn
