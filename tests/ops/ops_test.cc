// Op framework tests: registry, attribute canonicalisation, error messages
// for bad input, and the vectorised math against libm.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "core/thread_pool.h"
#include "ops/cpu/vec_math.h"
#include "ops/eager.h"
#include "ops/registry.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops {
namespace {

TEST(VecMath, MatchesLibm) {
  for (float x = -20.0f; x <= 20.0f; x += 0.01f) {
    EXPECT_NEAR(cpu::ExpF(x), std::exp(x), std::exp(x) * 2e-7f) << x;
    EXPECT_NEAR(cpu::TanhF(x), std::tanh(x), 2e-7f + std::abs(std::tanh(x)) * 2e-7f) << x;
    EXPECT_NEAR(cpu::ErfF(x), std::erf(x), 3e-7f + std::abs(std::erf(x)) * 1e-6f) << x;
  }
  for (float x = 1e-30f; x < 1e30f; x *= 1.7f) {
    EXPECT_NEAR(cpu::LogF(x), std::log(x), 3e-7f * std::max(1.0f, std::abs(std::log(x)))) << x;
  }
  // The whole finite range: exp of [88.38, 88.72) is finite (it was +inf:
  // 2^128's exponent bits), and down to the normals' end.
  for (float x = 80.0f; x < 88.72f; x += 0.001f) {
    EXPECT_NEAR(cpu::ExpF(x), std::exp(x), std::exp(x) * 2e-7f) << x;
  }
  for (float x = -87.3f; x < -80.0f; x += 0.001f) {
    EXPECT_NEAR(cpu::ExpF(x), std::exp(x), std::exp(x) * 2e-7f) << x;
  }
  // Subnormal inputs (read as normals, log(1e-40) was -88.0, not -92.1).
  for (float x = std::numeric_limits<float>::denorm_min(); x < 1.2e-38f;
       x = std::max(x * 1.3f, std::nextafter(x, 1.0f))) {
    EXPECT_NEAR(cpu::LogF(x), std::log(x), 3e-7f * std::abs(std::log(x))) << x;
  }
  EXPECT_EQ(cpu::ExpF(-100.0f), 0.0f);
  EXPECT_TRUE(std::isinf(cpu::ExpF(100.0f)));
  EXPECT_TRUE(std::isnan(cpu::ExpF(NAN)));
  EXPECT_TRUE(std::isinf(cpu::LogF(0.0f)));
  EXPECT_TRUE(std::isnan(cpu::LogF(-1.0f)));
}

// relu passes a NaN on, as PyTorch's does (it made it 0, hiding a
// diverged activation from the loss and from fp16's overflow check).
TEST(VecMath, ReluKeepsNaN) {
  auto x = Tensor::Empty(Shape{20}, DType::kF32);
  ASSERT_TRUE(x.ok());
  for (int i = 0; i < 20; ++i) x->data<float>()[i] = i % 3 == 0 ? NAN : static_cast<float>(i % 3 == 1 ? -i : i);
  auto y = RunOp("relu", {*x}, {});
  ASSERT_TRUE(y.ok()) << y.status();
  for (int i = 0; i < 20; ++i) {
    const float out = (*y)[0].data<float>()[i];
    if (i % 3 == 0) {
      EXPECT_TRUE(std::isnan(out)) << i;
    } else {
      EXPECT_EQ(out, i % 3 == 1 ? 0.0f : static_cast<float>(i)) << i;
    }
  }
}

TEST(Registry, HasManyOpsEachWithCpuKernel) {
  const OpRegistry& r = BuiltinOps();
  EXPECT_GE(r.size(), 40u);
  for (const std::string& name : r.Names()) {
    EXPECT_NE(r.Find(name)->FindKernel(DeviceType::kCpu), nullptr) << name;
  }
  EXPECT_FALSE(r.Get("no_such_op").ok());
}

// The scheduler gives these ops their micro-batch's place in the global
// batch (the equivalence tests check the masks through training): dropout,
// and the fused ops that drop as dropout does (attention, bias_dropout_add).
TEST(Registry, OnlyDropoutAndTheOpsFusingItDrawByGlobalIndexFromTheirInputs) {
  const OpRegistry& r = BuiltinOps();
  std::vector<std::string> drawing;
  for (const std::string& name : r.Names()) {
    if (r.Find(name)->draws_by_global_index()) drawing.push_back(name);
  }
  EXPECT_EQ(drawing, (std::vector<std::string>{"bias_dropout_add", "dropout", "flash_attention", "flash_attention_grad",
                                               "flash_attention_masked", "flash_attention_masked_grad"}));
}

TEST(Registry, DuplicateRegistrationIsAnError) {
  OpRegistry r;
  auto make = [] {
    return OpSchema("twice")
        .Output("y")
        .Infer([](const std::vector<TensorMeta>&, const AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
          return std::vector<TensorMeta>{TensorMeta{DType::kF32, Shape{}}};
        })
        .Kernel(DeviceType::kCpu, [](KernelContext&) { return absl::OkStatus(); });
  };
  EXPECT_TRUE(r.Register(make()).ok());
  EXPECT_EQ(r.Register(make()).code(), absl::StatusCode::kAlreadyExists);
}

// Bad input: errors name the op and the shapes / attributes, never crash.
std::string ErrorOf(const std::string& op, const std::vector<Tensor>& inputs, const AttrMap& attrs = {}) {
  auto result = RunOp(op, inputs, attrs);
  EXPECT_FALSE(result.ok()) << op << " accepted bad input";
  return result.ok() ? "" : std::string(result.status().message());
}

Tensor F32(const Shape& shape) { return *Tensor::Zeros(shape, DType::kF32); }

// The cross-entropy ops ask for a workspace only on GPUs and only for i32
// labels (widened there to the i64 their kernels read), 8 bytes a label.
TEST(Registry, CrossEntropyWorkspaceWidensI32LabelsOnGpusOnly) {
  const TensorMeta logits{DType::kF32, Shape{6, 10}}, column{DType::kF32, Shape{6, 1}}, loss{DType::kF32, Shape{6}};
  for (const DType dtype : {DType::kI32, DType::kI64}) {
    const TensorMeta labels{dtype, Shape{6}};
    const std::vector<std::pair<std::string, std::vector<TensorMeta>>> ops = {
        {"sparse_softmax_cross_entropy", {logits, labels}},
        {"sparse_softmax_cross_entropy_grad", {logits, labels, loss}},
        {"cross_entropy_partials", {logits, column, labels}},
        {"cross_entropy_partials_grad", {logits, column, labels, column, column}}};
    for (const auto& [name, inputs] : ops) {
      SCOPED_TRACE(name + " " + std::string(DTypeName(dtype)));
      const OpSchema& schema = *BuiltinOps().Find(name);
      EXPECT_EQ(schema.WorkspaceBytes(inputs, {}, {}, DeviceType::kCpu), 0);
      EXPECT_EQ(schema.WorkspaceBytes(inputs, {}, {}, DeviceType::kCuda), dtype == DType::kI32 ? 48 : 0);
    }
  }
}

// cross_entropy_partials_grad with dtype bf16 / f16 (what mixed precision
// asks of it) gives the f32 dlogits rounded as cast rounds them, bit for
// bit, on any pool; other dtypes are refused.
TEST(Kernels, CrossEntropyPartialsGradGivesCastBitsIn16Bits) {
  using testing::RandomUniform;
  const int64_t N = 37, V = 1030;
  const Tensor logits = RandomUniform(Shape{N, V}, 21, -4.0f, 4.0f);
  auto row_max = RunOp("reduce_max", {logits}, {{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
  ASSERT_TRUE(row_max.ok()) << row_max.status();
  std::vector<int64_t> label_values;
  for (int64_t n = 0; n < N; ++n) label_values.push_back((n * 131) % V);
  const std::vector<Tensor> inputs = {logits, (*row_max)[0], Tensor::FromVector<int64_t>(Shape{N}, label_values),
                                      RandomUniform(Shape{N, 1}, 22, 0.0f, 1e-3f), RandomUniform(Shape{N, 1}, 23)};
  auto f32 = RunOp("cross_entropy_partials_grad", inputs);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ThreadPool pool(3);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto want = RunOp("cast", {(*f32)[0]}, {{"dtype", dtype}});
    ASSERT_TRUE(want.ok()) << want.status();
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      EagerOptions options;
      options.pool = p;
      auto got = RunOp("cross_entropy_partials_grad", inputs, {{"dtype", dtype}}, options);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ((*got)[0].dtype(), dtype);
      EXPECT_EQ(std::memcmp((*got)[0].raw_data(), (*want)[0].raw_data(), (*want)[0].NumBytes()), 0);
    }
  }
  auto bad = RunOp("cross_entropy_partials_grad", inputs, {{"dtype", DType::kI32}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("attribute 'dtype' (of dlogits) must be f32, bf16 or f16, got i32"),
            std::string::npos)
      << bad.status();
}

// reduce_sum of a bf16 / f16 tensor (the cast pass's fold of a 16-bit
// gradient's bias gradient) gives the bits of reduce_sum of its f32 cast,
// for every way the kernel cuts the work (rows, columns, several groups,
// chunks over a pool); reduce_mean and reduce_max stay f32-only.
TEST(Kernels, ReduceSumOf16BitsGivesTheBitsOfItsF32Cast) {
  using testing::RandomUniform;
  using Ints = std::vector<int64_t>;
  ThreadPool pool(3);
  const std::vector<std::pair<Shape, Ints>> cases = {
      {Shape{64, 33, 96}, Ints{0, 1}},   // a bias gradient: columns
      {Shape{7, 5000}, Ints{1}},         // long rows
      {Shape{4, 9, 3, 50}, Ints{0, 2}},  // two reduced groups
      {Shape{20000}, Ints{}},            // all, chunked over the pool
      {Shape{3, 1, 5}, Ints{1}},         // nothing left to reduce: a copy
      {Shape{6000, 3}, Ints{0}},         // few outputs, long columns
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& [shape, axes] : cases) {
      SCOPED_TRACE(StrCat(DTypeName(dtype), " ", shape.ToString()));
      auto low = RunOp("cast", {RandomUniform(shape, 31, -3.0f, 3.0f)}, {{"dtype", dtype}});
      ASSERT_TRUE(low.ok()) << low.status();
      auto wide = RunOp("cast", {(*low)[0]}, {{"dtype", DType::kF32}});
      ASSERT_TRUE(wide.ok()) << wide.status();
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        EagerOptions options;
        options.pool = p;
        const AttrMap attrs = {{"axes", axes}};
        auto want = RunOp("reduce_sum", {(*wide)[0]}, attrs, options);
        auto got = RunOp("reduce_sum", {(*low)[0]}, attrs, options);
        ASSERT_TRUE(want.ok()) << want.status();
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ((*got)[0].dtype(), DType::kF32);
        ASSERT_EQ((*got)[0].shape(), (*want)[0].shape());
        EXPECT_EQ(std::memcmp((*got)[0].raw_data(), (*want)[0].raw_data(), (*want)[0].NumBytes()), 0);
      }
    }
  }
  const Tensor bf16 = *Tensor::Zeros(Shape{2, 3}, DType::kBF16);
  for (const std::string op : {"reduce_mean", "reduce_max"}) {
    const std::string e = ErrorOf(op, {bf16});
    EXPECT_NE(e.find("input 'x' must be f32, got bf16"), std::string::npos) << e;
  }
  const std::string e = ErrorOf("reduce_sum", {*Tensor::Zeros(Shape{2, 3}, DType::kI32)});
  EXPECT_NE(e.find("input 'x' must be f32, bf16 or f16, got i32"), std::string::npos) << e;
}

// Long full reductions keep small terms beside large ones: 16 ones then
// 4M values of 1e-4. Summed in float lanes, each lane's 1 swallows every
// 1e-8 square (and 1e-4 addend) after it in its chunk; square_sum (global-norm
// clipping) adds squares in double lanes and reduce_sum (clipping's other
// p-norms) adds float lanes block by block into a double. Alone and on a
// pool, whose chunks start fresh lanes.
TEST(Kernels, LongSumsKeepSmallTermsBesideLargeOnes) {
  constexpr int64_t kSmall = int64_t{1} << 22;
  std::vector<float> values(16, 1.0f);
  values.resize(16 + kSmall, 1e-4f);
  const Tensor x = Tensor::FromVector<float>(Shape{static_cast<int64_t>(values.size())}, values);
  const double small = static_cast<double>(1e-4f);
  const double squares = 16.0 + static_cast<double>(kSmall) * small * small;
  const double sum = 16.0 + static_cast<double>(kSmall) * small;
  ThreadPool pool(3);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    SCOPED_TRACE(p == nullptr ? "alone" : "pool of 3");
    EagerOptions options;
    options.pool = p;
    auto got = RunOp("square_sum", {x}, {}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NEAR((*got)[0].ToVector<float>().at(0), squares, 1e-6 * squares);
    got = RunOp("reduce_sum", {x}, {}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NEAR((*got)[0].ToVector<float>().at(0), sum, 1e-5 * sum);
  }
}

// square_sum (global-norm clipping) gives the same bits on every pool: its
// double partials were cut by the device's threads, and 16 squares of 2^20,
// 16,384 of 2^-40 (lost beside 2^24 in one chunk, not in a chunk of their
// own) and a 1 summed to 16777216 alone and to 16777218 on 2 threads, so a
// clipped run's bits changed with the machine.
TEST(Kernels, SquareSumIsTheSameBitsOnEveryPool) {
  std::vector<float> values(131072, 0.0f);
  for (size_t i = 0; i < 16; ++i) values[i] = 1024.0f;
  for (size_t i = 16384; i < 32768; ++i) values[i] = 0x1p-20f;
  values[32768] = 1.0f;
  const Tensor x = Tensor::FromVector<float>(Shape{static_cast<int64_t>(values.size())}, values);
  auto alone = RunOp("square_sum", {x}, {});
  ASSERT_TRUE(alone.ok()) << alone.status();
  const float want = (*alone)[0].ToVector<float>().at(0);
  for (int threads : {2, 3, 4, 7}) {
    ThreadPool pool(threads);
    EagerOptions options;
    options.pool = &pool;
    auto got = RunOp("square_sum", {x}, {}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::bit_cast<uint32_t>((*got)[0].ToVector<float>().at(0)), std::bit_cast<uint32_t>(want))
        << threads << " threads";
  }
}

// Parameter gradients sum over every row (B·T of them): a bias's is
// reduce_sum over the leading axis, layer_norm_grad's dgamma and dbeta its
// own. Rows are summed in fixed blocks, then the blocks in double, so the
// sums are the same bits on every pool (the threads a layout gives a device
// change nothing) and keep small terms beside large ones: 16 rows of ones,
// then 40,000 rows of 1e-4, whose running float sum per column drifted by
// 2e-4 of it.
TEST(Kernels, ParameterGradientSumsAreTheSameOnEveryPoolAndKeepSmallTerms) {
  using testing::RandomUniform;
  constexpr int64_t kRows = 40016, kCols = 37;
  std::vector<float> values(16 * kCols, 1.0f);
  values.resize(kRows * kCols, 1e-4f);
  const Tensor ones_then_small = Tensor::FromVector<float>(Shape{kRows, kCols}, values);
  const double sum = 16.0 + static_cast<double>(kRows - 16) * static_cast<double>(1e-4f);
  const Tensor x = RandomUniform(Shape{3000, 48}, 61, -2.0f, 2.0f), dy = RandomUniform(Shape{3000, 48}, 62);
  const Tensor gamma = RandomUniform(Shape{48}, 63), beta = RandomUniform(Shape{48}, 64);
  const Tensor wide = RandomUniform(Shape{700, 5000}, 65);
  std::vector<std::vector<float>> first;  // the outputs alone, for the pools to match
  ThreadPool two(2), three(3), seven(7);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &two, &three, &seven}) {
    SCOPED_TRACE(p == nullptr ? "alone" : StrCat("pool of ", p->num_threads()));
    EagerOptions options;
    options.pool = p;
    std::vector<std::vector<float>> outputs;
    auto got = RunOp("reduce_sum", {ones_then_small}, {{"axes", std::vector<int64_t>{0}}}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    for (float column : (*got)[0].ToVector<float>()) EXPECT_NEAR(column, sum, 5e-6 * sum);
    outputs.push_back((*got)[0].ToVector<float>());
    got = RunOp("reduce_sum", {wide}, {{"axes", std::vector<int64_t>{0}}}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    outputs.push_back((*got)[0].ToVector<float>());
    got = RunOp("reduce_sum", {wide}, {}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    outputs.push_back((*got)[0].ToVector<float>());
    auto forward = RunOp("layer_norm", {x, gamma, beta}, {}, options);
    ASSERT_TRUE(forward.ok()) << forward.status();
    got = RunOp("layer_norm_grad", {dy, x, (*forward)[1], (*forward)[2], gamma}, {}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    for (const Tensor& t : *got) outputs.push_back(t.ToVector<float>());
    auto rms = RunOp("rms_norm", {x, gamma}, {}, options);
    ASSERT_TRUE(rms.ok()) << rms.status();
    got = RunOp("rms_norm_grad", {dy, x, (*rms)[1], gamma}, {}, options);
    ASSERT_TRUE(got.ok()) << got.status();
    for (const Tensor& t : *got) outputs.push_back(t.ToVector<float>());
    if (first.empty()) {
      first = outputs;
      continue;
    }
    ASSERT_EQ(outputs.size(), first.size());
    for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i], first[i]) << "output " << i;
  }
}

// bias_dropout_add gives the bits of bias_add, dropout (same attributes)
// and add, on any pool, at any step, dropout or not; bad shapes are named.
TEST(Kernels, BiasDropoutAddGivesTheBitsOfItsThreeOps) {
  using testing::RandomUniform;
  ThreadPool pool(3);
  for (const Shape& shape : {Shape{64, 33, 96}, Shape{5, 1031}, Shape{7}}) {
    const int64_t C = shape[shape.rank() - 1];
    const Tensor x = RandomUniform(shape, 41, -3.0f, 3.0f), bias = RandomUniform(Shape{C}, 42),
                 residual = RandomUniform(shape, 43);
    for (const double rate : {0.0, 0.1, 0.5}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        SCOPED_TRACE(StrCat(shape.ToString(), " rate ", rate, p != nullptr ? " pool" : ""));
        EagerOptions options;
        options.pool = p;
        options.step = 5;
        const AttrMap attrs = {{"rate", rate}, {"seed", int64_t{17}}, {"tensor_id", int64_t{3}}};
        auto biased = RunOp("bias_add", {x, bias}, {}, options);
        ASSERT_TRUE(biased.ok()) << biased.status();
        auto dropped = RunOp("dropout", {(*biased)[0]}, attrs, options);
        ASSERT_TRUE(dropped.ok()) << dropped.status();
        auto want = RunOp("add", {residual, (*dropped)[0]}, {}, options);
        auto got = RunOp("bias_dropout_add", {x, bias, residual}, attrs, options);
        ASSERT_TRUE(want.ok()) << want.status();
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(std::memcmp((*got)[0].raw_data(), (*want)[0].raw_data(), (*want)[0].NumBytes()), 0);
      }
    }
  }
  const AttrMap attrs = {{"rate", 0.1}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}};
  std::string e = ErrorOf("bias_dropout_add", {F32(Shape{2, 3}), F32(Shape{2}), F32(Shape{2, 3})}, attrs);
  EXPECT_NE(e.find("bias must have shape (3,)"), std::string::npos) << e;
  e = ErrorOf("bias_dropout_add", {F32(Shape{2, 3}), F32(Shape{3}), F32(Shape{3, 2})}, attrs);
  EXPECT_NE(e.find("residual must match x f32(2, 3), got f32(3, 2)"), std::string::npos) << e;
  e = ErrorOf("bias_dropout_add", {F32(Shape{2, 3}), F32(Shape{3}), F32(Shape{2, 3})},
              {{"rate", 1.0}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}});
  EXPECT_NE(e.find("rate must be in [0, 1), got 1"), std::string::npos) << e;
}

