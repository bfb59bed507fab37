#include "core/checked.h"

#include <algorithm>

#include "core/dtype.h"
#include "core/text.h"

namespace tessera {

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(StrCat(what, ": ", a, " + ", b, " overflows int64"));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(StrCat(what, ": ", a, " * ", b, " overflows int64"));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedNumElements(const Shape& shape) {
  if (shape.rank() > kMaxTensorRank) {
    return absl::InvalidArgumentError(
        StrCat("shape of rank ", shape.rank(), " has more than ", kMaxTensorRank, " dimensions"));
  }
  int64_t bound = 1;  // product with zeros counted as 1: bounds every partial product
  bool empty = false;
  for (int a = 0; a < shape.rank(); ++a) {
    const int64_t d = shape[a];
    if (d < 0) {
      return absl::InvalidArgumentError(
          StrCat("shape ", shape.ToString(), " has a negative extent ", d, " at dimension ", a));
    }
    empty |= d == 0;
    if (d > 1 && bound > kMaxTensorBytes / d) {
      return absl::InvalidArgumentError(
          StrCat("shape ", shape.ToString(), " has more than 2^50 elements (dimension ", a, ", extent ", d, ")"));
    }
    bound *= std::max<int64_t>(d, 1);
  }
  return empty ? 0 : bound;
}

absl::StatusOr<int64_t> CheckedByteSize(const TensorMeta& meta) {
  auto elements = CheckedNumElements(meta.shape);
  if (!elements.ok()) {
    return absl::InvalidArgumentError(StrCat(DTypeName(meta.dtype), " tensor: ", elements.status().message()));
  }
  const auto size = static_cast<int64_t>(DTypeSize(meta.dtype));
  if (*elements > kMaxTensorBytes / size) {
    return absl::InvalidArgumentError(StrCat(meta.ToString(), " takes ", *elements, " x ", size,
                                             " bytes, more than the limit of 2^50 bytes (1 PiB)"));
  }
  return *elements * size;
}

}  // namespace tessera
