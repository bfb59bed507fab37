// Test cases of the shape family. References move elements one at a time by
// multi-index (through doubles, exact for every dtype used here), written
// independently of the kernels' coalescing and blocking.

#include <cmath>
#include <limits>
#include <optional>

#include "core/text.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

using Index = std::vector<int64_t>;
using Ints = std::vector<int64_t>;

Index Unravel(int64_t flat, const Shape& shape) {
  Index idx(static_cast<size_t>(shape.rank()));
  for (int a = shape.rank() - 1; a >= 0; --a) {
    idx[static_cast<size_t>(a)] = flat % shape[a];
    flat /= shape[a];
  }
  return idx;
}

int64_t Ravel(const Index& idx, const Shape& shape) {
  int64_t flat = 0;
  for (int a = 0; a < shape.rank(); ++a) flat = flat * shape[a] + idx[static_cast<size_t>(a)];
  return flat;
}

// Element of `t` at output multi-index `idx` under numpy broadcasting.
double At(const Tensor& t, const Index& idx) {
  const Shape& s = t.shape();
  const int lead = static_cast<int>(idx.size()) - s.rank();
  Index own(static_cast<size_t>(s.rank()));
  for (int a = 0; a < s.rank(); ++a) own[static_cast<size_t>(a)] = s[a] == 1 ? 0 : idx[static_cast<size_t>(a + lead)];
  return ElementAsDouble(t, Ravel(own, s));
}

// Values on a coarse grid, exact in every float dtype (for cast cases) and
// without ties closer than the finite-difference step.
Tensor Grid(const Shape& shape, uint64_t seed) {
  Tensor t = RandomInts(shape, seed, -64, 64, DType::kI64);
  return FilledF32(shape, [&](int64_t i) { return static_cast<float>(t.data<int64_t>()[i]) / 64.0f; });
}

OpTestCase Case(std::string op, std::string label, std::vector<Tensor> inputs, AttrMap attrs, ReferenceFn ref) {
  return MakeCase(std::move(op), std::move(label), std::move(inputs), std::move(ref), std::move(attrs));
}

// Integer and bool data have no gradients to check.
OpTestCase NoGrad(OpTestCase c) {
  c.check_grad = false;
  return c;
}

// bf16 data on Grid's 1/64 steps. The P → P check splits the input into
// bf16 parts, which round.
OpTestCase Bf16(OpTestCase c) {
  c.atol = 1e-2;
  return c;
}

// ---- references

std::vector<Tensor> ReshapeRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  Ints dims = attrs.Ints("shape");
  int64_t known = 1;
  for (int64_t d : dims) known *= d == -1 ? 1 : d;
  for (int64_t& d : dims) {
    if (d == -1) d = in[0].NumElements() / known;
  }
  Tensor y = Zeros(Shape(dims), in[0].dtype());
  for (int64_t i = 0; i < y.NumElements(); ++i) SetElementFromDouble(y, i, ElementAsDouble(in[0], i));
  return {y};
}

std::vector<Tensor> TransposeRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape& xs = in[0].shape();
  Ints perm;
  for (int64_t p : attrs.Ints("perm")) perm.push_back(p < 0 ? p + xs.rank() : p);
  Ints dims;
  for (int64_t p : perm) dims.push_back(xs[static_cast<int>(p)]);
  Tensor y = Zeros(Shape(dims), in[0].dtype());
  for (int64_t i = 0; i < y.NumElements(); ++i) {
    const Index out = Unravel(i, y.shape());
    Index src(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) src[static_cast<size_t>(perm[k])] = out[k];
    SetElementFromDouble(y, i, ElementAsDouble(in[0], Ravel(src, xs)));
  }
  return {y};
}

