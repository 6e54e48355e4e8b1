#include "kvattn/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kvattn/core/checked_math.h"
#include "kvattn/core/cuda_runtime_api.h"

namespace kvattn {

// ---------------------------------------------------------------------------------------
// Dims

Dims::Dims(std::initializer_list<int64_t> v) : Dims(std::span<const int64_t>(v.begin(), v.size())) {}

Dims::Dims(std::span<const int64_t> v) {
  KVATTN_CHECK(v.size() <= static_cast<size_t>(kMaxDims),
               "tensors have at most {} dimensions, got {}", kMaxDims, v.size());
  n_ = static_cast<int>(v.size());
  std::copy(v.begin(), v.end(), d_.begin());
}

Dims Dims::filled(int n, int64_t value) {
  KVATTN_CHECK(n >= 0 && n <= kMaxDims, "tensors have at most {} dimensions, got {}", kMaxDims, n);
  Dims d;
  d.n_ = n;
  for (int i = 0; i < n; ++i) d.d_[static_cast<size_t>(i)] = value;
  return d;
}

void Dims::push_back(int64_t v) {
  KVATTN_CHECK(n_ < kMaxDims, "tensors have at most {} dimensions", kMaxDims);
  d_[static_cast<size_t>(n_++)] = v;
}

void Dims::erase(int i) {
  KVATTN_ASSERT(i >= 0 && i < n_, "Dims::erase index {} out of range {}", i, n_);
  for (int j = i; j + 1 < n_; ++j) d_[static_cast<size_t>(j)] = d_[static_cast<size_t>(j + 1)];
  --n_;
}

void Dims::insert(int i, int64_t v) {
  KVATTN_CHECK(n_ < kMaxDims, "tensors have at most {} dimensions", kMaxDims);
  KVATTN_ASSERT(i >= 0 && i <= n_, "Dims::insert index {} out of range {}", i, n_);
  for (int j = n_; j > i; --j) d_[static_cast<size_t>(j)] = d_[static_cast<size_t>(j - 1)];
  d_[static_cast<size_t>(i)] = v;
  ++n_;
}

int64_t Dims::product() const noexcept {
  int64_t p = 1;
  for (int i = 0; i < n_; ++i) p *= d_[static_cast<size_t>(i)];
  return p;
}

std::string Dims::str() const { return fmt::format("[{}]", fmt::join(span(), ", ")); }

bool operator==(const Dims& a, const Dims& b) noexcept {
  return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
}

Dims contiguous_strides(const Dims& shape) {
  Dims s = Dims::filled(shape.size(), 1);
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc = checked_mul(acc, std::max<int64_t>(shape[i], 1), "contiguous strides of a shape");
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// Factories

Tensor Tensor::empty(const Dims& shape, DType dtype, Device device) {
  for (int64_t s : shape)
    KVATTN_CHECK(s >= 0, "negative dimension {} in shape {}; sizes must be >= 0", s, shape.str());
  const int64_t bytes = checked_mul(checked_product(shape.span(), "Tensor::empty: element count of the shape"),
                                    dtype_size(dtype), "Tensor::empty: byte size (elements * element size)");
  auto buf = Buffer::allocate(static_cast<size_t>(bytes), device);
  return from_buffer(std::move(buf), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Dims& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    if (t.nbytes() > 0) std::memset(t.data(), 0, static_cast<size_t>(t.nbytes()));
  } else if (t.nbytes() > 0) {
    cuda::memset(t.data(), 0, static_cast<size_t>(t.nbytes()));
  }
  return t;
}

Tensor Tensor::from_blob(void* data, const Dims& shape, const Dims& strides, DType dtype, Device device) {
  KVATTN_CHECK(shape.size() == strides.size(), "from_blob: shape {} and strides {} differ in rank",
               shape.str(), strides.str());
  Tensor t;
  t.base_ = data;
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.device_ = device;
  t.check_in_bounds();  // no storage extent to compare with, but sizes and extent must be representable
  return t;
}

Tensor Tensor::from_blob(void* data, const Dims& shape, DType dtype, Device device) {
  return from_blob(data, shape, contiguous_strides(shape), dtype, device);
}

Tensor Tensor::from_buffer(std::shared_ptr<Buffer> buffer, int64_t byte_offset, const Dims& shape,
                           const Dims& strides, DType dtype) {
  KVATTN_CHECK(buffer != nullptr, "from_buffer: null buffer");
  KVATTN_CHECK(byte_offset >= 0, "from_buffer: negative byte offset {}; offsets are >= 0", byte_offset);
  KVATTN_CHECK(shape.size() == strides.size(), "from_buffer: shape {} and strides {} differ in rank",
               shape.str(), strides.str());
  Tensor t;
  t.base_ = buffer->data();
  t.device_ = buffer->device();
  t.storage_bytes_ = static_cast<int64_t>(buffer->size());
  t.storage_ = std::move(buffer);
  t.byte_offset_ = byte_offset;
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.check_in_bounds();
  return t;
}

// ---------------------------------------------------------------------------------------
// Properties

int Tensor::wrap_dim(int d, int ndim) const {
  const int w = d < 0 ? d + ndim : d;
  KVATTN_CHECK(w >= 0 && w < ndim, "dimension {} out of range for a {}-d tensor (valid: {}..{})", d,
               ndim, -ndim, ndim - 1);
  return w;
}

int64_t Tensor::size(int d) const { return shape_[wrap_dim(d, dim())]; }
int64_t Tensor::stride(int d) const { return strides_[wrap_dim(d, dim())]; }

bool Tensor::is_contiguous() const noexcept {
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (shape_[i] == 0) return true;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return fmt::format("Tensor(shape={}, strides={}, dtype={}, device={}, offset={})", shape_.str(),
                     strides_.str(), dtype_name(dtype_), device_.str(), byte_offset_);
}

void Tensor::check_dtype_is(DType t) const {
  KVATTN_CHECK(dtype_ == t, "tensor has dtype {} but {} was requested", dtype_name(dtype_), dtype_name(t));
}

void Tensor::check_cpu(const char* what) const {
  if (!device_.is_cpu())
    throw Unsupported(fmt::format("{} needs a CPU tensor, got one on {}; copy it with .to(cpu) first",
                                  what, device_.str()));
}

std::pair<int64_t, int64_t> Tensor::byte_extent() const noexcept {
  if (numel() == 0) return {0, 0};
  int64_t lo = byte_offset_, hi = byte_offset_;
  const int64_t es = element_size();
  for (int i = 0; i < dim(); ++i) {
    const int64_t span = (shape_[i] - 1) * strides_[i] * es;
    if (span < 0) lo += span; else hi += span;
  }
  return {lo, hi + es};
}

void Tensor::check_in_bounds() const {
  for (int i = 0; i < dim(); ++i)
    KVATTN_CHECK(shape_[i] >= 0, "negative size {} in dimension {} of shape {}", shape_[i], i, shape_.str());
  // Every size derived below must be representable: the element count, the byte size and the
  // byte extent (byte_extent() and numel() rely on this check having passed).  Views are made on
  // hot paths, so nothing is formatted (allocated) unless the check fails.
  bool overflow = false;
  int64_t n = 1;
  for (int i = 0; i < dim(); ++i) overflow |= __builtin_mul_overflow(n, shape_[i], &n);
  if (!overflow && n == 0) return;
  const int64_t es = element_size();
  int64_t lo = byte_offset_, hi = 0, total = 0;
  overflow |= __builtin_mul_overflow(n, es, &total);
  overflow |= __builtin_add_overflow(byte_offset_, es, &hi);
  for (int i = 0; i < dim() && !overflow; ++i) {
    int64_t span = 0;
    overflow |= __builtin_mul_overflow(shape_[i] - 1, strides_[i], &span);
    overflow |= __builtin_mul_overflow(span, es, &span);
    overflow |= span < 0 ? __builtin_add_overflow(lo, span, &lo) : __builtin_add_overflow(hi, span, &hi);
  }
  KVATTN_CHECK(!overflow,
               "view shape={} strides={} offset={} ({}): its element count or byte extent overflows a 64-bit "
               "integer; use smaller sizes and strides",
               shape_.str(), strides_.str(), byte_offset_, dtype_name(dtype_));
  if (storage_bytes_ < 0) return;
  KVATTN_CHECK(lo >= 0 && hi <= storage_bytes_,
               "view shape={} strides={} offset={} ({}) touches bytes [{}, {}) outside its storage of "
               "{} bytes; check the shape, strides and offset",
               shape_.str(), strides_.str(), byte_offset_, dtype_name(dtype_), lo, hi, storage_bytes_);
}

char* Tensor::element_address(const int64_t* idx, int n) const {
  KVATTN_CHECK(n == dim(), "expected {} indices for shape {}, got {}", dim(), shape_.str(), n);
  KVATTN_CHECK(data() != nullptr, "element access on a tensor without data");
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    int64_t j = idx[i] < 0 ? idx[i] + shape_[i] : idx[i];
    KVATTN_CHECK(j >= 0 && j < shape_[i], "index {} out of range for dimension {} of size {}", idx[i], i,
                 shape_[i]);
    off += j * strides_[i];
  }
  return static_cast<char*>(data()) + off * element_size();
}

// ---------------------------------------------------------------------------------------
// Views

Tensor Tensor::as_strided(const Dims& shape, const Dims& strides) const {
  return as_strided(shape, strides, byte_offset_ / std::max<int64_t>(element_size(), 1));
}

Tensor Tensor::as_strided(const Dims& shape, const Dims& strides, int64_t storage_offset) const {
  KVATTN_CHECK(shape.size() == strides.size(), "as_strided: shape {} and strides {} differ in rank",
               shape.str(), strides.str());
  KVATTN_CHECK(storage_offset >= 0, "as_strided: negative storage offset {}", storage_offset);
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = strides;
  t.byte_offset_ = checked_mul(storage_offset, element_size(), "as_strided: byte offset of the storage offset");
  t.check_in_bounds();
  return t;
}

Tensor Tensor::view(const Dims& shape_in) const {
  Dims shape = shape_in;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KVATTN_CHECK(infer < 0, "view: only one dimension can be -1, got {}", shape_in.str());
      infer = i;
    } else {
      KVATTN_CHECK(shape[i] >= 0, "view: invalid size {} in {}", shape[i], shape_in.str());
      known = checked_mul(known, shape[i], "view: element count of the new shape");
    }
  }
  if (infer >= 0) {
    KVATTN_CHECK(known != 0 && numel() % known == 0, "view: shape {} is invalid for {} elements",
                 shape_in.str(), numel());
    shape[infer] = numel() / known;
  }
  KVATTN_CHECK(checked_product(shape.span(), "view: element count of the new shape") == numel(),
               "view: shape {} is invalid for input of size {} (shape {})",
               shape.str(), numel(), shape_.str());
  // torch's computeStride: walk old dims from the back, grouping runs that are contiguous
  // with respect to each other, and give each new dim strides inside the current run.
  Dims new_strides = Dims::filled(shape.size(), 0);
  if (numel() == 0) {
    new_strides = contiguous_strides(shape);
  } else {
    int view_d = shape.size() - 1;
    int64_t chunk_base_stride = dim() > 0 ? strides_[dim() - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int tensor_d = dim() - 1; tensor_d >= 0; --tensor_d) {
      tensor_numel *= shape_[tensor_d];
      if (tensor_d == 0 ||
          (shape_[tensor_d - 1] != 1 && strides_[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
        while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
          new_strides[view_d] = view_numel * chunk_base_stride;
          view_numel *= shape[view_d];
          --view_d;
        }
        KVATTN_CHECK(view_numel == tensor_numel,
                     "view: shape {} is not compatible with the strides {} of shape {}; call "
                     "contiguous() first",
                     shape.str(), strides_.str(), shape_.str());
        if (tensor_d > 0) {
          chunk_base_stride = strides_[tensor_d - 1];
          tensor_numel = 1;
          view_numel = 1;
        }
      }
    }
    KVATTN_CHECK(view_d == -1, "view: shape {} is not compatible with shape {} strides {}", shape.str(),
                 shape_.str(), strides_.str());
  }
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = new_strides;
  return t;
}