// matmul_add gives the bits of matmul then add, for every transpose, f32
// and bf16 inputs, K = 0, on one thread and on a pool; a c that is not the
// product's shape is named.
TEST(Kernels, MatmulAddGivesTheBitsOfMatmulThenAdd) {
  using testing::RandomUniform;
  ThreadPool pool(3);
  for (const auto& [m, k, n] : {std::tuple{96, 130, 70}, std::tuple{5, 0, 3}, std::tuple{1, 7, 1}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const DType dtype : {DType::kF32, DType::kBF16}) {
          const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
          std::vector<Tensor> inputs = {RandomUniform(sa, 51), RandomUniform(sb, 52)};
          if (dtype != DType::kF32) {
            for (Tensor& t : inputs) t = (*RunOp("cast", {t}, {{"dtype", dtype}}))[0];
          }
          const Tensor c = RandomUniform(Shape{m, n}, 53);
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            SCOPED_TRACE(StrCat(m, "x", k, "x", n, " ta ", ta, " tb ", tb, " ", DTypeName(dtype), p ? " pool" : ""));
            EagerOptions options;
            options.pool = p;
            const AttrMap attrs = {{"transpose_a", ta}, {"transpose_b", tb}, {"alpha", 0.75}};
            auto product = RunOp("matmul", inputs, attrs, options);
            ASSERT_TRUE(product.ok()) << product.status();
            auto want = RunOp("add", {c, (*product)[0]}, {}, options);
            auto got = RunOp("matmul_add", {inputs[0], inputs[1], c}, attrs, options);
            ASSERT_TRUE(want.ok()) << want.status();
            ASSERT_TRUE(got.ok()) << got.status();
            EXPECT_EQ(std::memcmp((*got)[0].raw_data(), (*want)[0].raw_data(), (*want)[0].NumBytes()), 0);
          }
        }
      }
    }
  }
  const std::string e = ErrorOf("matmul_add", {F32(Shape{2, 3}), F32(Shape{3, 4}), F32(Shape{4, 2})});
  EXPECT_NE(e.find("c must be f32(2, 4) (the product's), got f32(4, 2)"), std::string::npos) << e;
}