// Per-axis [start, start + size) by numpy rules, spelled out separately from
// the op's normalisation.
void SliceBounds(const Shape& shape, const AttrMap& attrs, Index* start, Index* size) {
  for (int a = 0; a < shape.rank(); ++a) {
    int64_t s = attrs.Ints("starts")[static_cast<size_t>(a)], e = attrs.Ints("ends")[static_cast<size_t>(a)];
    const int64_t d = shape[a];
    if (s < 0) s += d;
    if (e < 0) e += d;
    s = std::min(std::max<int64_t>(s, 0), d);
    e = std::min(std::max<int64_t>(e, 0), d);
    start->push_back(s);
    size->push_back(e > s ? e - s : 0);
  }
}

std::vector<Tensor> SliceRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  Index start, size;
  SliceBounds(in[0].shape(), attrs, &start, &size);
  Tensor y = Zeros(Shape(size), in[0].dtype());
  for (int64_t i = 0; i < y.NumElements(); ++i) {
    Index idx = Unravel(i, y.shape());
    for (size_t a = 0; a < idx.size(); ++a) idx[a] += start[a];
    SetElementFromDouble(y, i, ElementAsDouble(in[0], Ravel(idx, in[0].shape())));
  }
  return {y};
}

std::vector<Tensor> SliceGradRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape shape(attrs.Ints("shape"));
  Index start, size;
  SliceBounds(shape, attrs, &start, &size);
  Tensor y = Zeros(shape, in[0].dtype());
  for (int64_t i = 0; i < in[0].NumElements(); ++i) {
    Index idx = Unravel(i, in[0].shape());
    for (size_t a = 0; a < idx.size(); ++a) idx[a] += start[a];
    SetElementFromDouble(y, Ravel(idx, shape), ElementAsDouble(in[0], i));
  }
  return {y};
}

int Axis(int64_t axis, int rank) { return static_cast<int>(axis < 0 ? axis + rank : axis); }

std::vector<Tensor> ConcatRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const int axis = Axis(attrs.Int("axis"), in[0].shape().rank());
  Shape out = in[0].shape();
  out[axis] = 0;
  for (const Tensor& t : in) out[axis] += t.shape()[axis];
  Tensor y = Zeros(out, in[0].dtype());
  int64_t at = 0;
  for (const Tensor& t : in) {
    for (int64_t i = 0; i < t.NumElements(); ++i) {
      Index idx = Unravel(i, t.shape());
      idx[static_cast<size_t>(axis)] += at;
      SetElementFromDouble(y, Ravel(idx, out), ElementAsDouble(t, i));
    }
    at += t.shape()[axis];
  }
  return {y};
}

std::vector<Tensor> SplitRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const int axis = Axis(attrs.Int("axis"), in[0].shape().rank());
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t size : attrs.Ints("sizes")) {
    Shape shape = in[0].shape();
    shape[axis] = size;
    Tensor y = Zeros(shape, in[0].dtype());
    for (int64_t i = 0; i < y.NumElements(); ++i) {
      Index idx = Unravel(i, shape);
      idx[static_cast<size_t>(axis)] += at;
      SetElementFromDouble(y, i, ElementAsDouble(in[0], Ravel(idx, in[0].shape())));
    }
    at += size;
    out.push_back(y);
  }
  return out;
}

std::vector<Tensor> BroadcastToRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  Tensor y = Zeros(Shape(attrs.Ints("shape")), in[0].dtype());
  for (int64_t i = 0; i < y.NumElements(); ++i) SetElementFromDouble(y, i, At(in[0], Unravel(i, y.shape())));
  return {y};
}

// The cast rules written out per target dtype: truncation and saturation for
// integers (NaN → 0), != 0 for bool, rounding to nearest even for 16-bit
// floats (through SetElementFromDouble's conversions; tests/core checks
// those bit by bit), wrap for i64 → i32. In the double evaluation a cast
// between floats is the identity: rounding is the storage, not the function
// the gradient rule differentiates.
double CastValue(double v, DType from, DType to) {
  if (!IsFloatingPoint(from) && to == DType::kI32) {
    return static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(v)));
  }
  switch (to) {
    case DType::kBool:
      return v != 0.0 ? 1.0 : 0.0;
    case DType::kI32:
    case DType::kI64: {
      if (std::isnan(v)) return 0.0;
      const double hi = to == DType::kI32 ? 2147483647.0 : 9223372036854775807.0;
      const double lo = to == DType::kI32 ? -2147483648.0 : -9223372036854775808.0;
      if (v >= hi) return hi;
      if (v <= lo) return lo;
      return std::trunc(v);
    }
    default:
      return v;
  }
}

