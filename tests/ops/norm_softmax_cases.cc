// Test cases of the normalisation / softmax family and the cross-entropy
// family (ops/norm_softmax.cc, ops/loss.cc). References are plain double
// loops over rows of the last axis, written from the definitions. Below the
// cases: error paths the harness does not cover, and the vocabulary-parallel
// cross-entropy composition checked end to end against the fused op.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/tensor_util.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

OpTestCase Case(std::string op, std::string label, std::vector<Tensor> inputs, ReferenceFn ref, AttrMap attrs = {}) {
  return MakeCase(std::move(op), std::move(label), std::move(inputs), std::move(ref), std::move(attrs));
}

int64_t LastDim(const Tensor& t) { return t.shape()[t.shape().rank() - 1]; }

Shape WithoutLast(const Shape& s) {
  std::vector<int64_t> dims = s.dims();
  dims.pop_back();
  return Shape(std::move(dims));
}

// ---- softmax family references

// Softmax (or log-softmax) of each row; a row of all -inf gives zeros.
std::vector<double> SoftmaxRows(const std::vector<double>& x, int64_t C, bool log) {
  std::vector<double> y(x.size());
  for (size_t r0 = 0; r0 < x.size(); r0 += static_cast<size_t>(C)) {
    double m = kNegInf;
    for (int64_t j = 0; j < C; ++j) m = std::max(m, x[r0 + static_cast<size_t>(j)]);
    double sum = 0;
    for (int64_t j = 0; j < C; ++j) sum += std::exp(x[r0 + static_cast<size_t>(j)] - m);
    for (int64_t j = 0; j < C; ++j) {
      const double v = x[r0 + static_cast<size_t>(j)];
      if (m == kNegInf) {
        y[r0 + static_cast<size_t>(j)] = 0;
      } else {
        y[r0 + static_cast<size_t>(j)] = log ? v - m - std::log(sum) : std::exp(v - m) / sum;
      }
    }
  }
  return y;
}

ReferenceFn SoftmaxRef(bool log) {
  return [log](const std::vector<Tensor>& in, const AttrMap&) {
    const std::vector<double> y = SoftmaxRows(in[0].ToDoubleVector(), LastDim(in[0]), log);
    return std::vector<Tensor>{FromDoubles(in[0].shape(), RefFloatDType(in), y)};
  };
}

// softmax_grad: dx = y (dy - Σ y dy); log_softmax_grad: dx = dy - exp(y) Σ dy.
ReferenceFn SoftmaxGradRef(bool log) {
  return [log](const std::vector<Tensor>& in, const AttrMap&) {
    const std::vector<double> y = in[0].ToDoubleVector(), dy = in[1].ToDoubleVector();
    const int64_t C = LastDim(in[0]);
    std::vector<double> dx(y.size());
    for (size_t r0 = 0; r0 < y.size(); r0 += static_cast<size_t>(C)) {
      double s = 0;
      for (int64_t j = 0; j < C; ++j) {
        const size_t k = r0 + static_cast<size_t>(j);
        s += log ? dy[k] : y[k] * dy[k];
      }
      for (int64_t j = 0; j < C; ++j) {
        const size_t k = r0 + static_cast<size_t>(j);
        dx[k] = log ? dy[k] - std::exp(y[k]) * s : y[k] * (dy[k] - s);
      }
    }
    return std::vector<Tensor>{FromDoubles(in[0].shape(), RefFloatDType(in), dx)};
  };
}

// x (..., T, S); mask (optional) broadcast to x; masked and (causal) future
// keys get -inf before the softmax.
ReferenceFn FusedSoftmaxRef(bool has_mask, bool always_causal) {
  return [has_mask, always_causal](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const Shape& shape = in[0].shape();
    const int rank = shape.rank();
    const int64_t T = shape[rank - 2], S = shape[rank - 1];
    const bool causal = always_causal || (attrs.Has("causal") && attrs.Bool("causal"));
    const double scale = attrs.Float("scale");
    const auto strides = shape.Strides();
    std::vector<double> z(static_cast<size_t>(in[0].NumElements()));
    for (int64_t i = 0; i < in[0].NumElements(); ++i) {
      const int64_t t = (i / S) % T, s = i % S;
      bool keep = !causal || s <= t + (S - T);
      if (has_mask) {
        const Shape& ms = in[1].shape();
        const auto mstrides = ms.Strides();
        int64_t offset = 0;
        for (int a = 0; a < rank; ++a) {
          const int own = a - (rank - ms.rank());
          const int64_t idx = (i / strides[static_cast<size_t>(a)]) % shape[a];
          if (own >= 0 && ms[own] != 1) offset += idx * mstrides[static_cast<size_t>(own)];
        }
        keep = keep && in[1].data<bool>()[offset];
      }
      z[static_cast<size_t>(i)] = keep ? scale * ElementAsDouble(in[0], i) : kNegInf;
    }
    return std::vector<Tensor>{FromDoubles(shape, RefFloatDType(in), SoftmaxRows(z, S, /*log=*/false))};
  };
}

