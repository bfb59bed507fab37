#pragma once
// SBP: how a global (logical) tensor is laid out over the devices of one
// hierarchy axis of a placement.
//   S(i)    split along tensor axis i (balanced: the first n % p shards get one
//           more row, as OneFlow does)
//   B       broadcast: every device holds the whole tensor
//   P       partial sum: the logical tensor is the sum of the local ones
//   P(max)  partial max: the logical tensor is the element-wise max of the
//           local ones. Not in OneFlow's set; Tessera uses it for the
//           row-max of vocabulary-parallel cross-entropy (Megatron's
//           all-reduce MAX), so that formulation is expressible as plain ops.
// NdSbp has one Sbp per hierarchy axis: `(S(0), B)` on a [2, 4] placement.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "core/status.h"

namespace tessera {

class Sbp {
 public:
  enum class Kind : uint8_t { kSplit, kBroadcast, kPartialSum, kPartialMax };

  static Sbp Split(int axis) { return Sbp(Kind::kSplit, axis); }
  static Sbp Broadcast() { return Sbp(Kind::kBroadcast, 0); }
  static Sbp PartialSum() { return Sbp(Kind::kPartialSum, 0); }
  static Sbp PartialMax() { return Sbp(Kind::kPartialMax, 0); }

  Kind kind() const { return kind_; }
  bool is_split() const { return kind_ == Kind::kSplit; }
  bool is_broadcast() const { return kind_ == Kind::kBroadcast; }
  bool is_partial_sum() const { return kind_ == Kind::kPartialSum; }
  bool is_partial_max() const { return kind_ == Kind::kPartialMax; }
  bool is_partial() const { return is_partial_sum() || is_partial_max(); }
  // The split axis; meaningful only when is_split().
  int axis() const { return axis_; }

  std::string ToString() const;  // "S(0)", "B", "P", "P(max)"
  bool operator==(const Sbp&) const = default;

 private:
  Sbp(Kind kind, int axis) : kind_(kind), axis_(axis) {}
  Kind kind_;
  int axis_;
};

// Accepts "S(0)", "S0", "B", "P", "P(max)" (spaces ignored).
absl::StatusOr<Sbp> ParseSbp(std::string_view text);

using NdSbp = std::vector<Sbp>;
// "(S(0), B)"; a one-axis NdSbp prints as "(S(0))".
std::string NdSbpToString(const NdSbp& nd_sbp);
// Accepts "(S(0), B)", "S(0), B", and a single "S(0)".
absl::StatusOr<NdSbp> ParseNdSbp(std::string_view text);

// The piece [offset, offset + size) of an extent `n` that shard `index` of
// `parts` holds under a balanced split.
struct Range {
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const Range&) const = default;
};
Range BalancedSplit(int64_t n, int64_t parts, int64_t index);

// Where a local tensor sits in its logical tensor: per axis, the offset of the
// local block and the logical extent. Kernels that draw random numbers or
// index by global position (embedding over a vocabulary shard, arange) read it.
struct TensorSlice {
  Shape logical;
  std::vector<int64_t> offset;  // one per axis
  Shape local;

  // The whole tensor (offset 0 everywhere).
  static TensorSlice Whole(const Shape& shape);
  bool IsWhole() const { return logical == local; }
};

// The local block of rank `parallel_id` (row-major over `hierarchy`) of a
// tensor with logical shape `logical` laid out as `nd_sbp`. Splits nest in
// hierarchy order (the second axis splits the first axis's piece). Partial and
// broadcast axes do not change the block. Errors name the SBP and the shape.
absl::StatusOr<TensorSlice> LocalSlice(const Shape& logical, const NdSbp& nd_sbp,
                                       const std::vector<int64_t>& hierarchy, int64_t parallel_id);
// Whether blocks `a` and `b` (of logical tensors with the same number of
// elements, possibly of different shapes) hold the same elements of the
// row-major flattening, in the same order: a reshape of `a`'s local tensor
// to `b`'s local shape is then the reshape of the logical tensor, locally.
bool SameRowMajorElements(const TensorSlice& a, const TensorSlice& b);
// Convenience: LocalSlice(...).local for a one-axis layout over `parts` devices.
absl::StatusOr<Shape> LocalShape(const Shape& logical, const Sbp& sbp, int64_t parts, int64_t index);

}  // namespace tessera