Tensor Tensor::permute(const Dims& order) const {
  KVATTN_CHECK(order.size() == dim(), "permute: order {} has {} entries for a {}-d tensor", order.str(),
               order.size(), dim());
  Tensor t = *this;
  bool seen[kMaxDims] = {};
  for (int i = 0; i < dim(); ++i) {
    const int src = wrap_dim(static_cast<int>(order[i]), dim());
    KVATTN_CHECK(!seen[src], "permute: order {} repeats dimension {}", order.str(), src);
    seen[src] = true;
    t.shape_[i] = shape_[src];
    t.strides_[i] = strides_[src];
  }
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  a = wrap_dim(a, dim());
  b = wrap_dim(b, dim());
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  d = wrap_dim(d, dim());
  const int64_t n = shape_[d];
  const int64_t i = index < 0 ? index + n : index;
  KVATTN_CHECK(i >= 0 && i < n, "select: index {} out of range for dimension {} of size {}", index, d, n);
  Tensor t = *this;
  t.byte_offset_ += i * strides_[d] * element_size();
  t.shape_.erase(d);
  t.strides_.erase(d);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim());
  KVATTN_CHECK(step >= 1, "slice: step must be >= 1, got {}", step);
  const int64_t n = shape_[d];
  auto clamp = [n](int64_t v) {
    if (v < 0) v += n;
    return std::clamp<int64_t>(v, 0, n);
  };
  start = clamp(start);
  end = clamp(end);
  if (end < start) end = start;
  Tensor t = *this;
  t.byte_offset_ += start * strides_[d] * element_size();
  t.shape_[d] = (end - start + step - 1) / step;
  t.strides_[d] = strides_[d] * step;
  return t;
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim());
  KVATTN_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
               "narrow: [{}, {}) is outside dimension {} of size {}", start, start + length, d, shape_[d]);
  return slice(d, start, start + length);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int d) const {
  d = wrap_dim(d, dim());
  KVATTN_CHECK(split_size > 0, "split: split_size must be positive, got {}", split_size);
  std::vector<Tensor> out;
  for (int64_t s = 0; s < shape_[d]; s += split_size) out.push_back(slice(d, s, s + split_size));
  if (shape_[d] == 0) out.push_back(*this);
  return out;
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int d) const {
  d = wrap_dim(d, dim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    KVATTN_CHECK(s >= 0, "split: negative section size {}", s);
    total += s;
  }
  KVATTN_CHECK(total == shape_[d], "split: sections {} sum to {} but dimension {} has size {}",
               fmt::format("[{}]", fmt::join(sizes, ", ")), total, d, shape_[d]);
  std::vector<Tensor> out;
  int64_t s = 0;
  for (int64_t len : sizes) {
    out.push_back(slice(d, s, s + len));
    s += len;
  }
  return out;
}

