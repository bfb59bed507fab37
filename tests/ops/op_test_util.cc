#include "tests/ops/op_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "core/status.h"
#include "core/text.h"
#include "ops/eager.h"

namespace tessera::ops::testing {

OpTestCase MakeCase(std::string op, std::string label, std::vector<Tensor> inputs, ReferenceFn reference,
                    AttrMap attrs) {
  OpTestCase c;
  c.op = std::move(op);
  c.label = std::move(label);
  c.inputs = std::move(inputs);
  c.reference = std::move(reference);
  c.attrs = std::move(attrs);
  return c;
}

Tensor RandomUniform(const Shape& shape, uint64_t seed, float low, float high) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  return FilledF32(shape, [&](int64_t) { return dist(rng); });
}

Tensor RandomInts(const Shape& shape, uint64_t seed, int64_t low, int64_t high, DType dtype) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(low, high - 1);
  auto t = Tensor::Empty(shape, dtype);
  TESSERA_CHECK(t.ok());
  for (int64_t i = 0; i < t->NumElements(); ++i) SetElementFromDouble(*t, i, static_cast<double>(dist(rng)));
  return *t;
}

Tensor RandomBools(const Shape& shape, uint64_t seed, double p_true) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution dist(p_true);
  auto t = Tensor::Empty(shape, DType::kBool);
  TESSERA_CHECK(t.ok());
  for (int64_t i = 0; i < t->NumElements(); ++i) t->data<bool>()[i] = dist(rng);
  return *t;
}

Tensor FilledF32(const Shape& shape, const std::function<float(int64_t)>& fn) {
  auto t = Tensor::Empty(shape, DType::kF32);
  TESSERA_CHECK(t.ok());
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->NumElements(); ++i) p[i] = fn(i);
  return *t;
}

DType RefFloatDType(const std::vector<Tensor>& inputs, DType natural) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.dtype() == DType::kF64) return DType::kF64;
  }
  return natural;
}

Tensor Zeros(const Shape& shape, DType dtype) {
  auto t = Tensor::Zeros(shape, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  return *t;
}

Tensor FromDoubles(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Zeros(shape, dtype);
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == t.NumElements(), values.size(), " values for ",
                shape.ToString());
  for (int64_t i = 0; i < t.NumElements(); ++i) SetElementFromDouble(t, i, values[static_cast<size_t>(i)]);
  return t;
}

Tensor ToF64(const Tensor& t) {
  if (!IsFloatingPoint(t.dtype())) return t;
  return FromDoubles(t.shape(), DType::kF64, t.ToDoubleVector());
}

namespace {

// L(up) - L(down) for L = Σ_k Σ w_k ⊙ out_k over the outputs that have
// weights, summed as Σ w (up - down) so that unchanged elements cancel
// exactly instead of leaving rounding noise of the size of L.
double LossDifference(const std::vector<Tensor>& up, const std::vector<Tensor>& down,
                      const std::vector<Tensor>& weights) {
  double difference = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!weights[k].defined()) continue;
    for (int64_t i = 0; i < weights[k].NumElements(); ++i) {
      difference += (ElementAsDouble(up[k], i) - ElementAsDouble(down[k], i)) * ElementAsDouble(weights[k], i);
    }
  }
  return difference;
}

}  // namespace

absl::StatusOr<GradientCheck> CheckGradient(const OpTestCase& c, const OpRegistry& registry) {
  ASSIGN_OR_RETURN(const OpSchema* schema, registry.Get(c.op));
  ASSIGN_OR_RETURN(const AttrMap attrs, schema->CanonicalizeAttrs(c.attrs));
  EagerOptions options;
  options.registry = &registry;
  options.step = c.step;
  ASSIGN_OR_RETURN(const std::vector<Tensor> outputs, RunOp(c.op, c.inputs, c.attrs, options));
  // A random upstream gradient per floating output (or those the case names).
  std::vector<Tensor> weights(outputs.size());
  const std::set<int> wanted(c.grad_outputs.begin(), c.grad_outputs.end());
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!IsFloatingPoint(outputs[k].dtype())) continue;
    if (!wanted.empty() && !wanted.count(static_cast<int>(k))) continue;
    weights[k] = RandomUniform(outputs[k].shape(), 1000 + k, -1.0f, 1.0f);
  }
  ASSIGN_OR_RETURN(const std::vector<Tensor> grads, EagerGradients(c.op, c.inputs, outputs, weights, c.attrs, options));
  if (grads.size() != c.inputs.size()) {
    return absl::InternalError(StrCat(c.op, ": ", grads.size(), " gradients for ", c.inputs.size(), " inputs"));
  }

  // The double evaluation: the reference on f64 copies of the floating inputs.
  std::vector<Tensor> inputs64;
  for (const Tensor& t : c.inputs) inputs64.push_back(ToF64(t));
  const std::vector<Tensor> at_inputs = c.reference(inputs64, attrs);
  if (at_inputs.size() != outputs.size()) {
    return absl::InternalError(StrCat(c.op, "/", c.label, ": the reference gives ", at_inputs.size(),
                                      " outputs, the kernel ", outputs.size()));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!weights[k].defined()) continue;
    if (at_inputs[k].shape() != outputs[k].shape() || at_inputs[k].dtype() != DType::kF64) {
      return absl::InternalError(StrCat(c.op, "/", c.label, ": reference output ", k, " is ",
                                        at_inputs[k].meta().ToString(), " on f64 inputs; want f64",
                                        outputs[k].shape().ToString(), " (see RefFloatDType)"));
    }
  }

  GradientCheck check;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!schema->InputDifferentiable(static_cast<int>(i)) || !IsFloatingPoint(c.inputs[i].dtype())) continue;
    const Tensor& analytic = grads[i];
    if (!analytic.defined()) return absl::InternalError(StrCat(c.op, ": the rule gives no gradient for input ", i));
    if (analytic.shape() != c.inputs[i].shape()) {
      return absl::InternalError(StrCat(c.op, ": gradient ", analytic.shape().ToString(), " for input ", i, " of ",
                                        c.inputs[i].shape().ToString()));
    }
    std::vector<Tensor> shifted = inputs64;
    shifted[i] = inputs64[i].Clone();
    for (int64_t j = 0; j < c.inputs[i].NumElements(); ++j) {
      const double x = ElementAsDouble(inputs64[i], j);
      const double h = c.fd_step * std::max(1.0, std::abs(x));
      const double up = x + h, down = x - h;
      SetElementFromDouble(shifted[i], j, up);
      const std::vector<Tensor> out_up = c.reference(shifted, attrs);
      SetElementFromDouble(shifted[i], j, down);
      const std::vector<Tensor> out_down = c.reference(shifted, attrs);
      SetElementFromDouble(shifted[i], j, x);
      const double fd = LossDifference(out_up, out_down, weights) / (up - down);
      const double an = ElementAsDouble(analytic, j);
      double ratio = std::abs(an - fd) / (c.grad_atol + c.grad_rtol * std::abs(fd));
      if (std::isnan(ratio)) ratio = std::numeric_limits<double>::infinity();
      ++check.checked;
      check.worst = std::max(check.worst, ratio);
      if (ratio > 1 && check.mismatch.empty()) {
        check.mismatch = StrCat(c.op, "/", c.label, " d/d input ", i, " element ", j, " (x = ", x, "): analytic ", an,
                                ", finite differences ", fd, " (", ratio, "x the tolerance)");
      }
    }
  }
  return check;
}

double ReferenceGelu(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

}  // namespace tessera::ops::testing
