#include <gtest/gtest.h>

#include <dlpack/dlpack.h>

#include <numeric>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/dlpack_bridge.h"
#include "kvattn/core/tensor.h"

using namespace kvattn;

namespace {
Tensor iota(const Dims& shape, DType dt = DType::f32) {
  Tensor t = Tensor::empty(shape, dt);
  Tensor flat = t.view({-1});
  for (int64_t i = 0; i < t.numel(); ++i) flat.set({i}, static_cast<double>(i));
  return t;
}
}  // namespace

TEST(Tensor, ContiguousFactoryAndStrides) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::bf16);
  EXPECT_EQ(t.strides(), (Dims{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.str(), "Tensor(shape=[2, 3, 4], strides=[12, 4, 1], dtype=bfloat16, device=cpu, offset=0)");
}

TEST(Tensor, PermuteSelectSlice) {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Dims{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Dims{1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.get({3, 1, 2}), t.get({1, 2, 3}));
  Tensor s = t.select(1, 2);
  EXPECT_EQ(s.shape(), (Dims{2, 4}));
  EXPECT_EQ(s.get({1, 3}), 1 * 12 + 2 * 4 + 3);
  Tensor sl = t.slice(2, 1, 4, 2);
  EXPECT_EQ(sl.shape(), (Dims{2, 3, 2}));
  EXPECT_EQ(sl.get({0, 0, 1}), 3);
  EXPECT_EQ(t.slice(0, -1, 100).shape(), (Dims{1, 3, 4}));
  EXPECT_THROW(t.select(0, 2), InvalidArgument);
  EXPECT_THROW(t.permute({0, 0, 1}), InvalidArgument);
  Tensor c = p.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.get({3, 1, 2}), t.get({1, 2, 3}));
}

TEST(Tensor, ViewFollowsTorchRules) {
  Tensor t = iota({4, 6});
  EXPECT_EQ(t.view({2, 2, 6}).strides(), (Dims{12, 6, 1}));
  EXPECT_EQ(t.view({-1}).shape(), (Dims{24}));
  Tensor tr = t.transpose(0, 1);  // [6,4] strides [1,6]
  EXPECT_THROW(tr.view({24}), InvalidArgument);
  // Splitting a dimension of a transposed tensor is fine.
  Tensor v = tr.view({2, 3, 4});
  EXPECT_EQ(v.strides(), (Dims{3, 1, 6}));
  EXPECT_EQ(v.get({1, 2, 3}), t.get({3, 5}));
  EXPECT_THROW(t.view({5, -1}), InvalidArgument);
  EXPECT_THROW(t.view({-1, -1}), InvalidArgument);
}

TEST(Tensor, SplitAndNarrow) {
  Tensor t = iota({10, 2});
  auto parts = t.split(4);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].size(0), 2);
  EXPECT_EQ(parts[1].get({0, 1}), 9);
  auto p2 = t.split(std::vector<int64_t>{3, 7});
  EXPECT_EQ(p2[1].get({0, 0}), 6);
  EXPECT_THROW(t.split(std::vector<int64_t>{3, 6}), InvalidArgument);
  EXPECT_THROW(t.narrow(0, 8, 3), InvalidArgument);
}

TEST(Tensor, ViewAsDTypeReinterpretsBytes) {
  Tensor t = Tensor::empty({2, 4}, DType::i32);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) t.set({i, j}, i * 4 + j);
  Tensor b = t.view_as(DType::u8);
  EXPECT_EQ(b.shape(), (Dims{2, 16}));
  EXPECT_EQ(b.strides(), (Dims{16, 1}));
  EXPECT_EQ(b.get({1, 4}), 5);  // little-endian low byte of element [1][1]
  Tensor back = b.view_as(DType::i64);
  EXPECT_EQ(back.shape(), (Dims{2, 2}));
  EXPECT_EQ(static_cast<int64_t>(back.get({0, 0})), (int64_t{1} << 32) | 0);
  EXPECT_THROW(t.transpose(0, 1).view_as(DType::u8), InvalidArgument);
  EXPECT_THROW(Tensor::empty({3}, DType::u8).view_as(DType::i32), InvalidArgument);
}

TEST(Tensor, AsStridedStaysInsideStorage) {
  Tensor t = iota({16});
  Tensor w = t.as_strided({3, 4}, {4, 1}, 2);
  EXPECT_EQ(w.get({2, 3}), 13);
  EXPECT_THROW(t.as_strided({4, 4}, {4, 1}, 1), InvalidArgument);  // last element is 16
  EXPECT_THROW(t.as_strided({2}, {-1}, 0), InvalidArgument);      // before the start
  EXPECT_THROW(t.get({16}), InvalidArgument);
}

TEST(Tensor, CopyConvertsAndFills) {
  Tensor f = iota({3, 5});
  Tensor h = f.to(DType::bf16);
  EXPECT_EQ(h.get({2, 4}), 14);
  Tensor dst = Tensor::empty({5, 3}, DType::f32);
  dst.copy_from(h.transpose(0, 1));
  EXPECT_EQ(dst.get({4, 2}), 14);
  dst.fill_(-1.5);
  EXPECT_EQ(dst.get({1, 1}), -1.5);
  EXPECT_THROW(dst.copy_from(f), InvalidArgument);
  auto v = f.transpose(0, 1).to_double_vector();
  EXPECT_EQ(v[1], 5);
}

TEST(Tensor, DlpackRoundTripSharesMemory) {
  Tensor t = iota({3, 4}).slice(1, 1, 3);
  DLManagedTensor* m = to_dlpack(t);
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.strides[0], 4);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  Tensor back = from_dlpack(m);
  EXPECT_EQ(back.data(), t.data());
  EXPECT_EQ(back.shape(), t.shape());
  back.set({2, 1}, 42);
  EXPECT_EQ(t.get({2, 1}), 42);
  // A view of the imported tensor is bounds-checked against the producer's extent.
  EXPECT_THROW(back.as_strided({3, 3}, {4, 1}), InvalidArgument);
}

TEST(Tensor, DlpackFp8UsesDlpack1Codes) {
  Tensor t = Tensor::zeros({4}, DType::fp8_e4m3);
  DLManagedTensor* m = to_dlpack(t);
  EXPECT_EQ(m->dl_tensor.dtype.code, 10);
  Tensor back = from_dlpack(m);
  EXPECT_EQ(back.dtype(), DType::fp8_e4m3);
}

TEST(Tensor, ErrorsAreTyped) {
  try {
    Tensor::empty({2, 3}, DType::f32).view({4, 2});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("[4, 2]"), std::string::npos);
  }
  if (!cuda::built_with_cuda()) {

    EXPECT_THROW(Tensor::empty({2}, DType::f32, Device::cuda(0)), Unsupported);

  }
  Result<int> ok = 3;
  EXPECT_EQ(ok.value(), 3);
  Result<int> bad = Failure{ErrorKind::OutOfMemory, "does not fit"};
  EXPECT_FALSE(bad.ok());
  EXPECT_THROW(bad.value(), OutOfMemory);
}