Tensor Tensor::unsqueeze(int d) const {
  d = wrap_dim(d, dim() + 1);
  Tensor t = *this;
  const int64_t st = d < dim() ? checked_mul(strides_[d], shape_[d], "unsqueeze: stride") : 1;
  t.shape_.insert(d, 1);
  t.strides_.insert(d, st);
  return t;
}

Tensor Tensor::squeeze(int d) const {
  d = wrap_dim(d, dim());
  KVATTN_CHECK(shape_[d] == 1, "squeeze: dimension {} has size {}, not 1", d, shape_[d]);
  Tensor t = *this;
  t.shape_.erase(d);
  t.strides_.erase(d);
  return t;
}

Tensor Tensor::view_as(DType dtype) const {
  const int64_t old_es = element_size(), new_es = dtype_size(dtype);
  Tensor t = *this;
  t.dtype_ = dtype;
  if (old_es == new_es) return t;
  KVATTN_CHECK(dim() > 0, "view_as({}): a 0-d {} tensor cannot change element size", dtype_name(dtype),
               dtype_name(dtype_));
  KVATTN_CHECK(strides_[dim() - 1] == 1 || shape_[dim() - 1] == 1,
               "view_as({}): the last dimension must have stride 1 (got {}); call contiguous() first",
               dtype_name(dtype), strides_[dim() - 1]);
  KVATTN_CHECK(byte_offset_ % new_es == 0, "view_as({}): byte offset {} is not a multiple of {}",
               dtype_name(dtype), byte_offset_, new_es);
  if (new_es < old_es) {
    const int64_t r = old_es / new_es;
    for (int i = 0; i < dim() - 1; ++i) t.strides_[i] = checked_mul(strides_[i], r, "view_as: stride");
    t.shape_[dim() - 1] = checked_mul(shape_[dim() - 1], r, "view_as: last dimension");
    t.strides_[dim() - 1] = 1;
  } else {
    const int64_t r = new_es / old_es;
    KVATTN_CHECK(shape_[dim() - 1] % r == 0,
                 "view_as({}): last dimension {} of {} is not divisible by the size ratio {}",
                 dtype_name(dtype), shape_[dim() - 1], dtype_name(dtype_), r);
    for (int i = 0; i < dim() - 1; ++i) {
      KVATTN_CHECK(strides_[i] % r == 0, "view_as({}): stride {} of dimension {} is not divisible by {}",
                   dtype_name(dtype), strides_[i], i, r);
      t.strides_[i] = strides_[i] / r;
    }
    t.shape_[dim() - 1] = shape_[dim() - 1] / r;
    t.strides_[dim() - 1] = 1;
  }
  return t;
}

