#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "core/device.h"
#include "core/dtype.h"
#include "core/file_util.h"
#include "core/philox.h"
#include "core/placement.h"
#include "core/sbp.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "core/tensor_util.h"
#include "core/thread_pool.h"
#include "tests/ieee_rounding.h"

namespace tessera {
namespace {

absl::Status ReturnsError() { return absl::InvalidArgumentError("bad"); }
absl::StatusOr<int> ReturnsValue(bool ok) {
  if (!ok) return absl::NotFoundError("none");
  return 7;
}
absl::Status UsesMacros(bool ok, int* out) {
  ASSIGN_OR_RETURN(int v, ReturnsValue(ok));
  *out = v;
  RETURN_IF_ERROR(absl::OkStatus());
  return absl::OkStatus();
}
absl::Status PropagatesError() {
  RETURN_IF_ERROR(ReturnsError());
  return absl::OkStatus();
}

TEST(Status, MacrosPropagate) {
  int v = 0;
  EXPECT_TRUE(UsesMacros(true, &v).ok());
  EXPECT_EQ(v, 7);
  EXPECT_EQ(UsesMacros(false, &v).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PropagatesError().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusDeathTest, CheckAbortsWithMessage) {
  EXPECT_DEATH(TESSERA_CHECK(1 + 1 == 3, "math is ", "broken"), "TESSERA_CHECK failed.*math is broken");
}

TEST(DType, NamesParseAndSizes) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool, DType::kF64}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(*ParseDType("float64"), DType::kF64);
  EXPECT_TRUE(IsFloatingPoint(DType::kF64));
  EXPECT_FALSE(IsFloatingPoint(DType::kI64));
  EXPECT_FALSE(ParseDType("f8").ok());
}

// f64 tensors hold doubles exactly (the op tests' references compute in them).
TEST(Tensor, F64HoldsDoublesExactly) {
  const double third = 1.0 / 3.0, tiny = 1.0 + std::ldexp(1.0, -50);  // neither fits in f32
  Tensor t = Tensor::FromVector<double>(Shape{3}, {third, tiny, -0.0});
  EXPECT_EQ(t.dtype(), DType::kF64);
  EXPECT_EQ(t.NumBytes(), 24u);
  EXPECT_EQ(ElementAsDouble(t, 0), third);
  EXPECT_EQ(ElementAsDouble(t, 1), tiny);
  EXPECT_TRUE(std::signbit(ElementAsDouble(t, 2)));
  SetElementFromDouble(t, 2, -tiny);
  EXPECT_EQ(t.data<double>()[2], -tiny);
  EXPECT_EQ(t.ToVector<double>(), (std::vector<double>{third, tiny, -tiny}));
  EXPECT_EQ(t.meta().ToString(), "f64(3,)");
}

// ---- Conversions to the 16-bit floats, bit for bit against the IEEE 754
// oracle in tests/ieee_rounding.h (which rounds values, not bits).

using testing::DecodeFloat;
using testing::FloatFormat;
using testing::IsRightNarrowing;
using testing::IsRightWidening;
using testing::kBFloat16Format;
using testing::kHalfFormat;
using testing::RoundingProbes;
using testing::RoundToFormat;

float FloatOfBits(uint32_t bits) { return std::bit_cast<float>(bits); }

// Cases worked out by hand (bf16 keeps the top 16 bits of an f32; f16 has
// 10 fraction bits, bias 15, max 65504, smallest subnormal 2^-24).
struct Expected {
  uint32_t f32_bits;
  uint16_t bits;
  const char* what;
};

// `convert` on the cases by hand, on NaNs (quiet or signalling, either
// sign), and on RoundingProbes against the oracle; reports at most 10 wrong
// probes.
void ExpectRoundsLikeIeee(FloatFormat f, uint16_t (*convert)(float), const std::vector<Expected>& by_hand,
                          uint64_t seed) {
  for (const Expected& c : by_hand) {
    EXPECT_EQ(convert(FloatOfBits(c.f32_bits)), c.bits) << c.what;
  }
  std::vector<uint32_t> probes = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fffffffu};
  for (uint32_t bits : RoundingProbes(f, 1 << 18, seed)) probes.push_back(bits);
  int wrong = 0;
  for (uint32_t bits : probes) {
    const uint16_t got = convert(FloatOfBits(bits));
    if (!IsRightNarrowing(FloatOfBits(bits), got, f)) {
      ADD_FAILURE() << std::hex << "f32 0x" << bits << " (" << FloatOfBits(bits) << ") -> 0x" << got;
      if (++wrong == 10) return;
    }
  }
}

