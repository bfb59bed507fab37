#pragma once
// Shape of a tensor: a list of non-negative extents, row-major. Rank 0 is a
// scalar with one element.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int axis) const { return dims_[static_cast<size_t>(axis)]; }
  int64_t& operator[](int axis) { return dims_[static_cast<size_t>(axis)]; }
  // The product of the extents. For shapes already checked (core/checked.h:
  // every shape from input is checked where it enters); an overflow here is
  // a bug and aborts.
  int64_t NumElements() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  // Row-major strides in elements.
  std::vector<int64_t> Strides() const;
  // "(2, 3, 4)"; a scalar prints "()".
  std::string ToString() const;

  bool operator==(const Shape& other) const = default;

 private:
  std::vector<int64_t> dims_;
};

// Normalises a possibly negative axis against `rank`; error names the op context.
absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank);
// numpy broadcasting of two shapes; error names both.
absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

}  // namespace tessera
