// Test cases of the reduction family. References accumulate in double over
// every input element, mapping each to its output by multi-index
// (dtype-generic, see op_test_util.h).

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

using Ints = std::vector<int64_t>;

enum class Kind { kSum, kMean, kMax };

std::vector<bool> Mask(int rank, const Ints& axes) {
  std::vector<bool> mask(static_cast<size_t>(rank), axes.empty());
  for (int64_t a : axes) mask[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  return mask;
}

// Output shape and, for input element `flat`, the output element it feeds.
struct Reduction {
  Shape out;
  std::vector<int64_t> target;  // per input element
  std::vector<int64_t> count;   // inputs per output element
};

Reduction Plan(const Shape& in, const std::vector<bool>& mask, bool keepdim) {
  Reduction r;
  Ints dims;
  for (int a = 0; a < in.rank(); ++a) {
    if (!mask[static_cast<size_t>(a)]) {
      dims.push_back(in[a]);
    } else if (keepdim) {
      dims.push_back(1);
    }
  }
  r.out = Shape(dims);
  r.count.assign(static_cast<size_t>(r.out.NumElements()), 0);
  for (int64_t i = 0; i < in.NumElements(); ++i) {
    int64_t rest = i, target = 0, scale = 1;
    for (int a = in.rank() - 1; a >= 0; --a) {
      const int64_t idx = rest % in[a];
      rest /= in[a];
      if (!mask[static_cast<size_t>(a)]) {
        target += idx * scale;
        scale *= in[a];
      }
    }
    r.target.push_back(target);
    ++r.count[static_cast<size_t>(target)];
  }
  return r;
}

ReferenceFn ReduceRef(Kind kind) {
  return [kind](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const Shape& shape = in[0].shape();
    const Reduction r = Plan(shape, Mask(shape.rank(), attrs.Ints("axes")), attrs.Bool("keepdim"));
    std::vector<double> acc(r.count.size(), kind == Kind::kMax ? -std::numeric_limits<double>::infinity() : 0.0);
    for (int64_t i = 0; i < in[0].NumElements(); ++i) {
      double& a = acc[static_cast<size_t>(r.target[static_cast<size_t>(i)])];
      const double v = ElementAsDouble(in[0], i);
      // (max: NaN wins, as PyTorch's amax.)
      a = kind != Kind::kMax               ? a + v
          : std::isnan(a) || std::isnan(v) ? std::numeric_limits<double>::quiet_NaN()
                                           : std::max(a, v);
    }
    Tensor y = Zeros(r.out, RefFloatDType(in));
    for (size_t o = 0; o < acc.size(); ++o) {
      const double v = kind == Kind::kMean ? acc[o] / static_cast<double>(r.count[o]) : acc[o];
      SetElementFromDouble(y, static_cast<int64_t>(o), v);
    }
    return std::vector<Tensor>{y};
  };
}

std::vector<Tensor> ReduceMaxGradRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape& shape = in[0].shape();
  const Reduction r = Plan(shape, Mask(shape.rank(), attrs.Ints("axes")), attrs.Bool("keepdim"));
  std::vector<int> ties(r.count.size(), 0);
  auto is_max = [&](int64_t i) {
    return ElementAsDouble(in[0], i) == ElementAsDouble(in[1], r.target[static_cast<size_t>(i)]);
  };
  for (int64_t i = 0; i < shape.NumElements(); ++i)
    ties[static_cast<size_t>(r.target[static_cast<size_t>(i)])] += is_max(i);
  Tensor dx = Zeros(shape, RefFloatDType(in));
  for (int64_t i = 0; i < shape.NumElements(); ++i) {
    const int64_t o = r.target[static_cast<size_t>(i)];
    if (is_max(i)) SetElementFromDouble(dx, i, ElementAsDouble(in[2], o) / ties[static_cast<size_t>(o)]);
    // A NaN maximum: every element of its slice gets NaN (PyTorch's amax:
    // mask * dy / count, with count 0).
    if (std::isnan(ElementAsDouble(in[1], o))) SetElementFromDouble(dx, i, std::numeric_limits<double>::quiet_NaN());
  }
  return {dx};
}