std::vector<Tensor> CastRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const DType to = attrs.GetDType("dtype");
  Tensor y = Zeros(in[0].shape(), IsFloatingPoint(to) ? RefFloatDType(in, to) : to);
  for (int64_t i = 0; i < y.NumElements(); ++i) {
    SetElementFromDouble(y, i, CastValue(ElementAsDouble(in[0], i), in[0].dtype(), to));
  }
  return {y};
}

std::vector<Tensor> WhereRef(const std::vector<Tensor>& in, const AttrMap&) {
  const Shape out = *BroadcastShapes(in[0].shape(), *BroadcastShapes(in[1].shape(), in[2].shape()));
  Tensor y = Zeros(out, in[1].dtype());
  for (int64_t i = 0; i < y.NumElements(); ++i) {
    const Index idx = Unravel(i, out);
    SetElementFromDouble(y, i, At(in[0], idx) != 0 ? At(in[1], idx) : At(in[2], idx));
  }
  return {y};
}

std::vector<Tensor> MaskedFillRef(const std::vector<Tensor>& in, const AttrMap& attrs) {
  Tensor y = Zeros(in[0].shape(), in[0].dtype());
  for (int64_t i = 0; i < y.NumElements(); ++i) {
    const Index idx = Unravel(i, y.shape());
    SetElementFromDouble(y, i, At(in[1], idx) != 0 ? attrs.Float("value") : ElementAsDouble(in[0], i));
  }
  return {y};
}

ReferenceFn ConstantRef(std::optional<double> fixed) {
  return [fixed](const std::vector<Tensor>&, const AttrMap& attrs) {
    Tensor y = Zeros(Shape(attrs.Ints("shape")), attrs.GetDType("dtype"));
    const double value = fixed ? *fixed : attrs.Float("value");
    for (int64_t i = 0; i < y.NumElements(); ++i) SetElementFromDouble(y, i, value);
    return std::vector<Tensor>{y};
  };
}

std::vector<Tensor> ArangeRef(const std::vector<Tensor>&, const AttrMap& attrs) {
  Tensor y = Zeros(Shape{attrs.Int("n")}, attrs.GetDType("dtype"));
  for (int64_t i = 0; i < y.NumElements(); ++i) {
    SetElementFromDouble(y, i, attrs.Float("start") + static_cast<double>(i) * attrs.Float("step"));
  }
  return {y};
}

Tensor Ints64(const Shape& shape, uint64_t seed) { return RandomInts(shape, seed, -1000, 1000, DType::kI64); }

// f32 values cast to another dtype (exact: they lie on Grid's 1/64 steps).
Tensor AsDType(const Tensor& t, DType dtype) {
  Tensor y = Zeros(t.shape(), dtype);
  for (int64_t i = 0; i < t.NumElements(); ++i) SetElementFromDouble(y, i, ElementAsDouble(t, i));
  return y;
}

