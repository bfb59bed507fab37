#pragma once
// Branch-free float math that GCC vectorises inside plain loops (no calls into
// libm, which would keep loops scalar). On AVX2 that needs -fno-trapping-math
// (ops/CMakeLists.txt sets it), else the ternaries stay branches. Accuracy ~1e-7 relative (Cephes
// polynomials), tested against libm in tests/ops/vec_math_test.cc.

#include <bit>
#include <cmath>
#include <cstdint>

#include "ops/gelu_formulas.h"

namespace tessera::ops::cpu {

// e^x. Underflows to 0 below -87.33, +inf above 88.72 (finite up to there); NaN stays NaN.
inline float ExpF(float x) {
  // Written so GCC vectorises it without -ffast-math: ternaries rather than
  // std::fmin/fmax (whose NaN rules have no x86 instruction: a libm call), and
  // n = round(x / ln 2) by the 1.5 * 2^23 trick rather than std::floor plus a
  // float-to-int conversion (both keep the loop scalar under
  // -ftrapping-math): adding the magic number leaves n in the low mantissa
  // bits. A NaN clamps to the low bound here and is restored at the end.
  constexpr float kRoundMagic = 12582912.0f;
  float clamped = x > -87.5f ? x : -87.5f;
  clamped = clamped < 88.72f ? clamped : 88.72f;
  const float shifted = clamped * 1.44269504088896341f + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  float r = clamped - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // 2^n as 2^(n/2) * 2^(n - n/2), each built from its exponent bits: n
  // reaches 128 below the clamp (88.38 <= x <= 88.72), whose single scale's
  // exponent bits were +inf's, and -126 at the low end; halves stay normal.
  const int32_t n_half = n_int >> 1;
  const float scale_low = std::bit_cast<float>((n_half + 127) << 23);
  const float scale_high = std::bit_cast<float>((n_int - n_half + 127) << 23);
  float result = y * scale_low * scale_high;
  result = x < -87.33f ? 0.0f : result;
  result = x > 88.72f ? INFINITY : result;
  return x != x ? x : result;
}

// Natural log. log(0) = -inf, log(<0) = NaN, log(inf) = inf.
inline float LogF(float x) {
  // A subnormal x is scaled by 2^23 into the normals first (its exponent
  // field 0 read as a normal's gave log(1e-40) = -88.0, not -92.1).
  const bool subnormal = x > 0.0f && x < 1.17549435e-38f;
  const int32_t bits = std::bit_cast<int32_t>(subnormal ? x * 8388608.0f : x);
  float e = static_cast<float>(((bits >> 23) & 0xff) - 126 - (subnormal ? 23 : 0));
  float m = std::bit_cast<float>((bits & 0x807fffff) | 0x3f000000);  // [0.5, 1)
  const bool small = m < 0.707106781186547524f;
  e = small ? e - 1.0f : e;
  m = small ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  float result = m + y + 0.693359375f * e;
  // The specials, libm's values, without a branch.
  result = x == INFINITY ? INFINITY : result;
  result = x == 0.0f ? -INFINITY : result;
  result = x < 0.0f ? NAN : result;
  return x != x ? x : result;
}

inline float TanhF(float x) {
  const float a = std::fabs(x);
  // Small |x|: odd polynomial (1 - 2/(e^2x + 1) would cancel catastrophically).
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = 1.0f - 2.0f / (ExpF(2.0f * a) + 1.0f);
  const float signed_large = x < 0.0f ? -large : large;
  return a < 0.625f ? small : signed_large;
}

inline float SigmoidF(float x) { return 1.0f / (1.0f + ExpF(-x)); }

// erf: Maclaurin series below |x| = 0.5 (keeps small values' relative
// accuracy), Abramowitz & Stegun 7.1.26 above (|error| < 1.5e-7).
inline float ErfF(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float s = -1.0f / 9360.0f;  // coefficients (-1)^n / (n! (2n + 1)), n = 6 .. 0
  s = s * z + 1.0f / 1320.0f;
  s = s * z - 1.0f / 216.0f;
  s = s * z + 1.0f / 42.0f;
  s = s * z - 1.0f / 10.0f;
  s = s * z + 1.0f / 3.0f;
  s = s * z - 1.0f;
  const float series = -1.1283791670955126f * x * s;  // 2/sqrt(pi) * x * (1 - z/3 + ...)
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.0f - p * t * ExpF(-a * a);
  const float large = x < 0.0f ? -y : y;
  return a < 0.5f ? series : large;
}

// GELU and its derivative (ops/gelu_formulas.h) with the functions above.
struct VecMath {
  static float Exp(float x) { return ExpF(x); }
  static float Erf(float x) { return ErfF(x); }
  static float Tanh(float x) { return TanhF(x); }
};
inline float GeluF(float x, bool tanh_approx) { return GeluOf<VecMath>(x, tanh_approx); }
inline float GeluGradF(float x, bool tanh_approx) { return GeluGradOf<VecMath>(x, tanh_approx); }

}  // namespace tessera::ops::cpu
