// Test cases of the element-wise family; references are plain double loops
// (dtype-generic: f64 in, f64 out, see op_test_util.h).

#include <cmath>

#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

using UnaryFn = std::function<double(double)>;
using BinaryFn = std::function<double(double, double)>;

ReferenceFn UnaryRef(UnaryFn fn) {
  return [fn](const std::vector<Tensor>& in, const AttrMap&) {
    Tensor y = Zeros(in[0].shape(), RefFloatDType(in));
    for (int64_t i = 0; i < y.NumElements(); ++i) SetElementFromDouble(y, i, fn(ElementAsDouble(in[0], i)));
    return std::vector<Tensor>{y};
  };
}

// Element i of `t` seen through broadcasting to `out`.
double Broadcasted(const Tensor& t, const Shape& out, int64_t flat) {
  const auto out_strides = out.Strides();
  const auto strides = t.shape().Strides();
  const int lead = out.rank() - t.shape().rank();
  int64_t offset = 0;
  for (int axis = 0; axis < out.rank(); ++axis) {
    const int64_t idx = (flat / out_strides[static_cast<size_t>(axis)]) % out[axis];
    const int own = axis - lead;
    if (own >= 0 && t.shape()[own] != 1) offset += idx * strides[static_cast<size_t>(own)];
  }
  return ElementAsDouble(t, offset);
}

ReferenceFn BinaryRef(BinaryFn fn) {
  return [fn](const std::vector<Tensor>& in, const AttrMap&) {
    const Shape out = *BroadcastShapes(in[0].shape(), in[1].shape());
    Tensor y = Zeros(out, RefFloatDType(in));
    for (int64_t i = 0; i < y.NumElements(); ++i) {
      SetElementFromDouble(y, i, fn(Broadcasted(in[0], out, i), Broadcasted(in[1], out, i)));
    }
    return std::vector<Tensor>{y};
  };
}

double Gelu(double x) { return ReferenceGelu(x, false); }
double GeluTanh(double x) { return ReferenceGelu(x, true); }
double GeluGrad(double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double GeluTanhGrad(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2.0 / M_PI) * (1 + 3 * 0.044715 * x * x);
}
double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Values in [0.2, 2] ∪ [-2, -0.2]: away from relu's kink.
Tensor AwayFromZero(const Shape& shape, uint64_t seed) {
  Tensor t = RandomUniform(shape, seed, 0.2f, 2.0f);
  for (int64_t i = 0; i < t.NumElements(); i += 2) t.data<float>()[i] = -t.data<float>()[i];
  return t;
}

OpTestCase Case(std::string op, std::string label, std::vector<Tensor> inputs, ReferenceFn ref, AttrMap attrs = {}) {
  return MakeCase(std::move(op), std::move(label), std::move(inputs), std::move(ref), std::move(attrs));
}

}  // namespace