std::vector<Tensor> ArgmaxRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape& shape = in[0].shape();
  const int64_t axis_attr = attrs.Int("axis");
  const int axis = static_cast<int>(axis_attr < 0 ? axis_attr + shape.rank() : axis_attr);
  std::vector<bool> mask(static_cast<size_t>(shape.rank()), false);
  mask[static_cast<size_t>(axis)] = true;
  const Reduction r = Plan(shape, mask, attrs.Bool("keepdim"));
  const int64_t inner = shape.Strides()[static_cast<size_t>(axis)];
  std::vector<double> best(r.count.size(), 0);
  std::vector<bool> seen(r.count.size(), false);
  auto y = Tensor::Zeros(r.out, DType::kI64);  // 0 where all are NaN
  for (int64_t i = 0; i < shape.NumElements(); ++i) {
    const size_t o = static_cast<size_t>(r.target[static_cast<size_t>(i)]);
    const double v = ElementAsDouble(in[0], i);
    if (std::isnan(v)) continue;    // skipped, as the max
    if (!seen[o] || v > best[o]) {  // the first maximum wins
      seen[o] = true;
      best[o] = v;
      y->data<int64_t>()[o] = (i / inner) % shape[axis];
    }
  }
  return {*y};
}

std::vector<Tensor> TopKRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape& shape = in[0].shape();
  const int64_t n = shape[shape.rank() - 1], k = attrs.Int("k");
  Ints dims = shape.dims();
  dims.back() = k;
  Tensor values = Zeros(Shape(dims), RefFloatDType(in));
  auto indices = Tensor::Zeros(Shape(dims), DType::kI64);
  const int64_t rows = shape.NumElements() / n;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return ElementAsDouble(in[0], r * n + a) > ElementAsDouble(in[0], r * n + b);
    });
    for (int64_t j = 0; j < k; ++j) {
      SetElementFromDouble(values, r * k + j, ElementAsDouble(in[0], r * n + order[static_cast<size_t>(j)]));
      indices->data<int64_t>()[r * k + j] = order[static_cast<size_t>(j)];
    }
  }
  return {values, *indices};
}

std::vector<Tensor> SquareSumRef(const std::vector<Tensor>& in, const AttrMap&) {
  double total = 0;
  for (int64_t i = 0; i < in[0].NumElements(); ++i) total += ElementAsDouble(in[0], i) * ElementAsDouble(in[0], i);
  Tensor y = Zeros({}, RefFloatDType(in));
  SetElementFromDouble(y, 0, total);
  return {y};
}

// Distinct values at least 0.05 apart in random order: no ties for max, and
// no pair close enough for a finite-difference step to swap them.
Tensor Distinct(const Shape& shape, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(shape.NumElements()));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  const double middle = static_cast<double>(order.size()) / 2;
  return FilledF32(shape, [&](int64_t i) {
    return static_cast<float>((static_cast<double>(order[static_cast<size_t>(i)]) - middle) * 0.05);
  });
}

// Quarter steps in [-1, 1]: plenty of ties.
Tensor Tied(const Shape& shape, uint64_t seed) {
  Tensor q = RandomInts(shape, seed, -4, 5, DType::kI64);
  return FilledF32(shape, [&](int64_t i) { return static_cast<float>(q.data<int64_t>()[i]) / 4.0f; });
}

OpTestCase Case(std::string op, std::string label, std::vector<Tensor> inputs, AttrMap attrs, ReferenceFn ref) {
  return MakeCase(std::move(op), std::move(label), std::move(inputs), std::move(ref), std::move(attrs));
}

OpTestCase ReduceCase(const std::string& op, Kind kind, std::string label, Tensor x, Ints axes, bool keepdim) {
  OpTestCase c = Case(op, std::move(label), {std::move(x)}, {{"axes", axes}, {"keepdim", keepdim}}, ReduceRef(kind));
  c.rtol = 1e-5;
  c.atol = 1e-5;
  return c;
}

