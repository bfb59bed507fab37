#pragma once
// Block copies between tensors of any dtype: the building blocks of
// splitting a logical tensor into shards and assembling it back (SBP checks,
// boxing by slices). Between CPU tensors they are row memcpys; when either
// side is on a GPU, 2-D copies of the CUDA runtime, waited for.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace tessera {

// Copies the block of `extent` at `src_offset` in `src` to `dst_offset` in
// `dst`. Same dtype and rank; bounds are checked.
absl::Status CopyBlock(const Tensor& src, const std::vector<int64_t>& src_offset, const Tensor& dst,
                       const std::vector<int64_t>& dst_offset, const Shape& extent);
// A new tensor holding the block of `extent` at `offset`.
absl::StatusOr<Tensor> ExtractBlock(const Tensor& src, const std::vector<int64_t>& offset, const Shape& extent);

namespace internal {
// CopyBlock through the 2-D pieces its GPU path queues, run by host copies
// when both tensors are on the CPU: for tests of that decomposition.
absl::Status CopyBlockAs2D(const Tensor& src, const std::vector<int64_t>& src_offset, const Tensor& dst,
                           const std::vector<int64_t>& dst_offset, const Shape& extent);
}  // namespace internal

}  // namespace tessera
