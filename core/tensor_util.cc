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

// The block as 2-D copies for a GPU: axes merged where both sides are
// contiguous across them (and extents of 1 dropped), the innermost run one
// row, the next axis the rows, the rest a loop here.
std::vector<Copy2D> BlockAs2D(const char* src, const std::vector<int64_t>& src_strides, char* dst,
                              const std::vector<int64_t>& dst_strides, const Shape& extent, size_t elem) {
  struct Axis {
    int64_t n, src_stride, dst_stride;
  };
  std::vector<Axis> axes;  // innermost first
  const int rank = extent.rank();
  axes.push_back({extent[rank - 1], src_strides.back(), dst_strides.back()});
  for (int a = rank - 2; a >= 0; --a) {
    const auto i = static_cast<size_t>(a);
    if (extent[a] == 1) continue;
    Axis& inner = axes.back();
    if (src_strides[i] == inner.src_stride * inner.n && dst_strides[i] == inner.dst_stride * inner.n) {
      inner.n *= extent[a];
    } else {
      axes.push_back({extent[a], src_strides[i], dst_strides[i]});
    }
  }
  const size_t width = static_cast<size_t>(axes[0].n) * elem;
  Copy2D piece{.dst_pitch = width, .src_pitch = width, .width = width, .height = 1};
  if (axes.size() > 1) {
    piece.height = static_cast<size_t>(axes[1].n);
    piece.src_pitch = static_cast<size_t>(axes[1].src_stride) * elem;
    piece.dst_pitch = static_cast<size_t>(axes[1].dst_stride) * elem;
  }
  std::vector<Copy2D> copies;
  std::vector<int64_t> index(axes.size(), 0);  // over axes 2.. (the loop)
  while (true) {
    int64_t src_at = 0, dst_at = 0;
    for (size_t k = 2; k < axes.size(); ++k) {
      src_at += index[k] * axes[k].src_stride;
      dst_at += index[k] * axes[k].dst_stride;
    }
    piece.src = src + static_cast<size_t>(src_at) * elem;
    piece.dst = dst + static_cast<size_t>(dst_at) * elem;
    copies.push_back(piece);
    size_t k = 2;
    for (; k < axes.size(); ++k) {
      if (++index[k] < axes[k].n) break;
      index[k] = 0;
    }
    if (k >= axes.size()) break;
  }
  return copies;
}

absl::Status CopyBlockImpl(const Tensor& src, const std::vector<int64_t>& src_offset, const Tensor& dst,
                           const std::vector<int64_t>& dst_offset, const Shape& extent, bool as_2d) {
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
  if (rank == 0) return CopyBytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), elem);
  const auto src_strides = src.shape().Strides();
  const auto dst_strides = dst.shape().Strides();
  int64_t src_start = 0, dst_start = 0;
  for (int a = 0; a < rank; ++a) {
    src_start += src_offset[static_cast<size_t>(a)] * src_strides[static_cast<size_t>(a)];
    dst_start += dst_offset[static_cast<size_t>(a)] * dst_strides[static_cast<size_t>(a)];
  }
  const char* from = static_cast<const char*>(src.raw_data()) + static_cast<size_t>(src_start) * elem;
  char* to = static_cast<char*>(dst.raw_data()) + static_cast<size_t>(dst_start) * elem;
  if (as_2d || src.device().type != DeviceType::kCpu || dst.device().type != DeviceType::kCpu) {
    return CopyBytes2D(BlockAs2D(from, src_strides, to, dst_strides, extent, elem), dst.device(), src.device());
  }
  CopyRecursive(from, src_strides, to, dst_strides, extent, 0, elem);
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyBlock(const Tensor& src, const std::vector<int64_t>& src_offset, const Tensor& dst,
                       const std::vector<int64_t>& dst_offset, const Shape& extent) {
  return CopyBlockImpl(src, src_offset, dst, dst_offset, extent, false);
}

namespace internal {
absl::Status CopyBlockAs2D(const Tensor& src, const std::vector<int64_t>& src_offset, const Tensor& dst,
                           const std::vector<int64_t>& dst_offset, const Shape& extent) {
  return CopyBlockImpl(src, src_offset, dst, dst_offset, extent, true);
}
}  // namespace internal

absl::StatusOr<Tensor> ExtractBlock(const Tensor& src, const std::vector<int64_t>& offset, const Shape& extent) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(extent, src.dtype(), src.device()));
  RETURN_IF_ERROR(CopyBlock(src, offset, out, std::vector<int64_t>(offset.size(), 0), extent));
  return out;
}

}  // namespace tessera