// ---------------------------------------------------------------------------------------
// Copies

namespace {
// Calls fn(src_offset_elems, dst_offset_elems) for every element in row-major order.
template <typename Fn>
void for_each_index(const Dims& shape, const Dims& a, const Dims& b, Fn&& fn) {
  const int nd = shape.size();
  if (shape.product() == 0) return;
  int64_t idx[kMaxDims] = {};
  int64_t oa = 0, ob = 0;
  while (true) {
    fn(oa, ob);
    int d = nd - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        oa += a[d];
        ob += b[d];
        break;
      }
      oa -= a[d] * (shape[d] - 1);
      ob -= b[d] * (shape[d] - 1);
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  KVATTN_CHECK(src.shape() == shape_, "copy_from: source shape {} differs from destination shape {}",
               src.shape().str(), shape_.str());
  if (numel() == 0) return;
  if (!device_.is_cpu() || !src.device().is_cpu()) {
    KVATTN_CHECK(src.dtype() == dtype_ && src.is_contiguous() && is_contiguous(),
                 "copy_from across devices ({} -> {}) needs contiguous tensors of one dtype (got {} "
                 "and {})",
                 src.device().str(), device_.str(), dtype_name(src.dtype()), dtype_name(dtype_));
    cuda::memcpy(data(), src.data(), static_cast<size_t>(nbytes()));
    return;
  }
  if (src.dtype() == dtype_ && src.is_contiguous() && is_contiguous()) {
    std::memmove(data(), src.data(), static_cast<size_t>(nbytes()));
    return;
  }
  char* d = static_cast<char*>(data());
  const char* s = static_cast<const char*>(src.data());
  const int64_t des = element_size(), ses = src.element_size();
  if (src.dtype() == dtype_) {
    for_each_index(shape_, src.strides(), strides_,
                   [&](int64_t so, int64_t dof) { std::memcpy(d + dof * des, s + so * ses, static_cast<size_t>(des)); });
  } else {
    const DType sd = src.dtype(), dd = dtype_;
    for_each_index(shape_, src.strides(), strides_, [&](int64_t so, int64_t dof) {
      store_from_double(d + dof * des, dd, load_as_double(s + so * ses, sd));
    });
  }
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_);
  if (!device_.is_cpu()) {
    KVATTN_CHECK(is_contiguous(), "clone of a non-contiguous {} tensor is not supported on {}; use the "
                 "ops copy kernels", shape_.str(), device_.str());
  }
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor src = device_.is_cpu() ? contiguous() : *this;
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(src);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  check_cpu("Tensor::to(dtype)");
  Tensor out = empty(shape_, dtype, device_);
  out.copy_from(*this);
  return out;
}

