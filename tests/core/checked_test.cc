// Checked size arithmetic (core/checked.h) and the places in core that rely
// on it: tensors and the CPU allocator refuse sizes instead of wrapping them.

#include "core/checked.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/storage.h"
#include "core/tensor.h"

namespace tessera {
namespace {

constexpr int64_t kHuge = int64_t{1} << 62;  // model.seq_length=4611686018427387904

#define EXPECT_ERROR_CONTAINS(status_or, part)                                                                       \
  do {                                                                                                               \
    const absl::Status s_ = (status_or).status();                                                                    \
    EXPECT_FALSE(s_.ok());                                                                                           \
    EXPECT_NE(std::string(s_.message()).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << s_; \
  } while (0)

TEST(Checked, AddAndMulOverflowAreErrors) {
  EXPECT_EQ(*CheckedAdd(2, 3), 5);
  EXPECT_EQ(*CheckedMul(-4, 5), -20);
  EXPECT_ERROR_CONTAINS(CheckedAdd(std::numeric_limits<int64_t>::max(), 1, "offset"), "offset: ");
  EXPECT_ERROR_CONTAINS(CheckedMul(kHuge, 4, "bytes"), "overflows int64");
  EXPECT_FALSE(CheckedMul(std::numeric_limits<int64_t>::min(), -1).ok());
}

TEST(Checked, NumElementsNamesTheDimension) {
  EXPECT_EQ(*CheckedNumElements(Shape{}), 1);
  EXPECT_EQ(*CheckedNumElements(Shape{2, 3, 4}), 24);
  EXPECT_EQ(*CheckedNumElements(Shape{5, 0, 7}), 0);
  // Exactly at the limit is fine; one more is not.
  EXPECT_EQ(*CheckedNumElements(Shape{int64_t{1} << 25, int64_t{1} << 25}), kMaxTensorBytes);
  EXPECT_ERROR_CONTAINS(CheckedNumElements(Shape{kHuge, kHuge}), "dimension 0");
  EXPECT_ERROR_CONTAINS(CheckedNumElements(Shape{1 << 20, 1 << 20, 1 << 20}), "dimension 2, extent 1048576");
  EXPECT_ERROR_CONTAINS(CheckedNumElements(Shape{4, kHuge}), "more than 2^50 elements");
  EXPECT_ERROR_CONTAINS(CheckedNumElements(Shape{3, -2}), "negative extent -2 at dimension 1");
  // An empty tensor with an absurd extent is refused too: its strides would overflow.
  EXPECT_FALSE(CheckedNumElements(Shape{0, kHuge, 8}).ok());
  EXPECT_ERROR_CONTAINS(CheckedNumElements(Shape(std::vector<int64_t>(kMaxTensorRank + 1, 1))), "dimensions");
}

TEST(Checked, ByteSizeHoldsToTheByteLimit) {
  EXPECT_EQ(*CheckedByteSize({DType::kF32, Shape{2, 3}}), 24);
  EXPECT_EQ(*CheckedByteSize({DType::kBool, Shape{int64_t{1} << 50}}), kMaxTensorBytes);
  // 2^49 elements fit the element limit, their f32 bytes do not.
  EXPECT_ERROR_CONTAINS(CheckedByteSize({DType::kF32, Shape{int64_t{1} << 49}}), "more than the limit of 2^50 bytes");
  EXPECT_ERROR_CONTAINS(CheckedByteSize({DType::kI64, Shape{kHuge}}), "i64");
}

TEST(Checked, TensorsRefuseSizesInsteadOfWrapping) {
  // Wrapped to 0 bytes, this used to allocate nothing and let kernels write.
  EXPECT_ERROR_CONTAINS(Tensor::Empty(Shape{kHuge, 4}, DType::kF32), "more than 2^50 elements");
  EXPECT_ERROR_CONTAINS(Tensor::Zeros(Shape{8, kHuge}, DType::kF32), "dimension 1");
  EXPECT_FALSE(Tensor::Empty(Shape{-1}, DType::kF32).ok());
  Tensor t = *Tensor::Zeros(Shape{4, 3}, DType::kF32);
  EXPECT_FALSE(t.Reshape(Shape{kHuge, 4}).ok());
  EXPECT_FALSE(t.Reshape(Shape{kHuge, kHuge}).ok());
  EXPECT_FALSE(t.SliceRows(std::numeric_limits<int64_t>::max(), 1).ok());
  EXPECT_FALSE(t.SliceRows(1, std::numeric_limits<int64_t>::max()).ok());
  EXPECT_TRUE(t.SliceRows(1, 3).ok());
}

TEST(Checked, AllocatorRefusesMoreThanPhysicalMemory) {
  const size_t physical = PhysicalMemoryBytes();
  ASSERT_GT(physical, 0u);
  CpuAllocator allocator;
  // Refused before malloc sees it (sanitizers would abort on such a request).
  auto ptr = allocator.Allocate(physical + 1);
  ASSERT_FALSE(ptr.ok());
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(ptr.status().message()).find(std::to_string(physical + 1)), std::string::npos) << ptr.status();
  EXPECT_FALSE(allocator.Allocate(std::numeric_limits<size_t>::max()).ok());
  // A tensor of 2^50 bytes passes the size checks and fails as memory.
  auto tensor = Tensor::Empty(Shape{int64_t{1} << 48}, DType::kF32);
  ASSERT_FALSE(tensor.ok());
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kResourceExhausted) << tensor.status();
}

}  // namespace
}  // namespace tessera