// layer_norm_grad_add gives layer_norm_grad's dgamma and dbeta and the bits
// of its dx then add, on one thread and on a pool.
TEST(Kernels, LayerNormGradAddGivesTheBitsOfLayerNormGradThenAdd) {
  using testing::RandomUniform;
  ThreadPool pool(3);
  for (const Shape& shape : {Shape{64, 33, 96}, Shape{5, 1031}}) {
    const int64_t C = shape[shape.rank() - 1];
    const Tensor x = RandomUniform(shape, 61, -2.0f, 2.0f), gamma = RandomUniform(Shape{C}, 62),
                 beta = RandomUniform(Shape{C}, 63), dy = RandomUniform(shape, 64), addend = RandomUniform(shape, 65);
    auto forward = RunOp("layer_norm", {x, gamma, beta});
    ASSERT_TRUE(forward.ok()) << forward.status();
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      SCOPED_TRACE(StrCat(shape.ToString(), p != nullptr ? " pool" : ""));
      EagerOptions options;
      options.pool = p;
      std::vector<Tensor> in = {dy, x, (*forward)[1], (*forward)[2], gamma};
      auto grads = RunOp("layer_norm_grad", in, {}, options);
      ASSERT_TRUE(grads.ok()) << grads.status();
      auto want = RunOp("add", {(*grads)[0], addend}, {}, options);
      ASSERT_TRUE(want.ok()) << want.status();
      in.push_back(addend);
      auto got = RunOp("layer_norm_grad_add", in, {}, options);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(std::memcmp((*got)[0].raw_data(), (*want)[0].raw_data(), (*want)[0].NumBytes()), 0);
      for (int k = 1; k < 3; ++k) {
        EXPECT_EQ(std::memcmp((*got)[k].raw_data(), (*grads)[k].raw_data(), (*grads)[k].NumBytes()), 0) << k;
      }
    }
  }
}

