#include "core/tensor.h"

#include <cmath>
#include <cstring>

#include "core/checked.h"
#include "core/text.h"

namespace tessera {

std::string TensorMeta::ToString() const {
  return StrCat(DTypeName(dtype), shape.ToString());
}

absl::StatusOr<Tensor> Tensor::Empty(const Shape& shape, DType dtype, const Device& device) {
  ASSIGN_OR_RETURN(const int64_t bytes, CheckedByteSize(TensorMeta{dtype, shape}));
  ASSIGN_OR_RETURN(auto storage, Storage::Create(device, static_cast<size_t>(bytes)));
  return Tensor(std::move(storage), 0, TensorMeta{dtype, shape});
}

absl::StatusOr<Tensor> Tensor::InStorage(std::shared_ptr<Storage> storage, size_t byte_offset, TensorMeta meta) {
  if (storage == nullptr) return absl::InvalidArgumentError("a tensor in no storage");
  ASSIGN_OR_RETURN(const int64_t bytes, CheckedByteSize(meta));
  if (byte_offset > storage->bytes() || static_cast<size_t>(bytes) > storage->bytes() - byte_offset) {
    return absl::OutOfRangeError(StrCat(meta.ToString(), " at byte ", byte_offset, " does not fit a storage of ",
                                        storage->bytes(), " bytes"));
  }
  return Tensor(std::move(storage), byte_offset, std::move(meta));
}

absl::StatusOr<Tensor> Tensor::Zeros(const Shape& shape, DType dtype, const Device& device) {
  ASSIGN_OR_RETURN(const int64_t bytes, CheckedByteSize(TensorMeta{dtype, shape}));
  ASSIGN_OR_RETURN(auto storage, Storage::CreateZeroed(device, static_cast<size_t>(bytes)));
  return Tensor(std::move(storage), 0, TensorMeta{dtype, shape});
}

absl::StatusOr<Tensor> Tensor::PinnedHost(const Shape& shape, DType dtype) {
  ASSIGN_OR_RETURN(const int64_t bytes, CheckedByteSize(TensorMeta{dtype, shape}));
  ASSIGN_OR_RETURN(auto storage, Storage::CreatePinned(static_cast<size_t>(bytes)));
  std::memset(storage->data(), 0, storage->bytes());
  return Tensor(std::move(storage), 0, TensorMeta{dtype, shape});
}

absl::StatusOr<Tensor> Tensor::Reshape(const Shape& shape) const {
  auto elements = CheckedNumElements(shape);
  if (!elements.ok() || *elements != NumElements()) {
    return absl::InvalidArgumentError(StrCat("cannot reshape ", meta_.shape.ToString(), " (",
                                                   NumElements(), " elements) to ", shape.ToString()));
  }
  return Tensor(storage_, byte_offset_, TensorMeta{meta_.dtype, shape});
}

absl::StatusOr<Tensor> Tensor::SliceRows(int64_t start, int64_t length) const {
  if (meta_.shape.rank() == 0 || start < 0 || length < 0 || start > meta_.shape[0] - length) {
    return absl::InvalidArgumentError(
        StrCat("rows ", start, " + ", length, " out of range for shape ", meta_.shape.ToString()));
  }
  Shape shape = meta_.shape;
  const int64_t row_elements = shape[0] == 0 ? 0 : NumElements() / shape[0];
  shape[0] = length;
  return Tensor(storage_, byte_offset_ + static_cast<size_t>(start * row_elements) * DTypeSize(meta_.dtype),
                TensorMeta{meta_.dtype, shape});
}

Tensor Tensor::Clone() const {
  auto copy = Empty(meta_.shape, meta_.dtype, device());
  TESSERA_CHECK(copy.ok(), copy.status().ToString());
  std::memcpy(copy->raw_data(), raw_data(), NumBytes());
  return *std::move(copy);
}

absl::Status Tensor::CopyFrom(const Tensor& other) {
  // (An empty Tensor() has a scalar f32's metadata and no storage.)
  if (!defined() || !other.defined()) {
    return absl::InvalidArgumentError(StrCat("CopyFrom: ", other.defined() ? other.meta_.ToString() : "an empty tensor",
                                             " into ", defined() ? meta_.ToString() : "an empty tensor"));
  }
  if (other.meta_ != meta_) {
    return absl::InvalidArgumentError(
        StrCat("CopyFrom: ", other.meta_.ToString(), " into ", meta_.ToString()));
  }
  return CopyBytes(raw_data(), device(), other.raw_data(), other.device(), NumBytes());
}

double ElementAsDouble(const Tensor& t, int64_t i) {
  const void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kBool: return static_cast<const bool*>(p)[i] ? 1.0 : 0.0;
    case DType::kF64: return static_cast<const double*>(p)[i];
  }
  return 0;
}

void SetElementFromDouble(const Tensor& t, int64_t i, double value) {
  void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(value); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = DoubleToHalf(value); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = DoubleToBFloat16(value); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(std::llround(value)); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = std::llround(value); break;
    case DType::kBool: static_cast<bool*>(p)[i] = value != 0.0; break;
    case DType::kF64: static_cast<double*>(p)[i] = value; break;
  }
}

std::vector<double> Tensor::ToDoubleVector() const {
  std::vector<double> out(static_cast<size_t>(NumElements()));
  for (int64_t i = 0; i < NumElements(); ++i) out[static_cast<size_t>(i)] = ElementAsDouble(*this, i);
  return out;
}

std::string Tensor::ToString(int64_t max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  std::string s = StrCat(meta_.ToString(), " [");
  const int64_t n = NumElements();
  for (int64_t i = 0; i < n && i < max_elements; ++i) {
    s += StrCat(i ? ", " : "", ElementAsDouble(*this, i));
  }
  if (n > max_elements) s += StrCat(", ...");
  s += StrCat("]");
  return s;
}

}  // namespace tessera