void Tensor::fill_(double value) {
  if (numel() == 0) return;
  if (!device_.is_cpu()) {
    KVATTN_CHECK(value == 0.0 && is_contiguous(), "fill_ on {} supports only zero on contiguous tensors",
                 device_.str());
    cuda::memset(data(), 0, static_cast<size_t>(nbytes()));
    return;
  }
  alignas(8) unsigned char pattern[8];
  store_from_double(pattern, dtype_, value);
  const int64_t es = element_size();
  char* d = static_cast<char*>(data());
  for_each_index(shape_, strides_, strides_,
                 [&](int64_t, int64_t o) { std::memcpy(d + o * es, pattern, static_cast<size_t>(es)); });
}

double Tensor::get(std::initializer_list<int64_t> idx) const {
  check_cpu("Tensor::get");
  return load_as_double(element_address(idx.begin(), static_cast<int>(idx.size())), dtype_);
}

void Tensor::set(std::initializer_list<int64_t> idx, double value) {
  check_cpu("Tensor::set");
  store_from_double(element_address(idx.begin(), static_cast<int>(idx.size())), dtype_, value);
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor c = device_.is_cpu() ? *this : to(Device::cpu());
  std::vector<double> out;
  out.reserve(static_cast<size_t>(numel()));
  const char* s = static_cast<const char*>(c.data());
  const int64_t es = element_size();
  for_each_index(shape_, c.strides(), c.strides(),
                 [&](int64_t o, int64_t) { out.push_back(load_as_double(s + o * es, dtype_)); });
  return out;
}

}  // namespace kvattn