void AddReshapeCases(std::vector<OpTestCase>& cases) {
  // (B, T, C) → (B·T, C) with B = 5: S(0) → S(0) is wrong for p = 2, 3, 4
  // and must not be offered; S(2) → S(1) always holds.
  cases.push_back(
      Case("reshape", "merge_leading_uneven", {RandomUniform({5, 3, 4}, 1)}, {{"shape", Ints{15, 4}}}, ReshapeRef));
  // B = 4: S(0) → S(0) holds for p = 2, 4 but not 3.
  cases.push_back(
      Case("reshape", "merge_leading_b4", {RandomUniform({4, 3, 2}, 2)}, {{"shape", Ints{12, 2}}}, ReshapeRef));
  // (B·T, C) → (B, T, C): S(0) → S(0) iff B % p == 0.
  cases.push_back(
      Case("reshape", "split_leading", {RandomUniform({12, 2}, 3)}, {{"shape", Ints{4, 3, 2}}}, ReshapeRef));
  cases.push_back(
      Case("reshape", "infer_minus_one", {RandomUniform({6, 5}, 4)}, {{"shape", Ints{-1, 3, 5}}}, ReshapeRef));
  // T = 1: S(0) → S(0) holds for every p.
  cases.push_back(Case("reshape", "unit_time", {RandomUniform({7, 1, 4}, 5)}, {{"shape", Ints{7, 4}}}, ReshapeRef));
  cases.push_back(Case("reshape", "to_scalar", {RandomUniform({1, 1}, 6)}, {{"shape", Ints{}}}, ReshapeRef));
  cases.push_back(NoGrad(Case("reshape", "i64", {Ints64({3, 4}, 7)}, {{"shape", Ints{2, 6}}}, ReshapeRef)));
}

// depend(x, after) = x: `after`'s values (and its shape and dtype) do not
// matter; its gradient is none.
void AddDependCases(std::vector<OpTestCase>& cases) {
  const auto first = [](const std::vector<Tensor>& in, const AttrMap&) { return std::vector<Tensor>{in[0].Clone()}; };
  cases.push_back(Case("depend", "matrix_after_vector", {RandomUniform({5, 3}, 1), RandomUniform({7}, 2)}, {}, first));
  cases.push_back(Case("depend", "rank3_after_ints", {RandomUniform({2, 3, 4}, 3), Ints64({3, 2}, 4)}, {}, first));
}

void AddTransposeCases(std::vector<OpTestCase>& cases) {
  cases.push_back(Case("transpose", "last_two", {RandomUniform({7, 5}, 10)}, {{"perm", Ints{1, 0}}}, TransposeRef));
  cases.push_back(
      Case("transpose", "bthd_to_bhtd", {RandomUniform({2, 5, 3, 4}, 11)}, {{"perm", Ints{0, 2, 1, 3}}}, TransposeRef));
  cases.push_back(
      Case("transpose", "rotate_3d", {RandomUniform({5, 3, 4}, 12)}, {{"perm", Ints{2, 0, -2}}}, TransposeRef));
  cases.push_back(
      Case("transpose", "unit_axes", {RandomUniform({1, 5, 1, 6}, 13)}, {{"perm", Ints{3, 2, 0, 1}}}, TransposeRef));
  // Larger than one 32×32 tile on both sides, with ragged edges.
  OpTestCase tiled =
      Case("transpose", "tiled_ragged", {RandomUniform({3, 37, 45}, 14)}, {{"perm", Ints{0, 2, 1}}}, TransposeRef);
  tiled.check_grad = false;  // the small cases check the rule
  cases.push_back(tiled);
  cases.push_back(Bf16(Case("transpose", "bf16", {AsDType(Grid({3, 5, 2}, 15), DType::kBF16)},
                            {{"perm", Ints{2, 1, 0}}}, TransposeRef)));
  cases.push_back(NoGrad(Case("transpose", "i64", {Ints64({4, 3}, 16)}, {{"perm", Ints{1, 0}}}, TransposeRef)));
  cases.push_back(
      NoGrad(Case("transpose", "bool", {RandomBools({3, 2, 5}, 17)}, {{"perm", Ints{1, 2, 0}}}, TransposeRef)));
}