TEST(DType, BFloat16RoundsToNearestEvenBitExactly) {
  const std::vector<Expected> by_hand = {
      {0x3f808000, 0x3f80, "1 + 2^-8: a tie, down to even"},
      {0x3f818000, 0x3f82, "1 + 3 * 2^-8: a tie, up to even"},
      {0x3f807fff, 0x3f80, "just below a tie"},
      {0x3f808001, 0x3f81, "just above a tie"},
      {0xbf818000, 0xbf82, "negative tie, up to even"},
      {0x3f80ffff, 0x3f81, "all dropped bits set"},
      {0x3fffffff, 0x4000, "rounding carries into the exponent"},
      {0x7f7f7fff, 0x7f7f, "below the tie under max finite"},
      {0x7f7f8000, 0x7f80, "tie above max finite: to even, which is infinity"},
      {0x7f7fffff, 0x7f80, "max finite f32 overflows"},
      {0xff7fffff, 0xff80, "negative overflow"},
      {0x00008000, 0x0000, "subnormal tie, down to zero"},
      {0x00018000, 0x0002, "subnormal tie, up to even"},
      {0x00008001, 0x0001, "just above the smallest subnormal's half"},
      {0x00000001, 0x0000, "smallest f32 subnormal"},
      {0x807fffff, 0x8080, "largest negative subnormal rounds up to the smallest normal"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7f80, "+inf"},
      {0xff800000, 0xff80, "-inf"},
  };
  ExpectRoundsLikeIeee(kBFloat16Format, FloatToBFloat16, by_hand, 1);
}

TEST(DType, HalfRoundsToNearestEvenBitExactly) {
  const std::vector<Expected> by_hand = {
      {0x3f801000, 0x3c00, "1 + 2^-11: a tie, down to even"},
      {0x3f803000, 0x3c02, "1 + 3 * 2^-11: a tie, up to even"},
      {0x3f800fff, 0x3c00, "just below a tie"},
      {0x3f801001, 0x3c01, "just above a tie"},
      {0xbf803000, 0xbc02, "negative tie, up to even"},
      {0x477fe000, 0x7bff, "65504, the largest half"},
      {0x477fefff, 0x7bff, "just below 65520"},
      {0x477ff000, 0x7c00, "65520: a tie above max finite, to even, which is infinity"},
      {0xc77ff000, 0xfc00, "-65520"},
      {0x47800000, 0x7c00, "65536"},
      {0x38800000, 0x0400, "2^-14, the smallest normal half"},
      {0x387fe000, 0x0400, "1023.5 * 2^-24: a subnormal tie, up to even, the smallest normal"},
      {0x387fc000, 0x03ff, "1023 * 2^-24, the largest subnormal"},
      {0x33800000, 0x0001, "2^-24, the smallest subnormal"},
      {0x33000000, 0x0000, "2^-25: a tie, down to zero"},
      {0x33000001, 0x0001, "just above 2^-25"},
      {0x33c00000, 0x0002, "3 * 2^-25: a tie, up to even"},
      {0xb3c00000, 0x8002, "-3 * 2^-25"},
      {0x00000001, 0x0000, "an f32 subnormal"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7c00, "+inf"},
      {0xff800000, 0xfc00, "-inf"},
  };
  ExpectRoundsLikeIeee(kHalfFormat, FloatToHalf, by_hand, 2);
}

// Every 16-bit pattern widens to f32 exactly (NaN to NaN of the same sign).
TEST(DType, SixteenBitFloatsWidenExactly) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    ASSERT_TRUE(IsRightWidening(bits, BFloat16ToFloat(b), kBFloat16Format)) << std::hex << bits;
    ASSERT_TRUE(IsRightWidening(bits, HalfToFloat(b), kHalfFormat)) << std::hex << bits;
  }
}

