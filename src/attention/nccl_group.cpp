// src/attention/nccl_group.cpp — NcclDcpGroup: the DCP collectives over NCCL, one rank per
// GPU of this process.  Compiled with NCCL when CMake finds it (KVATTN_WITH_NCCL); otherwise
// the class says it is not available.
//
// Collectives along a dimension other than 0 are NCCL collectives on a "rank-major" buffer:
// the tensor viewed as [..., W, n, ...] and permuted to [W, ..., n, ...] (ops::copy_ does the
// strided copy on the GPU), so that rank j's part is one contiguous chunk.
#include <fmt/format.h>

#include "kvattn/attention/communicator.h"
#include "kvattn/core/error.h"

#if KVATTN_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/ops/dcp_combine.h"
#endif

namespace kvattn {

#if KVATTN_WITH_NCCL

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  throw InternalError(fmt::format("{}: NCCL error {} ({}); NCCL_DEBUG=INFO shows NCCL's own log", what,
                                  static_cast<int>(r), ncclGetErrorString(r)));
}

ncclDataType_t nccl_type(DType t, bool reduce, const char* what) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: if (!reduce) return ncclInt32; break;
    case DType::i64: if (!reduce) return ncclInt64; break;
    default:
      if (!reduce && dtype_size(t) == 1) return ncclUint8;  // uint8, int8, fp8 codes: moved as bytes
      break;
  }
  throw Unsupported(fmt::format("{}: NCCL {} of dtype {} is not supported; valid: {}", what,
                                reduce ? "reduction" : "transfer", dtype_name(t),
                                reduce ? "f32, f16, bf16" : "f32, f16, bf16, int32, int64, 1-byte dtypes"));
}

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
    cur_ = device;
  }
  ~DeviceScope() {
    if (prev_ != cur_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0, cur_ = 0;
};

int wrap(int dim, int n) { return dim < 0 ? dim + n : dim; }

// `t` ([.., W*n at dim, ..]) as the strided view [W, .., n, ..] (no copy).
Tensor rank_major_view(const Tensor& t, int dim, int64_t W) {
  Dims shape{W}, strides{t.stride(dim) * (t.size(dim) / W)};
  for (int d = 0; d < t.dim(); ++d) {
    shape.push_back(d == dim ? t.size(d) / W : t.size(d));
    strides.push_back(t.stride(d));
  }
  return t.as_strided(shape, strides);
}

Tensor contiguous_copy(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  ops::copy_(c, t);
  return c;
}

}  // namespace

// What the ranks share with NcclDcpGroup::abort(): collectives enqueue under the shared lock
// and refuse to start once `aborted` is set; abort() takes the lock exclusively, so no comm is
// aborted (and freed) while a rank is inside an NCCL call on it.
struct AbortState {
  std::shared_mutex mu;
  std::atomic<bool> aborted{false};
};

class NcclRank final : public DcpCommunicator {
 public:
  NcclRank(ncclComm_t comm, int64_t world, int64_t rank, int device, AbortState& abort)
      : comm_(comm), world_(world), rank_(rank), device_(device), abort_(abort) {}
  int64_t world_size() const override { return world_; }
  int64_t rank() const override { return rank_; }
  const char* transport() const noexcept override { return "nccl"; }

  Tensor all_gather(const Tensor& t, int dim) override {
    dim = check(t, dim, "all_gather", false);
    DeviceScope ds(device_);
    const Tensor src = contiguous_copy(t);
    Dims gathered = t.shape();
    gathered.insert(0, world_);
    Tensor recv = Tensor::empty(gathered, t.dtype(), t.device());  // [W, ...t]
    {
      auto lock = enter("all_gather");
      nccl_check(ncclAllGather(src.data(), recv.data(), static_cast<size_t>(src.numel()),
                               nccl_type(t.dtype(), false, "all_gather"), comm_, nullptr),
                 "ncclAllGather");
    }
    Dims shape = t.shape();
    shape[dim] *= world_;
    if (dim == 0) return recv.view(shape);
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    ops::copy_(rank_major_view(out, dim, world_), recv);
    return out;
  }

  Tensor reduce_scatter(const Tensor& t, int dim) override {
    dim = check(t, dim, "reduce_scatter", true);
    DeviceScope ds(device_);
    Tensor packed = dim == 0 ? contiguous_copy(t) : contiguous_copy(rank_major_view(t, dim, world_));
    Dims shape = t.shape();
    shape[dim] /= world_;
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    auto lock = enter("reduce_scatter");
    nccl_check(ncclReduceScatter(packed.data(), out.data(), static_cast<size_t>(out.numel()),
                                 nccl_type(t.dtype(), true, "reduce_scatter"), ncclSum, comm_, nullptr),
               "ncclReduceScatter");
    return out;
  }