TEST(BadInput, ShapeMismatchNamesOpAndShapes) {
  const std::string e = ErrorOf("add", {F32(Shape{2, 3}), F32(Shape{4})});
  EXPECT_NE(e.find("op 'add'"), std::string::npos) << e;
  EXPECT_NE(e.find("(2, 3)"), std::string::npos) << e;
  EXPECT_NE(e.find("(4,)"), std::string::npos) << e;
  const std::string bias = ErrorOf("bias_add", {F32(Shape{2, 3}), F32(Shape{2})});
  EXPECT_NE(bias.find("op 'bias_add'"), std::string::npos) << bias;
  EXPECT_NE(bias.find("(2,)"), std::string::npos) << bias;
  const std::string grad = ErrorOf("relu_grad", {F32(Shape{2, 3}), F32(Shape{3, 2})});
  EXPECT_NE(grad.find("(3, 2)"), std::string::npos) << grad;
}

TEST(BadInput, MatmulShapeErrorsNameOpAndShapes) {
  const std::string k = ErrorOf("matmul", {F32(Shape{5, 7}), F32(Shape{6, 3})});
  EXPECT_NE(k.find("op 'matmul' (a: f32(5, 7), b: f32(6, 3))"), std::string::npos) << k;
  EXPECT_NE(k.find("K = 7 vs 6"), std::string::npos) << k;
  const std::string rank = ErrorOf("matmul", {F32(Shape{2, 5, 7}), F32(Shape{7, 3})});
  EXPECT_NE(rank.find("use batch_matmul"), std::string::npos) << rank;
  const std::string batch = ErrorOf("batch_matmul", {F32(Shape{2, 5, 7}), F32(Shape{3, 7, 4})});
  EXPECT_NE(batch.find("batch dimensions differ"), std::string::npos) << batch;
  const std::string bf16 = ErrorOf("matmul", {*Tensor::Zeros(Shape{2, 2}, DType::kBF16), F32(Shape{2, 2})});
  EXPECT_NE(bf16.find("a is bf16 but b is f32; both must have the same dtype"), std::string::npos) << bf16;
}