// ---- layer_norm / rms_norm references

struct RowStats {
  std::vector<double> mean, rstd;
};

RowStats Stats(const Tensor& x, double eps, bool rms) {
  const std::vector<double> v = x.ToDoubleVector();
  const int64_t C = LastDim(x);
  RowStats st;
  for (size_t r0 = 0; r0 < v.size(); r0 += static_cast<size_t>(C)) {
    double mu = 0;
    if (!rms) {
      for (int64_t j = 0; j < C; ++j) mu += v[r0 + static_cast<size_t>(j)];
      mu /= static_cast<double>(C);
    }
    double var = 0;
    for (int64_t j = 0; j < C; ++j)
      var += (v[r0 + static_cast<size_t>(j)] - mu) * (v[r0 + static_cast<size_t>(j)] - mu);
    var /= static_cast<double>(C);
    st.mean.push_back(mu);
    st.rstd.push_back(1 / std::sqrt(var + eps));
  }
  return st;
}

ReferenceFn LayerNormRef(bool rms) {
  return [rms](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const RowStats st = Stats(in[0], attrs.Float("eps"), rms);
    const std::vector<double> x = in[0].ToDoubleVector(), gamma = in[1].ToDoubleVector();
    const std::vector<double> beta = rms ? std::vector<double>(gamma.size(), 0.0) : in[2].ToDoubleVector();
    const size_t C = gamma.size();
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t r = i / C, j = i % C;
      y[i] = (x[i] - st.mean[r]) * st.rstd[r] * gamma[j] + beta[j];
    }
    const Shape stats_shape = WithoutLast(in[0].shape());
    const DType dtype = RefFloatDType(in);
    if (rms) return std::vector<Tensor>{FromDoubles(in[0].shape(), dtype, y), FromDoubles(stats_shape, dtype, st.rstd)};
    return std::vector<Tensor>{FromDoubles(in[0].shape(), dtype, y), FromDoubles(stats_shape, dtype, st.mean),
                               FromDoubles(stats_shape, dtype, st.rstd)};
  };
}

// Backward of y = xhat * gamma (+ beta), xhat = (x - mean) * rstd, written as
// the chain rule through the statistics, per row:
//   dxhat = dy * gamma
//   layer: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   rms:   dx = rstd * (dxhat - xhat * mean(dxhat * xhat))
// Inputs: (dy, x, mean, rstd, gamma) or, for rms, (dy, x, rstd, gamma).
ReferenceFn NormGradRef(bool rms) {
  return [rms](const std::vector<Tensor>& in, const AttrMap&) {
    const std::vector<double> dy = in[0].ToDoubleVector(), x = in[1].ToDoubleVector();
    const std::vector<double> rstd = in[rms ? 2 : 3].ToDoubleVector(), gamma = in[rms ? 3 : 4].ToDoubleVector();
    const std::vector<double> mean = rms ? std::vector<double>(rstd.size(), 0.0) : in[2].ToDoubleVector();
    const size_t C = gamma.size();
    std::vector<double> dx(x.size()), dgamma(C), dbeta(C);
    for (size_t r = 0; r < rstd.size(); ++r) {
      double sum_g = 0, sum_gx = 0;
      for (size_t j = 0; j < C; ++j) {
        const double xhat = (x[r * C + j] - mean[r]) * rstd[r], g = dy[r * C + j] * gamma[j];
        sum_g += g;
        sum_gx += g * xhat;
        dgamma[j] += dy[r * C + j] * xhat;
        dbeta[j] += dy[r * C + j];
      }
      for (size_t j = 0; j < C; ++j) {
        const double xhat = (x[r * C + j] - mean[r]) * rstd[r], g = dy[r * C + j] * gamma[j];
        const double centred = rms ? g : g - sum_g / static_cast<double>(C);
        dx[r * C + j] = rstd[r] * (centred - xhat * sum_gx / static_cast<double>(C));
      }
    }
    const Shape c_shape{static_cast<int64_t>(C)};
    const DType dtype = RefFloatDType(in);
    if (rms) return std::vector<Tensor>{FromDoubles(in[1].shape(), dtype, dx), FromDoubles(c_shape, dtype, dgamma)};
    return std::vector<Tensor>{FromDoubles(in[1].shape(), dtype, dx), FromDoubles(c_shape, dtype, dgamma),
                               FromDoubles(c_shape, dtype, dbeta)};
  };
}