void AddSumMeanCases(std::vector<OpTestCase>& cases) {
  for (auto [op, kind] :
       {std::pair{std::string("reduce_sum"), Kind::kSum}, std::pair{std::string("reduce_mean"), Kind::kMean}}) {
    cases.push_back(ReduceCase(op, kind, "last_axis", RandomUniform({5, 7}, 1), {1}, false));
    cases.push_back(ReduceCase(op, kind, "leading_axis", RandomUniform({5, 7}, 2), {0}, false));
    cases.push_back(ReduceCase(op, kind, "outer_and_inner_keepdim", RandomUniform({3, 5, 4}, 3), {0, -1}, true));
    cases.push_back(ReduceCase(op, kind, "middle_axis", RandomUniform({3, 5, 4}, 4), {1}, false));
    cases.push_back(ReduceCase(op, kind, "all", RandomUniform({3, 5, 2}, 5), {}, false));
    // Long enough rows for the multi-lane loops, with ragged tails.
    cases.push_back(ReduceCase(op, kind, "long_rows", RandomUniform({3, 41}, 6), {1}, false));
    cases.push_back(ReduceCase(op, kind, "long_columns", RandomUniform({41, 3}, 7), {0}, true));
    cases.push_back(ReduceCase(op, kind, "two_groups", RandomUniform({2, 19, 3, 5}, 8), {0, 2}, false));
  }
  cases.push_back(ReduceCase("reduce_sum", Kind::kSum, "unit_axis", RandomUniform({4, 1, 5}, 9), {1}, false));
  cases.push_back(ReduceCase("reduce_sum", Kind::kSum, "scalar", RandomUniform({}, 10), {}, false));
  cases.push_back(ReduceCase("reduce_sum", Kind::kSum, "empty_axis", RandomUniform({0, 3}, 11), {0}, false));
  // bf16 and f16 inputs give the f32 sum of their values; the gradient is
  // the upstream one in x's type (rounded once: the tolerance).
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const auto low = [dtype](const Shape& shape, uint64_t seed) {
      const Tensor x = RandomUniform(shape, seed, -2.0f, 2.0f);
      std::vector<double> values;
      for (int64_t i = 0; i < x.NumElements(); ++i) values.push_back(x.data<float>()[i]);
      return FromDoubles(shape, dtype, values);
    };
    const std::string name(DTypeName(dtype));
    for (OpTestCase c : {
             // A bias's gradient: (B, T, C) summed over B and T.
             ReduceCase("reduce_sum", Kind::kSum, name + "_bias_gradient", low({3, 7, 40}, 12), {0, 1}, false),
             ReduceCase("reduce_sum", Kind::kSum, name + "_long_rows", low({3, 41}, 13), {1}, false),
             ReduceCase("reduce_sum", Kind::kSum, name + "_two_groups", low({2, 19, 3, 5}, 14), {0, 2}, true),
             ReduceCase("reduce_sum", Kind::kSum, name + "_all", low({3, 5, 2}, 15), {}, false),
             ReduceCase("reduce_sum", Kind::kSum, name + "_no_axis_left", low({1, 6}, 16), {0}, false),
         }) {
      c.grad_rtol = dtype == DType::kBF16 ? 4e-3 : 5e-4;
      cases.push_back(std::move(c));
    }
  }
}

void AddMaxCases(std::vector<OpTestCase>& cases) {
  cases.push_back(ReduceCase("reduce_max", Kind::kMax, "last_axis", Distinct({5, 7}, 20), {-1}, false));
  cases.push_back(ReduceCase("reduce_max", Kind::kMax, "leading_axis_keepdim", Distinct({5, 7}, 21), {0}, true));
  cases.push_back(ReduceCase("reduce_max", Kind::kMax, "two_groups", Distinct({3, 4, 2, 5}, 22), {1, 3}, false));
  cases.push_back(ReduceCase("reduce_max", Kind::kMax, "all", Distinct({3, 5, 4}, 23), {}, false));
  cases.push_back(ReduceCase("reduce_max", Kind::kMax, "long_rows", Distinct({3, 37}, 24), {1}, false));
  // A NaN wins wherever it is: in the first row, in a later one, past the
  // vector lanes. (It was kept only where it came first, so a split of the
  // rows changed the result.)
  for (const Ints& axes : {Ints{0}, Ints{1}, Ints{}}) {
    Tensor x = Distinct({6, 37}, 25);
    for (const int64_t at : {1, 3 * 37 + 4, 5 * 37 + 36, 2 * 37, 40 + 37 * 4}) {
      SetElementFromDouble(x, at, std::numeric_limits<double>::quiet_NaN());
    }
    OpTestCase c =
        ReduceCase("reduce_max", Kind::kMax,
                   "nan_axes_" + (axes.empty() ? std::string("all") : std::to_string(axes[0])), x, axes, false);
    c.check_grad = false;
    cases.push_back(std::move(c));
  }

  // The gradient op on its own, with ties (split evenly) and every layout
  // of the reduced axes.
  auto max_grad_case = [&](std::string label, const Shape& shape, Ints axes, bool keepdim, uint64_t seed) {
    Tensor x = Tied(shape, seed);
    const AttrMap attrs{{"axes", axes}, {"keepdim", keepdim}};
    Tensor y = ReduceRef(Kind::kMax)({x}, attrs)[0];
    Tensor dy = RandomUniform(y.shape(), seed + 1);
    cases.push_back(Case("reduce_max_grad", std::move(label), {x, y, dy}, attrs, ReduceMaxGradRef));
  };
  max_grad_case("last_axis_ties", {5, 7}, {1}, false, 30);
  max_grad_case("leading_axis_ties", {7, 5}, {0}, true, 32);
  max_grad_case("two_groups_ties", {3, 4, 2, 5}, {0, 2}, false, 34);
  max_grad_case("middle_axis_ties", {3, 6, 4}, {1}, false, 36);
  max_grad_case("all_ties", {4, 5}, {}, false, 38);
  // A NaN in some slices: their gradient is NaN throughout, the others'
  // as without it.
  for (const Ints& axes : {Ints{0}, Ints{1}}) {
    Tensor x = Tied({5, 6}, 39);
    SetElementFromDouble(x, 2 * 6 + 3, std::numeric_limits<double>::quiet_NaN());
    const AttrMap attrs{{"axes", axes}, {"keepdim", false}};
    Tensor y = ReduceRef(Kind::kMax)({x}, attrs)[0];
    Tensor dy = RandomUniform(y.shape(), 40);
    cases.push_back(
        Case("reduce_max_grad", "nan_axis_" + std::to_string(axes[0]), {x, y, dy}, attrs, ReduceMaxGradRef));
  }
}

