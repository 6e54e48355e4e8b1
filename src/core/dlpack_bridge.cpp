#include "kvattn/core/dlpack_bridge.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <memory>

#include "kvattn/core/checked_math.h"

namespace kvattn {
namespace {

// DLPack 1.x codes for fp8 (dlpack 0.6, Debian 12's header, predates them).
constexpr uint8_t kCodeFloat8E4m3fn = 10;
constexpr uint8_t kCodeFloat8E5m2 = 12;

DLDataType to_dl_dtype(DType t) {
  DLDataType d{};
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(dtype_size(t) * 8);
  switch (t) {
    case DType::f32:
    case DType::f16: d.code = kDLFloat; break;
    case DType::bf16: d.code = kDLBfloat; break;
    case DType::fp8_e4m3: d.code = kCodeFloat8E4m3fn; break;
    case DType::fp8_e5m2: d.code = kCodeFloat8E5m2; break;
    case DType::u8: d.code = kDLUInt; break;
    case DType::i8:
    case DType::i32:
    case DType::i64: d.code = kDLInt; break;
  }
  return d;
}

DType from_dl_dtype(DLDataType d) {
  KVATTN_CHECK(d.lanes == 1, "DLPack tensors with {} lanes are not supported; only scalar lanes", d.lanes);
  const int code = d.code, bits = d.bits;
  if (code == kDLFloat && bits == 32) return DType::f32;
  if (code == kDLFloat && bits == 16) return DType::f16;
  if (code == kDLBfloat && bits == 16) return DType::bf16;
  if (code == kCodeFloat8E4m3fn && bits == 8) return DType::fp8_e4m3;
  if (code == kCodeFloat8E5m2 && bits == 8) return DType::fp8_e5m2;
  if (code == kDLUInt && bits == 8) return DType::u8;
  if (code == 6 /* kDLBool */ && bits == 8) return DType::u8;
  if (code == kDLInt && bits == 8) return DType::i8;
  if (code == kDLInt && bits == 32) return DType::i32;
  if (code == kDLInt && bits == 64) return DType::i64;
  throw Unsupported(fmt::format("DLPack dtype (code={}, bits={}) has no kvattn equivalent; valid: {}", code,
                                bits, valid_dtype_names()));
}

struct ExportContext {
  Tensor tensor;  // keeps storage alive
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  DLManagedTensor managed;
};

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  KVATTN_CHECK(t.defined(), "to_dlpack: undefined tensor");
  auto* ctx = new ExportContext{};
  ctx->tensor = t;
  for (int i = 0; i < t.dim(); ++i) {
    ctx->shape[i] = t.size(i);
    ctx->strides[i] = t.stride(i);
  }
  DLTensor& d = ctx->managed.dl_tensor;
  d.data = t.storage_data();
  d.byte_offset = static_cast<uint64_t>(t.byte_offset());
  d.ndim = t.dim();
  d.shape = ctx->shape;
  d.strides = ctx->strides;
  d.dtype = to_dl_dtype(t.dtype());
  d.device.device_type = t.device().is_cpu() ? kDLCPU : kDLCUDA;
  d.device.device_id = t.device().index;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); };
  return &ctx->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  KVATTN_CHECK(managed != nullptr, "from_dlpack: null DLManagedTensor");
  // Own the capsule from here on, so an exception below still releases it.
  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& d = managed->dl_tensor;
  Device dev;
  switch (d.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: dev = Device::cpu(); break;
    case kDLCUDA: dev = Device::cuda(d.device.device_id); break;
    default:
      throw Unsupported(fmt::format("DLPack device type {} is not supported; valid: CPU (1), CUDA (2), "
                                    "CUDAHost (3)", static_cast<int>(d.device.device_type)));
  }
  KVATTN_CHECK(d.ndim >= 0 && d.ndim <= kMaxDims, "from_dlpack: {} dimensions (kvattn supports up to {})",
               d.ndim, kMaxDims);
  const DType dtype = from_dl_dtype(d.dtype);
  Dims shape{std::span<const int64_t>(d.shape, static_cast<size_t>(d.ndim))};
  Dims strides = d.strides ? Dims{std::span<const int64_t>(d.strides, static_cast<size_t>(d.ndim))}
                           : contiguous_strides(shape);
  Tensor view = Tensor::from_blob(d.data, shape, strides, dtype, dev);
  // Size of the region the producer described, so bounds checks on later views work.  from_blob
  // has checked that the shape's element count and extent are representable; the offset is a
  // producer's uint64.
  const int64_t offset = checked_cast<int64_t>(d.byte_offset, "from_dlpack: byte_offset");
  int64_t hi = checked_add(offset, dtype_size(dtype), "from_dlpack: byte extent");
  for (int i = 0; i < d.ndim; ++i) {
    KVATTN_CHECK(strides[i] >= 0, "from_dlpack: negative stride {} in dimension {} is not supported",
                 strides[i], i);
    if (shape[i] > 0)
      hi = checked_add(hi, checked_mul((shape[i] - 1) * strides[i], dtype_size(dtype), "from_dlpack: byte extent"),
                       "from_dlpack: byte extent");
  }
  if (view.numel() == 0) hi = offset;
  auto buffer = Buffer::wrap(d.data, static_cast<size_t>(hi), dev, [owner] {});
  return Tensor::from_buffer(std::move(buffer), offset, shape, strides, dtype);
}

}  // namespace kvattn