// ---- cross-entropy references

int64_t LabelAt(const Tensor& labels, int64_t n) { return static_cast<int64_t>(ElementAsDouble(labels, n)); }

// Per row: (max, Σ exp(x - max)).
std::vector<std::pair<double, double>> RowMaxSumExp(const std::vector<double>& x, int64_t V) {
  std::vector<std::pair<double, double>> out;
  for (size_t r0 = 0; r0 < x.size(); r0 += static_cast<size_t>(V)) {
    double m = kNegInf, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, x[r0 + static_cast<size_t>(j)]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[r0 + static_cast<size_t>(j)] - m);
    out.push_back({m, s});
  }
  return out;
}

std::vector<Tensor> SparseCrossEntropyRef(const std::vector<Tensor>& in, const AttrMap&) {
  const std::vector<double> x = in[0].ToDoubleVector();
  const int64_t N = in[0].shape()[0], V = in[0].shape()[1];
  const auto ms = RowMaxSumExp(x, V);
  std::vector<double> loss(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const auto [m, s] = ms[static_cast<size_t>(n)];
    loss[static_cast<size_t>(n)] = m + std::log(s) - x[static_cast<size_t>(n * V + LabelAt(in[1], n))];
  }
  return {FromDoubles(Shape{N}, RefFloatDType(in), loss)};
}

std::vector<Tensor> SparseCrossEntropyGradRef(const std::vector<Tensor>& in, const AttrMap&) {
  const std::vector<double> x = in[0].ToDoubleVector();
  const int64_t N = in[0].shape()[0], V = in[0].shape()[1];
  const auto ms = RowMaxSumExp(x, V);
  std::vector<double> dx(x.size());
  for (int64_t n = 0; n < N; ++n) {
    const auto [m, s] = ms[static_cast<size_t>(n)];
    const double dloss = ElementAsDouble(in[2], n);
    for (int64_t j = 0; j < V; ++j) {
      const double onehot = j == LabelAt(in[1], n) ? 1 : 0;
      dx[static_cast<size_t>(n * V + j)] = (std::exp(x[static_cast<size_t>(n * V + j)] - m) / s - onehot) * dloss;
    }
  }
  return {FromDoubles(in[0].shape(), RefFloatDType(in), dx)};
}

std::vector<Tensor> PartialsRef(const std::vector<Tensor>& in, const AttrMap&) {
  const int64_t N = in[0].shape()[0], V = in[0].shape()[1];
  std::vector<double> sumexp(static_cast<size_t>(N)), label_logit(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const double m = ElementAsDouble(in[1], n);
    for (int64_t j = 0; j < V; ++j) sumexp[static_cast<size_t>(n)] += std::exp(ElementAsDouble(in[0], n * V + j) - m);
    label_logit[static_cast<size_t>(n)] = ElementAsDouble(in[0], n * V + LabelAt(in[2], n)) - m;
  }
  const DType dtype = RefFloatDType(in);
  return {FromDoubles(Shape{N, 1}, dtype, sumexp), FromDoubles(Shape{N, 1}, dtype, label_logit)};
}

std::vector<Tensor> PartialsGradRef(const std::vector<Tensor>& in, const AttrMap&) {
  const int64_t N = in[0].shape()[0], V = in[0].shape()[1];
  std::vector<double> dx(static_cast<size_t>(N * V));
  for (int64_t n = 0; n < N; ++n) {
    const double m = ElementAsDouble(in[1], n), ds = ElementAsDouble(in[3], n), dl = ElementAsDouble(in[4], n);
    for (int64_t j = 0; j < V; ++j) {
      dx[static_cast<size_t>(n * V + j)] =
          ds * std::exp(ElementAsDouble(in[0], n * V + j) - m) + (j == LabelAt(in[2], n) ? dl : 0.0);
    }
  }
  return {FromDoubles(in[0].shape(), RefFloatDType(in), dx)};
}

// ---- inputs

Tensor Bools(const Shape& shape, const std::vector<int>& values) {
  auto t = Tensor::Empty(shape, DType::kBool);
  TESSERA_CHECK(t.ok());
  for (int64_t i = 0; i < t->NumElements(); ++i) t->data<bool>()[i] = values[static_cast<size_t>(i)] != 0;
  return *t;
}

