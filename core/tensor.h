#pragma once
// Tensor: a contiguous, row-major view of (part of) a Storage with a dtype and
// a shape. Copying a Tensor is cheap and shares the storage (like a
// shared_ptr); views (Reshape, SliceRows) share it too. A default-constructed
// Tensor is "undefined" (no storage).
//
// Not thread-safe for concurrent writes to the same bytes; the actor runtime
// guarantees a register has one writer at a time.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/storage.h"

namespace tessera {

// What a tensor is without its data: used by shape inference and plans.
struct TensorMeta {
  DType dtype = DType::kF32;
  Shape shape;

  std::string ToString() const;  // "f32(2, 3)"
  bool operator==(const TensorMeta&) const = default;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory on `device`.
  static absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype,
                                      const Device& device = Device{});
  // Zero-filled, on any device.
  static absl::StatusOr<Tensor> Zeros(const Shape& shape, DType dtype,
                                      const Device& device = Device{});
  // Zero-filled in page-locked host memory (Storage::CreatePinned): the
  // staging side of copies to and from GPUs.
  static absl::StatusOr<Tensor> PinnedHost(const Shape& shape, DType dtype);
  // A tensor over bytes [byte_offset, byte_offset + its size) of `storage`
  // (an arena's registers). Errors: bytes outside the storage, an invalid meta.
  static absl::StatusOr<Tensor> InStorage(std::shared_ptr<Storage> storage, size_t byte_offset, TensorMeta meta);
  // Host tensor from values (test and tool convenience); CHECKs the count.
  template <typename T>
  static Tensor FromVector(const Shape& shape, const std::vector<T>& values);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return meta_.dtype; }
  const Shape& shape() const { return meta_.shape; }
  const TensorMeta& meta() const { return meta_; }
  int64_t NumElements() const { return meta_.shape.NumElements(); }
  size_t NumBytes() const { return static_cast<size_t>(NumElements()) * DTypeSize(meta_.dtype); }
  const Device& device() const { return storage_->device(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const { return static_cast<char*>(storage_->data()) + byte_offset_; }
  // Typed pointer; CHECKs that T matches the dtype (a mismatch is a bug).
  template <typename T>
  T* data() const {
    TESSERA_CHECK(DTypeOf<T>::value == meta_.dtype, "tensor is ", DTypeName(meta_.dtype),
                  ", accessed as ", DTypeName(DTypeOf<T>::value));
    return static_cast<T*>(raw_data());
  }

  // A view with another shape of the same element count.
  absl::StatusOr<Tensor> Reshape(const Shape& shape) const;
  // A view of rows [start, start + length) along axis 0.
  absl::StatusOr<Tensor> SliceRows(int64_t start, int64_t length) const;
  // A deep copy in fresh storage on the same device (CPU only).
  Tensor Clone() const;
  // Copies `other`'s bytes into this tensor, across devices too (waiting
  // for the copy); shapes and dtypes must match.
  absl::Status CopyFrom(const Tensor& other);

  // Element values converted to double, row-major (CPU; for tests and tools).
  std::vector<double> ToDoubleVector() const;
  template <typename T>
  std::vector<T> ToVector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + NumElements());
  }
  // "f32(2, 3) [1, 2, 3, 4, 5, 6]", truncated after `max_elements`.
  std::string ToString(int64_t max_elements = 16) const;

 private:
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, TensorMeta meta)
      : storage_(std::move(storage)), byte_offset_(byte_offset), meta_(std::move(meta)) {}

  std::shared_ptr<Storage> storage_;
  size_t byte_offset_ = 0;
  TensorMeta meta_;
};

// Reads element `i` of a CPU tensor of any dtype as double.
double ElementAsDouble(const Tensor& t, int64_t i);
// Writes element `i` of a CPU tensor of any dtype from a double (rounded for
// integers, converted for 16-bit floats).
void SetElementFromDouble(const Tensor& t, int64_t i, double value);

template <typename T>
Tensor Tensor::FromVector(const Shape& shape, const std::vector<T>& values) {
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == shape.NumElements(), "FromVector: ",
                values.size(), " values for shape ", shape.ToString());
  auto t = Empty(shape, DTypeOf<T>::value);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  T* p = t->template data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return *std::move(t);
}

}  // namespace tessera
