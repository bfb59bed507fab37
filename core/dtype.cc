#include "core/dtype.h"

#include <bit>
#include <cmath>

#include "core/text.h"

namespace tessera {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI64: case DType::kF64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
    case DType::kF64: return "f64";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool, DType::kF64}) {
    if (DTypeName(d) == name) return d;
  }
  if (name == "float32") return DType::kF32;
  if (name == "float16") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "int32") return DType::kI32;
  if (name == "int64") return DType::kI64;
  if (name == "float64") return DType::kF64;
  return absl::InvalidArgumentError(
      StrCat("unknown dtype '", name, "' (expected f32, f16, bf16, i32, i64, bool or f64)"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): shift the implicit-1 mantissa into place with
    // round-to-nearest-even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 → 15
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rebased >> 13));
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 113;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

namespace {

// `value` rounded to f32 "to odd": truncated toward zero, then the last bit
// set if anything was cut off. Rounding that result to nearest even at 2 or
// more bits fewer (both 16-bit formats, subnormals included) gives the
// nearest even rounding of `value` itself; rounding to nearest twice does
// not (Boldo & Melquiond, "When double rounding is odd", 2005).
float RoundToOddF32(double value) {
  float f = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(f) == value) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) f = std::nextafter(f, 0.0f);  // inf included
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

}  // namespace

uint16_t DoubleToHalf(double value) { return FloatToHalf(RoundToOddF32(value)); }
uint16_t DoubleToBFloat16(double value) { return FloatToBFloat16(RoundToOddF32(value)); }

}  // namespace tessera