Tensor Labels(const std::vector<int64_t>& values, DType dtype) {
  auto t = Tensor::Empty(Shape{static_cast<int64_t>(values.size())}, dtype);
  TESSERA_CHECK(t.ok());
  for (size_t i = 0; i < values.size(); ++i)
    SetElementFromDouble(*t, static_cast<int64_t>(i), static_cast<double>(values[i]));
  return *t;
}

Tensor RowMaxPlus(const Tensor& logits, double extra) {
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const auto ms = RowMaxSumExp(logits.ToDoubleVector(), V);
  return FilledF32(Shape{N, 1},
                   [&](int64_t n) { return static_cast<float>(ms[static_cast<size_t>(n)].first + extra); });
}

void AddSoftmaxCases(std::vector<OpTestCase>& cases) {
  for (bool log : {false, true}) {
    const std::string op = log ? "log_softmax" : "softmax";
    cases.push_back(Case(op, "5x7", {RandomUniform({5, 7}, 1, -3, 3)}, SoftmaxRef(log)));
    cases.push_back(Case(op, "3x5x6", {RandomUniform({3, 5, 6}, 2, -3, 3)}, SoftmaxRef(log)));
    cases.push_back(Case(op, "3x37 rows longer than a vector", {RandomUniform({3, 37}, 3, -3, 3)}, SoftmaxRef(log)));
    cases.push_back(Case(op, "rank 1", {RandomUniform({9}, 4, -3, 3)}, SoftmaxRef(log)));
    // exp(100) overflows f32: only a max-subtracted kernel gets these right.
    // x - max in f32 is off by up to ulp(100) = 8e-6, which the gradient carries.
    OpTestCase near_100 = Case(op, "logits near 100", {RandomUniform({4, 5}, 5, 95, 105)}, SoftmaxRef(log));
    near_100.grad_atol = 1e-5;
    near_100.grad_rtol = 1e-4;
    cases.push_back(near_100);
    // log_softmax as (x - max) - log Σ: max + log Σ, rounded first, was off
    // by ulp(1e4) = 1e-3 here. (No finite differences at this magnitude.)
    OpTestCase near_1e4 = Case(op, "logits near 1e4", {RandomUniform({4, 50}, 8, 9990, 10010)}, SoftmaxRef(log));
    near_1e4.check_grad = false;
    cases.push_back(near_1e4);

    const std::string grad_op = op + "_grad";
    for (const Shape& s : {Shape{5, 7}, Shape{3, 5, 6}, Shape{2, 37}}) {
      const Tensor x = RandomUniform(s, 6, -2, 2);
      const Tensor y = FromDoubles(s, DType::kF32, SoftmaxRows(x.ToDoubleVector(), s[s.rank() - 1], log));
      cases.push_back(Case(grad_op, s.ToString(), {y, RandomUniform(s, 7)}, SoftmaxGradRef(log)));
    }
  }
}

void AddFusedSoftmaxCases(std::vector<OpTestCase>& cases) {
  const std::string op = "fused_scale_mask_softmax";
  // (B, H, T, S) = (2, 3, 4, 5), padding mask (B, 1, 1, S): batch 1 masks
  // every key, so all its rows are zeros.
  cases.push_back(
      Case(op, "padding mask, one batch fully masked",
           {RandomUniform({2, 3, 4, 5}, 10, -2, 2), Bools({2, 1, 1, 5}, {1, 1, 0, 1, 0, /*batch 1:*/ 0, 0, 0, 0, 0})},
           FusedSoftmaxRef(true, false), {{"scale", 0.5}}));
  // (B, 1, T, S) mask with row t=1 of batch 0 fully masked, plus causal, T < S.
  cases.push_back(Case(
      op, "per-query mask and causal, T < S",
      {RandomUniform({2, 2, 3, 5}, 11, -2, 2),
       Bools({2, 1, 3, 5}, {1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1})},
      FusedSoftmaxRef(true, false), {{"scale", 0.7}, {"causal", true}}));
  // T > S: the first T - S queries see no key at all.
  cases.push_back(Case(op, "causal, T > S",
                       {RandomUniform({2, 3, 5, 3}, 12, -2, 2), Bools({2, 1, 1, 3}, {1, 1, 1, 1, 0, 1})},
                       FusedSoftmaxRef(true, false), {{"scale", 1.3}, {"causal", true}}));
  cases.push_back(Case(op, "mask of lower rank (T, S)",
                       {RandomUniform({3, 4, 6}, 13, -2, 2), RandomBools({4, 6}, 14, 0.7)},
                       FusedSoftmaxRef(true, false), {{"scale", 0.4}}));
  // Mask (B, 1, T, 1): whole queries kept or dropped.
  cases.push_back(Case(op, "mask broadcast along keys",
                       {RandomUniform({2, 2, 3, 4}, 15, -2, 2), Bools({2, 1, 3, 1}, {1, 0, 1, 1, 1, 0})},
                       FusedSoftmaxRef(true, false)));

  const std::string causal = "fused_scale_causal_softmax";
  cases.push_back(
      Case(causal, "T < S", {RandomUniform({2, 3, 4, 6}, 16, -2, 2)}, FusedSoftmaxRef(false, true), {{"scale", 0.3}}));
  cases.push_back(
      Case(causal, "T > S", {RandomUniform({3, 5, 4}, 17, -2, 2)}, FusedSoftmaxRef(false, true), {{"scale", 1.5}}));
  cases.push_back(Case(causal, "square rank 2", {RandomUniform({7, 7}, 18, -2, 2)}, FusedSoftmaxRef(false, true)));
}

