// Cases for the embedding, random and optimizer families. References are
// plain loops in double; the random ones draw Philox element by element from
// the logical index (block i / 4, lane i % 4), independently of how the
// kernels walk runs and blocks, so the harness's SBP check doubles as a
// layout-invariance check.

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

OpTestCase Case(std::string op, std::string label, std::vector<Tensor> inputs, AttrMap attrs, ReferenceFn reference,
                int64_t step = 0) {
  OpTestCase c = MakeCase(std::move(op), std::move(label), std::move(inputs), std::move(reference), std::move(attrs));
  c.step = step;
  return c;
}

Tensor Ids(const Shape& shape, const std::vector<int64_t>& values, DType dtype) {
  auto t = Tensor::Empty(shape, dtype);
  TESSERA_CHECK(t.ok());
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == t->NumElements());
  for (size_t i = 0; i < values.size(); ++i) {
    SetElementFromDouble(*t, static_cast<int64_t>(i), static_cast<double>(values[i]));
  }
  return *t;
}

Tensor Scalar(float value) { return Tensor::FromVector<float>(Shape{}, {value}); }

// ---- embedding -------------------------------------------------------------

std::vector<Tensor> EmbeddingReference(const std::vector<Tensor>& in, const AttrMap&) {
  const Tensor& weight = in[0];
  const Tensor& ids = in[1];
  const int64_t C = weight.shape()[1];
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(C);
  std::vector<double> out;
  for (int64_t n = 0; n < ids.NumElements(); ++n) {
    const int64_t id = static_cast<int64_t>(ElementAsDouble(ids, n));
    for (int64_t c = 0; c < C; ++c) out.push_back(ElementAsDouble(weight, id * C + c));
  }
  return {FromDoubles(Shape(dims), RefFloatDType(in), out)};
}

std::vector<Tensor> EmbeddingGradReference(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Tensor& dy = in[0];
  const Tensor& ids = in[1];
  const int64_t V = attrs.Int("num_embeddings");
  const int64_t C = dy.shape()[dy.shape().rank() - 1];
  std::vector<double> dweight(static_cast<size_t>(V * C), 0.0);
  for (int64_t n = 0; n < ids.NumElements(); ++n) {
    const int64_t id = static_cast<int64_t>(ElementAsDouble(ids, n));
    for (int64_t c = 0; c < C; ++c) dweight[static_cast<size_t>(id * C + c)] += ElementAsDouble(dy, n * C + c);
  }
  return {FromDoubles(Shape{V, C}, RefFloatDType(in), dweight)};
}

std::vector<OpTestCase> EmbeddingCases() {
  std::vector<OpTestCase> cases;
  // Ids cover 0 and V - 1 with repeats, so vocabulary-parallel shards each
  // see hits and misses and embedding_grad sums duplicates.
  cases.push_back(
      Case("embedding", "ids_i64_2d",
           {RandomUniform(Shape{7, 5}, 1), Ids(Shape{3, 4}, {0, 6, 3, 3, 1, 6, 0, 2, 5, 4, 6, 0}, DType::kI64)}, {},
           EmbeddingReference));
  cases.push_back(Case("embedding", "ids_i32_1d",
                       {RandomUniform(Shape{9, 3}, 2), Ids(Shape{5}, {8, 0, 3, 8, 1}, DType::kI32)}, {},
                       EmbeddingReference));
  cases.push_back(
      Case("embedding", "ids_3d_wide_rows",
           {RandomUniform(Shape{6, 11}, 3), Ids(Shape{2, 3, 2}, {5, 0, 1, 1, 2, 5, 3, 4, 0, 0, 5, 2}, DType::kI64)}, {},
           EmbeddingReference));
  cases.push_back(Case("embedding", "scalar_id", {RandomUniform(Shape{5, 7}, 4), Ids(Shape{}, {4}, DType::kI64)}, {},
                       EmbeddingReference));
  cases.push_back(
      Case("embedding_grad", "dy_3d_duplicates",
           {RandomUniform(Shape{3, 4, 5}, 5), Ids(Shape{3, 4}, {0, 6, 3, 3, 1, 6, 0, 2, 5, 4, 6, 0}, DType::kI64)},
           {{"num_embeddings", int64_t{7}}}, EmbeddingGradReference));
  cases.push_back(Case("embedding_grad", "ids_i32_unused_rows",
                       {RandomUniform(Shape{5, 3}, 6), Ids(Shape{5}, {8, 0, 3, 8, 1}, DType::kI32)},
                       {{"num_embeddings", int64_t{9}}}, EmbeddingGradReference));
  return cases;
}

