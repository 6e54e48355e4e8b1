// kvattn/core/tensor.h — a strided view over (optionally owned) memory.
//
// A Tensor is (storage, byte offset, shape, strides in elements, dtype, device), exactly the
// model of torch.Tensor.  Views (`view`, `permute`, `select`, `slice`, `split`, `as_strided`,
// `view_as`) share storage and never copy; `contiguous`/`clone`/`to` copy.  Every view is
// checked to stay inside its storage, so a bad shape is an InvalidArgument, never an
// out-of-bounds access.  Shapes have at most kMaxDims dimensions and live inline (no heap),
// so building views on a hot path does not allocate.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvattn/core/buffer.h"
#include "kvattn/core/checked_math.h"
#include "kvattn/core/dtype.h"
#include "kvattn/core/error.h"

namespace kvattn {

inline constexpr int kMaxDims = 8;

// A fixed-capacity list of up to kMaxDims int64 values (a shape or strides).
class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> v);
  explicit Dims(std::span<const int64_t> v);
  static Dims filled(int n, int64_t value);

  int size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  int64_t& operator[](int i) noexcept { return d_[static_cast<size_t>(i)]; }
  int64_t operator[](int i) const noexcept { return d_[static_cast<size_t>(i)]; }
  const int64_t* begin() const noexcept { return d_.data(); }
  const int64_t* end() const noexcept { return d_.data() + n_; }
  int64_t* begin() noexcept { return d_.data(); }
  int64_t* end() noexcept { return d_.data() + n_; }
  std::span<const int64_t> span() const noexcept { return {d_.data(), static_cast<size_t>(n_)}; }
  void push_back(int64_t v);
  void erase(int i);
  void insert(int i, int64_t v);
  // Unchecked: a Tensor's shape is checked at construction to have a representable element
  // count; for any other Dims use checked_product(dims.span(), what).
  int64_t product() const noexcept;
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "[a, b, c]"
  friend bool operator==(const Dims& a, const Dims& b) noexcept;

 private:
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