void AddNormCases(std::vector<OpTestCase>& cases) {
  struct Input {
    std::string label;
    Tensor x;
  };
  // The 3x37 rows sit around 5 with spread 1: a single-pass E[x²] - E[x]²
  // variance would lose digits there.
  const std::vector<Input> inputs = {
      {"5x7", RandomUniform({5, 7}, 20, -2, 2)},
      {"3x5x6", RandomUniform({3, 5, 6}, 21, -2, 2)},
      {"3x37 offset mean", RandomUniform({3, 37}, 22, 4, 6)},
  };
  for (const Input& in : inputs) {
    const int64_t C = LastDim(in.x);
    const Tensor gamma = RandomUniform({C}, 23, 0.5, 1.5), beta = RandomUniform({C}, 24);
    OpTestCase ln = Case("layer_norm", in.label, {in.x, gamma, beta}, LayerNormRef(false));
    ln.grad_outputs = {0};  // the rule differentiates y; mean and rstd are saved statistics
    if (in.label == "3x37 offset mean") {
      // x - mean of values near 5 keeps ~4 bits fewer in f32; dgamma sums
      // three such rows with cancellation.
      ln.grad_atol = 1e-5;
      ln.grad_rtol = 1e-4;
    }
    cases.push_back(ln);
    OpTestCase rms = Case("rms_norm", in.label, {in.x, gamma}, LayerNormRef(true));
    rms.grad_outputs = {0};
    cases.push_back(rms);

    const RowStats ls = Stats(in.x, 1e-5, false), rs = Stats(in.x, 1e-5, true);
    const Shape stats = WithoutLast(in.x.shape());
    const Tensor dy = RandomUniform(in.x.shape(), 25);
    cases.push_back(Case("layer_norm_grad", in.label,
                         {dy, in.x, FromDoubles(stats, DType::kF32, ls.mean), FromDoubles(stats, DType::kF32, ls.rstd),
                          gamma},
                         NormGradRef(false)));
    cases.push_back(Case("rms_norm_grad", in.label, {dy, in.x, FromDoubles(stats, DType::kF32, rs.rstd), gamma},
                         NormGradRef(true)));
    // layer_norm_grad_add: dx + addend.
    cases.push_back(Case("layer_norm_grad_add", in.label,
                         {dy, in.x, FromDoubles(stats, DType::kF32, ls.mean), FromDoubles(stats, DType::kF32, ls.rstd),
                          gamma, RandomUniform(in.x.shape(), 31)},
                         [](const std::vector<Tensor>& in, const AttrMap& attrs) {
                           std::vector<Tensor> out = NormGradRef(false)({in[0], in[1], in[2], in[3], in[4]}, attrs);
                           std::vector<double> dx = out[0].ToDoubleVector();
                           const std::vector<double> addend = in[5].ToDoubleVector();
                           for (size_t i = 0; i < dx.size(); ++i) dx[i] += addend[i];
                           out[0] = FromDoubles(out[0].shape(), RefFloatDType(in), dx);
                           return out;
                         }));
  }
  OpTestCase eps =
      Case("layer_norm", "eps 0.1 rank 1", {RandomUniform({8}, 26), RandomUniform({8}, 27), RandomUniform({8}, 28)},
           LayerNormRef(false), {{"eps", 0.1}});
  eps.grad_outputs = {0};
  cases.push_back(eps);
  OpTestCase rms_eps = Case("rms_norm", "eps 0.1", {RandomUniform({4, 5}, 29), RandomUniform({5}, 30)},
                            LayerNormRef(true), {{"eps", 0.1}});
  rms_eps.grad_outputs = {0};
  cases.push_back(rms_eps);
}