// ---- random ------------------------------------------------------------------

struct StreamAttrs {
  uint64_t seed;
  uint32_t tensor_id;
  uint32_t step;
};

StreamAttrs StreamOf(const AttrMap& attrs, int64_t step) {
  return {static_cast<uint64_t>(attrs.Int("seed")), static_cast<uint32_t>(attrs.Int("tensor_id")),
          static_cast<uint32_t>(step)};
}

// The four words of the Philox block holding logical element `index`.
std::array<uint32_t, 4> BlockOf(const StreamAttrs& s, int64_t index) {
  const uint64_t block = static_cast<uint64_t>(index) / 4;
  return Philox4x32(MakePhiloxKey(s.seed), static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                    s.tensor_id, s.step);
}

uint32_t WordOf(const StreamAttrs& s, int64_t index) { return BlockOf(s, index)[static_cast<size_t>(index % 4)]; }

// Box–Muller on the lane's word pair: even lanes take the cos branch, odd
// lanes the sin branch. u1 as core/philox.h's BoxMuller defines it (an f32
// expression); the rest in double.
double StandardNormalOf(const StreamAttrs& s, int64_t index) {
  const std::array<uint32_t, 4> w = BlockOf(s, index);
  const size_t lane = static_cast<size_t>(index % 4), pair = lane / 2;
  const float u1 = (static_cast<float>(w[2 * pair] >> 8) + 1.0f) * (1.0f / 16777217.0f);
  const double u2 = UnitFloat(w[2 * pair + 1]);
  const double radius = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
  const double angle = 2.0 * std::numbers::pi * u2;
  return radius * (lane % 2 == 0 ? std::cos(angle) : std::sin(angle));
}

ReferenceFn NormalReference(int64_t step) {
  return [step](const std::vector<Tensor>&, const AttrMap& attrs) {
    const StreamAttrs s = StreamOf(attrs, step);
    const Shape shape(attrs.Ints("shape"));
    const double mean = attrs.Float("mean"), std = attrs.Float("std");
    return std::vector<Tensor>{
        FilledF32(shape, [&](int64_t i) { return static_cast<float>(mean + std * StandardNormalOf(s, i)); })};
  };
}

ReferenceFn UniformReference(int64_t step) {
  return [step](const std::vector<Tensor>&, const AttrMap& attrs) {
    const StreamAttrs s = StreamOf(attrs, step);
    const Shape shape(attrs.Ints("shape"));
    const double low = attrs.Float("low"), high = attrs.Float("high");
    return std::vector<Tensor>{FilledF32(shape, [&](int64_t i) {
      return static_cast<float>(low + (high - low) * static_cast<double>(UnitFloat(WordOf(s, i))));
    })};
  };
}

ReferenceFn DropoutReference(int64_t step) {
  return [step](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const StreamAttrs s = StreamOf(attrs, step);
    const double rate = attrs.Float("rate");
    std::vector<double> y;
    for (int64_t i = 0; i < in[0].NumElements(); ++i) {
      const bool keep = static_cast<double>(UnitFloat(WordOf(s, i))) >= rate;
      y.push_back(keep ? ElementAsDouble(in[0], i) / (1.0 - rate) : 0.0);
    }
    return std::vector<Tensor>{FromDoubles(in[0].shape(), RefFloatDType(in), y)};
  };
}

