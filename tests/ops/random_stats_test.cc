// Tests of the random, embedding and optimizer ops beyond the per-case
// harness: distributions on a million draws, stream separation, layout
// invariance under explicit sharding (nested and multi-threaded), in-place
// optimizer steps against PyTorch's formulas over several iterations, and
// errors for bad ids and attributes.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/sbp.h"
#include "core/tensor_util.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"

namespace tessera::ops {
namespace {

std::vector<float> RunFloats(const std::string& op, const std::vector<Tensor>& inputs, const AttrMap& attrs,
                             int64_t step = 0, ThreadPool* pool = nullptr) {
  EagerOptions options;
  options.step = step;
  options.pool = pool;
  auto out = RunOp(op, inputs, attrs, options);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  return (*out)[0].ToVector<float>();
}

AttrMap Canonical(const std::string& op, const AttrMap& attrs) {
  auto canonical = BuiltinOps().Find(op)->CanonicalizeAttrs(attrs);
  EXPECT_TRUE(canonical.ok()) << canonical.status();
  return *canonical;
}

Tensor Filled(const Shape& shape, float value) {
  return Tensor::FromVector<float>(shape, std::vector<float>(static_cast<size_t>(shape.NumElements()), value));
}

Tensor RandomTensor(const Shape& shape, uint64_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  for (float& v : values) v = dist(rng);
  return Tensor::FromVector<float>(shape, values);
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- distributions ---------------------------------------------------------

TEST(RandomOps, NormalMomentsOnAMillionDraws) {
  const AttrMap attrs{{"shape", std::vector<int64_t>{1000, 1000}},
                      {"mean", 2.0},
                      {"std", 3.0},
                      {"seed", int64_t{2024}},
                      {"tensor_id", int64_t{7}}};
  const std::vector<float> y = RunFloats("normal", {}, attrs);
  ASSERT_EQ(y.size(), 1000000u);
  double sum = 0, sum2 = 0, sum3 = 0, sum4 = 0;
  int64_t within_one_sigma = 0;
  for (float v : y) {
    ASSERT_TRUE(std::isfinite(v));
    const double z = (v - 2.0) / 3.0;
    sum += z;
    sum2 += z * z;
    sum3 += z * z * z;
    sum4 += z * z * z * z;
    within_one_sigma += std::abs(z) < 1.0;
  }
  const double n = static_cast<double>(y.size());
  // Standard errors on 1e6 draws: mean 0.001, variance 0.0014, skewness
  // 0.0024, kurtosis 0.005; the bounds are ~5 of them.
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sum2 / n, 1.0, 0.007);
  EXPECT_NEAR(sum3 / n, 0.0, 0.012);
  EXPECT_NEAR(sum4 / n, 3.0, 0.03);
  EXPECT_NEAR(within_one_sigma / n, 0.682689, 0.003);
}

TEST(RandomOps, UniformRangeAndMoments) {
  const AttrMap attrs{{"shape", std::vector<int64_t>{1000000}},
                      {"low", -2.0},
                      {"high", 3.0},
                      {"seed", int64_t{5}},
                      {"tensor_id", int64_t{1}}};
  const std::vector<float> y = RunFloats("uniform", {}, attrs);
  double sum = 0, sum2 = 0;
  int64_t low_half = 0;
  for (float v : y) {
    ASSERT_GE(v, -2.0f);
    ASSERT_LT(v, 3.0f);
    sum += v;
    sum2 += (v - 0.5) * (v - 0.5);
    low_half += v < 0.5f;
  }
  const double n = static_cast<double>(y.size());
  EXPECT_NEAR(sum / n, 0.5, 0.008);          // standard error 0.0014
  EXPECT_NEAR(sum2 / n, 25.0 / 12.0, 0.01);  // standard error 0.0019
  EXPECT_NEAR(low_half / n, 0.5, 0.003);     // standard error 0.0005
}

TEST(RandomOps, UniformStaysBelowHighWhenRoundingWouldReachIt) {
  // low + span * u rounds up to high for u close to 1 when span is a few
  // ulps of low; the kernel must still honour [low, high).
  const double high = 1.0 + std::ldexp(1.0, -20);
  const AttrMap attrs{{"shape", std::vector<int64_t>{4096}},
                      {"low", 1.0},
                      {"high", high},
                      {"seed", int64_t{3}},
                      {"tensor_id", int64_t{0}}};
  for (float v : RunFloats("uniform", {}, attrs)) {
    ASSERT_GE(v, 1.0f);
    ASSERT_LT(v, static_cast<float>(high));
  }
}

TEST(RandomOps, DropoutKeepsOneMinusRateAndScalesKeptValues) {
  const Tensor x = Filled(Shape{1000, 1000}, 1.0f);
  const AttrMap attrs{{"rate", 0.3}, {"seed", int64_t{9}}, {"tensor_id", int64_t{2}}};
  const std::vector<float> y = RunFloats("dropout", {x}, attrs);
  int64_t kept = 0;
  const float scale = static_cast<float>(1.0 / 0.7);
  for (float v : y) {
    if (v != 0.0f) {
      ++kept;
      ASSERT_EQ(v, scale);
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / 1e6, 0.7, 0.003);  // standard error 0.00046

  const Tensor values = RandomTensor(Shape{257}, 4);
  EXPECT_TRUE(
      BitwiseEqual(RunFloats("dropout", {values}, {{"rate", 0.0}, {"seed", int64_t{9}}, {"tensor_id", int64_t{2}}}),
                   values.ToVector<float>()));
}

TEST(RandomOps, GradientOfDropoutReusesTheForwardMask) {
  const Tensor x = RandomTensor(Shape{33, 17}, 8);
  const Tensor dy = RandomTensor(Shape{33, 17}, 9);
  const AttrMap attrs{{"rate", 0.4}, {"seed", int64_t{1}}, {"tensor_id", int64_t{6}}};
  EagerOptions options;
  options.step = 5;
  auto y = RunOp("dropout", {x}, attrs, options);
  ASSERT_TRUE(y.ok()) << y.status();
  auto grads = EagerGradients("dropout", {x}, *y, {dy}, attrs, options);
  ASSERT_TRUE(grads.ok()) << grads.status();
  const std::vector<float> xs = x.ToVector<float>(), ys = (*y)[0].ToVector<float>();
  const std::vector<float> dys = dy.ToVector<float>(), dxs = (*grads)[0].ToVector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    // Kept exactly where the forward kept, with the same scale.
    EXPECT_EQ(ys[i] == 0.0f, dxs[i] == 0.0f) << i;
    if (ys[i] != 0.0f) {
      EXPECT_FLOAT_EQ(dxs[i] / dys[i], ys[i] / xs[i]) << i;
    }
  }
}

// ---- streams ---------------------------------------------------------------

TEST(RandomOps, SeedTensorIdAndStepSelectDifferentStreams) {
  const AttrMap base{{"shape", std::vector<int64_t>{4096}}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}};
  const std::vector<float> reference = RunFloats("normal", {}, base);
  EXPECT_TRUE(BitwiseEqual(reference, RunFloats("normal", {}, base))) << "same key and counter, same numbers";