void AddLossCases(std::vector<OpTestCase>& cases) {
  // Labels include 0 and V - 1.
  const Tensor logits = RandomUniform({7, 5}, 40, -3, 3);
  const Tensor labels = Labels({0, 4, 2, 4, 0, 1, 3}, DType::kI64);
  cases.push_back(Case("sparse_softmax_cross_entropy", "7x5 i64 labels", {logits, labels}, SparseCrossEntropyRef));
  const Tensor wide = RandomUniform({6, 37}, 41, -3, 3);
  const Tensor wide_labels = Labels({36, 0, 17, 36, 5, 0}, DType::kI32);
  cases.push_back(Case("sparse_softmax_cross_entropy", "6x37 i32 labels", {wide, wide_labels}, SparseCrossEntropyRef));
  cases.push_back(Case("sparse_softmax_cross_entropy", "logits near 100",
                       {RandomUniform({4, 6}, 42, 95, 105), Labels({5, 0, 3, 2}, DType::kI64)}, SparseCrossEntropyRef));
  // log Σ exp(x - max) - (x[label] - max): max + log Σ, rounded first, was
  // off by ulp(1e4) = 1e-3 here.
  OpTestCase near_1e4 =
      Case("sparse_softmax_cross_entropy", "logits near 1e4",
           {RandomUniform({4, 50}, 45, 9990, 10010), Labels({49, 0, 7, 30}, DType::kI64)}, SparseCrossEntropyRef);
  near_1e4.check_grad = false;
  cases.push_back(near_1e4);
  cases.push_back(Case("sparse_softmax_cross_entropy_grad", "7x5", {logits, labels, RandomUniform({7}, 43)},
                       SparseCrossEntropyGradRef));
  cases.push_back(Case("sparse_softmax_cross_entropy_grad", "6x37 i32", {wide, wide_labels, RandomUniform({6}, 44)},
                       SparseCrossEntropyGradRef));

  // V = 11 splits unevenly over 2, 3 and 4 shards; the labels land in
  // different shards, including the first and last column.
  const Tensor vocab = RandomUniform({5, 11}, 45, -3, 3);
  const Tensor vocab_labels = Labels({0, 10, 4, 7, 10}, DType::kI64);
  cases.push_back(
      Case("cross_entropy_partials", "row max, i64 labels", {vocab, RowMaxPlus(vocab, 0), vocab_labels}, PartialsRef));
  // row_max is only a stabiliser: any value works, e.g. above the true max.
  cases.push_back(Case("cross_entropy_partials", "shifted row max, i32 labels",
                       {vocab, RowMaxPlus(vocab, 0.75), Labels({3, 0, 10, 10, 6}, DType::kI32)}, PartialsRef));
  cases.push_back(
      Case("cross_entropy_partials_grad", "5x11",
           {vocab, RowMaxPlus(vocab, 0), vocab_labels, RandomUniform({5, 1}, 46, 0.1, 1), RandomUniform({5, 1}, 47)},
           PartialsGradRef));
}

}  // namespace

std::vector<OpTestCase> NormSoftmaxCases() {
  std::vector<OpTestCase> cases;
  AddSoftmaxCases(cases);
  AddFusedSoftmaxCases(cases);
  AddNormCases(cases);
  AddLossCases(cases);
  return cases;
}

namespace {

// ---- What the harness does not cover: errors, and the composition.

TEST(NormSoftmaxOps, FullyMaskedRowIsZerosNotNan) {
  const Tensor x = RandomUniform({1, 1, 2, 3}, 1);
  auto y = RunOp("fused_scale_mask_softmax", {x, Bools({1, 1, 2, 3}, {0, 0, 0, 1, 0, 1})});
  ASSERT_TRUE(y.ok()) << y.status();
  const std::vector<double> v = (*y)[0].ToDoubleVector();
  EXPECT_EQ(v[0], 0.0);
  EXPECT_EQ(v[1], 0.0);
  EXPECT_EQ(v[2], 0.0);
  EXPECT_NEAR(v[3] + v[5], 1.0, 1e-6);
  EXPECT_EQ(v[4], 0.0);
}

TEST(NormSoftmaxOps, LabelOutOfRangeNamesLabelAndVocabulary) {
  const Tensor logits = RandomUniform({3, 5}, 1);
  auto loss = RunOp("sparse_softmax_cross_entropy", {logits, Labels({0, 5, 1}, DType::kI64)});
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(loss.status().message()).find("label 5"), std::string::npos) << loss.status();
  EXPECT_NE(std::string(loss.status().message()).find("[0, 5)"), std::string::npos) << loss.status();

