#pragma once
// The op test harness's vocabulary. Every registered op must have at least one
// OpTestCase (tests/ops/op_harness_test.cc fails otherwise). One case drives
// three checks:
//   1. reference: the CPU kernel against `reference`, a plain loop
//      implementation in double written independently of the kernel;
//   2. gradient (differentiable ops): the op's gradient rule, run eagerly
//      with the f32 kernels, against central differences of
//      L = Σ_k Σ w_k ⊙ out_k evaluated by `reference` in f64 (CheckGradient);
//   3. SBP: every signature, inputs split over p = 2, 3, 4 shards, kernel per
//      shard, outputs assembled per the output SBP, against the unsplit run.
// Cases are listed per op family in tests/ops/*_cases.cc.
//
// References are dtype-generic: given the case's inputs they return what the
// kernel returns (dtypes included); given f64 copies of the floating inputs
// they compute in f64 throughout and give their floating outputs in f64
// (RefFloatDType), so the finite differences see no f32 rounding.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "ops/attr.h"
#include "ops/registry.h"

namespace tessera::ops::testing {

using ReferenceFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const AttrMap& attrs)>;

struct OpTestCase {
  std::string op;
  std::string label;  // what this case covers; unique per op
  std::vector<Tensor> inputs;
  AttrMap attrs;
  ReferenceFn reference;
  double rtol = 1e-5;
  double atol = 1e-5;
  // Gradient check (ignored for ops without a gradient rule). The analytic
  // side runs f32 kernels, so its rounding sets the tolerance:
  // |analytic - fd| <= grad_atol + grad_rtol * |fd|. The defaults are ~10x
  // the worst error of a correct rule over the cases; a GELU rule that
  // ignores `approximate` is off by up to 9e-4 (gradient_check_test.cc).
  bool check_grad = true;
  double fd_step = 1e-6;  // central-difference step, relative: h = fd_step * max(1, |x|)
  double grad_rtol = 2e-5;
  double grad_atol = 2e-6;
  // Outputs that get a random upstream gradient; empty = every float output.
  std::vector<int> grad_outputs;
  bool check_sbp = true;
  int64_t step = 0;
};

// A case with the common defaults (tolerances, gradient and SBP checks on).
OpTestCase MakeCase(std::string op, std::string label, std::vector<Tensor> inputs, ReferenceFn reference,
                    AttrMap attrs = {});

// Deterministic test data (std::mt19937 seeded by `seed`).
Tensor RandomUniform(const Shape& shape, uint64_t seed, float low = -1.0f, float high = 1.0f);
Tensor RandomInts(const Shape& shape, uint64_t seed, int64_t low, int64_t high, DType dtype = DType::kI64);
Tensor RandomBools(const Shape& shape, uint64_t seed, double p_true = 0.5);
// f32 tensor filled by fn(flat index).
Tensor FilledF32(const Shape& shape, const std::function<float(int64_t)>& fn);

// For references: the dtype of their floating outputs. f64 when any input is
// f64 (the gradient check's double evaluation), else `natural`, the dtype the
// kernel gives.
DType RefFloatDType(const std::vector<Tensor>& inputs, DType natural = DType::kF32);
// Fresh zero-filled tensor of any dtype.
Tensor Zeros(const Shape& shape, DType dtype);
// A tensor of `dtype` holding `values` (row-major), each converted once.
Tensor FromDoubles(const Shape& shape, DType dtype, const std::vector<double>& values);
// An f64 copy of a floating tensor (exact); other dtypes are returned as they are.
Tensor ToF64(const Tensor& t);
// GELU in double: exact (erf) or the tanh approximation.
double ReferenceGelu(double x, bool tanh_approx);

// What CheckGradient found: `worst` is the largest |analytic - fd| over its
// tolerance among `checked` elements (> 1 means a mismatch), `mismatch`
// describes the first element over tolerance ("" when none is).
struct GradientCheck {
  int64_t checked = 0;
  double worst = 0;
  std::string mismatch;
};
// Check 2 above for case `c`, with the ops (the rule and the ops it emits)
// taken from `registry`. Errors: the rule fails to emit, or gives a gradient
// of the wrong shape or none for a differentiable floating input.
absl::StatusOr<GradientCheck> CheckGradient(const OpTestCase& c, const OpRegistry& registry);

// Every case of every family.
const std::vector<OpTestCase>& AllOpTestCases();

// Per family (tests/ops/<family>_cases.cc).
std::vector<OpTestCase> ElementwiseCases();
std::vector<OpTestCase> MatmulCases();
std::vector<OpTestCase> NormSoftmaxCases();
std::vector<OpTestCase> ShapeOpCases();
std::vector<OpTestCase> ReduceCases();
std::vector<OpTestCase> MiscCases();
std::vector<OpTestCase> AttentionCases();

}  // namespace tessera::ops::testing
