#pragma once
// The op test harness's vocabulary. Every registered op must have at least one
// OpTestCase (tests/ops/op_harness_test.cc fails otherwise). One case drives
// three checks:
//   1. reference: the CPU kernel against `reference`, a plain loop
//      implementation written independently of the kernel;
//   2. gradient (differentiable ops): the op's gradient rule, run eagerly,
//      against central finite differences of L = Σ_k Σ w_k ⊙ out_k;
//   3. SBP: every signature, inputs split over p = 2, 3, 4 shards, kernel per
//      shard, outputs assembled per the output SBP, against the unsplit run.
// Cases are listed per op family in tests/ops/*_cases.cc.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/attr.h"

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
  // Gradient check (ignored for ops without a gradient rule).
  bool check_grad = true;
  double fd_eps = 1e-2;      // central-difference step (f32 kernels)
  double grad_rtol = 2e-2;
  double grad_atol = 2e-3;
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
// Fresh f32 tensor of `shape`, zero-filled.
Tensor ZerosF32(const Shape& shape);

// Every case of every family.
const std::vector<OpTestCase>& AllOpTestCases();

// Per family (tests/ops/<family>_cases.cc).
std::vector<OpTestCase> ElementwiseCases();
std::vector<OpTestCase> MatmulCases();
std::vector<OpTestCase> NormSoftmaxCases();
std::vector<OpTestCase> ShapeOpCases();
std::vector<OpTestCase> ReduceCases();
std::vector<OpTestCase> MiscCases();

}  // namespace tessera::ops::testing