  auto negative = RunOp("cross_entropy_partials", {logits, RowMaxPlus(logits, 0), Labels({0, -1, 1}, DType::kI32)});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(std::string(negative.status().message()).find("label -1"), std::string::npos) << negative.status();
}

TEST(NormSoftmaxOps, BadShapesAreErrors) {
  auto mask = RunOp("fused_scale_mask_softmax", {RandomUniform({2, 3, 4}, 1), Bools({2, 3}, {1, 1, 1, 1, 1, 1})});
  ASSERT_FALSE(mask.ok());
  EXPECT_NE(std::string(mask.status().message()).find("does not broadcast"), std::string::npos) << mask.status();

  auto gamma = RunOp("layer_norm", {RandomUniform({2, 4}, 1), RandomUniform({3}, 2), RandomUniform({4}, 3)});
  ASSERT_FALSE(gamma.ok());
  EXPECT_NE(std::string(gamma.status().message()).find("gamma"), std::string::npos) << gamma.status();

  auto eps = RunOp("rms_norm", {RandomUniform({2, 4}, 1), RandomUniform({4}, 2)}, {{"eps", -1.0}});
  EXPECT_FALSE(eps.ok());

  auto labels = RunOp("sparse_softmax_cross_entropy", {RandomUniform({2, 4}, 1), RandomUniform({2}, 2)});
  ASSERT_FALSE(labels.ok());
  EXPECT_NE(std::string(labels.status().message()).find("i32 or i64"), std::string::npos) << labels.status();

  auto rows = RunOp("sparse_softmax_cross_entropy", {RandomUniform({2, 4}, 1), Labels({0, 1, 2}, DType::kI64)});
  EXPECT_FALSE(rows.ok());
}

// The harness runs kernels inline; this runs them on 3 threads, with tensors
// large enough to be cut into several chunks (and, for the norm gradients,
// several per-thread dgamma blocks), against the inline run.
TEST(NormSoftmaxOps, ThreadedKernelsMatchInlineRun) {
  const Shape shape{200, 300};
  const Tensor x = RandomUniform(shape, 1, -2, 2), dy = RandomUniform(shape, 2);
  const Tensor gamma = RandomUniform({300}, 3), beta = RandomUniform({300}, 4);
  std::vector<int64_t> label_values;
  for (int64_t n = 0; n < 200; ++n) label_values.push_back((n * 37) % 300);
  const Tensor labels = Labels(label_values, DType::kI32);
  auto stats = RunOp("layer_norm", {x, gamma, beta});
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto rms_stats = RunOp("rms_norm", {x, gamma});
  ASSERT_TRUE(rms_stats.ok()) << rms_stats.status();
  const Tensor mask = RandomBools({200, 300}, 5, 0.8);
  const std::vector<std::pair<std::string, std::vector<Tensor>>> runs = {
      {"softmax", {x}},
      {"log_softmax", {x}},
      {"softmax_grad", {x, dy}},
      {"log_softmax_grad", {x, dy}},
      {"fused_scale_mask_softmax", {x, mask}},
      {"fused_scale_causal_softmax", {x}},
      {"layer_norm", {x, gamma, beta}},
      {"layer_norm_grad", {dy, x, (*stats)[1], (*stats)[2], gamma}},
      {"rms_norm", {x, gamma}},
      {"rms_norm_grad", {dy, x, (*rms_stats)[1], gamma}},
      {"sparse_softmax_cross_entropy", {x, labels}},
      {"sparse_softmax_cross_entropy_grad", {x, labels, RandomUniform({200}, 6)}},
  };
  ThreadPool pool(3);
  EagerOptions threaded;
  threaded.pool = &pool;
  for (const auto& [op, inputs] : runs) {
    auto inline_run = RunOp(op, inputs);
    auto threaded_run = RunOp(op, inputs, {}, threaded);
    ASSERT_TRUE(inline_run.ok()) << inline_run.status();
    ASSERT_TRUE(threaded_run.ok()) << threaded_run.status();
    for (size_t k = 0; k < inline_run->size(); ++k) {
      const Tensor& want = (*inline_run)[k];
      const Tensor& got = (*threaded_run)[k];
      for (int64_t i = 0; i < want.NumElements(); ++i) {
        const double w = ElementAsDouble(want, i);
        ASSERT_NEAR(ElementAsDouble(got, i), w, 1e-5 * (1 + std::abs(w))) << op << " output " << k << " element " << i;
      }
    }
  }
}