  Tensor all_to_all(const Tensor& t, int dim) override {
    dim = check(t, dim, "all_to_all", true);
    DeviceScope ds(device_);
    Tensor packed = contiguous_copy(rank_major_view(t, dim, world_));  // [W, .., n, ..]
    Tensor recv = Tensor::empty(packed.shape(), t.dtype(), t.device());
    const int64_t chunk = packed.numel() / world_;
    const size_t bytes = static_cast<size_t>(chunk * t.element_size());
    const ncclDataType_t type = nccl_type(t.dtype(), false, "all_to_all");
    auto lock = enter("all_to_all");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int64_t p = 0; p < world_; ++p) {
      nccl_check(ncclSend(static_cast<const char*>(packed.data()) + p * bytes, static_cast<size_t>(chunk), type,
                          static_cast<int>(p), comm_, nullptr),
                 "ncclSend");
      nccl_check(ncclRecv(static_cast<char*>(recv.data()) + p * bytes, static_cast<size_t>(chunk), type,
                          static_cast<int>(p), comm_, nullptr),
                 "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return recv;
  }

 private:
  // Held while NCCL calls are enqueued on comm_; throws once the group was aborted.
  std::shared_lock<std::shared_mutex> enter(const char* what) const {
    std::shared_lock<std::shared_mutex> lock(abort_.mu);
    if (abort_.aborted.load(std::memory_order_acquire))
      throw InternalError(fmt::format("DCP {} abandoned: another rank of the NCCL group failed and aborted the "
                                      "group (its error is the one to read)", what));
    return lock;
  }

  int check(const Tensor& t, int dim, const char* what, bool divisible) const {
    dim = wrap(dim, t.dim());
    KVATTN_CHECK(dim >= 0 && dim < t.dim(), "{}: dim {} out of range for {}", what, dim, t.str());
    KVATTN_CHECK(t.device() == Device::cuda(device_),
                 "{}: NCCL rank {} runs on cuda:{} but got a tensor on {}; move it to the rank's GPU", what, rank_,
                 device_, t.device().str());
    KVATTN_CHECK(!divisible || t.size(dim) % world_ == 0, "{}: dim {} of {} must divide by the world size {}", what,
                 dim, t.str(), world_);
    return dim;
  }

  ncclComm_t comm_;
  int64_t world_, rank_;
  int device_;
  AbortState& abort_;
};

struct NcclDcpGroup::Impl {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<NcclRank>> ranks;
  AbortState abort;
};

bool NcclDcpGroup::available() noexcept { return true; }

NcclDcpGroup::NcclDcpGroup(const std::vector<int>& devices) : impl_(std::make_unique<Impl>()) {
  const int n = cuda::device_count();
  KVATTN_CHECK(!devices.empty(), "NcclDcpGroup: needs at least one device");
  for (size_t i = 0; i < devices.size(); ++i) {
    KVATTN_CHECK(devices[i] >= 0 && devices[i] < n, "NcclDcpGroup: device {} does not exist; this machine has {} CUDA "
                 "device(s) (cuda:0..cuda:{})", devices[i], n, n - 1);
    for (size_t j = 0; j < i; ++j)
      KVATTN_CHECK(devices[i] != devices[j], "NcclDcpGroup: device {} listed twice; NCCL needs one GPU per rank",
                   devices[i]);
  }
  impl_->devices = devices;
  impl_->comms.resize(devices.size());
  nccl_check(ncclCommInitAll(impl_->comms.data(), static_cast<int>(devices.size()), devices.data()),
             "ncclCommInitAll");
  for (size_t r = 0; r < devices.size(); ++r)
    impl_->ranks.push_back(std::make_unique<NcclRank>(impl_->comms[r], static_cast<int64_t>(devices.size()),
                                                      static_cast<int64_t>(r), devices[r], impl_->abort));
}

void NcclDcpGroup::abort() noexcept {
  std::unique_lock<std::shared_mutex> lock(impl_->abort.mu);
  if (impl_->abort.aborted.exchange(true)) return;
  // ncclCommAbort stops the group's kernels still waiting for the failed rank (their streams
  // drain, so peers blocked in a device synchronisation return) and frees the comms.
  for (size_t r = 0; r < impl_->comms.size(); ++r) {
    DeviceScope ds(impl_->devices[r]);
    (void)ncclCommAbort(impl_->comms[r]);
  }
}

NcclDcpGroup::~NcclDcpGroup() {
  if (!impl_ || impl_->abort.aborted.load()) return;  // abort() already released the comms
  for (size_t r = 0; r < impl_->comms.size(); ++r) {
    DeviceScope ds(impl_->devices[r]);
    (void)cudaDeviceSynchronize();
    (void)ncclCommDestroy(impl_->comms[r]);
  }
}

int64_t NcclDcpGroup::world_size() const noexcept { return static_cast<int64_t>(impl_->devices.size()); }

DcpCommunicator& NcclDcpGroup::communicator(int64_t rank) {
  KVATTN_CHECK(rank >= 0 && rank < world_size(), "NcclDcpGroup: rank {} out of range [0, {})", rank, world_size());
  return *impl_->ranks[static_cast<size_t>(rank)];
}

std::string NcclDcpGroup::describe() const {
  int v = 0;
  ncclGetVersion(&v);
  std::string s = fmt::format("NCCL {}.{}.{}, {} ranks on", v / 10000, (v / 100) % 100, v % 100, world_size());
  for (int d : impl_->devices) s += fmt::format(" cuda:{}", d);
  return s;
}

#else  // no NCCL in this build

struct NcclDcpGroup::Impl {};

bool NcclDcpGroup::available() noexcept { return false; }

NcclDcpGroup::NcclDcpGroup(const std::vector<int>&) {
  throw Unsupported(
      "NcclDcpGroup: kvattn was built without NCCL; rebuild with CUDA and NCCL (CMake finds nccl.h and libnccl "
      "in the CUDA toolkit, or set NCCL_ROOT), or use InProcessDcpGroup");
}
NcclDcpGroup::~NcclDcpGroup() = default;
void NcclDcpGroup::abort() noexcept {}
int64_t NcclDcpGroup::world_size() const noexcept { return 0; }
DcpCommunicator& NcclDcpGroup::communicator(int64_t) { throw Unsupported("NcclDcpGroup: built without NCCL"); }
std::string NcclDcpGroup::describe() const { return "NCCL not built"; }

#endif

}  // namespace kvattn
