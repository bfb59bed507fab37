#pragma once
// Element types of tensors, their sizes and names, and conversions between
// f32 and the 16-bit float formats (round-to-nearest-even, as hardware does).
//
// f64 is a host-side dtype: f64 tensors can be created, copied, read and
// written on the CPU (the op tests evaluate their double references in it),
// but no op has f64 kernels, so op inference refuses f64 inputs and outputs.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera {

// Values are appended, never renumbered.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kBool, kF64 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// "f32", "f16", "bf16", "i32", "i64", "bool", "f64".
std::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(std::string_view name);
bool IsFloatingPoint(DType dtype);

// IEEE binary16 and bfloat16 conversions. NaN stays NaN, overflow gives inf.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);
inline uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}
inline float BFloat16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// From double, rounded once to nearest even. (Through f32 they would round
// twice, and a value just above a tie, rounded to f32, can become the tie.)
uint16_t DoubleToHalf(double value);
uint16_t DoubleToBFloat16(double value);

// Storage types of the 16-bit formats (distinct so templates can dispatch).
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };

}  // namespace tessera