// Runs `op` on one vocabulary shard [offset, offset + size) of logits
// (S(1)), the other inputs whole (B), as the actor runtime would.
std::vector<Tensor> RunOnVocabShard(const std::string& op, const std::vector<Tensor>& inputs, int64_t p, int64_t r) {
  const OpSchema& schema = *BuiltinOps().Find(op);
  const AttrMap attrs = *schema.CanonicalizeAttrs({});
  KernelContext ctx;
  ctx.attrs = &attrs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Sbp sbp = i == 0 ? Sbp::Split(1) : Sbp::Broadcast();
    const TensorSlice slice = *LocalSlice(inputs[i].shape(), {sbp}, {p}, r);
    ctx.inputs.push_back(*ExtractBlock(inputs[i], slice.offset, slice.local));
    ctx.input_slices.push_back(slice);
  }
  std::vector<TensorMeta> metas;
  for (const Tensor& t : ctx.inputs) metas.push_back(t.meta());
  const auto out_metas = schema.InferMeta(metas, attrs);
  TESSERA_CHECK(out_metas.ok(), out_metas.status().ToString());
  for (const TensorMeta& m : *out_metas) ctx.outputs.push_back(*Tensor::Empty(m.shape, m.dtype));
  const absl::Status status = RunKernel(schema, ctx);
  TESSERA_CHECK(status.ok(), status.ToString());
  return ctx.outputs;
}

// Megatron's vocabulary-parallel cross-entropy as ops/loss.cc composes it,
// over p = 3 shards of V = 13, against the fused op: loss and dlogits.
TEST(NormSoftmaxOps, VocabParallelCompositionMatchesFusedLoss) {
  constexpr int64_t N = 4, V = 13, p = 3;
  const Tensor logits = RandomUniform({N, V}, 7, -4, 4);
  const Tensor labels = Labels({0, 12, 6, 9}, DType::kI64);
  const Tensor dloss = RandomUniform({N}, 8);

  // row_max: reduce_max per shard (S(1) -> P(max)), then the all-reduce MAX.
  std::vector<double> row_max(N, kNegInf);
  for (int64_t r = 0; r < p; ++r) {
    const TensorSlice slice = *LocalSlice(logits.shape(), {Sbp::Split(1)}, {p}, r);
    auto shard_max = RunOp("reduce_max", {*ExtractBlock(logits, slice.offset, slice.local)},
                           {{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
    ASSERT_TRUE(shard_max.ok()) << shard_max.status();
    for (int64_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], ElementAsDouble((*shard_max)[0], n));
  }
  const Tensor max_tensor = FromDoubles({N, 1}, DType::kF32, row_max);

  // Partials per shard, then the all-reduce SUM (P -> B).
  std::vector<double> sumexp(N, 0.0), label_logit(N, 0.0);
  for (int64_t r = 0; r < p; ++r) {
    const std::vector<Tensor> parts = RunOnVocabShard("cross_entropy_partials", {logits, max_tensor, labels}, p, r);
    for (int64_t n = 0; n < N; ++n) {
      sumexp[n] += ElementAsDouble(parts[0], n);
      label_logit[n] += ElementAsDouble(parts[1], n);
    }
  }
  auto fused = RunOp("sparse_softmax_cross_entropy", {logits, labels});
  ASSERT_TRUE(fused.ok()) << fused.status();
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_NEAR(std::log(sumexp[n]) - label_logit[n], ElementAsDouble((*fused)[0], n), 1e-5) << "row " << n;
  }

  // Backward of loss = log(sumexp) - label_logit, then per-shard dlogits.
  const Tensor d_sumexp =
      FilledF32({N, 1}, [&](int64_t n) { return static_cast<float>(ElementAsDouble(dloss, n) / sumexp[n]); });
  const Tensor d_label = FilledF32({N, 1}, [&](int64_t n) { return static_cast<float>(-ElementAsDouble(dloss, n)); });
  auto fused_grad = RunOp("sparse_softmax_cross_entropy_grad", {logits, labels, dloss});
  ASSERT_TRUE(fused_grad.ok()) << fused_grad.status();
  for (int64_t r = 0; r < p; ++r) {
    const TensorSlice slice = *LocalSlice(logits.shape(), {Sbp::Split(1)}, {p}, r);
    const Tensor dshard =
        RunOnVocabShard("cross_entropy_partials_grad", {logits, max_tensor, labels, d_sumexp, d_label}, p, r)[0];
    const Tensor want = *ExtractBlock((*fused_grad)[0], slice.offset, slice.local);
    for (int64_t i = 0; i < want.NumElements(); ++i) {
      EXPECT_NEAR(ElementAsDouble(dshard, i), ElementAsDouble(want, i), 1e-6) << "shard " << r << " element " << i;
    }
  }
}

}  // namespace
}  // namespace tessera::ops::testing
