#include "core/shape.h"

#include <algorithm>

#include "core/status.h"
#include "core/text.h"

namespace tessera {

int64_t Shape::NumElements() const {
  int64_t n = 1;
  for (int64_t d : dims_) {
    TESSERA_CHECK(!__builtin_mul_overflow(n, d, &n), "element count of ", ToString(),
                  " overflows int64: a shape from input escaped CheckedNumElements");
  }
  return n;
}

std::vector<int64_t> Shape::Strides() const {
  std::vector<int64_t> strides(dims_.size(), 1);
  for (int i = rank() - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims_[i + 1];
  return strides;
}

std::string Shape::ToString() const {
  if (dims_.size() == 1) return StrCat("(", dims_[0], ",)");
  return StrCat("(", Join(dims_, ", "), ")");
}

absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank) {
  const int64_t normalized = axis < 0 ? axis + rank : axis;
  if (normalized < 0 || normalized >= std::max(rank, 1)) {
    return absl::InvalidArgumentError(
        StrCat("axis ", axis, " is out of range for rank ", rank));
  }
  return static_cast<int>(normalized);
}

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  std::vector<int64_t> out(static_cast<size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    const int ia = a.rank() - rank + i;
    const int ib = b.rank() - rank + i;
    const int64_t da = ia >= 0 ? a[ia] : 1;
    const int64_t db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      return absl::InvalidArgumentError(StrCat("shapes ", a.ToString(), " and ",
                                                     b.ToString(), " do not broadcast"));
    }
    out[static_cast<size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(std::move(out));
}

}  // namespace tessera