  auto expect_unrelated = [&](const std::vector<float>& other, const std::string& what) {
    ASSERT_EQ(other.size(), reference.size());
    int64_t equal = 0;
    double dot = 0, norm_a = 0, norm_b = 0;
    for (size_t i = 0; i < other.size(); ++i) {
      equal += other[i] == reference[i];
      dot += other[i] * reference[i];
      norm_a += reference[i] * reference[i];
      norm_b += other[i] * other[i];
    }
    EXPECT_LT(equal, 4) << what;
    // Correlation of independent draws: standard error 1/64.
    EXPECT_LT(std::abs(dot / std::sqrt(norm_a * norm_b)), 0.08) << what;
  };
  AttrMap other_seed = base, other_id = base, wide_seed = base;
  other_seed.Set("seed", int64_t{2});
  other_id.Set("tensor_id", int64_t{1});
  wide_seed.Set("seed", int64_t{1} + (int64_t{1} << 32));  // differs only in the key's high word
  expect_unrelated(RunFloats("normal", {}, other_seed), "seed");
  expect_unrelated(RunFloats("normal", {}, other_id), "tensor_id");
  expect_unrelated(RunFloats("normal", {}, wide_seed), "seed high word");
  expect_unrelated(RunFloats("normal", {}, base, /*step=*/1), "step");
}

// ---- layout invariance -----------------------------------------------------

// Runs `op` once per rank of `hierarchy` on the local block that `nd_sbp`
// gives it (the input, if any, is split the same way) and assembles the
// logical output.
std::vector<float> RunSharded(const std::string& op, const Tensor* input, const AttrMap& attrs, const Shape& logical,
                              const NdSbp& nd_sbp, const std::vector<int64_t>& hierarchy, int64_t step,
                              ThreadPool* pool) {
  const OpSchema& schema = *BuiltinOps().Find(op);
  const AttrMap canonical = Canonical(op, attrs);
  auto assembled = Tensor::Zeros(logical, DType::kF32);
  EXPECT_TRUE(assembled.ok());
  int64_t ranks = 1;
  for (int64_t h : hierarchy) ranks *= h;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    auto slice = LocalSlice(logical, nd_sbp, hierarchy, rank);
    EXPECT_TRUE(slice.ok()) << slice.status();
    KernelContext ctx;
    ctx.attrs = &canonical;
    ctx.step = step;
    ctx.pool = pool;
    if (input != nullptr) {
      auto block = ExtractBlock(*input, slice->offset, slice->local);
      EXPECT_TRUE(block.ok()) << block.status();
      ctx.inputs.push_back(*block);
      ctx.input_slices.push_back(*slice);
    }
    auto out = Tensor::Empty(slice->local, DType::kF32);
    EXPECT_TRUE(out.ok());
    ctx.outputs.push_back(*out);
    ctx.output_slices.push_back(*slice);
    const absl::Status status = RunKernel(schema, ctx);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(CopyBlock(ctx.outputs[0], std::vector<int64_t>(static_cast<size_t>(logical.rank()), 0), *assembled,
                          slice->offset, slice->local)
                    .ok());
  }
  return assembled->ToVector<float>();
}