void AddSliceCases(std::vector<OpTestCase>& cases) {
  // Axis 1 whole (end clamps), so S(1) applies; axis 0 trimmed at both ends.
  cases.push_back(Case("slice", "rows_clamped_end", {RandomUniform({5, 7}, 20)},
                       {{"starts", Ints{1, 0}}, {"ends", Ints{-1, 100}}}, SliceRef));
  cases.push_back(Case("slice", "inner_window", {RandomUniform({4, 6, 5}, 21)},
                       {{"starts", Ints{0, -4, 1}}, {"ends", Ints{4, 6, 3}}}, SliceRef));
  cases.push_back(
      Case("slice", "empty", {RandomUniform({4, 5}, 22)}, {{"starts", Ints{3, 0}}, {"ends", Ints{1, 5}}}, SliceRef));
  cases.push_back(NoGrad(Case("slice", "negative_start_clamps", {Ints64({6, 3}, 23)},
                              {{"starts", Ints{-100, 1}}, {"ends", Ints{4, 3}}}, SliceRef)));
  cases.push_back(Case("slice_grad", "rows", {RandomUniform({3, 7}, 24)},
                       {{"shape", Ints{5, 7}}, {"starts", Ints{1, 0}}, {"ends", Ints{-1, 7}}}, SliceGradRef));
  cases.push_back(Case("slice_grad", "inner_window", {RandomUniform({4, 4, 2}, 25)},
                       {{"shape", Ints{4, 6, 5}}, {"starts", Ints{0, -4, 1}}, {"ends", Ints{4, 6, 3}}}, SliceGradRef));
}

void AddConcatSplitCases(std::vector<OpTestCase>& cases) {
  cases.push_back(Case("concat", "middle_axis",
                       {RandomUniform({2, 3, 5}, 30), RandomUniform({2, 1, 5}, 31), RandomUniform({2, 4, 5}, 32)},
                       {{"axis", int64_t{1}}}, ConcatRef));
  cases.push_back(Case("concat", "leading_negative_axis", {RandomUniform({3, 5}, 33), RandomUniform({4, 5}, 34)},
                       {{"axis", int64_t{-2}}}, ConcatRef));
  cases.push_back(Case("concat", "single_input", {RandomUniform({3, 5}, 35)}, {{"axis", int64_t{1}}}, ConcatRef));
  cases.push_back(NoGrad(Case("concat", "i32_last_axis",
                              {RandomInts({3, 2}, 36, -9, 9, DType::kI32), RandomInts({3, 5}, 37, -9, 9, DType::kI32)},
                              {{"axis", int64_t{1}}}, ConcatRef)));
  cases.push_back(Case("split", "last_axis_with_empty_piece", {RandomUniform({5, 7}, 38)},
                       {{"axis", int64_t{1}}, {"sizes", Ints{2, 0, 5}}}, SplitRef));
  OpTestCase partial = Case("split", "grads_for_some_outputs", {RandomUniform({6, 5}, 39)},
                            {{"axis", int64_t{0}}, {"sizes", Ints{1, 3, 2}}}, SplitRef);
  partial.grad_outputs = {0, 2};  // output 1 gets no gradient: zeros stand in
  cases.push_back(partial);
  cases.push_back(NoGrad(Case("split", "bool_middle_axis", {RandomBools({3, 4, 5}, 40)},
                              {{"axis", int64_t{1}}, {"sizes", Ints{1, 3}}}, SplitRef)));
}