// Doubles (SetElementFromDouble, fill values) round once: through f32 they
// would round twice, and a value just above a tie would become the tie.
TEST(DType, DoublesRoundOnceToSixteenBits) {
  // 1 + 2^-8 + 2^-40: f32 drops the 2^-40, leaving a bf16 tie that goes down;
  // the value is above the tie and must go up.
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(DoubleToBFloat16(above_bf16_tie), 0x3f81);
  const double above_half_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(DoubleToHalf(above_half_tie), 0x3c01);
  EXPECT_EQ(DoubleToBFloat16(-above_bf16_tie), 0xbf81);
  EXPECT_EQ(DoubleToBFloat16(1e300), 0x7f80);
  EXPECT_EQ(DoubleToHalf(-1e300), 0xfc00);
  EXPECT_EQ(DoubleToBFloat16(1e-300), 0x0000);
  EXPECT_EQ(DoubleToBFloat16(-1e-300), 0x8000);
  // Random doubles over each format's range and beyond, and values at and
  // around its ties (v + ulp/2), where rounding twice goes wrong.
  struct Sweep {
    FloatFormat format;
    uint16_t (*convert)(double);
    int min_exponent, max_exponent;
  };
  for (const Sweep& sweep :
       {Sweep{kBFloat16Format, DoubleToBFloat16, -140, 130}, Sweep{kHalfFormat, DoubleToHalf, -28, 17}}) {
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<int> exponent(sweep.min_exponent, sweep.max_exponent);
    std::uniform_real_distribution<double> unit(1.0, 2.0);
    int wrong = 0;
    for (int i = 0; i < 20000 && wrong < 10; ++i) {
      const double random = std::ldexp(unit(rng), exponent(rng)) * (i % 2 ? -1 : 1);
      const double nearest = DecodeFloat(RoundToFormat(random, sweep.format), sweep.format);
      const int binade = std::max(std::ilogb(nearest), sweep.format.emin());
      const double ulp = std::ldexp(1.0, binade - sweep.format.fraction_bits());
      std::vector<double> values = {random};
      for (double offset : {0.0, 0x1p-40, -0x1p-40, 0x1p-20, -0x1p-20, 0x1p-12, -0x1p-12}) {
        values.push_back(nearest + std::copysign(ulp * (0.5 + offset), nearest));
      }
      for (double x : values) {
        if (!std::isfinite(x)) continue;
        const uint16_t got = sweep.convert(x), want = static_cast<uint16_t>(RoundToFormat(x, sweep.format));
        if (got != want) {
          ADD_FAILURE() << std::hexfloat << x << " -> 0x" << std::hex << got << ", want 0x" << want;
          ++wrong;
        }
      }
    }
  }
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(DoubleToBFloat16(-NAN))));
  EXPECT_TRUE(std::signbit(BFloat16ToFloat(DoubleToBFloat16(-NAN))));
  EXPECT_TRUE(std::isnan(HalfToFloat(DoubleToHalf(NAN))));

  // SetElementFromDouble goes through them.
  auto bf16 = Tensor::Zeros(Shape{1}, DType::kBF16);
  auto half = Tensor::Zeros(Shape{1}, DType::kF16);
  ASSERT_TRUE(bf16.ok() && half.ok());
  SetElementFromDouble(*bf16, 0, above_bf16_tie);
  EXPECT_EQ(bf16->data<BFloat16>()[0].bits, 0x3f81);
  SetElementFromDouble(*half, 0, above_half_tie);
  EXPECT_EQ(half->data<Half>()[0].bits, 0x3c01);
}

TEST(Shape, BasicsAndBroadcast) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.NumElements(), 24);
  EXPECT_EQ(s.Strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(s.ToString(), "(2, 3, 4)");
  EXPECT_EQ(Shape{}.NumElements(), 1);
  auto b = BroadcastShapes(Shape{4, 1, 3}, Shape{5, 1});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (Shape{4, 5, 3}));
  auto bad = BroadcastShapes(Shape{2, 3}, Shape{4});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(2, 3)"), std::string::npos);
  EXPECT_EQ(*NormalizeAxis(-1, 3), 2);
  EXPECT_FALSE(NormalizeAxis(3, 3).ok());
}

TEST(Device, ParseAndPrint) {
  auto d = ParseDevice("cuda:3");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->type, DeviceType::kCuda);
  EXPECT_EQ(d->index, 3);
  EXPECT_EQ(d->ToString(), "cuda:3");
  EXPECT_EQ(ParseDevice("cpu")->ToString(), "cpu:0");
  EXPECT_FALSE(ParseDevice("tpu:0").ok());
  EXPECT_FALSE(ParseDevice("cpu:x").ok());
  EXPECT_FALSE(ParseDevice("cpu:-1").ok());
}