std::vector<OpTestCase> ElementwiseCases() {
  std::vector<OpTestCase> cases;
  const Shape s{5, 7};
  // Binary, same shape and broadcasting both ways (incl. a rank-0 operand).
  struct Binary {
    const char* op;
    BinaryFn fn;
  };
  for (const Binary& b : {Binary{"add", [](double x, double y) { return x + y; }},
                          Binary{"sub", [](double x, double y) { return x - y; }},
                          Binary{"mul", [](double x, double y) { return x * y; }},
                          Binary{"div", [](double x, double y) { return x / y; }}}) {
    const bool div = std::string(b.op) == "div";
    auto rhs = [&](const Shape& shape, uint64_t seed) {
      return div ? RandomUniform(shape, seed, 0.5f, 2.0f) : RandomUniform(shape, seed);
    };
    cases.push_back(Case(b.op, "same_shape", {RandomUniform(s, 1), rhs(s, 2)}, BinaryRef(b.fn)));
    cases.push_back(Case(b.op, "row_broadcast", {RandomUniform(Shape{3, 5, 7}, 3), rhs(Shape{7}, 4)}, BinaryRef(b.fn)));
    cases.push_back(Case(b.op, "both_broadcast", {RandomUniform(Shape{5, 1, 3}, 5), rhs(Shape{4, 1}, 6)}, BinaryRef(b.fn)));
    cases.push_back(Case(b.op, "scalar_rhs", {RandomUniform(s, 7), rhs(Shape{}, 8)}, BinaryRef(b.fn)));
  }
  // Scalar arithmetic.
  cases.push_back(Case("scalar_add", "basic", {RandomUniform(s, 9)}, UnaryRef([](double x) { return x + 1.5; }),
                       {{"value", 1.5}}));
  cases.push_back(Case("scalar_mul", "basic", {RandomUniform(s, 10)}, UnaryRef([](double x) { return x * -3; }),
                       {{"value", -3.0}}));
  cases.push_back(Case("scalar_pow", "cube", {RandomUniform(s, 11, 0.5f, 2.0f)},
                       UnaryRef([](double x) { return x * x * x; }), {{"exponent", 3.0}}));
  cases.push_back(Case("scalar_pow", "square", {RandomUniform(s, 12)}, UnaryRef([](double x) { return x * x; }),
                       {{"exponent", 2}}));
  cases.push_back(Case("scalar_pow", "sqrt", {RandomUniform(s, 13, 0.5f, 2.0f)},
                       UnaryRef([](double x) { return std::sqrt(x); }), {{"exponent", 0.5}}));
  // Unary math and activations.
  cases.push_back(Case("neg", "basic", {RandomUniform(s, 14)}, UnaryRef([](double x) { return -x; })));
  cases.push_back(Case("exp", "basic", {RandomUniform(s, 15, -3, 3)}, UnaryRef([](double x) { return std::exp(x); })));
  cases.push_back(Case("log", "basic", {RandomUniform(s, 16, 0.3f, 5)}, UnaryRef([](double x) { return std::log(x); })));
  cases.push_back(Case("sqrt", "basic", {RandomUniform(s, 17, 0.3f, 5)}, UnaryRef([](double x) { return std::sqrt(x); })));
  cases.push_back(Case("rsqrt", "basic", {RandomUniform(s, 18, 0.3f, 5)},
                       UnaryRef([](double x) { return 1 / std::sqrt(x); })));
  cases.push_back(Case("abs", "basic", {AwayFromZero(s, 46)}, UnaryRef([](double x) { return std::fabs(x); })));
  cases.push_back(Case("tanh", "basic", {RandomUniform(s, 19, -3, 3)}, UnaryRef([](double x) { return std::tanh(x); })));
  cases.push_back(Case("relu", "basic", {AwayFromZero(s, 20)}, UnaryRef([](double x) { return x > 0 ? x : 0; })));
  cases.push_back(Case("silu", "basic", {RandomUniform(s, 21, -4, 4)}, UnaryRef([](double x) { return x * Sigmoid(x); })));
  cases.push_back(Case("gelu", "exact", {RandomUniform(s, 22, -4, 4)}, UnaryRef(Gelu)));
  cases.push_back(Case("gelu", "tanh", {RandomUniform(s, 23, -4, 4)}, UnaryRef(GeluTanh), {{"approximate", std::string("tanh")}}));
  // Activation gradients: inputs (z, dy).
  auto grad_ref = [](std::function<double(double)> dfn) {
    return [dfn](const std::vector<Tensor>& in, const AttrMap&) {
      Tensor dx = Zeros(in[0].shape(), RefFloatDType(in));
      for (int64_t i = 0; i < dx.NumElements(); ++i) {
        SetElementFromDouble(dx, i, ElementAsDouble(in[1], i) * dfn(ElementAsDouble(in[0], i)));
      }
      return std::vector<Tensor>{dx};
    };
  };
  cases.push_back(Case("tanh_grad", "basic", {RandomUniform(s, 24, -0.9f, 0.9f), RandomUniform(s, 25)},
                       grad_ref([](double y) { return 1 - y * y; })));
  cases.push_back(Case("relu_grad", "basic", {AwayFromZero(s, 26), RandomUniform(s, 27)},
                       grad_ref([](double y) { return y > 0 ? 1.0 : 0.0; })));
  cases.push_back(Case("abs_grad", "basic", {AwayFromZero(s, 47), RandomUniform(s, 48)}, grad_ref([](double x) {
                         return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
                       })));
  {
    // sign(0) = 0, as torch: exact zeros among x get no gradient.
    Tensor x = AwayFromZero(s, 49);
    for (int64_t i = 0; i < x.NumElements(); i += 3) x.data<float>()[i] = 0.0f;
    cases.push_back(Case("abs_grad", "zeros", {x, RandomUniform(s, 50)}, grad_ref([](double x) {
                           return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
                         })));
  }
  cases.push_back(Case("silu_grad", "basic", {RandomUniform(s, 28, -4, 4), RandomUniform(s, 29)},
                       grad_ref([](double x) { return Sigmoid(x) * (1 + x * (1 - Sigmoid(x))); })));
  cases.push_back(Case("gelu_grad", "exact", {RandomUniform(s, 30, -4, 4), RandomUniform(s, 31)}, grad_ref(GeluGrad)));
  cases.push_back(Case("gelu_grad", "tanh", {RandomUniform(s, 32, -4, 4), RandomUniform(s, 33)}, grad_ref(GeluTanhGrad),
                       {{"approximate", std::string("tanh")}}));
  // Bias family: x (3, 5, 7), bias (7,).
  auto bias_ref = [](std::function<double(double)> fn) {
    return [fn](const std::vector<Tensor>& in, const AttrMap&) {
      Tensor y = Zeros(in[0].shape(), RefFloatDType(in));
      const int64_t C = in[1].NumElements();
      for (int64_t i = 0; i < y.NumElements(); ++i) {
        double v = fn(ElementAsDouble(in[0], i) + ElementAsDouble(in[1], i % C));
        if (in.size() == 3) v *= ElementAsDouble(in[2], i);
        SetElementFromDouble(y, i, v);
      }
      return std::vector<Tensor>{y};
    };
  };
  const Shape xs{3, 5, 7};
  cases.push_back(Case("bias_add", "rank3", {RandomUniform(xs, 34), RandomUniform(Shape{7}, 35)},
                       bias_ref([](double h) { return h; })));
  cases.push_back(Case("bias_gelu", "exact", {RandomUniform(xs, 36, -3, 3), RandomUniform(Shape{7}, 37)}, bias_ref(Gelu)));
  cases.push_back(Case("bias_gelu", "tanh", {RandomUniform(xs, 38, -3, 3), RandomUniform(Shape{7}, 39)},
                       bias_ref(GeluTanh), {{"approximate", std::string("tanh")}}));
  cases.push_back(Case("bias_gelu_grad", "exact",
                       {RandomUniform(xs, 40, -3, 3), RandomUniform(Shape{7}, 41), RandomUniform(xs, 42)},
                       bias_ref(GeluGrad)));
  cases.push_back(Case("bias_gelu_grad", "tanh",
                       {RandomUniform(xs, 43, -3, 3), RandomUniform(Shape{7}, 44), RandomUniform(xs, 45)},
                       bias_ref(GeluTanhGrad), {{"approximate", std::string("tanh")}}));
  // Large enough to cross the multi-thread grain in the kernels' own tests.
  for (OpTestCase& c : cases) {
    if (c.op == "exp" || c.op == "log" || c.op == "tanh" || c.op == "gelu" || c.op == "silu" || c.op == "rsqrt" ||
        c.op == "gelu_grad" || c.op == "silu_grad" || c.op == "bias_gelu" || c.op == "bias_gelu_grad") {
      c.rtol = 2e-6;
      c.atol = 2e-6;
    }
  }
  return cases;
}

}  // namespace tessera::ops::testing