TEST(BadInput, UnknownAttributeNamesOpAndKnownAttributes) {
  const std::string e = ErrorOf("gelu", {F32(Shape{2})}, {{"approx", std::string("tanh")}});
  EXPECT_NE(e.find("op 'gelu'"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown attribute 'approx'"), std::string::npos) << e;
  EXPECT_NE(e.find("approximate"), std::string::npos) << e;
}

TEST(BadInput, WrongAttributeTypeOrValue) {
  const std::string type = ErrorOf("gelu", {F32(Shape{2})}, {{"approximate", int64_t{1}}});
  EXPECT_NE(type.find("must be string"), std::string::npos) << type;
  const std::string value = ErrorOf("gelu", {F32(Shape{2})}, {{"approximate", std::string("fast")}});
  EXPECT_NE(value.find("\"fast\""), std::string::npos) << value;
  const std::string missing = ErrorOf("scalar_mul", {F32(Shape{2})});
  EXPECT_NE(missing.find("missing required attribute 'value'"), std::string::npos) << missing;
}

TEST(BadInput, WrongDTypeArityAndUnknownOp) {
  const std::string dtype = ErrorOf("exp", {Tensor::FromVector<int64_t>(Shape{2}, {1, 2})});
  EXPECT_NE(dtype.find("must be f32, got i64"), std::string::npos) << dtype;
  const std::string arity = ErrorOf("add", {F32(Shape{2})});
  EXPECT_NE(arity.find("expects 2 inputs, got 1"), std::string::npos) << arity;
  const std::string unknown = ErrorOf("gleu", {F32(Shape{2})});
  EXPECT_NE(unknown.find("unknown op 'gleu'"), std::string::npos) << unknown;
}

// f64 is a host-side dtype without kernels (core/dtype.h): every op refuses
// f64 inputs, and every op with a dtype attribute refuses to make f64, with
// an error naming f64, before any kernel runs. Byte-moving ops (reshape,
// transpose, ...) would not even notice the element type otherwise.
TEST(BadInput, EveryOpRefusesF64) {
  auto expect_refused = [](const std::string& op, const std::vector<Tensor>& inputs, const AttrMap& attrs) {
    auto result = RunOp(op, inputs, attrs);
    ASSERT_FALSE(result.ok()) << op << " ran with f64";
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnimplemented) << result.status();
    EXPECT_NE(std::string(result.status().message()).find("is f64: no op has f64 kernels"), std::string::npos)
        << result.status();
  };
  int with_float_input = 0, with_dtype_attr = 0;
  for (const std::string& name : BuiltinOps().Names()) {
    SCOPED_TRACE(name);
    const OpSchema& schema = *BuiltinOps().Find(name);
    const OpExample& example = schema.example();
    std::vector<Tensor> inputs, inputs_f64;
    bool any_float = false;
    for (const TensorMeta& m : example.inputs) {
      any_float |= IsFloatingPoint(m.dtype);
      inputs.push_back(*Tensor::Zeros(m.shape, m.dtype));
      inputs_f64.push_back(*Tensor::Zeros(m.shape, IsFloatingPoint(m.dtype) ? DType::kF64 : m.dtype));
    }
    ASSERT_TRUE(RunOp(name, inputs, example.attrs).ok()) << "the example itself must run";
    if (any_float) {
      expect_refused(name, inputs_f64, example.attrs);
      ++with_float_input;
    }
    for (const AttrDef& attr : schema.attrs()) {
      if (attr.type != AttrType::kDType) continue;
      AttrMap attrs = example.attrs;
      attrs.Set(attr.name, DType::kF64);
      expect_refused(name, inputs, attrs);
      ++with_dtype_attr;
    }
  }
  EXPECT_GT(with_float_input, 30);
  EXPECT_GE(with_dtype_attr, 5);  // cast, fill, zeros, ones, arange
}

// The harness's cases are small, so kernels run them inline; this runs
// representative ops on inputs large enough to be cut into chunks across 3
// threads and requires the same result as one thread.
TEST(Threading, PooledKernelsMatchSerial) {
  using testing::RandomInts;
  using testing::RandomUniform;
  struct Run {
    std::string op;
    std::vector<Tensor> inputs;
    AttrMap attrs;
  };
  const Shape big{96, 1030};  // rows and an inner extent that is not a multiple of the vector width
  const Tensor x = RandomUniform(big, 1), y = RandomUniform(big, 2);
  const Tensor row = RandomUniform(Shape{1030}, 3);
  std::vector<Run> runs = {
      {"add", {x, y}, {}},
      {"mul", {x, row}, {}},
      {"gelu", {x}, {{"approximate", std::string("tanh")}}},
      {"exp", {x}, {}},
      {"bias_gelu", {x, row}, {}},
      {"softmax", {x}, {}},
      {"layer_norm", {x, row, row}, {}},
      {"reduce_sum", {x}, {{"axes", std::vector<int64_t>{0}}}},
      {"reduce_max", {x}, {{"axes", std::vector<int64_t>{1}}}},
      {"transpose", {x}, {{"perm", std::vector<int64_t>{1, 0}}}},
      {"matmul", {RandomUniform(Shape{130, 70}, 4), RandomUniform(Shape{70, 90}, 5)}, {}},
      {"matmul_bias",
       {RandomUniform(Shape{150, 200}, 9), RandomUniform(Shape{200, 131}, 10), RandomUniform(Shape{131}, 11)},
       {}},
      {"matmul_bias_gelu",
       {RandomUniform(Shape{150, 200}, 9), RandomUniform(Shape{200, 131}, 10), RandomUniform(Shape{131}, 11)},
       {{"approximate", std::string("tanh")}}},
      {"embedding", {RandomUniform(Shape{50, 700}, 6), RandomInts(Shape{64}, 7, 0, 50)}, {}},
      {"dropout", {x}, {{"rate", 0.3}, {"seed", int64_t{5}}, {"tensor_id", int64_t{1}}}},
      {"adamw_update", {x, y, x, RandomUniform(big, 8, 0.0f, 1.0f), Tensor::FromVector<float>(Shape{}, {0.01f})}, {}},
  };
  ThreadPool pool(3);
  for (const Run& run : runs) {
    auto serial = RunOp(run.op, run.inputs, run.attrs);
    EagerOptions options;
    options.pool = &pool;
    auto pooled = RunOp(run.op, run.inputs, run.attrs, options);
    ASSERT_TRUE(serial.ok()) << run.op << ": " << serial.status();
    ASSERT_TRUE(pooled.ok()) << run.op << ": " << pooled.status();
    ASSERT_EQ(serial->size(), pooled->size());
    for (size_t k = 0; k < serial->size(); ++k) {
      const auto a = (*serial)[k].ToDoubleVector(), b = (*pooled)[k].ToDoubleVector();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-5 * (1 + std::abs(a[i]))) << run.op << " output " << k << " element " << i;
      }
    }
  }
}