// y = residual + dropout(x + bias): the dropout reference's mask on x's shape.
ReferenceFn BiasDropoutAddReference(int64_t step) {
  return [step](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const StreamAttrs s = StreamOf(attrs, step);
    const double rate = attrs.Float("rate");
    const int64_t C = in[0].shape()[in[0].shape().rank() - 1];
    std::vector<double> y;
    for (int64_t i = 0; i < in[0].NumElements(); ++i) {
      const bool keep = rate == 0.0 || static_cast<double>(UnitFloat(WordOf(s, i))) >= rate;
      const double t = ElementAsDouble(in[0], i) + ElementAsDouble(in[1], i % C);
      y.push_back(ElementAsDouble(in[2], i) + (keep ? t / (1.0 - rate) : 0.0));
    }
    return std::vector<Tensor>{FromDoubles(in[0].shape(), RefFloatDType(in), y)};
  };
}

std::vector<OpTestCase> RandomCases() {
  std::vector<OpTestCase> cases;
  // Uneven extents so splits cut Philox blocks of four in the middle, and
  // inner-axis splits leave gaps between runs.
  cases.push_back(Case("normal", "2d", {},
                       {{"shape", std::vector<int64_t>{5, 7}}, {"seed", int64_t{42}}, {"tensor_id", int64_t{3}}},
                       NormalReference(0)));
  cases.push_back(Case("normal", "3d_mean_std_step_wide_seed", {},
                       {{"shape", std::vector<int64_t>{3, 5, 6}},
                        {"mean", 1.5},
                        {"std", 0.5},
                        {"seed", int64_t{0x123456789abcdefLL}},
                        {"tensor_id", int64_t{9}}},
                       NormalReference(7), 7));
  cases.push_back(Case("normal", "1d_odd", {},
                       {{"shape", std::vector<int64_t>{13}}, {"seed", int64_t{7}}, {"tensor_id", int64_t{0}}},
                       NormalReference(0)));
  cases.push_back(Case("uniform", "2d_range", {},
                       {{"shape", std::vector<int64_t>{6, 5}},
                        {"low", -2.0},
                        {"high", 3.0},
                        {"seed", int64_t{11}},
                        {"tensor_id", int64_t{1}}},
                       UniformReference(0)));
  cases.push_back(Case("uniform", "3d_step", {},
                       {{"shape", std::vector<int64_t>{2, 3, 7}}, {"seed", int64_t{5}}, {"tensor_id", int64_t{2}}},
                       UniformReference(2), 2));
  cases.push_back(Case("dropout", "2d_rate_0_3", {RandomUniform(Shape{5, 7}, 21)},
                       {{"rate", 0.3}, {"seed", int64_t{5}}, {"tensor_id", int64_t{1}}}, DropoutReference(0)));
  cases.push_back(Case("dropout", "3d_rate_0_5_step", {RandomUniform(Shape{3, 4, 5}, 22)},
                       {{"rate", 0.5}, {"seed", int64_t{6}}, {"tensor_id", int64_t{4}}}, DropoutReference(3), 3));
  cases.push_back(Case("dropout", "rate_0_copies", {RandomUniform(Shape{6}, 23)},
                       {{"rate", 0.0}, {"seed", int64_t{6}}, {"tensor_id", int64_t{4}}}, DropoutReference(0)));
  // Uneven extents (splits cut Philox blocks), the bias split with the
  // channel axis, a step, and rate 0 (bias_add then add).
  cases.push_back(
      Case("bias_dropout_add", "3d_rate_0_3",
           {RandomUniform(Shape{3, 5, 7}, 24), RandomUniform(Shape{7}, 25), RandomUniform(Shape{3, 5, 7}, 26)},
           {{"rate", 0.3}, {"seed", int64_t{8}}, {"tensor_id", int64_t{2}}}, BiasDropoutAddReference(0)));
  cases.push_back(Case("bias_dropout_add", "2d_rate_0_5_step",
                       {RandomUniform(Shape{6, 9}, 27), RandomUniform(Shape{9}, 28), RandomUniform(Shape{6, 9}, 29)},
                       {{"rate", 0.5}, {"seed", int64_t{3}}, {"tensor_id", int64_t{5}}}, BiasDropoutAddReference(4),
                       4));
  cases.push_back(Case("bias_dropout_add", "rate_0",
                       {RandomUniform(Shape{4, 6}, 30), RandomUniform(Shape{6}, 31), RandomUniform(Shape{4, 6}, 32)},
                       {{"rate", 0.0}, {"seed", int64_t{0}}, {"tensor_id", int64_t{0}}}, BiasDropoutAddReference(0)));
  return cases;
}