TEST(Tensor, ViewsShareStorageAndAreAligned) {
  auto t = Tensor::Zeros(Shape{4, 3}, DType::kF32);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw_data()) % 64, 0u);
  auto rows = t->SliceRows(1, 2);
  ASSERT_TRUE(rows.ok());
  rows->data<float>()[0] = 5.0f;
  EXPECT_EQ(t->data<float>()[3], 5.0f);
  auto r = t->Reshape(Shape{12});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data<float>()[3], 5.0f);
  EXPECT_FALSE(t->Reshape(Shape{5}).ok());
  EXPECT_FALSE(t->SliceRows(3, 2).ok());
  Tensor c = t->Clone();
  c.data<float>()[3] = 1.0f;
  EXPECT_EQ(t->data<float>()[3], 5.0f);
}

// CopyFrom an empty Tensor() (whose metadata is a scalar f32's) or into
// one: an error, not a read or write through its missing storage.
TEST(Tensor, CopyFromAnEmptyTensorIsAnError) {
  auto scalar = Tensor::Zeros(Shape{}, DType::kF32);
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->CopyFrom(Tensor()), absl::InvalidArgumentError("CopyFrom: an empty tensor into f32()"));
  Tensor empty;
  EXPECT_EQ(empty.CopyFrom(*scalar).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(scalar->CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{2.0f})).ok());
}

TEST(TensorDeathTest, WrongTypedAccessIsABug) {
  Tensor t = Tensor::FromVector<int64_t>(Shape{2}, {1, 2});
  EXPECT_DEATH(t.data<float>(), "accessed as f32");
}

