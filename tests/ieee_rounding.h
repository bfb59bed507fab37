#pragma once
// A test oracle for conversions to the 16-bit float formats, written from the
// IEEE 754 definition with exact arithmetic on values, not from bit tricks:
// a format is (precision, exponent bits); a finite value is rounded to the
// nearest multiple of its binade's spacing (the subnormal spacing below the
// smallest normal), ties to the even multiple, and a result of 2^(emax + 1)
// or more is infinity. Every value of these formats, every f32, every sum and
// every quotient by a power of two below is exact in double, so the oracle
// itself does not round.

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tessera::testing {

struct FloatFormat {
  int precision;      // significand bits, the implicit one included
  int exponent_bits;

  int fraction_bits() const { return precision - 1; }
  int total_bits() const { return precision + exponent_bits; }
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int emin() const { return 1 - bias(); }
  int emax() const { return bias(); }
  uint32_t exponent_field_max() const { return (1u << exponent_bits) - 1; }
};

inline constexpr FloatFormat kBFloat16Format{8, 8};
inline constexpr FloatFormat kHalfFormat{11, 5};

// Fields of an encoding.
struct FloatFields {
  bool negative;
  uint32_t exponent;  // the biased field
  uint32_t fraction;
};

inline FloatFields FieldsOf(uint32_t bits, FloatFormat f) {
  return {((bits >> (f.total_bits() - 1)) & 1u) != 0, (bits >> f.fraction_bits()) & f.exponent_field_max(),
          bits & ((1u << f.fraction_bits()) - 1)};
}

inline bool IsNanEncoding(uint32_t bits, FloatFormat f) {
  const FloatFields fields = FieldsOf(bits, f);
  return fields.exponent == f.exponent_field_max() && fields.fraction != 0;
}

// The value of an encoding (NaN for NaN encodings).
inline double DecodeFloat(uint32_t bits, FloatFormat f) {
  const FloatFields fields = FieldsOf(bits, f);
  double magnitude;
  if (fields.exponent == f.exponent_field_max()) {
    magnitude = fields.fraction == 0 ? INFINITY : NAN;
  } else if (fields.exponent == 0) {  // zero or subnormal: fraction × 2^(emin - fraction bits)
    magnitude = std::ldexp(static_cast<double>(fields.fraction), f.emin() - f.fraction_bits());
  } else {
    magnitude = std::ldexp(static_cast<double>((1u << f.fraction_bits()) + fields.fraction),
                           static_cast<int>(fields.exponent) - f.bias() - f.fraction_bits());
  }
  return fields.negative ? -magnitude : magnitude;
}

// The encoding of `x` (not NaN) rounded to nearest, ties to even.
inline uint32_t RoundToFormat(double x, FloatFormat f) {
  const uint32_t sign = std::signbit(x) ? 1u << (f.total_bits() - 1) : 0u;
  const uint32_t infinity = f.exponent_field_max() << f.fraction_bits();
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | infinity;
  // The spacing of representable values around a: 2^(e - fraction bits) for
  // a in [2^e, 2^(e+1)), and the subnormal spacing below 2^emin.
  const int e = a >= std::ldexp(1.0, f.emin()) ? std::ilogb(a) : f.emin();
  const double spacing = std::ldexp(1.0, e - f.fraction_bits());
  const double multiples = a / spacing;
  double below = std::floor(multiples);
  const double remainder = multiples - below;
  if (remainder > 0.5 || (remainder == 0.5 && std::fmod(below, 2.0) == 1.0)) below += 1.0;
  const double rounded = below * spacing;
  if (rounded >= std::ldexp(1.0, f.emax() + 1)) return sign | infinity;
  if (rounded < std::ldexp(1.0, f.emin())) {  // subnormal or zero: exponent field 0
    return sign | static_cast<uint32_t>(rounded / std::ldexp(1.0, f.emin() - f.fraction_bits()));
  }
  const int re = std::ilogb(rounded);
  const uint32_t fraction =
      static_cast<uint32_t>(rounded / std::ldexp(1.0, re - f.fraction_bits())) - (1u << f.fraction_bits());
  return sign | (static_cast<uint32_t>(re + f.bias()) << f.fraction_bits()) | fraction;
}

// Whether `got` is a right conversion of the f32 `x` to `f`: the encoding
// RoundToFormat gives, or for a NaN a quiet NaN (top fraction bit set) of the
// same sign.
inline bool IsRightNarrowing(float x, uint32_t got, FloatFormat f) {
  if (!std::isnan(x)) return got == RoundToFormat(x, f);
  const uint32_t quiet = 1u << (f.fraction_bits() - 1);
  return IsNanEncoding(got, f) && (got & quiet) != 0 && FieldsOf(got, f).negative == std::signbit(x);
}

// Whether `widened` is exactly the value of the encoding `bits` of `f`, sign
// of zero included (for a NaN: a NaN of the same sign).
inline bool IsRightWidening(uint32_t bits, float widened, FloatFormat f) {
  const double want = DecodeFloat(bits, f);
  if (std::isnan(want)) return std::isnan(widened) && std::signbit(widened) == FieldsOf(bits, f).negative;
  return static_cast<double>(widened) == want && std::signbit(widened) == std::signbit(want);
}

// f32 bit patterns that probe every rounding decision of a conversion to
// `f`: each combination of the bits a normal result keeps (sign, exponent,
// the top fraction bits) with the dropped bits at 0, 1, just below half,
// half, just above half and all ones; then `random` random patterns.
// Subnormal results keep fewer bits, so their ties lie among the kept-bit
// combinations with the dropped bits 0.
inline std::vector<uint32_t> RoundingProbes(FloatFormat f, size_t random, uint64_t seed) {
  const int dropped = 23 - f.fraction_bits();
  const uint32_t half = 1u << (dropped - 1), all = (1u << dropped) - 1;
  std::vector<uint32_t> probes;
  for (uint32_t kept = 0; kept < (1u << (32 - dropped)); ++kept) {
    for (uint32_t low : {0u, 1u, half - 1, half, half + 1, all}) probes.push_back((kept << dropped) | low);
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (size_t i = 0; i < random; ++i) probes.push_back(static_cast<uint32_t>(rng()));
  return probes;
}

}  // namespace tessera::testing