// Row-major (C-order) strides for `shape`.
Dims contiguous_strides(const Dims& shape);

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false

  // ---- factories --------------------------------------------------------------------
  static Tensor empty(const Dims& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Dims& shape, DType dtype, Device device = Device::cpu());
  // Borrowed memory (not owned); the caller keeps it alive.
  static Tensor from_blob(void* data, const Dims& shape, const Dims& strides, DType dtype,
                          Device device = Device::cpu());
  static Tensor from_blob(void* data, const Dims& shape, DType dtype, Device device = Device::cpu());
  // View over a Buffer, keeping it alive.  byte_offset is relative to buffer->data().
  static Tensor from_buffer(std::shared_ptr<Buffer> buffer, int64_t byte_offset, const Dims& shape,
                            const Dims& strides, DType dtype);
  // Owning CPU copy of `values` with the given shape (default 1-D).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Dims shape = {});

  // ---- properties --------------------------------------------------------------------
  bool defined() const noexcept { return base_ != nullptr || shape_.size() > 0 || dtype_set_; }
  int dim() const noexcept { return shape_.size(); }
  const Dims& shape() const noexcept { return shape_; }
  const Dims& strides() const noexcept { return strides_; }
  int64_t size(int d) const;    // negative d counts from the end
  int64_t stride(int d) const;  // in elements
  int64_t numel() const noexcept { return shape_.product(); }
  int64_t element_size() const noexcept { return dtype_size(dtype_); }
  int64_t nbytes() const noexcept { return numel() * element_size(); }
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  int64_t byte_offset() const noexcept { return byte_offset_; }
  const std::shared_ptr<Buffer>& storage() const noexcept { return storage_; }
  // Base address of the storage (without the offset) and the first element's address.
  void* storage_data() const noexcept { return base_; }
  void* data() const noexcept { return base_ ? static_cast<char*>(base_) + byte_offset_ : nullptr; }
  template <typename T>
  T* data_ptr() const {
    check_dtype_is(dtype_of_v<T>);
    return static_cast<T*>(data());
  }
  bool is_contiguous() const noexcept;
  // "Tensor(shape=[2, 3], strides=[3, 1], dtype=float32, device=cpu, offset=0)"
  std::string str() const;

  // ---- views (never copy) ------------------------------------------------------------
  // shape/strides in elements; storage_offset in elements of this dtype, relative to the
  // storage base (torch semantics).  Default keeps the current offset.
  Tensor as_strided(const Dims& shape, const Dims& strides) const;
  Tensor as_strided(const Dims& shape, const Dims& strides, int64_t storage_offset) const;
  // Same numel, -1 inferred; fails when the strides cannot express the new shape.
  Tensor view(const Dims& shape) const;
  Tensor permute(const Dims& order) const;
  Tensor transpose(int a, int b) const;
  Tensor select(int d, int64_t index) const;  // removes dimension d; negative index from end
  // Python slice semantics for start/end (clamped, negative from end); step >= 1.
  Tensor slice(int d, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int d, int64_t start, int64_t length) const;
  std::vector<Tensor> split(int64_t split_size, int d = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int d = 0) const;
  Tensor unsqueeze(int d) const;
  Tensor squeeze(int d) const;
  // Reinterpret bytes as another dtype (torch.Tensor.view(dtype)): the last dimension is
  // scaled by the size ratio and must have stride 1 when sizes differ.
  Tensor view_as(DType dtype) const;

  // ---- copies ------------------------------------------------------------------------
  Tensor contiguous() const;  // *this if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy on the same device
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;  // CPU only: converts element by element
  // Copies src into *this (same shape; dtype conversion on CPU; across devices only when both
  // are contiguous and of the same dtype).
  void copy_from(const Tensor& src);
  void fill_(double value);  // CPU, or CUDA for byte-pattern values (0)

  // ---- element access (bounds-checked, for tests and small host logic) ---------------
  double get(std::initializer_list<int64_t> idx) const;
  void set(std::initializer_list<int64_t> idx, double value);
  template <typename T>
  T& at(std::initializer_list<int64_t> idx) const {
    check_dtype_is(dtype_of_v<T>);
    return *reinterpret_cast<T*>(element_address(idx.begin(), static_cast<int>(idx.size())));
  }
  // All elements in row-major order, as double (CPU tensors).
  std::vector<double> to_double_vector() const;
  template <typename T>
  std::vector<T> to_vector() const;

  // Range of bytes [lo, hi) this view touches, relative to storage_data().  {0,0} if empty.
  std::pair<int64_t, int64_t> byte_extent() const noexcept;

 private:
  void check_dtype_is(DType t) const;
  void check_cpu(const char* what) const;
  int wrap_dim(int d, int ndim) const;
  char* element_address(const int64_t* idx, int n) const;
  void check_in_bounds() const;  // throws when the view leaves its storage

  std::shared_ptr<Buffer> storage_;
  void* base_ = nullptr;
  int64_t byte_offset_ = 0;
  Dims shape_;
  Dims strides_;
  DType dtype_ = DType::f32;
  bool dtype_set_ = false;
  Device device_{};
  int64_t storage_bytes_ = -1;  // -1: unknown (borrowed memory, no bounds check)
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, Dims shape) {
  if (shape.empty()) shape = Dims{static_cast<int64_t>(values.size())};
  KVATTN_CHECK(checked_product(shape.span(), "from_vector: element count of the shape") ==
                   static_cast<int64_t>(values.size()),
               "from_vector: shape {} holds {} elements but {} values were given", shape.str(),
               shape.product(), values.size());
  Tensor t = empty(shape, dtype_of_v<T>);
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  check_dtype_is(dtype_of_v<T>);
  Tensor c = device_.is_cpu() ? contiguous() : to(Device::cpu());
  std::vector<T> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace kvattn