// ---- optimizers ----------------------------------------------------------------

// (Momentum 0 keeps no buffer: (param, grad, lr[, skip]) -> param'.)
std::vector<Tensor> SgdReference(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const double momentum = attrs.Float("momentum"), weight_decay = attrs.Float("weight_decay");
  const bool buffered = momentum != 0;
  const double lr = ElementAsDouble(in[buffered ? 3 : 2], 0);
  const bool nesterov = attrs.Bool("nesterov");
  std::vector<double> param, buf;
  for (int64_t i = 0; i < in[0].NumElements(); ++i) {
    const double p = ElementAsDouble(in[0], i);
    const double g = ElementAsDouble(in[1], i) + weight_decay * p;
    const double b = (buffered ? momentum * ElementAsDouble(in[2], i) : 0.0) + g;
    param.push_back(p - lr * (nesterov ? g + momentum * b : b));
    buf.push_back(b);
  }
  const DType dtype = RefFloatDType(in);
  if (!buffered) return {FromDoubles(in[0].shape(), dtype, param)};
  return {FromDoubles(in[0].shape(), dtype, param), FromDoubles(in[0].shape(), dtype, buf)};
}

ReferenceFn AdamwReference(int64_t step) {
  return [step](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const double lr = ElementAsDouble(in[4], 0);
    const double beta1 = attrs.Float("beta1"), beta2 = attrs.Float("beta2"), eps = attrs.Float("eps");
    const double weight_decay = attrs.Float("weight_decay");
    const double t = static_cast<double>(step + 1);
    const bool correct = attrs.Bool("bias_correction");
    const double c1 = correct ? 1 - std::pow(beta1, t) : 1, c2 = correct ? 1 - std::pow(beta2, t) : 1;
    std::vector<double> param, m, v;
    for (int64_t i = 0; i < in[0].NumElements(); ++i) {
      const double g = ElementAsDouble(in[1], i);
      const double mi = beta1 * ElementAsDouble(in[2], i) + (1 - beta1) * g;
      const double vi = beta2 * ElementAsDouble(in[3], i) + (1 - beta2) * g * g;
      const double p = ElementAsDouble(in[0], i) * (1 - lr * weight_decay);
      param.push_back(p - lr * (mi / c1) / (std::sqrt(vi / c2) + eps));
      m.push_back(mi);
      v.push_back(vi);
    }
    const Shape& shape = in[0].shape();
    const DType dtype = RefFloatDType(in);
    return std::vector<Tensor>{FromDoubles(shape, dtype, param), FromDoubles(shape, dtype, m),
                               FromDoubles(shape, dtype, v)};
  };
}