TEST(TensorUtil, BlockCopies) {
  Tensor t = Tensor::FromVector<float>(Shape{3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  auto block = ExtractBlock(t, {1, 1}, Shape{2, 2});
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->ToVector<float>(), (std::vector<float>{5, 6, 9, 10}));
  EXPECT_FALSE(ExtractBlock(t, {2, 3}, Shape{2, 2}).ok());
}

// The 2-D pieces a GPU copy is made of (axes merged where both sides are
// contiguous, size-1 axes dropped, the rest looped) move the same elements
// as the host's row copies and nothing else: random blocks of ranks 0-5,
// elements of 1, 2, 4 and 8 bytes.
TEST(TensorUtil, BlockCopiesAs2DPiecesMatchTheRowCopies) {
  std::mt19937 rng(7);
  const auto pick = [&rng](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const DType dtypes[] = {DType::kBool, DType::kBF16, DType::kF32, DType::kI64};
  for (int trial = 0; trial < 400; ++trial) {
    const int rank = static_cast<int>(pick(0, 5));
    std::vector<int64_t> src_dims, dst_dims, extent, src_offset, dst_offset;
    for (int a = 0; a < rank; ++a) {
      const int64_t e = pick(0, 1) == 0 ? 1 : pick(1, 4);  // size-1 axes often
      extent.push_back(e);
      src_dims.push_back(e + (pick(0, 2) == 0 ? 0 : pick(0, 3)));  // sometimes the whole axis
      dst_dims.push_back(e + (pick(0, 2) == 0 ? 0 : pick(0, 3)));
      src_offset.push_back(pick(0, src_dims.back() - e));
      dst_offset.push_back(pick(0, dst_dims.back() - e));
    }
    const DType dtype = dtypes[trial % 4];
    const size_t elem = DTypeSize(dtype);
    auto src = Tensor::Empty(Shape(src_dims), dtype, Device{});
    auto rows = Tensor::Empty(Shape(dst_dims), dtype, Device{});
    auto pieces = Tensor::Empty(Shape(dst_dims), dtype, Device{});
    ASSERT_TRUE(src.ok() && rows.ok() && pieces.ok());
    auto* bytes = static_cast<uint8_t*>(src->raw_data());
    for (size_t i = 0; i < src->NumBytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
    std::memset(rows->raw_data(), 0xA5, rows->NumBytes());
    std::memset(pieces->raw_data(), 0xA5, pieces->NumBytes());
    const Shape block(extent);
    ASSERT_TRUE(CopyBlock(*src, src_offset, *rows, dst_offset, block).ok());
    ASSERT_TRUE(internal::CopyBlockAs2D(*src, src_offset, *pieces, dst_offset, block).ok());
    ASSERT_EQ(std::memcmp(rows->raw_data(), pieces->raw_data(), rows->NumBytes()), 0)
        << "trial " << trial << ": block " << block.ToString() << " of " << src->shape().ToString() << " into "
        << rows->shape().ToString() << ", " << elem << "-byte elements";
  }
}

TEST(Sbp, ParsePrint) {
  EXPECT_EQ(ParseSbp("S(1)")->ToString(), "S(1)");
  EXPECT_EQ(ParseSbp("S0")->ToString(), "S(0)");
  EXPECT_EQ(ParseSbp(" B ")->ToString(), "B");
  EXPECT_EQ(ParseSbp("P")->ToString(), "P");
  EXPECT_EQ(ParseSbp("P(max)")->ToString(), "P(max)");
  EXPECT_FALSE(ParseSbp("Q").ok());
  EXPECT_FALSE(ParseSbp("S(-1)").ok());
  auto nd = ParseNdSbp("(S(0), B)");
  ASSERT_TRUE(nd.ok());
  ASSERT_EQ(nd->size(), 2u);
  EXPECT_EQ(NdSbpToString(*nd), "(S(0), B)");
  EXPECT_EQ(NdSbpToString(*ParseNdSbp("S(1)")), "(S(1))");
  EXPECT_FALSE(ParseNdSbp("(S(0), B").ok());
}

TEST(Sbp, BalancedSplitCoversAndFrontLoads) {
  for (int64_t n : {0, 1, 5, 7, 16}) {
    for (int64_t p : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int64_t i = 0; i < p; ++i) {
        const Range r = BalancedSplit(n, p, i);
        EXPECT_EQ(r.offset, next);
        EXPECT_EQ(r.size, n / p + (i < n % p ? 1 : 0));
        next += r.size;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(Sbp, LocalSliceNdNests) {
  // (S(0), S(0)) on [2, 2] splits rows 10 → 5 | 5 → 3,2 | 3,2.
  auto s = LocalSlice(Shape{10, 4}, *ParseNdSbp("(S(0), S(0))"), {2, 2}, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->local, (Shape{2, 4}));
  EXPECT_EQ(s->offset, (std::vector<int64_t>{8, 0}));
  auto t = LocalSlice(Shape{10, 4}, *ParseNdSbp("(B, S(1))"), {2, 2}, 2);
  EXPECT_EQ(t->local, (Shape{10, 2}));
  EXPECT_EQ(t->offset, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(LocalShape(Shape{7, 3}, Sbp::Split(0), 4, 3).value(), (Shape{1, 3}));
  EXPECT_EQ(LocalShape(Shape{7, 3}, Sbp::PartialSum(), 4, 3).value(), (Shape{7, 3}));
  EXPECT_FALSE(LocalSlice(Shape{4}, {Sbp::Split(1)}, {2}, 0).ok());
  EXPECT_FALSE(LocalSlice(Shape{4}, {Sbp::Split(0)}, {2, 2}, 0).ok());
}

TEST(Sbp, SameRowMajorElementsComparesWhatEachBlockHolds) {
  const auto slice = [](const Shape& logical, const char* nd, std::vector<int64_t> hierarchy, int64_t id) {
    return LocalSlice(logical, *ParseNdSbp(nd), hierarchy, id).value();
  };
  // (B, T, C) -> (B*T, C) split twice on rows: 8 rows nest evenly (2 each),
  // 10 do not (5 -> 3, 2), while 320 flattened rows split 80, 80.
  for (int64_t id = 0; id < 4; ++id) {
    EXPECT_TRUE(SameRowMajorElements(slice(Shape{8, 32, 64}, "(S(0), S(0))", {2, 2}, id),
                                     slice(Shape{256, 64}, "(S(0), S(0))", {2, 2}, id)));
    EXPECT_FALSE(SameRowMajorElements(slice(Shape{10, 32, 64}, "(S(0), S(0))", {2, 2}, id),
                                      slice(Shape{320, 64}, "(S(0), S(0))", {2, 2}, id)))
        << id;
  }
  // One axis splitting batch, the other the flattened rows, agree when each piece is whole rows.
  EXPECT_TRUE(
      SameRowMajorElements(slice(Shape{4, 6}, "(S(0), B)", {2, 3}, 4), slice(Shape{24}, "(S(0), B)", {2, 3}, 4)));
  // Strided blocks: columns 0..2 of (4, 6) are the first halves of (4, 2, 3)'s rows...
  EXPECT_TRUE(SameRowMajorElements(slice(Shape{4, 6}, "(S(1))", {2}, 0), slice(Shape{4, 2, 3}, "(S(1))", {2}, 0)));
  // ... but not the first 12 elements.
  EXPECT_FALSE(SameRowMajorElements(slice(Shape{4, 6}, "(S(1))", {2}, 0), slice(Shape{24}, "(S(0))", {2}, 0)));
  // Whole tensors are the same elements whatever their shapes; a column of
  // (6, 2) is not the first half of (12).
  EXPECT_TRUE(SameRowMajorElements(slice(Shape{2, 3}, "(B)", {1}, 0), slice(Shape{3, 2}, "(B)", {1}, 0)));
  EXPECT_FALSE(SameRowMajorElements(slice(Shape{6, 2}, "(S(1))", {2}, 0), slice(Shape{12}, "(S(0))", {2}, 0)));
  // Empty pieces: equal only to empty pieces.
  EXPECT_TRUE(SameRowMajorElements(slice(Shape{1, 4}, "(S(0))", {2}, 1), slice(Shape{4, 1}, "(S(1))", {2}, 1)));
  EXPECT_FALSE(SameRowMajorElements(slice(Shape{1, 4}, "(S(0))", {2}, 1), slice(Shape{4}, "(S(0))", {2}, 1)));
}

TEST(Placement, CreateParseCoordinates) {
  auto p = ParsePlacement("cpu:0-7@[2,4]");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 8);
  EXPECT_EQ(p->Coordinates(6), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p->ToString(), "cpu:{0,1,2,3,4,5,6,7}@[2,4]");
  EXPECT_EQ(ParsePlacement(p->ToString())->ranks(), p->ranks());
  EXPECT_EQ(ParsePlacement("cuda:1,3")->ParallelIdOf(3), 1);
  EXPECT_FALSE(ParsePlacement("cpu:0-5@[2,4]").ok());
  // Bounded: a range or a hierarchy past the most devices is an error, not
  // a vector filling memory or a product that wraps.
  EXPECT_FALSE(ParsePlacement("cpu:0-9999999999999").ok());
  EXPECT_FALSE(ParsePlacement("cpu:0-1048575,2000000-2000001").ok());
  EXPECT_TRUE(ParsePlacement("cpu:0-1048575").ok());
  EXPECT_FALSE(ParsePlacement("cpu:0-3@[4294967296,4294967296,1,4]").ok());
  EXPECT_FALSE(Placement::Create(DeviceType::kCpu, {0, 1, 2, 3}, {int64_t{1} << 62, 4, 4, 1, 1}).ok());
  EXPECT_FALSE(ParsePlacement("cpu:0,0").ok());
  EXPECT_FALSE(ParsePlacement("npu:0").ok());
}

TEST(Philox, KnownAnswerAndIndependence) {
  // Known-answer vector from the Random123 distribution (philox4x32-10,
  // counter = key = 0).
  const auto zero = Philox4x32(PhiloxKey{0, 0}, 0, 0, 0, 0);
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  const auto ones = Philox4x32(PhiloxKey{0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                               0xffffffffu);
  EXPECT_EQ(ones[0], 0x408f276du);
  EXPECT_EQ(ones[1], 0x41c83b0eu);
  EXPECT_EQ(ones[2], 0xa20bc7c6u);
  EXPECT_EQ(ones[3], 0x6d5451fdu);
  // Uniform draws over many elements have mean ~0.5 and differ by tensor id.
  const PhiloxKey key = MakePhiloxKey(1234);
  double sum = 0;
  int equal = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    const float u = UnitFloat(PhiloxForElement(key, i, 1, 0)[0]);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    equal += PhiloxForElement(key, i, 1, 0)[0] == PhiloxForElement(key, i, 2, 0)[0];
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  EXPECT_LT(equal, 3);
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(1000, 0);
  pool.ParallelFor(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
  int calls = 0;
  ParallelFor(nullptr, 10, 1, [&](int64_t b, int64_t e) { calls += static_cast<int>(e - b); });
  EXPECT_EQ(calls, 10);
}

// A chunk that throws (a kernel's bad_alloc): every chunk still ends, then
// the first exception reaches the caller, whichever thread threw it (the
// caller's left the queued chunks reading its dead frame; a worker's ended
// the process); the pool runs on afterwards.
TEST(ThreadPool, AChunkThatThrowsReachesTheCallerAfterEveryChunkEnded) {
  ThreadPool pool(4);
  for (int64_t thrower : {int64_t{0}, int64_t{2}, int64_t{3}}) {
    std::atomic<int> ended{0};
    std::atomic<int> sum{0};
    bool caught = false;
    try {
      pool.ParallelFor(4, 1, [&](int64_t b, int64_t e) {
        if (b == thrower) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          throw std::bad_alloc();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // still running when the thrower ends
        sum += static_cast<int>(e - b);
        ++ended;
      });
    } catch (const std::bad_alloc&) {
      caught = true;
    }
    EXPECT_TRUE(caught) << "chunk " << thrower;
    EXPECT_EQ(ended.load(), 3) << "chunk " << thrower;  // the others ran to their end before the rethrow
    EXPECT_EQ(sum.load(), 3);
  }
  std::vector<int> hits(100, 0);
  pool.ParallelFor(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

// A directory claim: exclusive while held (a second claim on the same
// directory, however spelled, is FailedPrecondition), free once released;
// the directory it made is removed when left empty, never one it found or
// one holding files.
TEST(DirectoryClaim, IsExclusiveAndRemovesOnlyTheEmptyDirectoryItMade) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tessera_claim_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path made = root / "a" / "b";
  absl::StatusOr<DirectoryClaim> first = DirectoryClaim::Acquire(made);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->held());
  EXPECT_TRUE(first->locked());
  EXPECT_TRUE(fs::is_directory(made));
  const absl::StatusOr<DirectoryClaim> second = DirectoryClaim::Acquire(root / "a" / "." / "b" / "");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("is in use by another run"), std::string::npos) << second.status();
  DirectoryClaim moved = *std::move(first);
  EXPECT_FALSE(DirectoryClaim::Acquire(made).ok());  // the moved claim still holds it
  moved.Release();
  EXPECT_FALSE(moved.held());
  EXPECT_FALSE(fs::exists(made));  // made by the claim and left empty
  EXPECT_FALSE(fs::exists(root));  // and the parents made with it (a/b left a)
  {
    // A parent that was there stays.
    fs::create_directories(root / "kept");
    absl::StatusOr<DirectoryClaim> deep = DirectoryClaim::Acquire(root / "kept" / "x" / "y");
    ASSERT_TRUE(deep.ok()) << deep.status();
    deep->Release();
    EXPECT_FALSE(fs::exists(root / "kept" / "x"));
    EXPECT_TRUE(fs::exists(root / "kept"));
  }
  {
    absl::StatusOr<DirectoryClaim> again = DirectoryClaim::Acquire(made);
    ASSERT_TRUE(again.ok()) << again.status();
    std::ofstream(made / "metrics.jsonl") << "{}\n";
    again->Release();
    EXPECT_TRUE(fs::exists(made / "metrics.jsonl"));  // written into: kept
  }
  {
    absl::StatusOr<DirectoryClaim> found = DirectoryClaim::Acquire(root / "a");
    ASSERT_TRUE(found.ok()) << found.status();
  }  // destroyed: freed, and nothing removed
  EXPECT_TRUE(fs::exists(root / "a"));
  EXPECT_TRUE(DirectoryClaim::Acquire(root / "a").ok());
  std::ofstream(root / "file") << "x";
  EXPECT_FALSE(DirectoryClaim::Acquire(root / "file").ok());
  // A symbolic link to nothing is named as such (it said "File exists").
  fs::create_symlink(root / "gone", root / "dangling");
  const absl::StatusOr<DirectoryClaim> dangling = DirectoryClaim::Acquire(root / "dangling");
  EXPECT_NE(dangling.status().message().find("it is a symbolic link to '" + (root / "gone").string() +
                                             "', which does not exist"),
            std::string::npos)
      << dangling.status();
  fs::remove_all(root);
}

// Shared claims (a job's nodes on its checkpoints/) hold a directory
// together; an exclusive claim is refused beside them and they beside it.
// CheckFree names only an exclusive holder, CheckUnclaimed any.
TEST(DirectoryClaim, SharedClaimsHoldTogetherAndKeepOutAnExclusiveOne) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tessera_shared_claim_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path dir = root / "checkpoints";
  absl::StatusOr<DirectoryClaim> first = DirectoryClaim::AcquireShared(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->made());
  absl::StatusOr<DirectoryClaim> second = DirectoryClaim::AcquireShared(dir);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->made());
  EXPECT_EQ(DirectoryClaim::Acquire(dir).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DirectoryClaim::CheckFree(dir).ok());
  EXPECT_EQ(DirectoryClaim::CheckUnclaimed(dir).code(), absl::StatusCode::kFailedPrecondition);
  first->Release();  // the other still holds it (and it is not removed under it)
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(DirectoryClaim::CheckUnclaimed(dir).code(), absl::StatusCode::kFailedPrecondition);
  second->Release();
  EXPECT_TRUE(DirectoryClaim::CheckUnclaimed(dir).ok());
  {
    absl::StatusOr<DirectoryClaim> exclusive = DirectoryClaim::Acquire(dir);
    ASSERT_TRUE(exclusive.ok()) << exclusive.status();
    EXPECT_EQ(DirectoryClaim::AcquireShared(dir).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(DirectoryClaim::CheckFree(dir).ok());
    EXPECT_FALSE(DirectoryClaim::CheckUnclaimed(dir).ok());
  }
  // The one that made it removes it, left empty, once no claim is left.
  fs::remove_all(dir);
  absl::StatusOr<DirectoryClaim> maker = DirectoryClaim::AcquireShared(dir);
  ASSERT_TRUE(maker.ok()) << maker.status();
  maker->Release();
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(DirectoryClaim::CheckUnclaimed(dir).ok());  // (none there: free)
  fs::remove_all(root);
}

// A durable write into a directory that does not exist names the
// directory, not the temporary file it would have made there.
// "~/" without $HOME (a service's environment) is the user's home, as a
// shell takes it (it was "/": ~/x wrote /x).
TEST(ExpandPath, TildeWithoutHomeIsTheUsersHome) {
  const char* saved = std::getenv("HOME");
  const std::string home = saved != nullptr ? saved : "";
  ::setenv("HOME", "/some/home", 1);
  EXPECT_EQ(ExpandPath("~/x"), std::filesystem::path("/some/home/x"));
  ::unsetenv("HOME");
  const passwd* entry = ::getpwuid(::getuid());
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(ExpandPath("~/x"), std::filesystem::path(entry->pw_dir) / "x");
  EXPECT_EQ(ExpandPath("/a/~/x"), std::filesystem::path("/a/~/x"));
  if (saved != nullptr) ::setenv("HOME", home.c_str(), 1);
}

TEST(ExpandPath, TildeUserIsThatUsersHome) {
  const passwd* root = ::getpwuid(0);
  ASSERT_NE(root, nullptr);
  const std::string root_home = root->pw_dir;
  const std::string root_name = root->pw_name;
  EXPECT_EQ(ExpandPath("~" + root_name + "/data/x.bin"), std::filesystem::path(root_home) / "data" / "x.bin");
  EXPECT_EQ(ExpandPath("~" + root_name), std::filesystem::path(root_home));
  EXPECT_EQ(ExpandPath("~no_such_user_tessera/x"), std::filesystem::path("~no_such_user_tessera/x"));
  const char* saved = std::getenv("HOME");
  const std::string home = saved != nullptr ? saved : "";
  ::setenv("HOME", "/some/home", 1);
  EXPECT_EQ(ExpandPath("~"), std::filesystem::path("/some/home"));
  EXPECT_EQ(ExpandPath("x~/y"), std::filesystem::path("x~/y"));
  if (saved != nullptr) ::setenv("HOME", home.c_str(), 1);
}

TEST(WriteFileDurably, AMissingDirectoryIsNamed) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tessera_durable_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const absl::Status status = WriteFileDurably(root / "sub" / "x.safetensors", "data");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_EQ(status.message(), "cannot write " + (root / "sub" / "x.safetensors").string() + ": its directory '" +
                                  (root / "sub").string() + "' does not exist");
  fs::create_directories(root);
  EXPECT_TRUE(WriteFileDurably(root / "x", "data").ok());
  fs::remove_all(root);
}

// A Ctrl-C during a commit (DeferTemporarySignals) waits for its end: the
// process goes on, then removes its temporaries and dies of the signal.
TEST(TemporaryFiles, ASignalDuringACommitActsAfterIt) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tessera_defer_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RemoveTemporariesOnSignals();
    std::ofstream(root / "temp") << "x";
    const TemporaryFile temp(root / "temp");
    {
      const DeferTemporarySignals commit;
      ::raise(SIGINT);
      std::ofstream(root / "committed") << "the commit went on";
    }
    std::ofstream(root / "after") << "never reached";
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  EXPECT_TRUE(fs::exists(root / "committed"));
  EXPECT_FALSE(fs::exists(root / "after"));
  EXPECT_FALSE(fs::exists(root / "temp"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera
