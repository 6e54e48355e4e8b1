// Overflow-checked size arithmetic: the helpers themselves, and the Tensor/Buffer factories and
// views that use them (a shape whose byte size overflows is refused, never under-allocated).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvattn/core/buffer.h"
#include "kvattn/core/checked_math.h"
#include "kvattn/core/tensor.h"

using namespace kvattn;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// Runs fn, expects InvalidArgument, and returns its message.
template <typename Fn>
std::string invalid_message(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return {};
}
}  // namespace

TEST(CheckedMath, ExactResultsInRange) {
  EXPECT_EQ(checked_mul(3, 7, "x"), 21);
  EXPECT_EQ(checked_mul(-3, 7, "x"), -21);
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_EQ(checked_add(kMax - 1, 1, "x"), kMax);
  EXPECT_EQ(checked_sub(kMin + 1, 1, "x"), kMin);
  const std::vector<int64_t> shape{2, 3, 4};
  EXPECT_EQ(checked_product(shape, "x"), 24);
  EXPECT_EQ(checked_product({}, "x"), 1);
  EXPECT_EQ(checked_cast<int32_t>(int64_t{2147483647}, "x"), 2147483647);
  EXPECT_EQ(checked_cast<uint32_t>(int64_t{4294967295}, "x"), 4294967295u);
  EXPECT_EQ(checked_cast<int64_t>(uint64_t{9223372036854775807ull}, "x"), kMax);
}

TEST(CheckedMath, OverflowNamesTheQuantityAndOperands) {
  const std::string m = invalid_message([] { (void)checked_mul((int64_t{1} << 62) + 1, 4, "byte size of q"); });
  EXPECT_NE(m.find("byte size of q"), std::string::npos) << m;
  EXPECT_NE(m.find("4611686018427387905 * 4"), std::string::npos) << m;
  EXPECT_NE(m.find("overflows"), std::string::npos) << m;
  EXPECT_THROW((void)checked_add(kMax, 1, "x"), InvalidArgument);
  EXPECT_THROW((void)checked_sub(kMin, 1, "x"), InvalidArgument);
  EXPECT_THROW((void)checked_mul(kMin, -1, "x"), InvalidArgument);
  const std::vector<int64_t> big{int64_t{1} << 40, int64_t{1} << 30};
  EXPECT_THROW((void)checked_product(big, "x"), InvalidArgument);
}

TEST(CheckedMath, NarrowingIsAFullWidthCheck) {
  // 4294967298 must not become 2 after a 32-bit truncation.
  const std::string m = invalid_message([] { (void)checked_cast<int32_t>(int64_t{4294967298}, "--dcp"); });
  EXPECT_NE(m.find("--dcp: 4294967298 is outside the representable range [-2147483648, 2147483647]"),
            std::string::npos)
      << m;
  EXPECT_THROW((void)checked_cast<uint32_t>(int64_t{-1}, "x"), InvalidArgument);
  EXPECT_THROW((void)checked_cast<int64_t>(uint64_t{18446744073709551615ull}, "x"), InvalidArgument);
  EXPECT_THROW((void)checked_cast<uint8_t>(256, "x"), InvalidArgument);
}

TEST(CheckedTensor, FactoryRefusesAnOverflowingByteSize) {
  // kvattn.zeros([2**62 + 1, 4]): the element count overflows (it used to allocate 16 bytes).
  const int64_t n = (int64_t{1} << 62) + 1;
  const std::string m = invalid_message([&] { (void)Tensor::zeros({n, 4}, DType::f32); });
  EXPECT_NE(m.find("4611686018427387905 * 4"), std::string::npos) << m;
  // The element count fits but the byte size does not.
  EXPECT_THROW((void)Tensor::empty({int64_t{1} << 62}, DType::f32), InvalidArgument);
  EXPECT_THROW((void)Tensor::empty({int64_t{1} << 31, int64_t{1} << 31, 4}, DType::u8), InvalidArgument);
  // Zero-size tensors with huge other dimensions still need representable strides.
  EXPECT_THROW((void)Tensor::empty({0, int64_t{1} << 62, 8}, DType::f32), InvalidArgument);
  EXPECT_THROW((void)Tensor::empty({-1, 4}, DType::f32), InvalidArgument);
  EXPECT_THROW((void)Tensor::from_vector(std::vector<int32_t>{1, 2}, Dims{int64_t{1} << 62, 4}), InvalidArgument);
}

TEST(CheckedTensor, ViewsPastTheEndAreRefused) {
  Tensor t = Tensor::zeros({4, 4}, DType::f32);
  // A view whose extent overflows (it used to wrap around and pass the bounds check).
  EXPECT_THROW((void)t.as_strided({(int64_t{1} << 62) + 1, 4}, {4, 1}), InvalidArgument);
  EXPECT_THROW((void)t.as_strided({2, 2}, {kMax / 2, 1}), InvalidArgument);
  EXPECT_THROW((void)t.as_strided({2}, {1}, kMax / 2), InvalidArgument);
  EXPECT_THROW((void)t.as_strided({4, 5}, {4, 1}), InvalidArgument);  // one element past the end
  EXPECT_THROW((void)t.view({int64_t{1} << 62, int64_t{1} << 62, 0}), InvalidArgument);
  EXPECT_THROW((void)t.view({-1, int64_t{1} << 62, 4}), InvalidArgument);
  // Views inside the storage still work and see the data.
  Tensor ok = t.as_strided({2, 2}, {4, 1}, 10);
  ok.set({1, 1}, 7.0);
  EXPECT_EQ(t.get({3, 3}), 7.0);
  // Borrowed memory: no extent to compare with, but the sizes must be representable.
  float blob[4] = {};
  EXPECT_THROW((void)Tensor::from_blob(blob, {(int64_t{1} << 62) + 1, 4}, DType::f32), InvalidArgument);
}

TEST(CheckedTensor, BufferRefusesSizesBeyondTheAddressSpace) {
  EXPECT_THROW((void)Buffer::allocate(SIZE_MAX - 8), OutOfMemory);
  auto b = Buffer::allocate(16);
  EXPECT_EQ(b->size(), 16u);
  EXPECT_THROW((void)Tensor::from_buffer(b, -4, {2}, {1}, DType::f32), InvalidArgument);
  EXPECT_THROW((void)Tensor::from_buffer(b, 12, {2}, {1}, DType::f32), InvalidArgument);
  EXPECT_EQ(Tensor::from_buffer(b, 8, {2}, {1}, DType::f32).nbytes(), 8);
}
