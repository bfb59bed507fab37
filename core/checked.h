#pragma once
// Checked size arithmetic. Every size derived from input (a config, a graph,
// a plan off the network) is computed here, so that an absurd size is an
// error naming the tensor and the dimension instead of a wrapped count that
// lets a kernel write past its buffer.
//
// Limits: a tensor has at most kMaxTensorRank axes and kMaxTensorBytes bytes.
// The element-count rule is stricter than "the product fits": the product of
// the extents with zeros counted as 1 must stay within kMaxTensorBytes, so
// every partial product of a checked shape (strides, row sizes, the extent
// of a split times its inner size) fits in int64 too, even for an empty
// tensor such as (0, 2^62).
//
// Stateless and thread-safe.

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace tessera {

inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 50;  // 1 PiB
inline constexpr int kMaxTensorRank = 64;

// a + b and a * b; an error "<what>: a + b overflows int64" when the result
// does not fit.
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, std::string_view what = "size");
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, std::string_view what = "size");

// The element count of `shape`; an error (naming the shape and the
// dimension) for a negative extent, more than kMaxTensorRank axes, or more
// elements than the limit above.
absl::StatusOr<int64_t> CheckedNumElements(const Shape& shape);
// The bytes of a tensor of `meta`, within kMaxTensorBytes; errors as
// CheckedNumElements, naming the meta.
absl::StatusOr<int64_t> CheckedByteSize(const TensorMeta& meta);

}  // namespace tessera
