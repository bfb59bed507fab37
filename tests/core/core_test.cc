#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/device.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "core/placement.h"
#include "core/sbp.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "core/tensor_util.h"
#include "core/thread_pool.h"

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

TEST(DType, HalfAndBFloat16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-5f, 3.14159f, -0.000061035156f}) {
    EXPECT_NEAR(HalfToFloat(FloatToHalf(v)), v, std::abs(v) * 1e-3 + 1e-7) << v;
    EXPECT_NEAR(BFloat16ToFloat(FloatToBFloat16(v)), v, std::abs(v) * 8e-3) << v;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  // Round to nearest even: 1 + 2^-8 is halfway between two bf16 values.
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
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

TEST(Placement, CreateParseCoordinates) {
  auto p = ParsePlacement("cpu:0-7@[2,4]");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 8);
  EXPECT_EQ(p->Coordinates(6), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p->ToString(), "cpu:{0,1,2,3,4,5,6,7}@[2,4]");
  EXPECT_EQ(ParsePlacement(p->ToString())->ranks(), p->ranks());
  EXPECT_EQ(ParsePlacement("cuda:1,3")->ParallelIdOf(3), 1);
  EXPECT_FALSE(ParsePlacement("cpu:0-5@[2,4]").ok());
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

}  // namespace
}  // namespace tessera