TEST(RandomOps, ThreeShardsOnAnyAxisGiveTheUnsplitNumbers) {
  const Shape shape{37, 23, 5};
  const Tensor x = RandomTensor(shape, 12);
  const AttrMap normal{{"shape", shape.dims()}, {"seed", int64_t{77}}, {"tensor_id", int64_t{4}}};
  const AttrMap uniform{
      {"shape", shape.dims()}, {"low", -1.0}, {"high", 2.0}, {"seed", int64_t{77}}, {"tensor_id", int64_t{5}}};
  const AttrMap dropout{{"rate", 0.25}, {"seed", int64_t{77}}, {"tensor_id", int64_t{6}}};
  const int64_t step = 3;
  const std::vector<float> whole_normal = RunFloats("normal", {}, normal, step);
  const std::vector<float> whole_uniform = RunFloats("uniform", {}, uniform, step);
  const std::vector<float> whole_dropout = RunFloats("dropout", {x}, dropout, step);
  for (int axis = 0; axis < shape.rank(); ++axis) {
    SCOPED_TRACE(::testing::Message() << "S(" << axis << ") over 3 shards");
    const NdSbp sbp{Sbp::Split(axis)};
    EXPECT_TRUE(BitwiseEqual(RunSharded("normal", nullptr, normal, shape, sbp, {3}, step, nullptr), whole_normal));
    EXPECT_TRUE(BitwiseEqual(RunSharded("uniform", nullptr, uniform, shape, sbp, {3}, step, nullptr), whole_uniform));
    EXPECT_TRUE(BitwiseEqual(RunSharded("dropout", &x, dropout, shape, sbp, {3}, step, nullptr), whole_dropout));
  }
}

TEST(RandomOps, NestedSplitsAndThreadsGiveTheUnsplitNumbers) {
  // Large enough that the intra-op threads cut runs into several chunks, and
  // a [2, 3] hierarchy splitting two axes at once (blocks with gaps on both).
  const Shape shape{301, 257};
  const Tensor x = RandomTensor(shape, 13);
  const AttrMap normal{{"shape", shape.dims()}, {"seed", int64_t{8}}, {"tensor_id", int64_t{1}}};
  const AttrMap dropout{{"rate", 0.5}, {"seed", int64_t{8}}, {"tensor_id", int64_t{2}}};
  ThreadPool pool(4);
  const std::vector<float> whole_normal = RunFloats("normal", {}, normal);
  const std::vector<float> whole_dropout = RunFloats("dropout", {x}, dropout);
  EXPECT_TRUE(BitwiseEqual(RunFloats("normal", {}, normal, 0, &pool), whole_normal));
  for (const NdSbp& sbp : {NdSbp{Sbp::Split(0), Sbp::Split(1)}, NdSbp{Sbp::Split(1), Sbp::Split(0)},
                           NdSbp{Sbp::Split(1), Sbp::Split(1)}}) {
    SCOPED_TRACE(NdSbpToString(sbp));
    EXPECT_TRUE(BitwiseEqual(RunSharded("normal", nullptr, normal, shape, sbp, {2, 3}, 0, &pool), whole_normal));
    EXPECT_TRUE(BitwiseEqual(RunSharded("dropout", &x, dropout, shape, sbp, {2, 3}, 0, &pool), whole_dropout));
  }
}

