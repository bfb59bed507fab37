#include "core/tensor_util.h"

#include <cstring>

#include "core/status.h"
#include "core/text.h"

namespace tessera {
namespace {

// Recursive row copy; the innermost axis is one memcpy.
void CopyRecursive(const char* src, const std::vector<int64_t>& src_strides, char* dst,
                   const std::vector<int64_t>& dst_strides, const Shape& extent, int axis, size_t elem) {
  if (axis == extent.rank() - 1) {
    std::memcpy(dst, src, static_cast<size_t>(extent[axis]) * elem);
    return;
  }
  for (int64_t i = 0; i < extent[axis]; ++i) {
    CopyRecursive(src + static_cast<size_t>(i * src_strides[static_cast<size_t>(axis)]) * elem, src_strides,
                  dst + static_cast<size_t>(i * dst_strides[static_cast<size_t>(axis)]) * elem, dst_strides, extent,
                  axis + 1, elem);
  }
}

}  // namespace

absl::Status CopyBlock(const Tensor& src, const std::vector<int64_t>& src_offset, const Tensor& dst,
                       const std::vector<int64_t>& dst_offset, const Shape& extent) {
  const int rank = extent.rank();
  if (src.dtype() != dst.dtype() || src.shape().rank() != rank || dst.shape().rank() != rank ||
      static_cast<int>(src_offset.size()) != rank || static_cast<int>(dst_offset.size()) != rank) {
    return absl::InvalidArgumentError(StrCat("CopyBlock: ", src.meta().ToString(), " → ", dst.meta().ToString(),
                                             " with block ", extent.ToString()));
  }
  for (int a = 0; a < rank; ++a) {
    if (src_offset[static_cast<size_t>(a)] < 0 || dst_offset[static_cast<size_t>(a)] < 0 ||
        src_offset[static_cast<size_t>(a)] + extent[a] > src.shape()[a] ||
        dst_offset[static_cast<size_t>(a)] + extent[a] > dst.shape()[a]) {
      return absl::OutOfRangeError(StrCat("CopyBlock: block ", extent.ToString(), " out of range on axis ", a));
    }
  }
  if (extent.NumElements() == 0) return absl::OkStatus();
  const size_t elem = DTypeSize(src.dtype());
  if (rank == 0) {
    std::memcpy(dst.raw_data(), src.raw_data(), elem);
    return absl::OkStatus();
  }
  const auto src_strides = src.shape().Strides();
  const auto dst_strides = dst.shape().Strides();
  int64_t src_start = 0, dst_start = 0;
  for (int a = 0; a < rank; ++a) {
    src_start += src_offset[static_cast<size_t>(a)] * src_strides[static_cast<size_t>(a)];
    dst_start += dst_offset[static_cast<size_t>(a)] * dst_strides[static_cast<size_t>(a)];
  }
  CopyRecursive(static_cast<const char*>(src.raw_data()) + static_cast<size_t>(src_start) * elem, src_strides,
                static_cast<char*>(dst.raw_data()) + static_cast<size_t>(dst_start) * elem, dst_strides, extent, 0,
                elem);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ExtractBlock(const Tensor& src, const std::vector<int64_t>& offset, const Shape& extent) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(extent, src.dtype(), src.device()));
  RETURN_IF_ERROR(CopyBlock(src, offset, out, std::vector<int64_t>(offset.size(), 0), extent));
  return out;
}

}  // namespace tessera