std::vector<OpTestCase> OptimizerCases() {
  std::vector<OpTestCase> cases;
  auto sgd_inputs = [](const Shape& shape, uint64_t seed) {
    return std::vector<Tensor>{RandomUniform(shape, seed), RandomUniform(shape, seed + 1),
                               RandomUniform(shape, seed + 2), Scalar(0.05f)};
  };
  cases.push_back(Case("sgd_update", "momentum_weight_decay", sgd_inputs(Shape{5, 7}, 31),
                       {{"momentum", 0.9}, {"weight_decay", 0.01}}, SgdReference));
  cases.push_back(Case("sgd_update", "nesterov_3d", sgd_inputs(Shape{3, 4, 5}, 34),
                       {{"momentum", 0.8}, {"nesterov", true}}, SgdReference));
  // Momentum 0: no buffer, one output.
  cases.push_back(Case("sgd_update", "plain", {RandomUniform(Shape{7}, 37), RandomUniform(Shape{7}, 38), Scalar(0.05f)},
                       {}, SgdReference));
  cases.push_back(Case("sgd_update", "plain_weight_decay_skip_0",
                       {RandomUniform(Shape{5, 3}, 39), RandomUniform(Shape{5, 3}, 40), Scalar(0.05f), Scalar(0.0f)},
                       {{"weight_decay", 0.1}}, SgdReference));
  cases.push_back(Case("sgd_update", "plain_skip_1_keeps",
                       {RandomUniform(Shape{5, 3}, 41), RandomUniform(Shape{5, 3}, 42), Scalar(0.05f), Scalar(1.0f)},
                       {}, [](const std::vector<Tensor>& in, const AttrMap&) { return std::vector<Tensor>{in[0]}; }));

  // v is a running mean of squares: non-negative, and kept away from 0 so the
  // f32 kernel is compared where the update is well conditioned.
  auto adamw_inputs = [](const Shape& shape, uint64_t seed) {
    return std::vector<Tensor>{RandomUniform(shape, seed), RandomUniform(shape, seed + 1),
                               RandomUniform(shape, seed + 2, -0.1f, 0.1f), RandomUniform(shape, seed + 3, 0.01f, 0.1f),
                               Scalar(0.01f)};
  };
  cases.push_back(Case("adamw_update", "defaults_first_step", adamw_inputs(Shape{5, 7}, 41), {}, AdamwReference(0)));
  cases.push_back(Case("adamw_update", "custom_betas_step_4", adamw_inputs(Shape{3, 4, 5}, 45),
                       {{"beta1", 0.8}, {"beta2", 0.95}, {"eps", 1e-6}, {"weight_decay", 0.1}}, AdamwReference(4), 4));
  cases.push_back(Case("adamw_update", "no_bias_correction", adamw_inputs(Shape{7}, 49), {{"bias_correction", false}},
                       AdamwReference(2), 2));

  // The optional skip input (fp16 loss scaling): 0 updates as without it,
  // nonzero hands the inputs back unchanged.
  const auto unchanged = [](size_t outputs) {
    return [outputs](const std::vector<Tensor>& in, const AttrMap&) {
      std::vector<Tensor> out = {in[0]};
      for (size_t k = 1; k < outputs; ++k) out.push_back(in[k + 1]);
      return out;
    };
  };
  const auto with = [](std::vector<Tensor> inputs, float skip) {
    inputs.push_back(Scalar(skip));
    return inputs;
  };
  cases.push_back(Case("sgd_update", "skip_0_updates", with(sgd_inputs(Shape{5, 3}, 51), 0.0f),
                       {{"momentum", 0.9}}, SgdReference));
  cases.push_back(Case("sgd_update", "skip_1_keeps", with(sgd_inputs(Shape{5, 3}, 54), 1.0f), {{"momentum", 0.9}},
                       unchanged(2)));
  cases.push_back(Case("adamw_update", "skip_0_updates", with(adamw_inputs(Shape{4, 5}, 57), 0.0f), {},
                       AdamwReference(0)));
  cases.push_back(Case("adamw_update", "skip_1_keeps", with(adamw_inputs(Shape{4, 5}, 61), 1.0f), {}, unchanged(3)));
  // skipped: steps skipped before, left out of t (iteration 7, 4 skipped:
  // the fourth update taken, t = 4).
  cases.push_back(Case("adamw_update", "skipped_4_iteration_7",
                       with(with(adamw_inputs(Shape{4, 5}, 63), 0.0f), 4.0f), {{"beta1", 0.8}, {"beta2", 0.9}},
                       AdamwReference(3), 7));
  cases.push_back(Case("adamw_update", "skipped_skip_keeps", with(with(adamw_inputs(Shape{6}, 64), 1.0f), 2.0f), {},
                       unchanged(3)));

  // nonfinite: 1 when any element is NaN or infinite.
  const auto nonfinite = [](const std::vector<Tensor>& in, const AttrMap&) {
    bool any = false;
    for (int64_t i = 0; i < in[0].NumElements(); ++i) any = any || !std::isfinite(ElementAsDouble(in[0], i));
    return std::vector<Tensor>{Scalar(any ? 1.0f : 0.0f)};
  };
  const auto with_value = [](Tensor t, int64_t at, float value) {
    t.data<float>()[at] = value;
    return t;
  };
  cases.push_back(Case("nonfinite", "finite", {RandomUniform(Shape{6, 5}, 65)}, {}, nonfinite));
  cases.push_back(
      Case("nonfinite", "one_inf", {with_value(RandomUniform(Shape{6, 5}, 66), 17, INFINITY)}, {}, nonfinite));
  cases.push_back(Case("nonfinite", "one_nan", {with_value(RandomUniform(Shape{40}, 67), 39, NAN)}, {}, nonfinite));
  cases.push_back(
      Case("nonfinite", "minus_inf_scalar", {with_value(RandomUniform(Shape{}, 68), 0, -INFINITY)}, {}, nonfinite));

  // loss_scale_update: GradScaler's rule.
  const auto scale_rule = [](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const double scale = ElementAsDouble(in[0], 0), good = ElementAsDouble(in[2], 0);
    double new_scale = scale, new_good = 0;
    if (ElementAsDouble(in[1], 0) != 0) {
      new_scale = scale * attrs.Float("backoff");
    } else if (good + 1 >= static_cast<double>(attrs.Int("growth_interval"))) {
      // (A scale the growth would overflow stays finite, as GradScaler's.)
      if (std::isfinite(static_cast<float>(scale * attrs.Float("growth")))) new_scale = scale * attrs.Float("growth");
    } else {
      new_good = good + 1;
    }
    return std::vector<Tensor>{Scalar(static_cast<float>(new_scale)), Scalar(static_cast<float>(new_good))};
  };
  cases.push_back(Case("loss_scale_update", "overflow_halves", {Scalar(65536.0f), Scalar(1.0f), Scalar(7.0f)}, {},
                       scale_rule));
  cases.push_back(Case("loss_scale_update", "clean_counts", {Scalar(65536.0f), Scalar(0.0f), Scalar(7.0f)},
                       {{"growth_interval", int64_t{10}}}, scale_rule));
  cases.push_back(Case("loss_scale_update", "interval_doubles", {Scalar(1024.0f), Scalar(0.0f), Scalar(9.0f)},
                       {{"growth_interval", int64_t{10}}}, scale_rule));
  cases.push_back(Case("loss_scale_update", "custom_factors", {Scalar(8.0f), Scalar(1.0f), Scalar(3.0f)},
                       {{"backoff", 0.25}, {"growth", 4.0}}, scale_rule));
  cases.push_back(Case("loss_scale_update", "growth_stays_finite", {Scalar(0x1p127f), Scalar(0.0f), Scalar(9.0f)},
                       {{"growth_interval", int64_t{10}}}, scale_rule));
  return cases;
}

}  // namespace

std::vector<OpTestCase> MiscCases() {
  std::vector<OpTestCase> cases;
  for (auto family : {EmbeddingCases, RandomCases, OptimizerCases}) {
    for (OpTestCase& c : family()) cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace tessera::ops::testing