void AddBroadcastCastCases(std::vector<OpTestCase>& cases) {
  cases.push_back(
      Case("broadcast_to", "column_to_3d", {RandomUniform({3, 1}, 50)}, {{"shape", Ints{2, 3, 5}}}, BroadcastToRef));
  cases.push_back(
      Case("broadcast_to", "row_to_matrix", {RandomUniform({7}, 51)}, {{"shape", Ints{5, 7}}}, BroadcastToRef));
  cases.push_back(
      NoGrad(Case("broadcast_to", "identity_i64", {Ints64({3, 2}, 52)}, {{"shape", Ints{3, 2}}}, BroadcastToRef)));
  cases.push_back(Case("broadcast_to", "scalar", {RandomUniform({}, 53)}, {{"shape", Ints{3, 5}}}, BroadcastToRef));

  // Float ↔ float on grid values: exact both ways.
  for (DType to : {DType::kBF16, DType::kF16}) {
    OpTestCase c = Case("cast", StrCat("f32_to_", DTypeName(to)), {Grid({5, 7}, 54)}, {{"dtype", to}}, CastRef);
    c.atol = 1e-2;  // P → P: the shards' parts round separately in 16 bits
    cases.push_back(c);
  }
  OpTestCase rounding = Case("cast", "f32_to_bf16_rounding", {RandomUniform({5, 3}, 55, -100.0f, 100.0f)},
                             {{"dtype", DType::kBF16}}, CastRef);
  rounding.atol = 1.0;  // P → P again
  cases.push_back(rounding);
  // The rule casts the f32 gradient back to bf16, which rounds it to 8
  // significant bits (a relative error up to 2^-8).
  OpTestCase from_bf16 =
      Bf16(Case("cast", "bf16_to_f32", {AsDType(Grid({4, 3}, 56), DType::kBF16)}, {{"dtype", DType::kF32}}, CastRef));
  from_bf16.grad_rtol = 1.0 / 128;
  cases.push_back(from_bf16);
  OpTestCase to_int =
      Case("cast", "f32_to_i32_saturating",
           {FilledF32({2, 5},
                      [](int64_t i) {
                        const float v[] = {2.7f, -2.7f, 0.5f, -0.5f, 3e9f, -3e9f, NAN, INFINITY, 7.0f, 0.0f};
                        return v[i];
                      })},
           {{"dtype", DType::kI32}}, CastRef);
  to_int.check_grad = false;  // inf/NaN inputs; the zero-gradient rule is checked by f32_to_i64
  cases.push_back(to_int);
  OpTestCase to_i64 = Case("cast", "f32_to_i64", {FilledF32({3, 4}, [](int64_t i) { return 0.25f + 1.1f * (i - 6); })},
                           {{"dtype", DType::kI64}}, CastRef);
  cases.push_back(to_i64);
  cases.push_back(Case("cast", "f32_to_bool",
                       {FilledF32({3, 3}, [](int64_t i) { return (i % 3 == 0) ? 0.0f : 0.5f * i; })},
                       {{"dtype", DType::kBool}}, CastRef));
  cases.push_back(NoGrad(Case("cast", "i64_to_f32", {Ints64({3, 4}, 57)}, {{"dtype", DType::kF32}}, CastRef)));
  cases.push_back(NoGrad(Case("cast", "i64_to_i32_wraps",
                              {Tensor::FromVector<int64_t>({2, 2}, {5, -7, int64_t{1} << 33, (int64_t{1} << 32) + 3})},
                              {{"dtype", DType::kI32}}, CastRef)));
  cases.push_back(NoGrad(
      Case("cast", "i32_to_bool", {RandomInts({4, 3}, 58, -2, 3, DType::kI32)}, {{"dtype", DType::kBool}}, CastRef)));
  cases.push_back(NoGrad(Case("cast", "bool_to_f16", {RandomBools({3, 5}, 59)}, {{"dtype", DType::kF16}}, CastRef)));
}

