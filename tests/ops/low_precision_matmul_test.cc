// matmul / batch_matmul on bf16 and f16 inputs (mixed precision): y is f32
// and equals the f32 product of the inputs' exact values (bf16 through
// oneDNN's bf16 GEMM where the CPU has AVX512-BF16, else widened; f16
// always widened), every transpose, batched and cut over a pool; the
// gradient rule gives gradients of the inputs' dtype that are the f32
// gradients of the low-precision dY, rounded.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/text.h"
#include "core/thread_pool.h"
#include "ops/cpu/matmul.h"
#include "ops/eager.h"

namespace tessera::ops {
namespace {

Tensor Random(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  for (float& v : values) v = normal(rng);
  return Tensor::FromVector(shape, values);
}

Tensor Abs(const Tensor& x) {
  std::vector<float> values(x.data<float>(), x.data<float>() + x.NumElements());
  for (float& v : values) v = std::fabs(v);
  return Tensor::FromVector(x.shape(), values);
}

Tensor Cast(const Tensor& x, DType dtype, const EagerOptions& options) {
  auto y = RunOp("cast", {x}, {{"dtype", dtype}}, options);
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? y->front() : Tensor();
}

// |got - want| within 1e-5 of the sum of |products| (f32 sums in another
// order), element by element.
void ExpectClose(const Tensor& got, const Tensor& want, const Tensor& bound, const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::kF32) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  const float* b = bound.data<float>();
  int bad = 0;
  for (int64_t i = 0; i < got.NumElements() && bad < 5; ++i) {
    if (std::fabs(g[i] - w[i]) > 1e-5f * b[i] + 1e-30f) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", want " << w[i];
      ++bad;
    }
  }
}

struct Case {
  std::string op;
  Shape a, b;
  bool transpose_a, transpose_b;
};

TEST(LowPrecisionMatmul, EqualsTheF32ProductOfTheExactInputs) {
  std::printf("bf16 GEMM: %s\n", cpu::CpuHasBf16Gemm() ? "oneDNN (AVX512-BF16)" : "inputs widened to f32");
  ThreadPool pool(2);
  EagerOptions options;
  options.pool = &pool;
  const std::vector<Case> cases = {
      {"matmul", Shape{37, 70}, Shape{70, 19}, false, false},
      {"matmul", Shape{70, 37}, Shape{70, 19}, true, false},
      {"matmul", Shape{37, 70}, Shape{19, 70}, false, true},
      {"matmul", Shape{70, 37}, Shape{19, 70}, true, true},
      {"matmul", Shape{300, 260}, Shape{260, 240}, false, false},  // cut into pieces
      {"matmul", Shape{260, 300}, Shape{240, 260}, true, true},
      {"batch_matmul", Shape{3, 2, 33, 40}, Shape{3, 2, 40, 17}, false, false},
      {"batch_matmul", Shape{6, 40, 33}, Shape{6, 17, 40}, true, true},
  };
  uint32_t seed = 1;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      for (double alpha : {1.0, 0.125}) {
        const std::string what = StrCat(DTypeName(dtype), " ", c.op, " ", c.a.ToString(), " x ", c.b.ToString(),
                                        " ta=", c.transpose_a, " tb=", c.transpose_b, " alpha=", alpha);
        const AttrMap attrs = {{"transpose_a", c.transpose_a}, {"transpose_b", c.transpose_b}, {"alpha", alpha}};
        const Tensor a = Cast(Random(c.a, seed++), dtype, options), b = Cast(Random(c.b, seed++), dtype, options);
        auto got = RunOp(c.op, {a, b}, attrs, options);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        const Tensor a32 = Cast(a, DType::kF32, options), b32 = Cast(b, DType::kF32, options);
        auto want = RunOp(c.op, {a32, b32}, attrs, options);
        ASSERT_TRUE(want.ok()) << want.status();
        AttrMap bound_attrs = attrs;
        bound_attrs.Set("alpha", std::fabs(alpha));
        auto bound = RunOp(c.op, {Abs(a32), Abs(b32)}, bound_attrs, options);
        ASSERT_TRUE(bound.ok()) << bound.status();
        ExpectClose(got->front(), want->front(), bound->front(), what);
      }
    }
  }
}

TEST(LowPrecisionMatmul, MixedOrIntegerInputsAreRefused) {
  const Tensor f = Tensor::FromVector(Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
  const Tensor h = Cast(f, DType::kBF16, {});
  auto mixed = RunOp("matmul", {f, h});
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(std::string(mixed.status().message()).find("a is f32 but b is bf16"), std::string::npos) << mixed.status();
  auto ints = RunOp("matmul", {Cast(f, DType::kI32, {}), Cast(f, DType::kI32, {})});
  ASSERT_FALSE(ints.ok());
  EXPECT_NE(std::string(ints.status().message()).find("must be f32, bf16 or f16, got i32"), std::string::npos)
      << ints.status();
}

// dA, dB of a bf16 product: bf16, and the f32 product rule applied to dY
// rounded to bf16, rounded again.
TEST(LowPrecisionMatmul, GradientsComeInTheInputsDType) {
  const Tensor a32 = Random(Shape{5, 7}, 11), b32 = Random(Shape{7, 3}, 12), dy32 = Random(Shape{5, 3}, 13);
  const Tensor a = Cast(a32, DType::kBF16, {}), b = Cast(b32, DType::kBF16, {});
  auto y = RunOp("matmul", {a, b});
  ASSERT_TRUE(y.ok()) << y.status();
  auto grads = EagerGradients("matmul", {a, b}, {y->front()}, {dy32}, {}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_EQ(grads->size(), 2u);
  const Tensor dy = Cast(dy32, DType::kBF16, {});
  auto da = RunOp("matmul", {dy, b}, {{"transpose_b", true}});
  auto db = RunOp("matmul", {a, dy}, {{"transpose_a", true}});
  ASSERT_TRUE(da.ok() && db.ok());
  for (const auto& [got, want] : {std::pair{(*grads)[0], Cast(da->front(), DType::kBF16, {})},
                                  std::pair{(*grads)[1], Cast(db->front(), DType::kBF16, {})}}) {
    const Tensor& g = got;
    ASSERT_EQ(g.dtype(), DType::kBF16);
    ASSERT_EQ(g.shape(), want.shape());
    const Tensor g32 = Cast(g, DType::kF32, {}), w32 = Cast(want, DType::kF32, {});
    for (int64_t i = 0; i < g.NumElements(); ++i) EXPECT_EQ(g32.data<float>()[i], w32.data<float>()[i]) << i;
  }
}

}  // namespace
}  // namespace tessera::ops
