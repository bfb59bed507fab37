#pragma once
// Helpers shared by op schemas: dtype checks, common inference rules and
// common SBP signature sets. Kernels' helpers live in ops/cpu/cpu_util.h.

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/sbp.h"
#include "core/tensor.h"
#include "ops/op_schema.h"

namespace tessera::ops {

// Error "input 'x' must be f32, got i64" unless `meta` has `dtype`.
absl::Status ExpectDType(const TensorMeta& meta, DType dtype, std::string_view input_name);
// Error unless `meta` has rank `rank` (or at least `rank` when at_least).
absl::Status ExpectRank(const TensorMeta& meta, int rank, std::string_view input_name, bool at_least = false);

// Signatures of an op whose inputs and outputs all have the same shape and
// whose outputs are computed element by element: S(a)...→S(a) for every axis,
// B...→B, and, when `linear_in_all` (the op is linear in every input jointly,
// like add), P...→P.
std::vector<SbpSignature> ElementwiseSignatures(int num_inputs, int num_outputs, int rank, bool linear_in_all);

// Signatures of a bias op (x (..., C), bias (C,), then inputs shaped as x):
// rows split with the bias broadcast, or the channel axis split together
// with the bias; all broadcast; and, when `linear`, all partial.
std::vector<SbpSignature> BiasSignatures(const std::vector<TensorMeta>& in, bool linear);

// Signatures of a broadcasting binary op with inputs a, b and output y:
// for every output axis, S on that axis in each input that has a non-1
// extent there (B for inputs that broadcast along it), plus B,B→B, and the
// partial rules the caller allows: P,P→P (sum-linear ops: add, sub) and
// P,B→P / B,P→P (ops linear in one input: mul; div only P,B→P).
struct PartialRules {
  bool both_partial = false;    // P, P -> P
  bool first_partial = false;   // P, B -> P
  bool second_partial = false;  // B, P -> P
};
std::vector<SbpSignature> BroadcastBinarySignatures(const Shape& a, const Shape& b, PartialRules partial);

}  // namespace tessera::ops