void AddSelectCases(std::vector<OpTestCase>& cases) {
  cases.push_back(Case("where", "broadcast_all_three",
                       {RandomBools({5, 1}, 60), RandomUniform({5, 7}, 61), RandomUniform({7}, 62)}, {}, WhereRef));
  cases.push_back(Case("where", "same_shape",
                       {RandomBools({4, 6}, 63), RandomUniform({4, 6}, 64), RandomUniform({4, 6}, 65)}, {}, WhereRef));
  cases.push_back(Case("where", "cond_broadcasts_up",
                       {RandomBools({3, 4, 5}, 66), RandomUniform({4, 1}, 67), RandomUniform({1, 5}, 68)}, {},
                       WhereRef));
  cases.push_back(
      NoGrad(Case("where", "i64", {RandomBools({3, 5}, 69), Ints64({3, 5}, 70), Ints64({1}, 71)}, {}, WhereRef)));
  cases.push_back(Case("masked_fill", "row_mask", {RandomUniform({5, 7}, 72), RandomBools({1, 7}, 73)},
                       {{"value", -1e4}}, MaskedFillRef));
  cases.push_back(Case("masked_fill", "zero_fill_is_linear", {RandomUniform({3, 4, 5}, 74), RandomBools({4, 1}, 75)},
                       {{"value", 0.0}}, MaskedFillRef));
  OpTestCase neg_inf = Case("masked_fill", "full_mask_neg_inf", {RandomUniform({4, 5}, 76), RandomBools({4, 5}, 77)},
                            {{"value", -std::numeric_limits<double>::infinity()}}, MaskedFillRef);
  neg_inf.check_grad = false;  // a loss with -inf in it has no finite differences
  cases.push_back(neg_inf);
  cases.push_back(NoGrad(Case("masked_fill", "i32", {RandomInts({4, 5}, 78, -9, 9, DType::kI32), RandomBools({5}, 79)},
                              {{"value", 42.0}}, MaskedFillRef)));
}

void AddMakerCases(std::vector<OpTestCase>& cases) {
  cases.push_back(Case("fill", "f32", {}, {{"shape", Ints{5, 3}}, {"value", 2.5}}, ConstantRef(std::nullopt)));
  cases.push_back(Case("fill", "bf16", {}, {{"shape", Ints{7}}, {"value", -1.5}, {"dtype", DType::kBF16}},
                       ConstantRef(std::nullopt)));
  cases.push_back(Case("fill", "i32", {}, {{"shape", Ints{2, 3, 5}}, {"value", 7.0}, {"dtype", DType::kI32}},
                       ConstantRef(std::nullopt)));
  cases.push_back(Case("zeros", "f32", {}, {{"shape", Ints{5, 3}}}, ConstantRef(0.0)));
  cases.push_back(Case("zeros", "i64_scalar", {}, {{"shape", Ints{}}, {"dtype", DType::kI64}}, ConstantRef(0.0)));
  cases.push_back(Case("ones", "f16", {}, {{"shape", Ints{3, 7}}, {"dtype", DType::kF16}}, ConstantRef(1.0)));
  cases.push_back(Case("ones", "bool", {}, {{"shape", Ints{7, 2}}, {"dtype", DType::kBool}}, ConstantRef(1.0)));
  // Under S(0) every shard must continue from its offset.
  cases.push_back(
      Case("arange", "f32_fractional_step", {}, {{"start", 1.0}, {"step", 0.5}, {"n", int64_t{7}}}, ArangeRef));
  cases.push_back(Case("arange", "i64_negative_start", {},
                       {{"start", -3.0}, {"step", 2.0}, {"n", int64_t{9}}, {"dtype", DType::kI64}}, ArangeRef));
  cases.push_back(Case("arange", "i32_default_start", {}, {{"n", int64_t{5}}, {"dtype", DType::kI32}}, ArangeRef));
  // 16-bit floats: fractional values rounded once from the double, to
  // nearest even (0.1 steps are inexact in every format).
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    cases.push_back(Case("arange", StrCat(DTypeName(dtype), "_fractional_step"), {},
                         {{"start", -1.25}, {"step", 0.1}, {"n", int64_t{37}}, {"dtype", dtype}}, ArangeRef));
  }
}

}  // namespace

std::vector<OpTestCase> ShapeOpCases() {
  std::vector<OpTestCase> cases;
  AddReshapeCases(cases);
  AddDependCases(cases);
  AddTransposeCases(cases);
  AddSliceCases(cases);
  AddConcatSplitCases(cases);
  AddBroadcastCastCases(cases);
  AddSelectCases(cases);
  AddMakerCases(cases);
  return cases;
}

}  // namespace tessera::ops::testing
