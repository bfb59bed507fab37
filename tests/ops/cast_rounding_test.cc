// The cast kernel's (and fill's) conversions to the 16-bit floats, bit for
// bit against the IEEE 754 oracle in tests/ieee_rounding.h, which rounds
// values rather than bits. tests/core checks core/dtype.h's conversions the
// same way; the kernel has its own paths (per-type loads and stores, integer
// sources), so it is checked on its own.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/eager.h"
#include "tests/ieee_rounding.h"

namespace tessera::ops {
namespace {

using tessera::testing::FloatFormat;
using tessera::testing::IsRightNarrowing;
using tessera::testing::IsRightWidening;
using tessera::testing::kBFloat16Format;
using tessera::testing::kHalfFormat;
using tessera::testing::RoundingProbes;
using tessera::testing::RoundToFormat;

struct Target {
  DType dtype;
  FloatFormat format;
};
constexpr Target kTargets[] = {{DType::kBF16, kBFloat16Format}, {DType::kF16, kHalfFormat}};

// The 16-bit patterns of cast(x, dtype).
std::vector<uint16_t> CastBits(const Tensor& x, DType dtype) {
  auto y = RunOp("cast", {x}, {{"dtype", dtype}});
  EXPECT_TRUE(y.ok()) << y.status();
  if (!y.ok()) return {};
  const uint16_t* bits = static_cast<const uint16_t*>((*y)[0].raw_data());
  return std::vector<uint16_t>(bits, bits + (*y)[0].NumElements());
}

TEST(CastRounding, F32ToSixteenBitsMatchesIeeeBitForBit) {
  for (const Target& target : kTargets) {
    SCOPED_TRACE(DTypeName(target.dtype));
    const std::vector<uint32_t> probes = RoundingProbes(target.format, 1 << 16, 7);
    auto floats = Tensor::Empty(Shape{static_cast<int64_t>(probes.size())}, DType::kF32);
    ASSERT_TRUE(floats.ok());
    std::memcpy(floats->raw_data(), probes.data(), probes.size() * sizeof(uint32_t));
    const std::vector<uint16_t> got = CastBits(*floats, target.dtype);
    ASSERT_EQ(got.size(), probes.size());
    int wrong = 0;
    for (size_t i = 0; i < probes.size() && wrong < 10; ++i) {
      if (!IsRightNarrowing(std::bit_cast<float>(probes[i]), got[i], target.format)) {
        ADD_FAILURE() << std::hex << "f32 0x" << probes[i] << " -> 0x" << got[i];
        ++wrong;
      }
    }
  }
}

TEST(CastRounding, SixteenBitsToF32IsExact) {
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (const Target& target : kTargets) {
    SCOPED_TRACE(DTypeName(target.dtype));
    auto x = Tensor::Empty(Shape{1 << 16}, target.dtype);
    ASSERT_TRUE(x.ok());
    std::memcpy(x->raw_data(), all.data(), all.size() * sizeof(uint16_t));
    auto y = RunOp("cast", {*x}, {{"dtype", DType::kF32}});
    ASSERT_TRUE(y.ok()) << y.status();
    const float* f = (*y)[0].data<float>();
    for (uint32_t bits = 0; bits < all.size(); ++bits) {
      ASSERT_TRUE(IsRightWidening(bits, f[bits], target.format)) << std::hex << bits << " -> " << f[bits];
    }
  }
}

// Integers round once: through f32 (24 bits) a value just above a bf16 tie
// can become the tie, e.g. 2^25 + 2^17 + 1 → 2^25 + 2^17, which then rounds
// to even, down, instead of up.
TEST(CastRounding, IntegersToSixteenBitsRoundOnce) {
  std::vector<int32_t> i32 = {(1 << 25) + (1 << 17) + 1, -((1 << 25) + (1 << 17) + 1), (1 << 25) + (1 << 17),
                              65519, 65520, -65520, 2047, 2049, 4097, 0, 1, -1, INT32_MAX, INT32_MIN};
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    const int shift = static_cast<int>(rng() % 31);
    i32.push_back(static_cast<int32_t>(rng()) >> shift);
  }
  const Tensor x32 = Tensor::FromVector<int32_t>(Shape{static_cast<int64_t>(i32.size())}, i32);
  for (const Target& target : kTargets) {
    const std::vector<uint16_t> got = CastBits(x32, target.dtype);
    ASSERT_EQ(got.size(), i32.size());
    int wrong = 0;
    for (size_t i = 0; i < i32.size() && wrong < 10; ++i) {
      const uint32_t want = RoundToFormat(static_cast<double>(i32[i]), target.format);  // exact in double
      if (got[i] != want) {
        ADD_FAILURE() << DTypeName(target.dtype) << ": " << i32[i] << std::hex << " -> 0x" << got[i] << ", want 0x"
                      << want;
        ++wrong;
      }
    }
  }
  // Beyond 2^53 doubles round too: 2^60 + 2^52 + 1 is just above the bf16 tie
  // between 2^60 (0x5d80) and 2^60 (1 + 2^-7) (0x5d81).
  const int64_t big = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;
  const Tensor x64 = Tensor::FromVector<int64_t>(Shape{4}, {big, -big, big - 1, INT64_MIN});
  EXPECT_EQ(CastBits(x64, DType::kBF16), (std::vector<uint16_t>{0x5d81, 0xdd81, 0x5d80, 0xdf00}));
  EXPECT_EQ(CastBits(x64, DType::kF16), (std::vector<uint16_t>{0x7c00, 0xfc00, 0x7c00, 0xfc00}));
}

// fill takes its value as a double: one rounding too.
TEST(CastRounding, FillRoundsItsDoubleOnce) {
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);  // f32 would make it the tie
  auto y = RunOp("fill", {}, {{"shape", std::vector<int64_t>{2}}, {"value", above_tie}, {"dtype", DType::kBF16}});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ((*y)[0].data<BFloat16>()[1].bits, 0x3f81);
}

}  // namespace
}  // namespace tessera::ops