// ---- optimizers --------------------------------------------------------------

// Runs an update kernel with outputs aliasing the inputs they replace
// (inputs[0..num_outputs)): the in-place form the runtime uses.
void RunInPlace(const std::string& op, const std::vector<Tensor>& inputs, const AttrMap& attrs, int64_t step,
                ThreadPool* pool) {
  const OpSchema& schema = *BuiltinOps().Find(op);
  const AttrMap canonical = Canonical(op, attrs);
  KernelContext ctx;
  ctx.attrs = &canonical;
  ctx.step = step;
  ctx.pool = pool;
  ctx.inputs = inputs;
  std::vector<TensorMeta> metas;
  for (const Tensor& t : inputs) metas.push_back(t.meta());
  const absl::StatusOr<std::vector<TensorMeta>> output_metas = schema.InferMeta(metas, canonical);
  ASSERT_TRUE(output_metas.ok()) << output_metas.status();
  const int num_outputs = static_cast<int>(output_metas->size());  // (sgd_update at momentum 0: one)
  // Outputs: new param = param (input 0), then the state tensors, which
  // follow grad (input 1).
  ctx.outputs.push_back(inputs[0]);
  for (int k = 1; k < num_outputs; ++k) ctx.outputs.push_back(inputs[static_cast<size_t>(k + 1)]);
  const absl::Status status = RunKernel(schema, ctx);
  ASSERT_TRUE(status.ok()) << status;
}

void ExpectClose(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  const std::vector<float> g = got.ToVector<float>();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], want[i], 2e-6 + 2e-5 * std::abs(want[i])) << what << " element " << i;
  }
}

std::vector<double> AsDoubles(const Tensor& t) {
  const std::vector<float> f = t.ToVector<float>();
  return std::vector<double>(f.begin(), f.end());
}

TEST(OptimizerOps, SgdInPlaceMatchesPyTorchOverThreeSteps) {
  ThreadPool pool(3);
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "heavy ball");
    const Shape shape{50001};  // several threads' chunks, odd length
    const Tensor param = RandomTensor(shape, 1), buf = Filled(shape, 0.0f);
    std::vector<double> p = AsDoubles(param), b = AsDoubles(buf);
    const double momentum = 0.9, weight_decay = 0.05;
    const AttrMap attrs{{"momentum", momentum}, {"weight_decay", weight_decay}, {"nesterov", nesterov}};
    const float lrs[] = {0.1f, 0.05f, 0.025f};
    for (int step = 0; step < 3; ++step) {
      const Tensor grad = RandomTensor(shape, 100 + static_cast<uint64_t>(step));
      const std::vector<double> g = AsDoubles(grad);
      RunInPlace("sgd_update", {param, grad, buf, Tensor::FromVector<float>(Shape{}, {lrs[step]})}, attrs, step, &pool);
      // torch.optim.SGD: d_p = g + wd p; buf = momentum buf + d_p (buf = d_p on
      // the first step, the same with buf starting at zero); p -= lr * (nesterov ?
      // d_p + momentum buf : buf).
      for (size_t i = 0; i < p.size(); ++i) {
        const double d = g[i] + weight_decay * p[i];
        b[i] = momentum * b[i] + d;
        p[i] -= static_cast<double>(lrs[step]) * (nesterov ? d + momentum * b[i] : b[i]);
      }
      ExpectClose(param, p, "param");
      ExpectClose(buf, b, "momentum_buf");
    }
  }
}