// The fused GEMM + bias + GELU gives the bits of matmul then bias_gelu (and
// matmul_bias those of matmul then bias_add): the GEMM is cut into the same
// pieces and z = sum + bias, GELU(z) formed the same way, whatever the pool
// (pieces of rows and columns at 2 and 3 threads), for f32 and bf16 inputs
// and both GELUs.
TEST(Kernels, MatmulBiasGeluGivesTheBitsOfMatmulThenBiasGelu) {
  using testing::RandomUniform;
  const Tensor bias = RandomUniform(Shape{131}, 14);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<Tensor> xw = {RandomUniform(Shape{150, 200}, 12), RandomUniform(Shape{200, 131}, 13)};
    for (Tensor& t : xw) {
      if (dtype != DType::kF32) t = (*RunOp("cast", {t}, {{"dtype", dtype}}))[0];
    }
    for (const std::string approximate : {"none", "tanh"}) {
      for (const int threads : {1, 2, 3}) {
        SCOPED_TRACE(StrCat(DTypeName(dtype), " ", approximate, " ", threads, " threads"));
        ThreadPool pool(threads);
        EagerOptions options;
        options.pool = &pool;
        const AttrMap attrs = {{"approximate", approximate}};
        auto fused = RunOp("matmul_bias_gelu", {xw[0], xw[1], bias}, attrs, options);
        ASSERT_TRUE(fused.ok()) << fused.status();
        auto h = RunOp("matmul", {xw[0], xw[1]}, {}, options);
        ASSERT_TRUE(h.ok()) << h.status();
        auto y = RunOp("bias_gelu", {(*h)[0], bias}, attrs, options);
        auto z = RunOp("bias_add", {(*h)[0], bias}, {}, options);
        ASSERT_TRUE(y.ok() && z.ok());
        EXPECT_EQ((*fused)[0].ToVector<float>(), (*y)[0].ToVector<float>());
        EXPECT_EQ((*fused)[1].ToVector<float>(), (*z)[0].ToVector<float>());
        auto linear = RunOp("matmul_bias", {xw[0], xw[1], bias}, {}, options);
        ASSERT_TRUE(linear.ok()) << linear.status();
        EXPECT_EQ((*linear)[0].ToVector<float>(), (*z)[0].ToVector<float>());
      }
    }
  }
}

TEST(Gradients, EagerRuleForBroadcastAddSumsBack) {
  Tensor a = Tensor::FromVector<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::FromVector<float>(Shape{3}, {1, 1, 1});
  auto y = RunOp("add", {a, b});
  ASSERT_TRUE(y.ok());
  Tensor dy = Tensor::FromVector<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  auto grads = EagerGradients("add", {a, b}, *y, {dy}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ((*grads)[1].ToVector<float>(), (std::vector<float>{5, 7, 9}));
}

}  // namespace
}  // namespace tessera::ops