void AddIndexCases(std::vector<OpTestCase>& cases) {
  cases.push_back(Case("argmax", "last_axis_ties", {Tied({5, 7}, 40)}, {}, ArgmaxRef));
  cases.push_back(Case("argmax", "middle_axis_keepdim", {Tied({5, 7, 3}, 41)},
                       {{"axis", int64_t{1}}, {"keepdim", true}}, ArgmaxRef));
  cases.push_back(Case("argmax", "leading_axis", {RandomUniform({6, 5}, 42)}, {{"axis", int64_t{0}}}, ArgmaxRef));
  // NaN skipped, a row or column of NaN gives 0, -inf is a value: the same
  // along the last axis (contiguous rows) and the first (strided columns).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor odd =
      Tensor::FromVector(Shape{4, 3}, std::vector<float>{nan, nan, 1, -inf, nan, nan, nan, nan, 2, -inf, nan, 2});
  cases.push_back(Case("argmax", "nan_and_neg_inf_rows", {odd}, {}, ArgmaxRef));
  cases.push_back(Case("argmax", "nan_and_neg_inf_columns", {odd}, {{"axis", int64_t{0}}}, ArgmaxRef));
  cases.push_back(Case("topk", "ties_by_index", {Tied({5, 7}, 43)}, {{"k", int64_t{3}}}, TopKRef));
  cases.push_back(Case("topk", "full_sort_3d", {RandomUniform({3, 4, 6}, 44)}, {{"k", int64_t{6}}}, TopKRef));
  cases.push_back(Case("topk", "k_zero", {RandomUniform({3, 4}, 45)}, {{"k", int64_t{0}}}, TopKRef));
  cases.push_back(Case("topk", "one_d", {RandomUniform({9}, 46)}, {{"k", int64_t{4}}}, TopKRef));
}

void AddSquareSumCases(std::vector<OpTestCase>& cases) {
  OpTestCase c = Case("square_sum", "matrix", {RandomUniform({5, 7}, 50)}, {}, SquareSumRef);
  c.rtol = 1e-5;
  cases.push_back(c);
  cases.push_back(Case("square_sum", "rank3", {RandomUniform({3, 4, 5}, 51)}, {}, SquareSumRef));
  cases.push_back(Case("square_sum", "scalar", {RandomUniform({}, 52)}, {}, SquareSumRef));
}

}  // namespace

std::vector<OpTestCase> ReduceCases() {
  std::vector<OpTestCase> cases;
  AddSumMeanCases(cases);
  AddMaxCases(cases);
  AddIndexCases(cases);
  AddSquareSumCases(cases);
  return cases;
}

}  // namespace tessera::ops::testing