// Momentum 0 keeps no buffer: (param, grad, lr[, skip]) -> param', in
// place, param - lr * (grad + wd * param); a nonzero skip leaves it.
TEST(OptimizerOps, SgdWithoutMomentumInPlaceMatchesPyTorch) {
  ThreadPool pool(3);
  const Shape shape{50001};
  const Tensor param = RandomTensor(shape, 3);
  std::vector<double> p = AsDoubles(param);
  const double weight_decay = 0.05;
  const AttrMap attrs{{"weight_decay", weight_decay}};
  const float lrs[] = {0.1f, 0.05f};
  for (int step = 0; step < 2; ++step) {
    const Tensor grad = RandomTensor(shape, 300 + static_cast<uint64_t>(step));
    const std::vector<double> g = AsDoubles(grad);
    RunInPlace("sgd_update", {param, grad, Tensor::FromVector<float>(Shape{}, {lrs[step]})}, attrs, step, &pool);
    for (size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<double>(lrs[step]) * (g[i] + weight_decay * p[i]);
    ExpectClose(param, p, "param");
  }
  RunInPlace("sgd_update",
             {param, RandomTensor(shape, 400), Tensor::FromVector<float>(Shape{}, {0.1f}),
              Tensor::FromVector<float>(Shape{}, {1.0f})},
             attrs, 2, &pool);
  ExpectClose(param, p, "param after a skipped step");
}

TEST(OptimizerOps, AdamwInPlaceMatchesPyTorchOverThreeSteps) {
  ThreadPool pool(3);
  const Shape shape{317, 129};
  const Tensor param = RandomTensor(shape, 2), m = Filled(shape, 0.0f), v = Filled(shape, 0.0f);
  std::vector<double> p = AsDoubles(param), m_ref(p.size(), 0.0), v_ref(p.size(), 0.0);
  const double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  const AttrMap attrs{{"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay}};
  const float lrs[] = {1e-3f, 2e-3f, 3e-3f};  // a warm-up schedule
  for (int step = 0; step < 3; ++step) {
    const Tensor grad = RandomTensor(shape, 200 + static_cast<uint64_t>(step));
    const std::vector<double> g = AsDoubles(grad);
    RunInPlace("adamw_update", {param, grad, m, v, Tensor::FromVector<float>(Shape{}, {lrs[step]})}, attrs, step,
               &pool);
    // torch.optim.AdamW (_single_tensor_adamw), t = step + 1.
    const double lr = lrs[step], t = step + 1;
    const double c1 = 1 - std::pow(beta1, t), c2 = 1 - std::pow(beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * weight_decay;
      m_ref[i] += (g[i] - m_ref[i]) * (1 - beta1);
      v_ref[i] = beta2 * v_ref[i] + (1 - beta2) * g[i] * g[i];
      p[i] -= lr / c1 * m_ref[i] / (std::sqrt(v_ref[i]) / std::sqrt(c2) + eps);
    }
    ExpectClose(param, p, "param");
    ExpectClose(m, m_ref, "m");
    ExpectClose(v, v_ref, "v");
  }
}

// ---- embedding ---------------------------------------------------------------

TEST(EmbeddingOps, IdOutsideTheVocabularyIsAnErrorNamingIt) {
  const Tensor weight = RandomTensor(Shape{7, 3}, 1);
  for (int64_t bad : {int64_t{7}, int64_t{-1}}) {
    const Tensor ids = Tensor::FromVector<int64_t>(Shape{3}, {0, bad, 2});
    auto y = RunOp("embedding", {weight, ids});
    ASSERT_FALSE(y.ok());
    EXPECT_NE(std::string(y.status().message()).find("id " + std::to_string(bad)), std::string::npos) << y.status();
    EXPECT_NE(std::string(y.status().message()).find("[0, 7)"), std::string::npos) << y.status();
    auto dw = RunOp("embedding_grad", {RandomTensor(Shape{3, 3}, 2), ids}, {{"num_embeddings", int64_t{7}}});
    ASSERT_FALSE(dw.ok());
    EXPECT_NE(std::string(dw.status().message()).find("id " + std::to_string(bad)), std::string::npos) << dw.status();
  }
}

TEST(EmbeddingOps, GradIsBitwiseTheSameForAnyThreadCount) {
  const int64_t V = 1000, C = 64, N = 20000;
  std::mt19937_64 rng(3);
  std::vector<int32_t> id_values(static_cast<size_t>(N));
  // Skewed ids: many repeats of a few rows, like real token frequencies.
  for (int32_t& id : id_values) id = static_cast<int32_t>(rng() % 7 == 0 ? rng() % 5 : rng() % V);
  const Tensor ids = Tensor::FromVector<int32_t>(Shape{N}, id_values);
  const Tensor dy = RandomTensor(Shape{N, C}, 4);
  const AttrMap attrs{{"num_embeddings", V}};
  ThreadPool pool(4);
  const std::vector<float> serial = RunFloats("embedding_grad", {dy, ids}, attrs);
  EXPECT_TRUE(BitwiseEqual(RunFloats("embedding_grad", {dy, ids}, attrs, 0, &pool), serial));
  // Spot-check against a double sum in id order.
  for (int64_t row : {int64_t{0}, int64_t{3}, V - 1}) {
    std::vector<double> want(static_cast<size_t>(C), 0.0);
    const std::vector<float> d = dy.ToVector<float>();
    for (int64_t n = 0; n < N; ++n) {
      if (id_values[static_cast<size_t>(n)] != row) continue;
      for (int64_t c = 0; c < C; ++c) want[static_cast<size_t>(c)] += d[static_cast<size_t>(n * C + c)];
    }
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(serial[static_cast<size_t>(row * C + c)], want[static_cast<size_t>(c)], 1e-4) << row << ", " << c;
    }
  }
}

// ---- attribute and shape errors ----------------------------------------------

TEST(MiscOps, BadAttributesAndShapesAreErrors) {
  const Tensor x = RandomTensor(Shape{4}, 1);
  const Tensor lr = Tensor::FromVector<float>(Shape{}, {0.1f});
  const AttrMap stream{{"seed", int64_t{1}}, {"tensor_id", int64_t{0}}};
  auto with = [](AttrMap attrs, const std::string& name, AttrValue value) {
    attrs.Set(name, std::move(value));
    return attrs;
  };
  EXPECT_FALSE(RunOp("dropout", {x}, with(stream, "rate", 1.0)).ok());
  EXPECT_FALSE(RunOp("dropout", {x}, with(with(stream, "rate", 0.5), "tensor_id", int64_t{-1})).ok());
  const AttrMap shaped = with(stream, "shape", std::vector<int64_t>{3});
  EXPECT_FALSE(RunOp("uniform", {}, with(with(shaped, "low", 2.0), "high", 1.0)).ok());
  // Past f32's range, the samples were inf or NaN.
  EXPECT_FALSE(RunOp("uniform", {}, with(with(shaped, "low", -3e38), "high", 3e38)).ok()) << "span overflows f32";
  EXPECT_FALSE(RunOp("uniform", {}, with(with(shaped, "low", 0.0), "high", 1e39)).ok());
  EXPECT_TRUE(RunOp("uniform", {}, with(with(shaped, "low", -1e38), "high", 1e38)).ok());
  EXPECT_FALSE(RunOp("normal", {}, with(shaped, "std", 1e39)).ok());
  EXPECT_FALSE(RunOp("normal", {}, with(shaped, "mean", -1e39)).ok());
  EXPECT_FALSE(RunOp("normal", {}, with(shaped, "std", -1.0)).ok());
  EXPECT_FALSE(RunOp("normal", {}, with(stream, "shape", std::vector<int64_t>{2, -1})).ok());
  EXPECT_FALSE(RunOp("normal", {}, {{"shape", std::vector<int64_t>{3}}, {"seed", int64_t{1}}}).ok())
      << "tensor_id is required";
  EXPECT_FALSE(RunOp("sgd_update", {x, x, x, lr}, {{"nesterov", true}}).ok()) << "nesterov without momentum";
  const AttrMap momentum{{"momentum", 0.9}};
  EXPECT_FALSE(RunOp("sgd_update", {x, x, RandomTensor(Shape{5}, 2), lr}, momentum).ok()) << "buffer shape";
  EXPECT_FALSE(RunOp("sgd_update", {x, x, x, RandomTensor(Shape{2}, 2)}, momentum).ok()) << "lr with two elements";
  EXPECT_FALSE(RunOp("sgd_update", {x, x, lr}, momentum).ok()) << "no buffer with momentum";
  // Momentum 0 keeps no buffer: (param, grad, lr[, skip]) -> param'.
  EXPECT_FALSE(RunOp("sgd_update", {x, x, x, lr}).ok()) << "a buffer without momentum";
  EXPECT_FALSE(RunOp("sgd_update", {x, x, RandomTensor(Shape{2}, 2)}).ok()) << "lr with two elements";
  EXPECT_FALSE(RunOp("adamw_update", {x, x, x, x, lr}, {{"beta1", 1.0}}).ok());
  const Tensor weight = RandomTensor(Shape{5, 3}, 3);
  EXPECT_FALSE(RunOp("embedding", {weight, x}).ok()) << "float ids";
  EXPECT_FALSE(RunOp("embedding_grad", {RandomTensor(Shape{4, 3}, 4), Tensor::FromVector<int64_t>(Shape{3}, {0, 1, 2})},
                     {{"num_embeddings", int64_t{5}}})
                   .ok())
      << "dy rows do not match ids";
}

}  // namespace
}  // namespace tessera::ops
